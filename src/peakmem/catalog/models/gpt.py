"""The catalog's GPT-style models: GPT-2, Pythia / GPT-NeoX, OPT, BLOOM, Falcon.

Entries as described in :mod:`peakmem.catalog.models`; plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

from peakmem.catalog.models._source import _src

# --- GPT-2 (openai-community): learned positions, tied head, Conv1D projections -------------------
_GPT2_COMMON: dict[str, Any] = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257,
    "n_positions": 1024, "n_ctx": 1024, "activation_function": "gelu_new", "n_inner": None,
    "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "layer_norm_epsilon": 1e-05,
    "bos_token_id": 50256, "eos_token_id": 50256,
}  # fmt: skip

# --- Pythia / GPT-NeoX (EleutherAI): parallel residual, partial rotary (25%), untied head ---------
_NEOX_COMMON: dict[str, Any] = {
    "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "max_position_embeddings": 2048,
    "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True, "hidden_act": "gelu",
    "layer_norm_eps": 1e-05, "tie_word_embeddings": False, "attention_dropout": 0.0,
    "hidden_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "float16",
}  # fmt: skip

# --- OPT (facebook): learned positions (offset 2), ReLU, pre-LN, tied head -------------------------
_OPT_COMMON: dict[str, Any] = {
    "model_type": "opt", "architectures": ["OPTForCausalLM"], "vocab_size": 50272,
    "max_position_embeddings": 2048, "activation_function": "relu", "do_layer_norm_before": True,
    "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0, "layerdrop": 0.0,
    "enable_bias": True, "layer_norm_elementwise_affine": True, "_remove_final_layer_norm": False,
    "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "torch_dtype": "float16",
}  # fmt: skip

# --- BLOOM (bigscience): ALiBi, embedding LayerNorm, tied head --------------------------------------
_BLOOM_COMMON: dict[str, Any] = {
    "model_type": "bloom", "architectures": ["BloomForCausalLM"], "vocab_size": 250880,
    "layer_norm_epsilon": 1e-05, "apply_residual_connection_post_layernorm": False,
    "attention_dropout": 0.0, "hidden_dropout": 0.0, "slow_but_exact": False,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
}  # fmt: skip


# fmt: off
ENTRIES: tuple[dict[str, Any], ...] = (
    # ---------------------------------------------------------------------------------- GPT-2
    {
        "name": "gpt2", "family": "gpt2", "hub_id": "openai-community/gpt2",
        "aliases": ("gpt2-small", "gpt2-124m"), "source": _src("openai-community/gpt2"),
        "reported_params": 124_439_808,
        "config": {**_GPT2_COMMON, "n_embd": 768, "n_head": 12, "n_layer": 12},
    },
    {
        "name": "gpt2-medium", "family": "gpt2", "hub_id": "openai-community/gpt2-medium",
        "aliases": ("gpt2-355m",), "source": _src("openai-community/gpt2-medium"),
        "reported_params": 354_823_168,
        "config": {**_GPT2_COMMON, "n_embd": 1024, "n_head": 16, "n_layer": 24},
    },
    {
        "name": "gpt2-large", "family": "gpt2", "hub_id": "openai-community/gpt2-large",
        "aliases": ("gpt2-774m",), "source": _src("openai-community/gpt2-large"),
        "reported_params": 774_030_080,
        "config": {**_GPT2_COMMON, "n_embd": 1280, "n_head": 20, "n_layer": 36},
    },
    {
        "name": "gpt2-xl", "family": "gpt2", "hub_id": "openai-community/gpt2-xl",
        "aliases": ("gpt2-1.5b",), "source": _src("openai-community/gpt2-xl"),
        "reported_params": 1_557_611_200,
        "config": {**_GPT2_COMMON, "n_embd": 1600, "n_head": 25, "n_layer": 48},
    },
    # ---------------------------------------------------------------------------- Pythia / NeoX
    {
        "name": "pythia-160m", "family": "pythia", "hub_id": "EleutherAI/pythia-160m",
        "aliases": ("pythia-160m-deduped", "EleutherAI/pythia-160m-deduped"),
        "source": _src("EleutherAI/pythia-160m"), "reported_params": 162_322_944,
        "config": {
            **_NEOX_COMMON, "vocab_size": 50304, "hidden_size": 768, "intermediate_size": 3072,
            "num_attention_heads": 12, "num_hidden_layers": 12,
        },
    },
    {
        "name": "pythia-1.4b", "family": "pythia", "hub_id": "EleutherAI/pythia-1.4b",
        "aliases": ("pythia-1.4b-deduped", "EleutherAI/pythia-1.4b-deduped"),
        "source": _src("EleutherAI/pythia-1.4b"), "reported_params": 1_414_647_808,
        "config": {
            **_NEOX_COMMON, "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 8192,
            "num_attention_heads": 16, "num_hidden_layers": 24,
        },
    },
    {
        "name": "pythia-6.9b", "family": "pythia", "hub_id": "EleutherAI/pythia-6.9b",
        "aliases": ("pythia-6.9b-deduped", "EleutherAI/pythia-6.9b-deduped"),
        "source": _src("EleutherAI/pythia-6.9b"), "reported_params": 6_857_302_016,
        "config": {
            **_NEOX_COMMON, "vocab_size": 50432, "hidden_size": 4096, "intermediate_size": 16384,
            "num_attention_heads": 32, "num_hidden_layers": 32,
        },
    },
    {
        "name": "pythia-12b", "family": "pythia", "hub_id": "EleutherAI/pythia-12b",
        "aliases": ("pythia-12b-deduped", "EleutherAI/pythia-12b-deduped"),
        "source": _src("EleutherAI/pythia-12b"), "reported_params": 11_846_072_320,
        "config": {
            **_NEOX_COMMON, "vocab_size": 50688, "hidden_size": 5120, "intermediate_size": 20480,
            "num_attention_heads": 40, "num_hidden_layers": 36,
        },
    },
    {
        "name": "gpt-neox-20b", "family": "gpt-neox", "hub_id": "EleutherAI/gpt-neox-20b",
        "aliases": ("neox-20b",), "source": _src("EleutherAI/gpt-neox-20b"),
        "reported_params": 20_554_567_680,
        "config": {
            **_NEOX_COMMON, "vocab_size": 50432, "hidden_size": 6144, "intermediate_size": 24576,
            "num_attention_heads": 64, "num_hidden_layers": 44,
        },
    },
    # ------------------------------------------------------------------------------------ OPT
    {
        "name": "opt-125m", "family": "opt", "hub_id": "facebook/opt-125m", "aliases": (),
        "source": _src("facebook/opt-125m"), "reported_params": 125_239_296,
        "config": {
            **_OPT_COMMON, "hidden_size": 768, "word_embed_proj_dim": 768, "ffn_dim": 3072,
            "num_attention_heads": 12, "num_hidden_layers": 12,
        },
    },
    {
        "name": "opt-1.3b", "family": "opt", "hub_id": "facebook/opt-1.3b", "aliases": (),
        "source": _src("facebook/opt-1.3b"), "reported_params": 1_315_758_080,
        "config": {
            **_OPT_COMMON, "hidden_size": 2048, "word_embed_proj_dim": 2048, "ffn_dim": 8192,
            "num_attention_heads": 32, "num_hidden_layers": 24,
        },
    },
    {
        "name": "opt-6.7b", "family": "opt", "hub_id": "facebook/opt-6.7b", "aliases": (),
        "source": _src("facebook/opt-6.7b"), "reported_params": 6_658_473_984,
        "config": {
            **_OPT_COMMON, "hidden_size": 4096, "word_embed_proj_dim": 4096, "ffn_dim": 16384,
            "num_attention_heads": 32, "num_hidden_layers": 32,
        },
    },
    {
        "name": "opt-13b", "family": "opt", "hub_id": "facebook/opt-13b", "aliases": (),
        "source": _src("facebook/opt-13b"), "reported_params": 12_853_473_280,
        "config": {
            **_OPT_COMMON, "hidden_size": 5120, "word_embed_proj_dim": 5120, "ffn_dim": 20480,
            "num_attention_heads": 40, "num_hidden_layers": 40,
        },
    },
    {
        "name": "opt-30b", "family": "opt", "hub_id": "facebook/opt-30b", "aliases": (),
        "source": _src("facebook/opt-30b"),
        "config": {
            **_OPT_COMMON, "hidden_size": 7168, "word_embed_proj_dim": 7168, "ffn_dim": 28672,
            "num_attention_heads": 56, "num_hidden_layers": 48,
        },
    },
    {
        "name": "opt-66b", "family": "opt", "hub_id": "facebook/opt-66b", "aliases": (),
        "source": _src("facebook/opt-66b"),
        "config": {
            **_OPT_COMMON, "hidden_size": 9216, "word_embed_proj_dim": 9216, "ffn_dim": 36864,
            "num_attention_heads": 72, "num_hidden_layers": 64,
        },
    },
    # ---------------------------------------------------------------------------------- BLOOM
    {
        "name": "bloom-560m", "family": "bloom", "hub_id": "bigscience/bloom-560m", "aliases": (),
        "source": _src("bigscience/bloom-560m"), "reported_params": 559_214_592,
        "config": {**_BLOOM_COMMON, "hidden_size": 1024, "n_head": 16, "n_layer": 24},
    },
    {
        "name": "bloom-7b1", "family": "bloom", "hub_id": "bigscience/bloom-7b1", "aliases": ("bloom-7b",),
        "source": _src("bigscience/bloom-7b1"), "reported_params": 7_069_016_064,
        "config": {**_BLOOM_COMMON, "hidden_size": 4096, "n_head": 32, "n_layer": 30},
    },
    {
        "name": "bloom-176b", "family": "bloom", "hub_id": "bigscience/bloom", "aliases": ("bloom",),
        "source": _src("bigscience/bloom"), "reported_params": 176_247_271_424,
        "note": "the Hub file spells the width 'n_embed' (read by BloomConfig as hidden_size)",
        "config": {**_BLOOM_COMMON, "n_embed": 14336, "n_head": 112, "n_layer": 70},
    },
    # --------------------------------------------------------------------------------- Falcon
    {
        "name": "falcon-7b", "family": "falcon", "hub_id": "tiiuae/falcon-7b",
        "aliases": ("tiiuae/falcon-7b-instruct", "falcon-7b-instruct"), "source": _src("tiiuae/falcon-7b"),
        "reported_params": 6_921_720_704,
        "config": {
            "model_type": "falcon", "architectures": ["FalconForCausalLM"], "vocab_size": 65024,
            "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32, "multi_query": True,
            "new_decoder_architecture": False, "parallel_attn": True, "bias": False, "alibi": False,
            "layer_norm_epsilon": 1e-05, "hidden_dropout": 0.0, "attention_dropout": 0.0,
            "max_position_embeddings": 2048, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
            "bos_token_id": 11, "eos_token_id": 11,
        },
    },
    {
        "name": "falcon-40b", "family": "falcon", "hub_id": "tiiuae/falcon-40b",
        "aliases": ("tiiuae/falcon-40b-instruct", "falcon-40b-instruct"), "source": _src("tiiuae/falcon-40b"),
                "config": {
            "model_type": "falcon", "architectures": ["FalconForCausalLM"], "vocab_size": 65024,
            "hidden_size": 8192, "num_attention_heads": 128, "num_kv_heads": 8, "num_hidden_layers": 60,
            "new_decoder_architecture": True, "parallel_attn": True, "bias": False, "alibi": False,
            "layer_norm_epsilon": 1e-05, "hidden_dropout": 0.0, "attention_dropout": 0.0,
            "max_position_embeddings": 2048, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
            "bos_token_id": 11, "eos_token_id": 11,
        },
    },
    {
        "name": "falcon-180b", "family": "falcon", "hub_id": "tiiuae/falcon-180B",
        "aliases": ("tiiuae/falcon-180B-chat", "falcon-180b-chat"), "source": _src("tiiuae/falcon-180B"),
        "config": {
            "model_type": "falcon", "architectures": ["FalconForCausalLM"], "vocab_size": 65024,
            "hidden_size": 14848, "num_attention_heads": 232, "num_kv_heads": 8, "num_hidden_layers": 80,
            "new_decoder_architecture": True, "parallel_attn": True, "bias": False, "alibi": False,
            "tie_word_embeddings": False,
            "layer_norm_epsilon": 1e-05, "hidden_dropout": 0.0, "attention_dropout": 0.0,
            "max_position_embeddings": 2048, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
            "bos_token_id": 11, "eos_token_id": 11,
        },
        "reported_params": 179_522_565_120,
        "note": "gated repo; shapes confirmed from TensorRT-LLM's Falcon-180B checkpoint config. "
        "tie_word_embeddings=false is inferred, not read: the Hub API's safetensors total "
        "(179,522,565,120) holds a separate lm_head; tied, transformers would build 178,557,088,768",
    },
)
# fmt: on
