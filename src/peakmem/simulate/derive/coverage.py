"""Coverage: every causal-LM model type transformers maps, built tiny and checked for its exact count
(benchmarks/derive_coverage.py, tests/test_derive.py)."""

from __future__ import annotations

from typing import Any

from peakmem.simulate.derive.build import build_meta, model_params, why
from peakmem.simulate.derive.from_model import spec_from_model

# Sizes a default config is shrunk to (only keys it has; ints larger than these are replaced), so
# that building and simulating it is cheap. Layer-type lists are cut to the layer count.
TINY = {
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "intermediate_size": 128, "ffn_dim": 128, "d_ff": 128,
    "n_inner": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "num_attention_heads": 4,
    "n_head": 4, "num_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "max_position_embeddings": 512, "n_positions": 512, "state_size": 16, "d_state": 16,
    "expand": 2, "time_step_rank": 8, "conv_kernel": 4, "n_groups": 1, "mamba_n_heads": 4,
    "mamba_d_head": 32, "mamba_n_groups": 1, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "kv_lora_rank": 16, "q_lora_rank": 32,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "sliding_window": 64,
}  # fmt: skip


def tiny_config(model_type: str, *, shrink: bool = True) -> dict[str, Any]:
    """transformers' default config for ``model_type``, shrunk to :data:`TINY` sizes where it has the
    keys (a key whose default is smaller stays), as a ``config.json`` dict."""
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type)
    data = cfg.to_dict()
    if shrink:
        _shrink(data)
    data["model_type"] = model_type
    return data


def _shrink(data: dict[str, Any]) -> None:
    for key, small in TINY.items():
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > small:
            data[key] = small
    vocab = data.get("vocab_size")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(vocab, int) and isinstance(data.get(key), int) and data[key] >= vocab:
            data[key] = 0
    heads = data.get("num_attention_heads")
    kv = data.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and kv and heads % kv:
        data["num_key_value_heads"] = heads
    layer_keys = ("num_hidden_layers", "n_layer", "num_layers")
    layers = next((data[k] for k in layer_keys if isinstance(data.get(k), int)), None)
    for key in ("layer_types", "layers_block_type", "block_types"):
        if isinstance(data.get(key), list) and layers is not None:
            data[key] = data[key][:layers]
    for key, value in list(data.items()):
        if key.endswith("_config") and isinstance(value, dict):
            _shrink(value)


def causal_lm_types() -> list[str]:
    """transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` keys, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_type(model_type: str) -> tuple[str, str, int]:
    """("ok", "", params) when the derived spec's count equals the meta-built model's; else
    ("cannot build" | "mismatch" | "error", why, 0)."""
    try:
        config = tiny_config(model_type)
        config.pop("architectures", None)
        model = build_meta(config)
    except Exception:
        try:
            config = tiny_config(model_type, shrink=False)
            config.pop("architectures", None)
            model = build_meta(config)
        except Exception as err:
            return "cannot build", why(err), 0
    try:
        spec = spec_from_model(model, config)
    except Exception as err:
        return "error", why(err), 0
    want = model_params(model)
    if spec.params != want:
        return "mismatch", f"spec {spec.params:,} != model {want:,}", 0
    return "ok", "", spec.params
