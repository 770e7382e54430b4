"""``peakmem plan``: the fastest parallel layouts that fit, scored by the step-time model first."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Any

from peakmem.catalog import Gpu
from peakmem.errors import require
from peakmem.formulas import step_time as st
from peakmem.formulas.overhead import Overheads
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import DEFAULT_GPUS_PER_NODE, FsdpMode, Parallelism
from peakmem.planner.search import Family, _Estimator, _family_json, _step_json, where_it_acts
from peakmem.training import AttentionKernel, Checkpointing, TrainingSetup

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


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One parallel layout in a plan, estimated."""

    parallelism: Parallelism
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
    overheads: Overheads | None = None, top: int = TOP_LAYOUTS, costs: CostLookup | None = None,
) -> PlanReport:  # fmt: skip
    """The fastest layouts of ``setup`` on up to ``max_gpus`` of ``gpu``, ranked by step time (``costs``:
    a derived spec's block-cost lookup)."""
    require(max_gpus >= 1, "max_gpus", max_gpus, "must be a positive integer")
    t0 = time.perf_counter()
    est = _Estimator(spec, overheads, costs=costs)
    sf = st.spec_flops(spec)
    rates = st.rates_for(gpu)
    cap = gpu.usable_bytes
    gb = global_batch or max(1, DEFAULT_GLOBAL_BATCH_TOKENS // setup.seq_len)
    require(gb >= 1, "global_batch", gb, "must be a positive integer")
    per_node = DEFAULT_GPUS_PER_NODE
    families = _plan_families()
    trainable = est(where_it_acts(replace(setup, micro_batch=1, grad_accum=1), None))
    trainable_params = trainable.estimate.trainable_params if trainable is not None else spec.params

    # 1. score every layout with the time model (arithmetic only)
    items: list[_PlanItem] = []
    counts = _gpu_counts(max_gpus, per_node)
    layers = spec.num_layers
    pp_options = [p for p in (1, 2, 4, 8, 16, 32, 64) if p <= layers]
    tps = [t for t in PLAN_TP if t <= per_node and _divides_heads(spec, t)]
    cps = plan_cp_options(sf, setup)
    ckpts = (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.FULL)
    # optimizer-in-backward cannot accumulate: unless a global batch is asked, it is the data-parallel
    # ranks x the job's own micro-batch, and layouts are ranked by time per sequence
    free_batch = setup.optimizer_in_backward and global_batch is None
    micro_batches = (setup.micro_batch,) if free_batch else PLAN_MICRO_BATCHES
    shaped: dict[tuple[int, int, Checkpointing], TrainingSetup] = {}
    for n, tp, pp, cp in itertools.product(counts, tps, pp_options, cps):
        if tp * pp * cp > n or n % (tp * pp * cp):
            continue
        dp = n // (tp * pp * cp)
        shard = dp * cp  # ZeRO / FSDP shard over the dp x cp ranks
        engines = ["zero-0", "zero-1"] if pp > 1 else ["zero-0", "zero-1", "zero-2", "zero-3", "fsdp"]
        if shard == 1:
            engines = ["zero-0"]
        for ep, mb in itertools.product(plan_ep_options(spec, shard), micro_batches):
            accum = _accumulation(setup, global_batch, gb, dp * mb)
            if accum is None:
                continue
            for engine, ck in itertools.product(engines, ckpts):
                s = shaped.get((mb, accum, ck))
                if s is None:  # one validated setup per shape, whatever the layout
                    s = shaped[mb, accum, ck] = replace(
                        setup, micro_batch=mb, grad_accum=accum, checkpointing=ck
                    )
                lay = st.Layout(gpus=n, tp=tp, pp=pp, cp=cp, ep=ep, gpus_per_node=per_node,
                                engine=_time_engine(engine, shard))  # fmt: skip
                step = st.step_time(sf, s, rates, lay, trainable_params=trainable_params, params=spec.params)
                items.append(_PlanItem(time_s=step.total_s, gpus=n, tp=tp, pp=pp, cp=cp, ep=ep, engine=engine,
                                       ckpt=ck, mb=mb, accum=accum, step=step))  # fmt: skip
    items.sort(key=_plan_order_per_sequence if free_batch else _plan_order)

    # 2. estimate memory in order of step time until ``top`` layouts fit
    floor_ok: dict[tuple[int, int, int, int, int], bool] = {}
    found: list[Layout] = []

    def make_par(it: _PlanItem) -> Parallelism:
        kw: dict[str, Any] = {"gpus": it.gpus, "tp": it.tp, "pp": it.pp, "cp": it.cp, "ep": it.ep,
                              "sequence_parallel": it.tp > 1}  # fmt: skip
        if it.engine == "fsdp":
            kw["fsdp"] = FsdpMode.FULL_SHARD
        else:
            kw["zero_stage"] = int(it.engine[-1])
        return Parallelism(**kw)

    def frugal_fits(n: int, tp: int, pp: int, cp: int, ep: int) -> bool:
        key = (n, tp, pp, cp, ep)
        if key not in floor_ok:
            dp = n // (tp * pp * cp)
            shard = dp * cp
            engine = "zero-0" if shard == 1 else "zero-3" if pp == 1 else "zero-1"
            it = _PlanItem(time_s=0, gpus=n, tp=tp, pp=pp, cp=cp, ep=ep, engine=engine,
                           ckpt=Checkpointing.FULL, mb=1,
                           accum=1 if setup.optimizer_in_backward else max(1, gb // max(1, dp)),
                           step=items[0].step)  # fmt: skip
            floor_ok[key] = _plan_fits(est, setup, it, make_par(it), cap)
        return floor_ok[key]

    # Layouts known not to fit: (shape, engine) -> (checkpointing rank, micro-batch) pairs. A layout
    # is skipped when one at least as frugal (as much checkpointing, no larger micro-batch) on the
    # same shape and engine did not fit: memory does not fall as the micro-batch grows or as less
    # is recomputed (the search's own monotonicity, as _first_fit assumes).
    failed: dict[tuple[int, int, int, int, int, str], list[tuple[int, int]]] = {}

    def try_layout(it: _PlanItem) -> Layout | None:
        key = (it.gpus, it.tp, it.pp, it.cp, it.ep, it.engine)
        rank = _CKPT_RANK[it.ckpt]
        if any(r >= rank and mb <= it.mb for r, mb in failed.get(key, ())):
            return None
        got = _plan_layout(est, setup, it, make_par(it), cap, _sequences(it))
        if got is None:
            failed.setdefault(key, []).append((rank, it.mb))
        return got

    # one layout per (GPUs, tp, pp, cp, ep): the fastest that fits
    shapes_done: set[tuple[int, int, int, int, int]] = set()
    for it in items:
        if len(found) >= top:
            break
        shape = (it.gpus, it.tp, it.pp, it.cp, it.ep)
        if shape in shapes_done or not frugal_fits(*shape):
            continue
        got = try_layout(it)
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
            best = try_layout(it)
            if best is not None:
                break
        if best is not None:
            fewest = best
            break
    scope = (f"data x tensor x pipeline{' x context' if len(cps) > 1 else ''}"
             f"{' x expert' if len(plan_ep_options(spec, max_gpus)) > 1 else ''} parallel over up to "
             f"{max_gpus} GPUs ({per_node} per node)")  # fmt: skip
    assumptions = (
        *rates.notes(),
        (
            f"global batch = data-parallel ranks x micro-batch {setup.micro_batch} sequences of "
            f"{setup.seq_len} tokens (optimizer-in-backward steps at every micro-batch: no accumulation); "
            "ranked by time per sequence"
        )
        if free_batch
        else f"global batch {gb} sequences of {setup.seq_len} tokens"
        + ("" if global_batch else f" (default: ~{DEFAULT_GLOBAL_BATCH_TOKENS:,} tokens per step)"),
        "layouts are scored by the step-time model first; memory is estimated in that order until "
        f"{top} fit; a (GPUs, tp, pp, cp, ep) whose most frugal variant (ZeRO-3 or ZeRO-1, full "
        "checkpointing, micro-batch 1) does not fit is skipped whole",
        "pipeline stages use ZeRO-0/1 only (DeepSpeed's pipeline engine rejects ZeRO-2/3); "
        "sequence parallelism on with tp > 1 (Korthikanti et al. 2022)",
    )
    return PlanReport(
        model=spec.name, params=spec.params, gpu=gpu, max_gpus=max_gpus,
        global_batch=found[0].global_batch if free_batch and found else gb,
        seq_len=setup.seq_len, layouts=tuple(found), fewest_gpus=fewest, scope=scope,
        search_space=tuple(families), assumptions=assumptions, scored=len(items), estimates=est.calls,
        elapsed_s=time.perf_counter() - t0,
    )  # fmt: skip


# How much a checkpointing level saves, for the "at least as frugal" test of plan's search.
_CKPT_RANK = {Checkpointing.NONE: 0, Checkpointing.SELECTIVE: 1, Checkpointing.FULL: 2}
# Equal step times are broken towards the engine that keeps less per rank.
_ENGINE_ORDER = {"zero-1": 0, "zero-2": 1, "zero-0": 2, "zero-3": 3, "fsdp": 4}


def _accumulation(setup: TrainingSetup, asked: int | None, gb: int, per_step: int) -> int | None:
    """Micro-batches per optimizer step for ``per_step`` sequences a step over the data-parallel
    ranks, or None when that shape cannot make the global batch ``gb``. Optimizer-in-backward steps at
    every micro-batch (no accumulation, as torchtune's recipes require): its global batch is
    ``per_step`` itself, which must equal ``gb`` only when the user asked for one (``asked``)."""
    if setup.optimizer_in_backward:
        return 1 if asked is None or asked == per_step else None
    return None if gb % per_step else gb // per_step


def _sequences(it: _PlanItem) -> int:
    """Sequences per optimizer step: data-parallel ranks x micro-batch x accumulation."""
    return it.gpus // (it.tp * it.pp * it.cp) * it.mb * it.accum


def _plan_order(it: _PlanItem) -> tuple[float, int, int, bool]:
    return (round(it.time_s, 9), it.gpus, _ENGINE_ORDER[it.engine], it.ckpt is not Checkpointing.NONE)


def _plan_order_per_sequence(it: _PlanItem) -> tuple[float, int, int, bool]:
    """Layouts whose global batches differ (optimizer-in-backward): by time per sequence."""
    return (round(it.time_s / _sequences(it), 12), *_plan_order(it)[1:])


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


def _plan_fits(est: _Estimator, setup: TrainingSetup, it: _PlanItem, par: Parallelism, cap: int) -> bool:
    s = where_it_acts(replace(setup, micro_batch=it.mb, grad_accum=it.accum, checkpointing=it.ckpt), par)
    return est.fits(s, par, cap)


def _plan_layout(
    est: _Estimator, setup: TrainingSetup, it: _PlanItem, par: Parallelism, cap: int, gb: int
) -> Layout | None:
    s = where_it_acts(replace(setup, micro_batch=it.mb, grad_accum=it.accum, checkpointing=it.ckpt), par)
    if not est.fits(s, par, cap):  # a floor above the GPU rules it out unreplayed
        return None
    r = est(s, par)
    if r is None:
        return None
    desc = par.describe()
    desc += f"; micro-batch {it.mb} x {it.accum} micro-batches; checkpointing {it.ckpt.value}"
    return Layout(parallelism=par, setup=s, description=desc, ranks=r.ranks, needed_bytes=r.needed,
                  capacity_bytes=cap, step=it.step, global_batch=gb)  # fmt: skip


def _plan_families() -> list[Family]:
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


def _layout_json(lay: Layout) -> dict[str, object]:
    par = lay.parallelism
    return {
        "layout": lay.description,
        "gpus": lay.step.gpus,
        "tp": par.tp if par is not None else 1, "pp": par.pp if par is not None else 1,
        "dp": par.dp if par is not None else 1, "cp": par.cp if par is not None else 1,
        "ep": par.ep if par is not None else 1, "engine": par.engine if par is not None else "none",
        "micro_batch": lay.setup.micro_batch, "grad_accum": lay.setup.grad_accum,
        "checkpointing": lay.setup.checkpointing_spelled,
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
