"""The one search: the estimator wrapper (memoised per search), the changes it applies, the
finishers that close a gap with the least invasive value of one knob, and the generic
"first value that fits" helpers. fit, plan, train's ways down and the page all build on it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from peakmem.adapters import LayoutPrep, lora_of, quant_of
from peakmem.breakdown import Estimate
from peakmem.catalog import Gpu
from peakmem.errors import InputError
from peakmem.estimate import TrainingEstimator, setup_dict
from peakmem.formulas import step_time as st
from peakmem.formulas.overhead import Overheads
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.ranks import RankReport, estimate_ranks
from peakmem.step_setup import setup_that_runs
from peakmem.training import TrainingSetup

MAX_CHANGES = 3  # changes combined in one candidate
MAX_NODE_GPUS = 8  # "shard over N GPUs" stays inside one node (DGX/HGX: 8 GPUs)
MAX_LIMIT_GPUS = 1024  # the "fewest GPUs" limit searches up to this many
MAX_MICRO_BATCH = 4096  # the "largest micro-batch" limit searches up to this
SEQ_STEP = 64  # a shorter sequence is a multiple of this (kernels tile by 64/128)
TOP_CANDIDATES = 10  # shown per GPU (JSON carries the same list)


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
    parallelism: Parallelism | None  # None: plain single-GPU estimate
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


# --- estimating, memoised ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Result:
    estimate: Estimate
    needed: int
    cpu_bytes: int
    ranks: tuple[tuple[str, int, int, int], ...]
    report: RankReport | None = None  # when sharded


class _Estimator:
    """Estimates (setup, parallelism) once; an invalid combination is remembered as None."""

    def __init__(
        self, spec: ModelSpec, overheads: Overheads | None, *, margin: bool = False, lazy: bool = False,
        costs: CostLookup | None = None,
    ) -> None:  # fmt: skip
        self.spec = spec
        self.overheads = overheads
        self.margin = margin  # judge by the band's high end: a change must make it "fit", not "tight"
        # lazy: a derived spec's setup family whose block costs are not measured yet is not measured
        # for a change (``train``'s ways: a family takes a minute or more to measure on a CPU)
        self.lazy = lazy
        self.memo: dict[tuple[TrainingSetup, Parallelism | None], _Result | None] = {}
        # why a (setup, layout) could not be estimated: the one-line error, for the user's own setup
        self.failures: dict[tuple[TrainingSetup, Parallelism | None], str] = {}
        self.calls = 0
        # its memo serves every setup and layout asked; ``costs``: a derived spec's block-cost lookup
        self.engine = TrainingEstimator(spec, overheads, costs=costs)
        # the same estimates with the closed-form reserved: a floor of the replayed one (estimate.py takes
        # the larger), so a job whose floor exceeds the GPU is out without replaying its step
        ov = overheads or Overheads()
        self.floor = (
            TrainingEstimator(spec, replace(ov, fragmentation=ov.fraction), costs=costs)
            if ov.replay_reserved and not margin
            else None
        )
        self.floor_memo: dict[tuple[TrainingSetup, Parallelism | None], int | None] = {}
        # the (setup, layout) pairs counted in ``calls``: a layout ruled out by its floor counts as estimated
        self.counted: set[tuple[TrainingSetup, Parallelism | None]] = set()

    def __call__(self, setup: TrainingSetup, par: Parallelism | None = None) -> _Result | None:
        key = (setup, par)
        if key in self.memo:
            return self.memo[key]
        self._count(key)
        result: _Result | None
        try:
            if par is None:
                est = self.engine.estimate(setup)
                result = _Result(estimate=est, needed=self._need(est), cpu_bytes=0,
                                 ranks=(("all ranks", 1, est.device_total_bytes, 0),))  # fmt: skip
            else:
                rep = estimate_ranks(self.spec, setup, par, estimator=self.engine)
                top = rep.most_loaded
                result = _Result(
                    estimate=top.estimate, needed=self._need(top.estimate),
                    cpu_bytes=rep.cpu_pinned_per_node_bytes,
                    ranks=tuple((r.role, r.ranks, r.estimate.device_total_bytes, r.cpu_bytes)
                                for r in rep.ranks), report=rep,
                )  # fmt: skip
        except (InputError, NotImplementedError) as exc:
            result = None
            self.failures[key] = str(exc)
        self.memo[key] = result
        return result

    def failure(self, setup: TrainingSetup, par: Parallelism | None, spec: ModelSpec) -> InputError:
        """The error for a setup the user asked that :meth:`__call__` could not estimate: its own
        one-line message where it raised one."""
        return InputError(self.failures.get((setup, par)) or f"the setup cannot be estimated for {spec.name}")

    def unmeasured(self, setup: TrainingSetup) -> bool:
        """Whether estimating ``setup`` would first measure block costs and this estimator is lazy:
        never for the formulas' families; for a derived spec, when its costs in the setup's family
        are neither shipped, cached nor already measured."""
        if not self.lazy or not self.spec.derived_from:
            return False
        from peakmem import block_costs
        from peakmem.formulas.activations import derived_family

        family = derived_family(setup_that_runs(self.spec, setup), self.spec.attention_kernels)
        return not block_costs.costs_ready(self.spec.derived_from, family)

    def _count(self, key: tuple[TrainingSetup, Parallelism | None]) -> None:
        """Count (setup, layout) once in ``calls``, whether its floor or its estimate was computed."""
        if key not in self.counted:
            self.counted.add(key)
            self.calls += 1

    def floor_needed(self, setup: TrainingSetup, par: Parallelism | None = None) -> int | None:
        """A lower bound of what (setup, par) needs (None: it cannot be estimated): the closed-form
        reserved's device total (of the most loaded rank under ``par``), before any replay; the answer
        itself where it is known. Exact as a bound: estimate.py adds the replay's excess over the closed
        form (never negative) to each rank's reserved, and the most loaded rank is the one with the
        largest device total, so no rank's answer is below its floor and the answer not below the
        largest floor. Under ``par`` the floor counts as the layout's estimate in ``calls`` (once)."""
        key = (setup, par)
        if self.floor is None or key in self.memo:
            r = self(setup, par)
            return None if r is None else r.needed
        if key not in self.floor_memo:
            try:
                if par is None:
                    self.floor_memo[key] = self.floor.estimate(setup).needed_bytes
                else:
                    self._count(key)
                    rep = estimate_ranks(self.spec, setup, par, estimator=self.floor)
                    self.floor_memo[key] = rep.most_loaded.estimate.needed_bytes
            except (InputError, NotImplementedError):
                self.floor_memo[key] = None
        return self.floor_memo[key]

    def fits(self, setup: TrainingSetup, par: Parallelism | None, capacity: int) -> bool:
        """Whether (setup, par) needs at most ``capacity``; a floor above it rules it out unreplayed."""
        floor = self.floor_needed(setup, par)
        if floor is None or floor > capacity:
            return False
        r = self(setup, par)
        return r is not None and r.needed <= capacity

    def _need(self, est: Estimate) -> int:
        """What a GPU must hold (``Estimate.needed_bytes``): the likely value, or the band's high end under
        ``margin``."""
        high = est.needed_high_bytes
        return high if self.margin and high is not None else est.needed_bytes


