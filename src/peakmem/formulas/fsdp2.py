"""FSDP2's transient bytes in a training step, by where the step is (torch 2.13
torch/distributed/fsdp/_fully_shard): the all-gather outputs and unsharded parameters around each
unit's forward and backward, the root unit's unshards and deferred reduce-scatter, and under
torch.distributed.pipelining the unsharded gradients accumulated between micro-batches and the
reduce-scatters after the last one. :func:`peakmem.formulas.sharding.rank_states` puts them in
:class:`~peakmem.formulas.sharding.RankStates`; :mod:`peakmem.estimate` places them on the timeline.
Each term was found in, and is checked against, the fake-process-group oracle
(:mod:`peakmem.measure.parallel`). Also here, for FSDP1 and FSDP2 alike: what their side streams keep
cached beside the default stream's peak (:class:`StreamPools`, read from torch's source; the oracle runs
on the CPU, which has no streams, so benchmarks/gpu_fixtures.py ``--only fsdp`` is its check)."""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem
from peakmem.defaults import fsdp_reduce, reduce_dtype
from peakmem.dtypes import BF16, FP16, FP32, DType
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import ReduceDtype, TrainingSetup

from .model_parallel import StageParams, cdiv, dtensor_embedding_grad_extra
from .stream_pools import NO_POOLS as NO_POOLS  # one concept, in stream_pools.py; re-exported
from .stream_pools import StreamPools as StreamPools
from .stream_pools import idle_pool_bytes as idle_pool_bytes
from .technique import Technique

SRC_FSDP_GATHER = "torch fsdp: root unit unsharded fwd->bwd; current + one prefetched unit all-gathered"
SRC_FSDP_RS = "torch fsdp _fsdp_collectives.py foreach_reduce: unsharded grads + reduce-scatter input"
SRC_STREAM_POOLS = (
    "c10/cuda/CUDACachingAllocator.cpp get_free_block: a cached block serves only its own stream; torch "
    "fsdp2 _fsdp_collectives.py: all-gather outputs on the copy-in stream, reduce-scatter outputs on the "
    "reduce-scatter stream"
)
SRC_FSDP_ROOT_RS = (
    "torch fsdp2 _fsdp_state.py _root_post_backward_final_callback: the root unit reduce-scatters last"
)


_REDUCE_DTYPES = {ReduceDtype.FP32: FP32, ReduceDtype.BF16: BF16, ReduceDtype.FP16: FP16}


def reduce_dt(tech: Technique, setup: TrainingSetup) -> DType:
    """The dtype an FSDP rank reduce-scatters its gradients in and, under FSDP2, accumulates them
    unsharded in between micro-batches (:func:`accumulated`): the setup's ``fsdp_reduce_dtype``
    (peakmem.defaults ``reduce_dtype``: the framework's policy unless asked). ``param`` is the dtype
    autograd writes the gradients in (the gathered parameters'): torch 2.13 _fsdp_param.py
    ``init_dtype_attrs`` clamps a ``reduce_dtype`` equal to ``param_dtype`` to None and
    _fsdp_collectives.py ``foreach_reduce`` then reduces in the gradients' dtype (``reduce_dtype or
    grad_dtype``). Adapters' gradients are reduced in their own dtype whatever is asked (peakmem models
    no reduce policy for them)."""
    if tech.adapter:
        return tech.grad
    return _REDUCE_DTYPES.get(reduce_dtype(setup), tech.grad)


def reduce_note(setup: TrainingSetup, dtype: DType) -> str:
    """The assumption line naming FSDP's reduce dtype and who decided it."""
    if setup.fsdp_reduce_dtype is ReduceDtype.AUTO:
        return f"FSDP reduces gradients in {dtype.name}: {fsdp_reduce(setup).assumption}"
    return (
        f"FSDP reduces gradients in {dtype.name} (fsdp-reduce-dtype {setup.fsdp_reduce_dtype.value}, asked)"
    )


def _item(path: str, category: Category, nbytes: int, source: str, key: str = "") -> MemoryItem:
    return MemoryItem(path=path, category=category, bytes=nbytes, source=source, key=key)


