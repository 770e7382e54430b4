"""Weights as the checkpoint ships them: mxfp4 (gpt-oss experts), nvfp4, fp8 block-wise (DeepSeek-V3),
and a config.json's quantization_config read when --weights is not given. Byte counts derived by hand
from each layout (formulas/weights.py cites the sources)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import peakmem
from _infer_specs import tiny
from peakmem.errors import InputError
from peakmem.formulas.weights import tensor_storage, weight_rows
from peakmem.hf.quant import checkpoint_weights
from peakmem.model import Tensor
from peakmem.resolve import resolve_config, resolve_model
from peakmem.weight_formats import Scheme, parse_weight_format

# one fused expert tensor, 4 experts of [out 96, in 64], and one decoder linear [out 48, in 160]
EXPERTS = Tensor(name="mlp.experts.down_proj", module="experts", shape=(4, 96, 64), component="experts",
                 kind="expert_weight")  # fmt: skip
LINEAR = Tensor(name="self_attn.o_proj.weight", module="o_proj", shape=(48, 160), component="attention",
                kind="linear_weight")  # fmt: skip


def _bytes(t: Tensor, name: str) -> int:
    return tensor_storage(t, parse_weight_format(name), tied=False)[0]


def test_parse_new_formats() -> None:
    assert parse_weight_format("MXFP4").scheme is Scheme.MXFP4
    assert parse_weight_format("nvfp4").scheme is Scheme.NVFP4
    assert parse_weight_format("fp8-block").block == (128, 128)
    assert parse_weight_format("fp8-block-64x32").name == "fp8-block-64x32"
    with pytest.raises(InputError, match="weights='fp8-block-0x1'"):
        parse_weight_format("fp8-block-0x1")


def test_mxfp4_experts_only() -> None:
    # per expert: 96 rows x (64/32 = 2 blocks) x (16 packed bytes + 1 e8m0 scale) = 3,264 B; 4 experts
    assert _bytes(EXPERTS, "mxfp4") == 4 * 96 * 2 * 17
    # linears stay bf16: 48 x 160 x 2
    assert _bytes(LINEAR, "mxfp4") == 48 * 160 * 2


def test_nvfp4_layout() -> None:
    # weight uint8 [48, 80] + e4m3 scales [48, 10] + weight_scale_2 and input_scale fp32
    assert _bytes(LINEAR, "nvfp4") == 48 * 80 + 48 * 10 + 2 * 4
    assert _bytes(EXPERTS, "nvfp4") == 4 * (96 * 32 + 96 * 4 + 8)


def test_fp8_block_layout() -> None:
    # e4m3 [48, 160] + fp32 scales [ceil(48/128)=1, ceil(160/128)=2]
    assert _bytes(LINEAR, "fp8-block") == 48 * 160 + 1 * 2 * 4
    # 32x32 blocks: [2, 5] scales
    assert _bytes(LINEAR, "fp8-block-32x32") == 48 * 160 + 2 * 5 * 4
    assert _bytes(EXPERTS, "fp8-block") == 4 * (96 * 64 + 1 * 1 * 4)


def test_mxfp4_needs_experts_and_nvfp4_needs_16() -> None:
    with pytest.raises(InputError, match="no MoE experts"):
        weight_rows(tiny(), parse_weight_format("mxfp4"))
    with pytest.raises(InputError, match="not a multiple of 16"):
        weight_rows(tiny(hidden=72, heads=4, head_dim=18), parse_weight_format("nvfp4"))


def _expert_params(spec: peakmem.model.ModelSpec) -> tuple[int, int]:
    """(expert weight params, bytes by the hand formula: per 32 values 16 packed bytes + 1 scale)."""
    params = nbytes = 0
    for t, n in spec.tensors():
        if t.kind == "expert_weight":
            params += t.numel * n
            assert t.shape[-1] % 32 == 0
            nbytes += t.numel * n // 32 * 17
    return params, nbytes


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b"])
def test_gpt_oss_priced_as_mxfp4(name: str) -> None:
    spec = resolve_model(name)
    r = peakmem.infer(name, engine="vllm", gpu="h100-80gb", context=32768)
    d = r.to_dict()
    assert d["setup"]["weights"] == "mxfp4"
    expert_params, expert_bytes = _expert_params(spec)
    rest = (spec.params - expert_params) * 2  # everything else bf16
    assert d["weight_bytes"] == expert_bytes + rest
    assert r.fits
    assert any("quantization_config" in a and "mxfp4" in a for a in d["assumptions"])


def test_gpt_oss_20b_smaller_and_override() -> None:
    small = peakmem.infer("gpt-oss-20b", engine="vllm", gpu="h100-80gb", context=32768).to_dict()
    big = peakmem.infer("gpt-oss-120b", engine="vllm", gpu="h100-80gb", context=32768).to_dict()
    assert small["weight_bytes"] < big["weight_bytes"]
    bf16 = peakmem.infer("gpt-oss-120b", engine="vllm", gpu="h100-80gb", context=32768, weights="bf16")
    d = bf16.to_dict()
    assert d["weight_bytes"] == resolve_model("gpt-oss-120b").params * 2
    assert not bf16.fits
    assert any("overrides" in a for a in d["assumptions"])


def test_deepseek_v3_fp8_block_from_config() -> None:
    spec = resolve_model("deepseek-v3")
    d = peakmem.infer("deepseek-v3", engine="vllm", context=4096).to_dict()
    assert d["setup"]["weights"] == "fp8-block"
    want = 0
    for t, n in spec.tensors():
        copies = t.copies * (t.shape[0] if len(t.shape) == 3 else 1)
        quantized = t.kind in ("linear_weight", "expert_weight") and t.component in (
            "attention", "mlp", "experts", "shared_experts")  # fmt: skip
        if quantized:
            out, inp = t.shape[-2], t.shape[-1]
            want += n * copies * (out * inp + -(-out // 128) * -(-inp // 128) * 4)
        else:
            want += n * t.numel * 2
    assert d["weight_bytes"] == want


def test_unknown_quant_method_is_named(tmp_path: Path) -> None:
    _, config = resolve_config("llama-3.1-8b")
    config["quantization_config"] = {"quant_method": "hqq", "nbits": 4}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    d = peakmem.infer(str(path), engine="vllm", context=4096).to_dict()
    assert d["setup"]["weights"] == "bf16"
    assert any("'hqq'" in a and "not modelled" in a for a in d["assumptions"])
    plain = peakmem.infer("llama-3.1-8b", engine="vllm", context=4096).to_dict()
    assert not any("quantization_config" in a for a in plain["assumptions"])


def test_checkpoint_weights_reader() -> None:
    assert checkpoint_weights({}) is None
    ck = checkpoint_weights({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}})
    assert ck is not None and ck.weights == "fp8-block-64x64"
    per_tensor = checkpoint_weights({"quantization_config": {"quant_method": "fp8"}})
    assert per_tensor is not None and per_tensor.weights == "fp8"
    with pytest.raises(peakmem.errors.ConfigError, match="weight_block_size"):
        checkpoint_weights({"quantization_config": {"quant_method": "fp8", "weight_block_size": [0]}})
