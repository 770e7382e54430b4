"""The catalog's Gemma, Gemma 2 and Gemma 3 models.

Entries as described in :mod:`peakmem.catalog.models`; plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

from peakmem.catalog.models._source import _src

# --- Gemma ------------------------------------------------------------------------------------------
_GEMMA_COMMON: dict[str, Any] = {
    "model_type": "gemma", "architectures": ["GemmaForCausalLM"], "vocab_size": 256000,
    "head_dim": 256, "max_position_embeddings": 8192, "hidden_act": "gelu", "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}  # fmt: skip
_GEMMA2_COMMON: dict[str, Any] = {
    "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "vocab_size": 256000,
    "max_position_embeddings": 8192, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "attention_bias": False, "attention_dropout": 0.0, "cache_implementation": "hybrid",
    "torch_dtype": "float32", "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}  # fmt: skip
_GEMMA3_TEXT_COMMON: dict[str, Any] = {
    "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "sliding_window_pattern": 6, "query_pre_attn_scalar": 256, "attention_bias": False,
    "attention_dropout": 0.0, "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "torch_dtype": "bfloat16", "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
}  # fmt: skip


# fmt: off
ENTRIES: tuple[dict[str, Any], ...] = (
    # ------------------------------------------------------------------------------------ Gemma
    {
        "name": "gemma-2b", "family": "gemma", "hub_id": "google/gemma-2b",
        "aliases": ("google/gemma-2b-it", "gemma-2b-it"), "source": _src("google/gemma-2b"),
        "reported_params": 2_506_172_416,
        "config": {
            **_GEMMA_COMMON, "hidden_size": 2048, "intermediate_size": 16384, "num_attention_heads": 8,
            "num_key_value_heads": 1, "num_hidden_layers": 18,
        },
    },
    {
        "name": "gemma-7b", "family": "gemma", "hub_id": "google/gemma-7b",
        "aliases": ("google/gemma-7b-it", "gemma-7b-it"), "source": _src("google/gemma-7b"),
        "reported_params": 8_537_680_896,
        "config": {
            **_GEMMA_COMMON, "hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
            "num_key_value_heads": 16, "num_hidden_layers": 28,
        },
    },
    {
        "name": "gemma-2-2b", "family": "gemma2", "hub_id": "google/gemma-2-2b",
        "aliases": ("gemma2-2b", "google/gemma-2-2b-it", "gemma-2-2b-it"),
        "source": _src("google/gemma-2-2b"),
        "reported_params": 2_614_341_888,
        "config": {
            **_GEMMA2_COMMON, "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 26, "query_pre_attn_scalar": 256,
        },
    },
    {
        "name": "gemma-2-9b", "family": "gemma2", "hub_id": "google/gemma-2-9b",
        "aliases": ("gemma2-9b", "google/gemma-2-9b-it", "gemma-2-9b-it"),
        "source": _src("google/gemma-2-9b"),
        "reported_params": 9_241_705_984,
        "config": {
            **_GEMMA2_COMMON, "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "query_pre_attn_scalar": 256,
        },
    },
    {
        "name": "gemma-2-27b", "family": "gemma2", "hub_id": "google/gemma-2-27b",
        "aliases": ("gemma2-27b", "google/gemma-2-27b-it", "gemma-2-27b-it"),
        "source": _src("google/gemma-2-27b"), "reported_params": 27_227_128_320,
        "config": {
            **_GEMMA2_COMMON, "hidden_size": 4608, "intermediate_size": 36864, "num_attention_heads": 32,
            "num_key_value_heads": 16, "head_dim": 128, "num_hidden_layers": 46, "query_pre_attn_scalar": 144,
        },
    },
    {
        "name": "gemma-3-1b", "family": "gemma3", "hub_id": "google/gemma-3-1b-pt",
        "aliases": ("gemma3-1b", "google/gemma-3-1b-it", "gemma-3-1b-it", "gemma-3-1b-pt"),
        "source": _src("google/gemma-3-1b-pt"), "reported_params": 999_885_952,
        "config": {
            **_GEMMA3_TEXT_COMMON, "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 26,
            "max_position_embeddings": 32768, "sliding_window": 512, "rope_scaling": None,
        },
    },
    {
        "name": "gemma-3-4b", "family": "gemma3", "hub_id": "google/gemma-3-4b-pt",
        "aliases": ("gemma3-4b", "google/gemma-3-4b-it", "gemma-3-4b-it", "gemma-3-4b-pt"),
        "source": _src("google/gemma-3-4b-pt"),
        "note": "the text_config of the multimodal Gemma3ForConditionalGeneration file, as a text-only "
        "gemma3_text config (the vision tower, ~0.4B, is not counted)",
        "config": {
            **_GEMMA3_TEXT_COMMON, "vocab_size": 262208, "hidden_size": 2560, "intermediate_size": 10240,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 34,
            "max_position_embeddings": 131072, "sliding_window": 1024,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
    },
    {
        "name": "gemma-3-12b", "family": "gemma3", "hub_id": "google/gemma-3-12b-pt",
        "aliases": ("gemma3-12b", "google/gemma-3-12b-it", "gemma-3-12b-it", "gemma-3-12b-pt"),
        "source": _src("google/gemma-3-12b-pt"),
        "note": "the text_config of the multimodal Gemma3ForConditionalGeneration file, as a text-only "
        "gemma3_text config (the vision tower, ~0.4B, is not counted)",
        "config": {
            **_GEMMA3_TEXT_COMMON, "vocab_size": 262208, "hidden_size": 3840, "intermediate_size": 15360,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 48,
            "max_position_embeddings": 131072, "sliding_window": 1024,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
    },
    {
        "name": "gemma-3-27b", "family": "gemma3", "hub_id": "google/gemma-3-27b-pt",
        "aliases": ("gemma3-27b", "google/gemma-3-27b-it", "gemma-3-27b-it", "gemma-3-27b-pt"),
        "source": _src("google/gemma-3-27b-pt"),
        "note": "the text_config of the multimodal Gemma3ForConditionalGeneration file, as a text-only "
        "gemma3_text config (the vision tower, ~0.4B, is not counted)",
        "config": {
            **_GEMMA3_TEXT_COMMON, "vocab_size": 262208, "hidden_size": 5376, "intermediate_size": 21504,
            "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "num_hidden_layers": 62,
            "max_position_embeddings": 131072, "sliding_window": 1024, "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
    },
)
# fmt: on
