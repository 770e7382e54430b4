"""The analytic training estimator: a setup -> an :class:`~peakmem.breakdown.Estimate`.

It assembles the formulas (model states, optimizer, activations, loss), walks the step's
timeline (forward, backward, optimizer; steady state), converts the allocated peak to reserved
bytes and the device total, and records every assumption. Pure and fast: one pass over layer
groups, never over individual layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from enum import Enum
from operator import attrgetter

from peakmem.breakdown import Category, Estimate, MemoryItem, PerParamRow, Phase, PhasePeak
from peakmem.formulas import activations as act
from peakmem.formulas import allocator
from peakmem.formulas import lora as _lora
from peakmem.formulas import lowbit_optim as _lowbit
from peakmem.formulas.loss import head_activations
from peakmem.formulas.model_states import (
    buffer_bytes,
    precision_plan,
    spec_facts,
    trainable_params,
    weight_rows,
)
from peakmem.formulas.optimizer import optimizer_phase_grads, optimizer_rows, state_dtype, step_temporaries
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.timeline import BackwardPeak, GroupCost, backward_peak
from peakmem.model import ModelSpec
from peakmem.training import AttentionKernel, Checkpointing, TrainingSetup

METHOD = "analytic"


_SETUP_FIELDS = tuple(TrainingSetup.__dataclass_fields__)
_SETUP_VALUES = attrgetter(*_SETUP_FIELDS)  # one call: the setup's field values, in field order
_PLAIN = (bool, int, float, str, type(None))


def setup_dict(setup: TrainingSetup) -> dict[str, object]:
    """The setup as JSON-ready values (enums by their CLI spelling)."""
    out: dict[str, object] = {}
    names = _SETUP_FIELDS if type(setup) is TrainingSetup else tuple(setup.__dataclass_fields__)
    values = _SETUP_VALUES(setup) if type(setup) is TrainingSetup else [getattr(setup, n) for n in names]
    for name, value in zip(names, values, strict=True):
        if isinstance(value, Enum):
            out[name] = value._value_  # .value without the enum property's descriptor
        elif isinstance(value, _PLAIN) or not is_dataclass(value) or isinstance(value, type):
            out[name] = value
        else:
            out[name] = asdict(value)  # lora, quant
    return out


def _setup_json(st: _States, setup: TrainingSetup) -> dict[str, object]:
    """``setup_dict(setup)`` from the memoised one of a setup that differs at most in its shapes: a fresh
    dict (same key order), the shapes set, nested dicts (lora, quant) rebuilt so that none is shared."""
    out = dict(st.setup_json)
    out["micro_batch"], out["seq_len"] = setup.micro_batch, setup.seq_len  # _SHAPE_FIELDS
    for name in st.setup_json_nested:
        out[name] = asdict(getattr(setup, name))
    return out


@dataclass(kw_only=True, slots=True)
class _Parts:
    """Per-step quantities shared by the phases (per estimate: slotted, not frozen)."""

    layer_items: tuple[tuple[int, tuple[MemoryItem, ...]], ...]  # (count, per-layer saved) per group
    groups: tuple[GroupCost, ...]
    embed_items: tuple[MemoryItem, ...]
    head_items: tuple[MemoryItem, ...]


@dataclass(frozen=True, kw_only=True)
class _States:
    """What a step needs that depends on the spec and the setup but not on its shapes (micro-batch,
    sequence): the model-state rows and their sums, the optimizer step's items, the outer gradients."""

    spec: ModelSpec  # the spec as estimated (LoRA: first layer split off)
    rows: tuple[PerParamRow, ...]
    grads: int  # the gradients' bytes (resident between steps under accumulation)
    states: int  # the optimizer states' bytes (created inside step 1's optimizer step)
    persistent: int  # alive through the whole steady-state step: weights, buffers, master weights, states
    # alive in forward and backward: weights, master weights, states, buffers, and the gradients kept
    # between steps (accumulation / set_to_none=False) when they are: the items (none of 0 bytes), their sum
    resident_items: tuple[MemoryItem, ...]
    resident_bytes: int
    # the optimizer step: weights, master weights, states, buffers; the step's gradients and temporaries
    optimizer_phase: PhasePeak
    state_extra: dict[str, int]  # Estimate.extra entries that do not depend on shapes (paged states)
    weight_cache: tuple[MemoryItem, ...]  # _weight_cache
    outer_grads: tuple[int, int, int]  # _outer_grad_split
    resident_rounding: int
    params: int
    trainable: int
    head_weight_numel: int
    assumptions: tuple[str, ...]  # LoRA / low-bit optimizer notes
    # the estimate's assumptions (but the attention fallback's) per Overheads: none depends on shapes
    notes: dict[Overheads, tuple[str, ...]] = field(default_factory=dict, compare=False)
    setup_json: dict[str, object]  # setup_dict of a setup with these fields (its shapes overwritten per call)
    setup_json_nested: tuple[str, ...]  # its nested dicts (lora, quant), rebuilt per call: none is shared