def pp_reduce(rs_unit: int, unit: int, root_rs: int, root: int, n: int) -> int:
    """FSDP2 under torch.distributed.pipelining: every micro-batch's backward runs without gradient
    sync; after the last one the schedule calls ``perform_reduce_grad`` (torch 2.13
    torch/distributed/pipelining/stage.py; schedules.py ``_step_microbatches``), which runs each
    unit's ``post_backward`` by hand, the root's first (``_state_ctx.all_states``), next to every unit's
    accumulated gradient. A unit's post-backward reshards it (frees ``unit`` / ``root`` gathered bytes),
    allocates its reduce-scatter input in the reduce dtype (``rs_unit`` / ``root_rs``), copies in and
    clears its gradients, and allocates the reduce-scatter output (a 1/``n`` shard in the reduce dtype)
    while the last parameter's accumulated gradient is still referenced (foreach_reduce's loop variable
    ``unsharded_grad``, _fsdp_collectives.py), so the unit's gradients count as alive at that instant:
    the largest of those instants beyond the accumulated gradients and the gathered units."""
    return max(0, root_rs + cdiv(root_rs, n) - root, rs_unit + cdiv(rs_unit, n) - unit)


def root_unshards(root: int, unit: int, par: Parallelism) -> tuple[int, int]:
    """FSDP2: (every unsharded byte at the first layer unit's copy-out in a micro-batch's forward, the
    root's all-gather output when backward starts), ``root`` bytes of the root unit gathered, ``unit``
    of a layer unit.

    The root's pre-forward all-gathers it and keeps its all-gather output as the "previous" one
    (_fsdp_param_group.py ``wait_for_unshard``: ``comm_ctx.all_gather_state``) until the next unit's
    copy-out; the root module's forward then runs the embedding and reaches the first layer unit, whose
    unshard allocates its output and its parameters before that output is freed: the root's parameters
    and output and the unit's output and parameters at once (no forward prefetch by default). Under
    PP (``reshard_after_forward=False``) only the first micro-batch of a step unshards. Without PP the
    root is resharded after forward (torchtitan ``reshard_after_forward=True`` for every module) and
    its ``pre_backward`` all-gathers it again at the very start of backward (_fsdp_state.py
    ``_register_pre_backward_hook`` on the root's output, the loss): its output next to its parameters,
    freed before the first layer unit is prefetched."""
    return 2 * root + 2 * unit, root if par.pp == 1 else 0


def root_backward(rs_unit: int, root_rs: int, root_gathered: int) -> int:
    """FSDP2 (no PP): what the end of backward adds beyond the root unit's unsharded gradients, with
    ``rs_unit`` bytes per layer unit's reduce-scatter input, ``root_rs`` the root's (its trainable
    elements in the reduce dtype) and ``root_gathered`` its unsharded parameters.

    The root's inputs (token ids) do not require grad, so ``RegisterPostBackwardFunction`` never runs
    for it and its post-backward (reduce-scatter) runs in ``_root_post_backward_final_callback``
    (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_state.py: "Run post-backward in case forward
    inputs did not require gradient"): the head's and the final norm's gradients, written at the start
    of backward, stay whole through every layer's backward (the timeline holds them), and the
    embeddings' join them at the end. There the last layer unit's reduce-scatter input is still kept
    (``reduce_scatter_max_input_buffers = 1``: only the next post-backward reclaims it), so the
    embedding's backward runs next to it; then the root's ``post_backward`` (_fsdp_param_group.py)
    reshards (frees ``root_gathered``), reclaims that input and allocates its own
    (_fsdp_collectives.py ``foreach_reduce``: ``reduce_scatter_comm.allocate``, the copy-in, and only
    then ``unsharded_grads.clear()``): the larger of the two instants."""
    return max(rs_unit, root_rs - root_gathered)


