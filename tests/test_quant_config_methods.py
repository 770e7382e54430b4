"""config.json quantization_config -> the weight format peakmem prices, per quant_method
(peakmem.hf.quant cites each framework's config class). Expected format strings derived by hand
from each tiny config's keys; "" means "not modelled" and the answer names the method and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import peakmem
from peakmem.hf.quant import checkpoint_weights
from peakmem.resolve import resolve_config


def _fmt(qc: dict[str, Any]) -> str:
    ck = checkpoint_weights({"quantization_config": qc})
    assert ck is not None
    return ck.weights


def _read(qc: dict[str, Any]) -> str:
    ck = checkpoint_weights({"quantization_config": qc})
    assert ck is not None
    return ck.read


@pytest.mark.parametrize(
    ("qc", "want"),
    [
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True},
            "gptq-4bit-g128",
        ),
        (
            {"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": False, "sym": False},
            "gptq-8bit-g-1",
        ),
        (
            {"quant_method": "gptq", "bits": 3, "group_size": 64, "checkpoint_format": "gptq_v2"},
            "gptq-3bit-g64",
        ),
        ({"quant_method": "gptq", "bits": 2}, "gptq-2bit-g128"),  # GPTQConfig's group_size default
        ({"quant_method": "gptq", "group_size": 128}, ""),  # GPTQConfig has no default bits
        ({"quant_method": "gptq", "bits": 5, "group_size": 128}, ""),
        ({"quant_method": "gptq", "bits": 4, "group_size": 100}, ""),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, ""),
    ],
)
def test_gptq(qc: dict[str, Any], want: str) -> None:
    assert _fmt(qc) == want


@pytest.mark.parametrize(
    ("qc", "want"),
    [
        (
            {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
            "awq-4bit-g128",
        ),
        ({"quant_method": "awq", "bits": 4, "group_size": 64, "version": "GEMM"}, "awq-4bit-g64"),
        ({"quant_method": "awq"}, "awq-4bit-g128"),  # AwqConfig defaults
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, ""),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "marlin"}, ""),
        ({"quant_method": "awq", "bits": 8, "group_size": 128}, ""),
        ({"quant_method": "awq", "bits": 4, "group_size": -1}, ""),
    ],
)
def test_awq(qc: dict[str, Any], want: str) -> None:
    assert _fmt(qc) == want


@pytest.mark.parametrize(
    ("qc", "want"),
    [
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}, "nf4-dq"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
        ({"load_in_4bit": True}, "fp4"),  # BitsAndBytesConfig's bnb_4bit_quant_type default
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": True}, "fp4-dq"),
        ({"load_in_8bit": True, "llm_int8_skip_modules": ["lm_head"]}, "int8"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "int4"}, ""),
        ({"load_in_4bit": False, "load_in_8bit": False}, ""),
    ],
)
def test_bitsandbytes(qc: dict[str, Any], want: str) -> None:
    assert _fmt({"quant_method": "bitsandbytes", **qc}) == want


def _ct(fmt: str | None, *weights: dict[str, Any], **extra: Any) -> dict[str, Any]:
    groups = {f"group_{i}": {"targets": ["Linear"], "weights": w} for i, w in enumerate(weights)}
    qc: dict[str, Any] = {"quant_method": "compressed-tensors", "config_groups": groups, **extra}
    if fmt is not None:
        qc["format"] = fmt
    return qc


FP8_TENSOR = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}
FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
INT4_G128 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}


@pytest.mark.parametrize(
    ("qc", "want"),
    [
        (_ct("float-quantized", FP8_TENSOR, ignore=["lm_head"]), "fp8"),
        (_ct("float-quantized", FP8_CHANNEL), "fp8-channel"),
        (
            _ct(
                "float-quantized",
                {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
            ),
            "fp8-block",
        ),
        (
            _ct(
                "float-quantized",
                {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [64, 32]},
            ),
            "fp8-block-64x32",
        ),
        (
            _ct(
                "nvfp4-pack-quantized",
                {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
            ),
            "nvfp4",
        ),
        (_ct("int-quantized", {"num_bits": 8, "type": "int", "strategy": "channel"}), "w8a8"),
        (_ct("pack-quantized", INT4_G128), "awq-4bit-g128"),
        (
            _ct("pack-quantized", {"num_bits": 4, "type": "int", "group_size": 32}),
            "awq-4bit-g32",
        ),  # strategy inferred
        (
            _ct(None, {"type": "float"}),
            "fp8",
        ),  # num_bits 8 and strategy tensor are QuantizationArgs' defaults
        (_ct("float-quantized", FP8_TENSOR, FP8_CHANNEL), ""),  # groups disagree
        (_ct("pack-quantized", FP8_TENSOR), ""),  # fp8 values are not stored packed
        (_ct("pack-quantized", {"num_bits": 2, "type": "int", "strategy": "group", "group_size": 128}), ""),
        (
            _ct("float-quantized", {"num_bits": 8, "type": "float", "strategy": "block"}),
            "",
        ),  # no block_structure
        ({"quant_method": "compressed-tensors", "format": "float-quantized"}, ""),
    ],
)
def test_compressed_tensors(qc: dict[str, Any], want: str) -> None:
    assert _fmt(qc) == want


@pytest.mark.parametrize(
    ("qc", "want"),
    [
        ({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}, "fp8"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, "nvfp4"),
        ({"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}, "fp8-channel"),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4"}}, "nvfp4"),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, ""),
        ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, "fp8-channel"),
    ],
)
def test_modelopt_and_fbgemm(qc: dict[str, Any], want: str) -> None:
    assert _fmt(qc) == want


def test_read_names_the_field_and_the_kept_modules() -> None:
    read = _read({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})
    assert "'awq'" in read and "version 'gemv'" in read
    read = _read({"quant_method": "gptq", "bits": 5, "group_size": 128})
    assert "'gptq'" in read and "bits 5" in read
    names = [f"model.layers.{i}.mlp.gate" for i in range(6)]
    read = _read({"quant_method": "fbgemm_fp8", "modules_to_not_convert": names})
    assert "modules_to_not_convert [model.layers.0.mlp.gate" in read and "+2 more" in read
    assert "model.layers.4" not in read
    read = _read(_ct("float-quantized", FP8_TENSOR, ignore=["lm_head"]))
    assert (
        "ignore [lm_head]" in read and "group_0.weights num_bits 8, type 'float', strategy 'tensor'" in read
    )


def _infer_with(tmp_path: Path, qc: dict[str, Any], **options: Any) -> dict[str, Any]:
    _, config = resolve_config("llama-3.1-8b")
    config["quantization_config"] = qc
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return peakmem.infer(str(path), **{"engine": "vllm", "context": 4096, **options}).to_dict()


@pytest.mark.parametrize(
    ("qc", "want"),
    [
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
            "gptq-4bit-g128",
        ),
        (_ct("pack-quantized", INT4_G128, ignore=["lm_head"]), "awq-4bit-g128"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
    ],
)
def test_infer_prices_the_checkpoint_format(tmp_path: Path, qc: dict[str, Any], want: str) -> None:
    """End to end: the config's quantization_config prices the weights as --weights <format> does."""
    engine = {"engine": "hf"} if want == "nf4" else {}  # bitsandbytes checkpoints: transformers too
    d = _infer_with(tmp_path, qc, **engine)
    assert d["setup"]["weights"] == want
    assert any("priced from the checkpoint" in a and want in a for a in d["assumptions"])
    given = _infer_with(tmp_path, qc, weights=want, **engine)
    bf16 = _infer_with(tmp_path, qc, weights="bf16", **engine)
    assert d["weight_bytes"] == given["weight_bytes"] < bf16["weight_bytes"] // 2


def test_infer_names_an_unmapped_value(tmp_path: Path) -> None:
    d = _infer_with(tmp_path, {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})
    assert d["setup"]["weights"] == "bf16"
    assert any("'awq'" in a and "version 'gemv'" in a and "not modelled" in a for a in d["assumptions"])
