"""The catalog's Phi-3, StarCoder2, OLMo and OLMo 2 models.

Entries as described in :mod:`peakmem.catalog.models`; plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

from peakmem.catalog.models._source import _src

# --- StarCoder2 -------------------------------------------------------------------------------------
_STARCODER2_COMMON: dict[str, Any] = {
    "model_type": "starcoder2", "architectures": ["Starcoder2ForCausalLM"], "vocab_size": 49152,
    "max_position_embeddings": 16384, "sliding_window": 4096, "hidden_act": "gelu_pytorch_tanh",
    "norm_epsilon": 1e-05, "use_bias": True, "attention_dropout": 0.1, "residual_dropout": 0.1,
    "embedding_dropout": 0.1, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip


# fmt: off
ENTRIES: tuple[dict[str, Any], ...] = (
    # ------------------------------------------------------------------------------------ Phi-3
    {
        "name": "phi-3-mini", "family": "phi3", "hub_id": "microsoft/Phi-3-mini-4k-instruct",
        "aliases": ("phi-3-mini-4k", "phi3-mini", "phi-3-mini-4k-instruct"),
        "source": _src("microsoft/Phi-3-mini-4k-instruct"), "reported_params": 3_821_079_552,
        "config": {
            "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 32064,
            "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096, "sliding_window": 2047, "hidden_act": "silu",
            "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
            "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000,
        },
    },
    {
        "name": "phi-3-medium", "family": "phi3", "hub_id": "microsoft/Phi-3-medium-4k-instruct",
        "aliases": ("phi-3-medium-4k", "phi3-medium", "phi-3-medium-4k-instruct"),
        "source": _src("microsoft/Phi-3-medium-4k-instruct"), "reported_params": 13_960_238_080,
        "config": {
            "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 32064,
            "hidden_size": 5120, "intermediate_size": 17920, "num_attention_heads": 40,
            "num_key_value_heads": 10, "num_hidden_layers": 40, "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096, "sliding_window": 2047, "hidden_act": "silu",
            "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
            "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000,
        },
    },
    {
        "name": "phi-4", "family": "phi3", "hub_id": "microsoft/phi-4", "aliases": ("phi4",),
        "source": _src("microsoft/phi-4"),
        "note": "read from the Hub file as stored at huggingface.co/microsoft/phi-4/blob/refs%2Fpr%2F10/"
        "config.json (the same keys as copies in fine-tunes, e.g. gaianet/phi-4-GGUF); the card says "
        "14B parameters (no exact count stated)",
        "config": {
            "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 100352,
            "hidden_size": 5120, "intermediate_size": 17920, "num_attention_heads": 40,
            "num_key_value_heads": 10, "num_hidden_layers": 40, "max_position_embeddings": 16384,
            "original_max_position_embeddings": 16384, "sliding_window": None, "hidden_act": "silu",
            "rms_norm_eps": 1e-05, "rope_theta": 250000, "rope_scaling": None, "attention_bias": False,
            "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "bos_token_id": 100257, "eos_token_id": 100257,
            "pad_token_id": 100257,
        },
    },
    {
        "name": "phi-4-mini", "family": "phi3", "hub_id": "microsoft/Phi-4-mini-instruct",
        "aliases": ("phi-4-mini-instruct", "phi4-mini"),
        "source": _src("microsoft/Phi-4-mini-instruct"),
        "note": "keys read from copies that name it as _name_or_path "
        "(huggingface.co/onnx-community/Phi-4-mini-instruct-ONNX-MHA and unsloth/Phi-4-mini-instruct "
        "config.json); the 48 longrope factors and the keys after them (sliding_window, tied "
        "embeddings, vocab) from an mlx-community conversion vendored in a public test fixture, the "
        "first factors agreeing with the ONNX copy; the card says 3.8B parameters",
        "config": {
            "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 200064,
            "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 24,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
            "sliding_window": 262144, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "rope_scaling": {
                "type": "longrope",
                "long_factor": [
                    1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
                    2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687,
                    4.279200023, 4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894,
                    8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
                    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03,
                    32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49,
                    33.5, 44.16, 47.77,
                ],
                "short_factor": [1.0] * 48,
            },
            "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "embd_pdrop": 0.0,
            "resid_pdrop": 0.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "bos_token_id": 199999, "eos_token_id": 199999, "pad_token_id": 199999,
        },
    },
    # ------------------------------------------------------------------------------- StarCoder2
    {
        "name": "starcoder2-3b", "family": "starcoder2", "hub_id": "bigcode/starcoder2-3b", "aliases": (),
        "source": _src("bigcode/starcoder2-3b"), "reported_params": 3_030_371_328,
        "config": {
            **_STARCODER2_COMMON, "hidden_size": 3072, "intermediate_size": 12288, "num_attention_heads": 24,
            "num_key_value_heads": 2, "num_hidden_layers": 30, "rope_theta": 999999.4420358813,
            "tie_word_embeddings": True,
        },
    },
    {
        "name": "starcoder2-7b", "family": "starcoder2", "hub_id": "bigcode/starcoder2-7b", "aliases": (),
        "source": _src("bigcode/starcoder2-7b"), "reported_params": 7_173_923_840,
        "note": "the Hub file does not set tie_word_embeddings, so Starcoder2Config's default (tied) "
        "applies; 7.17B on the model page only holds with a tied head",
        "config": {
            **_STARCODER2_COMMON, "hidden_size": 4608, "intermediate_size": 18432, "num_attention_heads": 36,
            "num_key_value_heads": 4, "num_hidden_layers": 32, "rope_theta": 1000000,
            "tie_word_embeddings": True,
        },
    },
    {
        "name": "starcoder2-15b", "family": "starcoder2", "hub_id": "bigcode/starcoder2-15b", "aliases": (),
        "source": _src("bigcode/starcoder2-15b"), "reported_params": 15_957_889_024,
        "config": {
            **_STARCODER2_COMMON, "hidden_size": 6144, "intermediate_size": 24576, "num_attention_heads": 48,
            "num_key_value_heads": 4, "num_hidden_layers": 40, "rope_theta": 100000,
            "tie_word_embeddings": False,
        },
    },
    # ------------------------------------------------------------------------------ OLMo / OLMo 2
    {
        "name": "olmo-1b", "family": "olmo", "hub_id": "allenai/OLMo-1B-hf", "aliases": ("olmo-1b-hf",),
        "source": _src("allenai/OLMo-1B-hf"), "reported_params": 1_176_764_416,
        "config": {
            "model_type": "olmo", "architectures": ["OlmoForCausalLM"], "vocab_size": 50304,
            "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 16,
            "num_key_value_heads": 16, "num_hidden_layers": 16, "max_position_embeddings": 2048,
            "hidden_act": "silu", "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": 0.0,
            "clip_qkv": None, "tie_word_embeddings": True, "torch_dtype": "float32",
            "eos_token_id": 50279, "pad_token_id": 1,
        },
    },
    {
        "name": "olmo-7b", "family": "olmo", "hub_id": "allenai/OLMo-7B-hf", "aliases": ("olmo-7b-hf",),
        "source": _src("allenai/OLMo-7B-hf"), "reported_params": 6_888_095_744,
        "config": {
            "model_type": "olmo", "architectures": ["OlmoForCausalLM"], "vocab_size": 50304,
            "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 2048,
            "hidden_act": "silu", "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": 0.0,
            "clip_qkv": None, "tie_word_embeddings": False, "torch_dtype": "float32",
            "eos_token_id": 50279, "pad_token_id": 1,
        },
    },
    {
        "name": "olmo-2-7b", "family": "olmo2", "hub_id": "allenai/OLMo-2-1124-7B",
        "aliases": ("olmo2-7b", "olmo-2-1124-7b", "allenai/OLMo-2-1124-7B-Instruct"),
        "source": _src("allenai/OLMo-2-1124-7B"), "reported_params": 7_298_617_344,
        "note": "reported_params: the Hub API's safetensors total",
        "config": {
            "model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "vocab_size": 100352,
            "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 4096,
            "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 500000, "attention_bias": False,
            "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "float32",
            "eos_token_id": 100257, "pad_token_id": 100277,
        },
    },
    {
        "name": "olmo-2-13b", "family": "olmo2", "hub_id": "allenai/OLMo-2-1124-13B",
        "aliases": ("olmo2-13b", "olmo-2-1124-13b", "allenai/OLMo-2-1124-13B-Instruct"),
        "source": _src("allenai/OLMo-2-1124-13B"), "reported_params": 13_716_198_400,
        "note": "reported_params: the Hub API's safetensors total",
        "config": {
            "model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "vocab_size": 100352,
            "hidden_size": 5120, "intermediate_size": 13824, "num_attention_heads": 40,
            "num_key_value_heads": 40, "num_hidden_layers": 40, "max_position_embeddings": 4096,
            "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 500000, "attention_bias": False,
            "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "float32",
            "eos_token_id": 100257, "pad_token_id": 100277,
        },
    },
)
# fmt: on
