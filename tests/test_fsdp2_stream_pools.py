"""FSDP's side-stream pools in the reserved bytes (formulas/fsdp2.py StreamPools), derived by hand on the
tiny spec of test_parallel (276,032 parameters: 4 layers of 36,992, a root of 128,064: embeddings
64,000 + final norm 64 + head 64,000), 4 ranks, every dimension divisible by 4 (no padding)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peakmem.breakdown import Phase
from peakmem.formulas import fsdp2
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import Precision, TrainingSetup
from test_parallel import tiny

P, LAYER, ROOT = 276_032, 36_992, 128_064
SETUP = TrainingSetup(seq_len=64)  # mixed-bf16: fp32 shards (master), bf16 all-gathers
FSDP4 = Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD)


def test_pools_by_hand() -> None:
    pools = fsdp2.stream_pools(grads=100, root=40, unit=10)
    assert (pools.reduce_scatter, pools.all_gather, pools.in_use) == (100, 50, 10)
    # no root unit: the kept output and the next unit's
    assert fsdp2.stream_pools(grads=100, root=0, unit=10).all_gather == 20
    # one rank: FSDP2 gathers nothing but still copies its reduce-scatter output; FSDP1's NO_SHARD keeps
    # its pools (the low-precision parameters and the gradient casts are still made on its side streams)
    assert fsdp2.stream_pools(grads=100, root=40, unit=10, world=1) == fsdp2.StreamPools(reduce_scatter=100)
    one = fsdp2.stream_pools(grads=100, root=40, unit=10, version=1, world=1)
    assert one == fsdp2.stream_pools(grads=100, root=40, unit=10, version=1)
    # FSDP1: the unsharded flat parameters themselves (root, running unit, prefetched unit), all in use
    assert fsdp2.stream_pools(grads=100, root=40, unit=10, version=1) == fsdp2.StreamPools(
        reduce_scatter=100, all_gather=60, in_use=60
    )
    # what the peak holds of a pool is not idle; never below zero
    assert fsdp2.idle_pool_bytes(pools, grads_alive=30, gathered_alive=10) == 70 + 40
    assert fsdp2.idle_pool_bytes(pools, grads_alive=200, gathered_alive=60) == 0
    with pytest.raises(ValueError, match="reduce_scatter"):
        fsdp2.StreamPools(reduce_scatter=-1)


def _estimate(setup: TrainingSetup, par: Parallelism = FSDP4):  # type: ignore[no-untyped-def]
    return estimate_ranks(tiny(), setup, par).most_loaded.estimate


def test_rank_states_pools() -> None:
    from peakmem.formulas import model_parallel as mp
    from peakmem.formulas import sharding
    from peakmem.formulas.technique import technique

    st = sharding.rank_states(technique(tiny(), SETUP), SETUP, FSDP4, mp.stage_params(tiny(), FSDP4, 0))
    # sharded fp32 gradients 4 B x P / 4; the root's bf16 all-gather output kept while the first layer
    # unit's arrives (2 B x ROOT + 2 B x LAYER)
    assert st.side_pools == fsdp2.StreamPools(
        reduce_scatter=P, all_gather=2 * ROOT + 2 * LAYER, in_use=2 * LAYER
    )
    fsdp1 = replace(FSDP4, fsdp_version=1)
    assert sharding.rank_states(
        technique(tiny(), SETUP), SETUP, fsdp1, mp.stage_params(tiny(), fsdp1, 0)
    ).side_pools == fsdp2.StreamPools(
        reduce_scatter=P, all_gather=2 * ROOT + 4 * LAYER, in_use=2 * ROOT + 4 * LAYER
    )


def test_idle_at_the_loss() -> None:
    """The tiny step peaks where backward starts (no layer done): no sharded gradient exists yet and one
    unit's all-gather output (the root's prefetch of the first layer unit) is alive, so the whole
    reduce-scatter pool and the root's share of the all-gather pool are idle."""
    est = _estimate(SETUP)
    assert est.peak_phase is Phase.BACKWARD and est.extra["backward_peak_layers_done"] == 0
    assert est.extra["side_stream_pool_bytes"] == P + 2 * ROOT == 532_160
    assert est.peak_reserved_bytes >= est.peak_allocated_bytes + 532_160


def test_resident_gradients_fill_the_reduce_scatter_pool() -> None:
    # accumulation: the sharded gradients of the earlier micro-batches are alive at the peak
    assert _estimate(replace(SETUP, grad_accum=2)).extra["side_stream_pool_bytes"] == 2 * ROOT
    # fp32 with zero_grad(set_to_none=False): they live through the next forward too
    fp32 = replace(SETUP, precision=Precision.FP32, grads_set_to_none=False)
    assert _estimate(fp32).extra["side_stream_pool_bytes"] == 4 * ROOT  # fp32 all-gathers


def test_fsdp1_reduce_scatter_pool_idle_at_the_loss() -> None:
    """FSDP1: the flat units are multiples of 4 here (36,992 and 128,064), so the sharded fp32 gradients
    are P bytes; its unsharded parameters are all in use in forward and backward."""
    est = _estimate(SETUP, replace(FSDP4, fsdp_version=1))
    assert est.peak_phase is Phase.BACKWARD and est.extra["backward_peak_layers_done"] == 0
    assert est.extra["side_stream_pool_bytes"] == P


def test_other_engines_have_no_side_pools() -> None:
    # DDP's reducer stays on the default stream; DeepSpeed ZeRO's pools: tests/test_zero_stream_pools.py
    for par in (Parallelism(gpus=4), Parallelism(gpus=4, zero_stage=3, overlap_comm=False)):
        assert "side_stream_pool_bytes" not in _estimate(SETUP, par).extra
