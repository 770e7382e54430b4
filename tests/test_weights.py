"""Weight storage per format, derived by hand from each tool's packing (real layer shapes)."""

from __future__ import annotations

import pytest

from _infer_specs import LLAMA_3_8B, QWEN3, build_spec, tiny
from peakmem.errors import InputError
from peakmem.formulas.weights import (
    awq_linear_bytes,
    bnb_4bit_bytes,
    bnb_int8_bytes,
    fp8_linear_bytes,
    gguf_tensor_bytes,
    gguf_type_for,
    gptq_linear_bytes,
    use_more_bits,
    weight_bytes,
    weight_rows,
)
from peakmem.weight_formats import Scheme, parse_weight_format


def test_parse_weight_formats() -> None:
    assert parse_weight_format("GPTQ-4bit-g128").name == "gptq-4bit-g128"
    assert parse_weight_format("gptq").name == "gptq-4bit-g128"
    assert parse_weight_format("gptq-8bit-g-1").group_size == -1
    assert parse_weight_format("awq").scheme is Scheme.AWQ
    assert parse_weight_format("nf4-dq").double_quant
    assert parse_weight_format("Q4_K_M").gguf_type == "q4_k_m"
    assert parse_weight_format("gguf-iq4_xs").gguf_type == "iq4_xs"
    with pytest.raises(InputError, match="weights='q4_k_z'"):
        parse_weight_format("q4_k_z")
    with pytest.raises(InputError, match="awq supports"):
        parse_weight_format("awq-3bit")


def test_gptq_packing_4096x4096_and_mlp() -> None:
    # qweight int32 [4096*4/32, 4096] = 512x4096x4 B; qzeros int32 [32, 512]; scales fp16 [32, 4096];
    # g_idx int32 [4096]
    assert gptq_linear_bytes(4096, 4096, 4, 128) == 8_388_608 + 65_536 + 262_144 + 16_384
    # gate_proj 4096 -> 14336
    assert (
        gptq_linear_bytes(4096, 14336, 4, 128) == 512 * 14336 * 4 + 32 * 1792 * 4 + 32 * 14336 * 2 + 4096 * 4
    )
    # down_proj 14336 -> 4096: 112 groups
    assert (
        gptq_linear_bytes(14336, 4096, 4, 128) == 1792 * 4096 * 4 + 112 * 512 * 4 + 112 * 4096 * 2 + 14336 * 4
    )
    # 8-bit, per channel (group -1 = one group of 4096 rows)
    assert gptq_linear_bytes(4096, 4096, 8, -1) == 1024 * 4096 * 4 + 1 * 1024 * 4 + 4096 * 2 + 4096 * 4


def test_awq_packing() -> None:
    # qweight int32 [4096, 4096/8]; qzeros int32 [32, 512]; scales fp16 [32, 4096]
    assert awq_linear_bytes(4096, 4096, 4, 128) == 4096 * 512 * 4 + 32 * 512 * 4 + 32 * 4096 * 2
    assert awq_linear_bytes(4096, 14336, 4, 128) == 4096 * 1792 * 4 + 32 * 1792 * 4 + 32 * 14336 * 2


def test_bnb_4bit_and_int8() -> None:
    n = 4096 * 4096
    # packed n/2 + fp32 absmax per 64 + 16-entry fp32 code
    assert bnb_4bit_bytes(n) == n // 2 + n // 64 * 4 + 64
    # double quant: uint8 absmax per 64 + fp32 absmax per 256 blocks + 256-entry fp32 map + offset + code
    assert bnb_4bit_bytes(n, double_quant=True) == n // 2 + n // 64 + (n // 64 // 256) * 4 + 1024 + 4 + 64
    # LLM.int8: int8 [out, in] + fp32 SCB per row
    assert bnb_int8_bytes(4096, 14336) == 4096 * 14336 + 14336 * 4
    assert fp8_linear_bytes(4096, 1024, per_channel=False) == 4096 * 1024 + 4
    assert fp8_linear_bytes(4096, 1024, per_channel=True) == 4096 * 1024 + 1024 * 4


def test_llama3_8b_nf4_keeps_head_and_embeddings_16bit() -> None:
    spec = build_spec(LLAMA_3_8B)
    rows = {r.name: r for r in weight_rows(spec, parse_weight_format("nf4"))}
    assert rows["lm_head.weight"].bytes == 128256 * 4096 * 2
    assert rows["model.embed_tokens.weight"].bytes == 128256 * 4096 * 2
    assert rows["input_layernorm.weight"].bytes == 32 * 4096 * 2
    assert rows["self_attn.q_proj.weight"].bytes == 32 * bnb_4bit_bytes(4096 * 4096)
    assert rows["mlp.down_proj.weight"].bytes == 32 * bnb_4bit_bytes(4096 * 14336)


