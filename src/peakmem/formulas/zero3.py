"""DeepSpeed ZeRO-3's GPU bytes beyond its partitions and buckets (used by :mod:`.sharding`): the
prefetcher's working set of gathered parameters, and the copies the gradient reduce makes.

Read in DeepSpeed v0.7.0 (git 5fe9d61, Aug 2022) and v0.16.4 (Feb 2025): each term below is the same
in both unless it says otherwise. ``P`` elements, ``N`` the sharding degree.

Gathered parameters (``partitioned_param_coordinator.py`` ``fetch_sub_module``). Every module
invocation (its pre-forward hook, and its pre-backward hook) gathers the module's own parameters and
then, once the step's trace is recorded (every step after the first), prefetches from the trace's
parameter queue while ``numel_prefetching < min(max_live_parameters - n_available,
prefetch_bucket_size)``, a whole parameter at a time; ``release_sub_module`` releases only the
module's own parameters. A transformer layer invokes more modules (the layer itself, its norms, the
attention and MLP containers, dropouts, the activation) than it has partitioned tensors, so each
invocation brings in at least one tensor ahead while a layer's run consumes one per tensor: the lead
grows until ``n_available`` reaches ``max_live_parameters``, overshooting by at most one parameter
(the last one added). The gathered set is then ``max_live_parameters`` plus the largest tensor
(replayed on GPT-2 shapes with reentrant checkpointing: 1.0e9-1.16e9 elements for n_embd 1600 to
8192), and in forward as in backward. ``prefetch_bucket_size`` or ``max_live_parameters`` 0: no
prefetch.

One rank (``num_partitions == 1``, DeepSpeed >= 0.9.0, PR #2953 "Simplify world_size=1"):
``all_gather_coalesced`` returns ``_no_gather_coalesced(params)``, whose handles set ``param.data =
param.ds_tensor.data.to(device)``: the partition is the whole parameter and already on the GPU, so
``.to`` returns it and nothing is gathered (:func:`gathers`). With the parameters offloaded the same
``.to`` copies each one in from the CPU, as a gather would.

Without ``zero.Init`` (the model built before DeepSpeed is set up: ``from_pretrained`` before
``TrainingArguments(deepspeed=...)``, accelerate ``zero3_init_flag`` false) or with
``memory_efficient_linear`` false, ``torch.nn.functional.linear`` stays torch's: DeepSpeed replaces it
with ``zero3_linear_wrap`` only in ``Init.patch_init_and_builtins`` (partition_parameters.py, the
``zero.Init`` context). torch's linear saves ``weight.t()`` for the input's gradient, a view that keeps the
gathered storage alive after ``free_param`` swaps ``param.data`` for an empty tensor, until the Linear's
backward (runtime/zero/linear.py's own comment: "Instead of saving variables using save_for_backward, we
save variable ids ... Which allows for underlying tensor to be garbage collected"). Every Linear weight
of a layer that is not checkpointed, and the head's, is then held from its forward to its backward; a
checkpointed layer's only while it is recomputed in backward (:func:`saved_linear_elements`). The
working set is re-gathered beside them (new storage), so both count.

v0.7.0 to v0.15.x also let the count go negative: ``reset_step`` (stage3.py ``backward``, after each
backward) zeroes ``__n_available_params`` while the input embedding is still gathered (its
post-backward hook never fires: its input ids do not require grad), and ``release_and_reset_all``
(the step's ``partition_all_parameters``) then subtracts it, so every later step holds that many more
elements (DeepSpeed PR #6726, v0.16.0, "__n_available_params becomes negative"). The likely value is
today's engine; the band's high end holds the older one (:func:`version_drift`, ``band.zero3_version_term``).

Gradient reduce (stage3.py ``__reduce_and_partition_ipg_grads`` -> ``__avg_scatter_grads`` ->
runtime/comm/coalesced_collectives.py ``reduce_scatter_coalesced``). When a gradient no longer fits
the bucket (``reduce_bucket_size`` elements), the bucket is reduced inside the backward of the layer
that wrote it: its gradients are ``torch.cat``-ed into one flat 16-bit tensor (a single tensor that
divides by ``N`` is used in place). With ``offload_optimizer`` (``__partition_grads``) each gradient's
partition is then copied into the CPU gradient buffer and back to the GPU (``grad_buffer =
grad_buffer.to(grad_partition.device)``, 16-bit) and its norm is taken in fp64
(``_constant_buffered_norm2``: ``part.data.double()`` per chunk of 2.5e8 elements): 2 + 8 bytes per
element of the largest partition at once (v0.16.4 then also copies ``grad_buffer.float()`` to the
CPU, 4 bytes, after the norm is freed: less).

End of backward (``independent_gradient_partition_epilogue``): the last bucket, which holds the input
embedding's gradient (its backward runs last; with a tied head, after the head's part was summed
into it), is reduced the same way. A tensor of ``reduce_bucket_size`` elements or more is never copied
into the flat bucket (``__add_grad_to_ipg_bucket``) and is reduced alone, its own gradient alive; the
embedding's parameters are still gathered (released by the step's ``partition_all_parameters``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from peakmem.breakdown import Category, MemoryItem
from peakmem.dtypes import DType
from peakmem.model import ModelSpec
from peakmem.parallel import Offload, Parallelism
from peakmem.training import Checkpointing, TrainingSetup, checkpointed_layers

from .model_parallel import StageParams, cdiv
from .model_states import spec_facts

# deepspeed/runtime/zero/stage3.py _constant_buffered_norm2(self, input, buffer_size=250000000)
DS_NORM_CHUNK = 250_000_000
FP64_BYTES = 8  # part.data.double()

# deepspeed stage3.py: max_reuse_distance default (stage3_max_reuse_distance, pp_int(1e9))
DS_MAX_REUSE_DISTANCE = 1_000_000_000

SRC_Z3_GATHER = (
    "deepspeed partitioned_param_coordinator.py: fetch + prefetch_bucket_size + reuse-distance keep"
)
SRC_Z3_PREFETCH = (
    "deepspeed partitioned_param_coordinator.py fetch_sub_module: prefetch while "
    "numel_prefetching < max_live_parameters - n_available (one whole parameter at a time)"
)
SRC_Z3_REDUCE = (
    "deepspeed stage3.py __reduce_and_partition_ipg_grads: reduce_scatter_coalesced torch.cat of the bucket; "
    "offload: __partition_grads grad_buffer.to(device), _constant_buffered_norm2 part.double()"
)
SRC_Z3_EPILOGUE = (
    "deepspeed stage3.py independent_gradient_partition_epilogue: the last bucket (the embedding's "
    "gradient) reduced after backward; the embedding still gathered until partition_all_parameters"
)


def gathers(par: Parallelism) -> bool:
    """Whether a gathered parameter is a new GPU tensor: over more than one rank, or copied in from
    offloaded partitions; on one rank with the partitions on the GPU it is the partition itself."""
    return par.shard_degree > 1 or par.offload_params is not Offload.NONE


SRC_Z3_SAVED_LINEAR = (
    "deepspeed partition_parameters.py: F.linear = zero3_linear_wrap only inside zero.Init "
    "(memory_efficient_linear); torch's linear saves weight.t(), a view holding the gathered storage "
    "after free_param, until its backward"
)


def torch_linear(par: Parallelism) -> bool:
    """Whether ZeRO-3 runs torch's ``F.linear``: the model built outside ``zero.Init``, or its
    ``memory_efficient_linear`` off."""
    return par.zero_stage == 3 and not (par.zero_init and par.memory_efficient_linear)


def saves_linear_weights(par: Parallelism) -> bool:
    """Whether torch's ``F.linear`` keeps each gathered Linear weight for its backward: ZeRO-3 gathering
    new storage (:func:`gathers`) with torch's linear (:func:`torch_linear`)."""
    return torch_linear(par) and gathers(par)