# Every TrainingSetup field but the shapes: the states are the same for any micro-batch and sequence.
_SHAPE_FIELDS = ("micro_batch", "seq_len")
_STATE_KEY = attrgetter(*(f for f in _SETUP_FIELDS if f not in _SHAPE_FIELDS))
_STATES: dict[tuple[int, tuple[object, ...]], tuple[ModelSpec, _States]] = {}
_STATES_MAX = 1024
_NOTES_MAX = 64


def _model_states(spec: ModelSpec, setup: TrainingSetup, *, adapter: bool) -> _States:
    """Memoised by spec identity (the spec kept alive in the memo) and every setup field but the shapes:
    a planner estimates one spec under many shapes."""
    if type(setup) is not TrainingSetup:  # a subclass may add fields the key does not know
        return _compute_states(_lora.split_first_layer(spec) if adapter else spec, setup, adapter=adapter)
    key = (id(spec), _STATE_KEY(setup))
    hit = _STATES.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    found = _compute_states(_lora.split_first_layer(spec) if adapter else spec, setup, adapter=adapter)
    if len(_STATES) >= _STATES_MAX:
        _STATES.clear()
    _STATES[key] = (spec, found)
    return found


def _compute_states(spec: ModelSpec, setup: TrainingSetup, *, adapter: bool) -> _States:
    tspec, tsetup = _lora.optimizer_view(spec, setup)  # the trainable tensors (LoRA: the adapters)
    opt_rows = optimizer_rows(tspec, tsetup)
    rows = _lora.weight_rows_for(spec, setup, weight_rows) + opt_rows
    buffers = buffer_bytes(spec, setup)
    outer = _outer_grad_split(spec, precision_plan(setup.precision).grad.nbytes)
    if adapter:
        outer = _lora.outer_grad_split(spec, setup), 0, 0
    weights, grads = _row_bytes(rows, Category.PARAMETERS), _row_bytes(rows, Category.GRADIENTS)
    master, states = _row_bytes(rows, Category.MASTER_WEIGHTS), _row_bytes(rows, Category.OPTIMIZER_STATES)
    persistent = state_items(rows, buffers, include_grads=False)
    kept_grads = _grad_items(rows, "gradients (accumulated)") if _grads_resident(setup, grads) else []
    resident_items, resident_bytes = _kept(persistent + kept_grads)
    step_items = [] if _lowbit.in_backward(setup) else [optimizer_phase_grads(tspec, tsetup),
                                                       *step_temporaries(tspec, tsetup)]  # fmt: skip
    paged = _lowbit.paged_bytes(tspec, tsetup)
    setup_json = setup_dict(setup)
    return _States(
        spec=spec, rows=rows,
        grads=grads, states=states, persistent=weights + buffers + master + states,
        resident_items=resident_items, resident_bytes=resident_bytes,
        optimizer_phase=_phase(Phase.OPTIMIZER, persistent + step_items),
        state_extra={"paged_optimizer_bytes": paged} if paged else {},
        weight_cache=tuple(_weight_cache(spec, setup)),
        outer_grads=outer, resident_rounding=_resident_rounding(spec, setup, len(opt_rows)),
        params=spec_facts(spec).params, trainable=trainable_params(tspec, tsetup),
        head_weight_numel=_head_weight_numel(spec),
        assumptions=_lora.assumptions(spec, setup) + _lowbit.assumptions(setup),
        setup_json=setup_json,
        setup_json_nested=tuple(k for k, v in setup_json.items() if isinstance(v, dict)),
    )  # fmt: skip