def where_it_acts(setup: TrainingSetup, par: Parallelism | None) -> TrainingSetup:
    """The setup a layout the search proposes runs (plan's layouts, fit's layout changes; the user's own
    layout keeps the flag and its one-line error): torchao's float8 all-gather acts through FSDP2's hooks
    only (torchao float8 fsdp_utils.py ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``), so on a
    layout that does not shard with FSDP2 the flag changes nothing and is dropped; a TRL release prepares
    the peft model by the layout's kind (``setup.layout_prep``: one GPU / DDP, FSDP, ZeRO-3)."""
    if setup.float8_all_gather and (par is None or par.fsdp is FsdpMode.NONE or par.fsdp_version != 2):
        setup = replace(setup, float8_all_gather=False)
    if setup.layout_prep is not None:
        setup = _with_layout_prep(setup, setup.layout_prep, par)
    return setup


def _with_layout_prep(setup: TrainingSetup, prep: LayoutPrep, par: Parallelism | None) -> TrainingSetup:
    """``setup`` with the (kbit_prep, adapter_dtype) row of ``prep`` for ``par``'s kind of layout."""
    if par is not None and par.zero_stage == 3:
        kbit, dtype = prep.zero3
    elif par is not None and par.fsdp is not FsdpMode.NONE:
        kbit, dtype = prep.fsdp
    else:
        kbit, dtype = prep.replicated
    quant = quant_of(setup)
    return replace(
        setup, lora=replace(lora_of(setup), adapter_dtype=dtype),
        quant=setup.quant if quant is None else replace(quant, kbit_prep=kbit),
    )  # fmt: skip


