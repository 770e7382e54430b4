"""KV-cache bytes, derived by hand (formula in each comment)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from _infer_specs import DEEPSEEK_V3, LLAMA_3_8B, MISTRAL_7B, QWEN3, build_spec, tiny
from peakmem.formulas.kv_cache import (
    cache_kind,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_elements_per_token_layer,
    kv_heads_per_rank,
    round_to_block,
)
from peakmem.inference import KV_BITS, KvDtype

B16 = Fraction(16)


def test_llama3_8b_bf16_per_token() -> None:
    # 32 layers x 8 KV heads x 128 x (K+V) x 2 bytes = 131,072
    spec = build_spec(LLAMA_3_8B)
    assert kv_bytes_per_token(spec, bits=B16, latent=True) == 131_072
    assert kv_cache_bytes(spec, tokens=8192, batch=4, bits=B16, latent=True) == 131_072 * 8192 * 4


def test_qwen3_8b_per_token_matches_validation_note() -> None:
    # 36 x 8 x 128 x 2 x 2 = 147,456 (the delta noted in shared/validation)
    assert kv_bytes_per_token(build_spec(QWEN3["qwen3-8b"]), bits=B16, latent=True) == 147_456


def test_mha_gqa_mqa() -> None:
    # tiny: 2 layers, head_dim 16: elements per token per layer = kv_heads x 32
    for kv, expected in ((4, 4 * 32), (2, 2 * 32), (1, 32)):
        spec = tiny(kv_heads=kv)
        assert kv_elements_per_token_layer(spec.first_layer.attention, latent=True) == expected
        assert kv_bytes_per_token(spec, bits=B16, latent=True) == 2 * expected * 2


def test_mistral_sliding_window_caps_cache() -> None:
    spec = build_spec(MISTRAL_7B)
    per_token = 131_072  # same attention shape as Llama-3-8B
    assert kv_cache_bytes(spec, tokens=2048, batch=1, bits=B16, latent=True) == per_token * 2048
    # beyond the 4096-token window the cache stops growing
    assert kv_cache_bytes(spec, tokens=32768, batch=1, bits=B16, latent=True) == per_token * 4096
    assert kv_cache_bytes(spec, tokens=32768, batch=3, bits=B16, latent=True) == per_token * 4096 * 3


def test_alternating_local_global_layers() -> None:
    # Gemma-2-like: layer 0 local (window 8), layer 1 global; per layer per token 2x32 elements x 2 B
    spec = tiny(layer_windows=[8, None])
    per_layer_token = 2 * 32 * 2
    assert kv_cache_bytes(spec, tokens=100, batch=1, bits=B16, latent=True) == per_layer_token * (8 + 100)
    assert kv_cache_bytes(spec, tokens=5, batch=1, bits=B16, latent=True) == per_layer_token * (5 + 5)


def test_deepseek_v3_latent_vs_expanded() -> None:
    spec = build_spec(DEEPSEEK_V3)
    att = spec.first_layer.attention
    # latent: kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576 elements per token per layer
    assert kv_elements_per_token_layer(att, latent=True) == 576
    assert kv_bytes_per_token(spec, bits=B16, latent=True) == 61 * 576 * 2 == 70_272
    # expanded: 128 heads x (K 192 + V 128) = 40,960 elements
    assert kv_elements_per_token_layer(att, latent=False) == 128 * (192 + 128)
    assert kv_bytes_per_token(spec, bits=B16, latent=False) == 61 * 40_960 * 2
    assert cache_kind(spec, latent=True) == "latent"
    assert cache_kind(spec, latent=False) == "expanded"
    assert cache_kind(build_spec(LLAMA_3_8B), latent=True) == "standard"
    # the latent is replicated on every TP rank; expanded heads are split
    assert kv_elements_per_token_layer(att, latent=True, tp=8) == 576
    assert kv_elements_per_token_layer(att, latent=False, tp=8) == 16 * 320


def test_moe_kv_depends_on_attention_only() -> None:
    # Qwen3-30B-A3B: 48 layers x 4 KV heads x 128 x 2 x 2 B = 98,304
    assert kv_bytes_per_token(build_spec(QWEN3["qwen3-30b-a3b"]), bits=B16, latent=True) == 98_304


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(KvDtype.FP16, 131_072), (KvDtype.FP8, 65_536), (KvDtype.FP32, 262_144),
     # int8: 34 bytes per 32 elements (q8_0); int4: 18 bytes per 32 (q4_0)
     (KvDtype.INT8, 65_536 * 34 // 32), (KvDtype.INT4, 65_536 * 18 // 32)],
)  # fmt: skip
def test_kv_dtypes(dtype: KvDtype, expected: int) -> None:
    assert kv_bytes_per_token(build_spec(LLAMA_3_8B), bits=KV_BITS[dtype], latent=True) == expected


def test_tensor_parallel_heads() -> None:
    assert kv_heads_per_rank(8, 2) == 4
    assert kv_heads_per_rank(8, 16) == 1  # replicated when ranks exceed KV heads
    assert kv_bytes_per_token(build_spec(LLAMA_3_8B), bits=B16, latent=True, tp=4) == 131_072 // 4


def test_paged_block_rounding() -> None:
    assert round_to_block(1, 16) == 16
    assert round_to_block(16, 16) == 16
    assert round_to_block(17, 16) == 32
    spec = tiny()
    per_token = kv_bytes_per_token(spec, bits=B16, latent=True)
    assert (
        kv_cache_bytes(spec, tokens=17, batch=2, bits=B16, latent=True, block_size=16) == per_token * 32 * 2
    )
