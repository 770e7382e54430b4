"""Will it fit, and what is the cheapest change that makes it fit? Verdicts, a search over the
user's own setup, limits, and a multi-GPU plan.

``fit`` (``peakmem fit MODEL --gpu A,B,...``):

1. a verdict per GPU (the device total, what ``nvidia-smi`` shows, against the GPU's usable memory)
   and the smallest sufficient option;
2. for each GPU it does not fit: a search over changes to the user's setup. Each *family* of
   changes is a small generator (:data:`FAMILIES`) that offers a few options, least invasive first,
   or says why it is not available (the feature is not modelled) or not applicable. Up to
   :data:`MAX_CHANGES` families are combined; three *finishers* then close the gap with the least
   invasive value of one knob: a smaller micro-batch with more accumulation (the global batch is
   kept), sharding over the fewest GPUs of one node (ZeRO-3), and - last, flagged as changing the
   job - a shorter sequence. Candidates that fit are ranked fewest changes first, then by the
   estimated GPU time per token (:mod:`peakmem.formulas.step_time`); a candidate is dropped when a
   subset of its changes already fits. Every change alone is listed too, with its total, so "why
   not X" has an answer;
3. limits: the largest micro-batch and the longest sequence that fit, the fewest GPUs (ZeRO-3).

``plan`` (``peakmem plan MODEL --gpu NAME --max-gpus N``): scores every layout (GPU count, tensor,
pipeline and data parallel degrees, ZeRO stage / FSDP, checkpointing, micro-batch) with the
step-time model first (arithmetic only), then estimates memory in order of step time until the
top layouts that fit are found; layouts whose most frugal variant does not fit are skipped whole.

Every estimate goes through the public estimators (:func:`peakmem.estimate.estimate_training`,
:func:`peakmem.ranks.estimate_ranks`), memoised per (setup, parallelism) within one search: what is
suggested is exactly what those functions say when asked again.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from peakmem.breakdown import Estimate, Verdict
from peakmem.catalog import Gpu
from peakmem.errors import InputError, require
from peakmem.estimate import estimate_training, setup_dict
from peakmem.formulas import step_time as st
from peakmem.formulas.overhead import Overheads
from peakmem.model import ModelSpec
from peakmem.training import AttentionKernel, Checkpointing, Method, OptimizerName, TrainingSetup

MAX_CHANGES = 3  # changes combined in one candidate
MAX_NODE_GPUS = 8  # "shard over N GPUs" stays inside one node (DGX/HGX: 8 GPUs)
MAX_LIMIT_GPUS = 1024  # the "fewest GPUs" limit searches up to this many
MAX_MICRO_BATCH = 4096  # the "largest micro-batch" limit searches up to this
SEQ_STEP = 64  # a shorter sequence is a multiple of this (kernels tile by 64/128)
TOP_CANDIDATES = 10  # shown per GPU (JSON carries the same list)
TOP_LAYOUTS = 10
# Default global batch for ``plan``: ~4M tokens per step, GPT-3's largest-model batch (Brown et al.
# 2020, arXiv 2005.14165 Table 2.1: 3.2M tokens) and Llama 3 405B's (Dubey et al. 2024 §3.4.1: 4M,
# then 8M and 16M tokens).
DEFAULT_GLOBAL_BATCH_TOKENS = 4 * 1024 * 1024
PLAN_TP = (1, 2, 4, 8)  # tensor parallel stays inside a node (Narayanan et al. 2021 §3.3, takeaway #1)
PLAN_MICRO_BATCHES = (1, 2, 4, 8)
# Context parallel (ring attention) degrees; searched only while each rank keeps at least
# PLAN_CP_MIN_CHUNK tokens of a sequence (long-context jobs: Llama 3 trained 131,072 tokens with cp=16,
# Dubey et al. 2024 §3.3.2, a chunk of 8,192), and never with eager attention (no ring kernel).
PLAN_CP = (1, 2, 4, 8, 16, 32)
PLAN_CP_MIN_CHUNK = 2048
# Expert parallel degrees for MoE models: those dividing the expert count and the dp x cp ranks.
PLAN_EP = (1, 2, 4, 8, 16, 32, 64)


# --- the result types ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Change:
    """One field of the job changed: ``field`` old -> new (CLI spellings)."""

    field: str
    old: str
    new: str

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.field, self.old, self.new)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A changed job, estimated on its own, with its cost in step time."""

    label: str
    steps: tuple[str, ...]  # one label per change, as the user would apply them
    changes: tuple[Change, ...]  # every field touched (a micro-batch change also sets grad_accum)
    setup: TrainingSetup
    parallelism: Any  # peakmem.parallel.Parallelism | None (None: plain single-GPU estimate)
    estimate: Estimate  # the most loaded rank's when sharded
    needed_bytes: int  # device total of the most loaded rank
    capacity_bytes: int
    cpu_bytes: int  # pinned CPU RAM per node (offload), 0 without
    step: st.StepTime
    relative_cost: float  # GPU-seconds per token against the unchanged job
    changes_job: bool = False  # a shorter sequence: a different job, shown last

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.capacity_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.needed_bytes

    @property
    def gpus(self) -> int:
        return self.step.gpus


@dataclass(frozen=True, kw_only=True)
class Family:
    """One family of changes in the search space: what it offers, or why it is not searched."""

    name: str
    status: str  # "searched" | "not available" | "not applicable"
    reason: str = ""
    options: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Limits:
    largest_micro_batch: int  # 0: not even micro-batch 1 fits
    longest_seq: int  # 0: not even the shortest fits
    seq_capped: bool  # longest_seq is the model's own context (it could go further)
    fewest_gpus: int | None  # None: not found up to MAX_LIMIT_GPUS, or sharding not available
    fewest_gpus_layout: str
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class GpuFit:
    gpu: Gpu
    verdict: Verdict
    candidates: tuple[Candidate, ...]  # fitting changed jobs, ranked (empty when it already fits)
    singles: tuple[Candidate, ...]  # every single change alone, fitting or not ("why not X")
    limits: Limits


