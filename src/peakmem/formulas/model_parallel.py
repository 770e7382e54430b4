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
ring-attention buffers for the K/V chunks in flight (Megatron-Core / Transformer Engine
``attention/dot_product_attention/context_parallel.py`` ``AttnFuncWithCPAndKVP2P``: double-buffered
K/V receive, fp32 dK/dV accumulation in backward).

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
from peakmem.model import Layer, ModelSpec, Tensor
from peakmem.parallel import FsdpMode, Parallelism, PipelineSchedule

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


def dtensor_rowwise_copy(par: Parallelism, hidden: int) -> int:
    """PyTorch tensor parallelism (DTensor ``parallelize_module``, torchtitan ``apply_tp``): an output
    projection's ``RowwiseParallel`` turns its partial sum into a replicated tensor (a sequence shard under
    SP) with the out-of-place functional ``all_reduce`` / ``reduce_scatter_tensor``, whose output is a
    new tensor alive beside the projection's own output until the residual add (Megatron's in-place
    ``all_reduce`` makes none; the ``AsyncCollectiveTensor`` wrapped around it holds no memory of its
    own). ``hidden``: one micro-batch's hidden states on the rank (its sequence shard under SP). The
    vocab-parallel embedding's collective output is the first layer's input, which the first norm saves:
    nothing more. Measured with the oracle (peakmem.measure.parallel). Not applied under DeepSpeed ZeRO
    (no DTensor TP)."""
    if par.tp == 1 or par.zero_stage:
        return 0
    return hidden


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
    la: LayerActivations, par: Parallelism, ring: RingBuffers | int, dispatch_bytes: int = 0
) -> LayerActivations:
    """A layer's activations on one TP/SP rank (computed before checkpointing), plus the
    context-parallel ring buffers (:func:`ring_buffers`; an int is one K/V chunk under Megatron's p2p
    ring: 2 chunks in forward, 2 chunks + fp32 dK/dV in backward) and the expert-parallel all-to-all
    buffer (forward and backward)."""
    if isinstance(ring, int):
        ring = p2p_ring_buffers(ring)
    saved = split_items(la.saved, par)
    ring_forward, ring_backward = ring.forward, ring.backward + dispatch_bytes
    backward = cdiv(la.backward_transient, par.tp) + ring_backward
    if ring.at_core:  # alive at the attention core only: before the layer's MLP saves anything in
        # forward (LayerActivations.forward_headroom), in the attention half of its backward
        ring_forward = max(0, ring.forward - cdiv(la.forward_headroom, par.tp))
        if len(la.backward_stages) == 2:  # (the MLP half's, the attention core's): layer.py
            att_net = la.backward_stages[1][0]
            backward = max(cdiv(la.backward_transient, par.tp), cdiv(att_net, par.tp) + ring_backward)
    if ring.saved:
        saved = (*saved, MemoryItem(
            path="attn.output copy (o_proj input; context parallel's merged output is [B, H, S, D])",
            category=Category.ACTIVATIONS, bytes=ring.saved, source=SRC_TORCH_CP_OUTPUT,
            key="attn.cp_output_copy",
        ))  # fmt: skip
    return LayerActivations(
        saved=saved,
        core=cdiv(la.core, par.tp),
        layer_input=_split(la.layer_input, True, par),
        forward_transient=cdiv(la.forward_transient, par.tp) + ring_forward + dispatch_bytes,
        backward_transient=backward,
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


def tp_head_activations(head: HeadActivations, par: Parallelism) -> HeadActivations:
    """The head and loss on one TP rank: vocab-parallel logits and cross-entropy (each rank's fp32
    ``T x V/tp``; Megatron ``tensor_parallel/cross_entropy.py`` ``_VocabParallelCrossEntropy``, PyTorch's
    ``loss_parallel`` with :func:`loss_parallel_extra`)."""
    if par.tp == 1:
        return head
    extra = loss_parallel_extra(head, par)
    return HeadActivations(
        saved=split_items(head.saved, par),
        forward_transient=cdiv(head.forward_transient, par.tp) + extra,
        backward_transient=cdiv(head.backward_transient, par.tp) + extra,
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
class RingBuffers:
    """What context parallelism's ring attention adds to one layer on one rank: the largest extra
    alive during its forward and during its backward, beyond what the same layer's SDPA kernel holds
    without CP (its output and logsumexp, its dQ/dK/dV), and bytes it adds to the layer's saved
    tensors."""

    forward: int
    backward: int
    saved: int = 0
    at_core: bool = False  # alive only at the attention core (else added to the whole layer, as before)

    def __post_init__(self) -> None:
        for name in ("forward", "backward", "saved"):
            if getattr(self, name) < 0:
                raise ValueError(f"RingBuffers.{name}={getattr(self, name)}: must be >= 0")


def p2p_ring_buffers(kv_chunk: int) -> RingBuffers:
    """Megatron-Core / Transformer Engine's p2p ring (``AttnFuncWithCPAndKVP2P``): double-buffered
    K/V receive in forward; in backward the same plus the fp32 dK/dV being passed on (2x a 16-bit
    chunk)."""
    return RingBuffers(forward=2 * kv_chunk, backward=2 * kv_chunk + 2 * kv_chunk)


SRC_TORCH_CP = (
    "torch 2.13 torch/distributed/tensor/experimental/_context_parallel/_attention.py "
    "_templated_ring_attention(_backward), _AllGatherRotater, _SDPAMerger (torchtitan b5bcd76 default "
    "context_parallel_rotate_method='allgather'); measured with peakmem.measure.parallel_cp"
)
SRC_TORCH_CP_OUTPUT = (
    "torch 2.13 _context_parallel/_attention.py _partial_update (torch.cat of the load-balanced merge: "
    "a contiguous [B, H, S, D] output) + the model's attn_output.transpose(1, 2).contiguous() "
    "(transformers modeling_llama.py; torchtitan models/llama3/model.py Attention.forward)"
)
FP32_BYTES = 4  # _ContextParallelOptions.convert_to_f32 = True: merger and gradient accumulators in fp32


def torch_context_parallel(par: Parallelism) -> bool:
    """CP is torch's ``context_parallel`` (torchtitan) unless the job runs under DeepSpeed: the same
    rule as the pipeline's, where a model-parallel job without ZeRO is torch.distributed.pipelining
    (estimate.py ``torch_pipeline_buffers``); DeepSpeed runs sequence parallelism as Ulysses."""
    return par.cp > 1 and par.zero_stage == 0


def ring_buffers(layer: Layer, tokens_local: int, compute_bytes: int, par: Parallelism) -> RingBuffers:
    """Ring attention's buffers on one rank (``layer`` as :func:`ring_kv_chunk_bytes` takes it).

    torch's ``context_parallel`` with the all-gather rotater (torch's and torchtitan's default; n = cp,
    kv = :func:`ring_kv_chunk_bytes`, q = the rank's query / output bytes, f = 4 / compute bytes):

    * forward, at the first ring step: the all-gathered ``cat(k, v)`` of every rank (n kv, kept for
      the whole ring: ``_AllGatherRotater`` gathers once), the local ``cat`` being sent (kv), the
      ``key.contiguous()`` / ``value.contiguous()`` copies (kv: SDPA's K and V arrive transposed) and,
      below fp32, the merger's fp32 copy of the block output (f q): ``(n + 2) kv [+ f q]``; or, if
      larger (bf16 with GQA, where kv is small next to q), a load-balanced merge step of
      ``_SDPAMerger._merge_one``: n kv, the merger's fp32 output (f q), the half-query block's output
      (q / 2), ``out - block_out`` (f q / 2) and below fp32 the block's fp32 copy (f q / 2) and one more
      fp32 q-sized buffer (seen by the oracle as ``_to_copy``; not traced to a line), less the kernel's
      own output, which does not exist yet: ``n kv + 5.5 q`` in bf16;
    * backward: the backward's own all-gather (n kv), the contiguous K/V copies (kv), two ``cat(k, v)``
      for n > 2 (kv each: the next one is built while ``next_kv`` still holds the previous; one for
      n = 2, where only step 0 sends), the step's dK/dV (kv, beyond the kernel's own), the fp32
      ``grad_key``/``grad_value`` accumulators, their ``cat`` and the all-to-all receive buffer
      (3 f kv), the fp32 ``grad_query`` accumulator (f q): ``(n + 3) kv + 3 f kv + f q`` (n > 2);
    * saved: under head-tail load balancing the rank's merged output is a ``torch.cat``
      (``_partial_update``), contiguous as ``[B, H, S, D]``, so the model's ``transpose(1, 2)
      .contiguous()`` before the output projection copies it: one more q per layer (on the first
      rank, which merges partially at every step; the peak is the largest rank's).

    Measured alone with the CPU ring (tests/test_context_parallel.py): exact in fp32 and bf16 for
    n >= 4, MHA and GQA, up to one logsumexp; at n = 2 up to 1.5 q high.
    Megatron / DeepSpeed: :func:`p2p_ring_buffers`."""
    kv = ring_kv_chunk_bytes(layer, tokens_local, compute_bytes, par)
    if not torch_context_parallel(par):
        return p2p_ring_buffers(kv)
    att = layer.attention
    heads = tokens_local * cdiv(att.num_heads, par.tp) * compute_bytes
    q, out = heads * att.head_dim, heads * att.v_head_dim  # grad_query is q's shape, the merger out's

    def f32(nbytes: int) -> int:
        return nbytes * FP32_BYTES // compute_bytes

    n = par.cp
    lse = tokens_local * cdiv(att.num_heads, par.tp) * FP32_BYTES
    below_fp32 = compute_bytes < FP32_BYTES  # the merger's .to(float32) copies; no-ops in fp32
    first = (n + 2) * kv + (f32(out) if below_fp32 else 0)
    # a load-balanced merge step (i > rank: half the queries): the merger's fp32 out, the block's half
    # output, out - block_out (fp32, half), below fp32 the block's fp32 copy (half) and a second fp32
    # out-sized buffer (measured: _to_copy), the logsumexps; less the kernel's own out and logsumexp,
    # which do not exist yet
    merge_fp32 = f32(out) + f32(out) // 2 + (f32(out) // 2 + f32(out) if below_fp32 else 0)
    merge = n * kv + merge_fp32 + out // 2 + 2 * lse - (out + lse)
    fwd = max(first, merge)
    cats = 2 if n > 2 else 1  # a second cat(k, v) exists from step 1, sent only while i != n - 1
    bwd = (n + 1 + cats) * kv + 3 * f32(kv) + f32(q)
    return RingBuffers(forward=fwd, backward=bwd, saved=out, at_core=True)
