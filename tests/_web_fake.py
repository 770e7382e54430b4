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


# --- a band and a three-state verdict, as peakmem's JSON carries them once estimates have a band -----
# The page must draw them when present (and do without them when absent); these hand-checkable numbers
# stand in for the estimator's: low = 93%, high = 111% of each quantity.
BAND_LOW_PCT = 93
BAND_HIGH_PCT = 111


def band_of(n: int) -> dict[str, int]:
    return {"low_bytes": n * BAND_LOW_PCT // 100, "likely_bytes": n, "high_bytes": n * BAND_HIGH_PCT // 100}


def three_state(capacity: int, device: dict[str, int]) -> str:
    """fits above the band's high end, does not fit below its low end, tight within it."""
    if capacity >= device["high_bytes"]:
        return "fits"
    return "does not fit" if capacity < device["low_bytes"] else "tight"


def with_band(answer: dict[str, Any]) -> dict[str, Any]:
    """A train/infer answer (or a fit answer with its ``estimate``) with ``band`` and ``verdict`` added:
    the JSON shape of ``{"band": {"allocated"|"reserved"|"device_total": {low,likely,high}, "terms": [...]},
    "verdicts": [{..., "verdict": "fits"|"tight"|"does not fit"}]}``."""
    out = dict(answer)
    if "estimate" in out:
        out["estimate"] = with_band(out["estimate"])
        device = out["estimate"]["band"]["device_total"]
        out["gpus"] = [{**g, "verdict": three_state(g["capacity_bytes"], device)} for g in out["gpus"]]
        return out
    total = out["device_total_bytes"]
    device = band_of(total)
    out["band"] = {
        "allocated": band_of(out["peak_allocated_bytes"]),
        "reserved": band_of(out["peak_reserved_bytes"]),
        "device_total": device,
        "terms": [
            {"name": "activations (kernel choice)", "low_bytes": -(total * 5 // 100),
             "high_bytes": total * 8 // 100, "source": "fake: 5% below, 8% above"},
            {"name": "allocator fragmentation", "low_bytes": -(total * 2 // 100),
             "high_bytes": total * 3 // 100, "source": "fake: 2% below, 3% above"},
        ],
    }  # fmt: skip
    verdicts = [{**v, "verdict": three_state(v["capacity_bytes"], device)} for v in out.get("verdicts", [])]
    if verdicts:
        out["verdicts"] = verdicts
    if len(verdicts) == 1:
        out["verdict"] = verdicts[0]["verdict"]
    return out
