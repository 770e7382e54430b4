"""Models as data: the architecture keys of each model's ``config.json`` on the Hugging Face Hub.

Each entry holds the keys :func:`peakmem.hf.spec_from_config` reads (and a few more that describe
the run: dropout, dtype), copied from the Hub file named in ``source``. Keys the Hub file omits are
left out, so transformers' defaults apply exactly as they do when it loads the file. Values were
checked against stored copies of the files (vendored configs and tests in public repositories,
model cards); where a value could not be confirmed that way the entry says so in ``note``.
``reported_params`` is the total parameter count the model card, paper or the Hub API states for
the transformers model (not the checkpoint size). It is an independent check of the shape keys:
tests require :func:`peakmem.hf.spec_from_config` to reproduce it exactly, and a torch-tier test
compares every entry with transformers' own model built on the meta device. Keys that do not
change shapes (dropout, dtype, token ids, rope details) were not all checked one by one; where a
shape-relevant value could not be confirmed, ``note`` says so.

Plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

_HUB = "https://huggingface.co/"


def _src(hub_id: str) -> str:
    """The Hub URL of a repository's config.json."""
    return f"{_HUB}{hub_id}/blob/main/config.json"


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

# --- Qwen2 / Qwen2.5 / Qwen3 -----------------------------------------------------------------------
_QWEN25_COMMON: dict[str, Any] = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu",
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "use_sliding_window": False,
    "attention_dropout": 0.0, "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151643,
}  # fmt: skip
_QWEN3_COMMON: dict[str, Any] = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_act": "silu",
    "vocab_size": 151936, "head_dim": 128, "num_key_value_heads": 8, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": None, "attention_bias": False,
    "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
    "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645,
}  # fmt: skip

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

