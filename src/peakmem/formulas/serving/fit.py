"""Whether a serving job fits one GPU, and the largest batch or context that does.

For vLLM/SGLang, a job fits when the pool the engine carves out of that GPU holds the request;
for the others, when what the request needs fits the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from peakmem.breakdown import Estimate, Verdict
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.serving.context import fraction_base
from peakmem.formulas.serving.estimate import estimate_inference
from peakmem.formulas.serving.paged import POOLED_ENGINES
from peakmem.inference import InferenceSetup
from peakmem.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class ServingFit:
    """Whether a serving job fits one GPU (one tensor-parallel rank) of ``capacity_bytes``.

    ``needed_bytes`` is what the request needs (weights, activations / profiled peak, sampler
    buffers, KV cache of ``batch`` sequences of ``context`` tokens, context and allocator overheads):
    the estimate's device total, the same on every GPU. Engines that preallocate a KV pool (vLLM,
    SGLang) fit when the pool they carve out of ``gpu_memory_utilization x GPU`` holds the request
    (``max_concurrent >= batch``) and the request fits the GPU; the others when ``needed_bytes`` fits.
    """

    needed_bytes: int
    capacity_bytes: int
    fits: bool
    headroom_bytes: int  # pooled engines: the smaller of the pool's spare and the GPU's
    max_concurrent: int | None  # pooled engines: sequences of ``context`` tokens the pool holds
    pool_bytes: int | None  # pooled engines: the KV pool on that GPU
    budget_bytes: int | None  # pooled engines: the fraction x GPU (SGLang: x what the CUDA context leaves)
    fraction: float | None  # pooled engines: gpu_memory_utilization / mem_fraction_static used
    kv_needed_bytes: int | None  # pooled engines: the KV cache of the request (batch x context)
    batch: int
    context: int
    engine: str
    estimate: Estimate

    def verdict(self, gpu: str) -> ServingVerdict:
        band = self.estimate.band
        high = band.device_total.high if band is not None else None
        return ServingVerdict(gpu=gpu, capacity_bytes=self.capacity_bytes, needed_bytes=self.needed_bytes,
                              high_bytes=high, serving=self)  # fmt: skip

    @property
    def max_concurrent_alone(self) -> int | None:
        """With a shared prefix: the sequences the pool would hold if each kept its prefix's blocks."""
        alone = self.estimate.extra.get("max_concurrent_without_prefix_sharing")
        return alone if isinstance(alone, int) else None

    def json(self) -> dict[str, object]:
        alone = self.max_concurrent_alone
        return {
            "needed_bytes": self.needed_bytes, "capacity_bytes": self.capacity_bytes, "fits": self.fits,
            "headroom_bytes": self.headroom_bytes, "max_concurrent": self.max_concurrent,
            **({"max_concurrent_without_prefix_sharing": alone} if alone is not None else {}),
            "kv_pool_bytes": self.pool_bytes, "memory_budget_bytes": self.budget_bytes,
            "kv_needed_bytes": self.kv_needed_bytes, "memory_fraction": self.fraction,
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ServingVerdict(Verdict):
    """A :class:`Verdict` whose answer is :func:`serving_fit`'s (a pooled engine's pool, not bytes alone)."""

    serving: ServingFit

    @property
    def fits(self) -> bool:
        return self.serving.fits

    @property
    def headroom_bytes(self) -> int:
        return self.serving.headroom_bytes


def serving_fit(
    spec: ModelSpec, setup: InferenceSetup, capacity_bytes: int, *, overheads: Overheads | None = None
) -> ServingFit:
    """The one verdict of serving ``setup`` on a GPU of ``capacity_bytes`` (``infer`` and ``fit --infer``)."""
    if setup.gpu_bytes != capacity_bytes:  # another GPU: its nvidia-smi total is not the setup's
        setup = replace(setup, gpu_bytes=capacity_bytes, gpu_smi_bytes=None)
    est = estimate_inference(spec, setup, overheads=overheads)
    needed = est.device_total_bytes
    context = _int(est, "context")
    fits, headroom = needed <= capacity_bytes, capacity_bytes - needed
    pool: int | None = None
    conc: int | None = None
    budget: int | None = None
    kv_needed: int | None = None
    fraction: float | None = None
    if setup.engine in POOLED_ENGINES:
        fraction = setup.memory_fraction(capacity_bytes)
        pool, conc = _int(est, "kv_pool_bytes"), _int(est, "max_concurrent_sequences")
        budget, kv_needed = _int(est, "memory_budget_bytes"), _int(est, "kv_needed_bytes")
        fits = fits and conc >= setup.batch
        headroom = min(headroom, pool - kv_needed)
        beyond = est.extra.get("sglang_beyond_budget_bytes")
        if isinstance(beyond, int):
            # SGLang speculative decoding: what it allocates past mem_fraction_static at launch
            # (formulas/serving/sglang_spec.py) must fit in what the CUDA context leaves beside the budget
            launch_room = fraction_base(setup.engine, capacity_bytes) - budget - beyond
            fits, headroom = fits and launch_room >= 0, min(headroom, launch_room)
    return ServingFit(
        needed_bytes=needed, capacity_bytes=capacity_bytes, fits=fits, headroom_bytes=headroom,
        max_concurrent=conc, pool_bytes=pool, budget_bytes=budget, kv_needed_bytes=kv_needed,
        fraction=fraction,
        batch=setup.batch, context=context, engine=setup.engine.value, estimate=est,
    )  # fmt: skip


def _int(est: Estimate, key: str) -> int:
    value = est.extra[key]
    assert isinstance(value, int), key
    return value


def _fits(spec: ModelSpec, setup: InferenceSetup, gpu_bytes: int) -> bool:
    return serving_fit(spec, setup, gpu_bytes).fits


def max_concurrent(spec: ModelSpec, setup: InferenceSetup, gpu_bytes: int) -> int:
    """Most sequences of ``setup.context`` tokens that run at once on a GPU of ``gpu_bytes``
    (per rank with tensor parallelism); 0 when not even one fits."""
    base = replace(setup, gpu_bytes=gpu_bytes, batch=1)
    if setup.engine in POOLED_ENGINES:
        conc = estimate_inference(spec, base).extra.get("max_concurrent_sequences", 0)
        return conc if isinstance(conc, int) else 0
    return _largest(lambda n: _fits(spec, replace(base, batch=n), gpu_bytes), 1, 1 << 20)


def max_context(spec: ModelSpec, setup: InferenceSetup, gpu_bytes: int) -> int:
    """Longest context (prompt + generated, up to the model's limit) for ``setup.batch`` sequences
    that fits on a GPU of ``gpu_bytes``; 0 when not even one token fits."""
    limit = spec.max_position_embeddings
    base = replace(setup, gpu_bytes=gpu_bytes, prompt=None, strict=False)
    return _largest(lambda n: _fits(spec, replace(base, context=n), gpu_bytes), 1, limit)


def _largest(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest n in [lo, hi] with ok(n) true, assuming ok is monotone decreasing; 0 if none."""
    if not ok(lo):
        return 0
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
