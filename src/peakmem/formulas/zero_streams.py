"""DeepSpeed ZeRO's side-stream pools (:class:`.stream_pools.StreamPools`): which of its allocations the
CUDA caching allocator keeps for a stream other than the default one.

Read in DeepSpeed v0.16.4 (git 38327e0, the mirror here; v0.19.8, cited elsewhere in peakmem, was not
available to read), and checked back to v0.7.0 (git 5fe9d61): every ``with stream(...)`` block named
below is the same there (``__allgather_stream`` and ``__reduce_and_partition_stream`` came with DeepSpeed
PR #1453, v0.6.0, Jan 2022; the coordinator moved to partitioned_param_coordinator.py in v0.6.x). A
tensor lands in a stream's pool when it is allocated while that stream is current; ``record_stream``
(``free_param``, ``partition_grads``) only delays a block's reuse.

ZeRO-3 (deepspeed/runtime/zero/, ``overlap_comm``, on by default for stage 3, ``overlap_comm_valid``):

* gathered parameters, on ``__allgather_stream`` (parameter_offload.py ``__init__``: ``Stream()`` if
  ``overlap_comm`` else ``default_stream()``). ``PartitionedParameterCoordinator.__all_gather_params_``
  calls ``all_gather_coalesced`` inside ``with stream(self.__allgather_stream)`` for the module's own
  fetch and for the prefetch alike (partitioned_param_coordinator.py ``fetch_sub_module``); there
  partition_parameters.py allocates a single parameter's ``param_buffer`` (``param.data`` is a view of
  it) or, for several, ``_all_gather_dtype``'s ``flat_tensor``; ``fetch_sub_module`` then waits on the
  handle inside the same ``with`` block, so ``AllGatherCoalescedHandle.wait``'s ``torch.cat`` (the
  parameter's own storage) is on that stream too. The whole working set (:func:`.zero3.working_set`)
  is in this pool; ``release_sub_module`` frees it there, and ``step`` -> ``_partition_all_parameters``
  frees all of it before the optimizer runs. Persistent small parameters (``ds_persist``) are
  gathered again by ``_post_step`` on the default stream (``all_gather`` -> ``_all_gather``, no
  ``with``): a few norms, not counted.
* the gradient reduce, on ``reduce_and_partition_stream`` (stage3.py ``__init__``). Inside its
  ``with`` block ``__reduce_and_partition_ipg_grads`` runs ``__avg_scatter_grads`` ->
  runtime/comm/coalesced_collectives.py ``reduce_scatter_coalesced`` (the ``torch.cat`` of the
  bucket's gradients, padded to ``N``; the scattered partitions are views of it) and
  ``partition_grads``, which copies each partition into ``grad_partitions_flat_buffer`` and, with
  ``offload_optimizer``, makes its 16-bit GPU copy and fp64 norm (:func:`.zero3.in_layer_reduce_bytes`);
  ``independent_gradient_partition_epilogue`` reduces the last bucket the same way
  (:func:`.zero3.end_of_backward_copies`). All short-lived: ``reduce_copies``. With fp16,
  ``has_overflow`` runs ``torch.isinf`` / ``torch.isnan`` of ``grad_partitions_flat_buffer`` on that
  stream at the step (one byte per partition element, freed before the optimizer's own temporaries).
* on the default stream: the ipg bucket ``__ipg_bucket_flat_buffer`` and ``grad_partitions_flat_buffer``
  (``__init__``, before any ``with``), the gradients autograd writes (``__add_grad_to_ipg_bucket`` only
  copies them into the bucket on the reduce stream), and the step's fp32 gradients
  (``_prepare_fp32_grad_for_sub_group``, no ``with``).

ZeRO-1/2 (stage_1_and_2.py; ``reduction_stream = Stream()`` always, used only with ``overlap_comm``,
off by default for stages 1 and 2):

* the 16-bit gradient partition ``grads_in_partition`` is allocated lazily by
  ``copy_grads_in_partition`` at the step's first bucket reduce, which ``reduce_ipg_grads`` runs inside
  ``with stream(self.reduction_stream)`` when ``overlap_comm`` (with ``contiguous_gradients``, default
  on, and without ``cpu_offload``, where ``copy_grads_in_partition`` returns first). The epilogue
  (``_release_ipg_buffers``) drops the attribute but ``averaged_gradients`` keeps views of it until the
  step flattens them to fp32 and frees it. Under gradient accumulation (stage 2), each later
  micro-batch allocates a new one (``if self.grads_in_partition is None``) while the first is still
  held, adds it in (``accumulated_grad.add_``) and frees it: two partitions in the pool.
* the reduce itself: ``average_tensor`` -> ``allreduce_no_retain`` -> ``allreduce_bucket``
  (``self.flatten`` of the slices per destination rank) runs on ``reduction_stream`` too, but the ipg
  bucket is contiguous and ranges of one destination rank merge (``rank_and_offsets``), so each flatten
  is of one view and copies nothing unless ``communication_data_type`` differs (not modelled).
* on the default stream: the ipg buffers (``backward``: ``torch.empty(reduce_bucket_size)``, one or two),
  the gradients autograd writes, and the step's ``flatten(...).to(fp32)`` (no ``with``).

What of each pool the default stream's peak holds is read off the peak's items (:func:`idle_bytes`).
"""