def saved_linear_elements(
    layer_linears: tuple[int, ...], checkpointed: tuple[bool, ...], head: int
) -> tuple[int, int]:
    """Gathered Linear weight elements autograd holds (:func:`saves_linear_weights`) at the end of forward
    and at the start of backward: every layer not checkpointed (``layer_linears`` per layer, in order)
    and the head; in backward the head's until its backward runs first, then a recomputed layer's, so
    the larger of the two."""
    held = sum(n for n, c in zip(layer_linears, checkpointed, strict=True) if not c)
    recomputed = max((n for n, c in zip(layer_linears, checkpointed, strict=True) if c), default=0)
    return held + head, held + max(head, recomputed)


def saved_linears(
    spec: ModelSpec, setup: TrainingSetup, par: Parallelism, sp: StageParams
) -> tuple[int, int]:
    """:func:`saved_linear_elements` of the rank's model: each layer's Linear weights (over ``tp``) and
    whether it is checkpointed (op-level SAC recomputes every layer's; ``selective`` none)."""
    linears = spec_facts(spec).linear_params
    per_layer = tuple(cdiv(linears[i], par.tp) for i, g in enumerate(spec.groups) for _ in range(g.count))
    if setup.checkpointing is Checkpointing.FULL:
        flags = checkpointed_layers(len(per_layer), setup.checkpoint_every, setup.framework)
    else:
        flags = (setup.checkpointing is Checkpointing.OP,) * len(per_layer)
    return saved_linear_elements(per_layer, flags, sp.head_numel)


