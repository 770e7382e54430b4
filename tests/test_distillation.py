"""Distillation (``--objective distill --teacher MODEL``): TRL 1.16's DistillationTrainer by hand, on the
tiny Llama of tests/tiny_models.py as the student and a wider one as its teacher. The CPU runs of the
trainer itself are in tests/test_post_training_torch.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

import peakmem
from peakmem.breakdown import Phase
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.jobs import estimate_post_training
from peakmem.post_training import Reference, post_training
from peakmem.resolve import spec_for_config
from peakmem.training import KernelPolicy, Method, OptimizerImpl, Precision, TrainingSetup
from tiny_models import LLAMA

TEACHER_CONFIG = dict(LLAMA, hidden_size=96, intermediate_size=256, num_attention_heads=6,
                      num_key_value_heads=2, num_hidden_layers=3)  # fmt: skip
# embed 1000*96 + 3 layers x (q 96*96 + k 96*32 + v 96*32 + o 96*96 + gate/up/down 3*96*256 + 2 norms 2*96)
# + final norm 96 + untied head 1000*96
TEACHER_P = 1000 * 96 + 3 * (96 * 96 + 2 * 96 * 32 + 96 * 96 + 3 * 96 * 256 + 2 * 96) + 96 + 1000 * 96
SPEC = spec_for_config(dict(LLAMA), name="tiny-llama")
TEACHER = spec_for_config(TEACHER_CONFIG, name="tiny-teacher")
SEQ, COMPLETION, BATCH = 32, 16, 4
SETUP = TrainingSetup(method=Method.FULL, precision=Precision.FP32, micro_batch=BATCH, seq_len=SEQ,
                      optimizer_impl=OptimizerImpl.FOR_LOOP, kernel_policy=KernelPolicy.CPU)  # fmt: skip


def _post(**kw: Any) -> Any:
    return post_training("distill", seq=SEQ, completion=COMPLETION, batch=BATCH, teacher=TEACHER, **kw)


def _item(est: Any, phase: Phase, key: str) -> int:
    (p,) = [p for p in est.phases if p.phase is phase]
    return sum(i.bytes for i in p.items if i.key == key)


def _phases(est: Any) -> dict[Phase, int]:
    return {p.phase: p.bytes for p in est.phases}


def test_teacher_parameters_by_hand() -> None:
    assert TEACHER.params == TEACHER_P == 487_584


def test_defaults_as_distillation_config() -> None:
    post = _post()
    # DistillationConfig.beta 1.0 (reverse KL), one completion per prompt, no reference model
    assert (post.beta, post.num_generations, post.reference) == (1.0, 1, Reference.NONE)
    assert post.echo()["teacher"] == "tiny-teacher"


def test_the_teacher_is_frozen_beside_the_student_in_every_phase() -> None:
    # loaded like the student: fp32 here, TEACHER_P x 4 bytes in every phase, rollout included
    est = estimate_post_training(SPEC, SETUP, _post())
    for p in est.phases:
        assert _item(est, p.phase, "teacher.weights") == TEACHER_P * 4, p.phase
    assert est.extra["phases_by_role"]["rollout"]["teacher"] == TEACHER_P * 4


def test_divergence_head_saves_both_hidden_states_by_hand() -> None:
    # N = batch x completion = 64 positions; saved for backward: the student's and the teacher's hidden
    # copies [64, 64] and [64, 96] in fp32 and three fp32 [64] vectors (s_log_z, t_log_z, aux)
    est = estimate_post_training(SPEC, SETUP, _post())
    assert _item(est, Phase.FORWARD, "loss.divergence_head") == 64 * (64 + 96) * 4 + 3 * 64 * 4 == 41_728


def test_the_jsd_folds_one_more_tile_each_way() -> None:
    # 0 < beta < 1: _jsd_tile's second pass (7 fp32 [64, 1000] temporaries instead of 6 in forward) and
    # a tenth in _backward_tile: 64 x 1000 x 4 = 256,000 bytes more in each phase; nothing else moves
    kl = _phases(estimate_post_training(SPEC, SETUP, _post(beta=1.0)))
    jsd = _phases(estimate_post_training(SPEC, SETUP, _post(beta=0.5)))
    assert jsd[Phase.FORWARD] - kl[Phase.FORWARD] == 64 * 1000 * 4
    assert jsd[Phase.BACKWARD] - kl[Phase.BACKWARD] == 64 * 1000 * 4
    assert jsd[Phase.OPTIMIZER] == kl[Phase.OPTIMIZER] and jsd[Phase.ROLLOUT] == kl[Phase.ROLLOUT]


def test_triton_drops_the_torch_fallback_tiles() -> None:
    # on CUDA the tiles fold in Triton kernels: the torch fallback's fp32 temporaries are gone
    cpu = estimate_post_training(SPEC, SETUP, _post())
    on_cuda = TrainingSetup(**{**SETUP.__dict__, "kernel_policy": KernelPolicy.CUDA})
    cuda = estimate_post_training(SPEC, on_cuda, _post())
    key = "loss.divergence_head"
    assert _item(cpu, Phase.FORWARD, key) == _item(cuda, Phase.FORWARD, key)
    assert cuda.peak_allocated_bytes < cpu.peak_allocated_bytes


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"teacher": None}, r"^teacher=None: objective='distill' needs --teacher MODEL"),
        ({"num_generations": 4}, r"^num_generations=4: distillation generates one completion per prompt"),
        ({"beta": 1.5}, r"^beta=1.5: distillation's divergence, between 0"),
        ({"reference": "separate"}, r"^reference='separate': distill is reference-free"),
    ],
)
def test_bad_distillation_jobs_are_one_line_errors(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        post_training("distill", seq=SEQ, completion=COMPLETION, batch=BATCH, **{"teacher": TEACHER, **kw})


def test_a_teacher_of_another_vocabulary_is_refused() -> None:
    other = spec_for_config(dict(TEACHER_CONFIG, vocab_size=1024), name="other")
    post = post_training("distill", seq=SEQ, completion=COMPLETION, batch=BATCH, teacher=other)
    with pytest.raises(InputError, match=r"^teacher='other': its vocabulary \(1,024\) differs"):
        estimate_post_training(SPEC, SETUP, post)


def test_a_teacher_without_distill_is_refused() -> None:
    with pytest.raises(InputError, match=r"^teacher: options of a post-training job"):
        peakmem.train("qwen3-0.6b", teacher="qwen3-8b")


def test_cli_equals_api(capsys: Any) -> None:
    kw = dict(objective="distill", teacher="qwen3-8b", batch=4, seq=2048, beta=0.5)
    api = peakmem.train("qwen3-1.7b", **kw).to_dict()
    argv = ["train", "qwen3-1.7b", "--json"]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli == api
    assert cli["setup"]["post_training"]["teacher"] == "qwen3-8b"
    assert set(cli["phases"]) == {"rollout", "scoring", "forward", "backward", "optimizer"}
    # the teacher in the student's dtype (mixed-bf16: 2 bytes per parameter of qwen3-8b)
    teacher = peakmem.train("qwen3-8b").to_dict()["model"]["params"]
    assert cli["phases_by_role"]["rollout"]["teacher"] == 2 * teacher
