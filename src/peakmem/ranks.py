"""Per-rank memory of a parallel training job: one :class:`~peakmem.breakdown.Estimate` per distinct
rank type (the most loaded first; first/last pipeline stage), plus CPU RAM per node.

Each rank type is one call of the one step timeline (:class:`peakmem.estimate.TrainingEstimator`)
on the rank's share: micro-batch x (seq / cp) tokens, heads and MLP width / tp
(:mod:`.formulas.model_parallel`), the stage's layers, the engine's partition of what the technique
left (:mod:`.formulas.sharding`), and the micro-batches a pipeline stage keeps in flight. This module
adds what is not one GPU's: which rank types exist, how many of each, and CPU RAM per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

from peakmem.breakdown import Estimate, MemoryItem
from peakmem.errors import InputError
from peakmem.estimate import TrainingEstimator
from peakmem.formulas import long_context, state_terms
from peakmem.formulas import nccl as _nccl
from peakmem.formulas.overhead import Overheads
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import Parallelism, validate_for
from peakmem.step_fsdp import NoGradForward, no_grad_forward
from peakmem.training import AttentionKernel, TrainingSetup
from peakmem.units import fmt_both


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
    # a no-grad forward of the same model on this rank (a post-training job's reference or teacher pass)
    no_grad_forward: NoGradForward = field(default_factory=NoGradForward)


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
                    "device_total_band": r.estimate.band.device_total.json() if r.estimate.band else None,
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
    spec: ModelSpec,
    setup: TrainingSetup,
    par: Parallelism,
    *,
    overheads: Overheads | None = None,
    estimator: TrainingEstimator | None = None,
    costs: CostLookup | None = None,
) -> RankReport:
    """Per-rank memory of ``spec`` trained under ``setup`` with layout ``par`` (``estimator``: one a
    search keeps for ``spec``, whose memo then serves every layout it asks about; else one is made with
    ``costs``, a derived spec's block-cost lookup)."""
    validate_for(spec, par)
    long_context.check_ulysses(spec, setup, par)
    if par.cp > 1 and setup.attention is AttentionKernel.EAGER:
        raise InputError(
            "attention='eager' with cp>1: context parallelism is modelled as ring attention "
            "over a flash/SDPA kernel; use --attention sdpa or flash"
        )
    if setup.seq_len % par.cp:
        raise InputError(f"cp={par.cp} does not divide seq={setup.seq_len}: each rank takes an equal chunk")
    est = estimator or TrainingEstimator(spec, overheads, costs=costs)
    ov = est.overheads
    nccl = _nccl.communicators(par) * _nccl.nccl_communicator_bytes()
    ranks = [_rank(est, setup, par, stage, role, nccl) for stage, role in _stages(par)]
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
        f"NCCL: {_nccl.communicators(par)} communicator(s) x "
        f"{_nccl.nccl_communicator_bytes() // 2**20} MiB "
        f"receive buffers ({_nccl.NCCL_CHANNELS} channels x {_nccl.NCCL_CONNECTIONS} connections x "
        "Simple+LL128+LL) outside PyTorch's allocator; set NCCL_BUFFSIZE/NCCL_MAX_NCHANNELS to change",
        f"allocator fragmentation {ov.fraction:.0%} of the per-step churn; CUDA context "
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


def _rank(
    est: TrainingEstimator, setup: TrainingSetup, par: Parallelism, stage: int, role: str, nccl: int
) -> RankEstimate:
    """One rank type: the one step timeline (:meth:`TrainingEstimator.rank`) on the rank's share."""
    estimate, states, sp = est.rank(setup, par, stage, role)
    return RankEstimate(
        role=role, stage=stage, ranks=_stage_ranks(par, stage), estimate=estimate,
        cpu_bytes=sum(i.bytes for i in states.cpu), cpu_items=states.cpu,
        load_cpu_bytes=state_terms.load_bytes_per_rank(est.spec, setup, par, sp),
        nvme_bytes=states.nvme_bytes, nccl_bytes=nccl, no_grad_forward=no_grad_forward(states),
    )  # fmt: skip


__all__ = ["RankEstimate", "RankReport", "estimate_ranks"]
