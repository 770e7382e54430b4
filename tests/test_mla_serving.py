"""MLA under the serving engines' tensor parallelism (formulas/serving/context.py): the down-projections
replicated on every rank (vLLM, SGLang) and vLLM's compute-dtype copy of a quantized kv_b_proj, by hand and
against the "Model loading took" of a fitting log of benchmarks/published_scale.json."""

from __future__ import annotations

import json
from pathlib import Path

from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.context import mla_absorbed_bytes, resolve_context, sharded_weight_bytes
from peakmem.formulas.weights import weight_rows
from peakmem.inference import Engine, InferenceSetup
from peakmem.resolve import resolve_model
from peakmem.units import GiB
from peakmem.weight_formats import parse_weight_format

POINTS = Path(__file__).resolve().parents[1] / "benchmarks" / "published_scale.json"
B200_RECORD = "vllm-memory-estimator-vdb-dcea7fc0-deepseek-r1-0528-b200-tp8-v0.18.0"


def test_the_down_projections_are_replicated() -> None:
    spec = resolve_model("deepseek-v3")
    rows = weight_rows(spec, parse_weight_format("fp8-block"))
    down = [r for r in rows if r.name.split(".")[-2] in ("q_a_proj", "kv_a_proj_with_mqa")]
    assert len(down) == 4  # the dense and the MoE layer groups, two projections each
    even = sharded_weight_bytes(rows, 8)
    whole = sharded_weight_bytes(rows, 8, mla_replicated=True)
    assert whole - even == sum(r.bytes - -(-r.bytes // 8) for r in down)
    assert 0.7 * GiB < whole - even < 0.8 * GiB
    assert sharded_weight_bytes(rows, 1, mla_replicated=True) == sharded_weight_bytes(rows, 1)


def _setup(engine: Engine, weights: str, tp: int = 8) -> InferenceSetup:
    version = {"engine_version": "0.18"} if engine is Engine.VLLM else {}
    return InferenceSetup(engine=engine, weights=weights, tp=tp, context=8192, **version)


def test_the_absorbed_copy_by_hand() -> None:
    """61 layers x kv_lora_rank 512 x 16 heads a rank x (128 nope + 128 v) x 2 B (bf16) at TP 8."""
    spec = resolve_model("deepseek-v3")
    c = resolve_context(spec, _setup(Engine.VLLM, "fp8-block"))
    assert mla_absorbed_bytes(c) == 61 * 512 * 16 * 256 * 2
    assert mla_absorbed_bytes(resolve_context(spec, _setup(Engine.VLLM, "bf16"))) == 0  # a view, no copy
    assert mla_absorbed_bytes(resolve_context(spec, _setup(Engine.SGLANG, "fp8-block"))) == 0
    dense = resolve_context(resolve_model("llama-3.1-8b"), _setup(Engine.VLLM, "fp8", 1))
    assert mla_absorbed_bytes(dense) == 0


def test_the_load_is_the_fitting_log() -> None:
    """DeepSeek-R1-0528 on 8 B200s, vLLM 0.18 (a fitting record): "Model loading took 79.88 GiB" a rank;
    peakmem's weights and the absorbed copy within 1 % (an even split alone: 1.34 GiB, 1.7 %, short)."""
    doc = json.loads(POINTS.read_text())
    (p,) = [p for p in doc["points"] if p["id"] == B200_RECORD]
    assert p["set"] == "fit"
    est = estimate_inference(resolve_model(p["model"]), _setup(Engine.VLLM, "fp8-block"))
    held = sum(i.bytes for i in est.items if i.path.startswith(("weights", "MLA")))
    logged = p["measured"]["components"]["model_load_gib"] * GiB
    assert abs(held / logged - 1) < 0.01
