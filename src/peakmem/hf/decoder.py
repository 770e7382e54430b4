"""The Llama-style decoder builder: embed_tokens, layers of self_attn + mlp (dense or MoE), a final norm,
lm_head; the keys every Llama-style family reads (:func:`_common`) and the per-layer sliding windows.
The families that use it are in :mod:`peakmem.hf.llama` and :mod:`peakmem.hf.deepseek`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from peakmem.hf.reader import _MISSING, _Reader
from peakmem.hf.tensors import _Dropout, _embedding, _fused_experts, _gated_mlp, _head, _rope_buffers, _spec
from peakmem.model import Attention, Layer, Mlp, ModelSpec, NormKind, QkNorm, Tensor, linear, norm

NormLayout = Literal["pre", "sandwich", "post", "nonparametric"]


@dataclass(frozen=True, kw_only=True)
class _Moe:
    """Which layers are sparse and what a sparse layer holds."""

    sparse: tuple[bool, ...]  # per layer
    experts: int
    top_k: int
    width: int  # per expert
    shared_width: int = 0
    shared_path: str = "mlp.shared_experts"
    shared_gate: bool = False  # Qwen2-MoE: shared_expert_gate, a (1, H) Linear
    router_buffer: bool = False  # DeepSeek-V3: gate.e_score_correction_bias is an nn.Buffer
    router_fp32: bool = False  # DeepSeek-V2/V3 routers: an fp32 Linear over upcast input and weight
    norm_topk: bool = False  # top-k weights renormalised in place (Mixtral always; norm_topk_prob)
    group_mask: bool = False  # DeepSeek-V2 topk_method group_limited_greedy masks the scores
    weights_fp32: bool = True  # Qwen-MoE routers cast the top-k weights back to the logits' dtype
    shared_after_routed: bool = False  # DeepSeek: hidden_states + self.shared_experts(residuals), last


@dataclass(frozen=True, kw_only=True)
class _Decoder:
    """A Llama-style decoder: embed_tokens, layers of self_attn + mlp, a final norm, lm_head."""

    architecture: str
    vocab: int
    hidden: int
    n_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    activation: str
    tied: bool
    max_pos: int
    windows: tuple[int | None, ...]  # sliding window per layer
    rotary_dim: int
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: QkNorm = "none"
    norm_kind: NormKind = "rmsnorm"
    norm_bias: bool = False  # a LayerNorm with a bias (StarCoder2)
    layout: NormLayout = "pre"
    fused: bool = False  # Phi-3: qkv_proj and gate_up_proj
    gated: bool = True  # False: StarCoder2's c_fc / c_proj
    moe: _Moe | None = None
    rope_names: tuple[str, ...] = ("",)  # Gemma 3: one rotary table per layer type
    embed_scale: bool = False  # Gemma: embed_tokens.embed_scale, a 0-d buffer
    dropout: _Dropout = field(default_factory=_Dropout)


def _attention_tensors(d: _Decoder) -> tuple[Tensor, ...]:
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    if d.fused:
        proj: tuple[Tensor, ...] = (
            *linear("self_attn.o_proj", q, d.hidden, d.o_bias, "attention"),
            *linear("self_attn.qkv_proj", d.hidden, q + 2 * kv, d.qkv_bias, "attention"),
        )
    else:
        proj = (
            *linear("self_attn.q_proj", d.hidden, q, d.qkv_bias, "attention"),
            *linear("self_attn.k_proj", d.hidden, kv, d.qkv_bias, "attention"),
            *linear("self_attn.v_proj", d.hidden, kv, d.qkv_bias, "attention"),
            *linear("self_attn.o_proj", q, d.hidden, d.o_bias, "attention"),
        )
    if d.qk_norm == "per_head":  # Qwen3, Gemma 3: RMSNorm(head_dim) shared by all heads
        return (
            *proj,
            *norm("self_attn.q_norm", d.head_dim, False),
            *norm("self_attn.k_norm", d.head_dim, False),
        )
    if d.qk_norm == "full":  # OLMo 2: RMSNorm over all heads at once
        return (*proj, *norm("self_attn.q_norm", q, False), *norm("self_attn.k_norm", kv, False))
    return proj


def _dense_mlp_tensors(d: _Decoder, width: int) -> tuple[Tensor, ...]:
    if d.fused:
        return (
            *linear("mlp.gate_up_proj", d.hidden, 2 * width, d.mlp_bias, "mlp"),
            *linear("mlp.down_proj", width, d.hidden, d.mlp_bias, "mlp"),
        )
    if not d.gated:
        return (
            *linear("mlp.c_fc", d.hidden, width, d.mlp_bias, "mlp"),
            *linear("mlp.c_proj", width, d.hidden, d.mlp_bias, "mlp"),
        )
    return _gated_mlp("mlp", d.hidden, width, d.mlp_bias, "mlp")


def _moe_tensors(d: _Decoder, m: _Moe) -> tuple[Tensor, ...]:
    out = (
        *linear("mlp.gate", d.hidden, m.experts, False, "router"),
        *_fused_experts("mlp.experts", m.experts, d.hidden, m.width),
    )
    if m.shared_width:
        out += _gated_mlp(m.shared_path, d.hidden, m.shared_width, d.mlp_bias, "shared_experts")
    if m.shared_gate:
        out += linear("mlp.shared_expert_gate", d.hidden, 1, False, "shared_experts")
    return out


def _norm_tensors(d: _Decoder) -> tuple[Tensor, ...]:
    names = {
        "pre": ("input_layernorm", "post_attention_layernorm"),
        "sandwich": (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        "post": ("post_attention_layernorm", "post_feedforward_layernorm"),
        "nonparametric": (),  # OLMo: LayerNorm without weight or bias
    }[d.layout]
    return tuple(t for n in names for t in norm(n, d.hidden, d.norm_bias))


def _decoder_layer(d: _Decoder, i: int, attention: Attention, attn_tensors: tuple[Tensor, ...]) -> Layer:
    m = d.moe
    if m is not None and m.sparse[i]:
        mlp = Mlp(
            intermediate_size=m.width,
            gated=True,
            activation=d.activation,
            num_experts=m.experts,
            experts_per_token=m.top_k,
            shared_intermediate_size=m.shared_width,
            router_fp32=m.router_fp32,
            router_norm_topk=m.norm_topk,
            router_group_mask=m.group_mask,
            routing_weights_fp32=m.weights_fp32,
            shared_gate=m.shared_gate,
            shared_after_routed=m.shared_after_routed,
        )
        mlp_tensors = _moe_tensors(d, m)
    else:
        mlp = Mlp(
            intermediate_size=d.intermediate, gated=d.gated, activation=d.activation, fused_gate_up=d.fused
        )
        mlp_tensors = _dense_mlp_tensors(d, d.intermediate)
    return Layer(attention=attention, mlp=mlp, tensors=(*attn_tensors, *mlp_tensors, *_norm_tensors(d)))


def _decoder_spec(
    r: _Reader,
    d: _Decoder,
    name: str | None,
    attention_for: Callable[[int], Attention] | None = None,
    attn_tensors: tuple[Tensor, ...] | None = None,
) -> ModelSpec:
    if attention_for is None:
        r.heads(d.heads, d.kv_heads)

        def attention_for(i: int) -> Attention:
            return Attention(
                num_heads=d.heads,
                num_kv_heads=d.kv_heads,
                head_dim=d.head_dim,
                v_head_dim=d.head_dim,
                qk_norm=d.qk_norm,
                sliding_window=d.windows[i],
            )

    tensors = _attention_tensors(d) if attn_tensors is None else attn_tensors
    layers = [_decoder_layer(d, i, attention_for(i), tensors) for i in range(d.n_layers)]
    outer = (
        _embedding("model.embed_tokens", d.vocab, d.hidden),
        *(() if d.layout == "nonparametric" else norm("model.norm", d.hidden, d.norm_bias)),
        *_head(d.vocab, d.hidden, d.tied),
    )
    buffers: list[Tensor] = []
    if d.embed_scale:
        buffers.append(
            Tensor(
                name="model.embed_tokens.embed_scale",
                module="embed_tokens",
                shape=(),
                component="embeddings",
                kind="other",
            )
        )
    buffers += _rope_buffers("model.rotary_emb", d.rotary_dim, d.rope_names)
    if d.moe is not None and d.moe.router_buffer:
        for i, sparse in enumerate(d.moe.sparse):
            if sparse:
                buffers.append(
                    Tensor(
                        name=f"model.layers.{i}.mlp.gate.e_score_correction_bias",
                        module="gate",
                        shape=(d.moe.experts,),
                        component="router",
                        kind="other",
                    )
                )
    return _spec(
        r,
        name=name,
        architecture=d.architecture,
        vocab=d.vocab,
        hidden=d.hidden,
        max_pos=d.max_pos,
        position="rope",
        norm_kind=d.norm_kind,
        layers=layers,
        outer=outer,
        tied=d.tied,
        dropout=d.dropout,
        buffers=buffers,
    )


@dataclass(frozen=True, kw_only=True)
class _Defaults:
    """A family's config-class defaults for the keys a Llama-style builder reads."""

    architecture: str
    kv_heads: int | None = None  # None: num_attention_heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    tied: bool = False
    max_pos: int = 2048
    activation: str = "silu"
    vocab: int | None = None  # None: vocab_size is required
    heads: int | None = None  # None: num_attention_heads is required