def _grads_resident(setup: TrainingSetup, grads: int) -> bool:
    """Gradients alive through the whole step: accumulation, or zero_grad(set_to_none=False)."""
    return grads > 0 and (setup.grad_accum > 1 or not setup.grads_set_to_none)


def _row_bytes(rows: tuple[PerParamRow, ...], category: Category) -> int:
    return sum(r.bytes for r in rows if r.category is category)


def _outer_grad_split(spec: ModelSpec, grad_bytes: Callable[[int], int]) -> tuple[int, int, int]:
    """(gradients written at the start of backward - head, final norm -, embedding gradients written
    at the end - a tied embedding's included -, the head's gradient of a tied embedding).

    A tied embedding gets two gradients: the LM head's (an ``mm`` output at the start of backward)
    and the embedding lookup's (``embedding_dense_backward`` at the end). The autograd engine keeps
    the first in the weight's ``InputBuffer`` until the second arrives and then sums them into a new
    tensor that ``AccumulateGrad`` takes as ``.grad`` (torch/csrc/autograd/input_buffer.cpp
    ``accumulate``; measured on CPU, torch 2.13: fp32 and bf16): a temporary through the whole
    backward, with both contributions and their sum alive together at the end."""
    start = end = 0
    for t in spec.outer:
        if t.component in ("embeddings", "positions"):
            end += grad_bytes(t.numel)
        else:
            start += grad_bytes(t.numel)
    tied_tmp = grad_bytes(spec.vocab_size * spec.hidden_size) if spec.tie_word_embeddings else 0
    return start, end, tied_tmp


def _head_weight_numel(spec: ModelSpec) -> int:
    for t in spec.outer:
        if t.component in ("head", "classifier") and t.kind == "linear_weight":
            return t.numel
    return spec.vocab_size * spec.hidden_size


def scaled_items(items: tuple[MemoryItem, ...], count: int, prefix: str) -> list[MemoryItem]:
    if not count:
        return []
    return [
        MemoryItem(f"{prefix}.{i.path}", i.category, i.bytes * count, i.source)  # by position: hot
        for i in items
        if i.bytes
    ]


