"""transformers' DynamicCache growing one token a step, replayed through the caching-allocator model
(:mod:`peakmem.formulas.caching_allocator`) to give what ``max_memory_reserved`` holds for the cache.

transformers 5.23 ``cache_utils.py`` ``DynamicLayer``: ``lazy_initialization`` makes empty ``keys`` and
``values``, and every ``update`` (the prompt's, then one per decode step) does
``self.keys = torch.cat([self.keys, key_states], dim=-2)`` and then the same for ``values``: each layer
allocates a K one token longer, the old K is freed when ``self.keys`` is rebound, then the same for V.
So at any moment at most one tensor is alive twice (the old K or V of one layer next to its new copy),
and the freed blocks of the old size are too small for the next, longer request: the allocator cuts
the longer ones from other free blocks or new segments (``get_free_block`` best fit, ``should_split``),
and reserved grows above allocated while the cache grows.

``generate(max_new_tokens=N)`` (``generation/utils.py`` ``_sample``): the prompt's forward yields the
first new token; each of the N - 1 later forwards adds one token to the cache, which ends at
``prompt + N - 1`` tokens.

Only the cache's own requests are replayed: the per-step activations and logits of a decode step are
far smaller and are kept in the closed-form churn (:func:`peakmem.formulas.allocator.reserved_bytes`).
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from peakmem.formulas.caching_allocator import CachingAllocatorModel


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheReplay:
    reserved: int  # peak of the segments holding a live cache block: what a GPU must have room for
    reserved_unbounded: int  # every segment the replay reserved: max_memory_reserved on a roomy GPU
    allocated: int  # the cache's peak allocated bytes (blocks, rounded), the cat overlap included


@lru_cache(maxsize=64)
def replay_dynamic_cache(tensor_bytes_per_token: tuple[int, ...], prompt: int, final: int) -> CacheReplay:
    """Replay a DynamicCache from ``prompt`` to ``final`` cached tokens.

    ``tensor_bytes_per_token``: per layer (forward order), the bytes one token adds to that layer's K
    (and as many to its V), the batch included. The prompt's update allocates each layer's K then V of
    ``prompt`` tokens (the empty tensors of ``lazy_initialization`` take no block); every later step,
    layer by layer: a K of ``t`` tokens, the old K freed, a V of ``t`` tokens, the old V freed."""
    run = _Pinned()
    for i, per_token in enumerate(tensor_bytes_per_token):
        run.malloc(2 * i, per_token * prompt)
        run.malloc(2 * i + 1, per_token * prompt)
    key = 2 * len(tensor_bytes_per_token)
    live = list(range(key))  # the allocator key of each layer's K and V
    for t in range(prompt + 1, final + 1):
        for i, per_token in enumerate(tensor_bytes_per_token):
            for j in (2 * i, 2 * i + 1):
                run.malloc(key, per_token * t)
                run.free(live[j])
                live[j] = key
                key += 1
    m = run.model
    return CacheReplay(reserved=run.pinned_peak, reserved_unbounded=m.reserved, allocated=run.allocated_peak)


class _Pinned:
    """The allocator model, counting the segments that hold a live block.

    A segment left with free blocks only is cached, not returned (``free_block``), until ``cudaMalloc``
    fails: then ``release_cached_blocks`` returns every such segment and the request is retried
    (``CUDACachingAllocator.cpp`` ``malloc``, PyTorch 2.13). The cache's outgrown segments are of
    that kind, so a GPU needs room for the pinned segments only; a roomy one shows them all."""

    __slots__ = ("allocated_peak", "live_blocks", "model", "pinned", "pinned_peak", "sizes")

    def __init__(self) -> None:
        self.model = CachingAllocatorModel()
        self.sizes: dict[int, int] = {}  # segment -> bytes
        self.live_blocks: dict[int, int] = {}  # segment -> live blocks in it
        self.pinned = self.pinned_peak = self.allocated_peak = 0

    def malloc(self, key: int, nbytes: int) -> None:
        m = self.model
        before = m.reserved
        m.malloc(key, nbytes)
        seg = m.live[key].segment
        if m.reserved != before:
            self.sizes[seg] = m.reserved - before
        n = self.live_blocks.get(seg, 0)
        if n == 0:
            self.pinned += self.sizes[seg]
            self.pinned_peak = max(self.pinned_peak, self.pinned)
        self.live_blocks[seg] = n + 1
        self.allocated_peak = max(self.allocated_peak, m.allocated)

    def free(self, key: int) -> None:
        seg = self.model.live[key].segment
        self.model.free(key)
        self.live_blocks[seg] -= 1
        if self.live_blocks[seg] == 0:
            self.pinned -= self.sizes[seg]
