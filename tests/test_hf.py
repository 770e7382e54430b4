"""peakmem.hf: config.json -> ModelSpec, with hand-derived parameter counts (no torch).

Tiny configs use V=100 (vocab), H=64 (width), L=3 (layers), 4 heads, I=96 (MLP width); each count
is written out as the arithmetic of the tensors transformers creates. The torch tier
(tests/test_param_counts_torch.py) checks the same configs against transformers' own models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from peakmem.errors import ConfigError, InputError
from peakmem.hf import SUPPORTED_MODEL_TYPES, load_config, spec_from_config

V, H, L, NH, INTER = 100, 64, 3, 4, 96
TINY: dict[str, Any] = {
    "vocab_size": V,
    "hidden_size": H,
    "num_hidden_layers": L,
    "num_attention_heads": NH,
    "intermediate_size": INTER,
}


def tiny(model_type: str, **extra: Any) -> dict[str, Any]:
    return {"model_type": model_type, **TINY, **extra}


# --- hand-derived totals -----------------------------------------------------------------------------
def test_gpt2_count_conv1d_learned_positions_tied_head() -> None:
    cfg = {"model_type": "gpt2", "vocab_size": V, "n_embd": H, "n_layer": 2, "n_head": NH, "n_positions": 32}
    spec = spec_from_config(cfg)
    # per layer: ln_1 2H, c_attn H*3H+3H, c_proj H*H+H, ln_2 2H, c_fc H*4H+4H, c_proj 4H*H+H
    layer = 2 * H + (H * 3 * H + 3 * H) + (H * H + H) + 2 * H + (H * 4 * H + 4 * H) + (4 * H * H + H)
    assert layer == 12 * H * H + 13 * H
    # wte V*H + wpe P*H + ln_f 2H; the LM head is tied to wte
    assert spec.params == V * H + 32 * H + 2 * H + 2 * layer == 108_544
    assert spec.architecture == "GPT2LMHeadModel" and spec.tie_word_embeddings
    assert spec.max_position_embeddings == 32 and spec.position == "learned"
    c_attn = next(t for t in spec.first_layer.tensors if t.name == "attn.c_attn.weight")
    assert c_attn.shape == (H, 3 * H) and c_attn.module == "c_attn"  # Conv1D stores (in, out)
    assert spec.buffers == ()  # transformers 5.x GPT-2 has no causal-mask buffer
    assert (spec.attention_dropout, spec.hidden_dropout, spec.embedding_dropout) == (0.1, 0.1, 0.1)


def test_gpt2_untied_head_and_n_inner() -> None:
    cfg = {
        "model_type": "gpt2",
        "vocab_size": V,
        "n_embd": H,
        "n_layer": 2,
        "n_head": NH,
        "n_positions": 32,
        "n_inner": 80,
        "tie_word_embeddings": False,
    }
    layer = 2 * H + (H * 3 * H + 3 * H) + (H * H + H) + 2 * H + (H * 80 + 80) + (80 * H + H)
    assert spec_from_config(cfg).params == V * H + 32 * H + 2 * H + 2 * layer + V * H


def test_llama_gqa_count_and_breakdown() -> None:
    spec = spec_from_config(tiny("llama", num_key_value_heads=2))
    hd = H // NH  # 16
    attn = H * NH * hd + 2 * H * 2 * hd + NH * hd * H  # q, k+v (2 kv heads), o
    mlp = 3 * H * INTER  # gate, up, down
    norms = 2 * H
    assert spec.params == V * H + L * (attn + mlp + norms) + H + V * H == 105_408
    assert spec.params_by_component() == {
        "embeddings": V * H,
        "attention": L * attn,
        "mlp": L * mlp,
        "norms": L * norms + H,
        "head": V * H,
    }
    a = spec.first_layer.attention
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.v_head_dim) == (4, 2, 16, 16)
    assert spec.first_layer.mlp.gated and spec.first_layer.mlp.activation == "silu"
    assert spec.norm == "rmsnorm" and spec.position == "rope" and not spec.tie_word_embeddings
    # RoPE inv_freq and original_inv_freq, head_dim/2 each
    assert [t.name for t in spec.buffers] == [
        "model.rotary_emb.inv_freq",
        "model.rotary_emb.original_inv_freq",
    ]
    assert spec.buffer_numel == 2 * (hd // 2)
    assert {t.module for t in spec.first_layer.tensors} >= {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
    }


def test_llama_biases_head_dim_key_and_tied() -> None:
    spec = spec_from_config(
        tiny("llama", attention_bias=True, mlp_bias=True, head_dim=32, tie_word_embeddings=True)
    )
    q = NH * 32  # head_dim is independent of hidden/heads
    attn = (H * q + q) * 3 + (q * H + H)  # q, k, v (kv heads = heads) and o, each with a bias
    mlp = 2 * (H * INTER + INTER) + (INTER * H + H)
    assert spec.params == V * H + L * (attn + mlp + 2 * H) + H == 162_560
    assert any("num_key_value_heads not set" in n for n in spec.notes)


def test_mixtral_fused_experts_and_active_params() -> None:
    spec = spec_from_config(
        tiny("mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    )
    attn = 2 * H * H + 2 * H * 32
    router = 4 * H
    experts = 4 * 3 * H * INTER  # gate_up (E, 2I, H) + down (E, H, I)
    layer = attn + router + experts + 2 * H
    assert spec.params == 2 * V * H + H + L * layer == 272_064
    # active: 2 of 4 experts per token
    assert spec.active_params == spec.params - L * experts // 2 == 161_472
    gate_up = next(t for t in spec.first_layer.tensors if t.name == "mlp.experts.gate_up_proj")
    assert (
        gate_up.shape == (4, 2 * INTER, H) and gate_up.kind == "expert_weight" and gate_up.module == "experts"
    )
    mlp = spec.first_layer.mlp
    assert (mlp.num_experts, mlp.experts_per_token, mlp.intermediate_size) == (4, 2, INTER)
    assert spec.params_by_component()["router"] == L * router


def test_deepseek_v3_mla_dense_first_and_router_buffer() -> None:
    cfg = tiny(
        "deepseek_v3",
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=24,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        first_k_dense_replace=1,
        n_shared_experts=1,
        num_nextn_predict_layers=1,
    )
    spec = spec_from_config(cfg)
    # q_a 64*24, q_a_layernorm 24, q_b 24*(4*12), kv_a 64*(16+4), kv_a_layernorm 16,
    # kv_b 16*(4*(8+8)), o (4*8)*64
    attn = H * 24 + 24 + 24 * NH * 12 + H * 20 + 16 + 16 * NH * 16 + NH * 8 * H
    assert attn == 7080
    dense = attn + 3 * H * INTER + 2 * H
    moe = attn + 4 * H + 4 * 3 * H * 32 + 3 * H * 32 + 2 * H  # router, routed experts, one shared expert
    assert spec.params == 2 * V * H + H + dense + 2 * moe == 114_872
    assert [(g.count, g.layer.mlp.is_moe) for g in spec.groups] == [(1, False), (2, True)]
    a = spec.first_layer.attention
    assert (a.head_dim, a.v_head_dim, a.q_lora_rank, a.kv_lora_rank, a.qk_rope_head_dim) == (12, 8, 24, 16, 4)
    assert a.is_mla
    # e_score_correction_bias is a buffer in transformers 5.23, one per MoE layer; RoPE over qk_rope_head_dim
    assert spec.buffer_numel == 2 * 4 + 2 * (4 // 2)
    assert any("num_nextn_predict_layers=1" in n for n in spec.notes)
    assert spec.groups[1].layer.mlp.shared_intermediate_size == 32


def test_deepseek_v2_q_lora_rank_null_uses_q_proj() -> None:
    cfg = tiny(
        "deepseek_v2",
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        first_k_dense_replace=1,
    )
    spec = spec_from_config(cfg)
    names = {t.name for t in spec.first_layer.tensors}
    assert "self_attn.q_proj.weight" in names and "self_attn.q_a_proj.weight" not in names
    attn = H * NH * 12 + H * 20 + 16 + 16 * NH * 16 + NH * 8 * H
    dense = attn + 3 * H * INTER + 2 * H
    moe = attn + 4 * H + 4 * 3 * H * 32 + 3 * H * 2 * 32 + 2 * H  # V2 default n_shared_experts=2
    assert spec.params == 2 * V * H + H + dense + 2 * moe == 128_240
    assert spec.buffer_numel == 4  # no e_score_correction_bias in V2


def test_qwen2_moe_shared_expert_gate_and_sparse_step() -> None:
    cfg = tiny(
        "qwen2_moe",
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=2,
        mlp_only_layers=[2],
    )
    spec = spec_from_config(cfg)
    attn = (H * H + H) + 2 * (H * 32 + 32) + H * H  # q/k/v with biases, o without
    dense = attn + 3 * H * INTER + 2 * H
    sparse = (
        attn + 4 * H + 4 * 3 * H * 32 + 3 * H * 48 + H + 2 * H
    )  # router, experts, shared, shared gate (1, H)
    # layer 0: (0+1) % 2 != 0 -> dense; layer 1 sparse; layer 2 in mlp_only_layers -> dense
    assert [g.layer.mlp.is_moe for g in spec.groups] == [False, True, False]
    assert spec.params == 2 * V * H + H + 2 * dense + sparse == 121_472
    assert "mlp.shared_expert_gate.weight" in {t.name for t in spec.groups[1].layer.tensors}


def test_gemma2_alternating_windows_and_sandwich_norms() -> None:
    spec = spec_from_config(tiny("gemma2", head_dim=16, num_key_value_heads=2, sliding_window=8))
    windows = [layer.attention.sliding_window for layer in spec.layers()]
    assert windows == [8, None, 8]  # layer_types default: sliding on even layer indices
    assert len(spec.groups) == 3
    layer = 2 * H * H + 2 * H * 32 + 3 * H * INTER + 4 * H  # four RMSNorms per layer
    assert spec.params == V * H + H + L * layer  # tied head
    assert spec.buffer_numel == 1 + 2 * 8  # embed_scale (0-d) + rotary tables


def test_gemma3_multimodal_reads_text_config() -> None:
    cfg = {
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": H,
            "num_hidden_layers": 7,
            "intermediate_size": INTER,
            "head_dim": 16,
            "num_key_value_heads": 2,
            "vocab_size": V,
        },
    }
    spec = spec_from_config(cfg)
    assert spec.architecture == "Gemma3ForCausalLM" and spec.model_type == "gemma3"
    assert any("multimodal" in n for n in spec.notes)
    assert any("num_attention_heads not set" in n for n in spec.notes)  # Gemma3TextConfig default 8
    assert [layer.attention.sliding_window is None for layer in spec.layers()] == [False] * 5 + [True] + [
        False
    ]
    layer = H * 128 + 2 * H * 32 + 128 * H + 2 * 16 + 3 * H * INTER + 4 * H  # q_norm/k_norm over head_dim
    assert spec.params == V * H + H + 7 * layer
    # embed_scale + inv_freq/original_inv_freq for each of the two layer types
    assert spec.buffer_numel == 1 + 2 * 2 * 8


def test_olmo_layernorm_has_no_parameters_and_olmo2_full_qk_norm() -> None:
    olmo = spec_from_config(tiny("olmo"))
    assert olmo.params == 2 * V * H + L * (4 * H * H + 3 * H * INTER)
    assert "norms" not in olmo.params_by_component()
    olmo2 = spec_from_config(tiny("olmo2", num_key_value_heads=2))
    layer = 2 * H * H + 2 * H * 32 + (H + 32) + 3 * H * INTER + 2 * H  # q_norm (H) and k_norm (kv width)
    assert olmo2.params == 2 * V * H + H + L * layer
    assert olmo2.first_layer.attention.qk_norm == "full"


def test_phi3_fused_projections() -> None:
    spec = spec_from_config(tiny("phi3", num_key_value_heads=2))
    names = {t.name: t.shape for t in spec.first_layer.tensors}
    assert names["self_attn.qkv_proj.weight"] == (H + 2 * 32, H)
    assert names["mlp.gate_up_proj.weight"] == (2 * INTER, H)
    assert spec.first_layer.mlp.fused_gate_up


def test_starcoder2_biases_and_layernorm() -> None:
    spec = spec_from_config(tiny("starcoder2"))  # num_key_value_heads defaults to 2
    attn = 2 * (H * H + H) + 2 * (H * 32 + 32)
    mlp = (H * INTER + INTER) + (INTER * H + H)
    assert spec.params == V * H + 2 * H + L * (attn + mlp + 4 * H)  # tied, LayerNorms with bias
    assert spec.norm == "layernorm" and not spec.first_layer.mlp.gated


def test_opt_offset_projections_and_post_norm() -> None:
    base = {
        "model_type": "opt",
        "vocab_size": V,
        "hidden_size": H,
        "num_hidden_layers": 2,
        "num_attention_heads": NH,
        "ffn_dim": INTER,
        "max_position_embeddings": 32,
    }
    layer = 4 * (H * H + H) + (H * INTER + INTER) + (INTER * H + H) + 2 * 2 * H
    assert spec_from_config(base).params == V * H + (32 + 2) * H + 2 * H + 2 * layer
    spec = spec_from_config({**base, "word_embed_proj_dim": 32, "do_layer_norm_before": False})
    # embed V*32, positions (P+2)*H, project_out H*32, project_in 32*H, no final norm, head tied to (V, 32)
    assert spec.params == V * 32 + 34 * H + 2 * 32 * H + 2 * layer
    assert {t.name for t in spec.outer} >= {
        "model.decoder.project_in.weight",
        "model.decoder.project_out.weight",
    }


def test_falcon_variants() -> None:
    base = {
        "model_type": "falcon",
        "vocab_size": V,
        "hidden_size": H,
        "num_hidden_layers": 2,
        "num_attention_heads": NH,
    }
    hd = H // NH
    mlp = 2 * 4 * H * H
    mq = spec_from_config(base)  # multi_query: one K and V head; one LayerNorm before parallel attn+mlp
    assert mq.params == V * H + 2 * H + 2 * (H * (H + 2 * hd) + H * H + mlp + 2 * H)
    assert mq.first_layer.attention.num_kv_heads == 1 and mq.first_layer.parallel_residual
    new = spec_from_config({**base, "new_decoder_architecture": True, "num_kv_heads": 2, "bias": True})
    qkv = (2 * 2 + NH) * hd
    layer = (
        (H * qkv + qkv) + (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H) + 2 * 2 * H
    )  # ln_attn + ln_mlp
    assert new.params == V * H + 2 * H + 2 * layer
    assert "ln_attn.weight" in {t.name for t in new.first_layer.tensors}


def test_bloom_alibi_and_embedding_layernorm() -> None:
    spec = spec_from_config(
        {"model_type": "bloom", "vocab_size": V, "hidden_size": H, "n_layer": 2, "n_head": NH}
    )
    layer = 2 * H + (3 * H * H + 3 * H) + (H * H + H) + 2 * H + (4 * H * H + 4 * H) + (4 * H * H + H)
    assert spec.params == V * H + 2 * H + 2 * H + 2 * layer
    assert spec.position == "alibi" and spec.buffers == ()
    assert any("ALiBi" in n for n in spec.notes)


def test_bert_sequence_classification() -> None:
    spec = spec_from_config(tiny("bert", max_position_embeddings=32))
    embeddings = V * H + 32 * H + 2 * H + 2 * H  # word, position, token type, LayerNorm
    layer = 4 * (H * H + H) + 2 * H + (H * INTER + INTER) + (INTER * H + H) + 2 * H
    pooler, classifier = H * H + H, 2 * H + 2
    assert spec.params == embeddings + L * layer + pooler + classifier == 101_026
    assert spec.architecture == "BertForSequenceClassification" and spec.task == "sequence-classification"
    assert spec.num_labels == 2 and spec.buffer_numel == 2 * 32  # position_ids, token_type_ids
    three = spec_from_config(tiny("bert", id2label={"0": "a", "1": "b", "2": "c"}))
    assert three.num_labels == 3


def test_gpt_neox_partial_rotary_buffers() -> None:
    spec = spec_from_config(tiny("gpt_neox"))
    assert spec.buffer_numel == 2 * (int(16 * 0.25) // 2)  # rotary_pct defaults to 0.25
    assert spec.first_layer.parallel_residual


def test_sliding_windows_per_family() -> None:
    mistral = spec_from_config(tiny("mistral", num_key_value_heads=2))  # MistralConfig default 4096
    assert [layer.attention.sliding_window for layer in mistral.layers()] == [4096] * L
    assert any("sliding_window not set" in n for n in mistral.notes)
    off = spec_from_config(tiny("mistral", num_key_value_heads=2, sliding_window=None))
    assert off.first_layer.attention.sliding_window is None and len(off.groups) == 1
    # Qwen2: only with use_sliding_window, on layers >= max_window_layers
    qwen = spec_from_config(
        tiny("qwen2", num_key_value_heads=2, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    )
    assert [layer.attention.sliding_window for layer in qwen.layers()] == [None, 16, 16]
    assert [g.count for g in qwen.groups] == [1, 2]
    plain = spec_from_config(tiny("qwen2", num_key_value_heads=2, sliding_window=16))
    assert plain.first_layer.attention.sliding_window is None and len(plain.groups) == 1


def test_gemma3_layer_types_and_null_window() -> None:
    types = ["full_attention", "sliding_attention", "sliding_attention"]
    spec = spec_from_config(tiny("gemma3_text", head_dim=16, num_key_value_heads=2, layer_types=types))
    assert [layer.attention.sliding_window for layer in spec.layers()] == [None, 4096, 4096]
    none = spec_from_config(tiny("gemma3_text", head_dim=16, num_key_value_heads=2, sliding_window=None))
    assert all(layer.attention.sliding_window is None for layer in none.layers())
    # still one rotary table for the (sliding) layer type the config declares: embed_scale + 2 * 8
    assert none.buffer_numel == 1 + 2 * 8


# --- known published counts, no torch ------------------------------------------------------------------
LLAMA2_7B = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
}


@pytest.mark.parametrize(
    ("cfg", "params"),
    [
        (
            {
                "model_type": "gpt2",
                "vocab_size": 50257,
                "n_embd": 1600,
                "n_layer": 48,
                "n_head": 25,
                "n_positions": 1024,
            },
            1_557_611_200,
        ),
        (LLAMA2_7B, 6_738_415_616),
        (
            {**LLAMA2_7B, "vocab_size": 128256, "intermediate_size": 14336, "num_key_value_heads": 8},
            8_030_261_248,
        ),
        (
            {
                **LLAMA2_7B,
                "model_type": "mixtral",
                "intermediate_size": 14336,
                "num_key_value_heads": 8,
                "num_local_experts": 8,
                "num_experts_per_tok": 2,
            },
            46_702_792_704,
        ),
    ],
    ids=["gpt2-xl", "llama-2-7b", "llama-3-8b", "mixtral-8x7b"],
)
def test_known_counts(cfg: dict[str, Any], params: int) -> None:
    assert spec_from_config(cfg).params == params


def test_every_supported_type_builds() -> None:
    moe = {
        "num_experts": 4,
        "num_local_experts": 4,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    }
    for mt in SUPPORTED_MODEL_TYPES:
        cfg: dict[str, Any] = {**tiny(mt), "num_key_value_heads": 2, **moe, "ffn_dim": INTER, "head_dim": 16}
        if mt == "gemma3":
            cfg = {"model_type": mt, "text_config": tiny("gemma3_text", num_key_value_heads=2)}
        spec = spec_from_config(cfg, name="x")
        assert spec.params > 0 and spec.name == "x" and spec.num_layers == L


# --- behaviours the formulas read (ModelSpec fields that peakmem.hf sets per family) ------------------------
STANDARD = {
    "attn_softmax_fp32": True, "attn_dropout_before_cast": False, "attn_logit_softcap": None,
    "final_logit_softcap": None, "rmsnorm_normed_fp32": False, "post_norm": False, "final_norm": True,
    "embedding_norm": False, "conv1d_modules": (),
}  # fmt: skip
# Each family that departs from the Llama-style standard, with the transformers code it follows
# (model.py documents each field): everything not listed is STANDARD.
BEHAVIOURS: dict[str, dict[str, Any]] = {
    # modeling_gpt2.py: softmax in the scores' dtype; Conv1D projections
    "gpt2": {"attn_softmax_fp32": False, "conv1d_modules": ("c_attn", "c_proj", "c_fc")},
    "falcon": {"attn_softmax_fp32": False},  # FalconAttention: softmax(dtype=hidden_states.dtype)
    "bert": {  # modeling_bert.py: a post-norm encoder
        "attn_softmax_fp32": False, "attn_dropout_before_cast": True, "post_norm": True, "final_norm": False,
        "embedding_norm": True,
    },
    "gemma": {"rmsnorm_normed_fp32": True},  # GemmaRMSNorm: x.float() * rsqrt(...) * (1 + w.float())
    # Gemma2Config: attn_logit_softcapping=50.0, final_logit_softcapping=30.0
    "gemma2": {"rmsnorm_normed_fp32": True, "attn_logit_softcap": 50.0, "final_logit_softcap": 30.0},
    "gemma3_text": {"rmsnorm_normed_fp32": True},  # Gemma3TextConfig: both soft-caps None
    "gemma3": {"rmsnorm_normed_fp32": True},
    "olmo2": {"rmsnorm_normed_fp32": True},  # Olmo2RMSNorm: (self.weight * x_normed_fp32).to(input_dtype)
}  # fmt: skip


def _tiny_of(mt: str) -> dict[str, Any]:
    if mt == "gemma3":
        return {"model_type": mt, "text_config": tiny("gemma3_text", num_key_value_heads=2)}
    moe = {
        "num_local_experts": 4, "n_routed_experts": 4, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    }  # fmt: skip
    return {**tiny(mt), "num_key_value_heads": 2, "head_dim": 16, "ffn_dim": INTER, **moe}


@pytest.mark.parametrize("mt", SUPPORTED_MODEL_TYPES)
def test_behaviour_fields_per_family(mt: str) -> None:
    spec = spec_from_config(_tiny_of(mt))
    got = {k: getattr(spec, k) for k in STANDARD}
    assert got == {**STANDARD, **BEHAVIOURS.get(mt, {})}


def test_softcaps_follow_the_config() -> None:
    spec = spec_from_config(tiny("gemma2", attn_logit_softcapping=20.0, final_logit_softcapping=None))
    assert spec.attn_logit_softcap == 20.0 and spec.final_logit_softcap is None  # null: transformers skips it
    spec = spec_from_config(tiny("gemma3_text", final_logit_softcapping=30.0))
    assert spec.final_logit_softcap == 30.0 and spec.attn_logit_softcap is None
    with pytest.raises(ConfigError, match="attn_logit_softcapping=-1"):
        spec_from_config(tiny("gemma2", attn_logit_softcapping=-1))


def test_sdpa_support_is_the_kernel_table() -> None:
    """transformers' Gemma 2 has no SDPA (``_supports_sdpa = False``): the formulas read attention_kernels."""
    assert "sdpa" not in spec_from_config(tiny("gemma2")).attention_kernels
    assert spec_from_config(tiny("llama")).attention_kernels == ("eager", "sdpa", "flash")


