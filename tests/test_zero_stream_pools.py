"""DeepSpeed ZeRO's side-stream pools in the reserved bytes (peakmem.formulas.zero_streams), by hand.

Tiny spec (tests/test_parallel.py ``tiny``, mixed-bf16: 16-bit weights and gradients of 2 bytes):
276,032 parameters, every tensor divisible by 4; with ``param_persistence_threshold=100`` the 9 norms
(576 elements) stay whole, 275,456 are partitioned and gathered. Over 4 ranks each owns 69,008 elements
(a 138,016-byte bf16 gradient partition). ``reduce_bucket_size=20,000``: the reduce's ``torch.cat`` of a
bucket is 40,000 bytes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding, zero_streams
from peakmem.formulas.stream_pools import NO_POOLS, StreamPools
from peakmem.formulas.technique import technique
from peakmem.parallel import FsdpMode, Offload, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import Precision, TrainingSetup
from test_parallel import tiny

GATHERED = 2 * 275_456  # ZeRO-3's working set on the tiny model: every partitioned parameter, bf16
PART = 2 * 69_008  # one rank's bf16 gradient partition
CAT = 2 * 20_000  # a full bucket concatenated
Z3 = Parallelism(gpus=4, zero_stage=3, param_persistence_threshold=100, reduce_bucket_size=20_000)
SEQ8 = TrainingSetup(seq_len=8)


def _item(key: str, nbytes: int) -> MemoryItem:
    return MemoryItem(path=key, category=Category.TEMPORARIES, bytes=nbytes, source="test", key=key)


def _states(par: Parallelism, setup: TrainingSetup = SEQ8) -> sharding.RankStates:
    return sharding.rank_states(technique(tiny(), setup), setup, par, mp.stage_params(tiny(), par, 0))


def test_pools_by_hand() -> None:
    z2 = Parallelism(gpus=4, zero_stage=2, overlap_comm=True)
    args = dict(grad_partition=100, gathered=60, reduce_copies=30)
    # ZeRO-3 (overlap_comm on by default): the gathered parameters and the reduce's copies
    assert zero_streams.zero_stream_pools(Z3, **args) == StreamPools(all_gather=60, reduce_copies=30)
    # one rank gathers nothing (_no_gather_coalesced); the reduce still runs on its stream
    one = Parallelism(zero_stage=3)
    assert zero_streams.zero_stream_pools(one, **args) == StreamPools(reduce_copies=30)
    # ZeRO-1/2 with overlap_comm: the gradient partition; stage 2 under accumulation holds two
    assert zero_streams.zero_stream_pools(z2, **args) == StreamPools(reduce_scatter=100)
    assert zero_streams.zero_stream_pools(z2, grad_accum=2, **args).reduce_scatter == 200
    z1 = replace(z2, zero_stage=1)
    assert zero_streams.zero_stream_pools(z1, grad_accum=2, **args).reduce_scatter == 100
    # every stream is the default one without overlap_comm (stage 1/2's default, or asked off for 3);
    # no GPU partition with the optimizer offloaded; no contiguous buffer without contiguous_gradients
    for par in (
        replace(z2, overlap_comm=None),
        replace(Z3, overlap_comm=False),
        replace(z2, offload_optimizer=Offload.CPU),
        replace(z2, contiguous_gradients=False),
        Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD),
    ):
        assert zero_streams.zero_stream_pools(par, **args) is NO_POOLS


def test_idle_by_hand() -> None:
    pools = StreamPools(reduce_scatter=100, all_gather=60, reduce_copies=30)
    # the optimizer step holds nothing of them (the gathered parameters were partitioned before it)
    assert zero_streams.idle_bytes(pools, [_item("zero.fp32_grad", 999)]) == 190
    # a layer's backward holds the partition, the working set and the reduce's copies
    held = [_item("zero.grad_partition", 100), _item("zero3.gathered", 60), _item("zero3.reduce", 30)]
    assert zero_streams.idle_bytes(pools, held) == 0
    # forward: the working set only
    assert zero_streams.idle_bytes(pools, [_item("zero3.gathered", 60)]) == 130
    # the end-of-backward reduce (offload) also holds the still-gathered embedding: beyond the copies
    # pool its bytes count as gathered
    assert zero_streams.idle_bytes(pools, [_item("zero3.reduce_end", 50)]) == 100 + (60 - 20)
    with pytest.raises(ValueError, match="reduce_copies"):
        StreamPools(reduce_copies=-1)


def test_rank_states_pools() -> None:
    assert _states(Z3).side_pools == StreamPools(all_gather=GATHERED, reduce_copies=CAT)
    # fp16: has_overflow's isinf / isnan of the 69,008-element partition (one byte each) at the step is
    # more than a bucket's concatenation
    fp16 = TrainingSetup(seq_len=8, precision=Precision.MIXED_FP16)
    assert _states(Z3, fp16).side_pools == StreamPools(all_gather=GATHERED, reduce_copies=69_008)
    # offload: the embedding's (64,000 >= the bucket, divisible by 4: reduced in place) partition of
    # 16,000: its 16-bit GPU copy and fp64 norm (10 B each) beat the in-layer 40,000 + 2,048 x 10
    off = replace(Z3, offload_optimizer=Offload.CPU, offload_params=Offload.CPU)
    assert _states(off).side_pools == StreamPools(all_gather=GATHERED, reduce_copies=10 * 16_000)
    z2 = replace(Z3, zero_stage=2, overlap_comm=True)
    assert _states(z2).side_pools == StreamPools(reduce_scatter=PART)


def _side(par: Parallelism, setup: TrainingSetup) -> tuple[str, int]:
    est = estimate_ranks(tiny(), setup, par).most_loaded.estimate
    return est.peak_phase.value, int(est.extra.get("side_stream_pool_bytes", 0))  # type: ignore[call-overload]


def test_reserved_counts_the_idle_part() -> None:
    # seq 8: the peak is inside a layer's backward, reducing a bucket next to the working set: all held
    assert _side(Z3, TrainingSetup(seq_len=8)) == ("backward", 0)
    # seq 64: backward peaks at the loss (before any bucket is reduced): the copies' 40,000 are idle
    assert _side(Z3, TrainingSetup(seq_len=64)) == ("backward", CAT)
    # ZeRO-2, overlap_comm, 2 micro-batches: backward holds both partitions (the accumulated one and the
    # micro-batch's own, tests/test_zero_grads_alloc.py): allocated, none of the pool idle
    z2 = replace(Z3, zero_stage=2, overlap_comm=True)
    assert _side(z2, TrainingSetup(seq_len=64, grad_accum=2)) == ("backward", 0)
    assert _side(z2, TrainingSetup(seq_len=64)) == ("backward", 0)
    # ZeRO-1, 2 micro-batches: full gradients until the boundary; its partition is idle in backward
    assert _side(replace(z2, zero_stage=1), TrainingSetup(seq_len=64, grad_accum=2)) == ("backward", PART)


def test_reserved_adds_exactly_the_idle_bytes() -> None:
    # the same step without overlap_comm has no side streams: reserved differs by the idle bytes only
    setup = TrainingSetup(seq_len=64)
    on = estimate_ranks(tiny(), setup, Z3).most_loaded.estimate
    off = estimate_ranks(tiny(), setup, replace(Z3, overlap_comm=False)).most_loaded.estimate
    assert on.peak_allocated_bytes == off.peak_allocated_bytes
    assert on.peak_reserved_bytes - off.peak_reserved_bytes == CAT
    assert "side_stream_pool_bytes" not in off.extra