@dataclass(frozen=True, kw_only=True)
class FitReport:
    model: str
    params: int
    setup: TrainingSetup
    baseline: Estimate
    baseline_step: st.StepTime
    gpus: tuple[GpuFit, ...]
    smallest_sufficient: str | None  # name of the smallest GPU given that fits
    search_space: tuple[Family, ...]
    assumptions: tuple[str, ...]
    estimates: int  # how many setups were estimated
    elapsed_s: float

    @property
    def any_fits(self) -> bool:
        return any(g.verdict.fits for g in self.gpus)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One parallel layout in a plan, estimated."""

    parallelism: Any  # peakmem.parallel.Parallelism
    setup: TrainingSetup
    description: str
    ranks: tuple[tuple[str, int, int, int], ...]  # (role, ranks, device_total_bytes, cpu_bytes)
    needed_bytes: int  # the most loaded rank
    capacity_bytes: int
    step: st.StepTime
    global_batch: int

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.needed_bytes


@dataclass(frozen=True, kw_only=True)
class PlanReport:
    model: str
    params: int
    gpu: Gpu
    max_gpus: int
    global_batch: int
    seq_len: int
    layouts: tuple[Layout, ...]  # ranked by step time
    fewest_gpus: Layout | None  # the layout with the fewest GPUs that fits
    scope: str  # what was searched, e.g. "multi-node: dp x tp x pp" or "single node only"
    search_space: tuple[Family, ...]
    assumptions: tuple[str, ...]
    scored: int  # layouts scored by the step-time model
    estimates: int  # layouts whose memory was estimated
    elapsed_s: float


# --- estimating, memoised ------------------------------------------------------------------------
def _ranks_module() -> Any | None:
    """peakmem.ranks, or None while the multi-GPU estimator is not there."""
    try:
        from peakmem import ranks
    except ImportError:
        return None
    return ranks


def _parallel_module() -> Any | None:
    try:
        from peakmem import parallel
    except ImportError:
        return None
    return parallel


@dataclass(frozen=True, kw_only=True)
class _Result:
    estimate: Estimate
    needed: int
    cpu_bytes: int
    ranks: tuple[tuple[str, int, int, int], ...]


class _Estimator:
    """Estimates (setup, parallelism) once; an invalid combination is remembered as None."""

    def __init__(self, spec: ModelSpec, overheads: Overheads | None) -> None:
        self.spec = spec
        self.overheads = overheads
        self.memo: dict[tuple[TrainingSetup, Any], _Result | None] = {}
        self.calls = 0
        self.ranks = _ranks_module()

    def __call__(self, setup: TrainingSetup, par: Any = None) -> _Result | None:
        key = (setup, par)
        if key in self.memo:
            return self.memo[key]
        self.calls += 1
        result: _Result | None
        try:
            if par is None:
                est = estimate_training(self.spec, setup, overheads=self.overheads)
                result = _Result(estimate=est, needed=est.device_total_bytes, cpu_bytes=0,
                                 ranks=(("all ranks", 1, est.device_total_bytes, 0),))  # fmt: skip
            else:
                assert self.ranks is not None
                rep = self.ranks.estimate_ranks(self.spec, setup, par, overheads=self.overheads)
                top = rep.most_loaded
                result = _Result(
                    estimate=top.estimate, needed=top.estimate.device_total_bytes,
                    cpu_bytes=rep.cpu_pinned_per_node_bytes,
                    ranks=tuple((r.role, r.ranks, r.estimate.device_total_bytes, r.cpu_bytes)
                                for r in rep.ranks),
                )  # fmt: skip
        except (InputError, NotImplementedError):
            result = None
        self.memo[key] = result
        return result


def _value(v: object) -> str:
    return v.value if isinstance(v, Enum) else str(v)


def _layout_of(par: Any) -> st.Layout:
    if par is None:
        return st.Layout()
    engine = par.engine
    if engine.startswith("fsdp"):
        engine = "fsdp-grad-op" if "shard-grad-op" in engine else "fsdp-full"
    return st.Layout(
        gpus=par.gpus, tp=par.tp, pp=par.pp, virtual_stages=par.virtual_stages,
        gpus_per_node=par.gpus_per_node, engine=engine,
        offload_optimizer=_value(par.offload_optimizer) != "none",
        offload_params=_value(par.offload_params) != "none",
    )  # fmt: skip


# --- the families of changes --------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Option:
    """One option of a family: setup fields and parallelism fields to set."""

    label: str
    setup: tuple[tuple[str, Any], ...] = ()
    par: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, kw_only=True)
class _Ctx:
    spec: ModelSpec
    setup: TrainingSetup
    gpus: tuple[Gpu, ...]
    estimator: _Estimator


FamilyFn = Callable[[_Ctx], "tuple[Family, tuple[_Option, ...]]"]


def _family_checkpointing(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    ladder = (Checkpointing.SELECTIVE, Checkpointing.FULL)
    opts = tuple(
        _Option(label=f"checkpointing {c.value}", setup=(("checkpointing", c),))
        for c in ladder[ladder.index(ctx.setup.checkpointing) + 1:] if ctx.setup.checkpointing is not c
    ) if ctx.setup.checkpointing is not Checkpointing.NONE else tuple(
        _Option(label=f"checkpointing {c.value}", setup=(("checkpointing", c),)) for c in ladder
    )  # fmt: skip
    if not opts:
        return Family(name="activation checkpointing", status="not applicable",
                      reason="already full checkpointing"), ()  # fmt: skip
    return Family(name="activation checkpointing", status="searched",
                  options=tuple(o.label for o in opts)), opts  # fmt: skip


def _family_attention(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    order = (AttentionKernel.EAGER, AttentionKernel.SDPA, AttentionKernel.FLASH)
    better = order[order.index(ctx.setup.attention) + 1 :]
    if not better:
        return Family(name="attention kernel", status="not applicable", reason="already flash attention"), ()
    opts = tuple(_Option(label=f"attention {k.value}", setup=(("attention", k),)) for k in better)
    return Family(name="attention kernel", status="searched", options=tuple(o.label for o in opts)), opts


_NO_8BIT = "8-bit optimizer states are not modelled yet (no *-8bit optimizer)"
_NO_RANKS = "the multi-GPU/offload estimator (peakmem.ranks) is not installed"


def _eight_bit(name: OptimizerName) -> OptimizerName | None:
    for member in OptimizerName:
        if member.value == f"{name.value}-8bit":
            return member
    return None


def _family_optimizer(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    fam = "8-bit optimizer"
    if "8bit" in ctx.setup.optimizer.value:
        return Family(name=fam, status="not applicable", reason=f"already {ctx.setup.optimizer.value}"), ()
    target = _eight_bit(ctx.setup.optimizer)
    if target is None:
        if not any("8bit" in m.value for m in OptimizerName):
            return Family(name=fam, status="not available", reason=_NO_8BIT), ()
        return Family(name=fam, status="not applicable",
                      reason=f"no 8-bit variant of {ctx.setup.optimizer.value}"), ()  # fmt: skip
    opt = _Option(label=f"optimizer {target.value}", setup=(("optimizer", target),))
    return Family(name=fam, status="searched", options=(opt.label,)), (opt,)


def _family_adapter(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    fam = "LoRA / QLoRA"
    if ctx.setup.method is not Method.FULL:
        ladder = (Method.LORA, Method.QLORA)
        if ctx.setup.method is Method.QLORA:
            return Family(name=fam, status="not applicable", reason="already QLoRA"), ()
        methods: tuple[Method, ...] = ladder[1:]
    else:
        methods = (Method.LORA, Method.QLORA)
    opts: list[_Option] = []
    missing: list[str] = []
    for m in methods:
        changed = replace(ctx.setup, method=m)
        res = ctx.estimator(changed)
        if res is None or res.estimate.trainable_params >= ctx.spec.params:
            missing.append(m.value)
        else:
            opts.append(_Option(label=f"method {m.value}", setup=(("method", m),)))
    if not opts:
        return Family(name=fam, status="not available",
                      reason=f"the estimator does not model {' / '.join(missing)} yet "
                             "(trainable parameters unchanged or setup rejected)"), ()  # fmt: skip
    reason = f"not modelled: {', '.join(missing)}" if missing else ""
    labels = tuple(o.label for o in opts)
    return Family(name=fam, status="searched", reason=reason, options=labels), tuple(opts)


def _family_offload(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    fam = "CPU offload"
    if ctx.estimator.ranks is None or _parallel_module() is None:
        return Family(name=fam, status="not available", reason=_NO_RANKS), ()
    if all(g.unified_memory for g in ctx.gpus):
        return Family(name=fam, status="not applicable", reason="unified memory: the CPU shares it"), ()
    from peakmem.parallel import Offload

    opts = (
        _Option(label="offload optimizer to CPU (ZeRO-2 Offload)",
                par=(("zero_stage", 2), ("offload_optimizer", Offload.CPU))),
        _Option(label="offload optimizer + parameters to CPU (ZeRO-3 Offload)",
                par=(("zero_stage", 3), ("offload_optimizer", Offload.CPU), ("offload_params", Offload.CPU))),
    )  # fmt: skip
    return Family(name=fam, status="searched", options=tuple(o.label for o in opts)), opts


FAMILIES: tuple[FamilyFn, ...] = (
    _family_checkpointing, _family_attention, _family_optimizer, _family_adapter, _family_offload,
)  # fmt: skip


# --- applying changes ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Config:
    setup: TrainingSetup
    par: Any  # Parallelism | None
    changes: tuple[Change, ...]
    labels: tuple[str, ...]
    changes_job: bool = False


def _apply(base: _Config, opt: _Option) -> _Config | None:
    setup = base.setup
    changes = list(base.changes)
    try:
        if opt.setup:
            for name, value in opt.setup:
                changes.append(Change(field=name, old=_value(getattr(setup, name)), new=_value(value)))
            setup = replace(setup, **dict(opt.setup))
        par = base.par
        if opt.par:
            from peakmem.parallel import Parallelism

            cur = par if par is not None else Parallelism()
            fields = dict(opt.par)
            if "zero_stage" in fields:
                fields["zero_stage"] = max(fields["zero_stage"], cur.zero_stage)
            for name, value in fields.items():
                if _value(getattr(cur, name)) != _value(value):
                    changes.append(Change(field=name, old=_value(getattr(cur, name)), new=_value(value)))
            par = replace(cur, **fields)
    except InputError:
        return None
    return _Config(setup=setup, par=par, changes=tuple(changes), labels=(*base.labels, opt.label),
                   changes_job=base.changes_job)  # fmt: skip


# --- the search ------------------------------------------------------------------------------------
class _Search:
    def __init__(self, spec: ModelSpec, setup: TrainingSetup, gpus: tuple[Gpu, ...], est: _Estimator) -> None:
        self.spec, self.setup, self.gpus, self.est = spec, setup, gpus, est
        self.sf = st.spec_flops(spec)
        base = est(setup)
        if base is None:
            raise InputError(f"the setup cannot be estimated for {spec.name}")
        self.base = base

    def base_step(self, rates: st.Rates) -> st.StepTime:
        return st.step_time(self.sf, self.setup, rates, st.Layout(),
                            trainable_params=self.base.estimate.trainable_params,
                            params=self.spec.params)  # fmt: skip

    def needed(self, cfg: _Config) -> int | None:
        res = self.est(cfg.setup, cfg.par)
        return None if res is None else res.needed

    def candidate(self, cfg: _Config, gpu: Gpu, rates: st.Rates, base_step: st.StepTime) -> Candidate | None:
        res = self.est(cfg.setup, cfg.par)
        if res is None:
            return None
        step = st.step_time(self.sf, cfg.setup, rates, _layout_of(cfg.par),
                            trainable_params=res.estimate.trainable_params,
                            params=self.spec.params)  # fmt: skip
        base_cost = base_step.gpu_seconds / max(1, base_step.tokens)
        cost = step.gpu_seconds / max(1, step.tokens)
        return Candidate(
            label=" + ".join(cfg.labels) if cfg.labels else "unchanged", steps=cfg.labels,
            changes=cfg.changes, setup=cfg.setup, parallelism=cfg.par, estimate=res.estimate,
            needed_bytes=res.needed, capacity_bytes=gpu.usable_bytes,
            cpu_bytes=res.cpu_bytes, step=step, relative_cost=cost / base_cost if base_cost else 1.0,
            changes_job=cfg.changes_job,
        )  # fmt: skip

    # finishers: one more change, the least invasive value that fits -----------------------------
    def finish_micro_batch(self, cfg: _Config, capacity: int) -> _Config | None:
        s = cfg.setup
        if s.micro_batch == 1:
            return None
        divisors = [d for d in range(s.micro_batch - 1, 0, -1) if s.micro_batch % d == 0]

        def make(mb: int) -> _Config:
            accum = s.grad_accum * s.micro_batch // mb
            ch = (Change(field="micro_batch", old=str(s.micro_batch), new=str(mb)),
                  Change(field="grad_accum", old=str(s.grad_accum), new=str(accum)))  # fmt: skip
            return _Config(setup=replace(s, micro_batch=mb, grad_accum=accum), par=cfg.par,
                           changes=cfg.changes + ch,
                           labels=(*cfg.labels, f"micro-batch {mb} x accumulation {accum}"),
                           changes_job=cfg.changes_job)  # fmt: skip

        idx = _first_fit(len(divisors), lambda i: self._fits(make(divisors[i]), capacity))
        return None if idx is None else make(divisors[idx])

    def finish_shard(self, cfg: _Config, capacity: int, max_gpus: int = MAX_NODE_GPUS) -> _Config | None:
        if self.est.ranks is None:
            return None
        from peakmem.parallel import Parallelism

        cur = cfg.par if cfg.par is not None else Parallelism()
        if cur.gpus > 1:
            return None
        s = cfg.setup

        def make(n: int) -> _Config | None:
            accum = s.grad_accum // n if s.grad_accum % n == 0 else s.grad_accum
            try:
                par = replace(cur, gpus=n, dp=0, zero_stage=3)
            except InputError:
                return None
            ch = [Change(field="gpus", old="1", new=str(n))]
            if cur.zero_stage != 3:
                ch.append(Change(field="zero_stage", old=str(cur.zero_stage), new="3"))
            label = f"shard over {n} GPUs (ZeRO-3)"
            if accum != s.grad_accum:
                ch.append(Change(field="grad_accum", old=str(s.grad_accum), new=str(accum)))
            else:
                label += f", global batch x{n}"
            return _Config(setup=replace(s, grad_accum=accum), par=par, changes=cfg.changes + tuple(ch),
                           labels=(*cfg.labels, label), changes_job=cfg.changes_job)  # fmt: skip

        counts = list(range(2, max_gpus + 1))

        def ok(i: int) -> bool:
            c = make(counts[i])
            return c is not None and self._fits(c, capacity)

        idx = _first_fit_monotone(len(counts), ok)
        return None if idx is None else make(counts[idx])

    def finish_seq(self, cfg: _Config, capacity: int) -> _Config | None:
        s = cfg.setup
        step = SEQ_STEP if s.seq_len > SEQ_STEP else 1
        top = (s.seq_len - 1) // step
        if top < 1:
            return None

        def make(k: int) -> _Config:
            seq = k * step
            return _Config(setup=replace(s, seq_len=seq), par=cfg.par,
                           changes=(*cfg.changes, Change(field="seq_len", old=str(s.seq_len), new=str(seq))),
                           labels=(*cfg.labels, f"sequence {seq} (changes the job)"),
                           changes_job=True)  # fmt: skip

        k = _largest_true(1, top, lambda k: self._fits(make(k), capacity))
        return None if k is None else make(k)

    def _fits(self, cfg: _Config, capacity: int) -> bool:
        n = self.needed(cfg)
        return n is not None and n <= capacity


def _first_fit(n: int, ok: Callable[[int], bool]) -> int | None:
    """Index of the first True in a list that is False...False True...True (memory falls along it)."""
    lo, hi = 0, n - 1
    if n == 0 or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


_first_fit_monotone = _first_fit


def _largest_true(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest k in [lo, hi] with ok(k), for ok True...True False...False."""
    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _minimal(cands: list[Candidate]) -> list[Candidate]:
    """Drop a candidate when a strict subset of its changes already fits."""
    keys = [frozenset(c.as_tuple()[::2] for c in cand.changes) for cand in cands]
    out = []
    for i, cand in enumerate(cands):
        if not any(keys[j] < keys[i] for j in range(len(cands)) if j != i):
            out.append(cand)
    return out


