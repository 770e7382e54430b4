"""What one rank's training step is made of, for :mod:`peakmem.estimate`: its shape-independent part
(:class:`Static`, memoised by a :class:`~peakmem.estimate.TrainingEstimator`), its activations at the
setup's shapes (:class:`Parts`), the items they show at each instant, and the step written tensor by
tensor for the caching-allocator replay that gives the reserved bytes (formulas/step_sequence.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from peakmem.breakdown import Category, MemoryItem, PerParamRow, PhasePeak
from peakmem.formulas import activations as act
from peakmem.formulas import allocator, sharding
from peakmem.formulas import lowbit_optim as _lowbit
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import step_sequence as _seq
from peakmem.formulas.optimizer import PER_PARAM_TEMPORARIES
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.technique import Technique
from peakmem.formulas.timeline import BackwardPeak, GroupCost
from peakmem.model import ModelSpec, Tensor
from peakmem.parallel import Parallelism
from peakmem.training import Checkpointing, OptimizerName, TrainingSetup


@dataclass(frozen=True, kw_only=True)
class Static:
    """What a rank's step needs that depends on the spec, the setup and the layout but not on the shapes."""

    tech: Technique
    states: sharding.RankStates
    sp: mp.StageParams
    single: bool  # one GPU (the estimate without per-rank figures)
    groups: tuple[tuple[int, int], ...]  # (group index of tech.spec, layers on this stage) per stage group
    # per stage group: whether setup.checkpointing wraps its layers (estimate._checkpoint_runs cuts the
    # spec's groups into runs under full checkpointing of every N-th layer)
    wrapped: tuple[bool, ...]
    written: tuple[int, ...]  # per stage group: gradient bytes one layer writes (before the TP split)
    kept: tuple[int, ...]  # per stage group: of them, bytes kept until the step (TP-local)
    outer: tuple[int, int, int, int, int]  # written start, kept start, written end, kept end, tied hold
    table: tuple[PerParamRow, ...]  # the rank's bytes-per-parameter table
    persistent: int  # alive through the whole step: weights, buffers, master weights, states, engine buffers
    states_bytes: int  # optimizer states on the GPU (created inside step 1's optimizer step)
    resident_items: tuple[MemoryItem, ...]  # alive in forward and backward (persistent + kept gradients)
    resident_bytes: int
    optimizer_phase: PhasePeak
    resident_rounding: int
    weight_cache: tuple[MemoryItem, ...]
    state_extra: dict[str, int]
    assumptions: tuple[str, ...]
    notes: dict[Overheads, tuple[str, ...]] = field(default_factory=dict, compare=False)
    setup_json: dict[str, object]
    setup_json_nested: tuple[str, ...]
    in_backward_step: int = 0  # optimizer-in-backward: one tensor's step temporaries, inside backward


def checkpointed_layer(
    la: act.LayerActivations,
    spec: ModelSpec,
    sh: act.Shapes,
    par: Parallelism,
    mode: Checkpointing,
    *,
    eager_mlp: bool,
) -> act.LayerActivations:
    """A layer (after the model-parallel split) under ``mode`` (not op-level SAC): what stays saved
    (:func:`peakmem.formulas.activations.checkpointed`), under full checkpointing with the forward
    instants of an eager gated MLP (``full_ac_forward``) and, under PyTorch TP, the end of the
    recomputation (:func:`peakmem.formulas.model_parallel.dtensor_recompute_tail`)."""
    out = sh.tokens * spec.hidden_size * sh.c  # a Linear's output over the whole sequence
    sp_split = par.tp if par.sequence_parallel else 1
    hidden = mp.cdiv(out, sp_split)  # the rank's hidden states (its sequence shard under SP)
    residual = mp.cdiv(sh.tokens * spec.hidden_size * sh.r, sp_split)
    copy = mp.dtensor_rowwise_copy(par, hidden, out)
    # alive through the MLP: the residual stream, and under SP the norm output's shard
    held = residual + (hidden if par.sequence_parallel else 0)
    la = act.checkpointed(la, mode, eager_mlp=eager_mlp, out=out, copy=copy, held=held)
    if mode is not Checkpointing.FULL or par.is_single_gpu:
        return la
    # in the recomputation the residual is also the second norm's saved input where that norm keeps it
    # as it is (LayerNorm; an RMSNorm whose fp32 upcast is a no-op): counted with the recomputed tensors
    residual_saved = spec.norm != "rmsnorm" or sh.r == 4
    tail_held = held - (residual if residual_saved else 0) if eager_mlp else 0
    return mp.dtensor_recompute_tail(la, par, hidden, out, residual, tail_held)


