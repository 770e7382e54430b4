"""Tiny real configs shared by the measure, simulate and CLI tests, with hand-derived counts."""

import json
from pathlib import Path

from peakmem.errors import InputError
from peakmem.formulas.activations import check_op_sac
from peakmem.model import ModelSpec
from peakmem.training import Checkpointing, Method, TrainingSetup

GPT2 = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 1000, "n_positions": 128,
    "n_embd": 64, "n_layer": 2, "n_head": 4, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip

# Parameter counts, hand-derived. Llama: embed 1000*64 + per layer (q 64*64 + k 64*32 + v 64*32 +
# o 64*64 + gate/up/down 3*64*176 + 2 norms 2*64) + final norm 64 + untied head 1000*64.
LLAMA_P = 1000 * 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64) + 64 + 1000 * 64
LLAMA_TENSORS = 1 + 2 * 9 + 1 + 1  # parameter tensors: embed, 9 per layer, norm, head
LLAMA_BUFFER_BYTES = 2 * 8 * 4  # rotary inv_freq and original_inv_freq: head_dim/2 = 8 fp32 values each
# GPT-2: wte 1000*64 + wpe 128*64 + per layer (ln 2*64, c_attn 64*192+192, c_proj 64*64+64, ln 2*64,
# c_fc 64*256+256, c_proj 256*64+64) + ln_f 2*64; the head is tied to wte.
GPT2_P = (
    1000 * 64 + 128 * 64 + 2 * (4 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64) + 128
)
GPT2_TENSORS = 2 + 2 * 12 + 2  # wte, wpe, 12 per layer, ln_f weight and bias

# One tiny config per family the formulas know (peakmem.hf's builders), for the formulas-vs-derived
# agreement test (tests/test_derive_agreement.py, benchmarks/derive_agreement.py): 3 layers, hidden 64,
# positions >= 256 so that seq 128 runs. Shapes as in tests/test_param_counts_torch.py's TINY.
_T = {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
      "intermediate_size": 96, "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0,
      "pad_token_id": 0}  # fmt: skip
_MLA = {"moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
        "first_k_dense_replace": 1}  # fmt: skip
FAMILY_CONFIGS = {
    "gpt2": {**GPT2, "n_positions": 256},
    "gpt_neox": {"model_type": "gpt_neox", **_T},
    "opt": {"model_type": "opt", **_T, "ffn_dim": 96, "word_embed_proj_dim": 64},
    "bloom": {"model_type": "bloom", **_T, "n_layer": 3, "n_head": 4},
    "falcon": {"model_type": "falcon", **_T},
    "llama": {"model_type": "llama", **_T, "num_key_value_heads": 2},
    "mistral": {"model_type": "mistral", **_T, "num_key_value_heads": 2, "sliding_window": None},
    "mixtral": {"model_type": "mixtral", **_T, "num_key_value_heads": 2, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "qwen2": {"model_type": "qwen2", **_T, "num_key_value_heads": 2},
    "qwen3": {"model_type": "qwen3", **_T, "num_key_value_heads": 2, "head_dim": 32},
    "qwen2_moe": {"model_type": "qwen2_moe", **_T, "num_key_value_heads": 2, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 48, "decoder_sparse_step": 2, "mlp_only_layers": [2]},
    "qwen3_moe": {"model_type": "qwen3_moe", **_T, "num_key_value_heads": 2, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [0]},
    "gemma": {"model_type": "gemma", **_T, "head_dim": 16, "num_key_value_heads": 2},
    "gemma2": {"model_type": "gemma2", **_T, "head_dim": 16, "num_key_value_heads": 2},
    "gemma3_text": {"model_type": "gemma3_text", **_T, "head_dim": 16, "num_key_value_heads": 2},
    "phi3": {"model_type": "phi3", **_T, "num_key_value_heads": 2},
    "starcoder2": {"model_type": "starcoder2", **_T},
    "olmo": {"model_type": "olmo", **_T},
    "olmo2": {"model_type": "olmo2", **_T, "num_key_value_heads": 2},
    "deepseek_v2": {"model_type": "deepseek_v2", **_T, **_MLA, "q_lora_rank": None},
    "deepseek_v3": {"model_type": "deepseek_v3", **_T, **_MLA, "q_lora_rank": 24, "n_group": 1,
                    "topk_group": 1},
    "bert": {"model_type": "bert", "architectures": ["BertForSequenceClassification"], **_T},
}  # fmt: skip

# Vision towers transformers builds with the timm library (TimmWrapperModel: transformers/models/
# timm_wrapper/modeling_timm_wrapper.py; Gemma 3n's MobileNet-V5 is a TimmWrapperConfig): a config with
# one cannot be built where timm is not installed (it is not among the test extras: timm needs a
# torchvision built for the installed torch).
TIMM_VISION_TYPES = frozenset({"timm_wrapper", "gemma3n_vision"})


def llama_config_file(directory: Path, *, hidden: int, intermediate: int, layers: int, seq: int) -> str:
    """A config.json of an MHA Llama with a 128-token vocabulary and an untied head in ``directory``: what
    the release-fact tests (bitsandbytes, torchao) train through peakmem.train."""
    cfg = {**LLAMA, "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
           "num_key_value_heads": 4, "vocab_size": 128, "max_position_embeddings": seq,
           "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "hidden_act": "silu",
           "torch_dtype": "bfloat16"}  # fmt: skip
    path = directory / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def needs_timm(config: dict) -> bool:  # type: ignore[type-arg]
    return (config.get("vision_config") or {}).get("model_type") in TIMM_VISION_TYPES


def op_modelled(spec: ModelSpec, setup: TrainingSetup, tp: int = 1) -> bool:
    """Whether ``checkpointing op`` is estimated for this job (dense, adapter-free Linear layers, no
    tensor parallelism): peakmem.formulas.activations.op_sac.check_op_sac, as the estimate calls it. The
    property tests draw every policy and keep op where it is modelled (an InputError elsewhere)."""
    if setup.checkpointing is not Checkpointing.OP:
        return True
    if setup.precision.states is not setup.precision:  # float8 recipes: op SAC not modelled (float8.py)
        return False
    try:
        for g in spec.groups:
            check_op_sac(spec, g.layer, setup.method is not Method.FULL, tp)
    except InputError:
        return False
    return True


# The tiny Llama the LoRA / QLoRA formulas-vs-simulate files share (test_qlora_simulate.py,
# test_lora_recompute_simulate.py): h 256, I 704 (bitsandbytes' CPU packing wants widths in 32s), 2 layers.
ADAPTER_LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 256,
    "intermediate_size": 704, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 1024, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip


def formulas_over_simulate(config: dict, setup: TrainingSetup) -> float:  # type: ignore[type-arg]
    """The analytic peak allocated over the fake-tensor simulator's, less 1 (needs torch and peft)."""
    from peakmem.estimate import estimate_training
    from peakmem.hf import spec_from_config
    from peakmem.simulate import simulate_training

    analytic = estimate_training(spec_from_config(config, name="t"), setup).peak_allocated_bytes
    return analytic / simulate_training(config, setup, lora=setup.lora).peak_allocated_bytes - 1