# --- errors --------------------------------------------------------------------------------------------
def test_unknown_model_type_lists_supported() -> None:
    with pytest.raises(ConfigError, match=r"model_type='t5' is not supported; supported: gpt2, .*llama"):
        spec_from_config({"model_type": "t5"})


def test_missing_model_type() -> None:
    with pytest.raises(ConfigError, match="missing key 'model_type'"):
        spec_from_config({"hidden_size": 4})


def test_missing_required_key_names_it() -> None:
    cfg = tiny("llama")
    del cfg["hidden_size"]
    with pytest.raises(ConfigError) as e:
        spec_from_config(cfg)
    assert str(e.value) == "config.json: missing key 'hidden_size' (model_type=llama)"


def test_missing_moe_key() -> None:
    with pytest.raises(ConfigError, match="missing key 'num_experts_per_tok'"):
        spec_from_config(tiny("mixtral", num_key_value_heads=2, num_local_experts=4))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hidden_size", -64, "hidden_size=-64: must be positive"),
        ("num_hidden_layers", 0, "num_hidden_layers=0: must be positive"),
        ("vocab_size", "big", "vocab_size='big': must be an integer"),
        ("intermediate_size", 96.0, "intermediate_size=96.0: must be an integer"),
        ("num_attention_heads", True, "num_attention_heads=True: must be an integer"),
        ("tie_word_embeddings", "yes", "tie_word_embeddings='yes': must be true or false"),
        ("attention_dropout", -0.1, "attention_dropout=-0.1: must be a number >= 0"),
    ],
)
def test_bad_values_name_key_and_value(key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        spec_from_config(tiny("llama", **{key: value}))


def test_heads_not_divisible_by_kv_heads() -> None:
    with pytest.raises(ConfigError, match="num_key_value_heads=3: must divide num_attention_heads=4"):
        spec_from_config(tiny("llama", num_key_value_heads=3))


def test_hidden_not_divisible_by_heads() -> None:
    with pytest.raises(ConfigError, match="num_attention_heads=5: must divide hidden_size=64"):
        spec_from_config(tiny("gpt_neox", num_attention_heads=5))


def test_layer_types_length_checked() -> None:
    with pytest.raises(ConfigError, match="layer_types has 2 entries"):
        spec_from_config(tiny("gemma2", layer_types=["full_attention"] * 2))


def test_config_errors_are_input_errors() -> None:
    assert issubclass(ConfigError, InputError)


# --- load_config -----------------------------------------------------------------------------------------
def test_load_config_file_and_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny("llama")))
    assert load_config(tmp_path) == load_config(tmp_path / "config.json") == tiny("llama")


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=r"config\.json: no such file"):
        load_config(tmp_path)


def test_load_config_bad_json_says_where(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{\n  "hidden_size": 64,\n  "vocab_size": ,\n}')
    with pytest.raises(ConfigError, match="not valid JSON at line 3 column 17"):
        load_config(p)


def test_load_config_top_level_must_be_object(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object, not list"):
        load_config(p)