def scaled_items(items: tuple[MemoryItem, ...], count: int, prefix: str) -> list[MemoryItem]:
    if not count:
        return []
    return [
        MemoryItem(f"{prefix}.{i.path}", i.category, i.bytes * count, i.source, i.key)  # by position: hot
        for i in items
        if i.bytes
    ]


# --- the step's activations, at the setup's shapes ---------------------------------------------------
@dataclass(kw_only=True, slots=True)
class Parts:
    """Per-step activations of the rank (per estimate: slotted, not frozen)."""

    layer_items: tuple[tuple[int, tuple[MemoryItem, ...]], ...]  # (count, per-layer saved) per group
    groups: tuple[GroupCost, ...]
    embed_items: tuple[MemoryItem, ...]
    head_items: tuple[MemoryItem, ...]
    # activation offloading: one micro-batch's saved layer tensors, as checkpointing (and float8, LoRA,
    # the model-parallel split) leaves them, in pinned CPU RAM (torchtune OffloadActivations)
    offloaded: int = 0


# --- reserved: the step replayed through the caching-allocator model -------------------------------
REPLAY_NOTE = (
    "reserved: two steps of these tensors replayed through the CUDA caching-allocator model "
    "(formulas/step_sequence.py: segments one phase cuts that another cannot reuse, optimizer states "
    "created in step 1), never below the fragmentation fraction above; give --fragmentation to use the "
    "fraction alone"
)


def replayable(st: Static, setup: TrainingSetup, par: Parallelism, ov: Overheads) -> bool:
    """Where the step can be written tensor by tensor: one GPU, full fine-tuning with a torch optimizer
    whose states are shaped like the parameters, no step tricks, and no fraction or expandable
    segments asked for (those keep the closed form of formulas/allocator.py). Not replayed, closed form:
    multi-GPU layouts (sharded or gathered buffers the sequence does not describe), LoRA/QLoRA (frozen
    base, adapter tensors), 8-bit/paged/4-bit optimizers and optimizer-in-backward, activation offloading,
    Adafactor (factored states, not shaped like the parameters)."""
    return (
        st.single and par.is_single_gpu and not st.tech.adapter and ov.replay_reserved
        and not ov.expandable_segments and not _lowbit.handles(setup) and not _lowbit.in_backward(setup)
        and not setup.activation_offload and setup.optimizer is not OptimizerName.ADAFACTOR
    )  # fmt: skip


