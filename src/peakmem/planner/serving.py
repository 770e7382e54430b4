"""``peakmem fit --infer``: serving verdicts per GPU and the changes that make a serving job fit."""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, replace
from typing import Any

from peakmem.breakdown import Estimate
from peakmem.catalog import Gpu
from peakmem.errors import InputError, require
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.serving import max_concurrent, max_context, serving_fit
from peakmem.inference import InferenceSetup
from peakmem.model import ModelSpec
from peakmem.planner.search import (
    MAX_CHANGES,
    TOP_CANDIDATES,
    Change,
    Family,
    _family_json,
    _largest_true,
    _value,
)
from peakmem.vllm_defaults import SMALL_TIER

# --- fit --infer ----------------------------------------------------------------------------------
INFER_MAX_TP = 8  # tensor parallel inside one node


@dataclass(frozen=True, kw_only=True)
class InferCandidate:
    """A changed inference job, estimated on its own (per tensor-parallel rank)."""

    label: str
    steps: tuple[str, ...]
    changes: tuple[Change, ...]
    setup: InferenceSetup
    estimate: Estimate
    needed_bytes: int  # device total of one rank
    capacity_bytes: int
    fits: bool  # vLLM/SGLang: the pool holds ``batch`` sequences; others: device total <= capacity
    max_concurrent: int | None  # vLLM/SGLang: sequences of ``context`` tokens the pool holds
    changes_job: bool = False

    @property
    def gpus(self) -> int:
        return self.setup.layout.gpus  # tp, or the whole deployment's (peakmem.serving_layout)


@dataclass(frozen=True, kw_only=True)
class InferGpuFit:
    gpu: Gpu
    fits: bool
    needed_bytes: int
    capacity_bytes: int
    max_context: int  # longest context one sequence of the batch can have (0: none)
    max_concurrent: int  # most sequences of the context that run at once (0: none)
    candidates: tuple[InferCandidate, ...]
    singles: tuple[InferCandidate, ...]


@dataclass(frozen=True, kw_only=True)
class InferFitReport:
    model: str
    params: int
    setup: InferenceSetup
    gpus: tuple[InferGpuFit, ...]
    smallest_sufficient: str | None
    search_space: tuple[Family, ...]
    assumptions: tuple[str, ...]
    estimates: int
    elapsed_s: float

    @property
    def any_fits(self) -> bool:
        return any(g.fits for g in self.gpus)


class _InferEstimator:
    def __init__(self, spec: ModelSpec, overheads: Overheads | None = None) -> None:
        self.spec, self.overheads = spec, overheads
        self.memo: dict[tuple[InferenceSetup, int], tuple[Estimate, int, bool, int | None] | None] = {}
        self.calls = 0

    def __call__(self, setup: InferenceSetup, capacity: int) -> tuple[Estimate, int, bool, int | None] | None:
        """(estimate, needed bytes, fits, max concurrent sequences) of ``setup`` on ``capacity`` bytes."""
        key = (setup, capacity)
        if key in self.memo:
            return self.memo[key]
        self.calls += 1
        try:
            f = serving_fit(self.spec, setup, capacity, overheads=self.overheads)
        except (InputError, NotImplementedError):
            self.memo[key] = None
            return None
        out = (f.estimate, f.needed_bytes, f.fits, f.max_concurrent)
        self.memo[key] = out
        return out


def _weight_options(setup: InferenceSetup) -> tuple[str, ...]:
    """Smaller weight formats the engine loads, least invasive first."""
    fmt = setup.weight_format
    engine = setup.engine.value
    if engine == "llamacpp":
        ladder: tuple[str, ...] = ("q8_0", "q6_k", "q4_k_m")
    elif engine in ("hf", "litgpt"):  # bitsandbytes (Lit-GPT: --quantize bnb.int8 / bnb.nf4)
        ladder = ("int8", "nf4")
    else:  # vllm / sglang
        ladder = ("fp8", "awq-4bit")
    if fmt.scheme.value in ("float", "gguf") and fmt.bits == 32:
        ladder = (("f16",) if engine == "llamacpp" else ("bf16",)) + ladder
    current = _nominal_bits(fmt.name)
    return tuple(name for name in ladder if _nominal_bits(name) < current)


def _nominal_bits(name: str) -> int:
    """Bits per weight a format is named for (GGUF mixes by their type: q4_k_m -> 4)."""
    from peakmem.weight_formats import parse_weight_format

    bits = parse_weight_format(name).bits
    if bits:
        return bits
    match = re.search(r"i?q(\d)", name)
    return int(match.group(1)) if match else 16


