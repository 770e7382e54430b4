"""ModelSpecs for the inference tests, built from literal config.json values of real models.

A small builder (Llama/Qwen3/Mistral/MoE/MLA layouts as transformers names them) so these tests
do not depend on ``peakmem.hf``; the parameter counts are checked against the published ones.
Config values: the models' config.json on the Hugging Face Hub.
"""

from __future__ import annotations

from typing import Any

from peakmem.model import Attention, Layer, LayerGroup, Mlp, ModelSpec, Tensor, linear, norm

LLAMA_3_8B = dict(
    name="llama-3-8b", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
    tie_word_embeddings=False,
)  # fmt: skip
MISTRAL_7B = dict(
    name="mistral-7b-v0.1", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
    sliding_window=4096, tie_word_embeddings=False,
)  # fmt: skip
QWEN3 = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                      num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          tie_word_embeddings=False),
}  # fmt: skip
for _name, _cfg in QWEN3.items():
    _cfg.update(name=_name, head_dim=128, vocab_size=151936, max_position_embeddings=40960, qk_norm=True)
DEEPSEEK_V3 = dict(
    name="deepseek-v3", hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, vocab_size=129280,
    max_position_embeddings=163840, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
    first_k_dense_replace=3, tie_word_embeddings=False,
)  # fmt: skip