def shards_written_grads(par: Parallelism) -> bool:
    """Whether the unsharded gradients a layer's backward writes leave as soon as its unit's
    post-backward reduce-scatters them (FSDP over more than one rank), whatever the bytes of the shard
    kept: a layer's gradients then never stay as written, even where the shard is as large (mixed-bf16:
    an fp32 shard over 2 ranks is the bf16 gradient's size; torch 2.13 _fsdp_collectives.py
    ``foreach_reduce`` copies the unsharded bf16 gradients into an fp32 reduce-scatter input and clears
    them). Without it the timeline counted a mixed-bf16 fsdp2 rank's layer gradients as accumulated in
    place into kept ones (no new bytes) and read 3.8-4.7% low in backward against the oracle (tp2 x
    fsdp2 with full checkpointing, pp2 x fsdp2 last stage, tp2 x pp2 x fsdp2)."""
    return par.fsdp is not FsdpMode.NONE and par.shard_degree > 1


def accumulates_unsharded(tech: Technique, par: Parallelism, no_sync: bool = False) -> bool:
    """Whether a rank's gradients accumulate unsharded between micro-batches (:func:`accumulated`),
    full fine-tuning under FSDP2: under pipeline parallelism always (torch.distributed.pipelining runs
    every backward without gradient sync), without it when the loop skips the sync (``no_sync``:
    peakmem.defaults ``skips_grad_sync``; accelerate's ``no_sync`` is ``set_requires_gradient_sync(False)``
    under FSDP2, whose ``post_backward`` then returns before the reduce-scatter, keeping the unsharded
    gradient: torch 2.13 _fsdp_param_group.py ``post_backward``: ``if not self.reduce_grads``)."""
    if par.fsdp is FsdpMode.NONE or par.fsdp_version != 2 or tech.adapter:
        return False
    return par.pp > 1 or no_sync


def accumulates_in_place(tech: Technique, par: Parallelism, no_sync: bool, reduce: DType) -> bool:
    """Whether a rank's backward adds each new gradient into the one accumulated unsharded between
    micro-batches (:func:`accumulates_unsharded`) with no new bytes: only where the gradients are
    written in the accumulation dtype, the reduce dtype ``reduce`` (:func:`reduce_dt`). FSDP2 keeps the
    accumulated gradient in the reduce dtype: under a
    MixedPrecisionPolicy (param_dtype=bf16, reduce_dtype=fp32) each backward writes new bf16 gradients,
    and a unit's post-backward adds them into its fp32 ones and frees them (torch 2.13
    _fsdp_param_group.py ``post_backward`` calls _fsdp_param.py ``accumulate_unsharded_grad_if_needed``
    / ``to_accumulated_grad_if_needed``, which returns early, keeping ``.grad`` as the accumulator, only
    when the gradient already has the reduce dtype), so a
    layer's bf16 gradients are new bytes until its unit's post-backward, the root's until the end
    (:func:`root_grads_whole`): pp2 x fsdp2 mixed-bf16 last stage, full checkpointing, read -3.8%
    without them. Under accelerate's policy (reduce_dtype = param_dtype) the bf16 gradients are the
    accumulator: added in place."""
    return accumulates_unsharded(tech, par, no_sync) and tech.grad == reduce


def root_grads_whole(tech: Technique, par: Parallelism, no_sync: bool, reduce: DType) -> bool:
    """FSDP2: whether the root unit's gradients (head, final norm) stay as written from the head's
    backward until the root's post-backward at the end of backward (:func:`root_backward`): where the
    gradients accumulate unsharded (:func:`accumulates_unsharded`), when they are not written into the
    accumulated ones (:func:`accumulates_in_place`); otherwise without PP."""
    if par.fsdp is FsdpMode.NONE or par.fsdp_version != 2:
        return False
    if accumulates_unsharded(tech, par, no_sync):
        return not accumulates_in_place(tech, par, no_sync, reduce)
    return par.pp == 1


def reduce_adds(par: Parallelism, no_sync: bool) -> bool:
    """Whether a backward's reduce-scatters add bytes beyond the unsharded gradients at the peak: the
    kept reduce-scatter input in a layer unit's backward (:func:`in_layer`), the root's at the end
    (:func:`root_backward`). Not where the loop skips the sync without PP: the micro-batches but the
    last reduce nothing (``post_backward`` returns first), and in the last one each unit's reduce-scatter
    input takes the place of the accumulated gradient it copies and frees (``foreach_reduce``: the
    copy-in, then ``unsharded_grads.clear()``), so that micro-batch's backward holds no more than the
    ones before it (measured with the oracle, tiny Llama on fsdp4 mixed-bf16 under full checkpointing:
    counting the kept input read +5.8% in backward)."""
    return not (no_sync and par.pp == 1)


