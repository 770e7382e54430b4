"""What engines allocate on side streams, which the CUDA caching allocator keeps for those streams.

A freed block serves only requests of the stream that allocated it (c10/cuda/CUDACachingAllocator.cpp
``get_free_block``: ``(*it)->stream != p.stream()`` returns no block; expandable segments are per stream
too), and ``Tensor.record_stream`` only delays a block's reuse, it never moves it to another stream's
pool. So once a step has used a side stream, what it allocated there stays reserved while the default
stream peaks elsewhere: reserved counts each pool less what of it the default stream's peak already holds
(:func:`idle_pool_bytes`). The allocator gives cached blocks back only when a ``cudaMalloc`` fails
(``release_cached_blocks``, then one retry): on a device run close to full the pools shrink instead, so
this is what a GPU with room shows (:mod:`.caching_allocator` assumes the same).

Who fills the pools: FSDP1/FSDP2 (:func:`peakmem.formulas.fsdp2.stream_pools`) and DeepSpeed ZeRO
(:func:`peakmem.formulas.zero_streams.zero_stream_pools`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamPools:
    """Bytes an engine allocates on its side streams, by what they hold. torch PR #129721 moved FSDP2's
    reduce-scatter input to the default stream for this reason ("that memory cannot be reused by the
    default stream outside of that spike"); the outputs stayed.

    * ``reduce_scatter``: the sharded gradients. FSDP2's ``foreach_reduce`` allocates each unit's
      reduce-scatter output inside ``device_handle.stream(reduce_scatter_stream)`` and the sharded
      ``.grad`` is a view of it (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:
      "The RS output is allocated in the RS stream"); FSDP1's ``_post_backward_hook`` runs
      ``_reduce_grad`` inside ``stream(state._post_backward_stream)``, whose ``new_sharded_grad``
      (``torch.empty_like(chunks[0])``) becomes ``_saved_grad_shard`` and then ``.grad``
      (torch/distributed/fsdp/_runtime_utils.py). ``zero_grad(set_to_none=True)`` frees them after the
      step. DeepSpeed ZeRO-1/2 with ``overlap_comm``: the 16-bit gradient partition
      (``grads_in_partition``, :mod:`.zero_streams`).
    * ``all_gather``: the most all-gathered bytes alive at once. FSDP2's forward and pre-backward
      unshards run on ``all_gather_copy_in_stream`` (_fsdp_param_group.py ``get_all_gather_streams``:
      "Use separate streams for implicit prefetching"), where ``foreach_all_gather`` allocates the flat
      output; the root's output is kept until the first layer unit's copy-out
      (:func:`.fsdp2.root_unshards`): the root's and one unit's. FSDP1 allocates each unsharded flat
      parameter itself inside ``stream(unshard_stream)`` (_runtime_utils.py ``_unshard``:
      ``handle.unshard()``, _flat_param.py ``_alloc_padded_unsharded_flat_param``): the root's, the
      running unit's and the prefetched one. DeepSpeed ZeRO-3: the gathered parameters
      (``__allgather_stream``, :mod:`.zero_streams`).
    * ``in_use``: what of ``all_gather`` is alive at every forward and backward instant after the first
      unshard: FSDP2 one unit's output (:func:`.fsdp2.in_layer`: the kept or the prefetched one), FSDP1
      all of it (the unsharded parameters themselves). (ZeRO reads what its peak holds from the peak's
      items instead: :func:`.zero_streams.idle_bytes`.)
    * ``reduce_copies``: short-lived copies a gradient reduce makes on a side stream, alive only while
      it runs: DeepSpeed ZeRO-3's concatenated bucket (and, offloaded, a partition's GPU copy and fp64
      norm) on ``reduce_and_partition_stream`` (:mod:`.zero_streams`). FSDP puts none there."""

    reduce_scatter: int = 0
    all_gather: int = 0
    in_use: int = 0
    reduce_copies: int = 0

    def __post_init__(self) -> None:
        for name in ("reduce_scatter", "all_gather", "in_use", "reduce_copies"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"StreamPools.{name} must be a non-negative int, got {value!r}")

    @property
    def total(self) -> int:
        """Every byte the side streams keep cached once a step has run."""
        return self.reduce_scatter + self.all_gather + self.reduce_copies


NO_POOLS = StreamPools()


def idle_pool_bytes(
    pools: StreamPools, *, grads_alive: int, gathered_alive: int, copies_alive: int = 0
) -> int:
    """The side-stream pools' bytes the default stream's peak cannot use: each pool less what of it is
    alive at that instant (already counted in the peak's allocated bytes)."""
    return (
        max(0, pools.reduce_scatter - grads_alive)
        + max(0, pools.all_gather - gathered_alive)
        + max(0, pools.reduce_copies - copies_alive)
    )
