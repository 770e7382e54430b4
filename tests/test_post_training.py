"""Post-training jobs (peakmem.jobs, peakmem.post_training, formulas/logprob_head.py) by hand.

Each test holds one rule against a value derived here from the rule's source (TRL 1.16, vLLM) on the
tiny Llama of tests/tiny_models.py; the CPU runs of TRL's own trainers are in
tests/test_post_training_torch.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

import peakmem
from peakmem.breakdown import Category, Phase
from peakmem.catalog import get_gpu
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.formulas.logprob_head import CHUNK_SIZE, RUNNING_VECTORS, TOKEN_CHUNK_SIZE, no_grad_head_bytes
from peakmem.jobs import estimate_post_training, update_setup
from peakmem.post_training import Objective, Reference, Rollout, post_training
from peakmem.resolve import spec_for_config
from peakmem.training import KernelPolicy, LossImpl, Method, OptimizerImpl, Precision, TrainingSetup
from tiny_models import LLAMA, LLAMA_P

SPEC = spec_for_config(dict(LLAMA), name="tiny-llama")
SEQ, COMPLETION, BATCH = 32, 16, 4


def _setup(method: str = "full", **kw: Any) -> TrainingSetup:
    base: dict[str, Any] = dict(
        method=Method(method), precision=Precision.FP32, micro_batch=BATCH, seq_len=SEQ,
        optimizer_impl=OptimizerImpl.FOR_LOOP,
    )  # fmt: skip
    return TrainingSetup(**{**base, **kw})


def _post(objective: str, method: str = "full", **kw: Any) -> Any:
    return post_training(
        objective, seq=SEQ, completion=COMPLETION, batch=BATCH, adapter=method != "full", **kw
    )


def _phases(est: Any) -> dict[Phase, int]:
    return {p.phase: p.bytes for p in est.phases}


# --- the roles TRL 1.16 builds -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("objective", "method", "beta", "reference"),
    [
        ("grpo", "full", None, Reference.NONE),  # GRPOConfig.beta = 0.0: no reference loaded
        ("grpo", "full", 0.04, Reference.SEPARATE),
        ("grpo", "lora", 0.04, Reference.ADAPTER),  # is_peft_model: the adapter is disabled
        ("rloo", "full", None, Reference.SEPARATE),  # RLOOConfig.beta = 0.05
        ("dpo", "full", None, Reference.SEPARATE),
        ("dpo", "lora", None, Reference.ADAPTER),
        ("orpo", "full", None, Reference.NONE),  # reference-free
        ("kto", "full", None, Reference.SEPARATE),
        ("kto", "lora", None, Reference.ADAPTER),
    ],
)
def test_reference_trl_builds(objective: str, method: str, beta: float | None, reference: Reference) -> None:
    post = _post(objective, method, num_generations=4 if objective == "grpo" else None, beta=beta)
    assert post.reference is reference


def test_sft_is_no_post_training_job() -> None:
    assert post_training("sft", seq=SEQ) is None


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(objective="kto", reference="none"), "reference='none'"),
        (dict(objective="dpo", reference="none"), "reference='none'"),
        (dict(objective="grpo", reference="adapter", num_generations=4), "reference='adapter'"),
        (dict(objective="grpo", num_generations=3), "num_generations=3"),  # 4 completions per device
        (dict(objective="grpo", num_generations=1), "num_generations=1"),
        (dict(objective="dpo", rollout="vllm-colocate"), "rollout='vllm-colocate'"),
        (dict(objective="grpo", reference="precomputed", num_generations=4), "reference='precomputed'"),
        (dict(objective="grpo", num_generations=4, rollout_memory=1.5), "rollout_memory=1.5"),
        (dict(objective="dpo", completion=SEQ), "completion=32"),
    ],
)
def test_bad_roles_are_one_line_errors(kw: dict[str, Any], field: str) -> None:
    completion = kw.pop("completion", COMPLETION)
    with pytest.raises(InputError) as err:
        post_training(kw.pop("objective"), seq=SEQ, completion=completion, batch=BATCH, **kw)
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


# --- the update step TRL runs ------------------------------------------------------------------
def test_dpo_concatenates_chosen_and_rejected() -> None:
    upd = update_setup(_setup(), _post("dpo"))
    assert (upd.micro_batch, upd.loss, upd.scored_tokens) == (2 * BATCH, LossImpl.LOGPROB, COMPLETION)
    grpo = update_setup(_setup(), _post("grpo", num_generations=4))
    assert (grpo.micro_batch, grpo.loss) == (BATCH, LossImpl.LOGPROB_ENTROPY)


def test_no_grad_head_by_hand() -> None:
    # Triton: the 16 x 4 scored positions only; one [min(N, 4096), 32768] tile in the compute dtype
    n, h, act = BATCH * COMPLETION, LLAMA["hidden_size"], 2
    want = n * (h * act + 8 + (RUNNING_VECTORS + 1) * 4) + min(n, TOKEN_CHUNK_SIZE) * CHUNK_SIZE * act
    assert no_grad_head_bytes(SPEC, BATCH * (SEQ - 1), n, act, triton=True) == want


# --- what each phase holds ---------------------------------------------------------------------
def test_separate_reference_adds_its_weights_to_every_update_phase() -> None:
    # DPO with a separate fp32 reference vs the same job with precomputed log-probs: the update's
    # forward, backward and optimizer phases differ by the reference's weights, LLAMA_P x 4 bytes
    sep = _phases(estimate_post_training(SPEC, _setup(), _post("dpo")))
    pre = _phases(estimate_post_training(SPEC, _setup(), _post("dpo", reference="precomputed")))
    for phase in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER):
        assert sep[phase] - pre[phase] == LLAMA_P * 4


def test_grpo_generations_do_not_change_a_device() -> None:
    # RepeatSampler: 2 or 4 completions per prompt, the per-device generation batch is batch x spg
    two = estimate_post_training(SPEC, _setup(), _post("grpo", num_generations=2, beta=0.04))
    four = estimate_post_training(SPEC, _setup(), _post("grpo", num_generations=4, beta=0.04))
    assert _phases(two) == _phases(four)


def test_vllm_colocated_takes_its_share_in_every_phase_unless_asleep() -> None:
    gpu = get_gpu("h100-80gb").memory_bytes
    share = int(0.3 * gpu)  # GRPOConfig.vllm_gpu_memory_utilization = 0.3 of the whole device
    server = _phases(
        estimate_post_training(SPEC, _setup(), _post("grpo", num_generations=4, rollout="vllm-server"))
    )
    awake = estimate_post_training(SPEC, _setup(), _post("grpo", num_generations=4, rollout="vllm-colocate"),
                                   gpu_bytes=gpu)  # fmt: skip
    asleep = estimate_post_training(
        SPEC,
        _setup(),
        _post("grpo", num_generations=4, rollout="vllm-colocate", rollout_sleep=True),
        gpu_bytes=gpu,
    )
    for phase, nbytes in server.items():
        assert _phases(awake)[phase] - nbytes == share
        assert _phases(asleep)[phase] - nbytes == (share if phase is Phase.ROLLOUT else 0)
    assert awake.extra["phases_by_role"][Phase.BACKWARD.value]["rollout engine"] == share


def test_vllm_colocated_needs_the_gpu() -> None:
    with pytest.raises(InputError, match=r"^rollout='vllm-colocate'"):
        estimate_post_training(SPEC, _setup(), _post("grpo", num_generations=4, rollout="vllm-colocate"))


def test_rollout_holds_the_generation_kv_of_batch_x_steps_per_generation() -> None:
    # fp32 generate: K and V of 2 layers x 2 kv heads x 16 dims per token, for 4 x 2 completions of 32 tokens
    one = estimate_post_training(SPEC, _setup(), _post("grpo", num_generations=4))
    two = estimate_post_training(
        SPEC, _setup(grad_accum=2), _post("grpo", num_generations=4, steps_per_generation=2)
    )
    per_token = 2 * LLAMA["num_hidden_layers"] * LLAMA["num_key_value_heads"] * 16 * 4
    assert one.extra["rollout_kv_bytes"] == BATCH * SEQ * per_token
    assert two.extra["rollout_kv_bytes"] == 2 * BATCH * SEQ * per_token
    assert two.extra["generation_batch"] == 2 * BATCH


def test_phases_by_role_add_up() -> None:
    est = estimate_post_training(SPEC, _setup(), _post("dpo"))
    for p in est.phases:
        assert sum(est.extra["phases_by_role"][p.phase.value].values()) == p.bytes
    assert est.peak_allocated_bytes == max(p.bytes for p in est.phases)
    assert sum(i.bytes for i in est.items if i.key == "reference.weights") == LLAMA_P * 4
    assert all(i.category is not Category.GRADIENTS for i in est.items if i.key == "policy.resident")


def test_cuda_scores_the_completion_only() -> None:
    # Triton scores the completion's positions (hidden_states[mask]); the CPU fallback every position
    cuda = estimate_post_training(SPEC, _setup(), _post("grpo", num_generations=4))
    cpu = estimate_post_training(
        SPEC, _setup(kernel_policy=KernelPolicy.CPU), _post("grpo", num_generations=4)
    )
    assert _phases(cuda)[Phase.FORWARD] < _phases(cpu)[Phase.FORWARD]


# --- every face asks the same ------------------------------------------------------------------
def test_cli_equals_api(capsys: Any) -> None:
    kw = dict(objective="grpo", method="lora", batch=8, seq=1024, completion=512, beta=0.04)
    api = peakmem.train("qwen2.5-0.5b", **kw).to_dict()
    argv = ["train", "qwen2.5-0.5b", "--json"]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    main(argv)
    cli = json.loads(capsys.readouterr().out)
    assert cli == api
    assert cli["setup"]["post_training"]["objective"] == "grpo" and cli["reference"] == "adapter"
    assert set(cli["phases"]) == {"rollout", "scoring", "forward", "backward", "optimizer"}


def test_post_training_options_need_an_objective() -> None:
    with pytest.raises(InputError, match=r"^beta: options of a post-training job"):
        peakmem.train("qwen2.5-0.5b", beta=0.1)


def test_objective_choices_name_the_field() -> None:
    with pytest.raises(InputError, match=r"^objective='bogus'"):
        peakmem.train("qwen2.5-0.5b", objective="bogus")
    assert {o.value for o in Objective} >= {"sft", "dpo", "grpo", "rloo", "orpo", "simpo"}
    assert Rollout("vllm-colocate") is Rollout.VLLM_COLOCATE


# --- fit: the changes that make a post-training job fit, each re-estimated ------------------------------
def _fit_report(gpu: str) -> Any:
    from peakmem.planner.post_training import fit_post_training
    from peakmem.question import ask

    job = dict(
        objective="grpo", batch=8, seq=1024, completion=512, rollout="vllm-colocate", beta=0.04, gpu=gpu
    )
    q = ask("fit", job, model="qwen2.5-0.5b")
    return q, fit_post_training(q.spec, q.training, q.post, q.gpus)


def test_fit_changes_are_each_re_estimated() -> None:
    q, report = _fit_report("16GB")
    g = report.gpus[0]
    assert not g.verdict.fits and g.singles
    for change, verdict in g.singles:
        again = estimate_post_training(q.spec, change.setup, change.post, gpu_bytes=g.gpu.memory_bytes)
        assert again.device_total_bytes == change.estimate.device_total_bytes == verdict.needed_bytes
    assert [c for c, _ in g.fitting] == [c for c, v in g.singles if v.fits]  # in the order of the steps


def test_fit_combined_changes_are_minimal() -> None:
    from peakmem.planner.post_training import _apply, _verdict

    q, report = _fit_report("12GB")
    g = report.gpus[0]
    assert not g.fitting and g.combined is not None and g.combined[1].fits
    steps = list(g.combined[0].steps)
    assert len(steps) >= 2
    for drop in steps:  # without any one of its changes, the job no longer fits
        _, s, p = _apply([x for x in steps if x is not drop], q.training, q.post, g.gpu, q.spec)
        assert not _verdict(estimate_post_training(q.spec, s, p, gpu_bytes=g.gpu.memory_bytes), g.gpu).fits


def test_fit_cli_answers_the_post_training_job(capsys: Any) -> None:
    argv = "fit qwen2.5-0.5b --objective grpo --batch 8 --seq 1024 --completion 512 --rollout vllm-colocate"
    code = main([*argv.split(), "--beta", "0.04", "--gpu", "16GB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["post_training"]["objective"] == "grpo"
    gpu = out["gpus"][0]
    assert not gpu["fits"] and gpu["each_change_alone"]
    assert code == (0 if gpu["changes_that_fit"] or gpu["changes_together"] else 1)