def test_gptq_model_total() -> None:
    spec = build_spec(LLAMA_3_8B)
    per_layer = (
        gptq_linear_bytes(4096, 4096, 4, 128) * 2  # q, o
        + gptq_linear_bytes(4096, 1024, 4, 128) * 2  # k, v
        + gptq_linear_bytes(4096, 14336, 4, 128) * 2  # gate, up
        + gptq_linear_bytes(14336, 4096, 4, 128)  # down
        + 2 * 4096 * 2  # two RMSNorm weights, fp16
    )
    outer = 2 * 128256 * 4096 * 2 + 4096 * 2  # embeddings, head, final norm
    assert weight_bytes(spec, parse_weight_format("gptq-4bit-g128")) == 32 * per_layer + outer


def test_moe_router_stays_16bit_experts_quantized() -> None:
    spec = build_spec(QWEN3["qwen3-30b-a3b"])
    rows = {r.name: r for r in weight_rows(spec, parse_weight_format("awq"))}
    assert rows["mlp.gate.weight"].bytes == 48 * 128 * 2048 * 2
    assert rows["mlp.experts.gate_proj.weight"].bytes == 48 * 128 * awq_linear_bytes(2048, 768, 4, 128)
    # bitsandbytes leaves transformers 5's fused expert parameters (not nn.Linear) in 16-bit
    nf4 = {r.name: r for r in weight_rows(spec, parse_weight_format("nf4"))}
    assert nf4["mlp.experts.down_proj.weight"].bytes == 48 * 128 * 768 * 2048 * 2


def test_format_the_architecture_cannot_use() -> None:
    spec = tiny(hidden=128, heads=4, head_dim=32, kv_heads=2, inter=200)  # 200 is not a multiple of 128
    with pytest.raises(InputError, match=r"awq-4bit-g128.*down_proj\.weight has in_features=200"):
        weight_bytes(spec, parse_weight_format("awq"))


def test_gguf_block_sizes() -> None:
    # Q4_0 18 B / 32, Q8_0 34 / 32, Q4_K 144 / 256, Q5_K 176, Q6_K 210, Q2_K 84, Q3_K 110
    shape = (4096, 4096)
    n = 4096 * 4096
    assert gguf_tensor_bytes("Q4_0", shape) == n // 32 * 18
    assert gguf_tensor_bytes("Q8_0", shape) == n // 32 * 34
    for t, size in (
        ("Q2_K", 84),
        ("Q3_K", 110),
        ("Q4_K", 144),
        ("Q5_K", 176),
        ("Q6_K", 210),
        ("IQ4_XS", 136),
    ):
        assert gguf_tensor_bytes(t, shape) == n // 256 * size


def test_gguf_q4_k_m_mix() -> None:
    # use_more_bits: first/last eighth and every third layer between (llama-quant.cpp)
    assert [i for i in range(32) if use_more_bits(i, 32)] == [
        0,
        1,
        2,
        3,
        6,
        9,
        12,
        15,
        18,
        21,
        24,
        27,
        28,
        29,
        30,
        31,
    ]
    kw = dict(n_layers=32, n_gqa=4, n_expert=0, ne0=4096, tied=False)
    assert gguf_type_for("q4_k_m", "attn_v", i_layer=0, **kw) == "Q6_K"
    assert gguf_type_for("q4_k_m", "attn_v", i_layer=4, **kw) == "Q4_K"
    assert gguf_type_for("q4_k_m", "ffn_down", i_layer=6, **kw) == "Q6_K"
    assert gguf_type_for("q4_k_m", "attn_q", i_layer=6, **kw) == "Q4_K"
    assert gguf_type_for("q4_k_m", "output", i_layer=0, **kw) == "Q6_K"
    assert gguf_type_for("q4_k_m", "token_embd", i_layer=0, **kw) == "Q4_K"
    # a row of 1000 elements cannot hold 256-element blocks: Q4_K falls back to Q5_0 ... then F16
    assert gguf_type_for("q4_k_m", "attn_q", i_layer=5, **{**kw, "ne0": 1024 + 32}) == "Q5_0"
    assert gguf_type_for("q4_k_m", "attn_q", i_layer=5, **{**kw, "ne0": 1000}) == "F16"


def test_gguf_llama3_8b_file_sizes() -> None:
    # Published Meta-Llama-3-8B-Instruct GGUF file sizes (bartowski, no-imatrix mixes; files also
    # hold ~5 MB of tokenizer metadata): Q8_0 8.54 GB, Q4_K_M 4.92 GB, Q2_K 3.18 GB.
    spec = build_spec(LLAMA_3_8B)
    for fmt, published in (("q8_0", 8.54e9), ("q4_k_m", 4.92e9), ("q2_k", 3.18e9)):
        got = weight_bytes(spec, parse_weight_format(fmt))
        assert abs(got - published) / published < 0.005, (fmt, got)
    # every 1-D tensor stays F32
    rows = {r.name: r for r in weight_rows(spec, parse_weight_format("q4_k_m"))}
    assert rows["input_layernorm.weight"].storage == "F32"
    assert rows["self_attn.v_proj.weight"].storage == "Q4_K/Q6_K"
