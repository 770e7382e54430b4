"""PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions: round_size by hand from c10/cuda/CUDACachingAllocator.cpp
(round_size, roundup_power2_next_division), a replay with and without it, the option and --from axolotl."""

from __future__ import annotations

import pytest

from peakmem.breakdown import Category, MemoryItem, Phase, PhasePeak
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas import allocator
from peakmem.formulas.block_rounding import parameter_shaped_extra, phase_extra, with_roundup
from peakmem.formulas.caching_allocator import replay
from peakmem.formulas.overhead import Overheads
from peakmem.hf import spec_from_config
from peakmem.training import TrainingSetup
from peakmem.units import GiB, MiB
from tiny_models import LLAMA


def test_round_size_by_hand() -> None:
    # 16,588,800 B lies in [2^23, 2^24): 16 divisions of 2^23 are 524,288 B steps; 31.64 steps -> 32 = 2^24
    assert allocator.round_request(16_588_800, 16) == 16_777_216
    assert allocator.round_request(16_588_800) == 16_588_800  # a multiple of 512 already
    assert allocator.round_request(16 * MiB, 16) == 16 * MiB  # a power of two is kept
    # the threshold is kMinBlockSize x divisions = 8192 B: at and below it only the 512 B rounding
    assert allocator.round_request(8192, 16) == 8192
    assert allocator.round_request(8000, 16) == 8192
    # 8193 B: floor 8192, step 8192 / 16 = 512 -> 8704
    assert allocator.round_request(8193, 16) == 8704
    # the C++ comment's example (1200 B, 4 divisions -> 1280) is below 512 x 4 = 2048: 512 B rounding
    assert allocator.round_request(1200, 4) == 1536
    # 3 GiB + 1 with 4 divisions: floor 2 GiB, step 512 MiB -> 3.5 GiB
    assert allocator.round_request(3 * GiB + 1, 4) == 3 * GiB + 512 * MiB
    # 0 (not set) and 1 leave the 512 B rounding (round_size tests divisions > 1)
    for off in (0, 1):
        assert allocator.round_request(16_588_801, off) == 16_589_312
    assert allocator.round_request(0, 16) == 0


def test_roundup_extra_over_512_byte_rounding() -> None:
    # 6,990,336 B (a multiple of 512): floor 2^22, step 262,144; 26.67 steps -> 27 x 262,144 = 7,077,888
    assert allocator.roundup_extra((6_990_336, 100, 8192), 16) == 7_077_888 - 6_990_336
    assert allocator.roundup_extra((6_990_336,), 1) == 0


def test_replay_with_and_without_roundup() -> None:
    # three requests of 6,990,336 B, each 1-10 MiB: a 20 MiB segment (kLargeBuffer), split while the rest is
    # over 1 MiB. Without roundup the three take 20,971,008 B; the last 512 B cannot be split off, so the
    # third block is the whole rest: allocated = the segment
    events = [(1, 6_990_336), (2, 6_990_336), (3, 6_990_336)]
    off = replay(events)
    assert (off.peak_allocated, off.peak_reserved, off.segments) == (20 * MiB, 20 * MiB, 1)
    # with 16 divisions each block is 7,077,888 B: two fit (6,815,744 B left), the third needs a new segment
    on = replay(events, divisions=16)
    assert (on.peak_allocated, on.peak_reserved, on.segments) == (3 * 7_077_888, 40 * MiB, 2)


def test_parameter_shaped_items_spread_over_the_spec_tensors() -> None:
    sizes = ((4_000_000, 2), (1000, 3))  # (elements, count)
    # 16,006,000 B of bf16 over 8,003,000 elements: 8,000,000 B per large tensor (a multiple of 512);
    # 16 divisions: 31 steps of 262,144 = 8,126,464; the 2,000 B tensors are under 8192 B: nothing
    assert parameter_shaped_extra(16_006_000, sizes, 16) == 2 * (8_126_464 - 8_000_000)
    weights = MemoryItem(path="weights", category=Category.PARAMETERS, bytes=16_006_000)
    acts = MemoryItem(path="acts", category=Category.ACTIVATIONS, bytes=2 * 6_990_336, tensors=2)
    assert phase_extra((weights, acts), sizes, 16) == 2 * 126_464 + 2 * 87_552
    assert phase_extra((weights, acts), sizes, 0) == 0


def test_estimate_adds_one_item_to_allocated_and_reserved() -> None:
    spec = spec_from_config(dict(LLAMA))
    setup = TrainingSetup(micro_batch=2, seq_len=64)
    off = estimate_training(spec, setup)
    on = estimate_training(spec, setup, overheads=Overheads(alloc_roundup_divisions=16))
    item = next(i for i in on.items if i.key == "allocator.roundup")
    assert item.bytes > 0  # the 1000 x 64 embedding (128,000 B) alone: 131,072 B blocks
    assert on.peak_allocated_bytes == off.peak_allocated_bytes + item.bytes
    assert on.peak_reserved_bytes >= off.peak_reserved_bytes
    assert on.extra["alloc_roundup_divisions"] == 16
    assert any("roundup_power2_divisions:16" in a for a in on.assumptions)
    peak = PhasePeak(phase=Phase.FORWARD, bytes=1, items=())
    assert with_roundup(peak, spec, 16) is peak  # nothing to round: the phase itself


@pytest.mark.parametrize("bad", [3, -2, 48, 1 << 28, True, 2.0])
def test_bad_divisions_name_the_field(bad: object) -> None:
    with pytest.raises(InputError, match=r"^alloc_roundup_divisions="):
        Overheads(alloc_roundup_divisions=bad)  # type: ignore[arg-type]


def test_cli_refuses_a_bad_value_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "gpt2", "--alloc-roundup-divisions", "12", "--json"]) == 2
    err = capsys.readouterr().err
    assert "alloc_roundup_divisions=12" in err and "Traceback" not in err


def test_serving_applies_it_to_generate_not_to_vllm() -> None:
    from peakmem.formulas.serving import estimate_inference
    from peakmem.inference import Engine, InferenceSetup

    spec = spec_from_config(dict(LLAMA))
    ov = Overheads(alloc_roundup_divisions=16)
    hf = InferenceSetup(engine=Engine.HF, batch=2, context=128)
    off, on = estimate_inference(spec, hf), estimate_inference(spec, hf, overheads=ov)
    item = next(i for i in on.items if i.key == "allocator.roundup")
    assert on.peak_allocated_bytes == off.peak_allocated_bytes + item.bytes > off.peak_allocated_bytes
    vllm = InferenceSetup(engine=Engine.VLLM, batch=2, context=128)
    base, same = estimate_inference(spec, vllm), estimate_inference(spec, vllm, overheads=ov)
    assert same.peak_allocated_bytes == base.peak_allocated_bytes
    assert any("not applied" in a for a in same.assumptions)
