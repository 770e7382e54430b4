"""What one rank's training step is made of, for :mod:`peakmem.estimate`: its shape-independent part
(:class:`Static`, memoised by a :class:`~peakmem.estimate.TrainingEstimator`), its activations at the
setup's shapes (:class:`Parts`), the items they show at each instant, and the step written tensor by
tensor for the caching-allocator replay that gives the reserved bytes (formulas/step_sequence.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from peakmem.breakdown import Category, MemoryItem, PerParamRow, PhasePeak
from peakmem.formulas import activations as act
from peakmem.formulas import allocator, sharding
from peakmem.formulas import fsdp2 as _fsdp2
from peakmem.formulas import lowbit_optim as _lowbit
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import step_sequence as _seq
from peakmem.formulas.activations import float8 as _f8
from peakmem.formulas.fsdp1_frozen_inputs import SRC_FROZEN_INPUTS
from peakmem.formulas.optimizer import PER_PARAM_TEMPORARIES
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.technique import Technique
from peakmem.formulas.timeline import BackwardPeak, GroupCost
from peakmem.model import ModelSpec, Tensor
from peakmem.parallel import FsdpMode, Offload, Parallelism
from peakmem.training import Checkpointing, LossImpl, OptimizerName, TrainingSetup


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
    unified_bytes: int  # a paged optimizer's states in CUDA unified memory: on the device, not torch's
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
REPLAY_NOTE_SHARDED = REPLAY_NOTE + (
    "; one FSDP rank's default stream (sharded parameters and states, each unit's unsharded parameters, "
    "gradients and reduce-scatter input as torch 2.13 allocates them), with FSDP's side-stream pools "
    "beside it"
)


def replayable(
    st: Static, setup: TrainingSetup, par: Parallelism, ov: Overheads, *, adapters: bool = False
) -> bool:
    """Where the step can be written tensor by tensor: full fine-tuning with a torch optimizer whose
    states are shaped like the parameters, no step tricks, no fraction or expandable segments asked for
    (those keep the closed form of formulas/allocator.py), and either one GPU or one rank of FSDP
    (FSDP2 full-shard, shard-grad-op or hybrid-shard; FSDP1 full-shard or hybrid-shard), alone or with
    TP (+SP) and CP, without pipeline parallelism (the data-parallel replica dimension changes nothing
    per rank). The sharded replay describes the default stream's requests only (:func:`sharded_parts`);
    FSDP's side-stream pools are priced apart (formulas/fsdp2.py ``StreamPools``).

    Not replayed, closed form: pipeline parallelism (in-flight micro-batches, units unsharded across
    them), DeepSpeed ZeRO (flat buckets and partitions), DDP and TP without an engine (their replicated
    gradients and buckets are not described), expert parallelism, FSDP1 shard-grad-op, offloaded
    parameters or optimizer states, LoRA/QLoRA (frozen
    base, adapter tensors), 8-bit/paged/4-bit optimizers and optimizer-in-backward, activation offloading,
    Adafactor (factored states, not shaped like the parameters). ``adapters``: LoRA/QLoRA taken too
    (:func:`lengths_replayable`)."""
    common = (
        (adapters or not st.tech.adapter) and ov.replay_reserved and not ov.expandable_segments
        and not _lowbit.handles(setup) and not _lowbit.in_backward(setup)
        and not setup.activation_offload and setup.optimizer is not OptimizerName.ADAFACTOR
    )  # fmt: skip
    if not common:
        return False
    if st.single and par.is_single_gpu:
        return True
    return (
        par.fsdp is not FsdpMode.NONE and par.pp == 1 and par.ep == 1 and par.zero_stage == 0
        and not (par.fsdp_version == 1 and par.fsdp is FsdpMode.SHARD_GRAD_OP)
        and par.offload_params is Offload.NONE and par.offload_optimizer is Offload.NONE
    )  # fmt: skip


def pieces(items: Iterable[MemoryItem]) -> tuple[int, ...]:
    """The tensor sizes of ``items`` (:func:`peakmem.formulas.activations.tensor_sizes`)."""
    return act.tensor_sizes(items)


def split(nbytes: int, unit: int) -> tuple[int, ...]:
    """``nbytes`` as tensors of about ``unit`` bytes (a transient known by its sum only)."""
    if nbytes <= 0:
        return ()
    n = max(1, -(-nbytes // max(1, unit)))
    return (nbytes // n,) * n


def sized(sizes: tuple[int, ...], nbytes: int, unit: int) -> tuple[int, ...]:
    """A layer's transient of ``nbytes`` as its tensors: ``sizes`` (the formulas' tensors at their sizes:
    :class:`~peakmem.formulas.activations.LayerActivations` ``forward_sizes`` etc.) where they add up to
    it, else :func:`split` into parts of ``unit`` (a transient the formulas know as a sum only: a net
    forward peak beyond the saved tensors, a TP rank's split, an MoE's or a post-norm's backward, a
    derived block's measured costs, one a technique changed). Equal parts a few MiB below a saved
    tensor cannot hold it: Llama-3.1-8B under op-level SAC cut its 960 MiB eager forward interior into
    5 x 192 MiB next to 224 MiB saved gate outputs, a new segment every layer."""
    known = tuple(n for n in sizes if n > 0)
    return known if known and sum(known) == nbytes else split(nbytes, unit)


# Replaying costs time in proportion to the layers, and past a few identical layers each further one
# cuts the same segments. A model of more than EXACT_LAYERS layers is replayed with its groups cut to
# REPLAY_LAYERS and to twice that, and the reserved bytes extrapolated linearly to the real counts.
# benchmarks/reserved_vs_replay.py --exact: on the catalog's models of more than 48 layers (llama-3.1-70b,
# qwen2.5-72b, opt-66b, falcon-40b, gemma-3-27b, ...) the extrapolation moves reserved by at most 0.2 %;
# on 24-36-layer models with large vocabularies it can move it by 5 % (the logits' blocks make the
# per-layer increments uneven), so those are replayed whole. A sharded rank (FSDP) is always replayed
# whole: with few saved bytes per layer (checkpoints) next to GiB-sized transients and loss blocks, the
# checkpoints fill the cached blocks of earlier requests unevenly, a new segment every few layers, and
# the line through the 8- and 16-layer replays moved reserved by -8 % .. +25 % against the whole replay
# (Llama-3.1-70B/405B, Qwen2.5-72B at FSDP x TP 1/2/4/8, batch 1-8 x 8192, full checkpointing; 0.1 %
# for the 70B and 72B at TP 1, batch 1), which costs 0.02-0.08 s a replay for 80-126 layers.
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
        step = step_tensors(st, setup, parts, head_fwd, head_bwd, logits_grad, counts, par)
        return _seq.replay_steps(replace(step, roundup_divisions=ov.alloc_roundup_divisions)).reserved

    return _by_layers(st, replay, exact=exact)


def _by_layers(st: Static, replay: Callable[[tuple[int, ...]], int], *, exact: bool = False) -> int:
    """``replay`` at the stage's layer counts, or extrapolated from :data:`REPLAY_LAYERS` and twice that."""
    counts = tuple(c for _, c in st.groups)
    few = tuple(min(c, REPLAY_LAYERS) for c in counts)
    more = tuple(min(c, 2 * REPLAY_LAYERS) for c in counts)
    if exact or not st.single or sum(counts) <= EXACT_LAYERS or more == counts:
        return replay(counts)
    r1, r2 = replay(few), replay(more)
    extrapolated = r2 + (r2 - r1) * (sum(counts) - sum(more)) // (sum(more) - sum(few))
    return -(-extrapolated // allocator.K_ROUND_LARGE) * allocator.K_ROUND_LARGE


@dataclass(frozen=True, kw_only=True)
class StepAt:
    """The step's activations at one sequence length (what :func:`step_tensors` needs besides the
    static part)."""

    parts: Parts
    head_fwd: int
    head_bwd: int
    logits_grad: int
    head_in_model: int = 0  # the head's peak inside the model (HeadActivations.in_model)


def lengths_replayable(st: Static, setup: TrainingSetup, par: Parallelism, ov: Overheads) -> bool:
    """Where ``--padded-lengths varying`` is replayed: where the step is (:func:`replayable`), and on one
    GPU LoRA/QLoRA too (the frozen base as loaded, the adapters' gradients, states and temporaries:
    :func:`step_tensors`); their fixed-length reserved keeps the closed form, the replays give only
    what the lengths add."""
    if replayable(st, setup, par, ov):
        return True
    return (
        st.tech.adapter and st.single and par.is_single_gpu and replayable(st, setup, par, ov, adapters=True)
    )


def varying_growth(
    st: Static, setup: TrainingSetup, par: Parallelism, fixed: StepAt, at_lengths: tuple[StepAt, ...],
    divisions: int = allocator.NO_ROUNDUP,
) -> int:  # fmt: skip
    """What batches padded to varying lengths (formulas/padded_lengths.py) reserve above the fixed-length
    step: the replay of ``at_lengths`` (rising to the longest, then the longest again) through one
    allocator state, less the fixed step's two-step replay; at least 0. ``divisions``:
    roundup_power2_divisions."""

    def step(at: StepAt, counts: tuple[int, ...]) -> _seq.StepTensors:
        tensors = step_tensors(st, setup, at.parts, at.head_fwd, at.head_bwd, at.logits_grad, counts, par)
        return replace(tensors, roundup_divisions=divisions)

    base = _by_layers(st, lambda counts: _seq.replay_steps(step(fixed, counts)).reserved)
    ramp = _by_layers(
        st, lambda counts: _seq.replay_lengths(tuple(step(at, counts) for at in at_lengths)).reserved
    )
    return max(0, ramp - base)


def step_tensors(
    st: Static, setup: TrainingSetup, parts: Parts, head_fwd: int, head_bwd: int, logits_grad: int,
    counts: tuple[int, ...], par: Parallelism | None = None,
) -> _seq.StepTensors:  # fmt: skip
    """The step tensor by tensor, with ``counts`` layers in each of the stage's groups; one FSDP rank's
    default stream where ``par`` is sharded (:func:`sharded_parts`)."""
    tech = st.tech
    spec = tech.spec

    def sizes(tensors: Iterable[Tensor], count: int = 1) -> list[int]:  # elements of each tensor
        return [t.numel // t.copies for t in tensors for _ in range(t.copies * count)]

    def flat(tsp: ModelSpec) -> tuple[list[int], list[int], list[list[int]], list[int]]:
        first = sizes(t for t in tsp.outer if t.component in ("embeddings", "positions"))
        last = sizes(t for t in tsp.outer if t.component not in ("embeddings", "positions"))
        layer_numel = [sizes(tsp.groups[i].layer.tensors) for i, _ in st.groups]
        layers = [n for count, per in zip(counts, layer_numel, strict=True) for n in per * count]
        return first, last, layer_numel, first + layers + last

    # the trainable tensors (the whole model, or LoRA's adapters: tech.tspec has the same layer groups)
    first, last, layer_numel, numel = flat(tech.tspec)
    weight, grad, master = tech.weight.nbytes, tech.grad.nbytes, tech.master
    frozen: list[int] = []  # LoRA/QLoRA: the frozen base, each tensor its share of the stored bytes
    if tech.frozen is not None:
        base = tech.frozen
        frozen = [base.bytes * n // max(1, base.params) for n in flat(spec)[3]]
    states = [r for r in tech.state_rows if r.params]
    temps: list[int] = []
    for item in st.states.step:
        if item.key in PER_PARAM_TEMPORARIES:  # one per parameter, in proportion to its elements
            temps += [item.bytes * n // tech.trainable for n in numel]
        else:
            temps += pieces((item,))
    sharded = par is not None and par.fsdp is not FsdpMode.NONE
    # a layer's transients at their tensors' sizes where the formulas list them (:func:`sized`); one
    # known by its sum only is cut into tensors of the largest saved one; under TP the layer's
    # transients hold whole T x H tensors (SP's all-gathered norm output, a row-parallel Linear's
    # partial sum) larger than any saved shard: those are cut at the head input's T x H
    lm_in = sum(i.bytes for i in parts.head_items if i.key == "head.lm_head_input")
    whole = lm_in if par is not None and par.tp > 1 else 0
    layers = []
    for g, la_items, per, count in zip(parts.groups, parts.layer_items, layer_numel, counts, strict=True):
        saved = pieces(la_items[1])
        unit = max(max(saved, default=0), whole)
        in_flight = g.grads_in_flight or 0
        layers.append(_seq.LayerTensors(
            count=count, saved=saved, forward_extra=sized(g.forward_sizes, g.forward_transient, unit),
            backward_extra=sized(g.recompute_sizes, g.recompute, unit)
            + sized(g.backward_sizes, g.backward_transient + g.freed - in_flight, unit),
            grads=tuple(grad(n) for n in reversed(per)),
        ))  # fmt: skip
    backward_order = last[::-1] + [
        n for count, per in zip(counts[::-1], layer_numel[::-1], strict=True) for n in per[::-1] * count
    ]
    backward_order += first[::-1]  # fmt: skip
    tied = st.outer[4]
    step = _seq.StepTensors(
        weights=(*frozen, *(weight(n) for n in numel), tech.buffers),
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
    if par is None or par.is_single_gpu:
        return step
    return sharded_parts(st, setup, par, parts, step, counts, logits_grad) if sharded else step


SRC_FSDP2_DEFAULT_STREAM = (
    "torch 2.13 torch/distributed/fsdp/_fully_shard: _fsdp_param.py _init_sharded_param (padded shard per "
    "parameter), _fsdp_collectives.py foreach_all_gather_copy_out (alloc_all_gather_outputs on the current "
    "stream), foreach_reduce (reduce_scatter_comm.allocate on the current stream, then unsharded_grads."
    "clear()), _fsdp_param_group.py post_backward (reshard, reclaim reduce_scatter_states, reduce)"
)
SRC_FSDP1_DEFAULT_STREAM = (
    "torch 2.13 torch/distributed/fsdp/_flat_param.py (one padded flat shard per unit; unsharded flat "
    "parameter allocated in _runtime_utils.py _unshard inside stream(unshard_stream)); split_with_sizes "
    "backward concatenates the views' gradients into the flat gradient; _post_backward_hook reduces it "
    "inside stream(_post_backward_stream)"
)


def _padded(lt: mp.LocalTensor, n: int) -> int:
    """Elements of ``lt`` (TP-local) padded so that ``n`` ranks each hold ``ceil(dim0 / n)`` rows
    (FSDP2 ``Shard(0)``: _fsdp_param.py ``padded_sharded_param_size``; _fsdp_collectives.py
    ``_get_dim0_padded_size``)."""
    return n * mp.cdiv(lt.dim0, n) * lt.rest


def sharded_parts(
    st: Static, setup: TrainingSetup, par: Parallelism, parts: Parts, step: _seq.StepTensors,
    counts: tuple[int, ...], logits_grad: int,
) -> _seq.StepTensors:  # fmt: skip
    """One FSDP rank's step on its default stream (``step``: the same layers' activations at the
    rank's TP/SP/CP-local sizes, from :func:`step_tensors`). What lands where (torch 2.13):

    * FSDP2 (SRC_FSDP2_DEFAULT_STREAM): each parameter's padded shard (``ceil(dim0 / n)`` rows of its
      TP-local tensor) in the sharded dtype (fp32 under mixed precision: the shards are the master
      weights); the optimizer states and the step's temporaries on those shards; a unit's unsharded
      parameters, one tensor per parameter, allocated by the copy-out in ``wait_for_unshard`` on the
      current stream (the flat all-gather output is the copy-in stream's: StreamPools) and freed at its
      reshard (after forward; after its backward); autograd's unsharded gradients in the parameter dtype;
      at its ``post_backward`` the reshard, the previous unit's reduce-scatter input reclaimed
      (``reduce_scatter_max_input_buffers = 1``), its own allocated in the reduce dtype (``world x`` the
      padded shard; fsdp2.reduce_dt: accelerate's param dtype, torchtitan's
      ``mixed_precision_reduce = float32``) and the
      gradients freed after the copy-in; the reduce-scatter output (the sharded ``.grad``) is the
      reduce-scatter stream's; under torchao's float8 all-gather a converted Linear weight's unsharded
      parameter is its 1-byte float8 data (its cast before the all-gather is the copy-in stream's). The
      root unit (embeddings, final norm, head) is unsharded at the root's
      pre-forward, resharded after the model's forward (before a loss computed outside it, as torchtitan
      does), unsharded again by its pre-backward hook on the logits' gradient; its gradients stay
      whole until its post-backward at the end (fsdp2.root_backward), the embedding's whole ``V x H`` under
      TP (fsdp2.whole_embedding_grad); the final callback drops the last reduce-scatter input. Under
      shard-grad-op (``reshard_after_forward=False``) the units stay unsharded from forward to backward.
    * FSDP1 (SRC_FSDP1_DEFAULT_STREAM): one padded flat shard per unit (fp32) with its states; the
      unsharded flat parameter is the unshard stream's (StreamPools); per unit the views' gradients, then
      their concatenation into the padded flat gradient, which the post-backward hook reduces on its own
      stream and frees.

    Optimizer steps read the sharded gradients in place: no 16-bit gradient is replaced by an fp32 copy,
    and zero_grad frees only side-stream blocks. Under ``loss_parallel`` (TP with the standard loss) the
    loss's requests follow torch's handlers (:class:`~peakmem.formulas.step_sequence.StepTensors`
    ``loss_parallel``); the layers' transients are requested as :func:`step_tensors` requests them (at
    their TP-split sizes, :func:`sized`)."""
    tech = st.tech
    spec = tech.spec
    n = par.shard_degree
    shard_dt = tech.master or tech.weight
    reduce = _fsdp2.reduce_dt(tech, setup).nbytes
    gather, grad = tech.weight.nbytes, tech.grad.nbytes
    v2 = par.fsdp_version == 2

    def local(tensors: Iterable[Tensor], in_layer: bool) -> list[mp.LocalTensor]:
        return [mp.local_tensor(t, par, 1, in_layer=in_layer, vocab_size=spec.vocab_size) for t in tensors]

    first = local((t for t in spec.outer if t.component in ("embeddings", "positions")), False)
    last = local((t for t in spec.outer if t.component not in ("embeddings", "positions")), False)
    per_layer = [local(spec.groups[i].layer.tensors, True) for i, _ in st.groups]
    # FSDP2 float8 all-gather (torchao): a converted Linear weight's unsharded parameter is its 1-byte
    # float8 data (activations/float8.py); its pre-all-gather cast runs inside foreach_all_gather's
    # ``stream(all_gather_copy_in_stream)``, not on the default stream
    fp8 = [
        [setup.float8_all_gather and _f8.converted(spec, t) for t in spec.groups[i].layer.tensors]
        for i, _ in st.groups
    ]
    root = first + last
    if v2:
        shards = [mp.cdiv(lt.dim0, n) * lt.rest for lt in root[: len(first)]]
        shards += [mp.cdiv(lt.dim0, n) * lt.rest for c, per in zip(counts, per_layer, strict=True)
                   for lt in per * c]  # fmt: skip
        shards += [mp.cdiv(lt.dim0, n) * lt.rest for lt in last]
    else:  # a flat shard per unit: the root's, then one per layer
        flat_root = mp.cdiv(sum(lt.numel for lt in root), n)
        units = [
            sum(lt.numel for lt in per) for c, per in zip(counts, per_layer, strict=True) for _ in range(c)
        ]
        shards = [flat_root] + [mp.cdiv(u, n) for u in units]
    shards = [k for k in shards if k > 0]
    states = [r for r in tech.state_rows if r.params]
    temps: list[int] = []
    total = sum(shards)
    for item in st.states.step:
        if item.key in PER_PARAM_TEMPORARIES:  # rank_states sized them over the rank's shard
            temps += [item.bytes * k // total for k in shards]
        else:
            temps += pieces((item,))
    layers = []
    for g, per, conv in zip(step.layers, per_layer, fp8, strict=True):
        padded = sum(_padded(lt, n) for lt in per)
        unshard = [
            _f8.FP8 * _padded(lt, n) if c else gather(_padded(lt, n)) for lt, c in zip(per, conv, strict=True)
        ]
        layers.append(replace(
            g, grads=tuple(grad(lt.numel) for lt in reversed(per) if lt.numel),
            unshard=tuple(u for u in unshard if u) if v2 else (),
            reduce_input=reduce(padded) if v2 else 0,
            flat_grad=0 if v2 else grad(n * mp.cdiv(sum(lt.numel for lt in per), n)),
        ))  # fmt: skip
    # FSDP2 + TP: the vocab-parallel embedding's gradient is written whole (fsdp2.whole_embedding_grad)
    end = [grad(lt.numel) for lt in reversed(first)]
    if end and st.states.embedding_grad_extra:
        end[-1] += st.states.embedding_grad_extra
    root_numel = sum(lt.numel for lt in root)
    loss, gather_in, input_grad = _loss_parallel(parts, par, setup, logits_grad)
    return replace(
        step, weights=(*(shard_dt.nbytes(k) for k in shards), tech.buffers), masters=(),
        states=tuple(r.bytes * k // r.params for k in shards for r in states), layers=tuple(layers),
        head_grads=tuple(grad(lt.numel) for lt in reversed(last) if lt.numel), end_grads=tuple(end),
        master_grads=(), step_temporaries=tuple(temps), grads_resident=False, sharded=True,
        root_unshard=tuple(gather(_padded(lt, n)) for lt in root if lt.numel) if v2 else (),
        root_reduce=reduce(sum(_padded(lt, n) for lt in root)) if v2 else 0,
        root_flat_grad=0 if v2 else grad(n * mp.cdiv(root_numel, n)),
        keep_units=v2 and par.fsdp is FsdpMode.SHARD_GRAD_OP, loss_parallel=loss, head_gather=gather_in,
        head_input_grad=input_grad,
    )  # fmt: skip


def _loss_parallel(
    parts: Parts, par: Parallelism, setup: TrainingSetup, logits_grad: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The head's and the loss's requests on a TP rank under ``loss_parallel`` (the standard loss, whose
    saved log-softmax output is a ``T x V/tp`` fp32 shard): ``pred`` (the rank's 16-bit logits, the
    size of their gradient) and the fp32 shards of torch/distributed/tensor/parallel/loss.py; the SP
    all-gather of the head input (model_parallel.sp_head_gather: the gathered buffer and the norm
    output's shard) and the head's input gradient (model_parallel.tp_head_input_grad: a whole ``T x H``
    partial sum, then its reduce-scatter under SP or all-reduce without). Empty without TP or for
    another loss (fused, chunked, compiled: their own requests, kept as the one-GPU sequence sizes)."""
    if par.tp == 1 or setup.loss is not LossImpl.STANDARD:
        return (), (), ()
    fp32 = sum(i.bytes for i in parts.head_items if i.key == "loss.log_softmax")
    lm_in = sum(i.bytes for i in parts.head_items if i.key == "head.lm_head_input")
    if not fp32 or not lm_in or not logits_grad:
        return (), (), ()
    shard = mp.cdiv(lm_in, par.tp) if par.sequence_parallel else lm_in
    # pred: the rank's logits (the size of their gradient), then the fp32 shards
    return (logits_grad, fp32), (lm_in, shard) if par.sequence_parallel else (), (lm_in, shard)


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
    if bp.kept:
        items.append(MemoryItem(path=f"FSDP1 frozen units: the inputs of the {bp.layers_done} layers done "
                                     "and their gradients (kept to the end of backward)",
                                category=Category.ACTIVATIONS, bytes=bp.kept, source=SRC_FROZEN_INPUTS,
                                key="backward.fsdp1_frozen_inputs"))  # fmt: skip
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
