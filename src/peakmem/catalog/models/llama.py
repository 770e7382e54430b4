"""The catalog's Llama, Mistral and Mixtral models.

Entries as described in :mod:`peakmem.catalog.models`; plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

from peakmem.catalog.models._source import _src

# --- Llama family (meta-llama) -----------------------------------------------------------------------
_LLAMA_COMMON: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "pretraining_tp": 1,
}  # fmt: skip
_LLAMA3_ROPE_8 = {
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3",
}  # fmt: skip
_LLAMA3_ROPE_32 = {**_LLAMA3_ROPE_8, "factor": 32.0}


# fmt: off
ENTRIES: tuple[dict[str, Any], ...] = (
    # ---------------------------------------------------------------------------------- Llama
    {
        "name": "llama-7b", "family": "llama", "hub_id": "huggyllama/llama-7b",
        "aliases": ("llama-1-7b", "llama1-7b"), "source": _src("huggyllama/llama-7b"),
        "reported_params": 6_738_415_616,
        "note": "LLaMA 1 weights were never on the Hub from Meta; huggyllama/llama-7b is the common "
        "conversion",
        "config": {
            **_LLAMA_COMMON, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
            "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
        },
    },
    {
        "name": "llama-2-7b", "family": "llama", "hub_id": "meta-llama/Llama-2-7b-hf",
        "aliases": ("llama2-7b", "meta-llama/Llama-2-7b-chat-hf", "llama-2-7b-chat"),
        "source": _src("meta-llama/Llama-2-7b-hf"), "reported_params": 6_738_415_616,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
        },
    },
    {
        "name": "llama-2-13b", "family": "llama", "hub_id": "meta-llama/Llama-2-13b-hf",
        "aliases": ("llama2-13b", "meta-llama/Llama-2-13b-chat-hf", "llama-2-13b-chat"),
        "source": _src("meta-llama/Llama-2-13b-hf"), "reported_params": 13_015_864_320,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 32000, "hidden_size": 5120, "intermediate_size": 13824,
            "num_attention_heads": 40, "num_key_value_heads": 40, "num_hidden_layers": 40,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
        },
    },
    {
        "name": "llama-2-70b", "family": "llama", "hub_id": "meta-llama/Llama-2-70b-hf",
        "aliases": ("llama2-70b", "meta-llama/Llama-2-70b-chat-hf", "llama-2-70b-chat"),
        "source": _src("meta-llama/Llama-2-70b-hf"), "reported_params": 68_976_648_192,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 32000, "hidden_size": 8192, "intermediate_size": 28672,
            "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
        },
    },
    {
        "name": "llama-3-8b", "family": "llama", "hub_id": "meta-llama/Meta-Llama-3-8B",
        "aliases": ("llama3-8b", "meta-llama/Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct",
                    "llama-3-8b-instruct"),
        "source": _src("meta-llama/Meta-Llama-3-8B"), "reported_params": 8_030_261_248,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
        },
    },
    {
        "name": "llama-3-70b", "family": "llama", "hub_id": "meta-llama/Meta-Llama-3-70B",
        "aliases": ("llama3-70b", "meta-llama/Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct",
                    "llama-3-70b-instruct"),
        "source": _src("meta-llama/Meta-Llama-3-70B"), "reported_params": 70_553_706_496,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
            "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
        },
    },
    {
        "name": "llama-3.1-8b", "family": "llama", "hub_id": "meta-llama/Llama-3.1-8B",
        "aliases": ("llama3.1-8b", "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                    "meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct"),
        "source": _src("meta-llama/Llama-3.1-8B"), "reported_params": 8_030_261_248,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": _LLAMA3_ROPE_8, "head_dim": 128,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
        },
    },
    {
        "name": "llama-3.1-70b", "family": "llama", "hub_id": "meta-llama/Llama-3.1-70B",
        "aliases": ("llama3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
                    "meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b-instruct",
                    "meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b", "llama-3.3-70b-instruct"),
        "source": _src("meta-llama/Llama-3.1-70B"), "reported_params": 70_553_706_496,
        "note": "Llama-3.3-70B-Instruct has the same architecture and is listed as an alias",
        "config": {
            **_LLAMA_COMMON, "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
            "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": _LLAMA3_ROPE_8, "head_dim": 128,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
        },
    },
    {
        "name": "llama-3.1-405b", "family": "llama", "hub_id": "meta-llama/Llama-3.1-405B",
        "aliases": ("llama3.1-405b", "meta-llama/Meta-Llama-3.1-405B", "meta-llama/Llama-3.1-405B-Instruct",
                    "meta-llama/Meta-Llama-3.1-405B-Instruct", "llama-3.1-405b-instruct"),
        "source": _src("meta-llama/Llama-3.1-405B"), "reported_params": 405_853_388_800,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 128256, "hidden_size": 16384, "intermediate_size": 53248,
            "num_attention_heads": 128, "num_key_value_heads": 8, "num_hidden_layers": 126,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": _LLAMA3_ROPE_8, "head_dim": 128,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
        },
    },
    {
        "name": "llama-3.2-1b", "family": "llama", "hub_id": "meta-llama/Llama-3.2-1B",
        "aliases": ("llama3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b-instruct"),
        "source": _src("meta-llama/Llama-3.2-1B"), "reported_params": 1_235_814_400,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 16, "head_dim": 64,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": _LLAMA3_ROPE_32, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
        },
    },
    {
        "name": "llama-3.2-3b", "family": "llama", "hub_id": "meta-llama/Llama-3.2-3B",
        "aliases": ("llama3.2-3b", "meta-llama/Llama-3.2-3B-Instruct", "llama-3.2-3b-instruct"),
        "source": _src("meta-llama/Llama-3.2-3B"), "reported_params": 3_212_749_824,
        "config": {
            **_LLAMA_COMMON, "vocab_size": 128256, "hidden_size": 3072, "intermediate_size": 8192,
            "num_attention_heads": 24, "num_key_value_heads": 8, "num_hidden_layers": 28, "head_dim": 128,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": _LLAMA3_ROPE_32, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
        },
    },
    # ------------------------------------------------------------------------- Mistral / Mixtral
    {
        "name": "mistral-7b-v0.1", "family": "mistral", "hub_id": "mistralai/Mistral-7B-v0.1",
        "aliases": ("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b-instruct-v0.1"),
        "source": _src("mistralai/Mistral-7B-v0.1"), "reported_params": 7_241_732_096,
        "note": "bare 'mistral-7b' means v0.1 (the sliding-window release)",
        "config": {
            "model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 32000,
            "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 32768,
            "sliding_window": 4096, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
        },
    },
    {
        "name": "mistral-7b-v0.3", "family": "mistral", "hub_id": "mistralai/Mistral-7B-v0.3",
        "aliases": ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-instruct-v0.3"),
        "source": _src("mistralai/Mistral-7B-v0.3"), "reported_params": 7_248_023_552,
        "config": {
            "model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 32768,
            "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 32768,
            "sliding_window": None, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
        },
    },
    {
        "name": "mistral-small-24b-2501", "family": "mistral",
        "hub_id": "mistralai/Mistral-Small-24B-Instruct-2501",
        "aliases": ("mistral-small-24b", "mistral-small-3", "mistral-small-24b-instruct-2501",
                    "mistralai/Mistral-Small-24B-Base-2501"),
        "source": _src("mistralai/Mistral-Small-24B-Instruct-2501"),
        "note": "the Hub repository is gated; keys read from configs that name it as _name_or_path "
        "(huggingface.co/ReadyArt/Reformed-Christian-Bible-Expert-v1.1-24B, a full fine-tune) and agree "
        "with stored copies of Mistral-Small-24B-Base-2501 (jhu-clsp/rank1-mistral-2501-24b); the card "
        "says 24B parameters (no exact count stated)",
        "config": {
            "model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 131072,
            "hidden_size": 5120, "intermediate_size": 32768, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 40,
            "max_position_embeddings": 32768, "sliding_window": None, "hidden_act": "silu",
            "rms_norm_eps": 1e-05, "rope_theta": 100000000.0, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
        },
    },
    {
        "name": "mixtral-8x7b", "family": "mixtral", "hub_id": "mistralai/Mixtral-8x7B-v0.1",
        "aliases": ("mixtral-8x7b-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-instruct"),
        "source": _src("mistralai/Mixtral-8x7B-v0.1"), "reported_params": 46_702_792_704,
        "config": {
            "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 32000,
            "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 32768,
            "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
            "sliding_window": None, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
            "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2,
        },
    },
    {
        "name": "mixtral-8x22b", "family": "mixtral", "hub_id": "mistralai/Mixtral-8x22B-v0.1",
        "aliases": ("mixtral-8x22b-v0.1",),
        "source": _src("mistralai/Mixtral-8x22B-v0.1"), "reported_params": 140_620_634_112,
        "note": "v0.1 base has a 32000 vocabulary; Mixtral-8x22B-Instruct-v0.1 has 32768 (not aliased)",
        "config": {
            "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 32000,
            "hidden_size": 6144, "intermediate_size": 16384, "num_attention_heads": 48,
            "num_key_value_heads": 8, "num_hidden_layers": 56, "max_position_embeddings": 65536,
            "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001,
            "sliding_window": None, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
            "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2,
        },
    },
)
# fmt: on
