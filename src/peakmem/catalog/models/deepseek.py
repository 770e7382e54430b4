"""The catalog's DeepSeek-V2/V3 (MLA + MoE) models.

Entries as described in :mod:`peakmem.catalog.models`; plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

from peakmem.catalog.models._source import _src

# --- DeepSeek ---------------------------------------------------------------------------------------
_DEEPSEEK_MLA: dict[str, Any] = {
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_lora_rank": 512,
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "rms_norm_eps": 1e-06, "moe_layer_freq": 1, "torch_dtype": "bfloat16",
}  # fmt: skip


# fmt: off
ENTRIES: tuple[dict[str, Any], ...] = (
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
        "e_score_correction_bias values transformers keeps as buffers; weights ship in fp8 with one fp32 "
        "scale per 128 x 128 block (quantization_config as the Hub file has it: `peakmem infer` prices "
        "them from it)",
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
            "quantization_config": {
                "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128],
            },
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
)
# fmt: on
