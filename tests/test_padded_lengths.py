"""Batches padded to varying lengths (``--padded-lengths varying``; formulas/padded_lengths.py): the lengths
replayed, a hand-derived replay of two lengths through one allocator state, and what the estimate does
with it (reserved grows, allocated stays the longest batch's, the default is unchanged). About 1 s."""

from __future__ import annotations

from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest

from peakmem.catalog import Gpu
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas import padded_lengths as pl
from peakmem.formulas import step_sequence as seq
from peakmem.hf import spec_from_config
from peakmem.options import convert
from peakmem.training import Checkpointing, Method, PaddedLengths, Precision, TrainingSetup
from peakmem.units import MiB, fmt_both

# a Llama whose activations and logits take the large pool (tiny_models' 64-wide one stays below 1 MiB)
MID = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 512,
    "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
    "max_position_embeddings": 2048,
}  # fmt: skip


def test_lengths_rise_to_seq_then_repeat_it() -> None:
    assert pl.lengths(512) == (64, 128, 192, 256, 320, 384, 448, 512, 512)
    assert pl.lengths(4) == (1, 2, 3, 4, 4)  # seq x k // 8 floored to 1 token, repeats dropped
    assert pl.lengths(1) == (1, 1)
    assert pl.lengths(512, longest_first=True) == (512, 64, 128, 192, 256, 320, 384, 448, 512, 512)


def test_only_a_longest_first_loop_with_varying_lengths_runs_its_longest_batch_first() -> None:
    from peakmem.training import Framework

    lit23 = TrainingSetup(framework=Framework.LITGPT_2023, padded_lengths=PaddedLengths.VARYING)
    assert pl.first_is_longest(lit23)
    assert not pl.first_is_longest(replace(lit23, padded_lengths=PaddedLengths.FIXED))  # every batch --seq
    assert not pl.first_is_longest(replace(lit23, framework=Framework.LITGPT))  # 2024: a shuffled DataLoader
    assert not pl.first_is_longest(replace(lit23, framework=Framework.HF))


def _one_layer(saved: int) -> seq.StepTensors:
    return seq.StepTensors(weights=(), layers=(seq.LayerTensors(count=1, saved=(saved,)),))


def test_two_lengths_whose_segments_cannot_be_reused_reserve_their_sum() -> None:
    """A 12 MiB activation, then a 24 MiB one: the freed 12 MiB segment (>= kMinLargeAlloc: its own
    size) cannot hold the longer batch's tensor, so a 24 MiB segment is cut beside it: 36 MiB reserved,
    where the longer batch alone reserves 24 MiB. The other order reserves 24 MiB: the 24 MiB block is
    split for the 12 MiB tensor (remainder 12 MiB > kSmallSize) and merges back when it is freed."""
    short, long = _one_layer(12 * MiB), _one_layer(24 * MiB)
    assert seq.replay_lengths((short, long)).reserved == 36 * MiB
    assert seq.replay_steps(long).reserved == 24 * MiB
    assert seq.replay_lengths((long, short)).reserved == 24 * MiB
    assert seq.replay_lengths((short, long)).allocated == 24 * MiB  # one batch's tensor at a time


def test_one_length_replays_as_the_fixed_step() -> None:
    """The fixed step's two steps are the lengths replay of the same step, once per micro-batch."""
    step = replace(_one_layer(12 * MiB), micro_batches=4, weights=(30 * MiB,))
    assert seq.replay_lengths((step,) * 4) == seq.replay_steps(step)


@pytest.mark.parametrize("method", [Method.FULL, Method.LORA])
def test_varying_lengths_grow_reserved_only(method: Method) -> None:
    spec = spec_from_config(dict(MID), name="mid-llama")
    fixed = TrainingSetup(method=method, precision=Precision.BF16, micro_batch=2, seq_len=1024,
                          checkpointing=Checkpointing.FULL)  # fmt: skip
    varying = replace(fixed, padded_lengths=PaddedLengths.VARYING)
    a, b = estimate_training(spec, fixed), estimate_training(spec, varying)
    assert b.peak_allocated_bytes == a.peak_allocated_bytes  # the longest batch's step
    assert b.peak_reserved_bytes > a.peak_reserved_bytes
    assert any(x.startswith("padded lengths varying: the step replayed") for x in b.assumptions)
    assert not any("padded lengths" in x for x in a.assumptions)