def _rank_key(c: Candidate) -> tuple[bool, int, float, int]:
    return (c.changes_job, len(c.steps), round(c.relative_cost, 3), c.needed_bytes)


def _discrete_configs(base: _Config, options: list[tuple[str, tuple[_Option, ...]]]) -> Iterator[_Config]:
    """Every combination of at most MAX_CHANGES families, one option each (the empty one first)."""
    for k in range(0, min(MAX_CHANGES, len(options)) + 1):
        for combo in itertools.combinations(options, k):
            for picks in itertools.product(*(opts for _, opts in combo)):
                cfg: _Config | None = base
                for opt in picks:
                    cfg = _apply(cfg, opt) if cfg is not None else None
                if cfg is not None:
                    yield cfg


def _limits(search: _Search, gpu: Gpu) -> Limits:
    spec, s, cap = search.spec, search.setup, gpu.usable_bytes
    est = search.est

    def fits(setup: TrainingSetup, par: Any = None) -> bool:
        r = est(setup, par)
        return r is not None and r.needed <= cap

    # largest micro-batch: double, then bisect
    mb = 0
    if fits(replace(s, micro_batch=1)):
        hi = 1
        while hi < MAX_MICRO_BATCH and fits(replace(s, micro_batch=hi * 2)):
            hi *= 2
        top = min(hi * 2, MAX_MICRO_BATCH)
        mb = _largest_true(hi, top, lambda b: fits(replace(s, micro_batch=b))) or hi
    # longest sequence, up to the model's context
    ctx = spec.max_position_embeddings or s.seq_len
    seq = _largest_true(1, ctx, lambda n: fits(replace(s, seq_len=n))) or 0
    capped = seq == ctx
    # fewest GPUs: ZeRO-3 over N, same per-GPU setup
    fewest: int | None = None
    layout, note = "", ""
    if fits(s):
        fewest, layout = 1, "1 GPU"
    elif est.ranks is None:
        note = "the multi-GPU estimator (peakmem.ranks) is not installed"
    else:
        from peakmem.parallel import Parallelism

        def ok(n: int) -> bool:
            return fits(s, Parallelism(gpus=n, zero_stage=3))

        n = 2
        while n < MAX_LIMIT_GPUS and not ok(n):
            n *= 2
        n = min(n, MAX_LIMIT_GPUS)
        if ok(n):
            lo = n // 2 + 1 if n > 2 else 2
            k = _first_fit(n - lo + 1, lambda i: ok(lo + i))
            fewest = lo + (k if k is not None else n - lo)
            layout = f"{fewest} GPUs, ZeRO-3 data parallel"
        else:
            note = (f"none up to {MAX_LIMIT_GPUS} with ZeRO-3 alone (activations do not "
                    "shard over data-parallel ranks); see `peakmem plan` for tensor/pipeline parallel "
                    "layouts")  # fmt: skip
    return Limits(largest_micro_batch=mb, longest_seq=seq, seq_capped=capped, fewest_gpus=fewest,
                  fewest_gpus_layout=layout, note=note)  # fmt: skip


