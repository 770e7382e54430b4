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


def round_request(nbytes: int) -> int:
    """Bytes one request really takes in a block (rounded to kMinBlockSize)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def segment_size(nbytes: int) -> int:
    """The cudaMalloc size the allocator asks for when no cached block fits the request."""
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
