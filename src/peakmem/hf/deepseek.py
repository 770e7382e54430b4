"""DeepSeek-V2/V3 (and Kimi-K2, which names DeepSeek-V3's modules): multi-head latent attention + MoE."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakmem.hf.decoder import _Decoder, _decoder_spec, _Moe
from peakmem.hf.reader import _Reader
from peakmem.hf.tensors import _Dropout
from peakmem.model import Attention, ModelSpec, Tensor, linear, norm


def _deepseek(r: _Reader, name: str | None, version: int) -> ModelSpec:
    """transformers/models/deepseek_v{2,3}/modeling_deepseek_v*.py: multi-head latent attention + MoE.

    Layers below ``first_k_dense_replace`` are dense; the rest hold fused routed experts, a router
    (``mlp.gate``) and ``n_shared_experts`` always-on experts fused into one MLP. In V3 the router's
    ``e_score_correction_bias`` is an ``nn.Buffer``, not a parameter.
    """
    arch = "DeepseekV2ForCausalLM" if version == 2 else "DeepseekV3ForCausalLM"
    heads = r.get_int("num_attention_heads")
    kv = r.get_int("num_key_value_heads", default=heads if version == 2 else 128, note=False)
    hidden = r.get_int("hidden_size")
    n = r.get_int("num_hidden_layers")
    q_rank = r.int_or_none("q_lora_rank", 1536)
    kv_rank = r.get_int("kv_lora_rank", default=512)
    nope = r.get_int("qk_nope_head_dim", default=128)
    rope = r.get_int("qk_rope_head_dim", default=64)
    v_dim = r.get_int("v_head_dim", default=128)
    bias = r.get_bool("attention_bias", False)
    mlp_bias = r.get_bool("mlp_bias", False) if version == 2 else False
    qk = nope + rope
    if q_rank is None:
        q: tuple[Tensor, ...] = linear("self_attn.q_proj", hidden, heads * qk, False, "attention")
    else:
        q = (
            *linear("self_attn.q_a_proj", hidden, q_rank, bias, "attention"),
            *norm("self_attn.q_a_layernorm", q_rank, False),
            *linear("self_attn.q_b_proj", q_rank, heads * qk, False, "attention"),
        )
    attn = (
        *q,
        *linear("self_attn.kv_a_proj_with_mqa", hidden, kv_rank + rope, bias, "attention"),
        *norm("self_attn.kv_a_layernorm", kv_rank, False),
        *linear("self_attn.kv_b_proj", kv_rank, heads * (nope + v_dim), False, "attention"),
        *linear("self_attn.o_proj", heads * v_dim, hidden, bias, "attention"),
    )
    dense = r.get_int("first_k_dense_replace", default=0 if version == 2 else 3, minimum=0)
    width = r.get_int("moe_intermediate_size")
    shared = r.get_int("n_shared_experts", default=2 if version == 2 else 1, minimum=0)
    moe = _Moe(
        sparse=tuple(i >= dense for i in range(n)),
        experts=r.get_int("n_routed_experts", "num_local_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        width=width,
        shared_width=width * shared,
        router_buffer=version == 3,
        router_fp32=True,  # DeepseekV{2,3}TopkRouter: F.linear(x.type(float32), weight.type(float32))
        # DeepseekV3Config norm_topk_prob defaults to True; V2's router never renormalises
        norm_topk=version == 3 and r.get_bool("norm_topk_prob", True),
        group_mask=version == 2 and r.get_str("topk_method", default="greedy") == "group_limited_greedy",
        shared_after_routed=True,  # DeepseekV{2,3}Moe.forward: experts(...), then + shared_experts(residuals)
    )
    freq = r.raw.get("moe_layer_freq", 1)
    if freq != 1:
        r.notes.append(
            f"moe_layer_freq={freq!r} is ignored: transformers makes every layer from "
            f"first_k_dense_replace={dense} on sparse"
        )
    mtp = r.get_int("num_nextn_predict_layers", default=0, minimum=0, note=False)
    if mtp:
        r.notes.append(
            f"num_nextn_predict_layers={mtp}: the multi-token-prediction layer is in the checkpoint "
            "but transformers does not build it; not counted"
        )
    d = _Decoder(
        architecture=arch,
        vocab=r.get_int("vocab_size"),
        hidden=hidden,
        n_layers=n,
        heads=heads,
        kv_heads=kv,
        head_dim=qk,
        intermediate=r.get_int("intermediate_size"),
        activation=r.get_str("hidden_act", default="silu"),
        tied=r.get_bool("tie_word_embeddings", False),
        max_pos=r.get_int("max_position_embeddings", default=2048 if version == 2 else 4096),
        windows=(None,) * n,
        rotary_dim=rope,
        mlp_bias=mlp_bias,
        moe=moe,
        dropout=_Dropout(attention=r.get_float("attention_dropout")),
    )

    def attention_for(i: int) -> Attention:
        return Attention(
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=qk,
            v_head_dim=v_dim,
            q_lora_rank=q_rank or 0,
            kv_lora_rank=kv_rank,
            qk_rope_head_dim=rope,
        )

    return _decoder_spec(r, d, name, attention_for, attn)


# The config key naming a checkpoint's multi-token-prediction layers: DeepSeek-V3 (DeepseekV3Config,
# config.json "num_nextn_predict_layers": 1) and GLM-4.5 (Glm4MoeConfig); other families that name
# their MTP layers otherwise (Qwen3-Next) are not read here yet.
MTP_LAYERS_KEY = "num_nextn_predict_layers"


# Qwen3-Next / Qwen3.5 name their MTP depth so (vllm/model_executor/models/qwen3_next_mtp.py:
# ``config.num_nextn_predict_layers = config.mtp_num_hidden_layers`` before building the layers)
QWEN_MTP_LAYERS_KEY = "mtp_num_hidden_layers"


def mtp_layers(config: Mapping[str, Any]) -> int:
    """The multi-token-prediction layers the checkpoint holds (0: none, or not a count)."""
    text = config.get("text_config")
    scopes = (config, text) if isinstance(text, Mapping) else (config,)
    for key in (MTP_LAYERS_KEY, QWEN_MTP_LAYERS_KEY):
        for scope in scopes:
            value = scope.get(key, 0)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0
