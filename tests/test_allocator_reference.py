"""The caching-allocator model (formulas/caching_allocator.py) against a plain reference written from the
same rules of c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.13, default config): segments as lists of
blocks, best fit by scanning every free block of the pool for the least (size, address), a split when
``should_split`` says, a freed block merged with its free neighbours. The model's sorted keys, linked
blocks and key-less take/give are its fast form; every event of hypothesis-drawn request sequences must
leave both with the same allocated and reserved bytes, segments and free blocks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hst

from peakmem.formulas.allocator import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, round_request, segment_size
from peakmem.formulas.caching_allocator import CachingAllocatorModel
from peakmem.formulas.step_sequence import AllocatorRun, Held
from peakmem.units import MiB


class _Reference:
    """Segments as Python lists of [addr, size, allocated]; everything found by scanning."""

    def __init__(self) -> None:
        self.segments: list[tuple[bool, list[list[int]]]] = []  # (small pool?, blocks in address order)
        self.live: dict[int, list[int]] = {}
        self.next_addr = 0

    def malloc(self, key: int, nbytes: int) -> None:
        size = max(K_MIN_BLOCK_SIZE, round_request(nbytes))
        small = size <= K_SMALL_SIZE
        fits = [(b[1], b[0], b, blocks) for s, blocks in self.segments if s == small
                for b in blocks if not b[2] and b[1] >= size]  # fmt: skip
        if fits:
            _, _, block, blocks = min(fits, key=lambda f: (f[0], f[1]))
        else:
            block = [self.next_addr, segment_size(size), 0]
            blocks = [block]
            self.segments.append((small, blocks))
            self.next_addr += block[1]
        remaining = block[1] - size
        if (remaining >= K_MIN_BLOCK_SIZE) if small else (remaining > K_SMALL_SIZE):
            blocks.insert(blocks.index(block) + 1, [block[0] + size, remaining, 0])
            block[1] = size
        block[2] = 1
        self.live[key] = block

    def free(self, key: int) -> None:
        block = self.live.pop(key)
        block[2] = 0
        for _, blocks in self.segments:
            if any(b is block for b in blocks):
                merged: list[list[int]] = []
                for b in blocks:
                    if merged and not merged[-1][2] and not b[2]:
                        merged[-1][1] += b[1]
                    else:
                        merged.append(b)
                blocks[:] = merged

    def state(self) -> tuple[int, int, int, list[tuple[int, int, bool]]]:
        allocated = sum(b[1] for _, bl in self.segments for b in bl if b[2])
        reserved = sum(b[1] for _, bl in self.segments for b in bl)
        free = sorted((b[0], b[1], s) for s, bl in self.segments for b in bl if not b[2])
        return allocated, reserved, len(self.segments), free


def _model_state(m: CachingAllocatorModel) -> tuple[int, int, int, list[tuple[int, int, bool]]]:
    free = sorted((b.addr, b.size, p.small) for p in (m.small, m.large) for b in p.by_key.values())
    return m.allocated, m.reserved, m.segments, free


# sizes around the thresholds that decide pools, segments and splits: 512 B, 1 MiB, 10 MiB, 2 MiB steps
_SIZES = hst.one_of(
    hst.integers(1, 4096), hst.integers(K_SMALL_SIZE - 1024, K_SMALL_SIZE + 1024),
    hst.integers(1, 24 * MiB), hst.sampled_from([2 * MiB, 4 * MiB, 9 * MiB, 10 * MiB, 19 * MiB, 20 * MiB]),
)  # fmt: skip
_EVENTS = hst.lists(hst.tuples(hst.booleans(), hst.integers(0, 30), _SIZES), min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(_EVENTS)
def test_model_matches_the_reference_after_every_event(events: list[tuple[bool, int, int]]) -> None:
    model, ref = CachingAllocatorModel(), _Reference()
    for is_free, pick, nbytes in events:
        if is_free and ref.live:
            key = sorted(ref.live)[pick % len(ref.live)]
            model.free(key)
            ref.free(key)
        else:
            key = max(ref.live, default=0) + 1
            model.malloc(key, nbytes)
            ref.malloc(key, nbytes)
        assert _model_state(model) == ref.state()


@settings(max_examples=60, deadline=None)
@given(_EVENTS)
def test_step_replay_run_is_the_model_less_the_small_pool(events: list[tuple[bool, int, int]]) -> None:
    """``AllocatorRun`` (formulas/step_sequence.py) places large requests exactly as the model does; a
    list it frees is emptied, so freeing it again frees nothing."""
    run, ref = AllocatorRun(), _Reference()
    held: list[tuple[int, list[Held]]] = []
    key = 0
    for is_free, pick, nbytes in events:
        if is_free and held:
            k, handles = held.pop(pick % len(held))
            run.free(handles)
            run.free(handles)
            if k in ref.live:
                ref.free(k)
        else:
            key += 1
            held.append((key, run.alloc((nbytes,))))
            if round_request(nbytes) > K_SMALL_SIZE:
                ref.malloc(key, nbytes)
        allocated, reserved, segments, free = ref.state()
        large = _model_state(run.model)
        assert (large[0], large[1], large[2], [f for f in large[3] if not f[2]]) == (
            allocated, reserved, segments, free)  # fmt: skip
    small = sum(round_request(n) for _, h in held for n in h if isinstance(n, int))
    assert run.small_live == small