def _kv_options(setup: InferenceSetup) -> tuple[Any, ...]:
    from peakmem.inference import KV_BITS, KvDtype

    engine = setup.engine.value
    ladder: tuple[KvDtype, ...] = (KvDtype.INT8, KvDtype.INT4)
    if engine in ("vllm", "sglang"):
        ladder = (KvDtype.FP8,)
    elif engine == "litgpt":  # Lit-GPT's KVCache holds the precision's dtype (formulas/serving/litgpt.py)
        ladder = ()
    cur = setup.kv_cache
    cur_bits = KV_BITS.get(cur, 16)
    return tuple(k for k in ladder if KV_BITS[k] < cur_bits)


def fit_inference(
    spec: ModelSpec,
    setup: InferenceSetup,
    gpus: tuple[Gpu, ...] | list[Gpu],
    *,
    top: int = TOP_CANDIDATES,
    overheads: Overheads | None = None,
) -> InferFitReport:
    """``peakmem fit MODEL --infer``: verdicts for serving ``setup`` on each GPU, limits (longest context,
    most concurrent sequences) and the changes that make it fit: a smaller weight format, a smaller
    KV-cache dtype, tensor parallel over the fewest GPUs of a node, then (changing the job) fewer
    concurrent sequences or a shorter context."""

    require(len(gpus) > 0, "gpu", "", "give at least one GPU")
    t0 = time.perf_counter()
    gpus = tuple(gpus)
    est = _InferEstimator(spec, overheads)  # a calibrated profile, expandable segments
    weights = _weight_options(setup)
    kvs = _kv_options(setup)
    # vLLM / SGLang capture CUDA graphs unless enforce_eager (peakmem.formulas.serving.cuda_graphs):
    # turning them off frees their memory for the KV pool, at a decode-speed cost
    eager = setup.engine.value in ("vllm", "sglang") and not setup.enforce_eager
    seqs = _seqs_options(setup)
    families = [
        Family(name="weight format", status="searched" if weights else "not applicable",
               reason="" if weights else f"{setup.weight_format.name} is already as small as the engine's "
               "common formats", options=weights),
        Family(name="KV-cache dtype", status="searched" if kvs else "not applicable",
               reason="" if kvs else f"kv cache {setup.kv_cache.value}: already the engine's smallest",
               options=tuple(k.value for k in kvs)),
        Family(name="CUDA graphs off", status="searched" if eager else "not applicable",
               reason="" if eager else "no CUDA graphs are captured (engine or --enforce-eager)",
               options=("enforce-eager",) if eager else ()),
        Family(name="fewer sequences per step (vLLM --max-num-seqs)",
               status="searched" if seqs else "not applicable",
               reason="" if seqs else _seqs_reason(setup), options=tuple(str(n) for n in seqs)),
        Family(name="tensor parallel over N GPUs",
               status="searched" if _tp_searched(setup) else "not applicable",
               reason="llama.cpp splits layers, not tensors" if setup.engine.value == "llamacpp" else
               "Lit-GPT's generate quantizes on one device" if setup.engine.value == "litgpt" else
               "the layout given (pp, dp, ep) is kept" if setup.layout.parallel else "",
               options=(f"the fewest of 2..{INFER_MAX_TP} GPUs",)),
        Family(name="fewer concurrent sequences", status="searched" if setup.batch > 1 else "not applicable",
               reason="changes the job (flagged)" if setup.batch > 1 else "batch is already 1"),
        Family(name="shorter context", status="searched", reason="changes the job (flagged)"),
    ]  # fmt: skip
    options: _InferOptions = []
    if weights:
        options.append(("weights", tuple(("weights", w) for w in weights)))
    if kvs:
        options.append(("kv_cache", tuple(("kv_cache", k) for k in kvs)))
    if eager:
        options.append(("enforce_eager", (("enforce_eager", True),)))
    if seqs:
        options.append(("max_num_seqs", tuple(("max_num_seqs", n) for n in seqs)))
    results = [_infer_gpu(spec, setup, gpu, est, options, top) for gpu in gpus]
    fitting = [g for g in results if g.fits]
    smallest = min(fitting, key=lambda g: g.capacity_bytes).gpu.name if fitting else None
    assumptions = (
        "vLLM/SGLang fit when their KV pool (gpu_memory_utilization x GPU, SGLang's of what the CUDA context "
        "leaves, less weights and activations) holds "
        "`batch` sequences of the full context; other engines when the device total fits the GPU",
        "tensor parallel: each rank's memory (NCCL buffers not modelled by the serving estimator)",
        f"candidates combine at most {MAX_CHANGES} changes, fewest first; job-changing ones last",
    )
    return InferFitReport(
        model=spec.name, params=spec.params, setup=setup, gpus=tuple(results), smallest_sufficient=smallest,
        search_space=tuple(families), assumptions=assumptions, estimates=est.calls,
        elapsed_s=time.perf_counter() - t0,
    )  # fmt: skip


