"""The caching-allocator replay of one FSDP rank's default stream (formulas/step_sequence.py ``sharded``,
step_parts.py ``sharded_parts``): hand-derived sequences on tiny sizes whose segments can be counted,
the gates of ``replayable``, and estimates whose reserved moves only up from the closed form.

Sizes are whole multiples of 2 MiB from 10 MiB up, so that each request is its own block and a new
segment is exactly its size (caching_allocator.py: ``kMinLargeAlloc`` 10 MiB, ``kRoundLarge`` 2 MiB;
a remainder above 1 MiB is split off)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peakmem.estimate import TrainingEstimator
from peakmem.formulas import step_sequence
from peakmem.formulas.allocator import DEFAULT_FRAGMENTATION
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.step_sequence import LayerTensors, StepTensors, _replay
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.resolve import resolve_model
from peakmem.training import Checkpointing, Method, Precision, ReduceDtype, TrainingSetup
from peakmem.units import MiB

W, S, F = 12 * MiB, 12 * MiB, 64 * MiB  # a weight shard, a layer's checkpoint, a T x V/tp fp32 shard
LOGITS = 1 * MiB  # the 16-bit logits, kept in the small pool here so that only F's blocks matter
SMALL = 2 * MiB  # the small pool's one 2 MiB segment (kSmallBuffer) for the logits


def _loss_parallel_step(states: tuple[int, ...] = ()) -> StepTensors:
    return StepTensors(
        weights=(W,), states=states, layers=(LayerTensors(count=2, saved=(S,)),),
        loss_parallel=(LOGITS, F), loss_saved=(F,), sharded=True,
    )  # fmt: skip


def test_loss_parallel_step_reuses_its_blocks_when_the_checkpoints_find_their_own() -> None:
    # step 1: W (segment 1), the two checkpoints (2, 3); loss_parallel's forward: pred.float() (4),
    # x - max (5), exp (6) freed, the log-softmax output into exp's block, the other two freed; its
    # backward: zeros_like (4), exp (5), their sum (new segment 7): four F at once with the saved output.
    # Step 2's checkpoints take the freed checkpoint blocks back: nothing new.
    r = _replay(_loss_parallel_step(), 2)
    assert (r.reserved, r.segments) == (W + 2 * S + 4 * F + SMALL, 7)
    # the backward's four F; the logits were freed before it (torchtitan's del pred)
    assert r.allocated == W + 2 * S + 4 * F


def test_step2_checkpoints_carved_from_the_loss_blocks_cost_the_loss_a_segment() -> None:
    # the same step with two 12 MiB optimizer states: created in step 1's optimizer step, they take the
    # two freed checkpoint blocks (best fit). Step 2's checkpoints then go to the smallest free block, a
    # 64 MiB loss block (the lowest address: pred.float()'s), one after the other in it (64 -> 52 -> 40);
    # the loss's forward takes the other three whole F blocks (copy, shifted, exp), and its backward's
    # third F (the sum) finds only the carved block's 40 MiB: a new 64 MiB segment.
    r = _replay(_loss_parallel_step(states=(S, S)), 2)
    assert (r.reserved, r.segments) == (W + 2 * S + 5 * F + SMALL, 8)
    assert r.reserved >= r.allocated


P, G, R = 20 * MiB, 10 * MiB, 40 * MiB  # a unit's unsharded parameters, its gradient, reduce input


def _fsdp2_units(count: int) -> StepTensors:
    return StepTensors(
        weights=(W,),
        layers=(LayerTensors(count=count, saved=(), unshard=(P,), grads=(G,), reduce_input=R),),
        sharded=True,
    )


def test_fsdp2_keeps_the_previous_reduce_scatter_input_until_the_next_units_reduce() -> None:
    # forward: each unit's parameters P are allocated at its unshard and freed at its reshard (one P
    # segment). Backward, the last layer: P, its gradient G, reshard, its reduce-scatter input R, G freed;
    # the first layer: P and G next to the kept R (W + P + G + R, the peak), reshard, the kept R reclaimed,
    # its own R into that block, G freed; the final callback drops it. Segments W, P, G, R: no more.
    r = _replay(_fsdp2_units(2), 2)
    assert (r.allocated, r.reserved, r.segments) == (W + P + G + R, W + P + G + R, 4)
    # one unit: no kept R beside its P and G; its own R comes after the reshard and before G is freed
    # (foreach_reduce frees the gradients after the copy-in): W + G + max(P, R)
    one = _replay(_fsdp2_units(1), 2)
    assert one.allocated == W + G + max(P, R)


def test_fsdp1_concatenates_a_units_gradients_into_its_flat_gradient() -> None:
    # FSDP1 (no default-stream unshard or reduce input): the views' gradients (G, G) then their flat
    # concatenation (2 G) alive together, then the views' freed; the hook reduces and frees the flat one
    flat = StepTensors(weights=(W,), layers=(LayerTensors(count=1, saved=(), grads=(G, G), flat_grad=2 * G),),
                       sharded=True)  # fmt: skip
    r = _replay(flat, 2)
    assert r.allocated == W + 4 * G
    # step 2 reuses: the two G segments and the 2 G one
    assert (r.reserved, r.segments) == (W + 4 * G, 4)


def test_shard_grad_op_keeps_every_unit_unsharded_from_forward_to_backward() -> None:
    step = replace(_fsdp2_units(3), keep_units=True)
    r = _replay(step, 2)
    # the three units' P stay from forward on; the last layer's backward: 3 P + G, its reshard (2 P + G),
    # its R before G is freed: W + 2 P + G + R, the peak (the next unit: 2 P + R + G, then P + R + G)
    assert r.allocated == W + 2 * P + G + R
    assert r.reserved >= r.allocated


# --- the estimate ------------------------------------------------------------------------------------
SPEC = resolve_model("llama-3.2-1b")
SETUP = TrainingSetup(seq_len=2048, micro_batch=2, checkpointing=Checkpointing.FULL)
REPLAYED = "reserved: two steps of these tensors replayed"


def _est(par: Parallelism, setup: TrainingSetup = SETUP, ov: Overheads | None = None):  # type: ignore[no-untyped-def]
    return TrainingEstimator(SPEC, ov).estimate(setup, par)


LAYOUTS = {
    "fsdp2": Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD),
    "fsdp2-tp2-sp": Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD, tp=2, sequence_parallel=True),
    "fsdp2-tp2-cp2": Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD, tp=2, cp=2, sequence_parallel=True),
    "fsdp1": Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD, fsdp_version=1),
    "fsdp2-grad-op": Parallelism(gpus=8, fsdp=FsdpMode.SHARD_GRAD_OP),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_sharded_estimate_replays_and_moves_reserved_only_up(name: str) -> None:
    par = LAYOUTS[name]
    est = _est(par)
    closed = _est(
        par, ov=Overheads(fragmentation=DEFAULT_FRAGMENTATION)
    )  # the same fraction, given: no replay
    assert any(a.startswith(REPLAYED) for a in est.assumptions)
    assert not any(a.startswith(REPLAYED) for a in closed.assumptions)
    assert est.peak_allocated_bytes == closed.peak_allocated_bytes
    assert est.peak_reserved_bytes >= closed.peak_reserved_bytes >= est.peak_allocated_bytes


def test_float8_all_gather_unshards_converted_weights_in_one_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3.2-1B (hidden 2048, 8 KV heads of 64, ffn 8192): a layer unit's converted Linear weights
    (q, o: 2048 x 2048; k, v: 512 x 2048; gate, up: 8192 x 2048; down: 2048 x 8192) unshard as 1-byte
    float8 data, its two norms (2048 each) in bf16; 8 ranks divide every first dimension (no padding)."""
    steps: list[StepTensors] = []
    replay = step_sequence.replay_steps

    def record(step: StepTensors, n: int = 2) -> step_sequence.Replayed:
        steps.append(step)
        return replay(step, n)

    monkeypatch.setattr("peakmem.step_parts._seq.replay_steps", record)
    setup = replace(SETUP, precision=Precision.FLOAT8_TENSORWISE, float8_all_gather=True)
    est = _est(LAYOUTS["fsdp2"], setup)
    assert any(a.startswith(REPLAYED) for a in est.assumptions)
    linear = 2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048
    assert sum(steps[0].layers[0].unshard) == linear * 1 + 2 * 2048 * 2


