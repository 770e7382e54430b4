"""QLoRA base storage and dequantization temporaries on tiny specs, by hand."""

from __future__ import annotations

import pytest

from peakmem.adapters import QuantConfig
from peakmem.errors import InputError
from peakmem.formulas.qlora import base_bytes, base_rows, dequant_temporaries, quantized_params
from peakmem.hf import spec_from_config

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
MIXTRAL = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2,
}  # fmt: skip


def nf4(numel: int) -> int:
    """Packed 4-bit (numel/2) + fp32 absmax per 64 + 16-entry fp32 code."""
    return numel // 2 + numel // 64 * 4 + 64


def test_nf4_base_keeps_embeddings_head_norms_16bit() -> None:
    spec = spec_from_config(LLAMA, name="t")
    # per layer: q 64x64, k/v 32x64, o 64x64, gate/up/down 128x64
    linears = [64 * 64, 32 * 64, 32 * 64, 64 * 64, 128 * 64, 128 * 64, 128 * 64]
    quantized = 2 * sum(nf4(n) for n in linears)
    bf16 = 2 * (128 * 64 + 128 * 64 + 64 + 2 * 2 * 64)  # embed, lm_head, final norm, 2 norms x 2 layers
    assert base_bytes(spec, QuantConfig(quant="nf4")) == quantized + bf16
    assert quantized_params(spec) == 2 * sum(linears)


def test_double_quant_and_int8() -> None:
    spec = spec_from_config(LLAMA, name="t")
    dq = {r.name: r for r in base_rows(spec, QuantConfig(quant="nf4", double_quant=True))}
    # 8192 elements: packed 4096 + uint8 absmax 128 + fp32 absmax per 256 blocks (1) + 256-entry fp32 code
    # + fp32 offset + 16-entry fp32 code. Tiny tensors: the nested code outweighs what it saves.
    assert dq["mlp.down_proj.weight"].bytes == 2 * (4096 + 128 + 4 + 1024 + 4 + 64)
    rows = {r.name: r for r in base_rows(spec, QuantConfig(quant="int8"))}
    assert rows["mlp.down_proj.weight"].bytes == 2 * (128 * 64 + 64 * 4)  # int8 + fp32 SCB per output row
    assert rows["lm_head.weight"].storage == "bf16"


def test_moe_router_and_experts_stay_16bit() -> None:
    spec = spec_from_config(MIXTRAL, name="m")
    rows = {r.name: r for r in base_rows(spec, QuantConfig(quant="nf4"))}
    assert rows["mlp.gate.weight"].bytes == 4 * 64 * 2
    assert rows["mlp.experts.gate_up_proj"].bytes == 4 * 256 * 64 * 2


def test_dequant_temporaries() -> None:
    spec = spec_from_config(LLAMA, name="t")
    t = dequant_temporaries(spec, QuantConfig(quant="nf4", double_quant=True), tokens=10, compute_bytes=2)
    assert t.forward == 128 * 64 * 2 + 128 * 64 // 64 * 4  # the largest weight in bf16 + fp32 absmax
    t8 = dequant_temporaries(spec, QuantConfig(quant="int8"), tokens=10, compute_bytes=2)
    assert t8.backward == 128 * 64 * 2
    assert t8.forward == 10 * 128 * 1 + 10 * 4  # int8 copy of the widest input + row scales (fp16 input)


def test_bad_quant_options() -> None:
    with pytest.raises(InputError, match="quant="):
        QuantConfig(quant="nf3")
    with pytest.raises(InputError, match="double_quant"):
        QuantConfig(quant="int8", double_quant=True)
    with pytest.raises(InputError, match="quant_blocksize"):
        QuantConfig(blocksize=100)