_InferOptions = list[tuple[str, tuple[tuple[str, Any], ...]]]


def _seqs_options(setup: InferenceSetup) -> tuple[int, ...]:
    """vLLM's max_num_seqs to try where vLLM picks it: its small tier's (peakmem.vllm_defaults), which a GPU
    of 70 GiB or more raises to 1024; the profile's sampler warm-up scales with it. Only where the job's
    concurrent sequences still run in one step (the job unchanged)."""
    small = SMALL_TIER.max_num_seqs
    if setup.engine.value != "vllm" or setup.max_num_seqs is not None or setup.batch > small:
        return ()
    return (small,)


def _seqs_reason(setup: InferenceSetup) -> str:
    if setup.engine.value != "vllm":
        return "a vLLM option"
    if setup.max_num_seqs is not None:
        return "--max-num-seqs is given"
    return f"{setup.batch} concurrent sequences: fewer per step would change the job"


def _effective(base: InferenceSetup, field: str) -> object:
    """The value ``base`` runs with (vLLM's own max_num_seqs where none is given)."""
    if field == "max_num_seqs" and base.engine.value == "vllm":
        return base.vllm_batch().max_num_seqs
    return getattr(base, field)


def _infer_configs(
    base: InferenceSetup, options: _InferOptions
) -> list[tuple[InferenceSetup, tuple[str, ...], tuple[Change, ...]]]:
    out = []
    for k in range(1, len(options) + 1):
        for combo in itertools.combinations(options, k):
            for picks in itertools.product(*(opts for _, opts in combo)):
                if any(_effective(base, f) == v for f, v in picks):
                    continue  # no change on this GPU (vLLM already picks it there)
                try:
                    s = replace(base, **dict(picks))
                except InputError:
                    continue
                labels = tuple(
                    f.replace("_", "-") if v is True else f"{f.replace('_', '-')} {_value(v)}"
                    for f, v in picks
                )
                changes = tuple(
                    Change(field=f, old=_value(_effective(base, f)), new=_value(v)) for f, v in picks
                )
                out.append((s, labels, changes))
    return out


class _InferGpuSearch:
    def __init__(self, spec: ModelSpec, setup: InferenceSetup, gpu: Gpu, est: _InferEstimator) -> None:
        self.spec, self.setup, self.gpu, self.est = spec, setup, gpu, est
        self.cap = gpu.usable_bytes
        self.base = setup.on_gpu(self.cap, gpu.display_name, gpu.memory_bytes)

    def ok(self, s: InferenceSetup) -> bool:
        r = self.est(s, self.cap)
        return bool(r and r[2])

    def cand(self, s: InferenceSetup, labels: tuple[str, ...], changes: tuple[Change, ...], job: bool = False
             ) -> InferCandidate | None:  # fmt: skip
        r = self.est(s, self.cap)
        if r is None:
            return None
        e, need, ok, conc = r
        return InferCandidate(label=" + ".join(labels), steps=labels, changes=changes, setup=s, estimate=e,
                              needed_bytes=need, capacity_bytes=self.cap, fits=ok, max_concurrent=conc,
                              changes_job=job)  # fmt: skip

    def with_context(self, n: int) -> InferenceSetup | None:
        prompt = self.base.prompt
        try:
            return replace(self.base, context=n, prompt=min(prompt, n) if prompt else None)
        except InputError:
            return None

    def fewer_sequences(self) -> InferCandidate | None:
        b = _largest_true(1, self.setup.batch - 1, lambda k: self.ok(replace(self.base, batch=k)))
        if not b:
            return None
        return self.cand(replace(self.base, batch=b), (f"{b} concurrent sequences (changes the job)",),
                         (Change(field="batch", old=str(self.setup.batch), new=str(b)),), True)  # fmt: skip

    def shorter_context(self) -> InferCandidate | None:
        ctx = self.base.context or self.spec.max_position_embeddings
        if ctx <= 1:
            return None

        def ok(n: int) -> bool:
            s = self.with_context(n)
            return s is not None and self.ok(s)

        n = _largest_true(1, ctx - 1, ok)
        s = self.with_context(n) if n else None
        if not n or s is None:
            return None
        return self.cand(s, (f"context {n:,} (changes the job)",),
                         (Change(field="context", old=str(ctx), new=str(n)),), True)  # fmt: skip

    def tensor_parallel(
        self, s: InferenceSetup, labels: tuple[str, ...], changes: tuple[Change, ...]
    ) -> InferCandidate | None:
        for n in range(2, INFER_MAX_TP + 1):
            try:
                sn = replace(s, tp=n)
            except InputError:
                continue
            c = self.cand(sn, (*labels, f"tensor parallel over {n} GPUs"),
                          (*changes, Change(field="tp", old="1", new=str(n))))  # fmt: skip
            if c is not None and c.fits:
                return c
        return None


