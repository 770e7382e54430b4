"""GPT-style families: GPT-2, GPT-NeoX / Pythia, OPT, BLOOM and Falcon (learned positions, ALiBi or
rotary; fused or Conv1D projections, ungated MLPs)."""

from __future__ import annotations

from dataclasses import replace

from peakmem.hf.reader import _partial_rotary, _Reader
from peakmem.hf.tensors import _conv1d, _Dropout, _embedding, _head, _rope_buffers, _spec
from peakmem.model import Attention, Layer, Mlp, ModelSpec, SdpaKv, Tensor, linear, norm

# OPT's learned positions have 2 extra rows: OPTLearnedPositionalEmbedding "offset = 2"
# (transformers/models/opt/modeling_opt.py).
OPT_POSITION_OFFSET = 2
# BLOOM uses ALiBi and has no position limit in its config; 2048 is the sequence length it was
# trained with (BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model", 2022).
BLOOM_TRAINING_SEQ_LEN = 2048
# GPT-2's MLP is 4x wide when n_inner is None (transformers/models/gpt2/modeling_gpt2.py, GPT2Block:
# "inner_dim = config.n_inner if config.n_inner is not None else 4 * hidden_size"); BLOOM and Falcon
# use the same factor (BloomMLP dense_h_to_4h; FalconConfig.ffn_hidden_size default).
MLP_EXPANSION = 4


# --- GPT-2 -------------------------------------------------------------------------------------------
GPT2_CONV1D_MODULES = ("c_attn", "c_proj", "c_fc")  # modeling_gpt2.py GPT2Attention / GPT2MLP: Conv1D