def accumulated(
    tech: Technique, par: Parallelism, sp: StageParams, dtype: DType, no_sync: bool = False
) -> MemoryItem | None:
    """FSDP2 where gradients accumulate unsharded (:func:`accumulates_unsharded`): under
    torch.distributed.pipelining every micro-batch's backward runs with
    ``set_requires_gradient_sync(False)`` (stage.py ``backward_maybe_with_nosync``) and
    ``perform_reduce_grad`` reduce-scatters after the last one (:func:`pp_reduce`); under a loop that
    skips the sync (accelerate's ``no_sync``) every unit's ``post_backward`` in the last micro-batch
    reduce-scatters its accumulated gradient. The gradients accumulate in the reduce dtype ``dtype``
    (:func:`reduce_dt`; ``to_accumulated_grad_if_needed`` upcasts to it where it differs from the
    gradients'), so between micro-batches a rank
    holds the stage's whole (TP-local) gradients, the vocab-parallel embedding's whole
    (:func:`whole_embedding_grad`)."""
    if not accumulates_unsharded(tech, par, no_sync):
        return None
    nbytes = dtype.nbytes(sp.numel) + whole_embedding_grad(tech, par, sp, dtype)
    what = "under PP" if par.pp > 1 else "set_requires_gradient_sync(False)"
    return _item(f"FSDP2 {what}: gradients accumulated unsharded between micro-batches",
                 Category.GRADIENTS, nbytes, SRC_FSDP_RS, key="grads")  # fmt: skip


def whole_embedding_grad(tech: Technique, par: Parallelism, sp: StageParams, dtype: DType) -> int:
    """FSDP2 + TP: DTensor gives the vocab-parallel embedding a whole ``V x H`` gradient on every TP rank
    (torch 2.13 torch/distributed/tensor/_ops/_embedding_ops.py ``embedding_dense_backward_strategy``
    offers Shard(1), Partial or Replicate weight gradients, no Shard(0);
    :func:`.model_parallel.dtensor_embedding_grad_extra` counts it where no engine shards the
    gradient); FSDP2 takes that gradient unsharded in ``post_backward`` and only then redistributes it
    to the TP-local rows for its reduce-scatter (a ``clone`` of ``V/tp`` rows, seen in the oracle), so
    as written, and accumulated under PP, the gradient is whole: the bytes beyond the TP-local rows."""
    tp_only = Parallelism(gpus=par.tp, tp=par.tp)  # the rule without an engine sharding the gradient
    return dtensor_embedding_grad_extra(tech.spec, tp_only, sp.stage == 0, dtype.nbytes, tech.adapter)


