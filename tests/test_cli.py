"""The command line as a new user meets it: answers, JSON, and one-line errors with exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from peakmem.cli import main
from tiny_models import GPT2, GPT2_TENSORS


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """The real console entry point in a subprocess: what a user sees, tracebacks included."""
    return subprocess.run(
        [sys.executable, "-m", "peakmem", *argv], capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert "peakmem 0.1.0" in capsys.readouterr().out


def test_info_gpt2_xl_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "gpt2-xl", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["params"] == 1_557_611_200
    assert sum(info["params_by_component"].values()) == info["params"]


def test_info_gpt2_xl_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "gpt2-xl"]) == 0
    out = capsys.readouterr().out
    assert "1,557,611,200" in out
    assert "attention" in out and "mlp" in out


def test_info_from_config_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from peakmem.catalog import get_model

    cfg = dict(get_model("gpt2-xl").config)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for arg in (tmp_path / "config.json", tmp_path):
        assert main(["info", str(arg), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["params"] == 1_557_611_200


def test_models_and_gpus_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert len(models) >= 40
    assert main(["gpus", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)
    assert len(gpus) >= 25
    assert all(g["memory_bytes"] > 0 for g in gpus)
    # the table names what PyTorch sees where the driver keeps some (the RTX 3090: 23.69 of 24 GiB)
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps the cell on a narrow terminal
    assert main(["gpus"]) == 0
    assert "torch 23.69" in capsys.readouterr().out


def test_typo_in_model_name_suggests() -> None:
    assert_one_line_error(run("info", "gpt2-xxl"), 3, "gpt2-xxl", "did you mean", "gpt2-xl")


def test_config_that_is_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert_one_line_error(run("info", str(bad)), 2, "config.json")


def test_config_missing_hidden_size(tmp_path: Path) -> None:
    from peakmem.catalog import get_model

    cfg = dict(get_model("llama-2-7b").config)
    del cfg["hidden_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert_one_line_error(run("info", str(path)), 2, "hidden_size")


def test_negative_seq_names_the_field() -> None:
    assert_one_line_error(run("train", "gpt2-xl", "--seq", "-5"), 2, "seq", "-5")


def test_unknown_gpu_suggests() -> None:
    assert_one_line_error(run("train", "gpt2-xl", "--gpu", "rtx-4900"), 3, "rtx-4900", "did you mean")


def test_unknown_option_is_a_usage_error() -> None:
    assert_one_line_error(run("info", "gpt2-xl", "--bogus"), 2, "--bogus")


TINY_GRANITE = {
    "model_type": "granite", "architectures": ["GraniteForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}  # fmt: skip


@pytest.mark.torch
def test_simulate_runs_an_architecture_the_formulas_do_not_know(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_GRANITE))
    assert main(["simulate", str(path), "--seq", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "simulated"
    assert out["setup"]["seq_len"] == 32
    assert out["peak_allocated_bytes"] > 16 * out["model"]["params"]  # at least the model states


@pytest.mark.torch
def test_measure_and_train_agree_on_a_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2))
    common = ["--precision", "fp32", "--batch", "2", "--seq", "64", "--json"]
    assert main(["measure", str(path), "--device", "cpu", *common]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert main(["train", str(path), *common]) == 0
    analytic = json.loads(capsys.readouterr().out)
    assert measured["method"] == "measured" and analytic["method"] == "analytic"
    # Model states agree to the byte but for Adam's per-tensor `step` counters, which the CPU run keeps
    # as 0-dim fp32 tensors (4 B each) and CUDA keeps on the host: 28 parameter tensors in this GPT-2
    # (wte, wpe, 12 per layer x 2, ln_f weight and bias).
    assert measured["model_state_bytes"] - analytic["model_state_bytes"] == 4 * GPT2_TENSORS
    # `train` models CUDA kernels (1-byte dropout masks, flash SDPA), the CPU run does not; the
    # peak parity under the CPU kernel policy (within 5%) is tests/test_parity.py's job.
    assert analytic["peak_allocated_bytes"] < measured["peak_allocated_bytes"]


def test_context_beyond_the_limit_warns_or_errors_with_strict() -> None:
    proc = run("infer", "llama-3-8b", "--context", "100000", "--json")
    assert proc.returncode == 0
    assert "warning: context=100000" in proc.stderr and "max_position_embeddings=8192" in proc.stderr
    assert_one_line_error(run("infer", "llama-3-8b", "--context", "100000", "--strict"), 2, "context=100000")


def test_fit_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "gpt2-xl", "--gpu", "8GB,16GB", "--seq", "1024", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["fits_any"]
    assert main(["fit", "gpt2-xl", "--gpu", "8GB,48GB", "--seq", "1024", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["smallest_sufficient"] == "48gb"


def test_train_with_lora_and_bad_combinations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "gpt2-xl", "--method", "lora", "--lora-rank", "16", "--json"]) == 0
    lora = json.loads(capsys.readouterr().out)
    # r x (in + out) per adapted Conv1D: c_attn 1600->4800, attn c_proj 1600->1600, c_fc 1600->6400,
    # mlp c_proj 6400->1600; 48 layers (peft's all-linear skips the tied head).
    per_layer = 16 * ((1600 + 4800) + (1600 + 1600) + (1600 + 6400) + (6400 + 1600))
    assert lora["model"]["trainable_params"] == 48 * per_layer == 19_660_800
    assert_one_line_error(run("train", "gpt2-xl", "--lora-rank", "16"), 2, "method='full'")
    assert_one_line_error(run("train", "gpt2-xl", "--method", "lora", "--lora-rank", "0"), 2, "lora_rank=0")


def test_train_multi_gpu_reports_each_pipeline_stage(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["role"] for r in out["ranks"]} >= {"first stage", "last stage"}
    assert out["device_total_bytes"] == max(r["device_total_bytes"] for r in out["ranks"])
    assert_one_line_error(run("train", "llama-3.1-70b", "--gpus", "24", "--tp", "3"), 2, "tp=3", "64")


def test_overheads_are_overridable(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "gpt2-xl", "--seq", "1024", "--json"]
    assert main(base) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*base, "--cuda-context-mib", "1343"]) == 0
    v100 = json.loads(capsys.readouterr().out)
    # Only the context changes: 1343 MiB (V100, HF docs) instead of the 512 MiB default.
    assert v100["device_total_bytes"] - default["device_total_bytes"] == (1343 - 512) * 1024**2
    assert v100["peak_reserved_bytes"] == default["peak_reserved_bytes"]
    assert_one_line_error(run(*base[:4], "--fragmentation", "3"), 2, "fragmentation=3.0")


@pytest.mark.torch
def test_measure_json_echoes_a_lora_setup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The measured setup carries its LoraConfig as a dict, as train's does (it used to fail to serialise)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2))
    common = ["--method", "lora", "--lora-rank", "4", "--batch", "1", "--seq", "16", "--json"]
    assert main(["measure", str(path), "--device", "cpu", "--steps", "2", *common]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert main(["train", str(path), *common]) == 0
    analytic = json.loads(capsys.readouterr().out)
    assert measured["setup"]["lora"] == analytic["setup"]["lora"] and measured["setup"]["lora"]["rank"] == 4


@pytest.mark.parametrize("command", ["train", "fit"])
def test_a_question_that_cannot_run_errors_in_one_line_naming_the_field(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpt2-xl has 1,024 learned positions: seq 1025 is refused with the estimator's own line, and the
    plain-size notice (--gpu 24GB) is not printed before it (found by test_fuzz's CLI fuzz)."""
    assert main([command, "gpt2-xl", "--gpu", "24GB", "--seq", "1025", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "peakmem: error: seq=1025: gpt2-xl has 1,024 learned positions (max_position_embeddings); "
        "a longer sequence cannot run"
    ]
