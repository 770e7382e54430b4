"""A model of PyTorch's CUDA caching allocator, replayed over an allocation sequence.

It turns a sequence of requests (every storage allocated and freed, in order: simulate's recorded
trace, or the analytic estimate's own step in :mod:`.step_sequence`) into what
``torch.cuda.max_memory_allocated()`` and ``torch.cuda.max_memory_reserved()`` would show, by doing
what ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.13, ``DeviceCachingAllocator``) does with the
default configuration (no ``PYTORCH_CUDA_ALLOC_CONF``: no expandable segments, no
``max_split_size_mb``, one stream), or with ``roundup_power2_divisions:N`` (one N for every interval):

* ``round_size``: a request is rounded up to a multiple of ``kMinBlockSize`` (512 B), or with
  ``roundup_power2_divisions`` to the next 1/N step of its power-of-two interval
  (:func:`.allocator.round_request`; a zero-byte request never reaches it: ``allocate(0)`` returns
  nullptr, so :func:`replay` gives it no block);
* ``get_pool``: rounded sizes up to ``kSmallSize`` (1 MiB) use the small pool, others the large pool;
* ``get_free_block``: the smallest cached free block of the pool that is at least the size (the
  pool's ``std::set`` is ordered by (size, address); ``lower_bound`` finds it);
* ``alloc_block``: when no free block fits, ``cudaMalloc`` a new segment of
  ``get_allocation_size``: 2 MiB (``kSmallBuffer``) for small requests, 20 MiB (``kLargeBuffer``)
  below ``kMinLargeAlloc`` (10 MiB), else the size rounded up to ``kRoundLarge`` (2 MiB);
* ``should_split``: the block is split and the remainder returned to the pool when the remainder
  is at least 512 B (small pool) or more than 1 MiB (large pool); an unsplit block is allocated
  whole, and ``allocated_bytes`` counts the whole block;
* ``free_block``/``try_merge_blocks``: a freed block merges with free neighbours of its segment;
* segments are returned to the driver only when ``cudaMalloc`` fails (or on ``empty_cache()``): with
  no ``capacity`` the model assumes the device has room, so its reserved peak is what a large enough
  GPU shows; with one (the bytes the process may reserve: the GPU's less the CUDA context), a new
  segment that would take reserved above it first makes the model do what ``malloc`` does when
  ``alloc_block`` fails: ``release_available_cached_blocks`` returns false without ``max_split_size_mb``,
  so ``release_cached_blocks`` frees every cached segment no block of is allocated (``release_blocks``:
  ``!block->prev && !block->next``), and the segment is allocated (c10/cuda/CUDACachingAllocator.cpp,
  ``DeviceCachingAllocator::malloc``). Where it still does not fit, the real allocator raises
  ``OutOfMemoryError``; the model allocates it and counts an OOM (``ooms``).

Addresses of new segments increase monotonically (what the driver returns is not modelled); this
only matters for ties between free blocks of equal size.

The constants come from :mod:`peakmem.formulas.allocator`, which cites the same source. Standard
library only (the core's reserved estimate replays through it; simulate imports it from here).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field

from .allocator import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, NO_ROUNDUP, round_request, segment_size

_ADDR_BITS = 48  # a free block's sort key is size << 48 | addr: one int, ordered as (size, addr)


@dataclass(slots=True)
class Block:
    segment: int
    small: bool  # which pool the block's segment belongs to
    addr: int  # offset in the simulated address space
    size: int
    allocated: bool = False
    prev: Block | None = None
    next: Block | None = None


@dataclass(slots=True)
class _Pool:
    small: bool
    free: list[int] = field(default_factory=list)  # sorted keys (size << _ADDR_BITS | addr)
    by_key: dict[int, Block] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class AllocatorStats:
    """What the allocator model saw over the whole trace."""

    peak_allocated: int  # max of allocated_bytes (blocks, rounded), as max_memory_allocated()
    peak_reserved: int  # max of reserved_bytes (segments), as max_memory_reserved()
    peak_requested: int  # max of the sum of raw requests
    segments: int  # cudaMalloc calls
    allocations: int
    # allocated/reserved bytes after each event (index k = after k events), for per-phase peaks
    allocated_after: tuple[int, ...] = ()
    reserved_after: tuple[int, ...] = ()


class CachingAllocatorModel:
    """Replays ``malloc(key, nbytes)`` / ``free(key)`` the way the CUDA caching allocator does.

    :meth:`take` and :meth:`give` are the same without keys (a block in, a block out): the analytic
    step's replay (formulas/step_sequence.py) holds its blocks itself. The hot path of every estimate
    (about 4,000 requests a step replay): written for CPython's speed, locals bound, no per-call
    objects but the blocks a split or a new segment makes."""

    __slots__ = ("_next_addr", "_requests", "allocated", "allocations", "capacity", "divisions", "large",
                 "live", "ooms", "releases", "requested", "reserved", "segments", "small")  # fmt: skip

    def __init__(self, divisions: int = NO_ROUNDUP, capacity: int | None = None) -> None:
        self.divisions = divisions  # roundup_power2_divisions (formulas/allocator.py round_request)
        self.capacity = capacity  # bytes the process may reserve (None: unbounded)
        self.releases = 0  # release_cached_blocks calls (a cudaMalloc that failed)
        self.ooms = 0  # requests that did not fit even after them
        self.small = _Pool(small=True)
        self.large = _Pool(small=False)
        self.live: dict[int, Block] = {}
        self.allocated = 0
        self.reserved = 0
        self.requested = 0
        self._requests: dict[int, int] = {}
        self._next_addr = 0
        self.segments = 0
        self.allocations = 0

    def malloc(self, key: int, nbytes: int) -> None:
        if key in self.live:
            self.free(key)
        self.live[key] = self.take(max(K_MIN_BLOCK_SIZE, round_request(nbytes, self.divisions)))
        self.requested += nbytes
        self._requests[key] = nbytes

    def free(self, key: int) -> None:
        block = self.live.pop(key, None)
        if block is None:
            return
        self.requested -= self._requests.pop(key)
        self.give(block)

    def take(self, size: int) -> Block:
        """The block a request of ``size`` bytes (rounded: a multiple of kMinBlockSize) gets: the best
        fit of its pool (``get_free_block``), else a new segment (``alloc_block``), split where
        ``should_split`` says."""
        small = size <= K_SMALL_SIZE
        pool = self.small if small else self.large
        free = pool.free
        i = bisect_left(free, size << _ADDR_BITS)
        if i < len(free):
            block = pool.by_key.pop(free.pop(i))
        else:
            seg = segment_size(size)
            if self.capacity is not None and self.reserved + seg > self.capacity:
                self.release_cached()
                self.releases += 1
                self.ooms += self.reserved + seg > self.capacity
            block = Block(self.segments, small, self._next_addr, seg)
            self._next_addr += seg
            self.segments += 1
            self.reserved += seg
        remaining = block.size - size
        # should_split: a remainder >= kMinBlockSize (small pool) or > kSmallSize (large pool)
        if remaining > K_SMALL_SIZE or (small and remaining >= K_MIN_BLOCK_SIZE):
            after = block.next
            rest = Block(block.segment, small, block.addr + size, remaining, False, block, after)
            if after is not None:
                after.prev = rest
            block.next = rest
            block.size = size
            k = remaining << _ADDR_BITS | rest.addr
            insort(free, k)
            pool.by_key[k] = rest
        block.allocated = True
        self.allocated += block.size
        self.allocations += 1
        return block

    def release_cached(self) -> None:
        """``release_cached_blocks``: every cached segment no block of is allocated goes back to the
        driver (a free block with no neighbours is a whole segment)."""
        for pool in (self.large, self.small):
            whole = [k for k in pool.free if pool.by_key[k].prev is None and pool.by_key[k].next is None]
            for k in whole:
                self.reserved -= pool.by_key.pop(k).size
            if whole:
                gone = set(whole)
                pool.free[:] = [k for k in pool.free if k not in gone]

    def give(self, block: Block) -> None:
        """Free ``block`` (a :meth:`take` result, once): merged with the free neighbours of its segment
        (``free_block``/``try_merge_blocks``) and cached in its pool."""
        self.allocated -= block.size
        block.allocated = False
        pool = self.small if block.small else self.large
        free, by_key = pool.free, pool.by_key
        before = block.prev
        if before is not None and not before.allocated:
            k = before.size << _ADDR_BITS | before.addr
            del free[bisect_left(free, k)]
            del by_key[k]
            before.size += block.size
            after = before.next = block.next
            if after is not None:
                after.prev = before
            block = before
        after = block.next
        if after is not None and not after.allocated:
            k = after.size << _ADDR_BITS | after.addr
            del free[bisect_left(free, k)]
            del by_key[k]
            block.size += after.size
            beyond = block.next = after.next
            if beyond is not None:
                beyond.prev = block
        k = block.size << _ADDR_BITS | block.addr
        insort(free, k)
        by_key[k] = block


def replay(events: Iterable[tuple[int, int]], divisions: int = NO_ROUNDUP) -> AllocatorStats:
    """Replay a ledger's ``(sid, signed delta)`` events; a positive delta on a live storage (a
    resize) is a free of the old block and a malloc of the new size, as ``resize_`` does; a
    zero-byte storage takes no block (``CUDACachingAllocator::allocate(0)`` returns nullptr).
    ``divisions``: ``roundup_power2_divisions`` (0: not set)."""
    model = CachingAllocatorModel(divisions)
    live: dict[int, int] = {}
    alloc_after = [0]
    res_after = [0]
    peak_alloc = peak_res = peak_req = 0
    for sid, delta in events:
        old = live.get(sid, 0)
        new = old + delta
        if new <= 0:  # freed, or a zero-byte storage: the CUDA allocator returns nullptr, no block
            live.pop(sid, None)
            model.free(sid)
        elif new != old:
            live[sid] = new
            model.malloc(sid, new)
        alloc_after.append(model.allocated)
        res_after.append(model.reserved)
        peak_alloc = max(peak_alloc, model.allocated)
        peak_res = max(peak_res, model.reserved)
        peak_req = max(peak_req, model.requested)
    return AllocatorStats(
        peak_allocated=peak_alloc, peak_reserved=peak_res, peak_requested=peak_req,
        segments=model.segments, allocations=model.allocations,
        allocated_after=tuple(alloc_after), reserved_after=tuple(res_after),
    )  # fmt: skip