def working_set(sp: StageParams, par: Parallelism, non_persistent: int) -> int:
    """Elements the prefetcher keeps gathered: ``max_live_parameters`` plus one overshooting tensor,
    at most every partitioned parameter; 0 where it does not prefetch."""
    if par.prefetch_bucket_size <= 0 or par.max_live_parameters <= 0:
        return 0
    return min(non_persistent, par.max_live_parameters + sp.largest_tensor)


def partition_reduce_bytes(grad: DType, part: int) -> int:
    """ZeRO-3 + offload_optimizer: one gradient partition of ``part`` elements at its reduce, the
    16-bit GPU copy of the CPU partition and its fp64 norm chunk."""
    return grad.nbytes(part) + FP64_BYTES * min(part, DS_NORM_CHUNK)


def in_layer_reduce_bytes(
    grad: DType, par: Parallelism, trainable: int, largest_part: int, offload: bool
) -> int:
    """A bucket's reduce inside a layer's backward: the concatenated bucket (at most
    ``reduce_bucket_size`` of the ``trainable`` elements) and, with the optimizer offloaded, the
    largest partition's copy and fp64 norm (``largest_part`` elements)."""
    cat = grad.nbytes(min(par.reduce_bucket_size, trainable))
    return cat + (partition_reduce_bytes(grad, largest_part) if offload else 0)


def end_of_backward_bytes(weight: DType, grad: DType, par: Parallelism, embed: int, trainable: int) -> int:
    """ZeRO-3 + offload_optimizer, after backward: the input embedding (``embed`` elements) still
    gathered (where :func:`gathers`), and its gradient's reduce: alone with its own 16-bit gradient when
    it does not fit the bucket (concatenated only to pad it to ``N`` ranks), else in the concatenated
    last bucket; then its partition's copy and fp64 norm (:func:`end_of_backward_copies`)."""
    own = grad.nbytes(embed) if embed >= par.reduce_bucket_size else 0
    gathered = weight.nbytes(embed) if gathers(par) else 0
    return gathered + own + end_of_backward_copies(grad, par, embed, trainable)


def end_of_backward_copies(grad: DType, par: Parallelism, embed: int, trainable: int) -> int:
    """What of :func:`end_of_backward_bytes` the reduce itself allocates (on the reduce stream,
    :mod:`.zero_streams`): the concatenation (the padded embedding gradient, none when it divides by
    ``N``; else the last bucket) and the embedding partition's 16-bit copy and fp64 norm."""
    n = par.shard_degree
    part = cdiv(embed, n)
    if embed >= par.reduce_bucket_size:
        cat = grad.nbytes(part * n) if embed % n else 0
    else:
        cat = grad.nbytes(min(par.reduce_bucket_size, trainable))
    return cat + partition_reduce_bytes(grad, part)


