"""torchao weight formats (int4 / int8 weight-only, float8 dynamic quantization): names, bytes by hand,
the bytes torchao's own tensors hold (built on the CPU or, for the CUDA-only int4 packing, on the meta
device), and the temporaries of each linear in transformers' generate."""

from __future__ import annotations

import pytest

import peakmem
from peakmem.errors import InputError
from peakmem.formulas.quant_kernels import TORCHAO_FP8_ACT_BYTES, linear_temporary_bytes
from peakmem.formulas.weights import (
    TORCHAO_INT8_ROW_BYTES,
    fp8_linear_bytes,
    torchao_int4_linear_bytes,
    torchao_int8_linear_bytes,
)
from peakmem.inference import Engine, InferenceSetup
from peakmem.weight_formats import Scheme, parse_weight_format


@pytest.mark.parametrize(
    ("text", "name", "scheme"),
    [
        ("torchao-int4wo", "torchao-int4wo-g128", Scheme.TORCHAO_INT4),
        ("int4wo-g64", "torchao-int4wo-g64", Scheme.TORCHAO_INT4),
        ("INT4_WEIGHT_ONLY", "torchao-int4wo-g128", Scheme.TORCHAO_INT4),
        ("torchao-int8wo", "torchao-int8wo", Scheme.TORCHAO_INT8),
        ("float8dq", "torchao-float8dq-row", Scheme.TORCHAO_FP8),
        ("torchao-float8dq-tensor", "torchao-float8dq-tensor", Scheme.TORCHAO_FP8),
    ],
)
def test_names(text: str, name: str, scheme: Scheme) -> None:
    fmt = parse_weight_format(text)
    assert (fmt.name, fmt.scheme, fmt.float_dtype) == (name, scheme, "bf16")


def test_int4_group_outside_tinygemm_is_refused() -> None:
    with pytest.raises(InputError, match="group size must be one of"):
        parse_weight_format("torchao-int4wo-g512")


def test_bytes_by_hand() -> None:
    # 1000 inputs pad to 1024, 12 outputs to 16: 1024 x 16 / 2 packed, (1024 / 128) x 16 x (scale, zero) x 2 B
    assert torchao_int4_linear_bytes(1000, 12, 128) == 8192 + 8 * 16 * 2 * 2
    assert torchao_int4_linear_bytes(4096, 14336, 128) == 4096 * 14336 // 2 + 32 * 14336 * 4
    assert torchao_int8_linear_bytes(1024, 256) == 1024 * 256 + 256 * TORCHAO_INT8_ROW_BYTES


