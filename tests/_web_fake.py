"""A small stand-in estimator for the plot and web tests: simple hand-checkable numbers.

Model states 16 bytes/param (2 weights + 2 grads + 4 master + 8 Adam), activations
``ACT_PER_TOKEN`` bytes per token, reserved = allocated + ``SLACK``, device = reserved + ``CONTEXT``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from peakmem.breakdown import Category, Estimate, MemoryItem, PerParamRow, Phase, PhasePeak

PARAMS = 1_000_000_000
ACT_PER_TOKEN = 1_000_000
SLACK = 500_000_000
CONTEXT = 500_000_000


@dataclass(frozen=True)
class FakeSpec:
    name: str = "fake-1b"
    max_position_embeddings: int = 4096
    params: int = PARAMS


def fake_estimate(spec: Any, setup: Any) -> Estimate:
    p = spec.params
    trainable = p if setup.method.value == "full" else p // 100
    rows = (
        PerParamRow(tensor="weights", dtype="bf16", bytes_per_param=2, bytes=2 * p, params=p,
                    category=Category.PARAMETERS),
        PerParamRow(tensor="gradients", dtype="bf16", bytes_per_param=2, bytes=2 * trainable,
                    params=trainable, category=Category.GRADIENTS),
        PerParamRow(tensor="master weights", dtype="fp32", bytes_per_param=4, bytes=4 * trainable,
                    params=trainable, category=Category.MASTER_WEIGHTS),
        PerParamRow(tensor="Adam m+v", dtype="fp32", bytes_per_param=8, bytes=8 * trainable, params=trainable,
                    category=Category.OPTIMIZER_STATES),
    )  # fmt: skip
    act = ACT_PER_TOKEN * setup.micro_batch * setup.seq_len
    items = (*(MemoryItem(path=r.tensor, category=r.category, bytes=r.bytes) for r in rows),
             MemoryItem(path="activations", category=Category.ACTIVATIONS, bytes=act))  # fmt: skip
    allocated = sum(i.bytes for i in items)
    return Estimate(
        method="analytic", job="train", model_name=spec.name, params=p, trainable_params=trainable,
        per_param=rows, items=items,
        phases=(PhasePeak(phase=Phase.BACKWARD, bytes=allocated),), peak_phase=Phase.BACKWARD,
        peak_allocated_bytes=allocated, peak_reserved_bytes=allocated + SLACK,
        device_total_bytes=allocated + SLACK + CONTEXT, assumptions=("fake",),
        setup={"batch": setup.micro_batch, "seq": setup.seq_len, "method": setup.method.value},
    )  # fmt: skip


def fake_ways(spec: Any, setup: Any) -> list[tuple[str, Estimate]]:
    from peakmem.training import Method

    return [
        ("LoRA", fake_estimate(spec, replace(setup, method=Method.LORA))),
        ("batch 1", fake_estimate(spec, replace(setup, micro_batch=1))),
    ]
