"""PPO with a critic, and GRPO without one (``--trainer verl``): the estimate (peakmem.ppo) against our step
harness in verl's phase order, on the CPU.

:func:`peakmem.measure.ppo.measure_ppo` runs two PPO iterations (rollout with transformers ``generate``,
scoring, critic update, actor update) of a tiny Llama policy and a critic built from the same config, and
records the live tensor bytes at each phase's peak. :func:`peakmem.jobs.estimate_post_training` with the
CPU kernel rules must name the same peak phase and agree within :data:`TOLERANCE` on every phase (so
within the issue's 3% median and 8% worst at the peak). The grid: a full and a LoRA actor, with and
without a reference (a separate copy; the adapter-disabled actor), gradient checkpointing none and full,
a generation batch of two micro-batches, and a short response (where the logits' [B, L, V] gradient, not
the log-prob's [B, R, V] tiles, is the actor's backward peak), the entropy in the actor's loss, and
amp-bf16 (CPU autocast) for a full and a LoRA actor.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from peakmem.jobs import estimate_post_training
from peakmem.measure.ppo import measure_ppo
from peakmem.post_training import post_training
from peakmem.resolve import spec_for_config
from peakmem.training import Checkpointing, KernelPolicy, Method, OptimizerImpl, Precision, TrainingSetup
from tiny_models import LLAMA

pytestmark = pytest.mark.torch

TOLERANCE = 0.03  # every phase, estimate vs the tracker's live bytes (measured: within 1.2%)
CONFIG = dict(LLAMA, eos_token_id=2, pad_token_id=3)
WIDER = dict(CONFIG, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4)  # fmt: skip

FP32, AMP = Precision.FP32, Precision.AMP_BF16
CASES = [
    # (method, beta, checkpointing, config, batch, seq, completion, steps_per_generation, entropy, precision)
    ("full", 0.0, Checkpointing.NONE, CONFIG, 2, 32, 16, 1, False, FP32),
    ("full", 0.001, Checkpointing.NONE, CONFIG, 2, 32, 16, 2, False, FP32),  # a separate reference copy
    ("lora", 0.001, Checkpointing.NONE, CONFIG, 2, 32, 16, 1, False, FP32),  # the adapter-disabled reference
    ("lora", 0.0, Checkpointing.FULL, CONFIG, 2, 32, 16, 1, False, FP32),
    ("full", 0.001, Checkpointing.FULL, WIDER, 2, 64, 32, 1, False, FP32),
    ("full", 0.0, Checkpointing.NONE, CONFIG, 4, 48, 8, 1, False, FP32),  # a short response
    ("full", 0.0, Checkpointing.NONE, CONFIG, 2, 32, 16, 1, True, FP32),  # the entropy in the actor's loss
    # autocast: 16-bit logits (each row's log_softmax saved), the scoring passes' cached weight casts
    ("full", 0.0, Checkpointing.NONE, CONFIG, 4, 48, 8, 1, False, AMP),
    ("lora", 0.01, Checkpointing.NONE, CONFIG, 2, 32, 16, 1, False, AMP),
]


def _case(c: tuple[Any, ...]) -> str:
    method, beta, ck, cfg, b, seq, comp, spg, ent, prec = c
    size = "wider" if cfg is WIDER else "tiny"
    name = f"{method}-beta{beta}-{ck.value}-{size}-b{b}-s{seq}-r{comp}-g{spg}-{prec.value}"
    return name + ("-entropy" if ent else "")


@pytest.mark.parametrize("case", CASES, ids=_case)
def test_ppo_estimate_matches_the_harness(case: tuple[Any, ...]) -> None:
    _check_against_harness("ppo", case)


# GRPO / RLOO under verl's loop (--trainer verl): no critic, the advantages from each group's scores
VERL_GRPO_CASES = [
    ("full", 0.001, Checkpointing.NONE, CONFIG, 2, 32, 16, 1, False, FP32),  # a separate reference copy
    # the adapter-disabled reference; one micro-batch per generation batch: generate on an unmerged LoRA
    # policy adds the adapters' per-Linear temporaries in prefill, which the rollout does not model (-2.2%
    # here, -4.0% with a generation batch of 4)
    ("lora", 0.001, Checkpointing.FULL, CONFIG, 2, 32, 16, 1, False, FP32),
    ("full", 0.0, Checkpointing.NONE, CONFIG, 4, 48, 8, 1, True, AMP),  # no reference, the entropy
]


@pytest.mark.parametrize("case", VERL_GRPO_CASES, ids=_case)
def test_verl_grpo_estimate_matches_the_harness(case: tuple[Any, ...]) -> None:
    _check_against_harness("grpo", case)


def _check_against_harness(objective: str, case: tuple[Any, ...]) -> None:
    method, beta, ck, cfg, b, seq, comp, spg, ent, prec = case
    setup = TrainingSetup(
        method=Method(method), precision=prec, micro_batch=b, seq_len=seq, grad_accum=spg,
        checkpointing=ck, optimizer_impl=OptimizerImpl.FOR_LOOP, kernel_policy=KernelPolicy.CPU,
    )  # fmt: skip
    post = post_training(
        objective,
        beta=beta,
        completion=comp,
        seq=seq,
        batch=b,
        steps_per_generation=spg,
        adapter=method != "full",
        entropy=ent,
        num_generations=2 if objective == "grpo" else None,
        trainer="verl",
    )
    assert post is not None
    estimate = estimate_post_training(spec_for_config(cfg), setup, post)
    measured = measure_ppo(cfg, setup, post)
    est = {p.phase: p.bytes for p in estimate.phases}
    assert set(est) == {p.phase for p in measured.phases}
    off = {p.phase.value: est[p.phase] / p.bytes - 1 for p in measured.phases}
    assert estimate.peak_phase is measured.peak_phase, off
    assert all(abs(e) <= TOLERANCE for e in off.values()), off
