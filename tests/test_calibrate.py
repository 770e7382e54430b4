"""``peakmem calibrate`` and ``--profile``: context and fragmentation fitted from hand-made numbers,
the profile's round trip through an env-overridden config folder, and what a profile changes.

Hand-derived case (MiB): allocated peak 10,240, of which 6,144 persistent (parameters + optimizer
states), reserved peak 11,264, nvidia-smi 11,964 -> context = 11,964 - 11,264 = 700 MiB and
fragmentation = (11,264 - 10,240) / (10,240 - 6,144) = 1,024 / 4,096 = 0.25.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import _snapshots as S
from peakmem.calibrate import (
    CONFIG_DIR_ENV,
    Measurement,
    Profile,
    fit_profile,
    load_profile,
    measurement_from_memory_stats,
    parse_nvidia_smi_used,
    profiles_dir,
    save_profile,
)
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas.overhead import Overheads
from peakmem.measure.snapshot import replay
from peakmem.resolve import resolve_model
from peakmem.training import OptimizerImpl, TrainingSetup
from peakmem.units import GiB, MiB

ALLOC, PERSIST, RESERVED, SMI = 10240 * MiB, 6144 * MiB, 11264 * MiB, 11964 * MiB
STATS = {"allocated_bytes.all.peak": ALLOC, "reserved_bytes.all.peak": RESERVED,
         "allocated_bytes.all.current": PERSIST, "num_alloc_retries": 0}  # fmt: skip


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "config"
    monkeypatch.setenv(CONFIG_DIR_ENV, str(folder))
    return folder


def test_fit_hand_derived() -> None:
    m = Measurement(source="hand", peak_allocated_bytes=ALLOC, peak_reserved_bytes=RESERVED,
                    device_total_bytes=SMI, persistent_bytes=PERSIST)  # fmt: skip
    assert m.context_bytes == 700 * MiB and m.fragmentation == 0.25
    p = fit_profile("h200", [m])
    assert (p.context_bytes, p.fragmentation) == (700 * MiB, 0.25)
    ov = p.overheads()
    assert (
        ov.profile == "h200"
        and ov.context_bytes == 700 * MiB
        and "calibrated profile 'h200'" in ov.context_source
    )


def test_fit_takes_the_median_and_keeps_defaults_it_cannot_fit() -> None:
    ms = [
        Measurement(
            source=str(i),
            peak_allocated_bytes=ALLOC,
            peak_reserved_bytes=ALLOC + extra,
            device_total_bytes=ALLOC + extra + ctx,
            persistent_bytes=PERSIST,
        )
        for i, (extra, ctx) in enumerate([(0, 500 * MiB), (1024 * MiB, 600 * MiB), (2048 * MiB, 900 * MiB)])
    ]
    p = fit_profile("x", ms)
    assert p.context_bytes == 600 * MiB and p.fragmentation == 0.25  # medians of (0, .25, .5)
    bare = fit_profile(
        "y", [Measurement(source="s", peak_allocated_bytes=ALLOC, peak_reserved_bytes=RESERVED)]
    )
    assert bare.context_bytes == Overheads().context_bytes and bare.fragmentation == Overheads().fraction
    assert any("default kept" in n for n in bare.notes)


def test_memory_stats_and_nvidia_smi_forms(tmp_path: Path) -> None:
    assert parse_nvidia_smi_used("11964") == (SMI, None)  # nvidia-smi prints MiB
    assert parse_nvidia_smi_used("11964MiB") == (SMI, None)
    assert parse_nvidia_smi_used("40.1GiB")[0] == int(40.1 * GiB) + 1  # parse_size rounds up
    csv = "name, memory.used [MiB], memory.total [MiB]\nNVIDIA H200, 11964 MiB, 143771 MiB\n"
    assert parse_nvidia_smi_used(csv) == (SMI, "NVIDIA H200")
    m = measurement_from_memory_stats(STATS, "stats", device_total_bytes=SMI)
    assert (m.context_bytes, m.fragmentation) == (700 * MiB, 0.25)
    with pytest.raises(InputError, match="memory_stats"):
        measurement_from_memory_stats({"allocated_bytes.all.peak": 1}, "stats")


def test_profile_round_trip(config_dir: Path) -> None:
    m = measurement_from_memory_stats(STATS, "stats", device_total_bytes=SMI, gpu="NVIDIA H200")
    saved = fit_profile("h200-test", [m])
    path = save_profile(saved)
    assert path == config_dir / "profiles" / "h200-test.json" and profiles_dir() == config_dir / "profiles"
    loaded = load_profile("h200-test")
    assert loaded == saved and loaded.gpu == "NVIDIA H200"
    with pytest.raises(InputError, match=r"no such profile.*did you mean h200-test"):
        load_profile("h200-tset")
    with pytest.raises(InputError, match="profile name"):
        load_profile("../etc/passwd")
    (config_dir / "profiles" / "junk.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="not a peakmem profile"):
        load_profile("junk")


def test_xdg_config_home_is_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(CONFIG_DIR_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert profiles_dir() == tmp_path / "xdg" / "peakmem" / "profiles"
    assert profiles_dir({}) == Path.home() / ".config" / "peakmem" / "profiles"


def test_cli_calibrate_from_memory_stats_then_profile_changes_train(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(STATS))
    smi = tmp_path / "smi.csv"
    smi.write_text("memory.used [MiB], name\n11964 MiB, NVIDIA H200\n")
    assert (
        main(["calibrate", str(stats), "--nvidia-smi-used", str(smi), "--name", "h200-test", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (out["context_bytes"], out["fragmentation"], out["gpu"]) == (700 * MiB, 0.25, "NVIDIA H200")
    assert main(["calibrate", "--list"]) == 0
    assert "h200-test: CUDA context 700 MiB, fragmentation 25.0%" in capsys.readouterr().out

    # --profile: the estimate with the profile's Overheads, as predicted from the allocator formula
    spec = resolve_model("gpt2")
    setup = TrainingSetup(seq_len=512, optimizer_impl=OptimizerImpl.FUSED)  # the CLI's (peakmem.defaults)
    assert main(["train", "gpt2", "--seq", "512", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["train", "gpt2", "--seq", "512", "--profile", "h200-test", "--json"]) == 0
    tuned = json.loads(capsys.readouterr().out)
    at = {f: estimate_training(spec, setup, overheads=Overheads(fragmentation=f)).peak_reserved_bytes
          for f in (0.0, 1.0)}  # fmt: skip
    churn = at[1.0] - at[0.0]  # reserved_bytes: churn x fragmentation on top (within kRoundLarge, 2 MiB)
    assert tuned["peak_allocated_bytes"] == plain["peak_allocated_bytes"]
    assert abs(tuned["peak_reserved_bytes"] - (at[0.0] + 0.25 * churn)) <= 2 * MiB
    # no profile, no fraction: the step replayed through the allocator model (formulas/step_sequence.py)
    assert plain["peak_reserved_bytes"] == estimate_training(spec, setup).peak_reserved_bytes
    assert (
        tuned["device_total_bytes"] - tuned["peak_reserved_bytes"]
        == 700 * MiB + tuned["cublas_workspace_bytes"]
    )
    assert tuned["fragmentation"] == 0.25
    assert any("calibrated profile 'h200-test'" in a for a in tuned["assumptions"])
    # fit and plan take it too
    assert main(["fit", "gpt2", "--seq", "512", "--gpu", "24GB", "--profile", "h200-test", "--json"]) == 0
    assert main(["plan", "gpt2", "--seq", "512", "--gpu", "24GB", "--max-gpus", "2", "--profile", "h200-test",
                 "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    import peakmem

    api = peakmem.train("gpt2", seq=512, profile="h200-test").to_dict()  # the Python API takes it too
    assert api["device_total_bytes"] == tuned["device_total_bytes"]
    assert main(["train", "gpt2", "--profile", "nope", "--json"]) == 2
    assert "no such profile" in capsys.readouterr().err


def test_cli_calibrate_from_a_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = S.write(tmp_path / "step.pickle", S.snapshot())
    # snapshot: peak 195 MiB of which parameters 40 + optimizer states 80 persistent; max reserved 256 MiB
    # -> fragmentation (256 - 195) / (195 - 120) = 61 / 75; context 300 MiB = 556 - 256
    assert main(["calibrate", str(snap), "--nvidia-smi-used", "556MiB", "--name", "snap", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["context_bytes"] == 300 * MiB and out["fragmentation"] == round(61 / 75, 4)
    m = replay(S.snapshot()).measurement("s")
    assert m.persistent_bytes == 120 * MiB and m.device_total_bytes is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "not an object"),
        ("{not json", "not JSON"),
        ('{"peak_allocated_bytes": 5, "method": "analytic"}', "not the JSON of `peakmem measure"),
        ('{"hello": 1}', "neither the JSON of peakmem measure"),
        ('{"allocated_bytes.all.peak": 9, "reserved_bytes.all.peak": 5}', "below peak_allocated_bytes"),
    ],
)
def test_cli_calibrate_foreign_files_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["calibrate", str(bad), "--name", "x"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_calibrate_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--name", "x"]) == 2
    assert main(["calibrate", str(tmp_path / "missing.json"), "--name", "x"]) == 2
    assert main(["calibrate", str(tmp_path / "missing.json"), "--name", "../x"]) == 2
    err = capsys.readouterr().err
    assert "needs FILE" in err and "no such file" in err and "profile name" in err


def test_profile_json_is_checked() -> None:
    with pytest.raises(InputError, match="damaged"):
        Profile.from_json({"peakmem_profile": 1, "name": "a", "context_bytes": -1, "fragmentation": 0.1}, "f")


@pytest.mark.torch
def test_cli_calibrate_on_peakmem_measure_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_models import GPT2

    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2))
    code = main(["measure", str(config), "--device", "cpu", "--precision", "fp32", "--batch", "2", "--seq",
                 "32", "--json"])  # fmt: skip
    assert code == 0
    measured = json.loads(capsys.readouterr().out)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(measured))
    assert main(["calibrate", str(run), "--name", "cpu-run", "--json"]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert (cpu["context_bytes"], cpu["fragmentation"]) == (0, 0.0)  # CPU: no context, no allocator slack
    assert any("measured on cpu" in n for n in cpu["notes"])
    # the same JSON as a CUDA run would write it: reserved and nvidia-smi above the allocated peak
    alloc = measured["peak_allocated_bytes"]
    persistent = sum(measured["breakdown"].get(c, 0) for c in ("parameters", "buffers", "master_weights",
                                                               "optimizer_states"))  # fmt: skip
    churn = alloc - persistent
    assert churn > 0
    cuda = dict(measured, device="cuda:0", peak_reserved_bytes=alloc + churn // 5,
                device_total_bytes=alloc + churn // 5 + 400 * MiB)  # fmt: skip
    run.write_text(json.dumps(cuda))
    assert main(["calibrate", str(run), "--name", "gpu-run", "--json"]) == 0
    gpu = json.loads(capsys.readouterr().out)
    assert gpu["context_bytes"] == 400 * MiB
    assert gpu["fragmentation"] == round((churn // 5) / churn, 4)


def test_cli_calibrate_reads_gzipped_and_unsuffixed_snapshots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip
    import pickle

    gz = tmp_path / "step.pickle.gz"
    gz.write_bytes(gzip.compress(pickle.dumps(S.snapshot())))
    plain = S.write(tmp_path / "dump", S.snapshot())  # no suffix: told by pickle's first byte
    assert main(["calibrate", str(gz), str(plain), "--name", "both", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["peak_allocated_bytes"] for m in out["measurements"]] == [S.PEAK, S.PEAK]
    assert main(["explain", str(gz), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_allocated_bytes"] == S.PEAK
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(b"x" * 100)[:20])
    assert main(["explain", str(broken)]) == 2
    assert "gzip" in capsys.readouterr().err