def _resident_rounding(spec: ModelSpec, setup: TrainingSetup, n_states: int) -> int:
    """kMinBlockSize (512 B) rounding of every weight, master copy and state tensor."""
    plan = precision_plan(setup.precision)
    per_elem = [plan.weight.bits // 8] + ([plan.master.bits // 8] if plan.master else [])
    per_elem += [state_dtype(setup).bits // 8] * n_states
    extra = 0
    for numel, n in spec_facts(spec).sizes:
        for size in per_elem:
            b = numel * size
            extra += (allocator.round_request(b) - b) * n
    return extra


def _parts(
    spec: ModelSpec,
    setup: TrainingSetup,
    sh: act.Shapes,
    head_items: tuple[MemoryItem, ...],
    *,
    adapter: bool,
) -> _Parts:
    """``adapter``: ``_lora.is_adapter_method(setup)``, asked once by the caller."""
    facts = spec_facts(spec)
    grad_dtype = precision_plan(setup.precision).grad
    groups: list[GroupCost] = []
    layer_items: list[tuple[int, tuple[MemoryItem, ...]]] = []
    seen: dict[int, act.LayerActivations] = {}  # groups with equal layers share their formulas
    for i, g in enumerate(spec.groups):
        layer_grads = grad_dtype.nbytes(facts.layer_params[i])
        if adapter:
            layer_grads = _lora.layer_grad_bytes(spec, setup, i)
        la = None if adapter else seen.get(facts.same_as[i])
        if la is None:
            la = act.layer_activations(
                spec, g.layer, sh, layer_grads, mlp_params=facts.mlp_params[i],
                linear_params=facts.linear_params[i], layer_params=facts.layer_params[i],
            )  # fmt: skip
            if adapter:
                la = _lora.adapt_layer(spec, i, la, sh, setup)
            la = seen[i] = act.checkpointed(la, setup.checkpointing)
        if setup.activation_offload or setup.optimizer_in_backward:
            la, layer_grads = _lowbit.step_tricks(la, layer_grads, setup)
        groups.append(GroupCost(
            count=g.count, saved=la.saved_bytes, grads=layer_grads, backward_transient=la.backward_transient,
            recompute=la.recompute, forward_transient=la.forward_transient, freed=la.backward_freed,
            grads_in_flight=la.backward_grads,
        ))  # fmt: skip
        layer_items.append((g.count, la.saved))
    embed = act.embedding_items(spec, sh)
    return _Parts(
        layer_items=tuple(layer_items),
        groups=tuple(groups), head_items=head_items,
        embed_items=_lora.adapt_embedding_items(spec, embed, setup) if adapter else embed,
    )  # fmt: skip


def _attention_fallback(spec: ModelSpec, setup: TrainingSetup) -> TrainingSetup | None:
    """The setup with eager attention when transformers has no ``setup.attention`` kernel for this
    architecture (BLOOM: eager only; Gemma 2: no SDPA), as its ``_check_and_adjust_attn_implementation``
    picks eager when SDPA is unsupported (modeling_utils.py); None when the kernel exists."""
    if setup.attention.value in spec.attention_kernels:
        return None
    return replace(setup, attention=AttentionKernel.EAGER)


def _fallback_note(spec: ModelSpec, asked: AttentionKernel, setup: TrainingSetup) -> tuple[str, ...]:
    if asked is setup.attention:
        return ()
    return (
        f"attention {asked.value} is not implemented by transformers for {spec.model_type} "
        f"(kernels: {', '.join(spec.attention_kernels)}); it runs {setup.attention.value}, as estimated",
    )


_DEFAULT_OVERHEADS = Overheads()  # frozen: one instance serves every call


def estimate_training(
    spec: ModelSpec, setup: TrainingSetup, *, overheads: Overheads | None = None
) -> Estimate:
    """Peak memory of one steady-state training step of ``spec`` under ``setup``."""
    ov = overheads or _DEFAULT_OVERHEADS
    asked = setup.attention
    fallback = _attention_fallback(spec, setup)
    if fallback is not None:
        setup = fallback
    adapter = _lora.is_adapter_method(setup)
    in_bwd = _lowbit.in_backward(setup)
    st = _model_states(spec, setup, adapter=adapter)
    spec = st.spec
    sh = act.shapes(spec, setup)
    head = head_activations(spec, sh, st.head_weight_numel)
    if adapter:
        head = _lora.adapt_head(spec, head, sh, setup)
    head = _lowbit.adapt_head_loss(spec, head, sh, setup)
    parts = _parts(spec, setup, sh, head.saved, adapter=adapter)
    resident = _grads_resident(setup, st.grads)

    # --- forward: everything saved, then the logits and their fp32 copy at the loss
    head_saved = sum([i.bytes for i in parts.head_items])
    layer_fwd = max([g.forward_transient for g in parts.groups], default=0)
    fwd_extra = max(head.forward_transient, layer_fwd - head_saved)
    all_saved = _activation_items(parts, layers_left=None)
    forward = _phase(Phase.FORWARD, [
        *all_saved, *st.weight_cache,
        MemoryItem(path="forward temporaries (logits and their fp32 copy, or a layer's interior)",
                   category=Category.TEMPORARIES, bytes=fwd_extra, source=SRC_FORWARD_TMP),
    ], base=st.resident_items, base_bytes=st.resident_bytes)  # fmt: skip

    # --- backward. CE backward: two fp32 T x V gradients next to the saved log-softmax output;
    # then the head's backward: the log-softmax output is freed, the logits gradient (compute
    # dtype) is alive while the head's weight gradient is written.
    start_grads, end_grads, tied_tmp = st.outer_grads
    bp = backward_peak(
        parts.groups[::-1], base_saved=sum([i.bytes for i in parts.embed_items]),
        head_saved=head_saved,
        start_extra=max(head.backward_transient, head.logits_grad + start_grads + tied_tmp),
        start_grads=0 if in_bwd else start_grads,
        tail_extra=tied_tmp + (end_grads if resident or in_bwd else 0),
        tail_grads=0 if resident or in_bwd else end_grads, grads_resident=resident,
        held=tied_tmp,
    )  # fmt: skip
    backward = _phase(Phase.BACKWARD, _backward_items(parts, bp, resident, all_saved),
                      base=st.resident_items, base_bytes=st.resident_bytes)  # fmt: skip

    # --- optimizer step (step 1 creates the states inside it, so it peaks the same)
    memo = st.optimizer_phase  # copied: results are not frozen, so none is shared between estimates
    optimizer = PhasePeak(phase=Phase.OPTIMIZER, bytes=memo.bytes, items=memo.items)
    phases = (forward, backward, optimizer)
    peak = max(phases, key=_BYTES)
    reserved = allocator.reserved_bytes(
        resident=st.persistent, resident_rounding=st.resident_rounding,
        churn=peak.bytes - st.persistent, fragmentation=ov.fragmentation,
    )  # fmt: skip
    notes = st.notes.get(ov)
    if notes is None:
        if len(st.notes) >= _NOTES_MAX:
            st.notes.clear()
        notes = st.notes[ov] = _assumptions(spec, setup, sh, ov) + st.assumptions
    step1 = max(forward.bytes - st.states, backward.bytes - st.states, optimizer.bytes)
    extra: dict[str, object] = {
        "step1_peak_allocated_bytes": step1,
        "backward_peak_layers_done": bp.layers_done,
        "context_bytes": ov.context_bytes,
        "cublas_workspace_bytes": ov.cublas_workspace_bytes,
        "fragmentation": ov.fragmentation,
        **st.state_extra,
    }
    if setup.activation_offload:
        extra["cpu_activation_bytes"] = _lowbit.cpu_activation_bytes(spec, setup)
    return Estimate(
        method=METHOD, job="train", model_name=spec.name, params=st.params,
        trainable_params=st.trainable, per_param=st.rows, items=peak.items, phases=phases,
        peak_phase=peak.phase, peak_allocated_bytes=peak.bytes, peak_reserved_bytes=reserved,
        device_total_bytes=reserved + ov.context_bytes + ov.cublas_workspace_bytes,
        assumptions=notes + _fallback_note(spec, asked, setup),
        setup=_setup_json(st, setup), extra=extra,
    )  # fmt: skip


_BYTES = attrgetter("bytes")


def _weight_cache(spec: ModelSpec, setup: TrainingSetup) -> list[MemoryItem]:
    """Autocast caches the 16-bit cast of every weight until the autocast context exits (after the
    loss). Without checkpointing each cast is also saved by its Linear (counted per layer); under
    full checkpointing nothing saves them, but the cache still holds all of them at the loss."""
    plan = precision_plan(setup.precision)
    if not plan.autocast or setup.checkpointing is not Checkpointing.FULL:
        return []
    facts = spec_facts(spec)
    numel = sum(g.count * n for g, n in zip(spec.groups, facts.linear_params, strict=True))
    return [MemoryItem(path="autocast weight cache (16-bit casts, until autocast exits)",
                       category=Category.TEMPORARIES, bytes=numel * (plan.compute.bits // 8),
                       source=SRC_WEIGHT_CACHE)]  # fmt: skip


SRC_WEIGHT_CACHE = "torch autocast cached_cast: leaf fp32 weights cached per autocast region"
SRC_FORWARD_TMP = "ForCausalLMLoss: logits (compute dtype) and logits.float() alive at cross_entropy"


def _kept(items: Iterable[MemoryItem]) -> tuple[tuple[MemoryItem, ...], int]:
    """The items that hold bytes, and their sum."""
    kept = tuple([i for i in items if i.bytes])
    return kept, sum([i.bytes for i in kept])


def _phase(
    phase: Phase, items: Iterable[MemoryItem], *, base: tuple[MemoryItem, ...] = (), base_bytes: int = 0
) -> PhasePeak:
    """``items`` (those of 0 bytes dropped) after ``base`` (already kept, ``base_bytes`` in all)."""
    kept, nbytes = _kept(items)
    return PhasePeak(phase=phase, bytes=base_bytes + nbytes, items=base + kept)


def state_items(rows: tuple[PerParamRow, ...], buffers: int, *, include_grads: bool) -> list[MemoryItem]:
    items = [
        MemoryItem(path=r.tensor, category=r.category, bytes=r.bytes, source=r.source)
        for r in rows
        if include_grads or r.category is not Category.GRADIENTS
    ]
    if buffers:
        items.append(MemoryItem(path="buffers", category=Category.BUFFERS, bytes=buffers,
                                source="registered buffers (RoPE inv_freq), fp32"))  # fmt: skip
    return items


def _grad_items(rows: tuple[PerParamRow, ...], label: str) -> list[MemoryItem]:
    return [
        MemoryItem(path=label, category=Category.GRADIENTS, bytes=r.bytes, source=r.source)
        for r in rows
        if r.category is Category.GRADIENTS
    ]


def _activation_items(parts: _Parts, layers_left: int | None, current_freed: int = 0) -> list[MemoryItem]:
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


def _backward_items(
    parts: _Parts, bp: BackwardPeak, resident: bool, all_saved: list[MemoryItem]
) -> list[MemoryItem]:
    """``all_saved``: ``_activation_items(parts, layers_left=None)``, built once for the forward."""
    n_layers = sum(c for c, _ in parts.layer_items)
    items: list[MemoryItem] = []
    # the running layer's new weight gradients become .grad (AccumulateGrad steals them) unless
    # gradients are resident (accumulation), where they are temporaries added in place
    in_flight = 0 if resident else bp.grads_in_flight
    if bp.grads_so_far + in_flight:
        items.append(MemoryItem(
            path=f"gradients (written so far, {bp.layers_done} of {n_layers} layers done)",
            category=Category.GRADIENTS, bytes=bp.grads_so_far + in_flight, source=SRC_GRADS,
        ))  # fmt: skip
    freed_saved = 0 if bp.recompute else bp.freed
    left = None if bp.at_start else n_layers - bp.layers_done
    items += (
        all_saved if left is None else _activation_items(parts, layers_left=left, current_freed=freed_saved)
    )
    if bp.recompute:
        items.append(MemoryItem(path="recomputed activations of the layer in backward (not yet freed)",
                                bytes=bp.recompute - bp.freed, category=Category.ACTIVATIONS,
                                source=SRC_RECOMPUTE))  # fmt: skip
    items.append(MemoryItem(path="backward temporaries (gradients in flight)", category=Category.TEMPORARIES,
                            bytes=bp.transient - in_flight + bp.freed, source=SRC_BACKWARD_TMP))  # fmt: skip
    if bp.held:
        items.append(MemoryItem(path="tied embedding: the LM head's gradient, held until the embedding's",
                                category=Category.TEMPORARIES, bytes=bp.held, source=SRC_TIED))  # fmt: skip
    return items


SRC_TIED = "torch/csrc/autograd/input_buffer.cpp: accumulate() sums both contributions at the end"
SRC_GRADS = "AccumulateGrad: param.grad appears as backward reaches the parameter"
SRC_FREED = "autograd frees a node's saved tensors once its backward ran"
SRC_RECOMPUTE = "torch.utils.checkpoint recomputes the layer's forward at its backward"
SRC_BACKWARD_TMP = "CE gradients at the start; a layer's activation and weight gradients later"


def _assumptions(spec: ModelSpec, setup: TrainingSetup, sh: act.Shapes, ov: Overheads) -> tuple[str, ...]:
    dropout = f"attention {spec.attention_dropout}, hidden {spec.hidden_dropout}"
    dropout += f", embedding {spec.embedding_dropout}"
    out = [
        "steady-state step (>= 2): optimizer states exist in forward/backward; "
        f"zero_grad(set_to_none={setup.grads_set_to_none})",
        act.activation_dtype_note(sh),
        f"framework profile {sh.profile.name}: {sh.profile.source}",
        f"training mode: dropout active where the config sets it ({dropout})",
        "the loop drops the model output (logits) before loss.backward(), as HF Trainer and torchtune do",
        f"allocator fragmentation {ov.fragmentation:.0%} of the per-step churn "
        "(activations, gradients, temporaries); override with Overheads(fragmentation=...)",
        f"CUDA context {ov.context_bytes // (1024 * 1024)} MiB ({ov.context_source}); "
        f"cuBLAS workspace {ov.cublas_workspace_bytes} B",
    ]
    if sh.kernel_note:
        out.append(f"attention kernel {setup.attention.value} runs as {sh.kernel.value}: {sh.kernel_note}")
    if setup.checkpointing is Checkpointing.FULL:
        out.append("full checkpointing: each layer keeps its input; one layer is recomputed during backward")
    if setup.checkpointing is Checkpointing.SELECTIVE:
        out.append("selective checkpointing (Korthikanti et al. 2022 §4.2): attention core recomputed")
    if precision_plan(setup.precision).master is not None:
        out.append(
            "mixed precision: at the step each 16-bit grad is replaced by its fp32 copy on the "
            "master weight (master.grad = p.grad.float(); p.grad = None)"
        )
    out.extend(spec.notes)
    return tuple(out)
