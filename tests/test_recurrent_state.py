"""Recurrent state of SSM / linear-attention blocks at inference (formulas/recurrent_state.py).

Hand-derived state sizes per family, checked three ways: the measured elements on the derived spec
(``simulate/derive/spec.py measure_state``, fake tensors), what transformers really allocates in its cache
for a real bf16 prefill of a tiny model on the CPU, and the bytes an inference estimate counts.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from peakmem.breakdown import Category
from peakmem.formulas.kv_cache import kv_cache_bytes
from peakmem.formulas.recurrent_state import recurrent_state_bytes, state_bytes_per_sequence
from peakmem.formulas.serving import estimate_inference
from peakmem.inference import InferenceSetup
from peakmem.resolve import resolve_model

# tiny configs of each family whose blocks keep a recurrent state in transformers 5.23's cache, with
# the (model-dtype, fp32) elements one sequence keeps per stateful layer, derived by hand
TINY: dict[str, tuple[dict[str, Any], tuple[int, int], int]] = {
    # gated delta-net: conv over q, k, v = (2 * 2 heads * 16 + 4 heads * 8) x kernel 4; the delta-rule
    # state 4 value heads x 16 x 8 (fp32); full attention every 2nd layer -> 2 stateful layers
    "qwen3_next": (
        dict(model_type="qwen3_next", vocab_size=128, hidden_size=64, intermediate_size=128,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2, num_experts=4,
             num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
        ((2 * 2 * 16 + 4 * 8) * 4, 4 * 16 * 8), 2,
    ),
    # Mamba-2 (parallel to attention in every layer): conv over x, B, C = (d_ssm 128 + 2 groups*16) x 4;
    # SSM state 4 heads x 32 head_dim x 16 d_state (fp32)
    "falcon_h1": (
        dict(model_type="falcon_h1", vocab_size=128, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_d_ssm=128,
             mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
             mamba_expand=2),
        ((128 + 2 * 1 * 16) * 4, 4 * 32 * 16), 2,
    ),
    "granitemoehybrid": (
        dict(model_type="granitemoehybrid", vocab_size=128, hidden_size=64, intermediate_size=32,
             shared_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16,
             mamba_d_conv=4, mamba_n_groups=1, mamba_expand=2, layer_types=["mamba", "attention"]),
        ((4 * 32 + 2 * 16) * 4, 4 * 32 * 16), 1,
    ),
    "mamba2": (
        dict(model_type="mamba2", vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=4,
             head_dim=32, expand=2, state_size=16, conv_kernel=4, n_groups=1),
        ((2 * 64 + 2 * 16) * 4, 4 * 32 * 16), 2,
    ),
    # Mamba-1: conv over d_inner = expand * hidden = 128 x 4; SSM state d_inner x d_state 16 (fp32)
    "jamba": (
        dict(model_type="jamba", vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
             expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2,
             mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8),
        (128 * 4, 128 * 16), 1,
    ),
    "mamba": (
        dict(model_type="mamba", vocab_size=128, hidden_size=64, num_hidden_layers=2, state_size=16, expand=2,
             conv_kernel=4, time_step_rank=8),
        (128 * 4, 128 * 16), 2,
    ),
    # LFM2's short convolution: hidden 64 x L_cache 3, no scan state
    "lfm2": (
        dict(model_type="lfm2", vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3,
             layer_types=["conv", "full_attention"]),
        (64 * 3, 0), 1,
    ),
    # MiniMax lightning attention: a key-value state of 4 heads x 16 x 16 per layer, kept in the model's
    # dtype (MiniMaxCache.linear_cache), no convolution
    "minimax": (
        dict(model_type="minimax", vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
             num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"]),
        (4 * 16 * 16, 0), 1,
    ),
}  # fmt: skip


# the conv window transformers keeps per channel (the config's conv kernel: conv_kernel, mamba_d_conv,
# linear_conv_kernel_dim, conv_L_cache); MiniMax's lightning attention has no convolution
CONV_WINDOW = {"qwen3_next": 4, "falcon_h1": 4, "granitemoehybrid": 4, "mamba2": 4, "jamba": 4, "mamba": 4,
               "lfm2": 3, "minimax": 0}  # fmt: skip


def _real_cache_elements(config: dict[str, Any]) -> list[tuple[int, int]]:
    """(bf16, fp32) elements per sequence of each stateful layer in transformers' cache after a real
    bf16 prefill of 2 x 8 tokens on the CPU."""
    torch = pytest.importorskip("torch")
    from peakmem.simulate import derive

    cfg = derive.config_object(config)
    cls = derive.model_class(config, cfg)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if hasattr(cls, "from_config"):
            model = cls.from_config(cfg, dtype=torch.bfloat16)
        else:
            model = cls._from_config(cfg, dtype=torch.bfloat16)
        model.eval()
        with torch.no_grad():
            out = model(input_ids=torch.randint(0, 128, (2, 8)), use_cache=True)
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache_params", None)
    found = []
    linear = list(getattr(cache, "linear_cache", None) or [])  # MiniMaxCache
    layers = list(cache.layers)
    for i in range(max(len(layers), len(linear))):
        b16 = f32 = 0
        states = [linear[i]] if i < len(linear) else []
        for attr in ("conv_states", "recurrent_states"):
            states += list((getattr(layers[i], attr, None) or {}).values()) if i < len(layers) else []
        for t in states:
            if isinstance(t, torch.Tensor):
                assert t.shape[0] == 2
                if t.dtype == torch.float32:
                    f32 += t.numel() // 2
                else:
                    assert t.dtype == torch.bfloat16
                    b16 += t.numel() // 2
        if b16 or f32:
            found.append((b16, f32))
    return found


@pytest.mark.torch
@pytest.mark.parametrize("family", sorted(TINY))
def test_measured_state_is_what_transformers_allocates(family: str, tmp_path: Any, monkeypatch: Any) -> None:
    pytest.importorskip("torch")
    from peakmem.simulate import derive

    monkeypatch.setenv("PEAKMEM_DERIVED_CACHE", str(tmp_path))
    config, per_layer, layers = TINY[family]
    assert _real_cache_elements(dict(config)) == [per_layer] * layers
    spec = derive.derive_spec(dict(config))
    blocks = [g.layer.derived for g in spec.groups for _ in range(g.count) if g.layer.derived is not None]
    got = [(b.state_elements, b.state_fp32_elements) for b in blocks]
    got = [pair for pair in got if pair != (0, 0)]
    assert got == [per_layer] * layers
    windows = {b.conv_kernel for b in blocks if b.state_elements or b.state_fp32_elements}
    assert windows == {CONV_WINDOW[family]}
    elems, fp32 = per_layer
    assert state_bytes_per_sequence(spec, act_bytes=2) == layers * (2 * elems + 4 * fp32)
    assert recurrent_state_bytes(spec, batch=3, act_bytes=2) == 3 * layers * (2 * elems + 4 * fp32)


# Qwen3-Next-80B-A3B (shipped derived data): 36 gated delta-net layers of 48 (full attention every 4th);
# conv over q, k, v = (2 * 16 key heads * 128 + 32 value heads * 128) x kernel 4 = 32768 bf16 elements;
# delta-rule state 32 value heads x 128 x 128 = 524288 fp32 elements
QWEN3_NEXT_STATE_PER_SEQ = 36 * (32768 * 2 + 524288 * 4)


def test_qwen3_next_state_per_sequence() -> None:
    spec = resolve_model("qwen3-next-80b-a3b")
    assert QWEN3_NEXT_STATE_PER_SEQ == 77_856_768
    assert state_bytes_per_sequence(spec, act_bytes=2) == QWEN3_NEXT_STATE_PER_SEQ
    # fp32 weights: the conv state doubles, the scan state stays fp32
    assert state_bytes_per_sequence(spec, act_bytes=4) == 36 * (32768 * 4 + 524288 * 4)
    # tensor parallel 2: split by heads
    assert state_bytes_per_sequence(spec, act_bytes=2, tp=2) == QWEN3_NEXT_STATE_PER_SEQ // 2


# the same state as each engine holds it (formulas/recurrent_state.py engine_state), hand-derived:
# vLLM keeps conv_kernel - 1 = 3 inputs of the 8192 conv channels and the delta-rule state in the model's
# dtype (bf16), one layer = 8192 * 3 * 2 + 524288 * 2 = 1,097,728 B, padded to one attention page: the
# attention layers cache 2 KV heads x (256 + 256) x 2 B = 2048 B per token, so the block becomes
# 16 * ceil(1,097,728 / (16 * 2048)) = 544 tokens and each page 544 * 2048 = 1,114,112 B;
# SGLang keeps 3 conv inputs in bf16 and the delta-rule state in fp32: 8192 * 3 * 2 + 524288 * 4;
# llama.cpp keeps d_conv - 1 = 3 inputs (llama-hparams.cpp n_embd_r) and both states in fp32
# (llama-model.cpp recurrent_type_k / _v GGML_TYPE_F32): 8192 * 3 * 4 + 524288 * 4
QWEN3_NEXT_VLLM_PAGE = 544 * 2048
QWEN3_NEXT_ENGINE_STATE = {
    "hf": QWEN3_NEXT_STATE_PER_SEQ,
    "llamacpp": 36 * (8192 * 3 * 4 + 524288 * 4),
    "vllm": 36 * QWEN3_NEXT_VLLM_PAGE,
    "sglang": 36 * (8192 * 3 * 2 + 524288 * 4),
}


@pytest.mark.parametrize("engine", ["hf", "vllm", "sglang", "llamacpp"])
def test_qwen3_next_infer_counts_the_state(engine: str) -> None:
    spec = resolve_model("qwen3-next-80b-a3b")
    setup = InferenceSetup(engine=engine, batch=4, context=8192)
    est = estimate_inference(spec, setup)
    state = [i for i in est.items if i.path.startswith("recurrent state")]
    per_seq = QWEN3_NEXT_ENGINE_STATE[engine]
    assert len(state) == 1 and state[0].bytes == 4 * per_seq
    assert sum(i.bytes for i in est.items) == est.peak_allocated_bytes
    assert est.extra["recurrent_state_bytes_per_sequence"] == per_seq
    text = " ".join(est.assumptions) + " ".join(spec.notes)
    assert "not counted" not in text and "was not recorded" not in text
    # independent of the context: the state item is the same at 1k and 8k tokens
    short = estimate_inference(spec, InferenceSetup(engine=engine, batch=4, context=1024))
    assert [i.bytes for i in short.items if i.path.startswith("recurrent state")] == [state[0].bytes]


def test_qwen3_next_hf_total_is_kv_plus_state() -> None:
    spec = resolve_model("qwen3-next-80b-a3b")
    est = estimate_inference(spec, InferenceSetup(engine="hf", batch=4, context=8192))
    # 12 full-attention layers x 2 KV heads x (256 + 256) x 2 bytes per token; the 36 linear-attention
    # layers cache no tokens
    kv = 12 * 2 * 512 * 2 * 8192 * 4
    assert kv_cache_bytes(spec, tokens=8192, batch=4, bits=16, latent=False) == kv
    assert est.extra["kv_bytes_per_token"] == 12 * 2 * 512 * 2
    assert est.by_category()[Category.KV_CACHE] == kv + 4 * QWEN3_NEXT_STATE_PER_SEQ


def test_vllm_pool_holds_kv_and_state_per_sequence() -> None:
    spec = resolve_model("qwen3-next-80b-a3b")
    est = estimate_inference(spec, InferenceSetup(engine="vllm", batch=2, context=4096))
    per_seq = est.extra["kv_bytes_per_sequence"]
    assert isinstance(per_seq, int)
    # the attention KV in 544-token blocks: 4096 tokens take 8 blocks (4352 tokens)
    kv = kv_cache_bytes(spec, tokens=4096, batch=1, bits=16, latent=False, block_size=544)
    assert kv == 12 * 2048 * 8 * 544
    assert per_seq == kv + 36 * QWEN3_NEXT_VLLM_PAGE


def test_models_without_recurrent_state_show_none() -> None:
    spec = resolve_model("gpt-oss-20b")
    assert state_bytes_per_sequence(spec, act_bytes=2) == 0
    est = estimate_inference(spec, InferenceSetup(engine="hf", batch=2, context=4096))
    assert not [i for i in est.items if i.path.startswith("recurrent state")]
    assert est.extra["recurrent_state_bytes_per_sequence"] == 0


def test_sliding_and_chunked_layers_are_capped_at_their_window() -> None:
    # gpt-oss-20b: 24 layers alternating sliding (128 tokens) / full; 8 KV heads x (64 + 64) x 2 bytes
    spec = resolve_model("gpt-oss-20b")
    per_token_layer = 8 * 128 * 2
    assert kv_cache_bytes(spec, tokens=10_000, batch=1, bits=16, latent=False) == per_token_layer * (
        12 * 10_000 + 12 * 128
    )
    # Llama 4 Scout: 48 layers, 3 of every 4 chunked at attention_chunk_size 8192; 8 KV heads x 256 x 2 B
    scout = resolve_model("llama-4-scout")
    per_token_layer = 8 * 256 * 2
    assert kv_cache_bytes(scout, tokens=100_000, batch=1, bits=16, latent=False) == per_token_layer * (
        12 * 100_000 + 36 * 8192
    )
