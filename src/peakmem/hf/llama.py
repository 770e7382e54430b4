"""Llama-style decoder families built with :mod:`peakmem.hf.decoder`: Llama, Mistral, Mixtral, Qwen2/3
(dense and MoE), Gemma 1/2/3, Phi-3, StarCoder2, OLMo 1/2."""

from __future__ import annotations

from dataclasses import replace

from peakmem.hf.decoder import (
    _common,
    _Decoder,
    _decoder_spec,
    _Defaults,
    _Moe,
    _sliding_flags,
    _windows_all,
    _windows_typed,
)
from peakmem.hf.reader import _partial_rotary, _Reader
from peakmem.hf.tensors import _Dropout
from peakmem.model import ModelSpec


def _qwen_windows(r: _Reader, n_layers: int) -> tuple[int | None, ...]:
    """Qwen2/Qwen3Config: sliding only with use_sliding_window, on layers >= max_window_layers."""
    use = r.get_bool("use_sliding_window", False)
    window = r.int_or_none("sliding_window", 4096) if use else None
    first = r.get_int("max_window_layers", default=28, minimum=0, note=False)
    return _windows_typed(r, n_layers, window, [window is not None and i >= first for i in range(n_layers)])


def _llama(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/llama/modeling_llama.py: LlamaForCausalLM (Llama 1/2/3/3.1/3.2)."""
    c = _common(r, _Defaults(architecture="LlamaForCausalLM"))
    bias = r.get_bool("attention_bias", False)
    d = _Decoder(
        **c,
        windows=(None,) * c["n_layers"],
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=r.get_bool("mlp_bias", False),
    )
    return _decoder_spec(r, d, name)


def _mistral(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/mistral/modeling_mistral.py: MistralForCausalLM (GQA, sliding window)."""
    c = _common(r, _Defaults(architecture="MistralForCausalLM", kv_heads=8, max_pos=131072))
    return _decoder_spec(r, _Decoder(**c, windows=_windows_all(r, c["n_layers"], 4096)), name)


def _mixtral(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/mixtral/modeling_mixtral.py: MixtralForCausalLM (every layer a sparse MoE)."""
    c = _common(r, _Defaults(architecture="MixtralForCausalLM", kv_heads=8, max_pos=131072))
    n = c["n_layers"]
    moe = _Moe(
        sparse=(True,) * n,
        experts=r.get_int("num_local_experts", "num_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        width=c["intermediate"],
        norm_topk=True,  # MixtralTopKRouter: router_top_value /= router_top_value.sum(...), always
    )
    return _decoder_spec(r, _Decoder(**c, windows=_windows_all(r, n, None), moe=moe), name)


def _qwen2(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/qwen2/modeling_qwen2.py: Qwen2ForCausalLM (Qwen2/2.5: q/k/v biases)."""
    c = _common(r, _Defaults(architecture="Qwen2ForCausalLM", kv_heads=32, max_pos=32768))
    d = _Decoder(**c, windows=_qwen_windows(r, c["n_layers"]), qkv_bias=True)
    return _decoder_spec(r, d, name)


def _qwen3(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/qwen3/modeling_qwen3.py: Qwen3ForCausalLM (per-head q_norm / k_norm)."""
    c = _common(r, _Defaults(architecture="Qwen3ForCausalLM", kv_heads=32, head_dim=128, max_pos=32768))
    bias = r.get_bool("attention_bias", False)
    d = _Decoder(**c, windows=_qwen_windows(r, c["n_layers"]), qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    return _decoder_spec(r, d, name)


def _qwen_sparse(r: _Reader, n_layers: int) -> tuple[bool, ...]:
    """Qwen2/3-MoE decoder layers: sparse unless in mlp_only_layers or off the decoder_sparse_step grid."""
    dense = set(r.int_list("mlp_only_layers"))
    step = r.get_int("decoder_sparse_step", default=1, note=False)
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(n_layers))


def _qwen2_moe(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/qwen2_moe/modeling_qwen2_moe.py: Qwen2MoeForCausalLM (shared expert + its gate)."""
    c = _common(r, _Defaults(architecture="Qwen2MoeForCausalLM", kv_heads=16, max_pos=32768))
    n = c["n_layers"]
    moe = _Moe(
        sparse=_qwen_sparse(r, n),
        experts=r.get_int("num_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        width=r.get_int("moe_intermediate_size"),
        shared_width=r.get_int("shared_expert_intermediate_size"),
        shared_path="mlp.shared_expert",
        shared_gate=True,
        norm_topk=r.get_bool("norm_topk_prob", False),  # Qwen2MoeConfig default
        weights_fp32=False,  # Qwen2MoeTopKRouter: router_top_value.to(router_logits.dtype)
    )
    use = r.get_bool("use_sliding_window", False)
    window = r.int_or_none("sliding_window", 4096) if use else None
    first = r.get_int("max_window_layers", default=28, minimum=0, note=False)
    # Qwen2MoeConfig's own rule: odd layers below max_window_layers slide, when use_sliding_window.
    windows = _windows_typed(
        r, n, window, [window is not None and i % 2 == 0 and i < first for i in range(n)]
    )
    d = _Decoder(**c, windows=windows, qkv_bias=r.get_bool("qkv_bias", True), moe=moe)
    return _decoder_spec(r, d, name)


def _qwen3_moe(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/qwen3_moe/modeling_qwen3_moe.py: Qwen3MoeForCausalLM (no shared expert)."""
    c = _common(r, _Defaults(architecture="Qwen3MoeForCausalLM", kv_heads=4, max_pos=32768))
    n = c["n_layers"]
    moe = _Moe(
        sparse=_qwen_sparse(r, n),
        experts=r.get_int("num_experts", "num_local_experts"),
        top_k=r.get_int("num_experts_per_tok"),
        width=r.get_int("moe_intermediate_size"),
        norm_topk=r.get_bool("norm_topk_prob", False),  # Qwen3MoeConfig default
        weights_fp32=False,  # Qwen3MoeTopKRouter: router_top_value.to(router_logits.dtype)
    )
    window = r.int_or_none("sliding_window", 4096) if r.get_bool("use_sliding_window", False) else None
    bias = r.get_bool("attention_bias", False)
    d = _Decoder(**c, windows=(window,) * n, qkv_bias=bias, o_bias=bias, qk_norm="per_head", moe=moe)
    return _decoder_spec(r, d, name)


# Gemma2Config defaults (configuration_gemma2.py): attn_logit_softcapping, final_logit_softcapping.
GEMMA2_ATTN_SOFTCAP = 50.0
GEMMA2_FINAL_SOFTCAP = 30.0


def _gemma_like(r: _Reader, name: str | None, version: int) -> ModelSpec:
    """transformers/models/gemma{,2,3}/modeling_gemma*.py: Gemma/Gemma2/Gemma3ForCausalLM.

    head_dim is its own key (256 by default), the head is tied, the embedding is scaled by a 0-d
    buffer; Gemma 2/3 add pre/post feed-forward norms and alternate local (sliding) and global layers;
    Gemma 3 adds per-head q/k norms and one rotary table per layer type.
    """
    arch, kv_default, vocab_default, max_pos = {
        1: ("GemmaForCausalLM", 16, 256000, 8192),
        2: ("Gemma2ForCausalLM", 4, 256000, 8192),
        3: ("Gemma3ForCausalLM", 4, 262208, 131072),
    }[version]
    # Gemma3TextConfig defaults vocab_size and num_attention_heads too; multimodal gemma3 text_configs
    # often omit them.
    f = _Defaults(
        architecture=arch,
        kv_heads=kv_default,
        head_dim=256,
        tied=True,
        max_pos=max_pos,
        activation="gelu_pytorch_tanh",
        vocab=vocab_default if version == 3 else None,
        heads=8 if version == 3 else None,
    )
    c = _common(r, f)
    n = c["n_layers"]
    bias = r.get_bool("attention_bias", False)
    if version == 1:
        windows: tuple[int | None, ...] = (None,) * n
    else:
        window = r.int_or_none("sliding_window", 4096)
        # Gemma2Config alternates (every 2nd layer global); Gemma3TextConfig reads the legacy
        # sliding_window_pattern (default 6: five local layers, then one global).
        pattern = 2 if version == 2 else r.get_int("sliding_window_pattern", default=6, note=False)
        flags = _sliding_flags(r, n, [bool((i + 1) % pattern) for i in range(n)])
        windows = tuple(window if f else None for f in flags)
    rope_names: tuple[str, ...] = ("",)
    if version == 3:  # Gemma3RotaryEmbedding: one table per layer type present, sorted
        types = {"sliding_attention" if f else "full_attention" for f in flags}
        rope_names = tuple(f"{t}_" for t in sorted(types))
    d = _Decoder(
        **c,
        windows=windows,
        qkv_bias=bias,
        o_bias=bias,
        layout="pre" if version == 1 else "sandwich",
        qk_norm="per_head" if version == 3 else "none",
        rope_names=rope_names,
        embed_scale=True,
    )
    # GemmaRMSNorm: ``(x.float() * rsqrt(...)) * (1 + weight.float())``, cast after: the normalised x
    # saved for backward is fp32. Gemma 2 soft-caps attention and head logits (Gemma2Config defaults
    # attn_logit_softcapping=50.0, final_logit_softcapping=30.0; modeling_gemma2.py applies each when
    # not None); Gemma 3 passes the same keys (Gemma3TextConfig defaults None: no capping).
    attn_cap = final_cap = None  # Gemma (1) has no capping
    if version > 1:
        v2 = version == 2
        attn_cap = r.float_or_none("attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP if v2 else None)
        final_cap = r.float_or_none("final_logit_softcapping", GEMMA2_FINAL_SOFTCAP if v2 else None)
    return replace(
        _decoder_spec(r, d, name), rmsnorm_normed_fp32=True, attn_logit_softcap=attn_cap,
        final_logit_softcap=final_cap,
    )  # fmt: skip


def _phi3(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/phi3/modeling_phi3.py: Phi3ForCausalLM (fused qkv_proj and gate_up_proj)."""
    c = _common(r, _Defaults(architecture="Phi3ForCausalLM", max_pos=4096))
    c["rotary_dim"] = int(c["head_dim"] * _partial_rotary(r, 1.0))
    drop = r.get_float("resid_pdrop")
    c["dropout"] = _Dropout(r.get_float("attention_dropout"), drop, r.get_float("embd_pdrop"))
    spec = _decoder_spec(r, _Decoder(**c, windows=_windows_all(r, c["n_layers"], None), fused=True), name)
    # modeling_phi3.py apply_rotary_pos_emb: ``torch.cat([(q_rot * cos) + ..., q_pass], dim=-1)``
    return replace(spec, rope_concat=True)


def _starcoder2(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/starcoder2/modeling_starcoder2.py: Starcoder2ForCausalLM (biases, LayerNorm)."""
    c = _common(
        r,
        _Defaults(
            architecture="Starcoder2ForCausalLM",
            kv_heads=2,
            tied=True,
            max_pos=4096,
            activation="gelu_pytorch_tanh",
        ),
    )
    bias = r.get_bool("use_bias", True)
    c["dropout"] = _Dropout(
        r.get_float("attention_dropout"), r.get_float("residual_dropout"), r.get_float("embedding_dropout")
    )
    d = _Decoder(
        **c,
        windows=_windows_all(r, c["n_layers"], None),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        norm_kind="layernorm",
        norm_bias=True,
        gated=False,
    )
    return _decoder_spec(r, d, name)


def _olmo(r: _Reader, name: str | None, version: int) -> ModelSpec:
    """transformers/models/olmo{,2}/modeling_olmo*.py: OLMo (LayerNorm without parameters) and OLMo 2
    (RMSNorm after attention and MLP, q_norm / k_norm over all heads)."""
    arch = "OlmoForCausalLM" if version == 1 else "Olmo2ForCausalLM"
    c = _common(r, _Defaults(architecture=arch))
    bias = r.get_bool("attention_bias", False)
    if version == 1:
        d = _Decoder(
            **c,
            windows=(None,) * c["n_layers"],
            qkv_bias=bias,
            o_bias=bias,
            norm_kind="layernorm",
            layout="nonparametric",
        )
        # OlmoLayerNorm (modeling_olmo.py) normalises an fp32 upcast: that is what layer_norm saves
        return replace(_decoder_spec(r, d, name), layernorm_fp32=True)
    d = _Decoder(
        **c, windows=(None,) * c["n_layers"], qkv_bias=bias, o_bias=bias, qk_norm="full", layout="post"
    )
    # Olmo2RMSNorm (modeling_olmo2.py): ``(self.weight * hidden_states).to(input_dtype)``: the weight
    # multiplies the fp32 normalised x, which is what it saves
    return replace(_decoder_spec(r, d, name), rmsnorm_normed_fp32=True)
