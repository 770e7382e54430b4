"""The analytic training estimator: a setup (and a parallel layout) -> an
:class:`~peakmem.breakdown.Estimate` for one rank.

ONE step timeline. The setup's method, precision and optimizer are applied once
(:func:`peakmem.formulas.technique.technique`); the engine then partitions what exists
(:func:`peakmem.formulas.sharding.rank_states`: DDP buckets, ZeRO 1/2/3, FSDP, offload) and the
model-parallel layout gives the rank its share of layers, heads and tokens
(:mod:`peakmem.formulas.model_parallel`); this module walks forward, backward and the optimizer step
(steady state, step 1 reported too) over that rank's tensors, converts the allocated peak to
reserved bytes and the device total, and records every assumption. The single-GPU estimate is the
replicated case of the per-rank one (``Parallelism()``), not a second code path.

Pure and fast: one pass over layer groups, never over individual layers. A
:class:`TrainingEstimator` memoises what does not depend on the shapes (micro-batch, sequence) for
one spec; a search keeps one per question (the caches belong to it, not to this module).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, is_dataclass, replace
from enum import Enum
from fractions import Fraction
from operator import attrgetter

from peakmem import block_costs
from peakmem import step_band as _step_band
from peakmem import step_fsdp as _fsdp
from peakmem import step_load as _load
from peakmem import step_parts as _steps
from peakmem import step_pipeline as _pipe
from peakmem.adapters import quant_of
from peakmem.breakdown import Category, Estimate, MemoryItem, PerParamRow, Phase, PhasePeak
from peakmem.defaults import skips_grad_sync
from peakmem.errors import InputError
from peakmem.formulas import activations as act
from peakmem.formulas import allocator, sharding
from peakmem.formulas import band as _band
from peakmem.formulas import block_rounding as _rounding
from peakmem.formulas import fsdp1_frozen_inputs as _frozen
from peakmem.formulas import fsdp1_root as _root1
from peakmem.formulas import fsdp2 as _fsdp2
from peakmem.formulas import long_context as _long
from peakmem.formulas import loop_held as _held
from peakmem.formulas import lora as _lora
from peakmem.formulas import lowbit_optim as _lowbit
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import moe_loop as _loop
from peakmem.formulas import nccl as _nccl
from peakmem.formulas import padded_lengths as _padded
from peakmem.formulas import zero_streams as _zs
from peakmem.formulas.activations import float8 as _f8
from peakmem.formulas.autocast_cache import weight_cache
from peakmem.formulas.loss import final_norm_backward, framework_head, head_activations
from peakmem.formulas.memo import Memo
from peakmem.formulas.model_states import spec_facts
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.quant_head import quantized_head
from peakmem.formulas.technique import Technique, technique
from peakmem.formulas.timeline import BackwardPeak, GroupCost, backward_peak, in_place_credit
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import Parallelism, PipelineSchedule
from peakmem.step_notes import step_assumptions
from peakmem.step_parts import Parts, Static
from peakmem.step_setup import fallback_note, setup_that_runs
from peakmem.training import (
    AttentionKernel,
    Checkpointing,
    LossImpl,
    Method,
    OptimizerName,
    PaddedLengths,
    TrainingSetup,
    checkpointed_layers,
)
from peakmem.transformers_versions import release_facts as _tf_release
from peakmem.units import fmt_gb

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


_SINGLE = Parallelism()  # one GPU: the replicated layout of one rank
_DEFAULT_OVERHEADS = Overheads()  # frozen: one instance serves every call
# Every TrainingSetup field but the shapes: a rank's states are the same for any micro-batch and sequence.
_SHAPE_FIELDS = ("micro_batch", "seq_len")
_STATE_KEY = attrgetter(*(f for f in _SETUP_FIELDS if f not in _SHAPE_FIELDS))
_MEMO_MAX = 1024


class TrainingEstimator:
    """Training estimates of one spec. It memoises the shape-independent part of each (setup, layout,
    stage); a search keeps one estimator per question, so the memo lives and dies with it.

    ``costs``: where a derived spec's measured block costs come from (:data:`peakmem.model.CostLookup`);
    by default the stored ones (:func:`peakmem.block_costs.stored_lookup`: shipped files, the disk cache).
    The face hands in :func:`peakmem.simulate.measuring_lookup` where torch is installed."""

    def __init__(
        self, spec: ModelSpec, overheads: Overheads | None = None, *, costs: CostLookup | None = None
    ) -> None:
        self.spec = spec
        self.overheads = overheads or _DEFAULT_OVERHEADS
        self.costs: CostLookup = costs or block_costs.stored_lookup
        # what formulas compute from the spec's and its layers' tensors, by identity (formulas/memo.py)
        self.memo = Memo()
        self._tech: dict[tuple[object, ...], Technique] = {}
        self._static: dict[tuple[object, ...], Static] = {}
        self._stages: dict[tuple[object, ...], mp.StageParams] = {}

    def technique(self, setup: TrainingSetup) -> Technique:
        key = _STATE_KEY(setup) if type(setup) is TrainingSetup else (setup,)
        found = self._tech.get(key)
        if found is None:
            if len(self._tech) >= _MEMO_MAX:
                self._tech.clear()
            found = self._tech[key] = technique(self.spec, setup, self.memo)
        return found

    def _static_of(self, setup: TrainingSetup, par: Parallelism | None, stage: int) -> Static:
        key = (_STATE_KEY(setup) if type(setup) is TrainingSetup else (setup,), par, stage)
        found = self._static.get(key)
        if found is None:
            if len(self._static) >= _MEMO_MAX:
                self._static.clear()
            tech = self.technique(setup)
            layout = par or _SINGLE
            # a stage's parameters depend on the model-parallel split (and the framework's head) only
            split = (tech.adapter, tech.spec.tie_word_embeddings, layout.tp, layout.pp, layout.ep, stage)
            sp = self._stages.get(split)
            if sp is None:
                sp = self._stages[split] = mp.stage_params(tech.spec, layout, stage)
            found = self._static[key] = _compute_static(tech, setup, par, sp, self.memo)
        return found

    def estimate(
        self, setup: TrainingSetup, par: Parallelism | None = None, stage: int = 0, role: str = "all ranks"
    ) -> Estimate:
        """One rank of pipeline stage ``stage`` under ``par`` (None: one GPU) at its peak."""
        return self.rank(setup, par, stage, role)[0]

    def rank(
        self, setup: TrainingSetup, par: Parallelism | None = None, stage: int = 0, role: str = "all ranks"
    ) -> tuple[Estimate, sharding.RankStates, mp.StageParams]:
        _check_positions(self.spec, setup)
        asked = setup
        setup = setup_that_runs(self.spec, setup)
        st = self._static_of(setup, par, stage)
        est = _estimate(st, setup, par or _SINGLE, role, self.overheads, asked, self.costs, self.memo)
        return est, st.states, st.sp


def _check_positions(spec: ModelSpec, setup: TrainingSetup) -> None:
    """A model with learned position embeddings has a row per position: a longer sequence cannot run
    (the embedding lookup goes out of range), so it is refused rather than estimated."""
    if spec.position == "learned" and setup.seq_len > spec.max_position_embeddings:
        raise InputError(
            f"seq={setup.seq_len}: {spec.name} has {spec.max_position_embeddings:,} learned positions "
            f"(max_position_embeddings); a longer sequence cannot run"
        )


def estimate_training(
    spec: ModelSpec,
    setup: TrainingSetup,
    *,
    overheads: Overheads | None = None,
    costs: CostLookup | None = None,
) -> Estimate:
    """Peak memory of one steady-state training step of ``spec`` under ``setup`` on one GPU (``costs``:
    see :class:`TrainingEstimator`)."""
    return TrainingEstimator(spec, overheads, costs=costs).estimate(setup)


# --- the shape-independent part -------------------------------------------------------------------
def _stage_group_indices(spec: ModelSpec, pp: int, stage: int) -> tuple[tuple[int, int], ...]:
    """(group index, layers of that group on the stage) for the stage's contiguous layer range."""
    start, n = mp.stage_layer_counts(spec.num_layers, pp, stage)
    end, pos = start + n, 0
    out: list[tuple[int, int]] = []
    for i, g in enumerate(spec.groups):
        lo, hi = max(start, pos), min(end, pos + g.count)
        if hi > lo:
            out.append((i, hi - lo))
        pos += g.count
    return tuple(out)


