"""What the real tools store, checked against formulas/weights.py and formulas/kv_cache.py.

bitsandbytes==0.50.2 quantizes on the CPU, so NF4/int8 byte counts are compared on real layer shapes;
transformers' own DynamicCache is filled by tiny models (GQA, sliding window, MLA) and its tensors
summed. Needs torch, transformers, bitsandbytes.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from peakmem.formulas.kv_cache import kv_cache_bytes
from peakmem.formulas.weights import bnb_4bit_bytes, bnb_int8_bytes

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def quant_state_bytes(state: Any) -> int:
    """Every tensor of a bitsandbytes 4-bit QuantState: absmax, code, offset and the nested state."""
    total = sum(nbytes(getattr(state, k)) for k in ("absmax", "code") if getattr(state, k) is not None)
    if state.offset is not None:
        total += nbytes(state.offset)
    if state.state2 is not None:
        total += nbytes(state.state2.absmax) + nbytes(state.state2.code)
    return total


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "double_quant"), [((4096, 4096), False), ((4096, 4096), True), ((14336, 4096), True)]
)
def test_bnb_nf4_bytes_real_shapes(shape: tuple[int, int], double_quant: bool) -> None:
    functional = pytest.importorskip("bitsandbytes.functional")
    weight = torch.randn(*shape, dtype=torch.bfloat16)
    packed, state = functional.quantize_4bit(
        weight, blocksize=64, compress_statistics=double_quant, quant_type="nf4"
    )
    stored = nbytes(packed) + quant_state_bytes(state)
    assert stored == bnb_4bit_bytes(shape[0] * shape[1], blocksize=64, double_quant=double_quant)


@pytest.mark.slow
def test_bnb_int8_bytes_real_shape() -> None:
    functional = pytest.importorskip("bitsandbytes.functional")
    weight = torch.randn(14336, 4096, dtype=torch.float16)  # up_proj: out 14336, in 4096
    cb, scb, _ = functional.int8_vectorwise_quant(weight)
    assert nbytes(cb) + nbytes(scb) == bnb_int8_bytes(4096, 14336)


def _cache_bytes(cache: Any) -> int:
    total = 0
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if t is not None and t.numel():
                total += nbytes(t)
    return total


def _run(config_dict: dict[str, Any], tokens: int) -> tuple[int, Any]:
    transformers = pytest.importorskip("transformers")
    from peakmem.hf import spec_from_config

    config = transformers.AutoConfig.for_model(**config_dict)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (2, tokens))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    spec = spec_from_config(config.to_dict(), name=config_dict["model_type"])
    return _cache_bytes(out.past_key_values), spec


def test_dynamic_cache_gqa_matches() -> None:
    cfg = dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
    )  # fmt: skip
    got, spec = _run(cfg, 37)
    assert got == kv_cache_bytes(spec, tokens=37, batch=2, bits=Fraction(16), latent=True)


def test_dynamic_cache_deepseek_v3_caches_the_latent() -> None:
    cfg = dict(
        model_type="deepseek_v3", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
        max_position_embeddings=512, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, n_group=1, topk_group=1,
    )  # fmt: skip
    got, spec = _run(cfg, 21)
    # transformers 5.x: (kv_lora_rank + qk_rope_head_dim) per token per layer, not the expanded heads
    assert got == kv_cache_bytes(spec, tokens=21, batch=2, bits=Fraction(16), latent=True)
    assert got == 2 * 21 * 2 * (16 + 8) * 2
    assert got < kv_cache_bytes(spec, tokens=21, batch=2, bits=Fraction(16), latent=False)
