"""Plots: the stack of each bar adds up to the device total; sweeps find where each GPU runs out."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from _web_fake import ACT_PER_TOKEN, CONTEXT, PARAMS, SLACK, FakeSpec, fake_estimate, fake_ways
from peakmem import plot
from peakmem.training import OptimizerImpl, TrainingSetup
from peakmem.units import GB, fmt_gb

SETUP = TrainingSetup(micro_batch=4, seq_len=1024)
GPU24 = SimpleNamespace(name="g24", display_name="Card 24GB", usable_bytes=24 * GB)
GPU80 = SimpleNamespace(name="g80", display_name="Card 80GB", usable_bytes=80 * GB)


def test_bar_segments_stack_to_device_total() -> None:
    est = fake_estimate(FakeSpec(), SETUP)
    segments = plot.bar_segments(est)
    assert [s.key for s in segments] == [
        "parameters", "gradients", "master_weights", "optimizer_states", "activations",
        plot.SLACK, plot.CONTEXT,
    ]  # fmt: skip
    by_key = {s.key: s.bytes for s in segments}
    assert by_key["activations"] == ACT_PER_TOKEN * 4 * 1024
    assert by_key[plot.SLACK] == SLACK and by_key[plot.CONTEXT] == CONTEXT
    expected = 16 * PARAMS + 4 * 1024 * ACT_PER_TOKEN + SLACK + CONTEXT
    assert sum(by_key.values()) == est.device_total_bytes == expected


def test_chart_json_has_one_bar_per_technique() -> None:
    est = fake_estimate(FakeSpec(), SETUP)
    ways = fake_ways(FakeSpec(), SETUP)
    bars = plot.chart_json(est, ways)
    assert [b["label"] for b in bars] == ["as asked", "LoRA", "batch 1"]
    for bar, e in zip(bars, [est, *(w for _, w in ways)], strict=True):
        assert sum(s["bytes"] for s in bar["segments"]) == bar["device_total_bytes"] == e.device_total_bytes


def test_max_fitting_is_exact_on_a_linear_total() -> None:
    # total(v) = 10 + 3 v: capacity 40 -> v = 10; capacity 12 -> 0 (even v = 1 needs 13).
    def total(v: int) -> int:
        return 10 + 3 * v

    assert plot.max_fitting(total, 40, 1000) == 10
    assert plot.max_fitting(total, 41, 1000) == 10
    assert plot.max_fitting(total, 43, 1000) == 11
    assert plot.max_fitting(total, 12, 1000) == 0
    assert plot.max_fitting(total, 10**9, 64) == 64


def test_limits_match_hand_derived_batch() -> None:
    # 16 GB of model states + 1 GB context/slack + 1.024 GB per batch row of 1024 tokens.
    fit = plot.limits(FakeSpec(), SETUP, [GPU24, GPU80], "batch", estimator=fake_estimate)
    assert fit["g24"] == (24 * GB - 16 * PARAMS - SLACK - CONTEXT) // (1024 * ACT_PER_TOKEN) == 6
    assert fit["g80"] == (80 * GB - 17 * GB) // (1024 * ACT_PER_TOKEN) == 61
    seq_fit = plot.limits(FakeSpec(), SETUP, [GPU24], "seq", estimator=fake_estimate)
    assert seq_fit["g24"] == (24 * GB - 16 * PARAMS - SLACK - CONTEXT) // (4 * ACT_PER_TOKEN) == 1750


def test_sweep_values() -> None:
    assert plot.sweep_values("batch", 1024, 3) == [1, 2, 3, 4, 8, 16, 32, 64, 128]
    assert plot.sweep_values("seq", 1024, 1024) == [128, 256, 512, 1024]
    assert plot.sweep_values("seq", 1000, 300) == [128, 256, 300, 512, 1000]


def test_bad_path_and_axis_are_input_errors(tmp_path: Path) -> None:
    from peakmem.errors import InputError

    est = fake_estimate(FakeSpec(), SETUP)
    with pytest.raises(InputError, match=r"\.png"):
        plot.plot_ways(est, [], [GPU24], tmp_path / "out.txt")
    with pytest.raises(InputError, match="axis"):
        plot.plot_sweep(FakeSpec(), SETUP, [GPU24], tmp_path / "x.png", axis="tokens",  # type: ignore[arg-type]
                        estimator=fake_estimate)  # fmt: skip


def test_plot_ways_svg_shows_the_tables_numbers(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    est = fake_estimate(FakeSpec(), SETUP)
    ways = fake_ways(FakeSpec(), SETUP)
    out = plot.plot_ways(est, ways, [GPU24, GPU80], tmp_path / "ways.svg")
    svg = out.read_text()
    for _, e in [("as asked", est), *ways]:
        assert fmt_gb(e.device_total_bytes) in svg
    for text in ("LoRA", "batch 1", "Card 24GB (24.0 GB)", "optimizer states", "activations"):
        assert text in svg


def test_plot_pngs_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    est = fake_estimate(FakeSpec(), SETUP)
    png = plot.plot_ways(est, fake_ways(FakeSpec(), SETUP), [GPU24, GPU80], tmp_path / "ways.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for axis in plot.AXES:
        out = plot.plot_sweep(FakeSpec(), SETUP, [GPU24, GPU80], tmp_path / f"{axis}.svg", axis,
                              estimator=fake_estimate)  # fmt: skip
        svg = out.read_text()
        assert "fits up to" in svg
    assert "batch 6" in (tmp_path / "batch.svg").read_text()
    assert "seq 1,750" in (tmp_path / "seq.svg").read_text()


def test_import_plot_and_web_stay_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, peakmem.plot, peakmem.web\n"
        "print(' '.join(m for m in ('matplotlib', 'fastapi', 'uvicorn', 'starlette') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_sweep_range_stops_past_the_last_crossing() -> None:
    values = [1, 2, 4, 8, 16, 32, 64, 128]
    assert plot.sweep_range(values, [3, 11, 0, 1]) == [1, 2, 4, 8, 16]
    assert plot.sweep_range(values, [0, 0, 1]) == [1, 2, 4, 8]  # at least four points
    assert plot.sweep_range(values, [128]) == values
    assert plot._densify([1, 2, 4], per_doubling=2) == [
        1,
        2,
        3,
        4,
    ]  # round(2 ** 0.5) = 1 dropped as a duplicate
    assert plot._densify([128, 1024], per_doubling=1) == [128, 256, 512, 1024]


def test_gpt2_xl_picture_shows_the_tables_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Done-when of issue 9: the picture's numbers equal the table's."""
    pytest.importorskip("matplotlib")
    from peakmem.cli import main
    from peakmem.estimate import estimate_training
    from peakmem.planner import ways_down
    from peakmem.resolve import resolve_gpu, resolve_model
    from peakmem.units import fmt_both

    spec = resolve_model("gpt2-xl")
    # what `peakmem train gpt2-xl --batch 4` asks (its AdamW step fused: peakmem.defaults)
    setup = TrainingSetup(micro_batch=4, seq_len=1024, optimizer_impl=OptimizerImpl.FUSED)
    est = estimate_training(spec, setup)
    gpus = [resolve_gpu("rtx-4090"), resolve_gpu("a100-80gb")]
    # the picture, the table and fit ask the planner, closing the gap to the smallest GPU given
    ways = ways_down(spec, setup, capacity_bytes=gpus[0].usable_bytes).pairs()
    svg = plot.plot_training(spec, setup, tmp_path / "gpt2xl.svg", gpus=gpus).read_text()
    assert main(["train", "gpt2-xl", "--batch", "4", "--markdown", "--gpu", "rtx-4090,a100-80gb"]) in (0, 1)
    table = capsys.readouterr().out
    for e in [est, *(w for _, w in ways)]:
        assert fmt_both(e.device_total_bytes) in table
        assert fmt_gb(e.device_total_bytes) in svg
    for label, _ in ways:
        assert label.split()[0] in svg
    assert "RTX 4090 (25.4 GB)" in svg  # what torch sees of it: 23.65 GiB (catalog driver_reserved_bytes)
    for kind in ("batch", "seq"):
        assert (
            plot.plot_training(spec, setup, tmp_path / f"{kind}.png", gpus=gpus, kind=kind).stat().st_size
            > 10_000
        )