def _gpt2(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/gpt2/modeling_gpt2.py: GPT2LMHeadModel (Conv1D projections, learned positions)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("n_embd", "hidden_size")
    n_layers = r.get_int("n_layer", "num_hidden_layers")
    heads = r.get_int("n_head", "num_attention_heads")
    head_dim = r.derived_head_dim(hidden, heads)
    max_pos = r.get_int("n_positions", "max_position_embeddings", default=1024)
    inner = r.get_int("n_inner", default=MLP_EXPANSION * hidden, note=False)
    tied = r.get_bool("tie_word_embeddings", True)
    if r.get_bool("add_cross_attention", False):
        raise r.fail("add_cross_attention=True: GPT-2 cross-attention is not supported")
    tensors = (
        *norm("ln_1", hidden, True),
        *_conv1d("attn.c_attn", hidden, 3 * hidden, "attention"),
        *_conv1d("attn.c_proj", hidden, hidden, "attention"),
        *norm("ln_2", hidden, True),
        *_conv1d("mlp.c_fc", hidden, inner, "mlp"),
        *_conv1d("mlp.c_proj", inner, hidden, "mlp"),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(
            intermediate_size=inner,
            gated=False,
            activation=r.get_str("activation_function", default="gelu_new"),
        ),
        tensors=tensors,
    )
    outer = (
        _embedding("transformer.wte", vocab, hidden),
        _embedding("transformer.wpe", max_pos, hidden, "positions"),
        *norm("transformer.ln_f", hidden, True),
        *_head(vocab, hidden, tied),
    )
    dropout = _Dropout(
        r.get_float("attn_pdrop", default=0.1),
        r.get_float("resid_pdrop", default=0.1),
        r.get_float("embd_pdrop", default=0.1),
    )
    spec = _spec(
        r,
        name=name,
        architecture="GPT2LMHeadModel",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="learned",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=dropout,
    )
    # eager_attention_forward: ``nn.functional.softmax(attn_weights, dim=-1)`` in the scores' dtype (so
    # do GPT-Neo, GPT-J and DistilBERT, not yet families here); c_attn, c_proj, c_fc are
    # transformers/pytorch_utils.py ``Conv1D`` (weight stored in x out).
    return replace(spec, attn_softmax_fp32=False, conv1d_modules=GPT2_CONV1D_MODULES)


def _gpt_neox(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/gpt_neox/modeling_gpt_neox.py: GPTNeoXForCausalLM."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    heads = r.get_int("num_attention_heads")
    inner = r.get_int("intermediate_size")
    head_dim = r.derived_head_dim(hidden, heads)
    max_pos = r.get_int("max_position_embeddings", default=2048)
    tied = r.get_bool("tie_word_embeddings", False)
    bias = r.get_bool("attention_bias", True)
    parallel = r.get_bool("use_parallel_residual", True)
    rotary = int(head_dim * _partial_rotary(r, 0.25, "rotary_pct"))  # GPTNeoXConfig: rotary_pct=0.25
    tensors = (
        *norm("input_layernorm", hidden, True),
        *norm("post_attention_layernorm", hidden, True),
        *linear("attention.query_key_value", hidden, 3 * hidden, bias, "attention"),
        *linear("attention.dense", hidden, hidden, bias, "attention"),
        *linear("mlp.dense_h_to_4h", hidden, inner, True, "mlp"),
        *linear("mlp.dense_4h_to_h", inner, hidden, True, "mlp"),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(intermediate_size=inner, gated=False, activation=r.get_str("hidden_act", default="gelu")),
        tensors=tensors,
        parallel_residual=parallel,
    )
    outer = (
        _embedding("gpt_neox.embed_in", vocab, hidden),
        *norm("gpt_neox.final_layer_norm", hidden, True),
        *_head(vocab, hidden, tied),
    )
    drop = r.get_float("hidden_dropout")
    spec = _spec(
        r,
        name=name,
        architecture="GPTNeoXForCausalLM",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="rope",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=_Dropout(r.get_float("attention_dropout"), drop, drop),
        buffers=_rope_buffers("gpt_neox.rotary_emb", rotary),
    )
    # modeling_gpt_neox.py apply_rotary_pos_emb: ``torch.cat([q_embed, q_pass], dim=-1)``
    return replace(spec, rope_concat=True)


# --- OPT ---------------------------------------------------------------------------------------------
def _opt(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/opt/modeling_opt.py: OPTForCausalLM (position offset 2, optional projections)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size")
    n_layers = r.get_int("num_hidden_layers")
    heads = r.get_int("num_attention_heads")
    ffn = r.get_int("ffn_dim")
    head_dim = r.derived_head_dim(hidden, heads)
    max_pos = r.get_int("max_position_embeddings", default=2048)
    proj = r.get_int("word_embed_proj_dim", default=hidden, note=False)
    tied = r.get_bool("tie_word_embeddings", True)
    bias = r.get_bool("enable_bias", True)
    affine = r.get_bool("layer_norm_elementwise_affine", True)
    pre_norm = r.get_bool("do_layer_norm_before", True)
    final_norm = pre_norm and not r.get_bool("_remove_final_layer_norm", False)

    def ln(path: str) -> tuple[Tensor, ...]:  # nn.LayerNorm(elementwise_affine=...): weight+bias or nothing
        return norm(path, hidden, True) if affine else ()

    tensors = (
        *linear("self_attn.k_proj", hidden, hidden, bias, "attention"),
        *linear("self_attn.v_proj", hidden, hidden, bias, "attention"),
        *linear("self_attn.q_proj", hidden, hidden, bias, "attention"),
        *linear("self_attn.out_proj", hidden, hidden, bias, "attention"),
        *ln("self_attn_layer_norm"),
        *linear("fc1", hidden, ffn, bias, "mlp"),
        *linear("fc2", ffn, hidden, bias, "mlp"),
        *ln("final_layer_norm"),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(
            intermediate_size=ffn, gated=False, activation=r.get_str("activation_function", default="relu")
        ),
        tensors=tensors,
    )
    outer: list[Tensor] = [
        _embedding("model.decoder.embed_tokens", vocab, proj),
        _embedding("model.decoder.embed_positions", max_pos + OPT_POSITION_OFFSET, hidden, "positions"),
    ]
    if final_norm:
        outer += ln("model.decoder.final_layer_norm")
    if proj != hidden:
        outer += linear("model.decoder.project_out", hidden, proj, False, "head")
        outer += linear("model.decoder.project_in", proj, hidden, False, "embeddings")
    outer += _head(vocab, proj, tied)
    if not pre_norm:
        r.notes.append("do_layer_norm_before=false: post-LayerNorm layers (OPT-350m style)")
    drop = r.get_float("dropout", default=0.1)
    return _spec(
        r,
        name=name,
        architecture="OPTForCausalLM",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="learned",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=_Dropout(r.get_float("attention_dropout"), drop, drop),
    )


# --- BLOOM -------------------------------------------------------------------------------------------
def _bloom(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/bloom/modeling_bloom.py: BloomForCausalLM (ALiBi, embedding LayerNorm)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size", "n_embed")
    n_layers = r.get_int("n_layer", "num_hidden_layers")
    heads = r.get_int("n_head", "num_attention_heads")
    head_dim = r.derived_head_dim(hidden, heads)
    tied = r.get_bool("tie_word_embeddings", True)
    inner = MLP_EXPANSION * hidden
    max_pos = r.get_int("seq_length", "max_position_embeddings", default=BLOOM_TRAINING_SEQ_LEN, note=False)
    if not (r.has("seq_length") or r.has("max_position_embeddings")):
        r.notes.append(
            f"BLOOM uses ALiBi (no position limit); assuming a {BLOOM_TRAINING_SEQ_LEN}-token context"
        )
    tensors = (
        *norm("input_layernorm", hidden, True),
        *linear("self_attention.query_key_value", hidden, 3 * hidden, True, "attention"),
        *linear("self_attention.dense", hidden, hidden, True, "attention"),
        *norm("post_attention_layernorm", hidden, True),
        *linear("mlp.dense_h_to_4h", hidden, inner, True, "mlp"),
        *linear("mlp.dense_4h_to_h", inner, hidden, True, "mlp"),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(intermediate_size=inner, gated=False, activation="bloom_gelu"),
        tensors=tensors,
    )
    outer = (
        _embedding("transformer.word_embeddings", vocab, hidden),
        *norm("transformer.word_embeddings_layernorm", hidden, True),
        *norm("transformer.ln_f", hidden, True),
        *_head(vocab, hidden, tied),
    )
    drop = r.get_float("hidden_dropout")
    return _spec(
        r,
        name=name,
        architecture="BloomForCausalLM",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="alibi",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=_Dropout(r.get_float("attention_dropout"), drop, 0.0),
    )


# --- Falcon ------------------------------------------------------------------------------------------
def _falcon(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/falcon/modeling_falcon.py: FalconForCausalLM (multi-query or grouped fused QKV)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size", "n_embed")
    n_layers = r.get_int("num_hidden_layers")
    heads = r.get_int("num_attention_heads")
    head_dim = r.derived_head_dim(hidden, heads)
    tied = r.get_bool("tie_word_embeddings", True)
    bias = r.get_bool("bias", False)
    new_arch = r.get_bool("new_decoder_architecture", False)
    multi_query = r.get_bool("multi_query", True)
    parallel = r.get_bool("parallel_attn", True)
    alibi = r.get_bool("alibi", False)
    ffn = r.get_int("ffn_hidden_size", default=MLP_EXPANSION * hidden, note=False)
    max_pos = r.get_int("max_position_embeddings", default=2048)
    if new_arch:
        kv = r.get_int("num_kv_heads", default=heads, note=False)
        qkv_out = (2 * kv + heads) * head_dim
    elif multi_query:
        kv = 1
        qkv_out = hidden + 2 * head_dim
    else:
        kv = heads
        qkv_out = 3 * hidden
    r.heads(heads, kv, "num_kv_heads")
    num_ln = r.get_int("num_ln_in_parallel_attn", default=2 if new_arch else 1, note=False)
    if not parallel:
        norms = (*norm("post_attention_layernorm", hidden, True), *norm("input_layernorm", hidden, True))
    elif num_ln == 2:
        norms = (*norm("ln_attn", hidden, True), *norm("ln_mlp", hidden, True))
    else:
        norms = norm("input_layernorm", hidden, True)
    tensors = (
        *linear("self_attention.query_key_value", hidden, qkv_out, bias, "attention"),
        *linear("self_attention.dense", hidden, hidden, bias, "attention"),
        *linear("mlp.dense_h_to_4h", hidden, ffn, bias, "mlp"),
        *linear("mlp.dense_4h_to_h", ffn, hidden, bias, "mlp"),
        *norms,
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=kv, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(intermediate_size=ffn, gated=False, activation=r.get_str("activation", default="gelu")),
        tensors=tensors,
        parallel_residual=parallel,
    )
    outer = (
        _embedding("transformer.word_embeddings", vocab, hidden),
        *norm("transformer.ln_f", hidden, True),
        *_head(vocab, hidden, tied),
    )
    # FalconModel always builds its rotary module, even with alibi=True.
    spec = _spec(
        r,
        name=name,
        architecture="FalconForCausalLM",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="alibi" if alibi else "rope",
        norm_kind="layernorm",
        layers=[layer] * n_layers,
        outer=outer,
        tied=tied,
        dropout=_Dropout(r.get_float("attention_dropout"), r.get_float("hidden_dropout"), 0.0),
        buffers=_rope_buffers("transformer.rotary_emb", head_dim),
    )
    # FalconAttention eager: ``F.softmax(scores + mask, dim=-1, dtype=hidden_states.dtype)``. Its SDPA call
    # (``FalconAttention.forward``) gets the mask FalconModel materialises (``create_causal_mask(...,
    # allow_is_causal_skip=False)``) and k/v as ``_split_heads`` makes them: copied to every head (new
    # decoder architecture), one head without ``enable_gqa`` (multi-query), or all heads.
    sdpa_kv: SdpaKv = "repeated" if new_arch else "broadcast" if multi_query else "shared"
    return replace(spec, attn_softmax_fp32=False, sdpa_kv=sdpa_kv, sdpa_mask=True)
