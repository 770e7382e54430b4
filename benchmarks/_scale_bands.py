"""The bands of benchmarks/published_scale.py's compared quantities and the sides of their misses: what a
row's estimate, low and high end are for the quantity the source measured (its module docstring lists them),
and which side of the band a measurement outside it lies on, in memory-use terms."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peakmem.catalog import Gpu

# quantities that are what the job leaves, not what it uses: a miss or error is read with its sign turned
USE_INVERTED = ("vllm_available_kv_cache", "sglang_kv_pool")
# quantities an engine computes and logs (not a memory reading): compared as figures, no allocator slack
ENGINE_FIGURES = ("vllm_non_kv", "vllm_available_kv_cache", "sglang_kv_pool")


def non_kv_band(data: dict[str, Any]) -> tuple[int, int, int]:
    """vLLM's non-KV memory as peakmem sizes the pool (budget less pool) and its band: the formula residual
    on what the allocator holds and the range of what lies outside it (from vLLM 0.9 the profile's non-torch
    increase, formulas/serving/vllm_profile.py; before, the CUDA context's: formulas/band.py)."""
    from peakmem.formulas.band import build_band, context_term, residual_term
    from peakmem.formulas.serving.context import CUDA_CONTEXT_BYTES
    from peakmem.formulas.serving.vllm_profile import NonTorch, non_torch_term

    verdict = data["verdicts"][0]
    likely = verdict["memory_budget_bytes"] - verdict["kv_pool_bytes"]
    if "vllm_non_torch_bytes" in data:
        outside = data["vllm_non_torch_bytes"]
        span = non_torch_term(NonTorch(low=data["vllm_non_torch_low_bytes"], likely=outside,
                                       high=data["vllm_non_torch_high_bytes"]))  # fmt: skip
    else:
        outside, span = CUDA_CONTEXT_BYTES, context_term(CUDA_CONTEXT_BYTES, assumed=True)
    allocated = likely - outside
    terms = (residual_term(allocated), span)
    b = build_band(allocated=allocated, reserved=allocated, device_total=likely, terms=terms).device_total
    return b.low, b.likely, b.high


def pool_band(data: dict[str, Any]) -> tuple[int, int, int]:
    """vLLM's KV pool as peakmem sizes it on the point's GPU and its band: the budget less the non-KV band
    (:func:`non_kv_band`), low and high swapped."""
    budget = data["verdicts"][0]["memory_budget_bytes"]
    low, likely, high = non_kv_band(data)
    return budget - high, budget - likely, budget - low


def sglang_pool_band(data: dict[str, Any]) -> tuple[int, int, int]:
    """SGLang's KV pool (its 'KV Cache is allocated' K + V sizes) as peakmem sizes it and its band.

    SGLang's pool is mem_fraction_static of the memory free after the CUDA context is up, less what the
    weights take (formulas/serving/context.py ``fraction_base``): the formula residual on the weights and
    the range of the context at that moment (formulas/band.py ``context_term``), scaled by the fraction,
    move it. Decided 2026-12-07 (session 24) before any SGLang point was estimated."""
    from peakmem.formulas.band import context_term, residual_term
    from peakmem.formulas.serving.context import CUDA_CONTEXT_BYTES

    verdict = data["verdicts"][0]
    pool, budget, fraction = (
        verdict["kv_pool_bytes"],
        verdict["memory_budget_bytes"],
        verdict["memory_fraction"],
    )
    residual = residual_term(budget - pool)  # the weights and whatever else the budget holds before the pool
    context = context_term(CUDA_CONTEXT_BYTES, assumed=True)
    low = pool - residual.high_bytes - int(fraction * context.high_bytes)
    high = pool - residual.low_bytes - int(fraction * context.low_bytes)
    return low, pool, high


def band(data: dict[str, Any], quantity: str, gpu: Gpu | None = None) -> tuple[int, int, int]:
    """(low, likely, high) bytes of the estimate for ``quantity`` (``nvml_v1_used``: on ``gpu``)."""
    from peakmem.formulas.overhead import nvml_v1_used_bytes

    if quantity == "vllm_non_kv":
        return non_kv_band(data)
    if quantity == "vllm_available_kv_cache":
        return pool_band(data)
    if quantity == "sglang_kv_pool":
        return sglang_pool_band(data)
    band = data["band"]
    if quantity == "allocated_plus_external":
        alloc = band["allocated"]
        external = data["device_total_bytes"] - data["peak_reserved_bytes"]
        terms = [t for t in band["terms"] if t["applies_to"] == "device_total"]
        ext_low = external + sum(t["low_bytes"] for t in terms)
        ext_high = external + sum(t["high_bytes"] for t in terms)
        return alloc["low_bytes"] + ext_low, alloc["likely_bytes"] + external, alloc["high_bytes"] + ext_high
    if quantity == "nvml_v1_used":
        assert gpu is not None, "nvml_v1_used needs the point's GPU"
        b = band["device_total"]
        extra = nvml_v1_used_bytes(data["device_total_bytes"], gpu) - data["device_total_bytes"]
        return b["low_bytes"] + extra, b["likely_bytes"] + extra, b["high_bytes"] + extra
    row = {"peak_reserved": "reserved", "peak_allocated": "allocated", "nvidia_smi": "device_total"}[quantity]
    b = band[row]
    return b["low_bytes"], b["likely_bytes"], b["high_bytes"]


def miss_side(quantity: str, low: int, high: int, measured: int) -> str | None:
    """None inside the band; else "low" where peakmem's memory use is below the measured one (the OOM
    side: the band below a use, or above a pool, USE_INVERTED) and "high" otherwise."""
    if low <= measured <= high:
        return None
    below = high < measured
    return "low" if below != (quantity in USE_INVERTED) else "high"


def miss_text(r: dict[str, Any]) -> str:
    """The table's side of a miss; a pool's says so (its "low" is an estimate above the logged pool)."""
    if r["quantity"] not in USE_INVERTED:
        return str(r["band_miss"])
    return r["band_miss"] + (": the pool too large" if r["band_miss"] == "low" else ": the pool too small")


def use_error(r: dict[str, Any]) -> float:
    """The row's error in memory-use terms (a pool's turned: see USE_INVERTED)."""
    return -r["error"] if r["quantity"] in USE_INVERTED else r["error"]