def fit(
    spec: ModelSpec, setup: TrainingSetup, gpus: tuple[Gpu, ...] | list[Gpu], *,
    overheads: Overheads | None = None, top: int = TOP_CANDIDATES,
) -> FitReport:  # fmt: skip
    """Verdicts for ``setup`` on each GPU, and the ranked changes that make it fit where it does not."""
    require(len(gpus) > 0, "gpu", "", "give at least one GPU")
    t0 = time.perf_counter()
    gpus = tuple(gpus)
    est = _Estimator(spec, overheads)
    search = _Search(spec, setup, gpus, est)
    ctx = _Ctx(spec=spec, setup=setup, gpus=gpus, estimator=est)
    families: list[Family] = []
    options: list[tuple[str, tuple[_Option, ...]]] = []
    for fn in FAMILIES:
        fam, opts = fn(ctx)
        families.append(fam)
        if opts:
            options.append((fam.name, opts))
    families += _finisher_families(est, setup)
    base_cfg = _Config(setup=setup, par=None, changes=(), labels=())
    discrete = list(_discrete_configs(base_cfg, options))
    singles_cfgs = [c for c in discrete if len(c.labels) == 1]

    results: list[GpuFit] = []
    for gpu in gpus:
        rates = st.rates_for(gpu)
        base_step = search.base_step(rates)
        verdict = Verdict(gpu=gpu.name, capacity_bytes=gpu.usable_bytes, needed_bytes=search.base.needed)
        cap = gpu.usable_bytes
        single_cfgs = list(singles_cfgs) if not verdict.fits else []
        for fin in (search.finish_micro_batch, search.finish_shard, search.finish_seq):
            c = fin(base_cfg, cap) if not verdict.fits else None
            if c is not None:
                single_cfgs.append(c)
        made = (search.candidate(cfg, gpu, rates, base_step) for cfg in single_cfgs)
        singles = [c for c in made if c is not None]
        cands: list[Candidate] = []
        if not verdict.fits:
            for cfg in discrete[1:]:
                n = search.needed(cfg)
                if n is None:
                    continue
                if n <= cap:
                    cand = search.candidate(cfg, gpu, rates, base_step)
                    if cand is not None:
                        cands.append(cand)
                    continue
                if len(cfg.labels) >= MAX_CHANGES:
                    continue
                for fin in (search.finish_micro_batch, search.finish_shard):
                    done = fin(cfg, cap)
                    if done is not None:
                        cand = search.candidate(done, gpu, rates, base_step)
                        if cand is not None:
                            cands.append(cand)
            cands += [c for c in singles if c.fits]
            cands = sorted(_minimal(_dedupe(cands)), key=_rank_key)[:top]
        results.append(GpuFit(gpu=gpu, verdict=verdict, candidates=tuple(cands),
                              singles=tuple(sorted(singles, key=_rank_key)),
                              limits=_limits(search, gpu)))  # fmt: skip
    fitting = [g for g in results if g.verdict.fits]
    smallest = min(fitting, key=lambda g: g.verdict.capacity_bytes).gpu.name if fitting else None
    base_step0 = search.base_step(st.rates_for(gpus[0]))
    assumptions = _fit_assumptions(gpus)
    return FitReport(
        model=spec.name, params=spec.params, setup=setup, baseline=search.base.estimate,
        baseline_step=base_step0,
        gpus=tuple(results), smallest_sufficient=smallest, search_space=tuple(families),
        assumptions=assumptions, estimates=est.calls, elapsed_s=time.perf_counter() - t0,
    )  # fmt: skip


