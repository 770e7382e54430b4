"""DeepSpeed ZeRO-1/2 gradient buffers under gradient accumulation, as allocated, by hand.

DeepSpeed stage_1_and_2.py (git 38327e0; the same code in v0.7.0, v0.10.0, v0.14.0):
* stage 2 runs ``independent_gradient_partition_epilogue`` after every micro-batch; ``averaged_gradients``
  keeps views of the first ``grads_in_partition`` while the next micro-batch's ``copy_grads_in_partition``
  allocates a second one (``if self.grads_in_partition is None``), so backward of micro-batches 2..k holds
  two 16-bit partitions next to the ipg bucket;
* ``backward`` allocates the ipg buffer(s) every micro-batch; stage 1 releases them only at the boundary's
  epilogue, so under accumulation they stay through the forward of micro-batches 2..k.

Tiny spec (tests/test_parallel.py ``tiny``, mixed-bf16): 276,032 parameters; over 4 ranks DeepSpeed pads
to 2 x N and each rank owns ceil(276,032 / 8) * 2 = 69,008 elements, a 138,016-byte bf16 partition.
``reduce_bucket_size=20,000``: one bf16 ipg buffer is 40,000 bytes, two with ``overlap_comm``.
"""

from __future__ import annotations

from peakmem.breakdown import MemoryItem
from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding
from peakmem.formulas.technique import technique
from peakmem.parallel import Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import TrainingSetup
from test_parallel import tiny

PART = 2 * 69_008
IPG = 2 * 20_000


def _states(par: Parallelism, setup: TrainingSetup) -> sharding.RankStates:
    return sharding.rank_states(technique(tiny(), setup), setup, par, mp.stage_params(tiny(), par, 0))


def _sum(items: tuple[MemoryItem, ...], key: str) -> int:
    return sum(i.bytes for i in items if i.key == key)


def test_stage2_accumulation_holds_two_partitions_in_backward() -> None:
    for overlap, ipg in ((False, IPG), (True, 2 * IPG)):
        par = Parallelism(gpus=4, zero_stage=2, reduce_bucket_size=20_000, overlap_comm=overlap)
        one = _states(par, TrainingSetup(seq_len=8))
        four = _states(par, TrainingSetup(seq_len=8, grad_accum=4))
        # between micro-batches: the accumulated partition only (the ipg buffers are released)
        assert _sum(four.accumulated, "zero.grad_partition") == PART
        assert _sum(four.accumulated, "zero.ipg") == 0
        # in backward: the accumulated one, the micro-batch's own one, and the ipg buffer(s)
        assert _sum(four.grads_backward, "zero.grad_partition") == 2 * PART
        assert _sum(four.grads_backward, "zero.ipg") == ipg
        assert _sum(one.grads_backward, "zero.grad_partition") == PART
        # the step reads one partition (the second was added in and freed by zero_grad)
        assert _sum(four.step_grads, "zero.grad_partition") == PART


def test_stage2_accumulation_backward_peak_grows_by_one_partition() -> None:
    par = Parallelism(gpus=4, zero_stage=2, reduce_bucket_size=20_000)
    setup = TrainingSetup(seq_len=8, grad_accum=4)
    est = estimate_ranks(tiny(), setup, par).most_loaded.estimate
    bwd = est.phases[1]
    assert bwd.phase.value == "backward"
    grads = [i for i in bwd.items if i.key == "zero.grad_partition"]
    assert sorted(i.bytes for i in grads) == [PART, PART]
    assert len({i.path for i in grads}) == 2


def test_stage1_accumulation_keeps_the_ipg_buffers_between_micro_batches() -> None:
    for overlap, ipg in ((False, IPG), (True, 2 * IPG)):
        par = Parallelism(gpus=4, zero_stage=1, reduce_bucket_size=20_000, overlap_comm=overlap)
        four = _states(par, TrainingSetup(seq_len=8, grad_accum=4))
        assert _sum(four.accumulated, "zero.ipg") == ipg
        assert _sum(four.accumulated, "grads") == 2 * 276_032  # full bf16 gradients until the boundary
        # counted once in backward: the timeline drops accumulated items from the backward-only ones
        assert [i for i in four.grads_backward if i.key == "zero.ipg"] == [
            i for i in four.accumulated if i.key == "zero.ipg"
        ]
        one = _states(par, TrainingSetup(seq_len=8))
        assert _sum(one.accumulated, "zero.ipg") == 0
