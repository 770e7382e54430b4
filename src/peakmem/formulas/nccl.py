"""NCCL communicators: the device buffers each process group's communicator takes.

They live outside PyTorch's caching allocator: NCCL cudaMallocs them at a group's first collective.
"""

from __future__ import annotations

from peakmem.parallel import Parallelism
from peakmem.units import MiB

# NCCL communicator buffers (outside PyTorch's allocator; cudaMalloc'd by NCCL at the first collective).
# NCCL src/include/device.h (v2.2x): NCCL_STEPS=8; Simple protocol buffer NCCL_BUFFSIZE=4 MiB (docs
# "Environment variables"); LL128: NCCL_LL128_ELEMS_PER_THREAD(120) x NCCL_LL128_MAX_NTHREADS(640) x
# NCCL_STEPS x 8 B; LL: NCCL_LL_LINES_PER_THREAD(8) x NCCL_LL_MAX_NTHREADS(512) x NCCL_STEPS x 16 B.
NCCL_SIMPLE_BYTES = 4 * MiB
NCCL_LL128_BYTES = 120 * 640 * 8 * 8
NCCL_LL_BYTES = 8 * 512 * 8 * 16
NCCL_CHANNELS = 16  # assumed: NCCL picks 2-32 channels by topology (NCCL_MIN/MAX_NCHANNELS)
NCCL_CONNECTIONS = 2  # ring + tree receive connections per channel (assumed)


def nccl_communicator_bytes() -> int:
    """Device bytes one NCCL communicator takes for its receive buffers (an estimate, see above)."""
    per_conn = NCCL_SIMPLE_BYTES + NCCL_LL128_BYTES + NCCL_LL_BYTES
    return NCCL_CHANNELS * NCCL_CONNECTIONS * per_conn


def communicators(par: Parallelism) -> int:
    """Process groups with more than one rank that a rank communicates in (dp, tp, pp, cp, ep, and the
    Ulysses group; gradients are reduced over dp x cp x ulysses: DeepSpeed ``seq_data_parallel_group``)."""
    groups = (par.dp * par.cp * par.ulysses, par.tp, par.pp, par.cp, par.ep, par.ulysses)
    return sum(1 for d in groups if d > 1) if par.gpus > 1 else 0