def _attention(c: dict[str, Any], window: int | None) -> tuple[Attention, tuple[Tensor, ...]]:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    if c.get("kv_lora_rank"):
        nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        qr, kr = c["q_lora_rank"], c["kv_lora_rank"]
        att = Attention(
            num_heads=heads, num_kv_heads=heads, head_dim=nope + rope, v_head_dim=vd,
            q_lora_rank=qr, kv_lora_rank=kr, qk_rope_head_dim=rope,
        )  # fmt: skip
        tensors = (
            *linear("self_attn.q_a_proj", h, qr, False, "attention"),
            *norm("self_attn.q_a_layernorm", qr, False),
            *linear("self_attn.q_b_proj", qr, heads * (nope + rope), False, "attention"),
            *linear("self_attn.kv_a_proj_with_mqa", h, kr + rope, False, "attention"),
            *norm("self_attn.kv_a_layernorm", kr, False),
            *linear("self_attn.kv_b_proj", kr, heads * (nope + vd), False, "attention"),
            *linear("self_attn.o_proj", heads * vd, h, False, "attention"),
        )
        return att, tensors
    hd = c.get("head_dim", h // heads)
    kv = c["num_key_value_heads"]
    att = Attention(
        num_heads=heads, num_kv_heads=kv, head_dim=hd, v_head_dim=hd,
        qk_norm="per_head" if c.get("qk_norm") else "none", sliding_window=window,
    )  # fmt: skip
    tensors = (
        *linear("self_attn.q_proj", h, heads * hd, False, "attention"),
        *linear("self_attn.k_proj", h, kv * hd, False, "attention"),
        *linear("self_attn.v_proj", h, kv * hd, False, "attention"),
        *linear("self_attn.o_proj", heads * hd, h, False, "attention"),
    )
    if c.get("qk_norm"):
        tensors += (*norm("self_attn.q_norm", hd, False), *norm("self_attn.k_norm", hd, False))
    return att, tensors


def _mlp(c: dict[str, Any], moe: bool) -> tuple[Mlp, tuple[Tensor, ...]]:
    h = c["hidden_size"]
    if not moe:
        i = c["intermediate_size"]
        tensors = (
            *linear("mlp.gate_proj", h, i, False, "mlp"),
            *linear("mlp.up_proj", h, i, False, "mlp"),
            *linear("mlp.down_proj", i, h, False, "mlp"),
        )
        return Mlp(intermediate_size=i, gated=True, activation="silu"), tensors
    e = c.get("num_experts") or c["n_routed_experts"]
    i = c["moe_intermediate_size"]
    shared = c.get("n_shared_experts", 0) * i
    tensors: tuple[Tensor, ...] = (*linear("mlp.gate", h, e, False, "router"),)
    for proj, (fan_in, fan_out) in (("gate_proj", (h, i)), ("up_proj", (h, i)), ("down_proj", (i, h))):
        tensors += (
            Tensor(name=f"mlp.experts.{proj}.weight", module=proj, shape=(fan_out, fan_in),
                   component="experts", kind="expert_weight", copies=e),
        )  # fmt: skip
    if shared:
        tensors += (
            *linear("mlp.shared_experts.gate_proj", h, shared, False, "shared_experts"),
            *linear("mlp.shared_experts.up_proj", h, shared, False, "shared_experts"),
            *linear("mlp.shared_experts.down_proj", shared, h, False, "shared_experts"),
        )
    if c.get("n_routed_experts"):  # DeepSeek-V3: e_score_correction_bias is a buffer, not a parameter
        pass
    mlp = Mlp(intermediate_size=i, gated=True, activation="silu", num_experts=e,
              experts_per_token=c["num_experts_per_tok"], shared_intermediate_size=shared)  # fmt: skip
    return mlp, tensors


def _layer(c: dict[str, Any], moe: bool, window: int | None) -> Layer:
    att, at = _attention(c, window)
    mlp, mt = _mlp(c, moe)
    h = c["hidden_size"]
    norms = (*norm("input_layernorm", h, False), *norm("post_attention_layernorm", h, False))
    return Layer(attention=att, mlp=mlp, tensors=(*at, *mt, *norms))


def build_spec(c: dict[str, Any], layer_windows: list[int | None] | None = None) -> ModelSpec:
    """A decoder-only causal LM from a config dict; ``layer_windows`` gives per-layer windows."""
    n = c["num_hidden_layers"]
    moe_from = c.get("first_k_dense_replace", 0) if (c.get("num_experts") or c.get("n_routed_experts")) else n
    windows = layer_windows or [c.get("sliding_window")] * n
    groups: list[LayerGroup] = []
    for idx in range(n):
        layer = _layer(c, idx >= moe_from, windows[idx])
        if groups and groups[-1].layer == layer:
            groups[-1] = LayerGroup(count=groups[-1].count + 1, layer=layer)
        else:
            groups.append(LayerGroup(count=1, layer=layer))
    h, v = c["hidden_size"], c["vocab_size"]
    outer = (
        Tensor(name="model.embed_tokens.weight", module="embed_tokens", shape=(v, h),
               component="embeddings", kind="embedding"),
        *norm("model.norm", h, False),
    )  # fmt: skip
    if not c.get("tie_word_embeddings"):
        outer += linear("lm_head", h, v, False, "head")
    return ModelSpec(
        name=c["name"], model_type="test", architecture="TestForCausalLM", task="causal-lm",
        vocab_size=v, hidden_size=h, max_position_embeddings=c["max_position_embeddings"],
        position="rope", norm="rmsnorm", groups=tuple(groups), outer=outer,
        tie_word_embeddings=bool(c.get("tie_word_embeddings")),
    )  # fmt: skip


def tiny(
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    vocab: int = 128,
    inter: int = 128,
    window: int | None = None,
    max_pos: int = 1024,
    layer_windows: list[int | None] | None = None,
) -> ModelSpec:
    cfg = dict(
        name="tiny", hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
        max_position_embeddings=max_pos, sliding_window=window, tie_word_embeddings=False,
    )  # fmt: skip
    return build_spec(cfg, layer_windows)


def infer_cli_equals_api(capsys: Any, model: str, **kw: Any) -> dict[str, Any]:
    """``peakmem infer MODEL --json`` with ``kw`` as flags; asserts it equals ``peakmem.infer`` and
    returns it (``capsys``: pytest's fixture)."""
    import json

    import peakmem
    from peakmem.cli import main

    api = peakmem.infer(model, **kw).to_dict()
    argv = ["infer", model, "--json"]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    main(argv)
    cli: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert cli == api
    return cli