def _infer_gpu(
    spec: ModelSpec, setup: InferenceSetup, gpu: Gpu, est: _InferEstimator, options: _InferOptions, top: int
) -> InferGpuFit:
    g = _InferGpuSearch(spec, setup, gpu, est)
    got = est(g.base, g.cap)
    if got is None:
        raise InputError(f"the inference setup cannot be estimated for {spec.name}")
    _, base_need, base_fits, _ = got
    singles: list[InferCandidate] = []
    cands: list[InferCandidate] = []
    if not base_fits:
        configs = _infer_configs(g.base, options)
        for s, labels, changes in configs:
            c = g.cand(s, labels, changes)
            if c is None:
                continue
            if len(labels) == 1:
                singles.append(c)
            if c.fits:
                cands.append(c)
        if _tp_searched(setup):
            for s, labels, changes in [(g.base, (), ()), *configs]:
                if len(labels) < MAX_CHANGES:
                    c = g.tensor_parallel(s, labels, changes)
                    if c is not None:
                        cands.append(c)
                        if not labels:
                            singles.append(c)
        for c in (g.fewer_sequences() if setup.batch > 1 else None, g.shorter_context()):
            if c is not None:
                singles.append(c)
                if c.fits:
                    cands.append(c)
    ranked = sorted(
        _minimal_infer(cands), key=lambda c: (c.changes_job, len(c.steps), c.gpus, c.needed_bytes)
    )
    try:
        mc, mcc = max_context(spec, g.base, g.cap), max_concurrent(spec, g.base, g.cap)
    except InputError:
        mc = mcc = 0
    return InferGpuFit(gpu=gpu, fits=base_fits, needed_bytes=base_need, capacity_bytes=g.cap, max_context=mc,
                       max_concurrent=mcc, candidates=tuple(ranked[:top]),
                       singles=tuple(singles))  # fmt: skip


def _minimal_infer(cands: list[InferCandidate]) -> list[InferCandidate]:
    keys = [frozenset((c.field, c.new) for c in cand.changes) for cand in cands]
    seen: set[frozenset[tuple[str, str]]] = set()
    out = []
    for i, cand in enumerate(cands):
        if keys[i] in seen or any(keys[j] < keys[i] for j in range(len(cands))):
            continue
        seen.add(keys[i])
        out.append(cand)
    return out


def _infer_candidate_json(c: InferCandidate) -> dict[str, object]:
    return {
        "label": c.label, "steps": list(c.steps), "changes": [list(ch.as_tuple()) for ch in c.changes],
        "fits": c.fits, "needed_bytes": c.needed_bytes, "capacity_bytes": c.capacity_bytes,
        "max_concurrent": c.max_concurrent, "gpus": c.gpus, "changes_job": c.changes_job,
        "setup": c.setup.echo(),
    }  # fmt: skip


def fit_inference_json(report: InferFitReport) -> dict[str, object]:
    return {
        "model": {"name": report.model, "params": report.params},
        "setup": report.setup.echo(),
        "smallest_sufficient": report.smallest_sufficient,
        "fits_any": report.any_fits,
        "gpus": [
            {
                "gpu": g.gpu.name, "display_name": g.gpu.display_name, "capacity_bytes": g.capacity_bytes,
                "needed_bytes": g.needed_bytes, "fits": g.fits,
                "headroom_bytes": g.capacity_bytes - g.needed_bytes,
                "max_context": g.max_context, "max_concurrent": g.max_concurrent,
                "candidates": [_infer_candidate_json(c) for c in g.candidates],
                "singles": [_infer_candidate_json(c) for c in g.singles],
            }
            for g in report.gpus
        ],
        "search_space": [_family_json(f) for f in report.search_space],
        "assumptions": list(report.assumptions),
        "estimates": report.estimates,
        "elapsed_s": report.elapsed_s,
    }  # fmt: skip


def _tp_searched(setup: InferenceSetup) -> bool:
    """Whether tensor parallelism is searched: a one-GPU job of an engine that splits tensors (a layout
    with pp / dp / ep is the user's own: formulas/serving/parallel.py)."""
    return setup.engine.value not in ("llamacpp", "litgpt") and setup.tp == 1 and not setup.layout.parallel