def _common(r: _Reader, f: _Defaults) -> dict[str, Any]:
    """The keys every Llama-style family reads, with that family's defaults."""
    hidden = r.get_int("hidden_size")
    heads = r.get_int("num_attention_heads", default=_MISSING if f.heads is None else f.heads)
    vocab = r.get_int("vocab_size", default=_MISSING if f.vocab is None else f.vocab)
    if f.kv_heads is None:
        kv = r.get_int("num_key_value_heads", default=heads, note=False)
        if not r.has("num_key_value_heads"):
            r.notes.append(f"num_key_value_heads not set; using num_attention_heads={heads} (no GQA)")
    else:
        kv = r.get_int("num_key_value_heads", default=f.kv_heads)
    if f.head_dim is None:
        head_dim = r.get_int("head_dim") if r.has("head_dim") else r.derived_head_dim(hidden, heads)
    else:
        head_dim = r.get_int("head_dim", default=f.head_dim)
    r.heads(heads, kv)
    return {
        "architecture": f.architecture,
        "vocab": vocab,
        "hidden": hidden,
        "n_layers": r.get_int("num_hidden_layers"),
        "heads": heads,
        "kv_heads": kv,
        "head_dim": head_dim,
        "intermediate": r.get_int("intermediate_size"),
        "activation": r.get_str("hidden_activation", "hidden_act", default=f.activation),
        "tied": r.get_bool("tie_word_embeddings", f.tied),
        "max_pos": r.get_int("max_position_embeddings", default=f.max_pos),
        "rotary_dim": head_dim,
        "dropout": _Dropout(attention=r.get_float("attention_dropout")),
    }


def _windows_all(r: _Reader, n_layers: int, default: int | None) -> tuple[int | None, ...]:
    """Mistral / Mixtral / Phi-3 / StarCoder2: one ``sliding_window`` for every layer (null: none)."""
    return (r.int_or_none("sliding_window", default),) * n_layers


def _sliding_flags(r: _Reader, n_layers: int, fallback: Sequence[bool]) -> tuple[bool, ...]:
    """Which layers slide: ``layer_types`` when the config has it, else the config class's own rule."""
    types = r.str_list("layer_types", n_layers)
    return tuple(t == "sliding_attention" for t in types) if types is not None else tuple(fallback)


def _windows_typed(
    r: _Reader, n_layers: int, window: int | None, fallback: Sequence[bool]
) -> tuple[int | None, ...]:
    """Per-layer windows: ``window`` on the sliding layers, None on the others."""
    return tuple(window if s else None for s in _sliding_flags(r, n_layers, fallback))
