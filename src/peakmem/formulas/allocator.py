"""Allocated bytes -> reserved bytes in PyTorch's CUDA caching allocator.

Constants from c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.13):
every request is rounded up to a multiple of ``kMinBlockSize`` (512 B); requests up to
``kSmallSize`` (1 MiB) come from 2 MiB segments (``kSmallBuffer``); larger ones below
``kMinLargeAlloc`` (10 MiB) from 20 MiB segments (``kLargeBuffer``); from 10 MiB up a segment is
the request rounded up to ``kRoundLarge`` (2 MiB).

Fragmentation: cached blocks that are free but too small or split for the next request make
``max_memory_reserved`` exceed ``max_memory_allocated``. It depends on the allocation order, so it
is an explicit, overridable fraction of the bytes that churn every step (activations, gradients,
temporaries), echoed in ``Estimate.assumptions``. Its default is calibrated (see
:data:`DEFAULT_FRAGMENTATION` for the source).
"""

from __future__ import annotations

from collections.abc import Iterable

from peakmem.units import MiB

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize
K_SMALL_SIZE = 1 * MiB  # kSmallSize: largest request served from the small pool
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: segment size of the small pool
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segment size for requests below kMinLargeAlloc
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
K_ROUND_LARGE = 2 * MiB  # kRoundLarge

# Reserved-over-allocated for the per-step churn (activations, grads, temporaries). Calibrated, one
# global value, on the 7 HF-docs bert-large V100 points of shared/validation that measured
# nvidia-smi (reserved + the 1343 MiB context they measured): fractions 0.10-0.15 fit them best
# (mean error -2% at 0.10, +0.2% at 0.15; worst 7% and 5%); 0.10 is the conservative end. PyTorch
# documents the mechanism (docs "CUDA semantics: memory management";
# ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` reduces it). Override per estimate.
DEFAULT_FRAGMENTATION = 0.10


# PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:N (PyTorch >= 1.13; read at the commits below, not in each
# release's tag: the PR history shows no change to it since 2.0). c10/cuda/CUDACachingAllocator.cpp
# ``round_size`` (pytorch/pytorch@eb42ad6e; moved unchanged from
# c10/cuda in PR #159553, torch 2.9): a request above ``kMinBlockSize * divisions`` is rounded up by
# ``roundup_power2_next_division`` to the next 1/divisions step of its power-of-two interval (a power of two
# is kept); ``divisions > 1`` is tested since PR #92109 / #93942 (torch 2.0): 0 and 1 leave the 512 B
# rounding. The divisions are looked up per power-of-two interval from kRoundUpPowerOfTwoStart (1 MiB) on,
# kRoundUpPowerOfTwoIntervals (16) of them, the last for everything from 32 GiB up, the first for
# everything below 2 MiB (AllocatorConfig::roundup_power2_divisions(size), c10/core/AllocatorConfig.cpp
# @065861fb; c10/cuda/CUDAAllocatorConfig.cpp before 2.9). The single-int form ``roundup_power2_divisions:N``
# fills every interval with N, which must be a power of two (parseRoundUpPower2Divisions: isPowerOf2_64;
# no upper bound); the per-interval list form ``[256:1,512:2,>:4]`` (PR #87290, torch 2.0) is not modelled.
NO_ROUNDUP = 0  # no roundup_power2_divisions in PYTORCH_CUDA_ALLOC_CONF (the default: every interval 0)
# Above this no request up to kRoundUpPowerOfTwoEnd (64 GiB) exceeds kMinBlockSize * divisions: a larger
# setting changes nothing, so peakmem accepts powers of two up to it
MAX_ROUNDUP_DIVISIONS = (64 << 30) // K_MIN_BLOCK_SIZE


def roundup_divisions_ok(divisions: int) -> bool:
    """Whether ``divisions`` is a roundup_power2_divisions value PyTorch accepts (0 = not set, or a power
    of two: 1 and 2 .. MAX_ROUNDUP_DIVISIONS)."""
    return divisions == NO_ROUNDUP or (
        0 < divisions <= MAX_ROUNDUP_DIVISIONS and divisions & (divisions - 1) == 0
    )


def _next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: ``size`` rounded up to a multiple of its power-of-two floor over
    ``divisions`` (a power of two itself: kept)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:  # unreachable through round_request (size > kMinBlockSize * divisions); as the C++ does
        return floor << 1
    return -(-size // step) * step


def round_request(nbytes: int, divisions: int = NO_ROUNDUP) -> int:
    """Bytes one request really takes in a block (``round_size``): rounded to kMinBlockSize, or with
    ``roundup_power2_divisions`` (``divisions`` > 1) above kMinBlockSize * divisions to the next
    1/divisions step of its power-of-two interval."""
    if nbytes <= 0:
        return 0
    if divisions > 1 and nbytes > K_MIN_BLOCK_SIZE * divisions:
        return _next_division(nbytes, divisions)
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def roundup_extra(sizes: Iterable[int], divisions: int) -> int:
    """What ``roundup_power2_divisions`` adds over the 512 B rounding to the blocks of tensors of ``sizes``
    bytes (counted by max_memory_allocated and held in reserved segments)."""
    if divisions <= 1:
        return 0
    return sum(round_request(b, divisions) - round_request(b) for b in sizes)


def segment_size(nbytes: int) -> int:
    """The cudaMalloc size the allocator asks for when no cached block fits the request (``nbytes``: the
    request as :func:`round_request` rounded it, or raw)."""
    size = round_request(nbytes)
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def tensor_rounding(numel_list_bytes: tuple[int, ...]) -> int:
    """Extra bytes from kMinBlockSize rounding over a set of long-lived tensors."""
    return sum(round_request(b) - b for b in numel_list_bytes)


def reserved_bytes(
    *, resident: int, resident_rounding: int, churn: int, fragmentation: float, expandable: bool = False
) -> int:
    """Reserved at the peak: long-lived tensors packed in their segments (plus block rounding),
    and the churning part with its fragmentation slack; the total rounded to kRoundLarge.

    ``expandable``: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Each pool has one segment
    that grows by mapping pages (``ExpandableSegment``: 2 MiB pages for the small pool, kLargeBuffer
    = 20 MiB for the large one); freed blocks of the segment merge with their neighbours and serve any
    later request, so the churn carries no fragmentation slack and the total is rounded to a page."""
    if expandable:
        total = resident + resident_rounding + churn
        return -(-total // K_LARGE_BUFFER) * K_LARGE_BUFFER
    total = resident + resident_rounding + churn + int(churn * fragmentation)
    return -(-total // K_ROUND_LARGE) * K_ROUND_LARGE
