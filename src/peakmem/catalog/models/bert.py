"""The catalog's BERT encoders.

Entries as described in :mod:`peakmem.catalog.models`; plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

from peakmem.catalog.models._source import _src

# --- BERT -------------------------------------------------------------------------------------------
_BERT_COMMON: dict[str, Any] = {
    "model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "layer_norm_eps": 1e-12, "position_embedding_type": "absolute", "pad_token_id": 0,
}  # fmt: skip


# fmt: off
ENTRIES: tuple[dict[str, Any], ...] = (
    # ------------------------------------------------------------------------------------- BERT
    {
        "name": "bert-base-uncased", "family": "bert", "hub_id": "google-bert/bert-base-uncased",
        "aliases": ("bert-base",), "source": _src("google-bert/bert-base-uncased"),
        "config": {
            **_BERT_COMMON, "architectures": ["BertForMaskedLM"], "hidden_size": 768,
            "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
        },
    },
    {
        "name": "bert-large-uncased", "family": "bert", "hub_id": "google-bert/bert-large-uncased",
        "aliases": ("bert-large",), "source": _src("google-bert/bert-large-uncased"),
        "config": {
            **_BERT_COMMON, "architectures": ["BertForMaskedLM"], "hidden_size": 1024,
            "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
        },
    },
    {
        "name": "bert-large-uncased-cls2", "family": "bert", "hub_id": "google-bert/bert-large-uncased",
        "aliases": ("bert-large-uncased-seqcls", "bert-large-cls2"), "variant_of": "bert-large-uncased",
        "source": _src("google-bert/bert-large-uncased"), "reported_params": 335_143_938,
        "note": "bert-large-uncased loaded with AutoModelForSequenceClassification (2 labels, the "
        "default), as in the Hugging Face 'Model training anatomy' measurements; the Hub file with "
        "the architecture set to BertForSequenceClassification, as save_pretrained writes it",
        "config": {
            **_BERT_COMMON, "architectures": ["BertForSequenceClassification"], "hidden_size": 1024,
            "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
            "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
        },
    },
)
# fmt: on
