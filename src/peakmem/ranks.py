"""Per-rank memory of a parallel training job: one :class:`~peakmem.breakdown.Estimate` per distinct
rank type (the most loaded first; first/last pipeline stage), plus CPU RAM per node.

It reuses the single-GPU formulas (:mod:`.formulas.activations`, :mod:`.formulas.loss`,
:mod:`.formulas.timeline`, :mod:`.formulas.allocator`) on each rank's local share:
micro-batch x (seq / cp) tokens, heads and MLP width / tp (:mod:`.formulas.model_parallel`), the
stage's layers, the engine's sharded states and buffers (:mod:`.formulas.sharding`), and the
micro-batches a pipeline stage keeps in flight. Pure and fast: a loop over layer groups and
parameter tensors per stage, no loop over layers or ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from peakmem.breakdown import Category, Estimate, MemoryItem, Phase, PhasePeak
from peakmem.errors import InputError
from peakmem.estimate import estimate_training, scaled_items, setup_dict, state_items
from peakmem.formulas import activations as act
from peakmem.formulas import allocator, sharding
from peakmem.formulas import model_parallel as mp
from peakmem.formulas.loss import head_activations
from peakmem.formulas.model_states import buffer_bytes, trainable_params
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.timeline import GroupCost, backward_peak
from peakmem.model import ModelSpec
from peakmem.parallel import Parallelism, validate_for
from peakmem.training import AttentionKernel, TrainingSetup
from peakmem.units import fmt_both

METHOD = "analytic"


@dataclass(frozen=True, kw_only=True)
class RankEstimate:
    """One rank type: its GPU estimate and its CPU/NVMe footprint."""

    role: str  # "all ranks", "first stage", "last stage", "middle stage"
    stage: int
    ranks: int  # how many ranks are of this type
    estimate: Estimate
    cpu_bytes: int  # pinned CPU RAM of one such rank (offloaded states)
    cpu_items: tuple[MemoryItem, ...]
    load_cpu_bytes: int  # CPU RAM one such rank needs while loading the model
    nvme_bytes: int
    nccl_bytes: int


@dataclass(frozen=True, kw_only=True)
class RankReport:
    parallelism: Parallelism
    ranks: tuple[RankEstimate, ...]  # the most loaded (highest device total) first
    cpu_per_node_bytes: int  # max(loading peak, pinned offload) on the most loaded node
    cpu_pinned_per_node_bytes: int
    cpu_load_per_node_bytes: int
    nvme_per_node_bytes: int
    assumptions: tuple[str, ...] = ()

    @property
    def most_loaded(self) -> RankEstimate:
        return self.ranks[0]

    def role(self, role: str) -> RankEstimate:
        for r in self.ranks:
            if r.role == role:
                return r
        raise KeyError(role)

    def as_estimate(self) -> Estimate:
        """The most loaded rank's estimate, carrying every rank type and the CPU/NVMe figures in
        ``extra`` (``per_rank``, ``cpu_per_node_bytes``, ...) and the layout in ``assumptions``:
        what the CLI renders and puts in ``--json`` for a sharded or offloaded job."""
        top = self.most_loaded.estimate
        info = self.to_dict()
        extra = {**top.extra, **{k: v for k, v in info.items() if k != "assumptions"}}
        seen = set(top.assumptions)
        assumptions = top.assumptions + tuple(a for a in self.assumptions if a not in seen)
        return replace(top, extra=extra, assumptions=assumptions)

    def summary_lines(self) -> list[str]:
        """One line per rank type and one for CPU RAM, e.g. for a terminal."""
        out = []
        for r in self.ranks:
            e = r.estimate
            out.append(
                f"{r.role} (stage {r.stage}, {r.ranks} ranks): {fmt_both(e.device_total_bytes)} on the GPU "
                f"(allocated {fmt_both(e.peak_allocated_bytes)} at {e.peak_phase.value}; model states "
                f"{fmt_both(e.model_state_bytes)})"
            )
        out.append(
            f"CPU RAM per node: {fmt_both(self.cpu_per_node_bytes)} (pinned offload "
            f"{fmt_both(self.cpu_pinned_per_node_bytes)}, "
            f"model loading {fmt_both(self.cpu_load_per_node_bytes)})"
        )
        if self.nvme_per_node_bytes:
            out.append(f"NVMe per node: {fmt_both(self.nvme_per_node_bytes)}")
        return out

    def to_dict(self) -> dict[str, object]:
        """JSON-ready per-rank and per-node figures (the CLI's ``--json`` adds these)."""
        par = self.parallelism
        par_dict: dict[str, object] = {}
        for name in par.__dataclass_fields__:
            value = getattr(par, name)
            par_dict[name] = value.value if isinstance(value, Enum) else value
        return {
            "parallelism": par_dict,
            "layout": par.describe(),
            "ranks": [
                {
                    "role": r.role,
                    "stage": r.stage,
                    "ranks": r.ranks,
                    "peak_phase": r.estimate.peak_phase.value,
                    "peak_allocated_bytes": r.estimate.peak_allocated_bytes,
                    "peak_reserved_bytes": r.estimate.peak_reserved_bytes,
                    "device_total_bytes": r.estimate.device_total_bytes,
                    "model_state_bytes": r.estimate.model_state_bytes,
                    "breakdown": {c.value: b for c, b in r.estimate.by_category().items()},
                    "phases": {p.phase.value: p.bytes for p in r.estimate.phases},
                    "items": [
                        {"path": i.path, "category": i.category.value, "bytes": i.bytes}
                        for i in r.estimate.items
                    ],
                    "cpu_pinned_bytes": r.cpu_bytes,
                    "cpu_load_bytes": r.load_cpu_bytes,
                    "nvme_bytes": r.nvme_bytes,
                    "nccl_bytes": r.nccl_bytes,
                }
                for r in self.ranks
            ],
            "cpu_per_node_bytes": self.cpu_per_node_bytes,
            "cpu_pinned_per_node_bytes": self.cpu_pinned_per_node_bytes,
            "cpu_load_per_node_bytes": self.cpu_load_per_node_bytes,
            "nvme_per_node_bytes": self.nvme_per_node_bytes,
            "assumptions": list(self.assumptions),
        }


def _stages(par: Parallelism) -> list[tuple[int, str]]:
    if par.pp == 1:
        return [(0, "all ranks")]
    out = [(0, "first stage"), (par.pp - 1, "last stage")]
    if par.pp > 2:
        out.append((1, "middle stage"))
    return out


def _stage_ranks(par: Parallelism, stage: int) -> int:
    per_stage = par.gpus // par.pp
    if par.pp > 2 and stage == 1:
        return per_stage * (par.pp - 2)
    return per_stage


def estimate_ranks(
    spec: ModelSpec, setup: TrainingSetup, par: Parallelism, *, overheads: Overheads | None = None
) -> RankReport:
    """Per-rank memory of ``spec`` trained under ``setup`` with layout ``par``."""
    validate_for(spec, par)
    if par.cp > 1 and setup.attention is AttentionKernel.EAGER:
        raise InputError(
            "attention='eager' with cp>1: context parallelism is modelled as ring attention "
            "over a flash/SDPA kernel; use --attention sdpa or flash"
        )
    if setup.seq_len % par.cp:
        raise InputError(f"cp={par.cp} does not divide seq={setup.seq_len}: each rank takes an equal chunk")
    ov = overheads or Overheads()
    nccl = sharding.communicators(par) * sharding.nccl_communicator_bytes()
    ranks = [_rank(spec, setup, par, stage, role, ov, nccl) for stage, role in _stages(par)]
    ranks.sort(key=lambda r: r.estimate.device_total_bytes, reverse=True)
    per_node = par.ranks_per_node
    pinned = max(r.cpu_bytes for r in ranks) * per_node
    load = max(r.load_cpu_bytes for r in ranks) * per_node
    nvme = max(r.nvme_bytes for r in ranks) * per_node
    return RankReport(
        parallelism=par,
        ranks=tuple(ranks),
        cpu_per_node_bytes=max(pinned, load),
        cpu_pinned_per_node_bytes=pinned,
        cpu_load_per_node_bytes=load,
        nvme_per_node_bytes=nvme,
        assumptions=_assumptions(par, ov, nccl),
    )


def _assumptions(par: Parallelism, ov: Overheads, nccl: int) -> tuple[str, ...]:
    out = [
        f"layout: {par.describe()}",
        "shards use ceiling division: the most loaded rank is shown",
        f"NCCL: {sharding.communicators(par)} communicator(s) x "
        f"{sharding.nccl_communicator_bytes() // 2**20} MiB "
        f"receive buffers ({sharding.NCCL_CHANNELS} channels x {sharding.NCCL_CONNECTIONS} connections x "
        "Simple+LL128+LL) outside PyTorch's allocator; set NCCL_BUFFSIZE/NCCL_MAX_NCHANNELS to change",
        f"allocator fragmentation {ov.fragmentation:.0%} of the per-step churn; CUDA context "
        f"{ov.context_bytes // 2**20} MiB",
        "CPU RAM per node: max(model loading on every local rank, pinned offload buffers)",
    ]
    if par.tp > 1:
        out.append(
            "tensor parallel: Megatron column/row split; LN inputs, first-Linear inputs and dropout masks "
            + ("split by sequence parallelism" if par.sequence_parallel else "replicated (no SP)")
        )
    if par.pp > 1:
        out.append(
            f"pipeline: {par.pp_schedule.value}; stage s keeps min(pp - s, grad_accum) micro-batches in "
            "flight (grad_accum = micro-batches per step)"
        )
    if par.cp > 1:
        out.append("context parallel: ring attention with double-buffered K/V chunks, fp32 dK/dV in backward")
    return tuple(out)


def _is_replicated(par: Parallelism) -> bool:
    """Every rank runs the single-GPU job on its own micro-batch (one GPU, or plain DDP)."""
    return par.tp == par.pp == par.cp == par.ep == 1 and par.engine in ("none", "ddp")


def _replicated_rank(
    spec: ModelSpec, setup: TrainingSetup, par: Parallelism, ov: Overheads, nccl: int
) -> RankEstimate:
    """The single-GPU estimate (:func:`peakmem.estimate.estimate_training`), plus DDP's reducer
    buckets (a resident gradient copy unless ``gradient_as_bucket_view``) and NCCL buffers."""
    base = estimate_training(spec, setup, overheads=ov)
    sp = mp.stage_params(spec, par, 0)
    states = sharding.rank_states(spec, setup, par, sp)
    added = tuple(states.resident)
    extra_bytes = sum(i.bytes for i in added)
    phases = tuple(replace(p, bytes=p.bytes + extra_bytes, items=p.items + added) for p in base.phases)
    peak = max(phases, key=lambda p: p.bytes)
    reserved = base.peak_reserved_bytes
    if extra_bytes:
        reserved = allocator.reserved_bytes(
            resident=base.peak_reserved_bytes + extra_bytes, resident_rounding=0, churn=0, fragmentation=0.0
        )
    est = replace(
        base,
        items=peak.items,
        phases=phases,
        peak_phase=peak.phase,
        peak_allocated_bytes=peak.bytes,
        peak_reserved_bytes=reserved,
        device_total_bytes=base.device_total_bytes - base.peak_reserved_bytes + reserved + nccl,
        assumptions=base.assumptions + states.notes,
        extra={
            **base.extra,
            "role": "all ranks",
            "stage": 0,
            "local_params": sp.numel,
            "nccl_bytes": nccl,
            "cpu_pinned_bytes": 0,
        },
    )
    return RankEstimate(
        role="all ranks",
        stage=0,
        ranks=par.gpus,
        estimate=est,
        cpu_bytes=0,
        cpu_items=(),
        load_cpu_bytes=sharding.load_bytes_per_rank(spec, setup, par, sp),
        nvme_bytes=0,
        nccl_bytes=nccl,
    )


def _rank(
    spec: ModelSpec, setup: TrainingSetup, par: Parallelism, stage: int, role: str, ov: Overheads, nccl: int
) -> RankEstimate:
    if _is_replicated(par):
        return _replicated_rank(spec, setup, par, ov, nccl)
    sp = mp.stage_params(spec, par, stage)
    states = sharding.rank_states(spec, setup, par, sp)
    first, last = stage == 0, stage == par.pp - 1
    local = replace(setup, seq_len=setup.seq_len // par.cp)
    sh = act.shapes(spec, local)
    c = sh.c

    groups: list[GroupCost] = []
    layer_items: list[tuple[int, tuple[MemoryItem, ...]]] = []
    max_fwd = 0
    for (count, layer), grads in zip(mp.stage_groups(spec, par.pp, stage), states.layer_grads, strict=True):
        ring = mp.ring_kv_chunk_bytes(layer, sh.tokens, c, par)
        dispatch = mp.ep_dispatch_bytes(layer, sh.tokens, spec.hidden_size, c, par)
        la = act.checkpointed(
            mp.tp_layer_activations(act.layer_activations(spec, layer, sh), par, ring, dispatch),
            setup.checkpointing,
        )
        groups.append(
            GroupCost(
                count=count, saved=la.saved_bytes, grads=grads, backward_transient=la.backward_transient
            )
        )
        layer_items.append((count, la.saved))
        max_fwd = max(max_fwd, la.forward_transient)
    embed_items = act.embedding_items(spec, sh) if first else ()
    hidden = mp.cdiv(sh.tokens * spec.hidden_size * c, par.tp if par.sequence_parallel else 1)
    if last:
        head = mp.tp_head_activations(head_activations(spec, sh, _head_numel(spec)), par)
        head_items, head_fwd, head_bwd, logits_grad = (
            head.saved,
            head.forward_transient,
            head.backward_transient,
            head.logits_grad,
        )
    else:
        head_items, head_fwd, head_bwd, logits_grad = (), 0, hidden, 0  # the received output gradient
    p2p = hidden * ((0 if first else 1) + (0 if last else 1))  # pipeline send/receive buffers

    in_flight = mp.in_flight_microbatches(par, stage, setup.grad_accum)
    layers_saved = sum(g.count * g.saved for g in groups)
    embed_saved = sum(i.bytes for i in embed_items)
    head_saved = sum(i.bytes for i in head_items)
    one_mb = layers_saved + embed_saved + head_saved
    extra_mb = int(one_mb * (in_flight - 1))
    inflight_items = (
        [
            MemoryItem(
                path=f"activations of {in_flight - 1:g} more micro-batches in flight (pipeline)",
                category=Category.ACTIVATIONS,
                bytes=extra_mb,
                source="Narayanan et al. 2021 §2.2: 1F1B warm-up micro-batches",
            )
        ]
        if extra_mb
        else []
    )

    rows = states.rows
    buffers = buffer_bytes(spec, setup)
    persistent_items = state_items(rows, buffers, include_grads=True) + list(states.resident)
    persistent = sum(i.bytes for i in persistent_items)
    accumulating = setup.grad_accum > 1

    # --- forward
    acts = list(embed_items)
    start = 0
    for count, per_layer in layer_items:
        acts += scaled_items(per_layer, count, f"layers[{start}:{start + count}]")
        start += count
    acts += list(head_items)
    fwd_extra = max(head_fwd, max_fwd - head_saved) + p2p
    fwd_items = (
        persistent_items
        + (list(states.grads_accumulated) if accumulating else [])
        + list(states.gathered_forward)
        + inflight_items
        + acts
        + [
            MemoryItem(
                path="forward temporaries (logits / attention scores / p2p buffers)",
                category=Category.TEMPORARIES,
                bytes=fwd_extra,
                source="see formulas/loss.py, activations.py",
            )
        ]
    )
    forward = _phase(Phase.FORWARD, fwd_items)

    # --- backward
    root = states.root_grads
    head_grads = root * sp.head_numel // sp.root_numel if sp.root_numel else 0
    start_extra = max(head_bwd, logits_grad + head_grads)
    bp = backward_peak(
        tuple(reversed(groups)),
        base_saved=embed_saved,
        head_saved=head_saved,
        start_extra=start_extra,
        start_grads=head_grads,
        tail_extra=0,
        tail_grads=root - head_grads,
        grads_resident=accumulating,
    )
    grads_resident = list(states.grads_accumulated) if accumulating else []
    bwd_fixed = (
        persistent_items + grads_resident + list(states.grads_backward) + list(states.gathered_backward)
    )
    bwd_fixed += inflight_items
    bwd_items = [
        *bwd_fixed,
        MemoryItem(
            path=f"activations left ({bp.layers_done} layers' backward done)",
            category=Category.ACTIVATIONS,
            bytes=bp.activations_left,
            source="saved tensors not yet freed by backward",
        ),
        MemoryItem(
            path="gradients written so far",
            category=Category.GRADIENTS,
            bytes=bp.grads_so_far,
            source="AccumulateGrad / engine gradient shards as backward reaches each layer",
        ),
        MemoryItem(
            path="backward temporaries (gradients in flight)",
            category=Category.TEMPORARIES,
            bytes=bp.transient,
            source="CE gradients at the start; a layer's activation gradients later",
        ),
    ]
    backward = _phase(Phase.BACKWARD, bwd_items)

    # --- optimizer step
    opt_items = persistent_items + list(states.step_grads) + list(states.step)
    optimizer = _phase(Phase.OPTIMIZER, opt_items)

    phases = (forward, backward, optimizer)
    peak = max(phases, key=lambda p: p.bytes)
    reserved = allocator.reserved_bytes(
        resident=persistent,
        resident_rounding=0,
        churn=peak.bytes - persistent,
        fragmentation=ov.fragmentation,
    )
    device_total = reserved + ov.context_bytes + ov.cublas_workspace_bytes + nccl
    est = Estimate(
        method=METHOD,
        job="train",
        model_name=spec.name,
        params=spec.params,
        trainable_params=trainable_params(spec, setup),
        per_param=rows,
        items=peak.items,
        phases=phases,
        peak_phase=peak.phase,
        peak_allocated_bytes=peak.bytes,
        peak_reserved_bytes=reserved,
        device_total_bytes=device_total,
        assumptions=(
            f"{role} (pipeline stage {stage}): {sp.layers} layers, {sp.numel:,} local parameters",
            *states.notes,
        ),
        setup=setup_dict(setup),
        extra={
            "role": role,
            "stage": stage,
            "local_params": sp.numel,
            "in_flight_microbatches": in_flight,
            "nccl_bytes": nccl,
            "context_bytes": ov.context_bytes,
            "cublas_workspace_bytes": ov.cublas_workspace_bytes,
            "cpu_pinned_bytes": sum(i.bytes for i in states.cpu),
        },
    )
    return RankEstimate(
        role=role,
        stage=stage,
        ranks=_stage_ranks(par, stage),
        estimate=est,
        cpu_bytes=sum(i.bytes for i in states.cpu),
        cpu_items=states.cpu,
        load_cpu_bytes=sharding.load_bytes_per_rank(spec, setup, par, sp),
        nvme_bytes=states.nvme_bytes,
        nccl_bytes=nccl,
    )


def _phase(phase: Phase, items: list[MemoryItem]) -> PhasePeak:
    kept = tuple(i for i in items if i.bytes)
    return PhasePeak(phase=phase, bytes=sum(i.bytes for i in kept), items=kept)


def _head_numel(spec: ModelSpec) -> int:
    for t in spec.outer:
        if t.component in ("head", "classifier") and t.kind == "linear_weight":
            return t.numel
    return spec.vocab_size * spec.hidden_size


__all__ = ["RankEstimate", "RankReport", "estimate_ranks"]