def input_embedding(sp: StageParams, par: Parallelism) -> int:
    """Elements of the largest partitioned parameter outside the layers on the first stage (the input
    embedding: its post-backward hook never fires, so it stays gathered to the step); 0 on later stages."""
    roots = [t.numel for t in sp.tensors if not t.in_layer and t.numel >= par.param_persistence_threshold]
    return max(roots) if roots and sp.stage == 0 else 0


def version_drift(sp: StageParams, par: Parallelism, non_persistent: int, gathered: int) -> int:
    """Elements DeepSpeed v0.7.0 to v0.15.x keeps gathered beyond today's working set (``gathered``
    elements): the input embedding, which the negative ``__n_available_params`` lets the prefetcher add
    on top of ``max_live_parameters`` every step after the first; 0 without prefetch, on a later pipeline
    stage, or once everything is gathered."""
    embed = input_embedding(sp, par)
    if not embed or par.prefetch_bucket_size <= 0 or par.max_live_parameters <= 0:
        return 0
    return max(0, min(embed, non_persistent - gathered))


@dataclass(frozen=True, kw_only=True)
class Gathered:
    """A ZeRO-3 rank's gathered parameters in forward and in backward, the older engines' extra elements
    (:func:`version_drift`) and the estimate's note on them."""

    forward: tuple[MemoryItem, ...]
    backward: tuple[MemoryItem, ...]
    drift: int
    note: str


def gathered(
    spec: ModelSpec, setup: TrainingSetup, par: Parallelism, sp: StageParams, non_persistent: int,
    to_bytes: Callable[[int], int], *, saves: bool,
) -> Gathered:  # fmt: skip
    """What the rank holds gathered (``to_bytes``: gathered elements to bytes): nothing on one rank
    (:func:`gathers`); else the running module and prefetch, or the prefetcher's working set
    (:func:`working_set`), in backward what is kept within ``max_reuse_distance``; and where
    :func:`saves_linear_weights` (and ``saves``: the Linears are torch's), the saved weights."""
    if not gathers(par):
        note = "ZeRO-3 on one rank: each gathered parameter is its own partition (no copy)"
        return Gathered(forward=(), backward=(), drift=0, note=note)
    fetch = min(non_persistent, sp.largest_tensor + min(par.prefetch_bucket_size, par.max_live_parameters))
    keep = min(non_persistent, DS_MAX_REUSE_DISTANCE // 2 + fetch)
    live = working_set(sp, par, non_persistent)

    def item(held: int, what: str) -> MemoryItem:
        prefetched = live > held
        what = "prefetched up to max_live_parameters" if prefetched else what
        source = SRC_Z3_PREFETCH if prefetched else SRC_Z3_GATHER
        return MemoryItem(path=f"ZeRO-3 gathered parameters ({what})", category=Category.PARAMETERS,
                          bytes=to_bytes(max(held, live)), source=source, key="zero3.gathered")  # fmt: skip

    forward = [item(fetch, "module + prefetch")]
    backward = [item(keep, "kept within max_reuse_distance + prefetch")]
    if saves and saves_linear_weights(par):
        fwd, bwd = saved_linears(spec, setup, par, sp)
        saved = MemoryItem(path="ZeRO-3 without zero.Init: Linear weights F.linear saved for backward",
                           category=Category.PARAMETERS, bytes=to_bytes(fwd), source=SRC_Z3_SAVED_LINEAR,
                           key="zero3.saved_linear")  # fmt: skip
        forward.append(saved)
        backward.append(replace(saved, bytes=to_bytes(bwd)))
    note = (
        "ZeRO-3 working set: max_live_parameters plus one tensor, as the prefetcher runs ahead "
        "(every step after the first)"
        if live
        else "ZeRO-3 working set: the running module plus prefetch_bucket_size, and at the "
        "forward/backward turn the parameters within max_reuse_distance/2 (approximate)"
    )
    drift = version_drift(sp, par, non_persistent, max(keep, live))
    return Gathered(forward=tuple(forward), backward=tuple(backward), drift=drift, note=note)
