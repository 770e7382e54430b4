"""LoRA trainable-parameter counts against peft 0.21.2 itself, for every catalog model.

Each catalog model is built by transformers on the meta device (no memory), with at most
:data:`MAX_LAYERS` decoder layers (the count per layer is what is checked; the spec is built from the
same truncated config), then peft adds four adapters to it: ``all-linear`` and the family's
query/value-style targets, each at r=8 and r=64. Each adapter's parameters (found by its name) must
equal :func:`peakmem.formulas.lora.trainable_params`; for the first adapter, also peft's own
``requires_grad`` count.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from peakmem.adapters import LoraConfig  # noqa: E402
from peakmem.formulas import lora as L  # noqa: E402
from peakmem.hf import spec_from_config  # noqa: E402
from torch_helpers import build_meta  # noqa: E402

pytestmark = pytest.mark.torch

MAX_LAYERS = 2
# query/value-style targets per family (peft's default mapping where it has one).
QV: dict[str, tuple[str, ...]] = {
    "gpt2": ("c_attn",), "gpt_neox": ("query_key_value",), "bloom": ("query_key_value",),
    "falcon": ("query_key_value",), "phi3": ("qkv_proj",), "bert": ("query", "value"),
    "deepseek_v2": ("q_proj", "kv_b_proj"), "deepseek_v3": ("q_b_proj", "kv_b_proj"),
    "kimi_k2": ("q_b_proj", "kv_b_proj"),  # DeepSeek-V3 modules
}  # fmt: skip
LAYER_KEYS = ("num_hidden_layers", "n_layer")


def _truncate(config: dict[str, Any]) -> dict[str, Any]:
    cfg = dict(config)
    for key in LAYER_KEYS:
        if isinstance(cfg.get(key), int) and cfg[key] > MAX_LAYERS:
            cfg[key] = MAX_LAYERS
    if isinstance(cfg.get("first_k_dense_replace"), int):
        cfg["first_k_dense_replace"] = min(cfg["first_k_dense_replace"], 1)
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:MAX_LAYERS]
    text = cfg.get("text_config")
    if isinstance(text, dict):
        cfg["text_config"] = _truncate(text)
    return cfg


def _qv(spec: Any) -> tuple[str, ...]:
    names = QV.get(spec.model_type, ("q_proj", "v_proj"))
    present = {t.module for t, _ in spec.tensors()}
    if spec.model_type == "deepseek_v2" and "q_proj" not in present:
        names = ("q_b_proj", "kv_b_proj")
    return names


def _catalog() -> list[Any]:
    """Every catalog entry; MoE ones (several seconds each on meta) also marked slow."""
    from peakmem.catalog import MODELS
    from peakmem.hf import SUPPORTED_MODEL_TYPES

    out = []
    for e in MODELS:
        if e.config["model_type"] not in SUPPORTED_MODEL_TYPES:
            continue  # the derived path's entries (tests/test_derive.py checks its LoRA marking)
        if e.config["model_type"] == "kimi_k2":  # a known gap, stated in issue 14's note
            # measured: peft adapts 98,578,432 parameters of the truncated meta model, the formulas count
            # 1,836,032 (attention, dense MLP, shared experts, router). The meta model is transformers'
            # own DeepseekV3 (its config's model_type is "deepseek_v3"), so peft converts the fused routed
            # experts to target_parameters (formulas/lora/targets.py PEFT_MOE_CONVERSION); the formulas key
            # that table by the checkpoint's "kimi_k2", as peft sees it under the checkpoint's remote code,
            # whose routed experts are one nn.Linear each (modeling_deepseek.py), which all-linear adapts
            # one by one: a third count that neither side models (the spec's experts are fused).
            reason = ("the meta model is transformers' DeepseekV3 (peft converts its fused experts); "
                      "remote code has per-expert nn.Linear: neither is the formulas' count")  # fmt: skip
            out.append(
                pytest.param(
                    e, id=e.name, marks=[pytest.mark.slow, pytest.mark.xfail(strict=True, reason=reason)]
                )
            )
            continue
        moe = any(k in e.config for k in ("num_local_experts", "num_experts", "n_routed_experts"))
        out.append(pytest.param(e, id=e.name, marks=pytest.mark.slow) if moe else pytest.param(e, id=e.name))
    return out


def _count(model: Any, adapter: str) -> int:
    pattern = re.compile(rf"\.{re.escape(adapter)}(\.|$)")
    return sum(p.numel() for n, p in model.named_parameters() if pattern.search(n))


@pytest.mark.parametrize("entry", _catalog())
def test_trainable_counts_equal_peft(entry: Any) -> None:
    cfg = _truncate(dict(entry.config))
    spec = spec_from_config(cfg, name=entry.name)
    model = build_meta(cfg, spec.architecture)
    task = "SEQ_CLS" if spec.task == "sequence-classification" else "CAUSAL_LM"
    qv = list(_qv(spec))
    adapters = {"a8": (8, "all-linear"), "a64": (64, "all-linear"), "q8": (8, qv), "q64": (64, qv)}
    peft_model = None
    got: dict[str, tuple[int, int]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (rank, targets) in adapters.items():
            config = peft.LoraConfig(r=rank, target_modules=targets, task_type=task)
            if peft_model is None:
                peft_model = peft.get_peft_model(model, config, adapter_name=name)
                requires_grad = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
            else:
                peft_model.add_adapter(name, config)
            mine = LoraConfig(rank=rank, targets=(targets,) if isinstance(targets, str) else tuple(targets))
            got[name] = (_count(peft_model, name), L.trainable_params(spec, mine))
    assert all(a == b for a, b in got.values()), got
    assert requires_grad == got["a8"][0]


def test_dora_and_dropout_counts_equal_peft() -> None:
    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    spec = spec_from_config(cfg, name="tiny-llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(
            build_meta(cfg, spec.architecture),
            peft.LoraConfig(r=4, target_modules="all-linear", use_dora=True, lora_dropout=0.1),
        )
    got = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert got == L.trainable_params(spec, LoraConfig(rank=4, dora=True, dropout=0.1))
    # by hand: per layer q (64->64), k, v (64->32), o (64->64), gate/up (64->96), down (96->64)
    per_layer = 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 96) + (96 + 64))
    per_layer += 64 + 32 + 32 + 64 + 96 + 96 + 64  # DoRA magnitude: out features
    assert got == 2 * per_layer


def test_target_parameters_on_fused_experts_equal_peft() -> None:
    cfg = {
        "model_type": "qwen2_moe",
        "architectures": ["Qwen2MoeForCausalLM"],
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    spec = spec_from_config(cfg, name="tiny-qwen2-moe")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(
            build_meta(cfg, spec.architecture),
            peft.LoraConfig(
                r=4,
                target_modules=["q_proj"],
                target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
            ),
        )
    got = sum(p.numel() for p in model.parameters() if p.requires_grad)
    mine = LoraConfig(
        rank=4, targets=("q_proj",), target_parameters=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
    )
    assert got == L.trainable_params(spec, mine)
    # q (64->64) + experts: r*E*(a+b) for gate_up (4, 64, 64) and down (4, 64, 32)
    assert got == 2 * (4 * 128 + 4 * 4 * (64 + 64) + 4 * 4 * (64 + 32))
