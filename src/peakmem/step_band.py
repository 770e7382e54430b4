"""The band of one rank's training step (formulas/band.py terms), for :mod:`peakmem.estimate`: the CUDA
context, fragmentation in the peak phase, segments cut by the other phases, NCCL buffers, and the
alternatives that move the peak (a fused optimizer step, the order of a compiled chunked loss's backward)."""

from __future__ import annotations

from peakmem.breakdown import Band, BandTerm, Category, PhasePeak
from peakmem.formulas import band as _band
from peakmem.formulas import lowbit_optim as _lowbit
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.timeline import BackwardPeak
from peakmem.training import LossImpl, OptimizerImpl, TrainingSetup

MEMO_MAX = 1024  # the context terms kept (one per Overheads)

_TRANSIENT = (Category.ACTIVATIONS, Category.TEMPORARIES)
_CONTEXT_TERMS: dict[Overheads, BandTerm] = {}  # the context term depends on the Overheads only


def transient_bytes(phase: PhasePeak) -> int:
    return sum([i.bytes for i in phase.items if i.category in _TRANSIENT])


def fused_step_delta(
    setup: TrainingSetup, forward: PhasePeak, backward: PhasePeak, optimizer: PhasePeak
) -> int:
    """How much lower the peak is when the step runs as one fused kernel rather than the foreach
    implementation estimated (<= 0): its temporaries gone, the peak is the larger of the rest."""
    if setup.optimizer_impl is not OptimizerImpl.FOREACH:
        return 0
    temps = sum([i.bytes for i in optimizer.items if i.category is Category.TEMPORARIES])
    return min(0, max(forward.bytes, backward.bytes, optimizer.bytes - temps) - optimizer.bytes)


def loss_order_deltas(
    setup: TrainingSetup, chunk_grad: int, bp: BackwardPeak, phases: tuple[PhasePeak, ...], peak: PhasePeak
) -> tuple[int, int]:
    """(low, high) change of the peak from the order of a compiled chunked loss's backward
    (``band.loss_backward_term``): each chunk's gradient in its saved chunk's place (low), or all
    ``CE_CHUNKS`` gradients alive at once (high, bounded with the backward phase's own peak)."""
    if setup.loss is not LossImpl.CHUNKED_COMPILED or not chunk_grad:
        return 0, 0
    forward, backward, optimizer = phases
    high = max(0, backward.bytes + (_lowbit.CE_CHUNKS - 1) * chunk_grad - peak.bytes)
    at_start = peak is backward and bp.at_start
    low = max(-chunk_grad, max(forward.bytes, optimizer.bytes) - peak.bytes) if at_start else 0
    return low, high


def training_band(
    *,
    allocated: int,
    reserved: int,
    device_total: int,
    churn: int,
    other_churn: int,
    ov: Overheads,
    communicators: int = 0,
    nccl_bytes: int = 0,
    fused_step_delta: int = 0,
    loss_order: tuple[int, int] = (0, 0),
    replayed: int = 0,
    engine_high: int = 0,
    published: BandTerm | None = None,
) -> Band:
    """The band of one rank's training step (formulas/band.py): the CUDA context, fragmentation in the
    peak phase, segments cut by the other phases, and NCCL buffers when the rank communicates.
    ``replayed``: what the allocator replay added to the closed form (formulas/step_sequence.py): slack the
    fragmentation term's low end removes, and segments of other phases the term for them no longer spans.
    ``engine_high``: what an older engine release keeps beyond the likely value (DeepSpeed ZeRO-3 < 0.16).
    ``published``: the published fitting set's residual for the kind of job (formulas/band.py
    ``MEASURED_RESIDUALS``)."""
    context = _CONTEXT_TERMS.get(ov)
    if context is None:
        if len(_CONTEXT_TERMS) >= MEMO_MAX:
            _CONTEXT_TERMS.clear()
        context = _CONTEXT_TERMS[ov] = _band.context_term(ov.context_bytes, assumed=ov.context_assumed,
                                                          profile=ov.profile)  # fmt: skip
    terms = [
        _band.residual_term(allocated),
        context,
        _band.fragmentation_term(churn=churn, fragmentation=ov.fraction, profile=ov.profile,
                                 expandable=ov.expandable_segments, replayed=replayed),
        _band.phase_segments_term(other_churn=other_churn, fragmentation=ov.fraction,
                                  expandable=ov.expandable_segments, replayed=replayed),
    ]  # fmt: skip
    if communicators:
        terms.append(_band.nccl_term(communicators=communicators, likely_bytes=nccl_bytes))
    if engine_high:
        terms.append(_band.zero3_version_term(engine_high))
    if fused_step_delta:
        terms.append(_band.optimizer_impl_term(fused_step_delta))
    if loss_order != (0, 0):
        terms.append(_band.loss_backward_term(low_delta=loss_order[0], high_delta=loss_order[1]))
    if published is not None:
        terms.append(published)
    return _band.build_band(
        allocated=allocated, reserved=reserved, device_total=device_total, terms=tuple(terms)
    )
