"""The DynamicCache growth replay (formulas/serving/cache_growth.py): hand-derived on tiny sizes."""

from __future__ import annotations

from peakmem.formulas.serving.cache_growth import replay_dynamic_cache
from peakmem.units import MiB


def test_outgrown_segments_are_cached_not_reused() -> None:
    # 2 layers, 1 MiB per token per tensor, prompt 12 -> 13 tokens. The prompt's K and V: 12 MiB each,
    # one 12 MiB segment each (>= kMinLargeAlloc: the size rounded to 2 MiB). Step 13: each 13 MiB
    # request fits no 12 MiB block: a 14 MiB segment, the 1 MiB remainder not split (needs > 1 MiB).
    # Pinned: 48 -> +14 (62) -> -12 -> +14 (64) -> -12 -> +14 (66) -> -12 -> +14 (68) -> -12 = 56.
    r = replay_dynamic_cache((1 * MiB, 1 * MiB), 12, 13)
    assert r.reserved_unbounded == 4 * 12 * MiB + 4 * 14 * MiB
    assert r.reserved == 68 * MiB
    assert r.allocated == 68 * MiB


def test_small_steps_reuse_the_split_block() -> None:
    # one layer, 4 MiB prompt tensors: K from a new 20 MiB kLargeBuffer segment, split (16 MiB
    # remainder > 1 MiB); V from that remainder (12 MiB left). The next step's 4 MiB + 512 B requests
    # fit the 12 MiB remainder: no new segment.
    r = replay_dynamic_cache((512,), 8192, 8193)
    assert r.reserved_unbounded == 20 * MiB
    assert r.reserved == 20 * MiB
    # peak at V's cat: the new K (4 MiB + 512 B), the old V and the new V (4 MiB + 512 B)
    assert r.allocated == 3 * 4 * MiB + 2 * 512