from __future__ import annotations

from collections.abc import Iterable

from peakmem.breakdown import MemoryItem
from peakmem.parallel import Offload, Parallelism

from .stream_pools import NO_POOLS, StreamPools, idle_pool_bytes

ZERO_POOLS_NOTE = (
    "DeepSpeed ZeRO overlap_comm side streams: {what} stay cached for their own streams; reserved counts "
    "what of them the peak does not hold (the caching allocator serves a block to its own stream only)"
)

# the items (MemoryItem.key) that hold each pool's bytes when the peak has them (peakmem.formulas.sharding)
GRADS_KEYS = frozenset({"zero.grad_partition"})
GATHERED_KEYS = frozenset({"zero3.gathered", "zero3.saved_linear"})
COPIES_KEYS = frozenset({"zero3.reduce", "zero3.reduce_end"})


def zero_stream_pools(
    par: Parallelism,
    *,
    grad_partition: int,
    gathered: int,
    reduce_copies: int,
    grad_accum: int = 1,
) -> StreamPools:
    """ZeRO's side-stream pools on one rank: ``grad_partition`` bytes of 16-bit gradient partition
    (ZeRO-1/2), ``gathered`` the larger of the forward and backward working sets of gathered parameters
    (ZeRO-3), ``reduce_copies`` the largest short-lived copies a reduce makes (ZeRO-3). Without
    ``overlap_comm`` every stream is the default one: no pools. ZeRO-3 on one rank gathers nothing
    (partition_parameters.py ``all_gather_coalesced``: ``_no_gather_coalesced`` when
    ``num_partitions == 1``). ZeRO-1/2 under pipeline parallelism reduce outside these hooks
    (``reduce_gradients(pipeline_parallel=True)``) and with the optimizer offloaded keep no GPU
    partition: none counted."""
    if not par.ds_overlap_comm or not par.zero_stage:
        return NO_POOLS
    if par.zero_stage == 3:
        return StreamPools(all_gather=gathered if par.shard_degree > 1 else 0, reduce_copies=reduce_copies)
    if not par.contiguous_gradients or par.offload_optimizer is not Offload.NONE or par.pp > 1:
        return NO_POOLS
    copies = 2 if par.zero_stage == 2 and grad_accum > 1 else 1
    return StreamPools(reduce_scatter=copies * grad_partition)


def idle_bytes(pools: StreamPools, items: Iterable[MemoryItem]) -> int:
    """What of ZeRO's pools the default stream's peak (its ``items``) does not hold: the gradient
    partition where the peak has it (backward, the step, accumulated between micro-batches), the
    gathered parameters in forward and backward (none at the step: ``_partition_all_parameters``), the
    reduce copies inside a layer's backward. The end-of-backward reduce under offload
    (``zero3.reduce_end``) also holds the still-gathered embedding: its bytes beyond the copies pool
    count as gathered (at most the whole embedding, so idle is if anything low)."""
    grads = gathered = copies = 0
    for item in items:
        if item.key in GRADS_KEYS:
            grads += item.bytes
        elif item.key in GATHERED_KEYS:
            gathered += item.bytes
        elif item.key in COPIES_KEYS:
            copies += item.bytes
    spill = max(0, copies - pools.reduce_copies)
    return idle_pool_bytes(pools, grads_alive=grads, gathered_alive=gathered + spill, copies_alive=copies)