def _checkpoint_runs(
    groups: tuple[tuple[int, int], ...], setup: TrainingSetup
) -> tuple[tuple[tuple[int, int], ...], tuple[bool, ...]]:
    """The stage's groups cut into runs of layers that ``setup.checkpointing`` wraps or not, in layer
    order, and per run whether it does: every run is wrapped but under full checkpointing of every
    N-th layer (peakmem.training.checkpointed_layers)."""
    if setup.checkpointing is not Checkpointing.FULL or setup.checkpoint_every == 1:
        return groups, (True,) * len(groups)
    wrapped = checkpointed_layers(sum(c for _, c in groups), setup.checkpoint_every, setup.framework)
    runs: list[tuple[int, int]] = []
    flags: list[bool] = []
    pos = 0
    for i, count in groups:
        for w in wrapped[pos : pos + count]:
            if runs and runs[-1][0] == i and flags[-1] == w:
                runs[-1] = (i, runs[-1][1] + 1)
            else:
                runs.append((i, 1))
                flags.append(w)
        pos += count
    return tuple(runs), tuple(flags)


def _kept(nbytes: int, frac: Fraction) -> int:
    return nbytes if frac == 1 else -(-nbytes * frac.numerator // frac.denominator)


def _compute_static(
    tech: Technique, setup: TrainingSetup, par: Parallelism | None, sp: mp.StageParams, memo: Memo
) -> Static:
    layout = par or _SINGLE
    spec = tech.spec
    stage = sp.stage
    rs = sharding.rank_states(tech, setup, layout, sp)
    first, last = stage == 0, stage == layout.pp - 1
    groups, wrapped = _checkpoint_runs(_stage_group_indices(spec, layout.pp, stage), setup)
    in_bwd = _lowbit.in_backward(setup)
    cap = rs.grads_written_cap
    written = tuple(tech.layer_grads[i] if cap is None else min(tech.layer_grads[i], cap * layout.tp)
                    for i, _ in groups)  # fmt: skip
    kept = tuple(_kept(mp.cdiv(tech.layer_grads[i], layout.tp), rs.grads_kept) for i, _ in groups)
    start, end, tied = _outer_grad_split(tech, setup, memo)
    start, end = (mp.cdiv(start, layout.tp) if last else 0), (mp.cdiv(end, layout.tp) if first else 0)
    end += rs.embedding_grad_extra  # FSDP2 + TP: written whole (rank_states)
    tied = tied if layout.pp == 1 else 0  # pipeline stages keep two tied copies: no shared InputBuffer
    if cap is not None:
        start, end = min(start, cap), min(end, cap)
    # FSDP2: the root unit's gradients are whole until its post-backward ends backward (rank_states)
    kept_outer = Fraction(0) if rs.root_grads_deferred else rs.grads_kept
    outer = (start, _kept(start, kept_outer), end, _kept(end, kept_outer), mp.cdiv(tied, layout.tp))
    buffers = tech.buffers
    persistent_items = _state_items(rs.rows, buffers) + list(rs.resident)
    resident = setup.grad_accum > 1 or not setup.grads_set_to_none
    resident_items, resident_bytes = _nonzero(persistent_items + (list(rs.accumulated) if resident else []))
    persistent = sum(i.bytes for i in persistent_items)
    step_items = [] if in_bwd else [*rs.step_grads, *rs.step]
    single = par is None or par == _SINGLE
    paged = sum(r.bytes for r in rs.rows if r.unified_memory)  # on the device beside torch's allocator
    setup_json = setup_dict(setup)
    cached = tuple(g for g, w in zip(groups, wrapped, strict=True) if w)  # the weight cache's layers
    return Static(
        tech=tech, states=rs, sp=sp, single=single, groups=groups, wrapped=wrapped, written=written,
        kept=kept, outer=outer,
        table=rs.table, persistent=persistent,
        states_bytes=sum(r.bytes for r in rs.rows if r.category is Category.OPTIMIZER_STATES) - paged,
        resident_items=resident_items, resident_bytes=resident_bytes,
        optimizer_phase=_phase(Phase.OPTIMIZER, persistent_items + step_items),
        resident_rounding=_rounding.resident_rounding(spec, setup, len(tech.state_rows), memo)
        if _whole(layout) else 0,
        weight_cache=tuple(weight_cache(tech, setup, cached, layout.tp, memo)),
        unified_bytes=paged,
        assumptions=_lora.assumptions(spec, setup, memo) + _lowbit.assumptions(setup)
        + _f8.assumptions(spec, setup.precision),
        setup_json=setup_json,
        setup_json_nested=tuple(k for k, v in setup_json.items() if isinstance(v, dict)),
        in_backward_step=sharding.one_tensor_step_bytes(tech) if in_bwd else 0,
    )  # fmt: skip


def _whole(par: Parallelism) -> bool:
    """Every rank holds every tensor whole (one GPU, or DDP replicas): per-tensor allocator rounding."""
    return par.tp == par.pp == par.ep == 1 and par.engine in ("none", "ddp")


def _outer_grad_split(tech: Technique, setup: TrainingSetup, memo: Memo) -> tuple[int, int, int]:
    """(gradients written at the start of backward - head, final norm -, embedding gradients written
    at the end - a tied embedding's included -, the head's gradient of a tied embedding).

    A tied embedding gets two gradients: the LM head's (an ``mm`` output at the start of backward)
    and the embedding lookup's (``embedding_dense_backward`` at the end). The autograd engine keeps
    the first in the weight's ``InputBuffer`` until the second arrives and then sums them into a new
    tensor that ``AccumulateGrad`` takes as ``.grad`` (torch/csrc/autograd/input_buffer.cpp
    ``accumulate``; measured on CPU, torch 2.13: fp32 and bf16): a temporary through the whole
    backward, with both contributions and their sum alive together at the end. Under LoRA only
    the adapters outside the layers get gradients, all at the start."""
    if tech.adapter:
        return _lora.outer_grad_split(tech.spec, setup, memo), 0, 0
    spec, grad_bytes = tech.spec, tech.grad.nbytes
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


SRC_BUFFERS = "registered buffers (RoPE inv_freq), fp32"
SRC_FORWARD_TMP = "ForCausalLMLoss: logits (compute dtype) and logits.float() alive at cross_entropy"


def _state_items(rows: tuple[PerParamRow, ...], buffers: int) -> list[MemoryItem]:
    """The rows as allocated items (a paged optimizer's CUDA unified memory is not torch's: left out)."""
    items = [MemoryItem(path=r.tensor, category=r.category, bytes=r.bytes, source=r.source)
             for r in rows if not r.unified_memory]  # fmt: skip
    if buffers:
        items.append(MemoryItem(path="buffers", category=Category.BUFFERS, bytes=buffers,
                                source=SRC_BUFFERS, key="buffers"))  # fmt: skip
    return items


def _nonzero(items: Iterable[MemoryItem]) -> tuple[tuple[MemoryItem, ...], int]:
    """The items that hold bytes, and their sum."""
    kept = tuple([i for i in items if i.bytes])
    return kept, sum([i.bytes for i in kept])


def _plus(p: PhasePeak, item: MemoryItem) -> PhasePeak:
    return PhasePeak(phase=p.phase, bytes=p.bytes + item.bytes, items=(*p.items, item))


def _phase(
    phase: Phase, items: Iterable[MemoryItem], *, base: tuple[MemoryItem, ...] = (), base_bytes: int = 0
) -> PhasePeak:
    """``items`` (those of 0 bytes dropped) after ``base`` (already kept, ``base_bytes`` in all)."""
    kept, nbytes = _nonzero(items)
    return PhasePeak(phase=phase, bytes=base_bytes + nbytes, items=base + kept)


# --- the step, at the setup's shapes --------------------------------------------------------------
def _parts(st: Static, setup: TrainingSetup, sh: act.Shapes, head_items: tuple[MemoryItem, ...],
           par: Parallelism) -> Parts:  # fmt: skip
    tech = st.tech
    spec = tech.spec
    facts = spec_facts(spec, sh.memo)
    groups: list[GroupCost] = []
    layer_items: list[tuple[int, tuple[MemoryItem, ...]]] = []
    offloaded = 0
    seen: dict[tuple[int, int, bool], act.LayerActivations] = {}  # equal layers share their formulas
    runs = zip(st.groups, st.wrapped, st.written, st.kept, strict=True)
    reentrant = _tf_release(setup.transformers).reentrant_checkpointing
    keeps = _frozen.keeps_layer_inputs(par, bool(tech.adapter), setup.checkpointing, reentrant)
    for (i, count), wrapped, written, kept in runs:
        memo = (facts.same_as[i], written, wrapped)
        la = None if tech.adapter else seen.get(memo)
        if la is None:
            layer = spec.groups[i].layer
            la = act.layer_activations(
                spec, layer, sh, written, mlp_params=facts.mlp_params[i],
                linear_params=facts.linear_params[i], layer_params=facts.layer_params[i],
            )  # fmt: skip
            if tech.adapter:  # a derived block's costs measured the module adapters (adapt_layer: the rest)
                la = _lora.adapt_layer(spec, i, la, sh, setup)
            rerun = wrapped and setup.checkpointing is Checkpointing.FULL  # a 4.x MoE loop: moe_loop.py
            la = _loop.expert_loop_layer(la, spec, layer, sh, setup, trainable=not tech.adapter,
                                         recomputed=rerun)  # fmt: skip
            if setup.tiled_mlp:
                la = _long.tiled_mlp(
                    la, spec, layer, sh, _long.tiled_shards(spec, sh.tokens, setup.tiled_mlp_shards)
                )
            recipe = _f8.recipe_of(setup.precision)
            if recipe is not None:  # before the model-parallel split, which shares them out as the rest
                _f8.check_float8(spec, layer, setup, bool(tech.adapter))
                recomputed = wrapped and setup.checkpointing in (Checkpointing.FULL, Checkpointing.OP)
                la = _f8.float8_layer(spec, layer, sh, la, recipe, recomputed=recomputed)
            if not par.is_single_gpu:
                la = _long.ulysses_attention(la, spec, layer, sh, par)
                att_sh = _long.attention_shapes(sh, par)  # the ring chunk Ulysses gathers
                ring = mp.cp_ring(_long.attention_layer(layer, par), att_sh.tokens, sh.c, par)
                dispatch = mp.ep_dispatch_bytes(layer, sh.tokens, spec.hidden_size, sh.c, par)
                all_to_all = _long.all_to_all_bytes(layer, sh, par)  # Ulysses: forward and backward
                la = mp.tp_layer_activations(
                    la, par, ring, dispatch + all_to_all, linear_input=sh.tokens * spec.hidden_size * sh.c
                )
            if setup.checkpointing is Checkpointing.OP:
                act.check_op_sac(spec, layer, bool(tech.adapter), par.tp)
                saved_op = act.op_saved(spec, layer, sh, la, float8=recipe is not None)
                la = seen[memo] = act.op_checkpointed(la, saved_op)
            else:
                eager = recipe is None and not tech.adapter and not sh.compiled
                mode = setup.checkpointing if wrapped else Checkpointing.NONE
                la = _steps.checkpointed_layer(la, spec, sh, par, mode, eager_mlp=eager)
                seen[memo] = la
        whole = kept == mp.cdiv(written, par.tp) and not _fsdp2.shards_written_grads(par)  # all stay (.grad)
        offloaded += count * la.saved_bytes if setup.activation_offload else 0  # before the device's view
        if setup.activation_offload or setup.optimizer_in_backward:
            la, kept = _lowbit.step_tricks(la, kept, setup, st.in_backward_step)
        mlp = spec.groups[i].layer.mlp
        alive = 0 if mlp.is_moe or spec.groups[i].layer.derived else act.backward_gradients_alive(mlp)
        # gradients that AccumulateGrad adds into
        in_place = whole or _fsdp2.accumulates_in_place(
            tech, par, skips_grad_sync(setup, fsdp2=par.is_fsdp2), _fsdp2.reduce_dt(tech, setup)
        )
        groups.append(GroupCost(
            count=count, saved=la.saved_bytes, grads=kept, backward_transient=la.backward_transient,
            recompute=la.recompute, forward_transient=la.forward_transient, freed=la.backward_freed,
            grads_in_flight=la.backward_grads if whole else 0,
            resident_credit=in_place_credit(la.backward_freed, la.backward_grads, alive) if in_place else 0,
            forward_sizes=la.forward_sizes, recompute_sizes=la.recompute_sizes,
            backward_sizes=la.backward_sizes + ((la.backward_grads,) if not whole else ()),
            kept=_frozen.kept_per_layer(la.layer_input) if keeps and wrapped else 0,
        ))  # fmt: skip
        layer_items.append((count, la.saved))
    embed: tuple[MemoryItem, ...] = ()
    if st.sp.stage == 0:
        embed = act.embedding_items(spec, sh)
        if tech.adapter:
            embed = _lora.adapt_embedding_items(spec, embed, setup, sh.memo)
    return Parts(layer_items=tuple(layer_items), groups=tuple(groups), head_items=head_items,
                  embed_items=embed, offloaded=offloaded)  # fmt: skip


SRC_INFLIGHT = "Narayanan et al. 2021 §2.2: 1F1B warm-up micro-batches"


def _step_at(
    st: Static, setup: TrainingSetup, par: Parallelism, costs: CostLookup, memo: Memo
) -> tuple[act.Shapes, _steps.StepAt]:
    """The rank's shapes and its step's activations at ``setup``'s sequence length."""
    spec, tech = st.tech.spec, st.tech
    split = par.cp * par.ulysses  # ranks that split one sequence (ring CP, Ulysses)
    local = setup if split == 1 else replace(setup, seq_len=setup.seq_len // split)
    sh = act.shapes(spec, local, costs, memo)
    if st.sp.stage == par.pp - 1:
        head = head_activations(spec, sh, _head_weight_numel(spec))
        if tech.adapter:
            head = _lora.adapt_head(spec, head, sh, setup)
        if setup.loss is LossImpl.STANDARD:  # the framework's own loss (peakmem.formulas.profiles)
            head = framework_head(spec, head, sh, setup)
        head = mp.tp_head_activations(quantized_head(spec, _lowbit.adapt_head_loss(spec, head, sh, setup), sh,
                                                     setup), par)  # fmt: skip
        norm_bwd = final_norm_backward(spec, sh, head, par.tp if par.sequence_parallel else 1)
        head_items, head_fwd = head.saved, head.forward_transient
        head_bwd = max(head.backward_transient, norm_bwd)  # the CE gradients, or the final norm's after them
        logits_grad, head_in_model = head.logits_grad, head.in_model
    else:  # a middle stage receives its output gradient from the next stage
        hidden = mp.cdiv(sh.tokens * spec.hidden_size * sh.c, par.tp if par.sequence_parallel else 1)
        head_items, head_fwd, head_bwd, logits_grad, head_in_model = (), 0, hidden, 0, 0
    parts = _parts(st, setup, sh, head_items, par)
    return sh, _steps.StepAt(parts=parts, head_fwd=head_fwd, head_bwd=head_bwd, logits_grad=logits_grad,
                             head_in_model=head_in_model)  # fmt: skip


def _varying_growth(
    st: Static, setup: TrainingSetup, par: Parallelism, ov: Overheads, at: _steps.StepAt, costs: CostLookup,
    memo: Memo,
) -> int | None:  # fmt: skip
    """``--padded-lengths varying``: what the replay at rising lengths reserves above the fixed step
    (formulas/padded_lengths.py); None where the step is not replayed."""
    if not _steps.lengths_replayable(st, setup, par, ov):
        return None
    ats = tuple(
        at if n == setup.seq_len else _step_at(st, replace(setup, seq_len=n), par, costs, memo)[1]
        for n in _padded.lengths(setup.seq_len, longest_first=_padded.first_is_longest(setup))
    )
    return _steps.varying_growth(st, setup, par, at, ats, ov.alloc_roundup_divisions)


def _estimate(
    st: Static, setup: TrainingSetup, par: Parallelism, role: str, ov: Overheads, asked: TrainingSetup,
    costs: CostLookup, memo: Memo,
) -> Estimate:  # fmt: skip
    tech, rs, sp = st.tech, st.states, st.sp
    spec = tech.spec
    first, last = sp.stage == 0, sp.stage == par.pp - 1
    in_bwd = _lowbit.in_backward(setup)
    sh, at = _step_at(st, setup, par, costs, memo)
    parts, head_fwd, head_bwd, logits_grad = at.parts, at.head_fwd, at.head_bwd, at.logits_grad
    hidden = mp.cdiv(sh.tokens * spec.hidden_size * sh.c, par.tp if par.sequence_parallel else 1)
    held = _held.loop_held(spec, setup, sh) if par.tp == par.pp == 1 else _held.NOTHING  # Lit-GPT's loop
    before = _held.NOTHING if _padded.first_is_longest(setup) else held  # alive at this batch's forward
    in_flight = mp.in_flight_microbatches(par, sp.stage, setup.grad_accum)
    # 1F1B whose warm-up runs every micro-batch (m <= pp - stage): every forward runs before the first
    # backward, so no gradient exists yet in forward (torch schedules.py Schedule1F1B: warmup_chunks)
    warm_only = (
        par.pp > 1 and par.pp_schedule is PipelineSchedule.ONE_F_ONE_B and setup.grad_accum <= in_flight
    )
    resident = (setup.grad_accum > 1 and not warm_only) or not setup.grads_set_to_none
    base_items, base_bytes = st.resident_items, st.resident_bytes
    if warm_only and setup.grads_set_to_none and setup.grad_accum > 1:
        base_items = tuple(i for i in base_items if i not in rs.accumulated)
        base_bytes -= sum(i.bytes for i in rs.accumulated)
    logits = mp.cdiv(sh.tokens * spec.vocab_size * sh.c, par.tp)  # the last stage's output
    whole = sh.tokens * spec.hidden_size * sh.c  # a Linear's T x h output (a partial sum under TP)
    pipe = _pipe.stage_pipeline(par, sp.stage, setup.grad_accum, hidden, logits, in_flight, whole)
    recv, p2p_path, p2p_src = pipe.recv, pipe.path, pipe.source
    head_saved = sum([i.bytes for i in parts.head_items])
    embed_saved = sum([i.bytes for i in parts.embed_items])
    per_mb = sum(g.count * g.saved for g in parts.groups) + embed_saved + head_saved

    def in_flight_items(more: float) -> list[MemoryItem]:
        extra_mb = int(per_mb * more)
        return [MemoryItem(path=f"activations of {more:g} more micro-batches in flight (pipeline)",
                           category=Category.ACTIVATIONS, bytes=extra_mb, source=SRC_INFLIGHT,
                           key="pipeline.in_flight")] if extra_mb else []  # fmt: skip

    pipeline = in_flight_items(in_flight - 1)

    # --- forward: everything saved, then the logits and their fp32 copy at the loss
    # FSDP2: a unit's unshard (before it saves anything) and its run add unsharded bytes (rank_states)
    rowwise_copy = mp.dtensor_rowwise_copy(par, hidden, whole)
    all_saved = _steps.activation_items(parts, layers_left=None)

    def p2p(nbytes: int) -> MemoryItem:
        return MemoryItem(path=p2p_path, category=Category.TEMPORARIES, bytes=nbytes, source=p2p_src,
                          key="pipeline.p2p")  # fmt: skip

    # the embedding output, held by the HF model's forward (modeling_llama.py ``LlamaModel.forward``:
    # ``inputs_embeds``) through every layer, where neither the first norm (a 16-bit residual stream) nor a
    # checkpoint saves it (a pipeline stage's loop rebinds it: torchtitan, measure/parallel.py _Stage)
    embeds = mp.cdiv(sh.tokens * spec.hidden_size * sh.r, par.tp if par.sequence_parallel else 1)
    first_kept = setup.checkpointing is Checkpointing.FULL and st.wrapped[:1] == (True,)  # its input saved
    unsaved = not act.input_saved_by_layer(spec, sh) and not first_kept
    embeds_held = embeds if first and par.pp == 1 and unsaved else 0

    def forward_phase(run: int, unshard: int, more: int, pipe_bytes: int, base: tuple[MemoryItem, ...],
                      pipeline: list[MemoryItem]) -> PhasePeak:  # fmt: skip
        layer = max([max(g.forward_transient + run + rowwise_copy, unshard - g.saved) for g in parts.groups],
                    default=0) + embeds_held  # fmt: skip
        in_model = max(layer + more - head_saved, pipe.stage_output, at.head_in_model)  # a layer, the head
        extra, kept = _held.forward_peak(before, at_loss=head_fwd, in_model=in_model)
        return _phase(Phase.FORWARD, [
            *rs.gathered_forward, *pipeline, *all_saved, *st.weight_cache, *kept,
            MemoryItem(path="forward temporaries (logits and their fp32 copy, or a layer's interior)",
                       category=Category.TEMPORARIES, bytes=extra, source=SRC_FORWARD_TMP,
                       key="forward.temporaries"), p2p(pipe_bytes),
        ], base=base, base_bytes=sum(i.bytes for i in base))  # fmt: skip

    forward = forward_phase(rs.layer_forward_extra, rs.layer_unshard_extra, pipe.forward_layer, pipe.forward,
                            base_items, pipeline)  # fmt: skip
    pools = rs.side_pools  # FSDP: what of its side streams' pools is alive at the forward peak
    fwd_gathered = pools.in_use if par.pp == 1 else 0  # the kept one (none after PP's first micro-batch)
    if rs.first_unshard:  # FSDP2: the first layer unit's unshard, next to the root's all-gather output
        start = _phase(Phase.FORWARD, [*_fsdp.first_unshard_items(rs), *parts.embed_items, p2p(recv)],
                       base=base_items, base_bytes=base_bytes)  # fmt: skip
        fwd_gathered = pools.all_gather if start.bytes > forward.bytes else fwd_gathered
        forward = max(forward, start, key=_BYTES)
    if par.pp > 1 and rs.first_unshard:  # FSDP2 under PP: the step's first micro-batch unshards every unit
        no_grads = setup.grads_set_to_none and bool(rs.accumulated)  # none before its first backward
        base0 = tuple(i for i in st.resident_items if not (no_grads and i in rs.accumulated))
        first_mb = forward_phase(*_fsdp.pp_first_forward(rs, sp), 0, pipe.first_forward, base0, [])
        fwd_gathered = pools.in_use if first_mb.bytes > forward.bytes else fwd_gathered
        forward = max(forward, first_mb, key=_BYTES)

    # --- backward. CE backward: two fp32 T x V gradients next to the saved log-softmax output;
    # then the head's backward: the log-softmax output is freed, the logits gradient (compute
    # dtype) is alive while the head's weight gradient is written.
    start_written, start_kept, end_written, end_kept, tied_tmp = st.outer
    groups = _fsdp.backward_groups(parts.groups, rs)
    root_held = start_written if rs.root_grads_deferred else 0  # FSDP1/FSDP2: whole until the end
    p2p_item = p2p(pipe.backward)
    # the vocab-parallel embedding's gradient is whole (DTensor); kept until the step, and between
    # micro-batches (there in forward and backward too) when gradients are resident
    whole_embed = mp.dtensor_embedding_grad_extra(spec, par, first, tech.grad.nbytes, bool(tech.adapter))
    embed_grad = MemoryItem(path="TP: the embedding's gradient is whole (vocab not split)",
                            category=Category.GRADIENTS, bytes=whole_embed, source=mp.SRC_DTENSOR_EMBED,
                            key="tp.embedding_grad")  # fmt: skip

    def backward_phase(
        resident: bool,
        base: tuple[MemoryItem, ...],
        base_bytes: int,
        pipeline: list[MemoryItem],
        p2p_item: MemoryItem = p2p_item,
    ) -> tuple[PhasePeak, BackwardPeak]:
        tail = (
            tied_tmp
            + (end_written if resident or in_bwd else end_written - end_kept)
            + rs.root_backward_extra
        )
        # FSDP1: the root's flat gradient cat at the end, where the layer units are resharded (fsdp1_root)
        cat = _root1.flat_grad_extra(rs.root_flat_grad, tied_tmp + root_held + tail)
        units = _frozen.backward_units(rs.gathered_backward, par, bool(tech.adapter), sp.layers)
        credit = _root1.resharded_at_tail(par, units, tail + cat) if cat else 0
        bp = backward_peak(
            groups[::-1], base_saved=embed_saved, head_saved=head_saved,
            start_extra=max(max(head_bwd, logits_grad + start_written + tied_tmp) + rs.backward_start_extra,
                            rs.backward_root_unshard),
            start_grads=0 if in_bwd else start_kept,
            tail_extra=tail + cat - credit,
            tail_grads=0 if resident or in_bwd else end_kept, grads_resident=resident,
            held=tied_tmp + root_held, kept_in_transient=_frozen.incoming_gradient(groups),
        )  # fmt: skip
        engine_bwd = [i for i in rs.grads_backward if not (resident and i in rs.accumulated)]
        layers = sum(g.count for g in groups)
        at_tail = not bp.at_start and bp.layers_done == layers
        bwd_items = _steps.backward_items(parts, bp, resident, all_saved)
        bwd_items = _fsdp.root_items(bwd_items, root_held, par.fsdp_version, cat * at_tail, credit * at_tail)
        if rs.layer_backward_extra and not bp.at_start and bp.layers_done < layers:
            extra = _fsdp.layer_extra(rs, bp.layers_done, layers)
            bwd_items = _fsdp.backward_items(bwd_items, extra, rs.layer_backward_item)
        gathered = [i for i in units if not (at_tail and credit and i.key in _root1.RESHARDED_KEYS)]
        items = [*engine_bwd, *gathered, *pipeline, *bwd_items, p2p_item,
                 *((embed_grad,) if resident else ())]  # fmt: skip
        return _phase(Phase.BACKWARD, items, base=base, base_bytes=base_bytes), bp

    backward, bp = backward_phase(resident, base_items, base_bytes, pipeline)
    if warm_only and setup.grad_accum > 1 and setup.grads_set_to_none:
        # the second backward of an all-warm-up 1F1B stage: every gradient exists (the first backward
        # wrote them), one micro-batch fewer in flight (torch schedules.py Schedule1F1B: B1, B2, ...)
        second, bp2 = backward_phase(
            True,
            st.resident_items,
            st.resident_bytes,
            in_flight_items(in_flight - 2),
            replace(p2p_item, bytes=pipe.second_backward),
        )
        if second.bytes > backward.bytes:
            backward, bp = second, bp2
    if rs.reduce_after_backward and setup.grads_set_to_none:  # FSDP2 under PP: after the last backward
        reduce = _phase(Phase.BACKWARD, [*rs.gathered_backward, *_fsdp.pp_reduce_items(rs),
                                         replace(p2p_item, bytes=recv)],
                        base=st.resident_items, base_bytes=st.resident_bytes)  # fmt: skip
        backward = max(backward, reduce, key=_BYTES)

    # --- optimizer step (step 1 creates the states inside it, so it peaks the same)
    step = st.optimizer_phase  # copied: results are not frozen, so none is shared between estimates
    optimizer = _held.at_step(PhasePeak(phase=Phase.OPTIMIZER, bytes=step.bytes, items=step.items), held)
    if whole_embed:
        optimizer = _plus(optimizer, embed_grad)
        forward = _plus(forward, embed_grad) if resident else forward
    if recv:  # the pipeline's receive buffers stay allocated through the step
        optimizer = _plus(optimizer, MemoryItem(path="pipeline receive buffers (one per micro-batch)",
                                                category=Category.TEMPORARIES, bytes=recv,
                                                source=_pipe.SRC_TORCH_PP, key="pipeline.p2p"))  # fmt: skip
    # PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions: every block rounded up further (block_rounding.py)
    forward, backward, optimizer = (_rounding.with_roundup(p, spec, ov.alloc_roundup_divisions, memo)
                                    for p in (forward, backward, optimizer))  # fmt: skip
    phases = (forward, backward, optimizer)
    peak = max(phases, key=_BYTES)
    loaded = _load.load_phase(st, setup, par, ov)  # torchtune's to_nf4, MXFP4, a bitsandbytes base
    load, load_reserved = loaded if loaded is not None else (None, 0)
    top = peak if load is None or load.bytes <= peak.bytes else load
    churn = peak.bytes - st.persistent
    reserved = allocator.reserved_bytes(
        resident=st.persistent, resident_rounding=st.resident_rounding,
        churn=churn, fragmentation=ov.fraction, expandable=ov.expandable_segments,
    )  # fmt: skip
    if par.zero_stage:  # DeepSpeed ZeRO: what of its pools the peak's items hold (formulas/zero_streams.py)
        side = _zs.idle_bytes(pools, peak.items)
    else:
        # FSDP's side-stream pools (formulas/stream_pools.py), less what of them the peak holds: the
        # sharded gradients exist at the step, between micro-batches and as backward writes them
        one_stage = par.pp == 1
        grads_kept = peak is optimizer or (resident and one_stage) or not setup.grads_set_to_none
        written = bp.grads_so_far if peak is backward and one_stage else 0
        gathered = fwd_gathered if peak is forward else pools.in_use * one_stage
        side = _fsdp2.idle_pool_bytes(pools, grads_alive=pools.reduce_scatter if grads_kept else written,
                                      gathered_alive=0 if peak is optimizer else gathered)  # fmt: skip
    replayed = _steps.replayed_reserved(st, setup, par, ov, parts, head_fwd, head_bwd, logits_grad)
    over_closed = 0  # what the replay adds to the closed form
    if replayed is not None:
        # the replay sees the estimate's tensors only; a real step allocates many more short-lived ones
        # (simulate's trace of qwen3-0.6b: ~3x the 4-8 MiB requests), whose slack the calibrated fraction
        # (DEFAULT_FRAGMENTATION, bert-large V100 nvidia-smi) covers: the closed form is the floor, the
        # replay adds the segments one phase cuts that another cannot reuse. A sharded rank's replay
        # is its default stream's: the side streams' pools stand beside it whole
        over_closed = max(0, replayed + pools.total - reserved - side)
        reserved += over_closed
    varying: tuple[str, ...] = ()
    fixed = reserved  # the fixed-length step's: what the longest batch needs once the cache is freed
    if setup.padded_lengths is PaddedLengths.VARYING:  # batches padded to their longest sample
        growth = _varying_growth(st, setup, par, ov, at, costs, memo)
        reserved += growth or 0
        longest = _padded.first_is_longest(setup)
        said = _padded.NOT_REPLAYED if growth is None else _padded.note(growth, fmt_gb(growth), longest)
        varying = (said, *((_padded.LONGEST_FIRST_NOTE,) if longest else ()))
    reserved = max(reserved + side, load_reserved)  # the step reuses the segments the load cut
    releasable = reserved - max(fixed + side, load_reserved)  # freed before an OOM (padded_lengths RELEASE)
    notes = st.notes.get(ov)
    if notes is None:
        if len(st.notes) >= 64:
            st.notes.clear()
        notes = st.notes[ov] = (
            step_assumptions(tech, setup, sh, ov)
            + st.assumptions
            + rs.notes
            + ((_frozen.NOTE,) if any(g.kept for g in parts.groups) else ())
            + (() if replayed is None else (_steps.REPLAY_NOTE if st.single else _steps.REPLAY_NOTE_SHARDED,))
        )
    step1 = max(forward.bytes - st.states_bytes, backward.bytes - st.states_bytes, optimizer.bytes)
    nccl = _nccl.communicators(par) * _nccl.nccl_communicator_bytes()
    extra: dict[str, object] = {
        "step1_peak_allocated_bytes": step1,
        "backward_peak_layers_done": bp.layers_done,
        "context_bytes": ov.context_bytes,
        "cublas_workspace_bytes": ov.cublas_workspace_bytes,
        "fragmentation": ov.fraction,
        **({"side_stream_pool_bytes": side} if side else {}),
        **({"releasable_cache_bytes": releasable} if releasable else {}),
        **({"paged_optimizer_bytes": st.unified_bytes} if st.unified_bytes else {}),
        **({"expandable_segments": True} if ov.expandable_segments else {}),
        **({"alloc_roundup_divisions": ov.alloc_roundup_divisions} if ov.alloc_roundup_divisions else {}),
        **({"profile": ov.profile} if ov.profile is not None else {}),
    }
    if setup.activation_offload:
        extra["cpu_activation_bytes"] = int(parts.offloaded * in_flight)
    rank_notes: tuple[str, ...] = ()
    if not st.single:
        extra.update(role=role, stage=sp.stage, local_params=sp.numel, in_flight_microbatches=in_flight,
                     nccl_bytes=nccl, cpu_pinned_bytes=sum(i.bytes for i in rs.cpu))  # fmt: skip
        rank_notes = (
            f"{role} (pipeline stage {sp.stage}): {sp.layers} layers, {sp.numel:,} local parameters",
        )
    out = dict(st.setup_json)
    out["micro_batch"], out["seq_len"] = setup.micro_batch, setup.seq_len  # _SHAPE_FIELDS
    for name in st.setup_json_nested:
        out[name] = asdict(getattr(setup, name))
    device_total = reserved + ov.context_bytes + ov.cublas_workspace_bytes + nccl + st.unified_bytes
    # what the other phases freed before the peak phase (forward/backward's activations and temporaries
    # when the optimizer step peaks, the step's temporaries when forward or backward does), and the
    # optimizer states step 1 creates lazily (torch.optim: zeros_like in _init_group) into cached blocks
    others = (forward, backward) if peak is optimizer else (optimizer,)
    freed = max(_step_band.transient_bytes(p) for p in others)
    lazy = st.states_bytes if not par.zero_stage else 0  # DeepSpeed builds its states at initialize()
    band = _step_band.training_band(
        allocated=top.bytes, reserved=reserved, device_total=device_total, churn=churn,
        other_churn=max(freed, min(lazy, max(forward.bytes, backward.bytes) - st.persistent)), ov=ov,
        communicators=_nccl.communicators(par), nccl_bytes=nccl, engine_high=rs.engine_band_high,
        fused_step_delta=(
            _step_band.fused_step_delta(setup, forward, backward, optimizer) if peak is optimizer else 0
        ),
        loss_order=_step_band.loss_order_deltas(setup, logits_grad, bp, phases, peak) if last else (0, 0),
        replayed=over_closed,
        published=_band.measured_residual_term(
            _band.training_kind(gpus=par.gpus, adapters=setup.method is not Method.FULL,
                                quantized=quant_of(setup) is not None,
                                galore=setup.optimizer is OptimizerName.GALORE_ADAMW),
            top.bytes,
        ),
    )  # fmt: skip
    return Estimate(
        method=METHOD, job="train", model_name=spec.name, params=tech.params,
        trainable_params=tech.trainable, per_param=st.table, items=top.items,
        phases=phases if load is None else (load, *phases),
        peak_phase=top.phase, peak_allocated_bytes=top.bytes, peak_reserved_bytes=reserved,
        device_total_bytes=device_total,
        assumptions=rank_notes + notes + varying + fallback_note(spec, asked, setup), setup=out, extra=extra,
        band=band,
    )  # fmt: skip


def with_alternatives(
    spec: ModelSpec,
    setup: TrainingSetup,
    est: Estimate,
    gpus: Iterable[object],
    *,
    overheads: Overheads | None = None,
    par: Parallelism | None = None,
    costs: CostLookup | None = None,
) -> Estimate:
    """``est`` with a band term for each alternative the question leaves open, the allocated difference of
    re-estimating it: ``attention_kernel`` where a named GPU predates Ampere (``Gpu.pre_ampere``) and the
    setup asks for SDPA or flash (there SDPA may fall back to the math kernel, the scores materialised as
    eager attention does); ``loop_order`` where the loop runs its longest batch first
    (formulas/padded_lengths.py ``first_is_longest``): a later long batch may follow another long one, whose
    leftovers the loop keeps (the fixed-length step, every batch ``--seq`` long)."""
    if est.band is None:
        return est
    estimator = TrainingEstimator(spec, overheads, costs=costs)
    terms = []
    if setup.attention is not AttentionKernel.EAGER and any(getattr(g, "pre_ampere", False) for g in gpus):
        alt = estimator.estimate(replace(setup, attention=AttentionKernel.EAGER), par)
        delta = alt.peak_allocated_bytes - est.peak_allocated_bytes
        if par is not None and est.extra.get("role") != alt.extra.get("role"):
            delta = max(0, delta)
        terms.append(_band.kernel_term(low_delta=delta, high_delta=delta, source=_band.SRC_KERNEL_PRE_AMPERE))
    if _padded.first_is_longest(setup):
        alt = estimator.estimate(replace(setup, padded_lengths=PaddedLengths.FIXED), par)
        terms.append(_band.loop_order_term(max(0, alt.peak_allocated_bytes - est.peak_allocated_bytes)))
    return replace(est, band=_band.with_terms(est.band, tuple(terms))) if terms else est


_BYTES = attrgetter("bytes")