def pieces(items: Iterable[MemoryItem]) -> tuple[int, ...]:
    """The tensor sizes of ``items``: an item's ``sizes`` where they add up to its bytes, else its bytes
    split into its ``tensors`` equal parts (an item whose bytes a technique changed: LoRA's frozen norms)."""
    out: list[int] = []
    for i in items:
        if i.sizes and sum(i.sizes) == i.bytes:
            out += i.sizes
        elif i.bytes > 0:
            n = max(1, i.tensors)
            out += [i.bytes // n] * n
    return tuple(out)


def split(nbytes: int, unit: int) -> tuple[int, ...]:
    """``nbytes`` as tensors of about ``unit`` bytes (a transient known by its sum only)."""
    if nbytes <= 0:
        return ()
    n = max(1, -(-nbytes // max(1, unit)))
    return (nbytes // n,) * n


# Replaying costs time in proportion to the layers, and past a few identical layers each further one
# cuts the same segments. A model of more than EXACT_LAYERS layers is replayed with its groups cut to
# REPLAY_LAYERS and to twice that, and the reserved bytes extrapolated linearly to the real counts.
# benchmarks/reserved_vs_replay.py --exact: on the catalog's models of more than 48 layers (llama-3.1-70b,
# qwen2.5-72b, opt-66b, falcon-40b, gemma-3-27b, ...) the extrapolation moves reserved by at most 0.2 %;
# on 24-36-layer models with large vocabularies it can move it by 5 % (the logits' blocks make the
# per-layer increments uneven), so those are replayed whole.
REPLAY_LAYERS = 8
EXACT_LAYERS = 48


def replayed_reserved(
    st: Static, setup: TrainingSetup, par: Parallelism, ov: Overheads, parts: Parts,
    head_fwd: int, head_bwd: int, logits_grad: int, *, exact: bool = False,
) -> int | None:  # fmt: skip
    """``max_memory_reserved`` of two steps of this estimate's tensors (formulas/step_sequence.py);
    None where :func:`replayable` says the closed form answers. ``exact``: replay every layer."""
    if not replayable(st, setup, par, ov):
        return None

    def replay(counts: tuple[int, ...]) -> int:
        step = step_tensors(st, setup, parts, head_fwd, head_bwd, logits_grad, counts)
        return _seq.replay_steps(step).reserved

    counts = tuple(c for _, c in st.groups)
    few = tuple(min(c, REPLAY_LAYERS) for c in counts)
    more = tuple(min(c, 2 * REPLAY_LAYERS) for c in counts)
    if exact or sum(counts) <= EXACT_LAYERS or more == counts:
        return replay(counts)
    r1, r2 = replay(few), replay(more)
    extrapolated = r2 + (r2 - r1) * (sum(counts) - sum(more)) // (sum(more) - sum(few))
    return -(-extrapolated // allocator.K_ROUND_LARGE) * allocator.K_ROUND_LARGE


def step_tensors(
    st: Static, setup: TrainingSetup, parts: Parts, head_fwd: int, head_bwd: int, logits_grad: int,
    counts: tuple[int, ...],
) -> _seq.StepTensors:  # fmt: skip
    """The step tensor by tensor, with ``counts`` layers in each of the stage's groups."""
    tech = st.tech
    spec = tech.spec
    outer_first = [t for t in spec.outer if t.component in ("embeddings", "positions")]
    outer_last = [t for t in spec.outer if t.component not in ("embeddings", "positions")]

    def sizes(tensors: Iterable[Tensor], count: int = 1) -> list[int]:  # elements of each tensor
        return [t.numel // t.copies for t in tensors for _ in range(t.copies * count)]

    first, last = sizes(outer_first), sizes(outer_last)
    layer_numel = [sizes(spec.groups[i].layer.tensors) for i, _ in st.groups]
    numel = first + [n for count, per in zip(counts, layer_numel, strict=True) for n in per * count] + last
    weight, grad, master = tech.weight.nbytes, tech.grad.nbytes, tech.master
    states = [r for r in tech.state_rows if r.params]
    temps: list[int] = []
    for item in st.states.step:
        if item.key in PER_PARAM_TEMPORARIES:  # one per parameter, in proportion to its elements
            temps += [item.bytes * n // tech.trainable for n in numel]
        else:
            temps += pieces((item,))
    layers = []
    for g, la_items, per, count in zip(parts.groups, parts.layer_items, layer_numel, counts, strict=True):
        saved = pieces(la_items[1])
        unit = max(saved, default=0)
        in_flight = g.grads_in_flight or 0
        layers.append(_seq.LayerTensors(
            count=count, saved=saved, forward_extra=split(g.forward_transient, unit),
            backward_extra=split(g.recompute, unit)
            + split(g.backward_transient + g.freed - in_flight, unit),
            grads=tuple(grad(n) for n in reversed(per)),
        ))  # fmt: skip
    backward_order = last[::-1] + [
        n for count, per in zip(counts[::-1], layer_numel[::-1], strict=True) for n in per[::-1] * count
    ]
    backward_order += first[::-1]  # fmt: skip
    tied = st.outer[4]
    return _seq.StepTensors(
        weights=(*(weight(n) for n in numel), tech.buffers),
        masters=tuple(master.nbytes(n) for n in numel) if master else (),
        states=tuple(r.bytes * n // r.params for n in numel for r in states),
        embed_saved=pieces(parts.embed_items), layers=tuple(layers),
        head_saved=pieces(i for i in parts.head_items if not i.key.startswith("loss.")),
        head_extra=tuple(i.bytes for i in parts.head_items if i.key == "head.softcap") * 2,
        loss_saved=pieces(i for i in parts.head_items if i.key.startswith("loss.")),
        # the logits (the size of their gradient) and their fp32 copy
        loss_extra=(logits_grad, head_fwd - logits_grad) if 0 < logits_grad < head_fwd else (head_fwd,),
        forward_held=pieces(st.weight_cache),
        loss_grads=(*split(head_bwd, head_bwd // 2), *((logits_grad,) if logits_grad else ())),
        head_grads=tuple(grad(n) for n in last[::-1]), end_grads=tuple(grad(n) for n in first[::-1]),
        tied_hold=tied,
        master_grads=tuple(master.nbytes(n) for n in backward_order) if master else (),
        step_temporaries=tuple(temps), micro_batches=setup.grad_accum,
        grads_resident=not setup.grads_set_to_none,
    )  # fmt: skip


# --- the items alive at an instant ----------------------------------------------------------------
def activation_items(parts: Parts, layers_left: int | None, current_freed: int = 0) -> list[MemoryItem]:
    """Saved activations; ``layers_left`` keeps only the first N layers and drops the head's
    (backward in progress; the top kept layer is the one running, ``current_freed`` of its saved
    bytes already freed); None: everything (forward, and backward at the loss)."""
    items: list[MemoryItem] = list(parts.embed_items)
    start = 0
    for count, per_layer in parts.layer_items:
        keep = count if layers_left is None else max(0, min(count, layers_left - start))
        if current_freed and keep and layers_left is not None and start + keep == layers_left:
            top = start + keep - 1
            items += scaled_items(per_layer, keep - 1, f"layers[{start}:{top}]")
            items.append(MemoryItem(
                path=f"layers[{top}] in backward (saved tensors not yet freed)",
                category=Category.ACTIVATIONS, bytes=sum(i.bytes for i in per_layer) - current_freed,
                source=SRC_FREED,
            ))  # fmt: skip
        else:
            items += scaled_items(per_layer, keep, f"layers[{start}:{start + keep}]")
        start += count
    if layers_left is None:
        items += list(parts.head_items)
    return items


def backward_items(
    parts: Parts, bp: BackwardPeak, resident: bool, all_saved: list[MemoryItem]
) -> list[MemoryItem]:
    """``all_saved``: ``activation_items(parts, layers_left=None)``, built once for the forward."""
    n_layers = sum(c for c, _ in parts.layer_items)
    items: list[MemoryItem] = []
    # the running layer's new weight gradients become .grad (AccumulateGrad steals them) unless
    # gradients are resident (accumulation), where they are temporaries added in place
    in_flight = 0 if resident else bp.grads_in_flight
    if bp.grads_so_far + in_flight:
        items.append(MemoryItem(
            path=f"gradients (written so far, {bp.layers_done} of {n_layers} layers done)",
            category=Category.GRADIENTS, bytes=bp.grads_so_far + in_flight, source=SRC_GRADS,
            key="backward.grads_so_far",
        ))  # fmt: skip
    freed_saved = 0 if bp.recompute else bp.freed
    left = None if bp.at_start else n_layers - bp.layers_done
    items += (
        all_saved if left is None else activation_items(parts, layers_left=left, current_freed=freed_saved)
    )
    if bp.recompute:
        items.append(MemoryItem(path="recomputed activations of the layer in backward (not yet freed)",
                                bytes=bp.recompute - bp.freed, category=Category.ACTIVATIONS,
                                source=SRC_RECOMPUTE))  # fmt: skip
    items.append(MemoryItem(path="backward temporaries (gradients in flight)", category=Category.TEMPORARIES,
                            bytes=bp.transient - in_flight + bp.freed, source=SRC_BACKWARD_TMP,
                            key="backward.temporaries"))  # fmt: skip
    if bp.held:
        items.append(MemoryItem(path="tied embedding: the LM head's gradient, held until the embedding's",
                                category=Category.TEMPORARIES, bytes=bp.held, source=SRC_TIED,
                                key="backward.tied_hold"))  # fmt: skip
    return items


SRC_TIED = "torch/csrc/autograd/input_buffer.cpp: accumulate() sums both contributions at the end"
SRC_GRADS = "AccumulateGrad: param.grad appears as backward reaches the parameter"
SRC_FREED = "autograd frees a node's saved tensors once its backward ran"
SRC_RECOMPUTE = "torch.utils.checkpoint recomputes the layer's forward at its backward"
SRC_BACKWARD_TMP = "CE gradients at the start; a layer's activation and weight gradients later"