def test_not_replayed_says_so() -> None:
    spec = spec_from_config(dict(MID), name="mid-llama")
    setup = TrainingSetup(optimizer="adafactor", seq_len=256, padded_lengths=PaddedLengths.VARYING)  # type: ignore[arg-type]
    est = estimate_training(spec, setup)
    assert pl.NOT_REPLAYED in est.assumptions
    assert (
        est.peak_reserved_bytes
        == estimate_training(spec, replace(setup, padded_lengths="fixed")).peak_reserved_bytes
    )  # type: ignore[arg-type]


def test_bad_value_is_one_line_naming_the_field() -> None:
    with pytest.raises(InputError, match="padded_lengths='sometimes'") as err:
        TrainingSetup(padded_lengths="sometimes")  # type: ignore[arg-type]
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="padded_lengths"):
        convert("train", {"padded_lengths": "sometimes"})


@pytest.mark.parametrize("method", [Method.FULL, Method.LORA])
def test_the_cache_varying_lengths_leave_is_not_needed(method: Method) -> None:
    """What a card must hold is the fixed-length step's device total: the growth is cache the allocator frees
    before it raises an OOM (CUDACachingAllocator ``malloc``: ``release_cached_blocks``, then retry)."""
    spec = spec_from_config(dict(MID), name="mid-llama")
    fixed = TrainingSetup(
        method=method, precision=Precision.BF16, seq_len=1024, checkpointing=Checkpointing.FULL
    )
    varying = replace(fixed, padded_lengths=PaddedLengths.VARYING)
    a, b = estimate_training(spec, fixed), estimate_training(spec, varying)
    assert b.releasable_bytes == b.peak_reserved_bytes - a.peak_reserved_bytes > 0
    assert b.needed_bytes == a.device_total_bytes == a.needed_bytes and a.releasable_bytes == 0
    assert b.device_total_bytes == b.needed_bytes + b.releasable_bytes  # what a card with room shows
    assert b.band is not None and b.needed_high_bytes == b.band.device_total.high - b.releasable_bytes
    assert any(pl.RELEASE in x for x in b.assumptions)


def test_a_card_between_the_need_and_the_device_total_fits(tmp_path: Path) -> None:
    """A job fits a card that holds what it needs but not the cache a card with room would keep: the verdict,
    the headline (the need, the cache named), and the CLI's ``train`` and ``fit`` alike."""
    import json

    import peakmem
    from peakmem.answers import train_headline, verdicts_of
    from peakmem.cli import main
    from peakmem.resolve import gpu_of_size

    def between(need: int, total: int) -> Gpu:
        card = gpu_of_size(f"{(need + total) // 2 / 1e9:.3f}GB")
        assert need <= card.usable_bytes < total  # the case this test is about
        return card

    spec = spec_from_config(dict(MID), name="mid-llama")
    setup = TrainingSetup(method=Method.FULL, seq_len=1024, padded_lengths=PaddedLengths.VARYING)
    est = estimate_training(spec, setup)
    card = between(est.needed_bytes, est.device_total_bytes)
    (v,) = verdicts_of(est, [card])
    assert v.fits and v.headroom_bytes == card.usable_bytes - est.needed_bytes
    line = train_headline("mid-llama", setup, est)
    assert fmt_both(est.needed_bytes) in line and "frees before an out-of-memory error" in line
    (tmp_path / "config.json").write_text(json.dumps(MID))
    asked = peakmem.train(str(tmp_path), seq=1024, padded_lengths="varying").data
    card = between(asked["needed_bytes"], asked["device_total_bytes"])
    out = tmp_path / "out.json"
    for verb in ("train", "fit"):
        with out.open("w") as f, redirect_stdout(f):
            code = main([verb, str(tmp_path), "--seq", "1024", "--padded-lengths", "varying",
                         "--gpu", card.name, "--json"])  # fmt: skip
        got = json.loads(out.read_text())
        assert code == 0 and got["needed_bytes"] == asked["needed_bytes"], verb