def _value(v: object) -> str:
    return v.value if isinstance(v, Enum) else str(v)


def _layout_of(par: Parallelism | None) -> st.Layout:
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


# --- options and changes -----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Option:
    """One option of a family: setup fields and parallelism fields to set."""

    label: str
    setup: tuple[tuple[str, Any], ...] = ()
    par: tuple[tuple[str, Any], ...] = ()


# --- applying changes ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Config:
    setup: TrainingSetup
    par: Parallelism | None
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
            cur = par if par is not None else Parallelism()
            fields = dict(opt.par)
            if "zero_stage" in fields:
                fields["zero_stage"] = max(fields["zero_stage"], cur.zero_stage)
            for name, value in fields.items():
                if _value(getattr(cur, name)) != _value(value):
                    changes.append(Change(field=name, old=_value(getattr(cur, name)), new=_value(value)))
            par = replace(cur, **fields)
            setup = where_it_acts(setup, par)  # a layout the search proposes, not the user's
    except InputError:
        return None
    return _Config(setup=setup, par=par, changes=tuple(changes), labels=(*base.labels, opt.label),
                   changes_job=base.changes_job)  # fmt: skip


def smaller_micro_batch(cfg: _Config, mb: int) -> _Config:
    """The job at micro-batch ``mb``. Accumulation keeps the global batch, except under
    optimizer-in-backward, which steps at every micro-batch and cannot accumulate (torchtune's
    recipes refuse ``gradient_accumulation_steps > 1`` with ``optimizer_in_bwd``): there the global
    batch shrinks, a different job."""
    s = cfg.setup
    if s.optimizer_in_backward:
        ch: tuple[Change, ...] = (Change(field="micro_batch", old=str(s.micro_batch), new=str(mb)),)
        label = (
            f"micro-batch {mb} (global batch /{s.micro_batch // mb}: optimizer-in-backward cannot accumulate)"
        )
        return _Config(setup=replace(s, micro_batch=mb), par=cfg.par, changes=cfg.changes + ch,
                       labels=(*cfg.labels, label), changes_job=True)  # fmt: skip
    accum = s.grad_accum * s.micro_batch // mb
    ch = (Change(field="micro_batch", old=str(s.micro_batch), new=str(mb)),
          Change(field="grad_accum", old=str(s.grad_accum), new=str(accum)))  # fmt: skip
    return _Config(setup=replace(s, micro_batch=mb, grad_accum=accum), par=cfg.par, changes=cfg.changes + ch,
                   labels=(*cfg.labels, f"micro-batch {mb} x accumulation {accum}"),
                   changes_job=cfg.changes_job)  # fmt: skip


# --- the search ------------------------------------------------------------------------------------
class _Search:
    def __init__(
        self,
        spec: ModelSpec,
        setup: TrainingSetup,
        gpus: tuple[Gpu, ...],
        est: _Estimator,
        par: Parallelism | None = None,
    ) -> None:
        self.spec, self.setup, self.gpus, self.est, self.par = spec, setup, gpus, est, par
        self.sf = st.spec_flops(spec)
        base = est(setup, par)
        if base is None:
            raise est.failure(setup, par, spec)
        self.base = base

    def base_step(self, rates: st.Rates) -> st.StepTime:
        return st.step_time(self.sf, self.setup, rates, _layout_of(self.par),
                            trainable_params=self.base.estimate.trainable_params,
                            params=self.spec.params)  # fmt: skip

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
        idx = _first_fit(len(divisors), lambda i: self._fits(smaller_micro_batch(cfg, divisors[i]), capacity))
        return None if idx is None else smaller_micro_batch(cfg, divisors[idx])

    def finish_shard(self, cfg: _Config, capacity: int, max_gpus: int = MAX_NODE_GPUS) -> _Config | None:
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

        idx = _first_fit(len(counts), ok)
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
        return self.est.fits(cfg.setup, cfg.par, capacity)


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