# --- StarCoder2, OLMo, DeepSeek ---------------------------------------------------------------------
_STARCODER2_COMMON: dict[str, Any] = {
    "model_type": "starcoder2", "architectures": ["Starcoder2ForCausalLM"], "vocab_size": 49152,
    "max_position_embeddings": 16384, "sliding_window": 4096, "hidden_act": "gelu_pytorch_tanh",
    "norm_epsilon": 1e-05, "use_bias": True, "attention_dropout": 0.1, "residual_dropout": 0.1,
    "embedding_dropout": 0.1, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
_DEEPSEEK_MLA: dict[str, Any] = {
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_lora_rank": 512,
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-06, "moe_layer_freq": 1, "torch_dtype": "bfloat16",
}  # fmt: skip
_BERT_COMMON: dict[str, Any] = {
    "model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "layer_norm_eps": 1e-12, "position_embedding_type": "absolute", "pad_token_id": 0,
}  # fmt: skip


# fmt: off
MODEL_ENTRIES: tuple[dict[str, Any], ...] = (
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
    # ---------------------------------------------------------------------------------- Qwen2.5
    {
        "name": "qwen2.5-0.5b", "family": "qwen2.5", "hub_id": "Qwen/Qwen2.5-0.5B",
        "aliases": ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-0.5b-instruct"),
        "source": _src("Qwen/Qwen2.5-0.5B"),
        "reported_params": 494_032_768,
        "config": {
            **_QWEN25_COMMON, "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
            "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 24,
            "max_position_embeddings": 32768, "sliding_window": 32768, "max_window_layers": 24,
            "tie_word_embeddings": True,
        },
    },
    {
        "name": "qwen2.5-7b", "family": "qwen2.5", "hub_id": "Qwen/Qwen2.5-7B",
        "aliases": ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct"), "source": _src("Qwen/Qwen2.5-7B"),
        "reported_params": 7_615_616_512,
        "config": {
            **_QWEN25_COMMON, "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
            "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
            "max_position_embeddings": 131072, "sliding_window": 131072, "max_window_layers": 28,
            "tie_word_embeddings": False,
        },
    },
    {
        "name": "qwen2.5-72b", "family": "qwen2.5", "hub_id": "Qwen/Qwen2.5-72B",
        "aliases": ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b-instruct"), "source": _src("Qwen/Qwen2.5-72B"),
        "reported_params": 72_706_203_648,
        "config": {
            **_QWEN25_COMMON, "vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568,
            "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80,
            "max_position_embeddings": 131072, "sliding_window": 131072, "max_window_layers": 80,
            "tie_word_embeddings": False,
        },
    },
    # ------------------------------------------------------------------------------------ Qwen3
    {
        "name": "qwen3-0.6b", "family": "qwen3", "hub_id": "Qwen/Qwen3-0.6B",
        "aliases": ("Qwen/Qwen3-0.6B-Base", "qwen3-0.6b-base"), "source": _src("Qwen/Qwen3-0.6B"),
        "reported_params": 596_049_920,
        "config": {
            **_QWEN3_COMMON, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
            "num_hidden_layers": 28, "max_window_layers": 28, "tie_word_embeddings": True,
        },
    },
    {
        "name": "qwen3-1.7b", "family": "qwen3", "hub_id": "Qwen/Qwen3-1.7B",
        "aliases": ("Qwen/Qwen3-1.7B-Base", "qwen3-1.7b-base"), "source": _src("Qwen/Qwen3-1.7B"),
        "reported_params": 1_720_574_976,
        "config": {
            **_QWEN3_COMMON, "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 16,
            "num_hidden_layers": 28, "max_window_layers": 28, "tie_word_embeddings": True,
        },
    },
    {
        "name": "qwen3-4b", "family": "qwen3", "hub_id": "Qwen/Qwen3-4B",
        "aliases": ("Qwen/Qwen3-4B-Base", "qwen3-4b-base"), "source": _src("Qwen/Qwen3-4B"),
        "reported_params": 4_022_468_096,
        "config": {
            **_QWEN3_COMMON, "hidden_size": 2560, "intermediate_size": 9728, "num_attention_heads": 32,
            "num_hidden_layers": 36, "max_window_layers": 36, "tie_word_embeddings": True,
        },
    },
    {
        "name": "qwen3-8b", "family": "qwen3", "hub_id": "Qwen/Qwen3-8B",
        "aliases": ("Qwen/Qwen3-8B-Base", "qwen3-8b-base"), "source": _src("Qwen/Qwen3-8B"),
        "reported_params": 8_190_735_360,
        "config": {
            **_QWEN3_COMMON, "hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
            "num_hidden_layers": 36, "max_window_layers": 36, "tie_word_embeddings": False,
        },
    },
    {
        "name": "qwen3-14b", "family": "qwen3", "hub_id": "Qwen/Qwen3-14B",
        "aliases": ("Qwen/Qwen3-14B-Base", "qwen3-14b-base"), "source": _src("Qwen/Qwen3-14B"),
        "reported_params": 14_768_307_200,
        "config": {
            **_QWEN3_COMMON, "hidden_size": 5120, "intermediate_size": 17408, "num_attention_heads": 40,
            "num_hidden_layers": 40, "max_window_layers": 40, "tie_word_embeddings": False,
        },
    },
    {
        "name": "qwen3-32b", "family": "qwen3", "hub_id": "Qwen/Qwen3-32B",
        "aliases": (), "source": _src("Qwen/Qwen3-32B"),
        "reported_params": 32_762_123_264,
        "config": {
            **_QWEN3_COMMON, "hidden_size": 5120, "intermediate_size": 25600, "num_attention_heads": 64,
            "num_hidden_layers": 64, "max_window_layers": 64, "tie_word_embeddings": False,
        },
    },
    # -------------------------------------------------------------------------------- Qwen MoE
    {
        "name": "qwen1.5-moe-a2.7b", "family": "qwen2-moe", "hub_id": "Qwen/Qwen1.5-MoE-A2.7B",
        "aliases": ("qwen2-moe-a2.7b", "Qwen/Qwen1.5-MoE-A2.7B-Chat", "qwen1.5-moe-a2.7b-chat"),
        "source": _src("Qwen/Qwen1.5-MoE-A2.7B"), "reported_params": 14_315_784_192,
        "config": {
            "model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 151936,
            "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False,
            "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24,
            "max_position_embeddings": 8192, "hidden_act": "silu", "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": 32768,
            "max_window_layers": 21, "router_aux_loss_coef": 0.001, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "bos_token_id": 151643, "eos_token_id": 151643,
        },
    },
    {
        "name": "qwen3-30b-a3b", "family": "qwen3-moe", "hub_id": "Qwen/Qwen3-30B-A3B",
        "aliases": ("Qwen/Qwen3-30B-A3B-Base", "qwen3-30b-a3b-base"), "source": _src("Qwen/Qwen3-30B-A3B"),
        "reported_params": 30_532_122_624,
        "config": {
            **_QWEN3_COMMON, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
            "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "norm_topk_prob": True, "output_router_logits": False, "router_aux_loss_coef": 0.001,
            "num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 48,
            "max_window_layers": 48, "tie_word_embeddings": False,
        },
    },
    {
        "name": "qwen3-235b-a22b", "family": "qwen3-moe", "hub_id": "Qwen/Qwen3-235B-A22B",
        "aliases": (), "source": _src("Qwen/Qwen3-235B-A22B"), "reported_params": 235_093_634_560,
        "config": {
            **_QWEN3_COMMON, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
            "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
            "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "norm_topk_prob": True, "output_router_logits": False, "router_aux_loss_coef": 0.001,
            "num_attention_heads": 64, "num_key_value_heads": 4, "num_hidden_layers": 94,
            "max_window_layers": 94, "tie_word_embeddings": False,
        },
    },
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
    # --------------------------------------------------------------------------------- DeepSeek
    {
        "name": "deepseek-v2-lite", "family": "deepseek", "hub_id": "deepseek-ai/DeepSeek-V2-Lite",
        "aliases": ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite-chat"),
        "source": _src("deepseek-ai/DeepSeek-V2-Lite"), "reported_params": 15_706_484_224,
        "config": {
            **_DEEPSEEK_MLA, "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"],
            "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
            "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
            "num_experts_per_tok": 6, "first_k_dense_replace": 1, "norm_topk_prob": False,
            "routed_scaling_factor": 1.0, "scoring_func": "softmax", "topk_method": "greedy",
            "n_group": 1, "topk_group": 1, "aux_loss_alpha": 0.001, "seq_aux": True,
            "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 27,
            "q_lora_rank": None, "max_position_embeddings": 163840, "rope_theta": 10000,
            "rope_scaling": {
                "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
            },
            "bos_token_id": 100000, "eos_token_id": 100001,
        },
    },
    {
        "name": "deepseek-v2", "family": "deepseek", "hub_id": "deepseek-ai/DeepSeek-V2",
        "aliases": ("deepseek-ai/DeepSeek-V2-Chat", "deepseek-v2-chat", "deepseek-ai/DeepSeek-V2.5"),
        "source": _src("deepseek-ai/DeepSeek-V2"), "reported_params": 235_741_434_880,
        "config": {
            **_DEEPSEEK_MLA, "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"],
            "vocab_size": 102400, "hidden_size": 5120, "intermediate_size": 12288,
            "moe_intermediate_size": 1536, "n_routed_experts": 160, "n_shared_experts": 2,
            "num_experts_per_tok": 6, "first_k_dense_replace": 1, "norm_topk_prob": False,
            "routed_scaling_factor": 16.0, "scoring_func": "softmax", "topk_method": "group_limited_greedy",
            "n_group": 8, "topk_group": 3, "aux_loss_alpha": 0.003, "seq_aux": True,
            "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 60,
            "q_lora_rank": 1536, "max_position_embeddings": 163840, "rope_theta": 10000,
            "rope_scaling": {
                "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
            },
            "bos_token_id": 100000, "eos_token_id": 100001,
        },
    },
    {
        "name": "deepseek-v3", "family": "deepseek", "hub_id": "deepseek-ai/DeepSeek-V3",
        "aliases": ("deepseek-ai/DeepSeek-V3-Base", "deepseek-v3-base", "deepseek-ai/DeepSeek-R1",
                    "deepseek-r1", "deepseek-ai/DeepSeek-V3-0324"),
        "source": _src("deepseek-ai/DeepSeek-V3"),
        "note": "the Hub checkpoint holds 685B: 671B main model plus a 14B multi-token-prediction "
        "layer (num_nextn_predict_layers=1) that transformers does not build, and 58 x 256 router "
        "e_score_correction_bias values transformers keeps as buffers; weights ship in fp8 "
        "(quantization_config omitted here: the catalog describes the architecture)",
        "config": {
            **_DEEPSEEK_MLA, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
            "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
            "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
            "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "n_group": 8, "topk_group": 4, "aux_loss_alpha": 0.001, "seq_aux": True,
            "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
            "num_hidden_layers": 61, "q_lora_rank": 1536, "max_position_embeddings": 163840,
            "rope_theta": 10000,
            "rope_scaling": {
                "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
            },
            "bos_token_id": 0, "eos_token_id": 1,
        },
    },
    {
        "name": "deepseek-v3.1", "family": "deepseek", "hub_id": "deepseek-ai/DeepSeek-V3.1",
        "aliases": ("deepseek-ai/DeepSeek-V3.1-Base", "deepseek-v3.1-base"),
        "source": _src("deepseek-ai/DeepSeek-V3.1"),
        "note": "the Hub file was not read itself: shape keys from NVIDIA's quantization of it, "
        "vendored in github.com/ai-dynamo/aiconfigurator (aic-core/src/aiconfigurator_core/"
        "model_configs/nvidia--DeepSeek-V3.1-NVFP4_config.json), identical to DeepSeek-V3's; like V3, 671B "
        "main model plus a 14B MTP layer transformers does not build",
        "config": {
            **_DEEPSEEK_MLA, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
            "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
            "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
            "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "n_group": 8, "topk_group": 4, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
            "num_key_value_heads": 128, "num_hidden_layers": 61, "q_lora_rank": 1536,
            "max_position_embeddings": 163840, "rope_theta": 10000,
            "rope_scaling": {
                "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
            },
            "bos_token_id": 0, "eos_token_id": 1,
        },
    },
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
