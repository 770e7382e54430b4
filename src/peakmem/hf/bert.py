"""Encoders: BERT (BertForSequenceClassification)."""

from __future__ import annotations

from dataclasses import replace

from peakmem.hf.reader import _Reader
from peakmem.hf.tensors import _Dropout, _embedding, _spec
from peakmem.model import Attention, Layer, Mlp, ModelSpec, Tensor, linear, norm


def _bert(r: _Reader, name: str | None) -> ModelSpec:
    """transformers/models/bert/modeling_bert.py: BertForSequenceClassification (pooler + classifier)."""
    vocab = r.get_int("vocab_size")
    hidden = r.get_int("hidden_size")
    n = r.get_int("num_hidden_layers")
    heads = r.get_int("num_attention_heads")
    inner = r.get_int("intermediate_size")
    head_dim = r.derived_head_dim(hidden, heads)
    max_pos = r.get_int("max_position_embeddings", default=512)
    types = r.get_int("type_vocab_size", default=2)
    labels = _num_labels(r)
    if r.get_bool("is_decoder", False) or r.get_bool("add_cross_attention", False):
        raise r.fail("is_decoder/add_cross_attention=true: BERT as a decoder is not supported")
    archs = r.raw.get("architectures")
    if isinstance(archs, list) and archs and "BertForSequenceClassification" not in archs:
        r.notes.append(
            f"architectures={archs}: counting BertForSequenceClassification with {labels} labels "
            "(a fine-tuning head on the encoder) instead"
        )
    tensors = (
        *linear("attention.self.query", hidden, hidden, True, "attention"),
        *linear("attention.self.key", hidden, hidden, True, "attention"),
        *linear("attention.self.value", hidden, hidden, True, "attention"),
        *linear("attention.output.dense", hidden, hidden, True, "attention"),
        *norm("attention.output.LayerNorm", hidden, True),
        *linear("intermediate.dense", hidden, inner, True, "mlp"),
        *linear("output.dense", inner, hidden, True, "mlp"),
        *norm("output.LayerNorm", hidden, True),
    )
    layer = Layer(
        attention=Attention(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, v_head_dim=head_dim),
        mlp=Mlp(intermediate_size=inner, gated=False, activation=r.get_str("hidden_act", default="gelu")),
        tensors=tensors,
    )
    outer = (
        _embedding("bert.embeddings.word_embeddings", vocab, hidden),
        _embedding("bert.embeddings.position_embeddings", max_pos, hidden, "positions"),
        _embedding("bert.embeddings.token_type_embeddings", types, hidden),
        *norm("bert.embeddings.LayerNorm", hidden, True),
        *linear("bert.pooler.dense", hidden, hidden, True, "pooler"),
        *linear("classifier", hidden, labels, True, "classifier"),
    )
    buffers = tuple(
        Tensor(
            name=f"bert.embeddings.{b}",
            module="embeddings",
            shape=(1, max_pos),
            component="positions",
            kind="other",
        )
        for b in ("position_ids", "token_type_ids")
    )
    drop = r.get_float("hidden_dropout_prob", default=0.1)
    spec = _spec(
        r,
        name=name,
        architecture="BertForSequenceClassification",
        vocab=vocab,
        hidden=hidden,
        max_pos=max_pos,
        position="learned",
        norm_kind="layernorm",
        layers=[layer] * n,
        outer=outer,
        tied=False,
        dropout=_Dropout(r.get_float("attention_probs_dropout_prob", default=0.1), drop, drop),
        buffers=buffers,
        task="sequence-classification",
        num_labels=labels,
    )
    # modeling_bert.py: a post-norm encoder (BertLayer: attention reads the block input, LayerNorm after
    # each residual sum; no norm before the head; BertEmbeddings.LayerNorm over the summed embeddings);
    # eager_attention_forward runs softmax in the scores' dtype and drops out the probabilities before
    # the matmul with v casts them. (RoBERTa, not yet a family here, is the same.)
    return replace(
        spec, attn_softmax_fp32=False, attn_dropout_before_cast=True, post_norm=True, final_norm=False,
        embedding_norm=True,
    )  # fmt: skip


def _num_labels(r: _Reader) -> int:
    """PretrainedConfig: ``num_labels`` (default 2), or the length of ``id2label`` when given."""
    id2label = r.raw.get("id2label")
    if isinstance(id2label, dict) and id2label and not r.has("num_labels"):
        return len(id2label)
    return r.get_int("num_labels", default=2, note=False)