@pytest.mark.parametrize(
    "par, setup",
    [
        (Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD, pp=2), SETUP),
        (Parallelism(gpus=8, zero_stage=3), SETUP),
        (Parallelism(gpus=8), SETUP),  # DDP
        (Parallelism(gpus=8, tp=8), SETUP),  # TP without an engine
        (Parallelism(gpus=8, fsdp=FsdpMode.SHARD_GRAD_OP, fsdp_version=1), SETUP),
        (Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD), replace(SETUP, method=Method.LORA)),
    ],
    ids=["pp", "zero3", "ddp", "tp-only", "fsdp1-grad-op", "lora"],
)
def test_layouts_the_replay_does_not_describe_keep_the_closed_form(
    par: Parallelism, setup: TrainingSetup
) -> None:
    est = _est(par, setup)
    assert not any(a.startswith(REPLAYED) for a in est.assumptions)


def test_a_sharded_rank_reserves_its_default_stream_replay_beside_its_side_stream_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """reserved = max(closed form + the pools' idle bytes, the default stream's replay + the whole pools):
    the replay holds no side-stream block (StreamPools), which cached blocks of the default stream cannot
    serve. FSDP2 at 1 x 2048 under full checkpointing is a case where the replay decides."""
    seen: list[step_sequence.Replayed] = []
    replay = step_sequence.replay_steps

    def record(step: StepTensors, steps: int = 2) -> step_sequence.Replayed:
        seen.append(replay(step, steps))
        return seen[-1]

    monkeypatch.setattr("peakmem.step_parts._seq.replay_steps", record)
    par = LAYOUTS["fsdp2"]
    # torchtitan's fp32 reduce: its larger reduce-scatter inputs make the replay decide (under the HF
    # default's bf16 ones the closed form does)
    setup = replace(SETUP, micro_batch=1, fsdp_reduce_dtype=ReduceDtype.FP32)
    est, rs, _ = TrainingEstimator(SPEC).rank(setup, par)
    closed = _est(par, setup, Overheads(fragmentation=DEFAULT_FRAGMENTATION))
    pools = rs.side_pools.reduce_scatter + rs.side_pools.all_gather
    assert pools > 0 and len(seen) == 1  # a sharded rank replays every layer at once
    assert est.peak_reserved_bytes == seen[0].reserved + pools > closed.peak_reserved_bytes
