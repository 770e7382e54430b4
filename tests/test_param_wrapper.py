"""LoRA on bare parameters (peft target_parameters, ParamWrapper): counts, layer keys and bytes by hand.

Tiny Qwen2-MoE: hidden 64, 4 experts of intermediate 32, stored as transformers 5 fuses them:
``mlp.experts.gate_up_proj`` (4, 64, 64) and ``mlp.experts.down_proj`` (4, 64, 32).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import peakmem
from peakmem.adapters import LoraConfig, parse_parameters
from peakmem.errors import InputError
from peakmem.formulas import lora as L
from peakmem.formulas.lora.param_wrapper import wrapper_costs
from peakmem.formulas.lora.targets import layer_key
from peakmem.hf import spec_from_config
from peakmem.model import ModelSpec
from peakmem.peft_versions import release_facts
from peakmem.training import Method, TrainingSetup

QWEN2_MOE = {
    "model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
    "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}  # fmt: skip
R, E = 4, 4
GATE_UP = R * E * (64 + 64)  # lora_A (r*E, 64) + lora_B (64, r*E)
DOWN = R * E * (64 + 32)
Q = R * (64 + 64)
N_GATE, N_DOWN = E * 64 * 64, E * 64 * 32  # elements of the two expert stacks
BF16, FP32 = 2, 4


def _spec() -> ModelSpec:
    return spec_from_config(QWEN2_MOE, name="tiny-qwen2-moe")


def _lora(*params: str) -> LoraConfig:
    return LoraConfig(rank=R, targets=("q_proj",), target_parameters=params)


def test_parse_and_layer_keys() -> None:
    assert parse_parameters("1.mlp.experts.gate_up_proj, 1.mlp.experts.down_proj") == (
        "1.mlp.experts.gate_up_proj",
        "1.mlp.experts.down_proj",
    )
    assert parse_parameters("experts") == ("experts",)
    with pytest.raises(InputError, match="lora_target_parameters"):
        parse_parameters("experts,1.mlp.experts.down_proj")
    with pytest.raises(InputError, match="lora_target_parameters"):
        parse_parameters("mlp.experts.down_proj,")
    assert layer_key("22.mlp.experts.gate_up_proj") == (22, "mlp.experts.gate_up_proj")
    assert layer_key("model.layers.3.mlp.experts.down_proj") == (3, "mlp.experts.down_proj")
    assert layer_key("mlp.experts.down_proj") == (None, "mlp.experts.down_proj")


def test_trainable_counts_per_layer_key() -> None:
    s = _spec()
    every = L.trainable_params(s, _lora("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))
    assert every == 4 * (Q + GATE_UP + DOWN)
    assert L.trainable_params(s, _lora("experts")) == every
    one = _lora("2.mlp.experts.gate_up_proj", "layers.2.mlp.experts.down_proj")
    assert L.trainable_params(s, one) == 4 * Q + GATE_UP + DOWN
    split = L.split_target_layers(s, one)
    assert [g.count for g in split.groups] == [2, 1, 1]  # layers 0-1, 2, 3
    assert L.trainable_params(split, one) == 4 * Q + GATE_UP + DOWN
    assert L.layer_trainable_params(split, one, 1) == Q + GATE_UP + DOWN
    assert L.layer_trainable_params(split, one, 2) == Q


def test_wrapper_bytes_by_release() -> None:
    mods = [m for m in L.resolve_targets(_spec(), _lora("experts")) if m.kind == "param" and m.group == 0]
    factors = wrapper_costs(mods, release_facts("0.21.2"), param_bytes=BF16, a_bytes=FP32)
    # baddbmm writes the merged weight (saved): nothing else full-size in forward; backward: its gradient
    assert (factors.forward, factors.backward) == (0, N_GATE * BF16)
    delta = wrapper_costs(mods, release_facts("0.17.0"), param_bytes=BF16, a_bytes=FP32)
    merged = (N_GATE + N_DOWN) * BF16
    # both cast deltas held; gate_up's einsum output and scaled copy (2 N a) before its cast, net of the
    # merged weights made after it
    assert delta.forward == merged + (2 * N_GATE * FP32 - N_GATE * BF16) - merged
    # gate_up's gradient cast to fp32 and scaled (2 N a), after its consumer freed both merged weights
    assert delta.backward == 2 * N_GATE * FP32 - merged
    assert L.param_wrapper_saved(mods[0], _lora("experts"), BF16, FP32, factors=True) == N_GATE * BF16 + (
        R * E * (64 + 64) * BF16
    )
    assert L.param_wrapper_saved(mods[0], _lora("experts"), BF16, FP32, factors=False) == N_GATE * BF16


def test_bad_targets_name_the_field() -> None:
    s = _spec()
    for bad in ("9.mlp.experts.gate_up_proj", "mlp.experts.gate_up_bias", "mlp.gate.bias"):
        with pytest.raises(InputError) as err:
            L.resolve_targets(s, _lora(bad))
        assert str(err.value).startswith(f"lora_target_parameters={bad!r}") and "\n" not in str(err.value)
    dense = spec_from_config({**QWEN2_MOE, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    with pytest.raises(InputError, match=r"lora_target_parameters='experts'"):
        L.resolve_targets(dense, _lora("experts"))
    with pytest.raises(InputError, match=r"peft='0\.16\.0'"):
        TrainingSetup(method=Method.LORA, lora=_lora("experts"), peft="0.16.0")
    with pytest.raises(InputError, match="peft="):
        TrainingSetup(method=Method.LORA, peft="sixteen")


def test_the_option_through_the_api(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN2_MOE))
    ask = {"method": "lora", "lora_rank": R, "lora_targets": "q_proj", "precision": "bf16", "seq": 64}
    plain = peakmem.train(str(path), **ask)
    new = peakmem.train(str(path), **ask, lora_target_parameters="2.mlp.experts.gate_up_proj")
    old = peakmem.train(str(path), **ask, lora_target_parameters="2.mlp.experts.gate_up_proj", peft="0.17.0")
    assert [r["model"]["trainable_params"] for r in (plain, new)] == [4 * Q, 4 * Q + GATE_UP]
    peaks = [r["peak_allocated_bytes"] for r in (plain, new, old)]
    assert peaks[0] < peaks[1] < peaks[2]  # the merged weight; then the full-size fp32 delta


def test_axolotl_file_maps_the_parameter_targets(tmp_path: Path) -> None:
    from peakmem.fromfile import read_from_files

    path = tmp_path / "gpt-oss-lora.yaml"  # as axolotl's examples/gpt-oss/gpt-oss-20b-sft-lora-singlegpu.yaml
    path.write_text(
        "base_model: openai/gpt-oss-20b\nadapter: lora\nlora_r: 8\nlora_target_linear: true\n"
        "lora_target_parameters:\n  - 22.mlp.experts.gate_up_proj\n  - 22.mlp.experts.down_proj\n"
    )
    found = read_from_files([path])
    assert found.format == "axolotl"
    assert found.options["lora_target_parameters"] == "22.mlp.experts.gate_up_proj,22.mlp.experts.down_proj"