def test_int4_packing_as_aten_builds_it() -> None:
    """aten ``_convert_weight_to_int4pack`` (the CUDA layout, by its meta kernel) and torchao's
    ``pack_tinygemm_scales_and_zeros``: the bytes of the formula for a padded 16 x 1024 weight."""
    torch = pytest.importorskip("torch")
    utils = pytest.importorskip("torchao.quantization.utils")
    n, k, group = 16, 1024, 128
    packed = torch.ops.aten._convert_weight_to_int4pack(
        torch.empty(n, k // 2, dtype=torch.uint8, device="meta"), 8
    )
    scale = torch.zeros(n, k // group, dtype=torch.bfloat16)
    both = utils.pack_tinygemm_scales_and_zeros(scale, scale.clone(), torch.bfloat16)
    held = packed.numel() * packed.element_size() + both.numel() * both.element_size()
    assert held == torchao_int4_linear_bytes(k, n, group)


def test_float8_rows_as_torchao_stores_them() -> None:
    torch = pytest.importorskip("torch")
    quant = pytest.importorskip("torchao.quantization")
    w = torch.randn(256, 1024, dtype=torch.bfloat16)
    for granularity, per_channel in ((quant.PerRow(), True), (quant.PerTensor(), False)):
        t = quant.Float8Tensor.from_hp(w, granularity=granularity)
        held = t.qdata.numel() * t.qdata.element_size() + t.scale.numel() * t.scale.element_size()
        assert held == fp8_linear_bytes(1024, 256, per_channel=per_channel)


def test_int8_rows_within_the_releases_counted() -> None:
    """torchao 0.18's Int8Tensor holds int8 values, an fp32 scale and an int8 zero point a row (5 B); the
    formula counts v0.9's bf16 scale and int64 zero point (10 B a row), the larger."""
    torch = pytest.importorskip("torch")
    quant = pytest.importorskip("torchao.quantization")
    lin = torch.nn.Linear(1024, 256, bias=False, dtype=torch.bfloat16)
    quant.quantize_(lin, quant.Int8WeightOnlyConfig())
    w = lin.weight
    held = sum(getattr(w, name).untyped_storage().nbytes() for name in w.__tensor_flatten__()[0])
    assert held == 1024 * 256 + 256 * (4 + 1)
    assert torchao_int8_linear_bytes(1024, 256) - held == 256 * (TORCHAO_INT8_ROW_BYTES - 5)


def _setup(weights: str) -> InferenceSetup:
    return InferenceSetup(weights=weights, engine=Engine.HF, batch=1, prompt=64, context=128)


def test_linear_temporaries() -> None:
    # int8: the cast weight each call, decode too; int4: the padded input; fp8: the input's quantization
    int8 = linear_temporary_bytes(4096, 1024, _setup("torchao-int8wo"), 1, 2, prefill=False)
    assert int8 == 4096 * 1024 * 2
    int4 = linear_temporary_bytes(1000, 1024, _setup("torchao-int4wo"), 3, 2, prefill=True)
    assert int4 == 3 * 1024 * 2
    fp8 = linear_temporary_bytes(4096, 1024, _setup("torchao-float8dq"), 64, 2, prefill=True)
    assert fp8 == 64 * 4096 * TORCHAO_FP8_ACT_BYTES


def test_generate_weights_and_head() -> None:
    """Llama-3.1-8B int4: every layer linear packed, the embedding and the untied head in bf16."""
    r = peakmem.infer("llama-3.1-8b", weights="torchao-int4wo", batch=1, prompt=64, context=128, engine="hf")
    hidden, inter, vocab, layers, kv = 4096, 14336, 128256, 32, 1024
    linears = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden)] + [(hidden, inter)] * 2
    linears += [(inter, hidden)]
    packed = layers * sum(torchao_int4_linear_bytes(i, o, 128) for i, o in linears)
    norms = (2 * layers + 1) * hidden * 2
    assert r.data["weight_bytes"] == packed + 2 * vocab * hidden * 2 + norms


@pytest.mark.parametrize("engine", ["llamacpp", "litgpt"])
def test_engines_that_do_not_load_torchao(engine: str) -> None:
    with pytest.raises(InputError, match="weights"):
        peakmem.infer("llama-3.1-8b", weights="torchao-int4wo", engine=engine)


def test_checkpoint_config_as_transformers_writes_it() -> None:
    """transformers' own ``TorchAoConfig.to_dict`` of torchao configs, read back as peakmem's formats."""
    transformers = pytest.importorskip("transformers")
    quant = pytest.importorskip("torchao.quantization")
    from peakmem.hf.quant import checkpoint_weights

    cases = [
        (quant.Int4WeightOnlyConfig(group_size=64), "torchao-int4wo-g64"),
        (quant.Int8WeightOnlyConfig(), "torchao-int8wo"),
        (quant.Float8DynamicActivationFloat8WeightConfig(granularity=quant.PerRow()), "torchao-float8dq-row"),
        (quant.Float8DynamicActivationFloat8WeightConfig(), "torchao-float8dq-tensor"),
    ]
    for config, name in cases:
        qc = transformers.TorchAoConfig(config).to_dict()
        found = checkpoint_weights({"quantization_config": qc})
        assert found is not None and found.weights == name, (qc, found)
    legacy = {
        "quant_method": "torchao",
        "quant_type": "int4_weight_only",
        "quant_type_kwargs": {"group_size": 32},
    }
    other = {
        "quant_method": "torchao",
        "quant_type": {"default": {"_type": "Int8DynamicActivationInt4WeightConfig"}},
    }
    read = [checkpoint_weights({"quantization_config": qc}) for qc in (legacy, other)]
    assert [r.weights if r else None for r in read] == ["torchao-int4wo-g32", ""]