def _dedupe(cands: list[Candidate]) -> list[Candidate]:
    seen: set[frozenset[tuple[str, str, str]]] = set()
    out = []
    for c in cands:
        key = frozenset(ch.as_tuple() for ch in c.changes)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _finisher_families(est: _Estimator, setup: TrainingSetup) -> list[Family]:
    out = [
        Family(name="micro-batch + accumulation",
               status="searched" if setup.micro_batch > 1 else "not applicable",
               reason="" if setup.micro_batch > 1 else "micro-batch is already 1",
               options=("the largest divisor of the micro-batch that fits; accumulation keeps the "
                        "global batch",)),
    ]  # fmt: skip
    if est.ranks is None:
        out.append(Family(name="shard over N GPUs", status="not available",
                          reason="the multi-GPU estimator (peakmem.ranks) is not installed"))  # fmt: skip
    else:
        out.append(
            Family(
                name="shard over N GPUs",
                status="searched",
                options=(f"ZeRO-3 over the fewest of 2..{MAX_NODE_GPUS} GPUs",),
            )
        )
    out.append(Family(name="shorter sequence", status="searched",
                      reason="last resort: changes the job (flagged)",
                      options=(f"the longest multiple of {SEQ_STEP} that fits",)))  # fmt: skip
    out.append(
        Family(
            name="precision / other optimizers",
            status="not applicable",
            reason="not searched: they change numerics; compare with `peakmem train`",
        )
    )
    return out


def _fit_assumptions(gpus: tuple[Gpu, ...]) -> tuple[str, ...]:
    notes: list[str] = []
    seen: set[str] = set()
    for g in gpus:
        for n in st.rates_for(g).notes():
            if n not in seen:
                seen.add(n)
                notes.append(n)
    notes += [
        "a GPU fits a job when the device total (what nvidia-smi shows) is at most its usable memory",
        f"candidates combine at most {MAX_CHANGES} changes; a candidate is dropped when a subset of its "
        "changes already fits; ranked by fewest changes, then GPU-seconds per token (step-time model)",
        "relative cost: GPU-seconds per token against the unchanged job; MFU assumed independent of "
        "micro-batch and kernel; QLoRA's dequantisation at the full memory bandwidth (a lower bound)",
    ]
    return tuple(notes)


# --- plan ---------------------------------------------------------------------------------------------
def _divides_heads(spec: ModelSpec, tp: int) -> bool:
    for g in spec.groups:
        a, m = g.layer.attention, g.layer.mlp
        if a.num_heads % tp or a.num_kv_heads % tp or m.intermediate_size % tp:
            return False
    return True


@dataclass(frozen=True, kw_only=True)
class _PlanItem:
    time_s: float
    gpus: int
    tp: int
    pp: int
    cp: int
    ep: int
    engine: str  # zero-0..3 | fsdp
    ckpt: Checkpointing
    mb: int
    accum: int
    step: st.StepTime


def _gpu_counts(max_gpus: int, per_node: int) -> list[int]:
    """1, 2, 4, ... up to one node, then whole nodes in powers of two, and max_gpus itself."""
    out = {1}
    n = 1
    while n * 2 <= max_gpus:
        n *= 2
        out.add(n)
    if max_gpus % per_node == 0 or max_gpus < per_node:
        out.add(max_gpus)
    return sorted(out)


