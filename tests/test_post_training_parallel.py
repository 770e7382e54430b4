"""Post-training jobs on several GPUs (peakmem.jobs, data parallel) by hand: the reference as TRL 1.16
prepares it (trl/models/utils.py prepare_deepspeed / prepare_fsdp) and HF generate under ZeRO-3
(unwrap_model_for_generation gathers the whole model), on the tiny Llama of tests/tiny_models.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from peakmem.breakdown import Phase
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.jobs import estimate_post_training, reference_shards, update_setup
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.post_training import post_training
from peakmem.ranks import estimate_ranks
from peakmem.resolve import spec_for_config
from peakmem.training import Method, OptimizerImpl, Precision, TrainingSetup
from tiny_models import LLAMA, LLAMA_P

SPEC = spec_for_config(dict(LLAMA), name="tiny-llama")
SEQ, COMPLETION, BATCH = 32, 16, 4
SETUP = TrainingSetup(method=Method.FULL, precision=Precision.MIXED_BF16, micro_batch=BATCH, seq_len=SEQ,
                      optimizer_impl=OptimizerImpl.FOR_LOOP)  # fmt: skip
Z3 = Parallelism(gpus=8, zero_stage=3)
Z2 = Parallelism(gpus=8, zero_stage=2)


def _post(objective: str, gpus: int = 8, **kw: Any) -> Any:
    return post_training(objective, seq=SEQ, completion=COMPLETION, batch=BATCH, gpus=gpus, **kw)


def _items(est: Any, phase: Phase, key: str) -> int:
    (p,) = [p for p in est.phases if p.phase is phase]
    return sum(i.bytes for i in p.items if i.key == key)


@pytest.mark.parametrize(
    ("par", "shards"),
    [
        (Parallelism(gpus=8, zero_stage=3), 8),  # "If ZeRO-3 is used, we shard both the active and reference"
        (Parallelism(gpus=8, zero_stage=2), 1),  # else "initialized on each device with ZeRO disabled"
        (Parallelism(gpus=8, zero_stage=1), 1),
        (Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD), 8),  # prepare_fsdp: the policy's plugin
        (Parallelism(gpus=16, gpus_per_node=8, fsdp=FsdpMode.HYBRID_SHARD), 8),  # sharded within a node
        (Parallelism(gpus=8, fsdp=FsdpMode.SHARD_GRAD_OP), 1),  # not resharded after its forward
        (Parallelism(gpus=8), 1),  # DDP: a whole copy per rank
    ],
)
def test_reference_shards_as_trl_prepares_it(par: Parallelism, shards: int) -> None:
    assert reference_shards(par) == shards


def test_dpo_reference_is_sharded_under_zero3_and_whole_under_zero2() -> None:
    # mixed-bf16: the reference is a bf16 copy, LLAMA_P x 2 bytes; ZeRO-3 keeps 1/8 of it per rank
    # (rounded up), ZeRO-2 builds it at stage 0: all of it, in every phase of the update
    post = _post("dpo")
    z3 = estimate_post_training(SPEC, SETUP, post, par=Z3)
    z2 = estimate_post_training(SPEC, SETUP, post, par=Z2)
    for phase in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER):
        assert _items(z3, phase, "reference.weights") == -(-LLAMA_P * 2 // 8)
        assert _items(z2, phase, "reference.weights") == LLAMA_P * 2
    assert z3.extra["reference_shards"] == 8 and z2.extra["reference_shards"] == 1


def test_the_update_phases_are_the_most_loaded_ranks() -> None:
    # the policy's update on 8 ranks is estimate_ranks' most loaded rank of the step TRL runs (chosen +
    # rejected: 2 x batch sequences, its log-prob head), plus the reference's shard
    post = _post("dpo")
    est = estimate_post_training(SPEC, SETUP, post, par=Z3)
    rank = estimate_ranks(SPEC, update_setup(SETUP, post), Z3).most_loaded.estimate
    by_phase = {p.phase: p.bytes for p in rank.phases}
    ref = -(-LLAMA_P * 2 // 8)
    assert {p.phase for p in est.phases} >= set(by_phase)
    for p in est.phases:
        if p.phase in by_phase:
            assert p.bytes == by_phase[p.phase] + ref


def test_grpo_generate_under_zero3_gathers_the_whole_policy() -> None:
    # unwrap_model_for_generation: deepspeed.zero.GatheredParameters(model.parameters()): the 16-bit
    # weights of every parameter on each rank while generate runs (LLAMA_P x 2 bytes)
    post = _post("grpo", beta=0.04, num_generations=4)
    z3 = estimate_post_training(SPEC, SETUP, post, par=Z3)
    assert _items(z3, Phase.ROLLOUT, "rollout.gathered") == LLAMA_P * 2
    fsdp = estimate_post_training(SPEC, SETUP, post, par=Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD))
    assert _items(fsdp, Phase.ROLLOUT, "rollout.gathered") == 0  # FSDP: layer by layer
    gathered = sum(i.bytes for p in fsdp.phases if p.phase is Phase.FORWARD for i in p.items
                   if i.key in ("fsdp.root", "fsdp.units"))  # fmt: skip
    assert _items(fsdp, Phase.ROLLOUT, "policy.gathered") == gathered > 0
    # the reference's no-grad scoring forward gathers its layers as the policy's forward does
    assert _items(fsdp, Phase.SCORING, "reference.gathered") == gathered
    # FSDP2's unshards (peakmem.step_fsdp.NoGradForward, as the training forward counts them): the root
    # (embed 64,000 + norm 64 + head 64,000 = 128,064) and one unit (46,208) stay gathered, bf16
    root, unit = 2 * 128_064, 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64)
    assert gathered == root + unit == 348_544
    # generate: no layer temporaries to speak of, so the largest unshard instant counts whole: the first
    # unit's, next to the root's all-gather output (root + unit more), above a later unit's (2 units)
    assert _items(fsdp, Phase.ROLLOUT, "policy.unshard") == max(root + unit, 2 * unit) == 348_544
    # scoring: TRL's log-prob head over 4 x 31 positions x 1,000 logits outweighs every unshard instant
    # (the first: 348,544 + 16,384 bytes of hidden states, 4 x 32 x 64 x 2), so nothing is added
    assert _items(fsdp, Phase.SCORING, "reference.unshard") == 0


def test_the_generation_batch_counts_every_data_parallel_rank() -> None:
    # GRPOConfig: batch x gpus x steps_per_generation must be divisible by num_generations;
    # 4 x 1 x 1 = 4 is not divisible by 8, 4 x 2 x 1 = 8 is
    with pytest.raises(InputError, match=r"^num_generations=8: the generation batch"):
        _post("grpo", gpus=1, num_generations=8)
    assert _post("grpo", gpus=2, num_generations=8).num_generations == 8


@pytest.mark.parametrize("field", ["tp", "pp", "cp"])
def test_model_parallel_post_training_is_a_one_line_error(field: str) -> None:
    par = Parallelism(gpus=4, dp=2, **{field: 2})
    with pytest.raises(InputError, match=rf"^{field}=2: post-training jobs are modelled data parallel"):
        estimate_post_training(SPEC, SETUP, _post("dpo", gpus=2), par=par)


def test_cli_answers_a_zero3_dpo_job(capsys: Any) -> None:
    code = main(["train", "qwen2.5-0.5b", "--objective", "dpo", "--seq", "512", "--gpus", "8", "--zero", "3",
                 "--gpu", "h100", "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["reference_shards"] == 8 and out["reference"] == "separate"
    assert any("sharded over 8 ranks" in a for a in out["assumptions"])


def test_fit_on_several_gpus_re_estimates_each_change_on_the_layout() -> None:
    # fit keeps the layout as given: every change alone is the most loaded rank's estimate of the job
    # with that change, on the same 8 GPUs under ZeRO-2
    from peakmem.planner.post_training import fit_post_training
    from peakmem.resolve import gpu_of_size

    big = TrainingSetup(**{**SETUP.__dict__, "seq_len": 128, "micro_batch": 64})
    post = post_training("dpo", seq=128, completion=64, batch=64, gpus=8)
    needed = estimate_post_training(SPEC, big, post, par=Z2).device_total_bytes
    gpu = gpu_of_size(f"{needed * 3 // 4 // 2**20}MiB")  # a device a quarter too small for the job
    report = fit_post_training(SPEC, big, post, (gpu,), par=Z2)
    (g,) = report.gpus
    assert report.baseline.extra["reference_shards"] == 1 and not g.verdict.fits
    assert g.singles
    for change, _ in g.singles:
        again = estimate_post_training(SPEC, change.setup, change.post, gpu_bytes=gpu.memory_bytes, par=Z2)
        assert change.estimate.device_total_bytes == again.device_total_bytes, change.label


def test_fit_cli_takes_a_zero3_post_training_job(capsys: Any) -> None:
    # fit's verdict is on the same rank train answers for: the same device total, and it fits an H100
    job = ["llama-3.1-8b", "--objective", "dpo", "--seq", "2048", "--batch", "4", "--gpus", "8", "--zero",
           "3", "--checkpointing", "full", "--gpu", "h100", "--json"]  # fmt: skip
    assert main(["train", *job]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert main(["fit", *job]) == 0
    out = json.loads(capsys.readouterr().out)
    (gpu,) = out["gpus"]
    assert gpu["gpu"] == "h100-sxm" and gpu["fits"]
    assert out["post_training"]["objective"] == "dpo"
    assert gpu["needed_bytes"] == trained["needed_bytes"]
    assert out["device_total_bytes"] == trained["device_total_bytes"]


def test_a_sharded_teacher_gathers_its_own_layers() -> None:
    # distillation under FSDP full shard: the teacher (wider than the student) is sharded like the policy,
    # ceil(TEACHER_P x 2 / 8) bf16 bytes per rank, and its no-grad forward gathers the teacher's layers
    # (its own FSDP units, as estimate_ranks prices them for the teacher), not the student's
    teacher_config = dict(LLAMA, hidden_size=96, intermediate_size=256, num_attention_heads=6,
                          num_key_value_heads=2, num_hidden_layers=3)  # fmt: skip
    teacher = spec_for_config(teacher_config, name="tiny-teacher")
    par = Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD)
    post = post_training("distill", seq=SEQ, completion=COMPLETION, batch=BATCH, gpus=8, teacher=teacher)
    est = estimate_post_training(SPEC, SETUP, post, par=par)
    assert _items(est, Phase.FORWARD, "teacher.weights") == -(-teacher.params * 2 // 8)
    own = estimate_ranks(teacher, SETUP, par).most_loaded.estimate
    gathered = sum(i.bytes for p in own.phases if p.phase is Phase.FORWARD for i in p.items
                   if i.key in ("fsdp.root", "fsdp.units"))  # fmt: skip
    student = _items(est, Phase.ROLLOUT, "policy.gathered")
    assert _items(est, Phase.SCORING, "teacher.gathered") == gathered > student > 0
    # its no-grad forward's unshards, by hand, bf16: root (embed 96,000 + norm 96 + head 96,000 =
    # 192,096 elements) and a unit (q, o 96 x 96; k, v 96 x 32; gate, up, down 96 x 256; norms 2 x 96 =
    # 98,496), the layer's temporaries 128 tokens x (3 x 256 x 2 MLP + 4 x 96 x 2 residual) = 294,912
    # and 128 x 96 x 2 = 24,576 of hidden states: the first unit's unshard (root + unit beyond the
    # gathered set) is the largest instant, above a later unit's (2 units + hidden) and a layer running
    # (unit + its temporaries)
    root, unit, layer, hidden = 2 * 192_096, 2 * 98_496, 294_912, 24_576
    assert gathered == root + unit == 581_184
    assert _items(est, Phase.SCORING, "teacher.forward") == layer
    first, later, running = root + unit + hidden, 2 * unit + hidden, layer + unit
    assert _items(est, Phase.SCORING, "teacher.unshard") == max(first, later, running) - layer == 310_848
