"""Model parallelism: what one rank holds under tensor, sequence, pipeline, context and expert
parallelism, before any data-parallel sharding.

Tensor parallel (Shoeybi et al. 2019, arXiv 1909.08053 §3, Megatron-LM ``tensor_parallel/layers.py``):
attention q/k/v and MLP gate/up/fc1 are column-parallel (output rows split), the attention output
and MLP down/fc2 projections row-parallel (input columns split; bias replicated); the token
embedding and the LM head are vocab-parallel (``VocabParallelEmbedding``, parallel output layer);
norms, learned positions and MoE routers are replicated. Experts use expert tensor parallel =
tp and are split over ``ep`` (Megatron-Core ``moe/experts.py``).

Activations (Korthikanti et al. 2022, arXiv 2205.05198 §4, Eq. 2-4): with TP, everything inside
attention and the MLP is split by ``tp``; the layer norms, the inputs of the first Linear of each
block and the residual dropout masks stay replicated (the ``10 sbh`` term) unless sequence
parallelism splits them too. Context parallelism splits the sequence over ``cp`` ranks and adds
ring-attention buffers (:func:`cp_ring`, chosen by ``Parallelism.cp_rotate``): Megatron-Core /
Transformer Engine's K/V chunks in flight (``attention/dot_product_attention/context_parallel.py``
``AttnFuncWithCPAndKVP2P``: double-buffered K/V receive, fp32 dK/dV accumulation in backward), or
torch's ``context_parallel`` (torchtitan), whose default all-gather rotate holds every CP rank's K/V.

Pipeline parallel (Narayanan et al. 2021, arXiv 2104.04473 §2.2): contiguous stages of
``layers / pp`` layers; the first stage also holds the embeddings, the last the final norm, the
head and the loss (a tied head keeps a copy of the embedding there, Megatron
``shared_embedding``). With 1F1B, stage ``s`` holds activations of ``min(pp - s, m)`` micro-batches;
interleaved with ``v`` virtual stages it holds ``min((pp - s - 1) * 2 + (v - 1) * pp + 1, m * v)``
model chunks of ``layers / (pp v)`` layers (Megatron ``schedules.py``
``forward_backward_pipelining_with_interleaving``: ``num_warmup_microbatches``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from peakmem.breakdown import Category, MemoryItem
from peakmem.dtypes import FP32
from peakmem.errors import require
from peakmem.model import Layer, ModelSpec, Tensor
from peakmem.parallel import CpRotate, FsdpMode, Parallelism, PipelineSchedule

from .activations import LayerActivations
from .loss import HeadActivations

# Row-parallel Linears (Megatron RowParallelLinear): input split, output (and bias) replicated.
ROW_PARALLEL_MODULES = frozenset(
    {
        "o_proj",
        "down_proj",
        "c_proj",
        "dense",
        "dense_4h_to_h",
        "fc2",
        "out_proj",
        "w2",
        "wo",
    }
)
TP_SPLIT_COMPONENTS = frozenset({"attention", "mlp", "shared_experts"})

# Activation items (paths from formulas/activations/ and formulas/loss.py) that Megatron keeps
# replicated over the TP group without sequence parallelism (Korthikanti et al. 2022 Eq. 2: LN
# inputs, first-Linear inputs, dropout masks); everything else is split by tp.
# Item keys (MemoryItem.key, set where the items are made: formulas/activations/, formulas/loss.py).
# Falcon-7B's one shared norm output ("input.attn_mlp") is split, as before keys existed (the old path
# prefix "attn+mlp inputs" matched no item); by Eq. 2 it is replicated like "input.attn".
REPLICATED_ACTIVATIONS = frozenset(
    {
        "norms",
        "input.attn",
        "input.mlp",
        "dropout.residual_masks",
        "moe.routed_inputs",
        "moe.router",
        "head.final_norm",
        "head.lm_head_input",
        "head.pooler_inputs",
    }
)


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the most loaded rank's share."""
    return -(-a // b)


@dataclass(frozen=True, kw_only=True)
class LocalTensor:
    """One parameter tensor as a rank holds it after TP/EP (``count`` identical ones)."""

    name: str
    dim0: int  # rows after the TP/EP split (FSDP2 shards this dimension)
    rest: int  # elements per row
    count: int  # occurrences on this rank (layers of a group on this stage)
    expert: bool  # sharded over expert data parallel (dp*cp/ep) instead of dp*cp
    in_layer: bool  # part of a transformer layer (an FSDP unit); else the root unit

    @property
    def numel(self) -> int:
        return self.dim0 * self.rest

    @property
    def total(self) -> int:
        return self.numel * self.count


def local_tensor(t: Tensor, par: Parallelism, count: int, in_layer: bool, vocab_size: int = 0) -> LocalTensor:
    """``t`` as one rank holds it (rows x rest), after the TP/EP split. Embeddings and heads with
    ``vocab_size`` rows are vocab-parallel; other embeddings (positions, token types) replicated."""
    shape = t.shape if t.copies == 1 else (t.copies, *t.shape)
    dim0, rest = shape[0], math.prod(shape[1:]) if len(shape) > 1 else 1
    tp, ep = par.tp, par.ep
    expert = t.component == "experts"
    if expert:
        # (E, out, in) or per-expert (out, in) x copies: experts split over ep, each over tp
        if len(shape) >= 3:
            return LocalTensor(
                name=t.name,
                dim0=cdiv(dim0, ep),
                rest=cdiv(rest, tp),
                count=count,
                expert=True,
                in_layer=in_layer,
            )
        return LocalTensor(
            name=t.name, dim0=cdiv(dim0, ep * tp), rest=rest, count=count, expert=True, in_layer=in_layer
        )
    split_rows = split_cols = False
    if t.component in TP_SPLIT_COMPONENTS and t.kind in ("linear_weight", "linear_bias"):
        row_parallel = t.module in ROW_PARALLEL_MODULES
        if t.kind == "linear_bias":
            split_rows = not row_parallel
        elif row_parallel:
            split_cols = True
        else:
            split_rows = True
    elif t.component in ("embeddings", "head") and t.shape[0] == vocab_size:
        split_rows = True  # vocab-parallel
    if split_rows:
        dim0 = cdiv(dim0, tp)
    if split_cols:
        rest = cdiv(rest, tp)
    return LocalTensor(name=t.name, dim0=dim0, rest=rest, count=count, expert=False, in_layer=in_layer)


def stage_layer_counts(num_layers: int, pp: int, stage: int) -> tuple[int, int]:
    """(first layer, number of layers) of pipeline stage ``stage``; the first ``L % pp`` stages take
    one extra layer (ceil: the most loaded stage)."""
    base, extra = divmod(num_layers, pp)
    start = stage * base + min(stage, extra)
    return start, base + (1 if stage < extra else 0)


def stage_groups(spec: ModelSpec, pp: int, stage: int) -> tuple[tuple[int, Layer], ...]:
    """(count, layer) of each layer group's share of the stage's contiguous layer range."""
    start, n = stage_layer_counts(spec.num_layers, pp, stage)
    end = start + n
    out: list[tuple[int, Layer]] = []
    pos = 0
    for g in spec.groups:
        lo, hi = max(start, pos), min(end, pos + g.count)
        if hi > lo:
            out.append((hi - lo, g.layer))
        pos += g.count
    return tuple(out)


def _tied_embedding(spec: ModelSpec, t: Tensor) -> bool:
    return spec.tie_word_embeddings and t.component == "embeddings" and t.shape[0] == spec.vocab_size


def stage_tensors(spec: ModelSpec, par: Parallelism, stage: int) -> tuple[LocalTensor, ...]:
    """Every parameter tensor on a rank of pipeline stage ``stage``, after TP/EP.

    The first stage holds embeddings and positions; the last the final norm, head, pooler and
    classifier; a tied embedding is held by both (Megatron keeps a synchronised copy)."""
    first, last = stage == 0, stage == par.pp - 1
    out: list[LocalTensor] = []
    for t in spec.outer:
        on_first = t.component in ("embeddings", "positions")
        keep = (on_first and first) or (not on_first and last) or (_tied_embedding(spec, t) and last)
        if keep:
            out.append(local_tensor(t, par, 1, in_layer=False, vocab_size=spec.vocab_size))
    for count, layer in stage_groups(spec, par.pp, stage):
        out.extend(local_tensor(t, par, count, in_layer=True) for t in layer.tensors)
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class StageParams:
    """The parameters of one rank of a pipeline stage, after TP/EP, grouped as FSDP units."""

    stage: int
    tensors: tuple[LocalTensor, ...]  # all, with their counts
    layer_units: tuple[tuple[int, int], ...]  # (layers, local elements of one layer) per group
    root_numel: int  # elements outside the layers (the root FSDP unit): embeddings, norm, head
    head_numel: int  # root elements whose gradients appear at the start of backward (head side)
    largest_tensor: int  # elements of the largest local tensor (a ZeRO-3 fetch granule: one module)

    @property
    def numel(self) -> int:
        return sum(t.total for t in self.tensors)

    @property
    def largest_unit(self) -> int:
        return max((n for _, n in self.layer_units), default=0)

    @property
    def layers(self) -> int:
        return sum(c for c, _ in self.layer_units)


def _head_side_numel(spec: ModelSpec, par: Parallelism, stage: int) -> int:
    """Root elements of the stage whose gradients the head's backward writes first: the head,
    final norm, and a tied embedding on the last stage (transformers' tied lm_head)."""
    if stage != par.pp - 1:
        return 0
    total = 0
    for t in spec.outer:
        if t.component not in ("embeddings", "positions") or _tied_embedding(spec, t):
            total += local_tensor(t, par, 1, in_layer=False, vocab_size=spec.vocab_size).numel
    return total


def stage_params(spec: ModelSpec, par: Parallelism, stage: int) -> StageParams:
    tensors = stage_tensors(spec, par, stage)
    units = tuple(
        (count, sum(local_tensor(t, par, 1, in_layer=True).numel for t in layer.tensors))
        for count, layer in stage_groups(spec, par.pp, stage)
    )
    return StageParams(
        stage=stage,
        tensors=tensors,
        layer_units=units,
        root_numel=sum(t.total for t in tensors if not t.in_layer),
        head_numel=_head_side_numel(spec, par, stage),
        largest_tensor=max((t.numel for t in tensors), default=0),
    )


def in_flight_microbatches(par: Parallelism, stage: int, microbatches: int) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the stage's layers.

    1F1B: ``min(pp - stage, m)``. Interleaved: chunks in flight x (1/v) of the stage's layers."""
    pp, v = par.pp, par.virtual_stages
    if pp == 1:
        return 1.0
    if par.pp_schedule is PipelineSchedule.ONE_F_ONE_B:
        return float(min(pp - stage, microbatches))
    chunks = min((pp - stage - 1) * 2 + (v - 1) * pp + 1, microbatches * v)
    return chunks / v


SRC_DTENSOR_TP = (
    "torch/distributed/tensor/parallel/style.py RowwiseParallel: Partial -> Replicate via the out-of-place "
    "functional all_reduce (_functional_collectives.py) and its autograd wrapper"
)


SRC_DTENSOR_SP_SCATTER = (
    "torch/distributed/_functional_collectives.py reduce_scatter_single (torch 2.13): scatter_dim != 0 "
    "first copies its input with torch/_utils.py _chunk_or_narrow_cat (torch.cat of torch.chunk)"
)


def dtensor_rowwise_copy(par: Parallelism, hidden: int, whole: int = 0) -> int:
    """PyTorch tensor parallelism (DTensor ``parallelize_module``, torchtitan ``apply_tp``): an output
    projection's ``RowwiseParallel`` turns its partial sum into a replicated tensor (a sequence shard under
    SP) with the out-of-place functional ``all_reduce`` / ``reduce_scatter_tensor``, whose output is a
    new tensor alive beside the projection's own output until the residual add (Megatron's in-place
    ``all_reduce`` makes none; the ``AsyncCollectiveTensor`` wrapped around it holds no memory of its
    own). ``hidden``: one micro-batch's hidden states on the rank (its sequence shard under SP). The
    vocab-parallel embedding's collective output is the first layer's input, which the first norm saves:
    nothing more. Measured with the oracle (peakmem.measure.parallel). Not applied under DeepSpeed ZeRO
    (no DTensor TP).

    Under SP the reduce-scatter runs on the sequence dim (``Shard(1)``), and ``reduce_scatter_single``
    first lays the whole partial sum out chunk by chunk along dim 0 in a copy
    (:data:`SRC_DTENSOR_SP_SCATTER`): ``whole`` (the ``T x h`` partial sum's bytes) more, alive with the
    projection's output during the collective (measured with the oracle under full checkpointing,
    peakmem.measure.parallel_ac, where a layer's interior is the forward peak: tp8+sp, 512-token vocab,
    forward -16.9% without it)."""
    if par.tp == 1 or par.zero_stage:
        return 0
    return hidden + (whole if par.sequence_parallel else 0)


SRC_RECOMPUTE_TAIL = (
    "torch/utils/checkpoint.py _checkpoint_without_reentrant_generator: the first unpack of a saved tensor "
    "reruns the block's whole forward (early_stop=False: torchtitan b5bcd76 FullAC._wrap_block) before its "
    "backward goes on; torch/distributed/_functional_collectives.py reduce_scatter_tensor_backward: "
    "all_gather_single of the output gradient (gather dim 1 under SP: a whole copy)"
)


def dtensor_recompute_tail(
    la: LayerActivations, par: Parallelism, hidden: int, whole: int, grad_in: int, held: int = 0
) -> LayerActivations:
    """A fully checkpointed layer under PyTorch TP (torchtitan ``apply_tp`` then ``FullAC``): its backward
    starts at the block's last op, the output projection's collective, whose backward turns the incoming
    gradient (``grad_in``: the rank's hidden states in the residual dtype) into the projection output's
    gradient (under SP all-gathered over the sequence: ``whole`` more; without SP the all-reduce's backward
    passes it on). The projection's backward then unpacks its saved input, which reruns the block's forward
    to its end (:data:`SRC_RECOMPUTE_TAIL`), where the recomputed saved tensors are all alive with the last
    projection's partial sum (``whole``) and its collective's copies (:func:`dtensor_rowwise_copy`) next to
    that gradient, with what the recomputed forward holds through its MLP (``held``: the residual stream
    and SP's norm-output shard, :func:`peakmem.formulas.activations.full_ac_forward`): none of the
    layer's saved tensors freed yet, no weight gradient written. That instant
    becomes the layer's backward stage where it exceeds the gradient stages (``la.backward_*``).
    Measured with the oracle (peakmem.measure.parallel_ac: tp8+sp, 512-token vocab, backward -23.8%
    without it, -2.3% without ``held`` under FSDP2 mixed-bf16). ``la``: the checkpointed layer
    (``recompute`` set)."""
    if par.tp == 1 or par.zero_stage or not la.recompute:
        return la
    gathered = whole if par.sequence_parallel else 0
    # net bytes above the recomputed tensors, as backward_transient counts them (the mask argument, kept
    # for the recomputation, alive at both)
    copy = dtensor_rowwise_copy(par, hidden, whole)
    tail = grad_in + gathered + held + whole + copy + la.mask_arg
    if tail <= la.backward_transient:
        return la

    # at their sizes: ``held`` and the copy in hidden-state tensors (the residual stream, SP's norm-output
    # shard; the collective's output, SP's whole chunked copy)
    def hidden_parts(n: int) -> tuple[int, ...]:
        return (hidden,) * (n // hidden) if hidden and n % hidden == 0 else (n,)

    copies = (hidden, whole) if par.sequence_parallel else (hidden,)
    sizes = tuple(x for x in (grad_in, gathered, *hidden_parts(held), whole, *copies, la.mask_arg) if x)
    return replace(la, backward_transient=tail, backward_freed=0, backward_grads=0, backward_sizes=sizes)


SRC_DTENSOR_EMBED = (
    "torch/distributed/tensor/_ops/_embedding_ops.py embedding_dense_backward_strategy: no vocab-sharded "
    "weight-gradient strategy (Shard(1), Partial or Replicate)"
)


def dtensor_embedding_grad_extra(
    spec: ModelSpec, par: Parallelism, first: bool, grad_bytes: Callable[[int], int], adapter: bool
) -> int:
    """PyTorch TP's vocab-parallel embedding (``RowwiseParallel`` on ``nn.Embedding``: rows split over
    tp) gets a whole ``V x H`` gradient on every TP rank: DTensor's rule for ``embedding_dense_backward``
    offers no vocab-sharded weight gradient, so the gradient comes out Replicate (measured with the
    oracle, torch 2.13). The bytes beyond the ``V/tp`` rows counted with the parameter, on the first
    stage, where nothing else shards the gradient (FSDP2 reduce-scatters it; ZeRO has no DTensor TP)."""
    if par.tp == 1 or not first or adapter or par.zero_stage or par.fsdp is not FsdpMode.NONE:
        return 0
    rows = sum(
        math.prod(t.shape)
        for t in spec.outer
        if t.component == "embeddings" and t.shape[0] == spec.vocab_size
    )
    return grad_bytes(rows) - grad_bytes(cdiv(rows, par.tp)) if rows else 0


def torch_pipeline_buffers(par: Parallelism, stage: int, microbatches: int, act_bytes: int) -> int:
    """Receive buffers ``torch.distributed.pipelining`` (torchtitan's pipeline) keeps for a stage: one
    per micro-batch and direction, allocated at the first step and kept (torch 2.13
    ``torch/distributed/pipelining/stage.py``: ``_prepare_forward_infra`` makes ``args_recv_info[chunk]``
    with a buffer from ``_make_tensor_from_meta`` for every chunk of a non-first stage;
    ``_setup_backward_recv_info`` makes ``grad_recv_info[mb]`` for every micro-batch of a non-last
    stage). ``act_bytes``: one micro-batch's stage boundary activation. A received activation is the
    stage's input (the first layer saves it), so in-flight micro-batches' inputs are these buffers.
    Megatron instead allocates a tensor per receive (``p2p_communication._communicate``)."""
    if par.pp == 1:
        return 0
    directions = (0 if stage == 0 else 1) + (0 if stage == par.pp - 1 else 1)
    return directions * microbatches * act_bytes


# The Linears' inputs that PyTorch's sequence parallelism all-gathers before the Linear, which then saves
# the gathered (whole-sequence) tensor: torchtitan ``apply_tp`` ``PrepareModuleInput(input_layouts=
# Shard(1), desired_input_layouts=Replicate())`` on attention and MLP, the head's ``ColwiseParallel(
# input_layouts=Shard(1))``. Megatron's SP Linears save the sequence shard and gather it again in
# backward (``tensor_parallel/layers.py`` ``LinearWithGradAccumulationAndAsyncCommunication``).
GATHERED_UNDER_DTENSOR_SP = frozenset({"input.attn", "input.mlp", "head.lm_head_input", "moe.routed_inputs"})


def _split(nbytes: int, replicated: bool, par: Parallelism) -> int:
    if replicated and not par.sequence_parallel:
        return nbytes
    return cdiv(nbytes, par.tp)


def _kept_whole(key: str, par: Parallelism) -> bool:
    """Replicated over the TP group: Korthikanti's replicated items without SP; under PyTorch's SP (no
    DeepSpeed: peakmem's TP is DTensor's unless ZeRO runs it) the Linears' gathered inputs."""
    if par.sequence_parallel:
        return par.zero_stage == 0 and key in GATHERED_UNDER_DTENSOR_SP
    return key in REPLICATED_ACTIVATIONS


def split_items(items: tuple[MemoryItem, ...], par: Parallelism) -> tuple[MemoryItem, ...]:
    if par.tp == 1:
        return items
    return tuple(i if _kept_whole(i.key, par) else replace(i, bytes=cdiv(i.bytes, par.tp)) for i in items)


def tp_layer_activations(
    la: LayerActivations,
    par: Parallelism,
    ring: int | CpRing,
    dispatch_bytes: int = 0,
    *,
    linear_input: int = 0,
) -> LayerActivations:
    """A layer's activations on one TP/SP rank (computed before checkpointing), plus the
    context-parallel ring's buffers (:func:`cp_ring`; an int is the p2p ring's K/V chunk) and the
    expert-parallel all-to-all buffer (forward and backward).

    What full checkpointing reads is carried over too (:func:`peakmem.formulas.activations.checkpointed`):
    the interior alive mid-layer in a forward that saves nothing (``la.interior``: the attention core or
    the MLP interior, split by tp, next to the block's ``linear_input``: the norm output its first Linears
    read, ``T x h`` in the compute dtype, whole on every rank: replicated without SP, all-gathered by
    PyTorch's SP), the layer input the first norm saves (split like the layer input), the mask argument
    (whole) and the backward split (freed / grads, split by tp). Without them a TP layer under full
    checkpointing had no forward interior and recomputed its kept input twice (measured with the
    oracle, peakmem.measure.parallel_ac: tp8+sp, a 512-token vocab, forward -32.6%)."""
    cp = ring if isinstance(ring, CpRing) else p2p_ring(ring)
    saved = split_items(la.saved, par)
    forward = cdiv(la.forward_transient, par.tp) + cp.forward + dispatch_bytes
    backward = cdiv(la.backward_transient, par.tp) + cp.backward + dispatch_bytes
    if cp.at_core:  # alive at the attention core only: in forward before the layer's MLP saves anything
        # (LayerActivations.forward_headroom), in backward in the attention half (layer.py's stages)
        core = cdiv(la.forward_core, par.tp) + max(0, cp.forward - cdiv(la.forward_headroom, par.tp))
        forward = max(core, cdiv(la.forward_transient, par.tp)) + dispatch_bytes  # or the layer's end
        if len(la.backward_stages) == 2:  # (the MLP half's, the attention core's)
            att_net = la.backward_stages[1][0]
            backward = max(cdiv(la.backward_transient, par.tp), cdiv(att_net, par.tp) + cp.backward)
            backward += dispatch_bytes
    if cp.saved:
        saved += (MemoryItem(
            path="layers.*.self_attn context-parallel output copy", category=Category.ACTIVATIONS,
            bytes=cp.saved, source=SRC_TORCH_CP, key="attn.cp_out_copy",
        ),)  # fmt: skip
    whole = min(linear_input, la.interior)
    plain = not (cp.forward or cp.backward or dispatch_bytes)
    # the pre-norm block's second RMSNorm: its T x h temporaries whole on every rank without SP
    # (activations/norms.py pre_mlp_norm_stage; tp2 x fsdp2 mixed-bf16, full checkpointing: -4.2% split)
    norm_net, norm_freed, norm_grads = la.norm_stage.stage(par.tp, par.sequence_parallel)
    norm_wins = norm_net + dispatch_bytes > backward
    if norm_wins:
        backward = norm_net + dispatch_bytes
    split_stages = tuple(
        (cdiv(n, par.tp), cdiv(f, par.tp), cdiv(g, par.tp)) for n, f, g in la.backward_stages
    )
    return LayerActivations(
        saved=saved,
        core=cdiv(la.core, par.tp),
        layer_input=_split(la.layer_input, True, par),
        forward_transient=forward,
        backward_transient=backward,
        interior=cdiv(la.interior - whole, par.tp) + whole,
        input_saved=_split(la.input_saved, True, par),
        mask_arg=la.mask_arg,
        backward_freed=norm_freed if norm_wins else cdiv(la.backward_freed, par.tp),
        backward_grads=norm_grads if norm_wins else cdiv(la.backward_grads, par.tp),
        backward_stages=split_stages,
        norm_stage=la.norm_stage,
        # the tensors at their sizes (LayerActivations.forward_sizes etc.), each split as its sum is (the
        # step replays them where they still add up to it; a ring or a dispatch buffer adds a sum only)
        forward_sizes=tuple(cdiv(x, par.tp) for x in la.forward_sizes) if plain else (),
        backward_sizes=tuple(cdiv(x, par.tp) for x in la.backward_sizes) if plain and not norm_wins else (),
        interior_sizes=(whole, *(cdiv(x, par.tp) for x in la.interior_sizes[1:]))
        if la.interior_sizes[:1] == (whole,)
        else (),
    )


SRC_LOSS_PARALLEL = (
    "torch/distributed/tensor/parallel/loss.py (torch 2.13): _log_softmax keeps x, shifted = x - max and "
    "exp(shifted) / the result; _nll_loss_and_log_softmax_backward: zeros_like(x), exp(x), their sum"
)


def loss_parallel_extra(head: HeadActivations, par: Parallelism) -> int:
    """PyTorch's vocab-parallel cross-entropy (``loss_parallel()``, torchtitan's default with TP) on one
    rank: one ``T x V/tp`` fp32 tensor more than the fused ``log_softmax`` / ``nll_loss`` kernels hold,
    in forward and in backward. Its ``_log_softmax`` computes ``shifted = x - max`` out of place and keeps
    it next to ``exp(shifted)`` and then the result; its backward holds ``zeros_like(x)``, ``exp(x)`` and
    their sum next to the saved output (3 where the kernels' backward holds 2). Measured with the oracle
    (peakmem.measure.parallel, which sees DTensor handlers' own ops). 0 without TP, under DeepSpeed
    (no DTensor TP) and for a loss that does not run ``log_softmax`` (fused / chunked CE kernels)."""
    if par.tp == 1 or par.zero_stage:
        return 0
    return sum(cdiv(i.bytes, par.tp) for i in head.saved if i.key == "loss.log_softmax")


def sp_head_gather(head: HeadActivations, par: Parallelism) -> int:
    """PyTorch SP's head input gather (``ColwiseParallel(input_layouts=Shard(1))``): the functional
    ``all_gather_tensor`` gathers the sequence shards on dim 0 and then lays them out on the sequence
    dim (torch 2.13 torch/distributed/_functional_collectives.py ``all_gather_tensor``:
    ``torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim)``), so the gathered buffer (a whole
    ``T x H``) is alive next to the head's input (saved: ``head.lm_head_input``) and the final norm's
    output shard it came from. Beyond the saved input: the buffer and the shard. Measured with the oracle
    (no checkpointing, REGIME_70B with vocab 512 at tp8+sp: forward -3.8% without it, tp8+sp x fsdp2
    -4.6%). 0 without SP or under DeepSpeed (no DTensor TP)."""
    if not par.sequence_parallel or par.zero_stage:
        return 0
    gathered = sum(i.bytes for i in head.saved if i.key == "head.lm_head_input")
    return gathered + cdiv(gathered, par.tp)


def tp_head_input_grad(head: HeadActivations, par: Parallelism) -> int:
    """The head's backward on a TP rank: ``ColwiseParallel``'s input gradient is a whole ``T x H``
    partial sum (the vocab-sharded logits' gradient times the rank's rows of the head), alive next to
    that logits gradient (``T x V/tp``) until DTensor redistributes it (torch 2.13
    torch/distributed/tensor/_redistribute.py ``Redistribute.backward``; under SP a reduce-scatter to the
    sequence shard). Measured with the oracle (no checkpointing, REGIME_70B with vocab 512 at tp8+sp:
    backward -3.0% without it, tp8+sp x fsdp2 -3.2%). 0 under DeepSpeed (no DTensor TP)."""
    if par.zero_stage:
        return 0
    whole = sum(i.bytes for i in head.saved if i.key == "head.lm_head_input")
    return cdiv(head.logits_grad, par.tp) + whole


def tp_head_activations(head: HeadActivations, par: Parallelism) -> HeadActivations:
    """The head and loss on one TP rank: vocab-parallel logits and cross-entropy (each rank's fp32
    ``T x V/tp``; Megatron ``tensor_parallel/cross_entropy.py`` ``_VocabParallelCrossEntropy``, PyTorch's
    ``loss_parallel`` with :func:`loss_parallel_extra`)."""
    if par.tp == 1:
        return head
    extra = loss_parallel_extra(head, par)
    return HeadActivations(
        saved=split_items(head.saved, par),
        forward_transient=max(cdiv(head.forward_transient, par.tp) + extra, sp_head_gather(head, par)),
        backward_transient=max(cdiv(head.backward_transient, par.tp) + extra, tp_head_input_grad(head, par)),
        logits_grad=cdiv(head.logits_grad, par.tp),
    )


def ep_dispatch_bytes(
    layer: Layer, tokens_local: int, hidden: int, compute_bytes: int, par: Parallelism
) -> int:
    """Expert parallel: the all-to-all send buffer of the permuted top-k token copies, alive next to
    the received ones (which the expert MLPs save; counted as ``moe.routed token copies``).
    Megatron-Core ``moe/token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher``: permute, all-to-all,
    experts, all-to-all back, unpermute; on average each rank receives top-k x its own tokens."""
    if par.ep == 1 or not layer.mlp.is_moe:
        return 0
    return layer.mlp.experts_per_token * tokens_local * hidden * compute_bytes


def ring_kv_chunk_bytes(layer: Layer, tokens_local: int, compute_bytes: int, par: Parallelism) -> int:
    """One rank's K and V for its sequence chunk (the unit a ring-attention step sends)."""
    if par.cp == 1:
        return 0
    att = layer.attention
    return tokens_local * cdiv(att.num_kv_heads, par.tp) * (att.head_dim + att.v_head_dim) * compute_bytes


@dataclass(frozen=True, kw_only=True)
class CpRing:
    """What context parallelism's ring attention adds to one layer on one rank: transient bytes in the
    attention's forward and backward, and bytes saved for backward (per layer)."""

    forward: int
    backward: int
    saved: int = 0
    # torch's ring: alive at the attention core only, so it composes with the layer's headroom and its
    # attention half's backward stage (tp_layer_activations); p2p's is added to the whole layer
    at_core: bool = False

    def __post_init__(self) -> None:
        for name in ("forward", "backward", "saved"):
            require(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")


def p2p_ring(kv_chunk: int) -> CpRing:
    """Megatron-Core / Transformer Engine ``AttnFuncWithCPAndKVP2P``: the K/V chunk being computed on and
    the one being received (2 in forward); in backward the same 2 plus fp32 dK/dV (2x a 16-bit chunk)."""
    return CpRing(forward=2 * kv_chunk, backward=2 * kv_chunk + 2 * kv_chunk)


SRC_TORCH_CP = (
    "torch/distributed/tensor/experimental/_context_parallel/_attention.py (torch 2.13): "
    "_templated_ring_attention(_backward), _AllGatherRotater, _AllToAllRotater, _SDPAMerger"
)
# _ContextParallelOptions.convert_to_f32: the merger and the gradient accumulators
FP32_BYTES = FP32.nbytes(1)


def cp_ring(layer: Layer, tokens_local: int, compute_bytes: int, par: Parallelism) -> CpRing:
    """The ring's buffers for ``par.cp_ring`` (``layer`` as the attention kernel sees it, before TP).

    p2p: :func:`p2p_ring`. torch's ``context_parallel`` (what torchtitan runs; :data:`SRC_TORCH_CP`),
    with ``c`` the rank's K+V chunk, ``q`` and ``o`` its query and output bytes (compute dtype) and
    ``f = 4 / compute_bytes`` (fp32: ``_ContextParallelOptions.convert_to_f32``):

    * the rotated K/V (``held``): ``_AllGatherRotater`` all-gathers ``cat(k, v)`` of the whole CP group
      once per attention call and keeps it for every step (``cp x c``: at fixed local tokens it grows
      with ``cp``); ``_AllToAllRotater`` holds the one chunk received (``c``);
    * forward: ``key.contiguous()`` / ``value.contiguous()`` copy the transposed K/V (``c``), and the
      ``cat(k, v)`` sent is alive while the rotation's buffer is allocated (``c``): ``held + 2 c``, and
      below fp32 the merger's fp32 copy of the block output (``f o``). With the all-gather, the larger of
      that and a load-balanced merge step of ``_SDPAMerger._merge_one`` (bf16 GQA, where ``c`` is small
      next to ``o``): ``held`` + the merger's fp32 output (``f o``), the half-query block's output
      (``o / 2``), ``out - block_out`` (``f o / 2``), below fp32 the block's fp32 copy (``f o / 2``) and
      one more fp32 output-sized buffer (the oracle's ``_to_copy``; not traced to a line), less the
      kernel's own output (``held + 5.5 o`` in bf16). Measured alone (tests/test_cp_ring_alone.py): exact
      in fp32 and bf16, MHA and GQA at cp 4 and 8, up to one logsumexp;
    * backward: the same contiguous copies (``c``), the K/V ``cat`` sent at every step but the last, two
      at once from cp 3 on (``next_kv`` holds the previous one until it is reassigned: ``min(2, cp - 1)
      c``), the fp32 ``grad_query`` / ``grad_key`` / ``grad_value`` accumulators (``f (q + c)``) and the
      dK/dV ``cat`` and its all-to-all receive buffer in fp32 (``2 f c``; dK/dV always rotate by
      all-to-all): ``held + (1 + min(2, cp - 1)) c + f (q + 3 c)``. The kernel's own per-step dQ/dK/dV
      are the attention's usual backward, counted elsewhere;
    * saved: the merged output comes back as a ``[B, H, S, D]`` tensor of its own (``torch.cat`` in
      ``_partial_update``), so the attention's ``transpose(1, 2).contiguous()`` before ``o_proj`` copies
      it (a flash kernel's output is already ``[B, S, H, D]`` in memory): one ``o`` more saved per layer.

    Measured with the parallel oracle (``peakmem.measure.parallel_cp``, tiny Llama, cp 2 to 8): at the
    ring's backward peak the all-gather buffer is ``cp x c``, the ``zeros_like`` accumulators ``f (q + c)``,
    the ``cat`` ``(2 + f) c`` (``(1 + f) c`` at cp 2), the contiguous copies ``c`` and the all-to-all
    ``f c``, in fp32 and bf16."""
    c = ring_kv_chunk_bytes(layer, tokens_local, compute_bytes, par)
    ring = par.cp_ring
    if par.cp == 1:
        return CpRing(forward=0, backward=0)
    if ring is CpRotate.P2P:
        return p2p_ring(c)
    att = layer.attention
    heads = cdiv(att.num_heads, par.tp)
    q = tokens_local * heads * att.head_dim * compute_bytes
    o = tokens_local * heads * att.v_head_dim * compute_bytes
    f32 = FP32_BYTES // compute_bytes if compute_bytes <= FP32_BYTES else 1
    held = par.cp * c if ring is CpRotate.ALLGATHER else c
    forward = held + 2 * c
    if ring is CpRotate.ALLGATHER:  # the two forward peaks of torch's ring, measured alone (h-cp3)
        below_fp32 = compute_bytes < FP32_BYTES  # the merger's .to(float32) copies: no-ops in fp32
        lse = tokens_local * heads * FP32_BYTES
        forward += f32 * o if below_fp32 else 0  # first step: the merger's fp32 copy of the block output
        # a load-balanced merge step (i > rank: half the queries): the merger's fp32 out, the half
        # block's output, out - block_out (fp32, half), below fp32 the block's fp32 copy (half) and one
        # more fp32 output-sized buffer (the oracle's _to_copy), the logsumexps; less the kernel's own
        # output and logsumexp, which do not exist yet
        merge_fp32 = f32 * o + f32 * o // 2 + (f32 * o // 2 + f32 * o if below_fp32 else 0)
        forward = max(forward, held + merge_fp32 + o // 2 + 2 * lse - (o + lse))
    backward = held + (1 + min(2, par.cp - 1)) * c + f32 * (q + 3 * c)
    return CpRing(forward=forward, backward=backward, saved=o, at_core=True)
