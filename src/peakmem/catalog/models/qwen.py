"""The catalog's Qwen2.5, Qwen3 and Qwen MoE models.

Entries as described in :mod:`peakmem.catalog.models`; plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

from peakmem.catalog.models._source import _src

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


# fmt: off
ENTRIES: tuple[dict[str, Any], ...] = (
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
)
# fmt: on
