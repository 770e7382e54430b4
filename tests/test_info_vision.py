"""Issue 30 part 3 (info): a vision-language model's info shows the language model and its towers apart.

A derived spec records the towers beside the language model (:class:`peakmem.model.Tower`, read by
peakmem/simulate/derive/from_model.py from the modules transformers builds from the config's other
sub-configs); ``info`` describes the language model in its top-level fields and lists each tower with
its sizes and parameters. Counts below are derived by hand from the architecture.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from peakmem import block_costs
from peakmem.cli import main
from peakmem.model import FIRST_BLOCK
from peakmem.resolve import resolve_model
from peakmem.units import fmt_count

# Qwen2.5-VL-7B's vision tower (transformers 5.23 modeling_qwen2_5_vl.py
# Qwen2_5_VisionTransformerPretrainedModel): depth 32, hidden 1280, MLP 3420 (gated, with biases), patch
# 14 x 14 over 2 frames, 2 x 2 patches merged into the language model's 3584
V_HIDDEN, V_MLP, V_DEPTH, PATCH, FRAMES, MERGE, OUT = 1280, 3420, 32, 14, 2, 2, 3584
# fmt: off
V_BLOCK = (
    2 * V_HIDDEN  # norm1, norm2 (RMSNorm)
    + 3 * V_HIDDEN * V_HIDDEN + 3 * V_HIDDEN  # attn.qkv
    + V_HIDDEN * V_HIDDEN + V_HIDDEN  # attn.proj
    + 2 * (V_MLP * V_HIDDEN + V_MLP)  # gate_proj, up_proj
    + V_HIDDEN * V_MLP + V_HIDDEN  # down_proj
)
MERGED = V_HIDDEN * MERGE * MERGE
V_OUTER = (
    V_HIDDEN * 3 * FRAMES * PATCH * PATCH  # patch_embed.proj (Conv3d, no bias)
    + V_HIDDEN  # merger.ln_q
    + MERGED * MERGED + MERGED  # merger.mlp.0
    + OUT * MERGED + OUT  # merger.mlp.2
)
# fmt: on
VISION = V_DEPTH * V_BLOCK + V_OUTER


def _info(capsys: pytest.CaptureFixture[str], name: str) -> tuple[dict, str]:  # type: ignore[type-arg]
    """The JSON, and the text with rich's wrapping at the pipe width undone (whitespace runs as one space)."""
    assert main(["info", name, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["info", name]) == 0
    return got, " ".join(capsys.readouterr().out.split())


def test_qwen25_vl_json_names_the_language_model_and_the_tower(capsys: pytest.CaptureFixture[str]) -> None:
    got, _ = _info(capsys, "qwen2.5-vl-7b")
    assert (got["num_layers"], got["num_heads"], got["num_kv_heads"], got["head_dim"]) == (28, 28, 4, 128)
    assert got["hidden_size"] == 3584 and got["intermediate_size"] == 18944
    assert got["language_model"]["attention"] == "GQA (4 kv heads)"
    assert got["language_model"]["num_layers"] == 28
    [tower] = got["towers"]
    assert tower["kind"] == "vision" and tower["module"] == "model.visual"
    assert (tower["num_layers"], tower["hidden_size"], tower["num_heads"]) == (V_DEPTH, V_HIDDEN, 16)
    assert (tower["intermediate_size"], tower["patch_size"], tower["spatial_merge_size"]) == (
        V_MLP,
        PATCH,
        MERGE,
    )
    assert (tower["temporal_patch_size"], tower["out_hidden_size"], tower["image_size"]) == (
        FRAMES,
        OUT,
        None,
    )
    assert tower["params"] == VISION
    assert got["language_model"]["params"] + VISION == got["params"]


def test_qwen25_vl_text_shows_the_language_model_then_the_tower(capsys: pytest.CaptureFixture[str]) -> None:
    got, text = _info(capsys, "qwen2.5-vl-7b")
    lm = got["params"] - VISION
    assert (
        f"qwen2.5-vl-7b (Qwen2_5_VLForConditionalGeneration): {got['params']:,} parameters "
        f"({fmt_count(got['params'])}); language model: 28 layers, hidden 3584, 28 heads, GQA (4 kv heads); "
        f"{lm:,} parameters ({fmt_count(lm)})"
    ) in text
    assert (
        "vision tower (model.visual): 32 layers, hidden 1280, 16 heads, intermediate 3420, patch 14, "
        f"temporal patch 2, spatial merge 2, out 3584; {VISION:,} parameters ({fmt_count(VISION)})"
    ) in text
    assert text.index("language model:") < text.index("vision tower") < text.index("parameters by component")


def test_qwen3_vl_names_its_language_model(capsys: pytest.CaptureFixture[str]) -> None:
    got, _ = _info(capsys, "qwen3-vl-8b")
    assert (got["num_layers"], got["num_heads"], got["num_kv_heads"]) == (36, 32, 8)
    [tower] = got["towers"]
    assert (tower["module"], tower["num_layers"], tower["hidden_size"], tower["num_heads"]) == (
        "model.visual",
        27,
        1152,
        16,
    )


VL_MODELS = [
    path.stem
    for path in sorted(block_costs.SHIPPED.glob("*.json"))
    if "vision_config" in json.loads(path.read_text())["config"]
]


def test_every_vl_catalog_model_has_a_vision_tower() -> None:
    assert len(VL_MODELS) >= 7
    for name in VL_MODELS:
        spec = resolve_model(name)
        assert "vision" in [t.kind for t in spec.towers], name


@pytest.mark.parametrize("name", VL_MODELS)
def test_tower_params_are_the_sum_of_its_tensors(name: str) -> None:
    """From the shipped document itself: the outer tensors under the tower's module and its blocks' tensors
    times their count; the language model keeps the rest, and the total is the exact count, unchanged."""
    doc = json.loads((block_costs.SHIPPED / f"{name}.json").read_text())["spec"]
    spec = resolve_model(name)
    mine = 0
    for tower in doc["towers"]:
        outer = sum(
            math.prod(t["shape"]) for t in doc["outer"] if t["name"].startswith(tower["prefix"] + ".")
        )
        blocks = sum(
            g["count"] * sum(math.prod(t["shape"]) * t["copies"] for t in g["layer"]["tensors"])
            for g in doc["groups"]
            if g["layer"]["derived"]["key"] in tower["block_keys"]
        )
        [typed] = [t for t in spec.towers if t.prefix == tower["prefix"]]
        assert spec.tower_params(typed) == outer + blocks > 0
        mine += outer + blocks
    everything = sum(math.prod(t["shape"]) * t["copies"] for t in doc["outer"]) + sum(
        g["count"] * sum(math.prod(t["shape"]) * t["copies"] for t in g["layer"]["tensors"])
        for g in doc["groups"]
    )
    assert spec.params == everything
    assert mine < everything


def test_an_edge_block_keeps_its_tower() -> None:
    """formulas/lora split_first_layer gives the first block a key with a suffix: still the tower's."""
    spec = resolve_model("qwen2.5-vl-7b")
    first = spec.groups[0].layer
    assert first.derived is not None
    edge = dataclasses.replace(
        first, derived=dataclasses.replace(first.derived, key=first.derived.key + FIRST_BLOCK)
    )
    assert spec.tower_of(edge) is spec.towers[0]
    assert spec.tower_of(spec.groups[-1].layer) is None


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt2-xl", "smollm3-3b", "qwen3-next-80b-a3b"])
def test_a_text_only_models_info_is_unchanged(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    got, text = _info(capsys, name)
    spec = resolve_model(name)
    first = spec.first_layer.attention
    assert got["towers"] == [] and "language_model" not in got
    assert (got["num_layers"], got["num_heads"], got["num_kv_heads"]) == (
        spec.num_layers,
        first.num_heads,
        first.num_kv_heads,
    )
    assert text.startswith(
        f"{name} ({spec.architecture}): {spec.params:,} parameters ({fmt_count(spec.params)}); "
        f"{spec.num_layers} layers, hidden {spec.hidden_size}, {first.num_heads} heads,"
    )
    assert "tower" not in text and "language model:" not in text


@pytest.mark.torch
def test_the_derived_tower_is_transformers_vision_module(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Derived from the config on the meta device, the tower's count is its module's parameters."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path))
    from peakmem.simulate.derive.build import build_meta
    from peakmem.simulate.derive.spec import derive_spec

    config = json.loads((block_costs.SHIPPED / "qwen2.5-vl-7b.json").read_text())["config"]
    spec = derive_spec(config, name="qwen2.5-vl-7b")
    model = build_meta(config)
    [tower] = spec.towers
    module = model.get_submodule(tower.prefix)
    assert spec.tower_params(tower) == sum(p.numel() for p in module.parameters()) == VISION
