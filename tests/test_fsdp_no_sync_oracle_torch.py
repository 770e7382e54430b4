"""FSDP2 gradient accumulation under accelerate's ``no_sync`` (``set_requires_gradient_sync(False)`` on
every micro-batch but the last: ``grad_sync='last-micro-batch'``) in the parallel oracle
(:mod:`peakmem.measure.parallel`, the real ``fully_shard`` code on torch's fake process group), against
peakmem's per-rank estimate within 3% (issue 27's tolerance) on every phase. Tiny Llama (hidden 128,
2 layers, vocabulary 512), 2 micro-batches of 2 x 64 tokens, 2 steps, rank 0. About 10 s.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torch.testing._internal.distributed.fake_pg")

from peakmem.breakdown import Phase  # noqa: E402
from peakmem.measure.parallel import TINY_LLAMA, compare_rank, describe, measure_rank  # noqa: E402
from peakmem.parallel import FsdpMode, Parallelism  # noqa: E402
from peakmem.training import (  # noqa: E402
    Checkpointing,
    GradSync,
    KernelPolicy,
    OptimizerImpl,
    Precision,
    ReduceDtype,
    TrainingSetup,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TOLERANCE = 0.03
SETUP = TrainingSetup(
    precision=Precision.FP32, micro_batch=2, seq_len=64, grad_accum=2, kernel_policy=KernelPolicy.CPU,
    optimizer_impl=OptimizerImpl.FOREACH, grad_sync=GradSync.LAST,
    fsdp_reduce_dtype=ReduceDtype.FP32,  # the policy these cases were measured under (torchtitan's)
)  # fmt: skip
FSDP4 = Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD)
# TINY_LLAMA's elements: 2 layer units of 181,504 and the root (embedding, final norm, head) of 131,200
ELEMENTS = 2 * 181_504 + 131_200


def test_the_oracle_keeps_the_unsharded_gradients() -> None:
    """The oracle itself, by hand: a later micro-batch's forward holds every fp32 gradient whole
    (4 x 494,208) where reduce-scattering each micro-batch leaves a quarter of them."""
    last = measure_rank(TINY_LLAMA, SETUP, FSDP4, 0).phases[Phase.FORWARD]
    each = measure_rank(TINY_LLAMA, replace(SETUP, grad_sync=GradSync.EACH), FSDP4, 0).phases[Phase.FORWARD]
    assert last - each == 4 * ELEMENTS * 3 // 4 == 1_482_624


@pytest.mark.parametrize(
    ("par", "setup"),
    [
        pytest.param(FSDP4, SETUP, id="fsdp4-fp32"),
        pytest.param(
            FSDP4,
            replace(SETUP, precision=Precision.MIXED_BF16, checkpointing=Checkpointing.FULL),
            id="fsdp4-mixed-bf16-full-ac",
        ),
        pytest.param(
            FSDP4,
            replace(SETUP, precision=Precision.MIXED_BF16, fsdp_reduce_dtype=ReduceDtype.AUTO),
            id="fsdp4-mixed-bf16-accelerate",
        ),
        pytest.param(
            Parallelism(gpus=4, tp=2, fsdp=FsdpMode.FULL_SHARD),
            replace(SETUP, precision=Precision.MIXED_BF16),
            id="tp2-fsdp2-mixed-bf16",
        ),
    ],
)
def test_no_sync_within_tolerance(par: Parallelism, setup: TrainingSetup) -> None:
    """Measured (oracle error of the estimate): fsdp4 fp32 forward / backward / step -0.02 / -0.02 /
    -0.00%; fsdp4 mixed-bf16 under full checkpointing -0.07 / -0.03 / -0.00% (+5.8% in backward while
    the kept reduce-scatter input was counted: formulas/fsdp2.py reduce_adds); tp2 x fsdp2 mixed-bf16
    -0.12 / -0.15 / -0.00%; fsdp4 mixed-bf16 under accelerate's policy (the HF default, reduce_dtype =
    param_dtype = bf16: bf16 unsharded gradients kept) -0.07 / -0.03 / -0.00%, its oracle 988,416 B
    (2 B x 494,208 elements) below the fp32 policy's in forward and backward."""
    rows = compare_rank(TINY_LLAMA, setup, par, 0)
    misses = [
        f"{r.phase.value}: {r.error:+.1%}" for r in rows if r.error is not None and abs(r.error) > TOLERANCE
    ]
    assert not misses, f"{describe(par)}: " + "; ".join(misses)
