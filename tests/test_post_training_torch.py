"""Post-training estimates against TRL 1.16's own DPO and GRPO trainers, run on the CPU.

:func:`peakmem.measure.post_training.measure_post_training` runs two optimizer steps of the trainer
(transformers ``generate`` for GRPO's rollout) on a tiny Llama and records the live tensor bytes at the
peak of each phase; :func:`peakmem.jobs.estimate_post_training` with the CPU kernel rules must agree
within :data:`TOLERANCE` on every phase and name the same peak phase. The grid is the issue's: DPO
(and KTO) with a separate, an adapter-disabled and a precomputed reference; GRPO with beta 0 and > 0, 2 and 4
generations, full and LoRA; an amp-bf16 run and a larger tiny model with gradient checkpointing.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("trl")

from peakmem.jobs import estimate_post_training
from peakmem.measure.post_training import measure_post_training
from peakmem.post_training import post_training
from peakmem.resolve import spec_for_config
from peakmem.training import (
    Checkpointing,
    KernelPolicy,
    Method,
    OptimizerImpl,
    Precision,
    TrainingSetup,
)
from tiny_models import LLAMA

pytestmark = pytest.mark.torch

TOLERANCE = 0.03  # the job's peak, estimate vs the tracker's live bytes (the issue: 3% median, 8% worst)
# every other phase: generate through a peft model (the LoRA policy's rollout) allocates the adapters'
# x @ A and B outputs, and a LoRA optimizer step its small tensors' temporaries, which the serving and
# step formulas do not carry; on these tiny models that is up to 9% of a phase of a few MB
PHASE_TOLERANCE = 0.10
CONFIG = dict(LLAMA, eos_token_id=2, pad_token_id=3)
# wider and deeper, so the layers' activations are not dwarfed by TRL's 32768-column log-prob tile
WIDER = dict(CONFIG, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4)  # fmt: skip

CASES = [
    # (objective, reference, method, beta, generations, precision, config, checkpointing, seq)
    ("dpo", "separate", "full", None, None, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("dpo", "adapter", "lora", None, None, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("dpo", "precomputed", "full", None, None, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("kto", "separate", "full", None, None, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("kto", "adapter", "lora", None, None, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("kto", "precomputed", "full", None, None, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("grpo", "auto", "full", 0.0, 2, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("grpo", "auto", "full", 0.04, 4, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("grpo", "auto", "lora", 0.0, 4, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("grpo", "auto", "lora", 0.04, 2, Precision.FP32, CONFIG, Checkpointing.NONE, 32),
    ("grpo", "auto", "full", 0.04, 2, Precision.AMP_BF16, CONFIG, Checkpointing.NONE, 32),
    ("grpo", "auto", "full", 0.04, 4, Precision.FP32, WIDER, Checkpointing.FULL, 64),
    ("dpo", "separate", "full", None, None, Precision.FP32, WIDER, Checkpointing.FULL, 64),
]


def _holds(estimate: Any, measured: Any) -> None:
    """The same phases, each within PHASE_TOLERANCE, the same peak phase, its bytes within TOLERANCE."""
    est = {p.phase: p.bytes for p in estimate.phases}
    off = {p.phase.value: est[p.phase] / p.bytes - 1 for p in measured.phases}
    assert set(est) == {p.phase for p in measured.phases}
    assert all(abs(e) <= PHASE_TOLERANCE for e in off.values()), off
    assert estimate.peak_phase is measured.peak_phase
    assert abs(off[measured.peak_phase.value]) <= TOLERANCE, off


def _case(c: tuple[Any, ...]) -> str:
    obj, ref, method, beta, gens, prec, cfg, ck, _seq = c
    size = "wider" if cfg is WIDER else "tiny"
    return f"{obj}-{ref}-{method}-beta{beta}-g{gens}-{prec.value}-{size}-{ck.value}"


@pytest.mark.parametrize("case", CASES, ids=_case)
def test_estimate_holds_against_trl_on_the_cpu(case: tuple[Any, ...]) -> None:
    obj, ref, method, beta, gens, precision, config, checkpointing, seq = case
    setup = TrainingSetup(
        method=Method(method), precision=precision, optimizer_impl=OptimizerImpl.FOR_LOOP, micro_batch=4,
        seq_len=seq, checkpointing=checkpointing, kernel_policy=KernelPolicy.CPU,
    )  # fmt: skip
    post = post_training(obj, reference=ref, beta=beta, num_generations=gens, completion=seq // 2, seq=seq,
                         batch=4, adapter=method != "full")  # fmt: skip
    measured = measure_post_training(config, setup, post)
    estimate = estimate_post_training(spec_for_config(config, name="tiny"), setup, post)
    _holds(estimate, measured)


# distillation: TRL's DistillationTrainer with a wider, deeper teacher of the same vocabulary
TEACHER = dict(CONFIG, hidden_size=96, intermediate_size=256, num_attention_heads=6, num_key_value_heads=2,
               num_hidden_layers=3)  # fmt: skip
# a student whose layers weigh as much as TRL's two 32768-column divergence tiles (vocab 128, hidden 256)
WIDE = dict(CONFIG, vocab_size=128, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4)  # fmt: skip
WIDE_TEACHER = dict(WIDE, hidden_size=384, intermediate_size=1024, num_attention_heads=12)
DISTILL_CASES = [
    # (beta, method, precision, checkpointing, student, teacher, seq, batch)
    (1.0, "full", Precision.FP32, Checkpointing.NONE, CONFIG, TEACHER, 32, 4),  # reverse KL, the default
    (0.5, "full", Precision.FP32, Checkpointing.NONE, CONFIG, TEACHER, 32, 4),  # the JSD's second pass
    (0.0, "full", Precision.FP32, Checkpointing.FULL, CONFIG, TEACHER, 32, 4),  # forward KL, checkpointed
    (1.0, "lora", Precision.FP32, Checkpointing.NONE, CONFIG, TEACHER, 32, 4),
    (0.5, "full", Precision.AMP_BF16, Checkpointing.NONE, CONFIG, TEACHER, 32, 4),
    (1.0, "full", Precision.FP32, Checkpointing.NONE, WIDE, WIDE_TEACHER, 128, 8),
]


def _distill_case(c: tuple[Any, ...]) -> str:
    size = "wide" if c[4] is WIDE else "tiny"
    return f"beta{c[0]}-{c[1]}-{c[2].value}-{c[3].value}-{size}"


@pytest.mark.parametrize("case", DISTILL_CASES, ids=_distill_case)
def test_distillation_holds_against_trl_on_the_cpu(case: tuple[Any, ...]) -> None:
    beta, method, precision, checkpointing, student, teacher_config, seq, batch = case
    setup = TrainingSetup(
        method=Method(method), precision=precision, optimizer_impl=OptimizerImpl.FOR_LOOP, micro_batch=batch,
        seq_len=seq, checkpointing=checkpointing, kernel_policy=KernelPolicy.CPU,
    )  # fmt: skip
    teacher = spec_for_config(teacher_config, name="teacher")
    post = post_training("distill", beta=beta, completion=seq // 2, seq=seq, batch=batch, teacher=teacher,
                         adapter=method != "full")  # fmt: skip
    measured = measure_post_training(student, setup, post, teacher_config=teacher_config)
    estimate = estimate_post_training(spec_for_config(student, name="tiny"), setup, post)
    _holds(estimate, measured)
