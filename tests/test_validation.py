"""The one validation layer (peakmem.validate) as the setups, the config reader and the CLI use it.

Each error is an InputError (a ValueError) that names the field and the value; sizes no cluster
holds are "too large" before any work is done.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from peakmem.adapters import LoraConfig
from peakmem.catalog import MODELS, find_model
from peakmem.cli import main
from peakmem.errors import ConfigError, InputError, MissingExtraError, PeakmemError
from peakmem.formulas.overhead import Overheads
from peakmem.hf.reader import (
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_FILE_BYTES,
    _text_depth,
    check_config,
    read_config_file,
)
from peakmem.parallel import FsdpMode, Offload, Parallelism, PipelineSchedule
from peakmem.resolve import resolve_model
from peakmem.training import Checkpointing, Method, Precision, TrainingSetup
from peakmem.validate import MAX_DEVICE_BYTES, MAX_GPUS, MAX_LAYERS, MAX_TOKENS, check_int, check_real

GPT2_XL: dict[str, Any] = dict(find_model("gpt2-xl").config)  # type: ignore[union-attr]


# --- scalar checks --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (2.5, "batch=2.5: must be an integer, not float"),
        (2.0, "batch=2.0: must be an integer, not float"),
        (True, "batch=True: must be an integer, not bool"),
        ("2", "batch='2': must be an integer, not str"),
        (0, "batch=0: must be positive"),
        (-1, "batch=-1: must be positive"),
    ],
)
def test_check_int_names_field_and_value(value: object, message: str) -> None:
    with pytest.raises(InputError) as info:
        check_int("batch", value)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


def test_check_int_upper_bound_is_too_large() -> None:
    assert check_int("gpus", 10**6, maximum=10**6) == 10**6
    with pytest.raises(InputError, match=r"gpus=1000001: too large \(more than 1,000,000 GPUs\)"):
        check_int("gpus", 10**6 + 1, maximum=10**6, what="GPUs")


def test_too_large_cuts_a_huge_value_to_one_short_line() -> None:
    with pytest.raises(InputError) as info:
        check_int("n", 10**500, maximum=10)
    assert len(str(info.value)) < 150


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), True, "0.1", None])
def test_check_real_rejects_non_finite_and_non_numbers(value: object) -> None:
    with pytest.raises(InputError, match="fragmentation="):
        check_real("fragmentation", value, minimum=0.0, maximum=1.0)


# --- TrainingSetup --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"micro_batch": 2.5}, "batch=2.5: must be an integer"),
        ({"micro_batch": True}, "batch=True: must be an integer"),
        ({"seq_len": 1024.0}, "seq=1024.0: must be an integer"),
        ({"grad_accum": False}, "grad_accum=False: must be an integer"),
        ({"grad_accum": 2**20 + 1}, "grad_accum=1048577: too large"),
        ({"precision": "bogus"}, "precision='bogus': unknown; choose one of fp32, amp-bf16"),
        ({"precision": 16}, "precision=16: must be one of fp32"),
        ({"optimizer": "adamw9"}, "optimizer='adamw9': unknown"),
        ({"checkpointing": None}, "checkpointing=None: must be one of none, selective, full"),
        ({"grads_set_to_none": 1}, "grads_set_to_none=1: must be True or False"),
        ({"activation_offload": "yes"}, "activation_offload='yes': must be True or False"),
        ({"method": "lora", "lora": {"rank": 8}}, "lora=.*must be a LoraConfig or None"),
    ],
)
def test_training_setup_rejects_wrong_types(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        TrainingSetup(**kwargs)


def test_training_setup_coerces_choice_spellings() -> None:
    setup = TrainingSetup(method="lora", precision="BF16", checkpointing="full", lora=LoraConfig(rank=4))  # type: ignore[arg-type]
    assert setup.method is Method.LORA
    assert setup.precision is Precision.BF16
    assert setup.checkpointing is Checkpointing.FULL
    assert setup == TrainingSetup(
        method=Method.LORA,
        precision=Precision.BF16,
        checkpointing=Checkpointing.FULL,
        lora=LoraConfig(rank=4),
    )


def test_training_setup_token_limit_is_exact() -> None:
    assert TrainingSetup(micro_batch=2**20, seq_len=2**20).tokens == MAX_TOKENS  # 2^40: accepted
    with pytest.raises(InputError, match=r"batch x seq = 1 x 1099511627777 .* too large"):
        TrainingSetup(micro_batch=1, seq_len=MAX_TOKENS + 1)


def test_bad_precision_through_the_estimate_is_no_key_error() -> None:
    from peakmem.estimate import estimate_training

    spec = resolve_model("gpt2")
    with pytest.raises(InputError, match="precision"):
        estimate_training(spec, TrainingSetup(precision="bogus"))  # type: ignore[arg-type]
    est = estimate_training(spec, TrainingSetup(precision="bf16", seq_len=128))  # type: ignore[arg-type]
    assert (
        est.peak_allocated_bytes
        == estimate_training(spec, TrainingSetup(precision=Precision.BF16, seq_len=128)).peak_allocated_bytes
    )


# --- Parallelism ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gpus": True}, "gpus=True: must be an integer, not bool"),
        ({"gpus": 8.0}, "gpus=8.0: must be an integer"),
        ({"gpus": MAX_GPUS + 1}, "gpus=1000001: too large"),
        ({"gpus": 8, "tp": 2.0}, "tp=2.0: must be an integer"),
        ({"dp": -1}, "dp=-1: must be >= 0"),
        ({"zero_stage": True}, "zero=True: must be an integer"),
        ({"zero_stage": 4}, "zero=4: must be 0, 1, 2 or 3"),
        ({"fsdp": "bogus"}, "fsdp='bogus': unknown; choose one of none, full-shard"),
        ({"offload_optimizer": 1}, "offload_optimizer=1: must be one of none, cpu, nvme"),
        ({"sequence_parallel": 1}, "sequence_parallel=1: must be True or False"),
        ({"overlap_comm": "no"}, "overlap_comm='no': must be True or False"),
        ({"ddp_bucket_bytes": 25.5}, "ddp_bucket_bytes=25.5: must be an integer"),
        ({"reduce_bucket_size": 2**50 + 1}, "reduce_bucket_size=1125899906842625: too large"),
    ],
)
def test_parallelism_rejects_wrong_types_and_sizes(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        Parallelism(**kwargs)


def test_parallelism_coerces_choice_spellings() -> None:
    par = Parallelism(gpus=8, fsdp="full-shard", offload_optimizer="cpu", pp_schedule="1f1b")  # type: ignore[arg-type]
    assert (par.fsdp, par.offload_optimizer, par.pp_schedule) == (
        FsdpMode.FULL_SHARD, Offload.CPU, PipelineSchedule.ONE_F_ONE_B,
    )  # fmt: skip
    assert par.engine == "fsdp2-full-shard"
    assert Parallelism(gpus=MAX_GPUS).dp == MAX_GPUS  # the limit itself is accepted


# --- Overheads ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fragmentation": float("nan")}, "fragmentation=nan: must be a finite number"),
        ({"fragmentation": float("inf")}, "fragmentation=inf: must be a finite number"),
        ({"fragmentation": True}, "fragmentation=True: must be a number"),
        ({"fragmentation": 1.5}, r"fragmentation=1.5: must be in \[0.0, 1.0\]"),
        ({"context_bytes": 1.5}, "context_bytes=1.5: must be an integer"),
        ({"context_bytes": -1}, "context_bytes=-1: must be >= 0"),
        ({"context_bytes": MAX_DEVICE_BYTES + 1}, "context_bytes=1125899906842625: too large"),
        ({"cublas_workspace_bytes": None}, "cublas_workspace_bytes=None: must be an integer"),
        ({"context_source": 3}, "context_source=3: must be a string"),
    ],
)
def test_overheads_reject_non_finite_and_out_of_range(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        Overheads(**kwargs)


def test_overheads_accept_integer_fragmentation_bounds() -> None:
    assert Overheads(fragmentation=0).fragmentation == 0
    assert Overheads(fragmentation=1).fragmentation == 1


# --- config.json ----------------------------------------------------------------------------------
def test_every_catalog_config_is_within_the_bounds() -> None:
    for model in MODELS:
        check_config(model.config)


def test_text_depth_skips_brackets_inside_strings() -> None:
    assert _text_depth('{"a": "[[[{{{", "b": [1, {"c": "\\"]]"}]}') == 3
    assert _text_depth("[]") == 1
    assert _text_depth('"{{{"') == 0


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"n_layer": MAX_LAYERS + 1}, "n_layer=10001: too large"),
        ({"n_layer": "48"}, "n_layer='48': must be an integer"),
        ({"n_layer": 48.0}, "n_layer=48.0: must be an integer"),
        ({"n_layer": True}, "n_layer=True: must be an integer"),
        ({"n_embd": 10**30}, "n_embd=1000000000000000000000000000000: too large"),
        ({"vocab_size": 2**26 + 1}, "vocab_size=67108865: too large"),
        (
            {"text_config": {"num_hidden_layers": 10**9}},
            "text_config.num_hidden_layers=1000000000: too large",
        ),
        ({"intermediate_size": [64, 2**21]}, r"intermediate_size=2097152: too large"),
        ({"intermediate_size": [64, "x"]}, r"intermediate_size=\[64, 'x'\]: must be an integer"),
        ({"rope_scaling": {"factor": float("nan")}}, "rope_scaling.factor=nan: must be a finite number"),
        ({"layer_norm_epsilon": float("inf")}, "layer_norm_epsilon=inf: must be a finite number"),
    ],
)
def test_check_config_names_the_key(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_config({**GPT2_XL, **changes})


def test_check_config_allows_transformers_unbounded_time_step_limit() -> None:
    # Falcon-H1 / Granite 4 / Mamba-2 configs saved by transformers hold its default (0.0, inf)
    check_config({**GPT2_XL, "time_step_limit": [0.0, float("inf")]})
    with pytest.raises(ConfigError, match=r"time_step_limit\[1\]=nan: must be a finite number"):
        check_config({**GPT2_XL, "time_step_limit": [0.0, float("nan")]})
    with pytest.raises(ConfigError, match="rope_theta=inf: must be a finite number"):
        check_config({**GPT2_XL, "rope_theta": float("inf")})


def test_check_config_allows_nulls_and_int_lists() -> None:
    check_config({**GPT2_XL, "n_inner": None, "intermediate_size": [64, 128], "sliding_window": None})


def test_check_config_depth_and_size_of_a_dict() -> None:
    tree: Any = 1
    for _ in range(MAX_CONFIG_DEPTH + 5):
        tree = {"a": tree}
    with pytest.raises(ConfigError, match="nested more than 32 levels"):
        check_config(tree)
    with pytest.raises(ConfigError, match="more than 200,000 values"):
        check_config({"big": list(range(300_000))})
    with pytest.raises(ConfigError, match="must be a string"):
        check_config({(1, 2): 2})  # type: ignore[dict-item]
    check_config({"id2label": {0: "a"}})  # transformers' to_dict() keeps int label keys


def test_read_config_file_bounds(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 10_000 + "]" * 10_000)
    with pytest.raises(ConfigError, match=r"deep\.json: nested 10000 levels deep"):
        read_config_file(deep)
    big = tmp_path / "big.json"
    big.write_text('{"x": "' + "a" * MAX_CONFIG_FILE_BYTES + '"}')
    with pytest.raises(ConfigError, match=r"big.json: 10,000,009 bytes is too large"):
        read_config_file(big)
    digits = tmp_path / "digits.json"
    digits.write_text('{"x": ' + "9" * 5000 + "}")
    with pytest.raises(ConfigError, match=r"digits\.json: not valid JSON"):
        read_config_file(digits)
    ok = tmp_path / "config.json"
    ok.write_text(json.dumps(GPT2_XL))
    assert read_config_file(ok) == GPT2_XL


def test_a_billion_layers_is_refused_before_any_work(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GPT2_XL, "n_layer": 10**9}))
    start = time.monotonic()
    with pytest.raises(ConfigError, match="n_layer=1000000000: too large"):
        resolve_model(str(path))
    assert time.monotonic() - start < 1.0


# --- CLI ------------------------------------------------------------------------------------------
def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", ["simulate", "measure"])
def test_torch_commands_without_torch_name_the_extra(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    code, err = _main([command, "gpt2"], capsys)
    assert code == 2
    assert err == (
        f"peakmem: error: peakmem {command} needs the 'torch' extra (torch is not installed): "
        "pip install 'peakmem[torch]'\n"
    )


def test_missing_extra_is_both_our_error_and_an_import_error() -> None:
    error = MissingExtraError("simulate", "torch", "torch")
    assert isinstance(error, PeakmemError) and isinstance(error, ImportError)
    assert error.exit_code == 2


@pytest.mark.parametrize("port", ["0", "-1", "65536", "99999"])
def test_serve_port_out_of_range(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(["serve", f"--port={port}"], capsys)
    assert (code, err) == (2, f"peakmem: error: --port={int(port)}: must be in 1..65535\n")


def test_serve_on_a_busy_port_is_an_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        code, err = _main(["serve", "--port", str(port)], capsys)
    assert code == 2
    assert err.startswith(f"peakmem: error: --host='127.0.0.1' --port={port}: cannot listen there")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "gpt2", "--cuda-context-mib", "nan"], "--cuda-context-mib=nan: must be a finite number"),
        (["train", "gpt2", "--fragmentation=-inf"], "--fragmentation=-inf: must be a finite number"),
        (["train", "gpt2", "--batch", str(10**20)], "--batch=100000000000000000000: too large"),
        (["infer", "gpt2", "--batch", str(10**29)], "--batch=" + str(10**29) + ": too large"),
        (["simulate", "gpt2", "--steps", "0"], "--steps=0: must be positive"),
        (["simulate", "gpt2", "--steps", "101"], "--steps=101: too large (more than 100 steps"),
    ],
)
def test_cli_numbers_are_finite_and_bounded(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _main(argv, capsys)
    assert code == 2
    assert err.startswith(f"peakmem: error: {message}"), err


def test_cli_output_into_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "no" / "such" / "folder" / "out.png"
    code, err = _main(["train", "gpt2", "--seq", "128", "--plot", str(target)], capsys)
    assert code == 2
    assert err == f"peakmem: error: No such file or directory: {target}\n"


def test_cli_a_10000_character_model_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(["train", "x" * 10_000], capsys)
    assert code == 2
    assert "10,000 characters is too long (at most 4,096)" in err
    assert len(err) < 400


def test_long_unknown_name_is_cut_in_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(["train", "q" * 3000], capsys)
    assert code == 3
    assert err.startswith("peakmem: error: unknown model 'qqqq") and len(err) < 300


def test_one_reader_of_user_files(tmp_path: Path) -> None:
    """userfiles.read_user_file / read_user_text: config.json, --from, calibrate's inputs and snapshots
    all read through it, so each failure names the file, how it was given and what was expected."""
    from peakmem.userfiles import read_user_file, read_user_text

    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 11)
    with pytest.raises(InputError, match=r"--from .*big.json: 11 bytes is too large for a thing \(at most"):
        read_user_file(big, what="a thing", max_bytes=10, label="--from")
    with pytest.raises(InputError, match=r"nope.json: no such file"):
        read_user_file(tmp_path / "nope.json", what="a thing", max_bytes=10)
    with pytest.raises(InputError, match=r": a folder, not a thing"):
        read_user_file(tmp_path, what="a thing", max_bytes=10**6)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"caf\xe9")
    with pytest.raises(ConfigError, match=r"latin.yaml: not UTF-8 text .*; expected a thing"):
        read_user_text(latin, what="a thing", max_bytes=10, error=ConfigError)
    assert read_user_text(big, what="a thing", max_bytes=11) == "x" * 11