def plan(
    spec: ModelSpec, setup: TrainingSetup, gpu: Gpu, max_gpus: int, global_batch: int | None = None, *,
    overheads: Overheads | None = None, top: int = TOP_LAYOUTS,
) -> PlanReport:  # fmt: skip
    """The fastest layouts of ``setup`` on up to ``max_gpus`` of ``gpu``, ranked by step time."""
    require(max_gpus >= 1, "max_gpus", max_gpus, "must be a positive integer")
    t0 = time.perf_counter()
    est = _Estimator(spec, overheads)
    sf = st.spec_flops(spec)
    rates = st.rates_for(gpu)
    cap = gpu.usable_bytes
    gb = global_batch or max(1, DEFAULT_GLOBAL_BATCH_TOKENS // setup.seq_len)
    require(gb >= 1, "global_batch", gb, "must be a positive integer")
    par_mod = _parallel_module()
    multi = est.ranks is not None and par_mod is not None
    per_node = par_mod.DEFAULT_GPUS_PER_NODE if par_mod is not None else MAX_NODE_GPUS
    families = _plan_families(multi)
    trainable = est(replace(setup, micro_batch=1, grad_accum=1))
    trainable_params = trainable.estimate.trainable_params if trainable is not None else spec.params

    # 1. score every layout with the time model (arithmetic only)
    items: list[_PlanItem] = []
    counts = _gpu_counts(max_gpus, per_node) if multi else [1]
    layers = spec.num_layers
    pp_options = [p for p in (1, 2, 4, 8, 16, 32, 64) if p <= layers]
    tps = [t for t in PLAN_TP if t <= per_node and _divides_heads(spec, t)]
    cps = plan_cp_options(sf, setup)
    ckpts = (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.FULL)
    for n, tp, pp, cp in itertools.product(counts, tps, pp_options, cps):
        if tp * pp * cp > n or n % (tp * pp * cp):
            continue
        dp = n // (tp * pp * cp)
        shard = dp * cp  # ZeRO / FSDP shard over the dp x cp ranks
        engines = ["zero-0", "zero-1"] if pp > 1 else ["zero-0", "zero-1", "zero-2", "zero-3", "fsdp"]
        if shard == 1:
            engines = ["zero-0"]
        for ep, mb in itertools.product(plan_ep_options(spec, shard), PLAN_MICRO_BATCHES):
            if gb % (dp * mb):
                continue
            accum = gb // (dp * mb)
            for engine, ck in itertools.product(engines, ckpts):
                s = replace(setup, micro_batch=mb, grad_accum=accum, checkpointing=ck)
                lay = st.Layout(gpus=n, tp=tp, pp=pp, cp=cp, ep=ep, gpus_per_node=per_node,
                                engine=_time_engine(engine, shard))  # fmt: skip
                step = st.step_time(sf, s, rates, lay, trainable_params=trainable_params, params=spec.params)
                items.append(_PlanItem(time_s=step.total_s, gpus=n, tp=tp, pp=pp, cp=cp, ep=ep, engine=engine,
                                       ckpt=ck, mb=mb, accum=accum, step=step))  # fmt: skip
    items.sort(key=_plan_order)

    # 2. estimate memory in order of step time until ``top`` layouts fit
    floor_ok: dict[tuple[int, int, int, int, int], bool] = {}
    found: list[Layout] = []

    def make_par(it: _PlanItem) -> Any:
        if par_mod is None:
            return None
        kw: dict[str, Any] = {"gpus": it.gpus, "tp": it.tp, "pp": it.pp, "cp": it.cp, "ep": it.ep,
                              "sequence_parallel": it.tp > 1}  # fmt: skip
        if it.engine == "fsdp":
            kw["fsdp"] = par_mod.FsdpMode.FULL_SHARD
        else:
            kw["zero_stage"] = int(it.engine[-1])
        return par_mod.Parallelism(**kw)

    def frugal_fits(n: int, tp: int, pp: int, cp: int, ep: int) -> bool:
        key = (n, tp, pp, cp, ep)
        if key not in floor_ok:
            dp = n // (tp * pp * cp)
            shard = dp * cp
            engine = "zero-0" if shard == 1 else "zero-3" if pp == 1 else "zero-1"
            it = _PlanItem(time_s=0, gpus=n, tp=tp, pp=pp, cp=cp, ep=ep, engine=engine,
                           ckpt=Checkpointing.FULL, mb=1, accum=max(1, gb // max(1, dp)),
                           step=items[0].step)  # fmt: skip
            floor_ok[key] = _plan_fits(est, setup, it, make_par(it) if multi else None, cap)
        return floor_ok[key]

    # one layout per (GPUs, tp, pp, cp, ep): the fastest that fits
    shapes_done: set[tuple[int, int, int, int, int]] = set()
    for it in items:
        if len(found) >= top:
            break
        shape = (it.gpus, it.tp, it.pp, it.cp, it.ep)
        if shape in shapes_done or not frugal_fits(*shape):
            continue
        got = _plan_layout(est, setup, it, make_par(it) if multi else None, cap, gb)
        if got is not None:
            found.append(got)
            shapes_done.add(shape)

    # 3. the fewest GPUs that fit (most frugal variant of the fewest-GPU count that fits)
    fewest: Layout | None = None
    for n in counts:
        best: Layout | None = None
        for it in (i for i in items if i.gpus == n):
            if not frugal_fits(it.gpus, it.tp, it.pp, it.cp, it.ep):
                continue
            best = _plan_layout(est, setup, it, make_par(it) if multi else None, cap, gb)
            if best is not None:
                break
        if best is not None:
            fewest = best
            break
    scope = (f"data x tensor x pipeline{' x context' if len(cps) > 1 else ''}"
             f"{' x expert' if len(plan_ep_options(spec, max_gpus)) > 1 else ''} parallel over up to "
             f"{max_gpus} GPUs ({per_node} per node)") if multi else (
        "single GPU only: the multi-GPU estimator (peakmem.ranks) is not installed, "
        "so no sharding is searched")  # fmt: skip
    assumptions = (
        *rates.notes(),
        f"global batch {gb} sequences of {setup.seq_len} tokens"
        + ("" if global_batch else f" (default: ~{DEFAULT_GLOBAL_BATCH_TOKENS:,} tokens per step)"),
        "layouts are scored by the step-time model first; memory is estimated in that order until "
        f"{top} fit; a (GPUs, tp, pp, cp, ep) whose most frugal variant (ZeRO-3 or ZeRO-1, full "
        "checkpointing, micro-batch 1) does not fit is skipped whole",
        "pipeline stages use ZeRO-0/1 only (DeepSpeed's pipeline engine rejects ZeRO-2/3); "
        "sequence parallelism on with tp > 1 (Korthikanti et al. 2022)",
    )
    return PlanReport(
        model=spec.name, params=spec.params, gpu=gpu, max_gpus=max_gpus, global_batch=gb,
        seq_len=setup.seq_len, layouts=tuple(found), fewest_gpus=fewest, scope=scope,
        search_space=tuple(families), assumptions=assumptions, scored=len(items), estimates=est.calls,
        elapsed_s=time.perf_counter() - t0,
    )  # fmt: skip


# Equal step times are broken towards the engine that keeps less per rank.
_ENGINE_ORDER = {"zero-1": 0, "zero-2": 1, "zero-0": 2, "zero-3": 3, "fsdp": 4}


def _plan_order(it: _PlanItem) -> tuple[float, int, int, bool]:
    return (round(it.time_s, 9), it.gpus, _ENGINE_ORDER[it.engine], it.ckpt is not Checkpointing.NONE)


def plan_cp_options(sf: st.SpecFlops, setup: TrainingSetup) -> tuple[int, ...]:
    """Context-parallel degrees worth searching: each rank keeps >= PLAN_CP_MIN_CHUNK tokens of a
    sequence, the degree divides it, and the attention kernel is not eager (no ring attention)."""
    if sf.kernel(setup) is AttentionKernel.EAGER:
        return (1,)
    s = setup.seq_len
    return tuple(c for c in PLAN_CP if s % c == 0 and (c == 1 or s // c >= PLAN_CP_MIN_CHUNK))


def plan_ep_options(spec: ModelSpec, ranks: int) -> tuple[int, ...]:
    """Expert-parallel degrees: those dividing every MoE layer's expert count and ``ranks`` (dp x cp)."""
    experts = {g.layer.mlp.num_experts for g in spec.groups if g.layer.mlp.is_moe}
    if not experts:
        return (1,)
    return tuple(e for e in PLAN_EP if ranks % e == 0 and all(n % e == 0 for n in experts))


def _time_engine(engine: str, dp: int) -> str:
    if dp <= 1:
        return "none"
    if engine == "fsdp":
        return "fsdp-full"
    return "ddp" if engine == "zero-0" else engine


def _plan_fits(est: _Estimator, setup: TrainingSetup, it: _PlanItem, par: Any, cap: int) -> bool:
    s = replace(setup, micro_batch=it.mb, grad_accum=it.accum, checkpointing=it.ckpt)
    r = est(s, par)
    return r is not None and r.needed <= cap


def _plan_layout(
    est: _Estimator, setup: TrainingSetup, it: _PlanItem, par: Any, cap: int, gb: int
) -> Layout | None:
    s = replace(setup, micro_batch=it.mb, grad_accum=it.accum, checkpointing=it.ckpt)
    r = est(s, par)
    if r is None or r.needed > cap:
        return None
    desc = par.describe() if par is not None else "1 GPU"
    desc += f"; micro-batch {it.mb} x {it.accum} micro-batches; checkpointing {it.ckpt.value}"
    return Layout(parallelism=par, setup=s, description=desc, ranks=r.ranks, needed_bytes=r.needed,
                  capacity_bytes=cap, step=it.step, global_batch=gb)  # fmt: skip


def _plan_families(multi: bool) -> list[Family]:
    if not multi:
        return [Family(name="sharding / tensor / pipeline parallel", status="not available",
                       reason="the multi-GPU estimator (peakmem.ranks) is not installed"),
                Family(name="checkpointing x micro-batch", status="searched",
                       options=("none/selective/full", f"micro-batch {PLAN_MICRO_BATCHES}"))]  # fmt: skip
    return [
        Family(
            name="GPU count", status="searched", options=("powers of two up to --max-gpus, and --max-gpus",)
        ),
        Family(name="tensor parallel", status="searched", options=tuple(f"tp={t}" for t in PLAN_TP)),
        Family(
            name="pipeline parallel", status="searched", options=("pp in 1..64 (powers of two, <= layers)",)
        ),
        Family(
            name="data-parallel engine",
            status="searched",
            options=("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP full-shard"),
        ),
        Family(name="checkpointing", status="searched", options=("none", "selective", "full")),
        Family(name="micro-batch", status="searched", options=tuple(str(m) for m in PLAN_MICRO_BATCHES)),
        Family(
            name="context parallel",
            status="searched",
            options=(
                f"cp in {PLAN_CP} while seq / cp >= {PLAN_CP_MIN_CHUNK:,} tokens (not with eager attention)",
            ),
        ),
        Family(
            name="expert parallel",
            status="searched",
            options=(f"ep in {PLAN_EP} dividing the experts and dp x cp (MoE models only)",),
        ),
        Family(
            name="offload",
            status="not applicable",
            reason="not searched by plan (use `peakmem train --offload` or `peakmem fit` to check it)",
        ),
    ]


# --- fit --infer ----------------------------------------------------------------------------------
INFER_MAX_TP = 8  # tensor parallel inside one node


@dataclass(frozen=True, kw_only=True)
class InferCandidate:
    """A changed inference job, estimated on its own (per tensor-parallel rank)."""

    label: str
    steps: tuple[str, ...]
    changes: tuple[Change, ...]
    setup: Any  # peakmem.inference.InferenceSetup
    estimate: Estimate
    needed_bytes: int  # device total of one rank
    capacity_bytes: int
    fits: bool  # vLLM/SGLang: the pool holds ``batch`` sequences; others: device total <= capacity
    max_concurrent: int | None  # vLLM/SGLang: sequences of ``context`` tokens the pool holds
    changes_job: bool = False

    @property
    def gpus(self) -> int:
        return int(self.setup.tp)


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
    setup: Any  # InferenceSetup
    gpus: tuple[InferGpuFit, ...]
    smallest_sufficient: str | None
    search_space: tuple[Family, ...]
    assumptions: tuple[str, ...]
    estimates: int
    elapsed_s: float

    @property
    def any_fits(self) -> bool:
        return any(g.fits for g in self.gpus)


def _infer_with(setup: Any, **changes: Any) -> Any:
    fields = {f: getattr(setup, f) for f in setup.__dataclass_fields__}
    fields.update(changes)
    return type(setup)(**fields)


class _InferEstimator:
    def __init__(self, spec: ModelSpec) -> None:
        from peakmem.formulas import serving

        self.spec, self.serving = spec, serving
        self.memo: dict[Any, tuple[Estimate, int, bool, int | None] | None] = {}
        self.calls = 0

    def __call__(self, setup: Any, capacity: int) -> tuple[Estimate, int, bool, int | None] | None:
        """(estimate, needed bytes, fits, max concurrent sequences) of ``setup`` on ``capacity`` bytes."""
        key = (setup, capacity)
        if key in self.memo:
            return self.memo[key]
        self.calls += 1
        try:
            est = self.serving.estimate_inference(self.spec, setup)
        except (InputError, NotImplementedError):
            self.memo[key] = None
            return None
        conc = est.extra.get("max_concurrent_sequences")
        if setup.engine.value in ("vllm", "sglang"):
            fits = isinstance(conc, int) and conc >= setup.batch and est.device_total_bytes <= capacity
        else:
            fits = est.device_total_bytes <= capacity
        out = (est, est.device_total_bytes, fits, conc if isinstance(conc, int) else None)
        self.memo[key] = out
        return out


def _weight_options(setup: Any) -> tuple[str, ...]:
    """Smaller weight formats the engine loads, least invasive first."""
    fmt = setup.weight_format
    engine = setup.engine.value
    if engine == "llamacpp":
        ladder: tuple[str, ...] = ("q8_0", "q6_k", "q4_k_m")
    elif engine == "hf":
        ladder = ("int8", "nf4")
    else:  # vllm / sglang
        ladder = ("fp8", "awq-4bit")
    if fmt.scheme.value in ("float", "gguf") and fmt.bits == 32:
        ladder = (("f16",) if engine == "llamacpp" else ("bf16",)) + ladder
    current = _nominal_bits(fmt.name)
    return tuple(name for name in ladder if _nominal_bits(name) < current)


def _nominal_bits(name: str) -> int:
    """Bits per weight a format is named for (GGUF mixes by their type: q4_k_m -> 4)."""
    from peakmem.inference import parse_weight_format

    bits = parse_weight_format(name).bits
    if bits:
        return bits
    match = re.search(r"i?q(\d)", name)
    return int(match.group(1)) if match else 16


def _kv_options(setup: Any) -> tuple[Any, ...]:
    from peakmem.inference import KV_BITS, KvDtype

    engine = setup.engine.value
    ladder = (KvDtype.FP8,) if engine in ("vllm", "sglang") else (KvDtype.INT8, KvDtype.INT4)
    cur = setup.kv_cache
    cur_bits = KV_BITS.get(cur, 16)
    return tuple(k for k in ladder if KV_BITS[k] < cur_bits)


def fit_inference(
    spec: ModelSpec, setup: Any, gpus: tuple[Gpu, ...] | list[Gpu], *, top: int = TOP_CANDIDATES
) -> InferFitReport:
    """``peakmem fit MODEL --infer``: verdicts for serving ``setup`` on each GPU, limits (longest context,
    most concurrent sequences) and the changes that make it fit: a smaller weight format, a smaller
    KV-cache dtype, tensor parallel over the fewest GPUs of a node, then (changing the job) fewer
    concurrent sequences or a shorter context."""

    require(len(gpus) > 0, "gpu", "", "give at least one GPU")
    t0 = time.perf_counter()
    gpus = tuple(gpus)
    est = _InferEstimator(spec)
    weights = _weight_options(setup)
    kvs = _kv_options(setup)
    families = [
        Family(name="weight format", status="searched" if weights else "not applicable",
               reason="" if weights else f"{setup.weight_format.name} is already as small as the engine's "
               "common formats", options=weights),
        Family(name="KV-cache dtype", status="searched" if kvs else "not applicable",
               reason="" if kvs else f"kv cache {setup.kv_cache.value}: already the engine's smallest",
               options=tuple(k.value for k in kvs)),
        Family(name="tensor parallel over N GPUs",
               status="searched" if setup.engine.value != "llamacpp" and setup.tp == 1 else "not applicable",
               reason="" if setup.engine.value != "llamacpp" else "llama.cpp splits layers, not tensors",
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
    results = [_infer_gpu(spec, setup, gpu, est, options, top) for gpu in gpus]
    fitting = [g for g in results if g.fits]
    smallest = min(fitting, key=lambda g: g.capacity_bytes).gpu.name if fitting else None
    assumptions = (
        "vLLM/SGLang fit when their KV pool (gpu_memory_utilization x GPU, less weights and activations) "
        "holds "
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


def _infer_configs(
    base: Any, options: _InferOptions
) -> list[tuple[Any, tuple[str, ...], tuple[Change, ...]]]:
    out = []
    for k in range(1, len(options) + 1):
        for combo in itertools.combinations(options, k):
            for picks in itertools.product(*(opts for _, opts in combo)):
                try:
                    s = _infer_with(base, **dict(picks))
                except InputError:
                    continue
                labels = tuple(f"{f.replace('_', '-')} {_value(v)}" for f, v in picks)
                changes = tuple(
                    Change(field=f, old=_value(getattr(base, f)), new=_value(v)) for f, v in picks
                )
                out.append((s, labels, changes))
    return out


class _InferGpuSearch:
    def __init__(self, spec: ModelSpec, setup: Any, gpu: Gpu, est: _InferEstimator) -> None:
        self.spec, self.setup, self.gpu, self.est = spec, setup, gpu, est
        self.cap = gpu.usable_bytes
        self.base = _infer_with(setup, gpu_bytes=self.cap)

    def ok(self, s: Any) -> bool:
        r = self.est(s, self.cap)
        return bool(r and r[2])

    def cand(self, s: Any, labels: tuple[str, ...], changes: tuple[Change, ...], job: bool = False
             ) -> InferCandidate | None:  # fmt: skip
        r = self.est(s, self.cap)
        if r is None:
            return None
        e, need, ok, conc = r
        return InferCandidate(label=" + ".join(labels), steps=labels, changes=changes, setup=s, estimate=e,
                              needed_bytes=need, capacity_bytes=self.cap, fits=ok, max_concurrent=conc,
                              changes_job=job)  # fmt: skip

    def with_context(self, n: int) -> Any | None:
        prompt = self.base.prompt
        try:
            return _infer_with(self.base, context=n, prompt=min(prompt, n) if prompt else None)
        except InputError:
            return None

    def fewer_sequences(self) -> InferCandidate | None:
        b = _largest_true(1, self.setup.batch - 1, lambda k: self.ok(_infer_with(self.base, batch=k)))
        if not b:
            return None
        return self.cand(_infer_with(self.base, batch=b), (f"{b} concurrent sequences (changes the job)",),
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
        self, s: Any, labels: tuple[str, ...], changes: tuple[Change, ...]
    ) -> InferCandidate | None:
        for n in range(2, INFER_MAX_TP + 1):
            try:
                sn = _infer_with(s, tp=n)
            except InputError:
                continue
            c = self.cand(sn, (*labels, f"tensor parallel over {n} GPUs"),
                          (*changes, Change(field="tp", old="1", new=str(n))))  # fmt: skip
            if c is not None and c.fits:
                return c
        return None


def _infer_gpu(
    spec: ModelSpec, setup: Any, gpu: Gpu, est: _InferEstimator, options: _InferOptions, top: int
) -> InferGpuFit:
    from peakmem.formulas.serving import max_concurrent, max_context

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
        if setup.engine.value != "llamacpp" and setup.tp == 1:
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


# --- JSON -------------------------------------------------------------------------------------------
def _step_json(step: st.StepTime) -> dict[str, object]:
    return {
        "total_s": step.total_s, "compute_s": step.compute_s, "recompute_s": step.recompute_s,
        "bubble_s": step.bubble_s, "tp_comm_s": step.tp_comm_s, "dp_comm_s": step.dp_comm_s,
        "pp_comm_s": step.pp_comm_s, "cp_comm_s": step.cp_comm_s, "ep_comm_s": step.ep_comm_s,
        "offload_s": step.offload_s, "dequant_s": step.dequant_s,
        "gpus": step.gpus, "tokens": step.tokens,
        "gpu_seconds": step.gpu_seconds, "tokens_per_s": step.tokens_per_s,
    }  # fmt: skip


def _candidate_json(c: Candidate) -> dict[str, object]:
    return {
        "label": c.label, "changes": [list(ch.as_tuple()) for ch in c.changes], "fits": c.fits,
        "needed_bytes": c.needed_bytes, "capacity_bytes": c.capacity_bytes,
        "headroom_bytes": c.headroom_bytes, "steps": list(c.steps),
        "peak_allocated_bytes": c.estimate.peak_allocated_bytes, "peak_phase": c.estimate.peak_phase.value,
        "cpu_bytes": c.cpu_bytes, "gpus": c.gpus, "step_time": _step_json(c.step),
        "relative_cost": c.relative_cost, "changes_job": c.changes_job, "setup": setup_dict(c.setup),
        "parallelism": c.parallelism.describe() if c.parallelism is not None else None,
    }  # fmt: skip


def _family_json(f: Family) -> dict[str, object]:
    return {"name": f.name, "status": f.status, "reason": f.reason, "options": list(f.options)}


def fit_json(report: FitReport) -> dict[str, object]:
    """The fit report as JSON-ready values (bytes as int)."""
    return {
        "model": {"name": report.model, "params": report.params},
        "setup": setup_dict(report.setup),
        "device_total_bytes": report.baseline.device_total_bytes,
        "peak_allocated_bytes": report.baseline.peak_allocated_bytes,
        "step_time": _step_json(report.baseline_step),
        "smallest_sufficient": report.smallest_sufficient,
        "fits_any": report.any_fits,
        "gpus": [
            {
                "gpu": g.gpu.name, "display_name": g.gpu.display_name,
                "capacity_bytes": g.verdict.capacity_bytes,
                "needed_bytes": g.verdict.needed_bytes, "fits": g.verdict.fits,
                "headroom_bytes": g.verdict.headroom_bytes,
                "candidates": [_candidate_json(c) for c in g.candidates],
                "singles": [_candidate_json(c) for c in g.singles],
                "limits": {
                    "largest_micro_batch": g.limits.largest_micro_batch, "longest_seq": g.limits.longest_seq,
                    "seq_capped_at_context": g.limits.seq_capped, "fewest_gpus": g.limits.fewest_gpus,
                    "fewest_gpus_layout": g.limits.fewest_gpus_layout, "note": g.limits.note,
                },
            }
            for g in report.gpus
        ],
        "search_space": [_family_json(f) for f in report.search_space],
        "assumptions": list(report.assumptions),
        "estimates": report.estimates,
        "elapsed_s": report.elapsed_s,
    }  # fmt: skip


def _layout_json(lay: Layout) -> dict[str, object]:
    par = lay.parallelism
    return {
        "layout": lay.description,
        "gpus": lay.step.gpus,
        "tp": par.tp if par is not None else 1, "pp": par.pp if par is not None else 1,
        "dp": par.dp if par is not None else 1, "cp": par.cp if par is not None else 1,
        "ep": par.ep if par is not None else 1, "engine": par.engine if par is not None else "none",
        "micro_batch": lay.setup.micro_batch, "grad_accum": lay.setup.grad_accum,
        "checkpointing": lay.setup.checkpointing.value,
        "needed_bytes": lay.needed_bytes, "capacity_bytes": lay.capacity_bytes,
        "headroom_bytes": lay.headroom_bytes,
        "ranks": [{"role": r, "ranks": n, "device_total_bytes": b, "cpu_pinned_bytes": c}
                  for r, n, b, c in lay.ranks],
        "step_time": _step_json(lay.step),
    }  # fmt: skip


def plan_json(report: PlanReport) -> dict[str, object]:
    return {
        "model": {"name": report.model, "params": report.params},
        "gpu": report.gpu.name, "capacity_bytes": report.gpu.usable_bytes, "max_gpus": report.max_gpus,
        "global_batch": report.global_batch, "seq_len": report.seq_len, "scope": report.scope,
        "layouts": [_layout_json(lay) for lay in report.layouts],
        "fewest_gpus": _layout_json(report.fewest_gpus) if report.fewest_gpus is not None else None,
        "search_space": [_family_json(f) for f in report.search_space],
        "assumptions": list(report.assumptions),
        "scored": report.scored, "estimates": report.estimates, "elapsed_s": report.elapsed_s,
    }  # fmt: skip


__all__ = [
    "Candidate", "Change", "Family", "FitReport", "GpuFit", "InferCandidate", "InferFitReport", "InferGpuFit",
    "Layout", "Limits", "PlanReport", "Verdict", "fit", "fit_inference", "fit_inference_json", "fit_json",
    "plan", "plan_json",
]  # fmt: skip