def in_layer(
    unit: int, all_units: int, rs_unit: int, par: Parallelism
) -> tuple[list[MemoryItem], list[MemoryItem], tuple[int, int, int, int, int, int]]:
    """FSDP2's unsharded bytes by where the step is: (items alive through forward, items alive through
    backward, (what a layer unit adds at its unshard, while its forward runs, in its backward, in the
    backward of the first unit backward reaches, and what the start of backward adds)), ``unit`` bytes
    per unit gathered, ``rs_unit`` per unit's reduce-scatter input.

    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py (torch 2.13) ``wait_for_unshard``: in
    forward it copies a unit's flat all-gather output into its unsharded parameters (``alloc_storage``)
    and only then frees the *previous* unit's output (``comm_ctx.all_gather_state``), keeping this one
    until the next unit's all-gather; the root's post-forward frees the last one (_fsdp_state.py
    ``_post_forward``: ``iter_forward_root``), after the loss when the model computes it. So in forward
    one output is kept between units (the loss included), a unit's unshard adds the new output and its
    parameters (2 units), its run its parameters (1). In backward the output is freed right after the
    copy-out, and ``pre_backward`` prefetches the next unit's all-gather (``_backward_prefetch``); the
    previous unit's reduce-scatter input is kept until this unit's ``post_backward`` reclaims it
    (``reduce_scatter_max_input_buffers = 1``, reclaimed after this unit's reshard and before its own
    input is allocated): the running unit's parameters, the prefetched output and the kept input; the
    first unit backward reaches has no earlier input: its parameters and the prefetched output (2
    units); the last one it reaches (the first layer) prefetches nothing (``_backward_prefetch``: the
    unit at post-forward index 0 has no ``post_forward_order[curr_index - 1]``; the root, unsharded
    since forward, is not all-gathered again): its parameters and the kept input (found with full
    activation checkpointing, where every layer's backward peaks alike and the first layer's decides:
    the oracle's fsdp4 backward was +10.6% with 3 units there, peakmem.measure.parallel_ac). Its own
    reduce-scatter (the prefetched output and its input, next to its whole gradients)
    comes after its backward freed its activations and temporaries, and is below the next unit's
    running instant (that unit's parameters, the next prefetch and the same kept input, next to its
    backward): not a peak of its own (counting it as one put the mixed-bf16 oracle's fsdp4 backward
    one unit high).
    The root's ``pre_backward`` runs at the very start of backward (its hook is on the root's output,
    the loss HF computes inside forward: _fsdp_state.py ``_register_pre_backward_hook``) and prefetches
    the first layer unit: its all-gather output (one unit) is alive through the loss's and the head's
    backward, until that unit's copy-out. Checked against the fake-process-group oracle
    (peakmem.measure.parallel).

    Under pipeline parallelism torchtitan sets ``reshard_after_forward=False``
    (torchtitan/distributed/fsdp.py ``get_fsdp_reshard_after_forward_policy``): every unit of the stage
    stays unsharded from the first micro-batch's forward on, so the later micro-batches' unshards are
    no-ops and backward all-gathers nothing; torch.distributed.pipelining runs every backward without
    gradient sync (stage.py ``backward_maybe_with_nosync``) and reduce-scatters and reshards after the
    last micro-batch (:func:`pp_reduce`)."""
    if par.pp > 1:
        held = _item("FSDP2 under PP: every layer unit of the stage unsharded from forward to backward",
                     Category.PARAMETERS, all_units, SRC_FSDP_GATHER, key="fsdp.units")  # fmt: skip
        return [held], [held], (0, 0, 0, 0, 0, 0)
    kept = _item("FSDP2 all-gather output kept until the next unit's all-gather (one unit)",
                 Category.PARAMETERS, unit, SRC_FSDP_GATHER, key="fsdp.units")  # fmt: skip
    return [kept], [], (2 * unit, unit, 2 * unit + rs_unit, 2 * unit, unit, unit + rs_unit)


def stream_pools(grads: int, root: int, unit: int, *, version: int = 2, world: int = 2) -> StreamPools:
    """FSDP's side-stream pools (:class:`StreamPools`) for ``grads`` bytes of sharded gradients on the
    GPU, ``root`` bytes of the root unit gathered and ``unit`` of the largest layer unit, FSDP
    ``version`` 1 or 2, over ``world`` ranks. On one rank FSDP2 all-gathers nothing (_fsdp_param_group.py
    ``unshard``: ``if world_size == 1`` returns before ``foreach_all_gather``) and its reduce-scatter output
    is still a copy made on the reduce-scatter stream (_fsdp_collectives.py ``foreach_reduce``); FSDP1
    runs NO_SHARD there (_init_utils.py ``_init_core_state``), whose low-precision parameters still come
    from the pre-unshard stream and whose gradients are still cast on the post-backward stream
    (_runtime_utils.py ``_reduce_grad_no_shard``): the same pools."""
    if world == 1 and version == 2:
        return StreamPools(reduce_scatter=grads)
    if version == 1:
        gathered = root + 2 * unit
        return StreamPools(reduce_scatter=grads, all_gather=gathered, in_use=gathered)
    return StreamPools(reduce_scatter=grads, all_gather=root + unit if root else 2 * unit, in_use=unit)
