"""Accuracy of ``peakmem infer`` against published inference memory (shared/validation).

Run: ``.venv/bin/python benchmarks/accuracy_infer.py [path/to/published-measurements.json]``.

The Qwen3 speed benchmark ("GPU Memory", transformers 4.51 generate, bf16, flash-attention 2,
batch 1, input length L + 2048 generated tokens) behaves like memory held after generation: its
deltas between input lengths equal the bf16 KV cache of the extra tokens. So the quantity compared
is ``extra["steady_state_bytes"]`` (weights + the KV cache of L + 2048 tokens); the decode-phase
peak (which adds the torch.cat growth copy and logits) is listed too. Prints a Markdown table and
exits 1 if any point is off by more than 5 %.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from peakmem.breakdown import Category, Estimate
from peakmem.catalog import get_model
from peakmem.formulas.serving import estimate_inference, serving_fit
from peakmem.hf import spec_from_config
from peakmem.inference import Engine, InferenceSetup
from peakmem.units import GiB, MiB

TOLERANCE = 0.05
GENERATED = 2048  # the benchmark generates 2048 tokens after each input
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published-measurements.json"


def estimates(path: Path) -> list[tuple[dict[str, Any], Estimate, int]]:
    """Each Qwen3 point, its estimate and the compared prediction (the steady-state bytes)."""
    out = []
    for p in json.loads(path.read_text()):
        if not str(p["id"]).startswith("QWEN3-INF"):
            continue
        name = str(p["model"]).lower()
        spec = spec_from_config(get_model(name).config, name=name)
        context = int(p["seq_len"])
        setup = InferenceSetup(weights="bf16", context=context, prompt=context - GENERATED, batch=1)
        est = estimate_inference(spec, setup)
        steady = est.extra["steady_state_bytes"]
        assert isinstance(steady, int)
        out.append((p, est, steady))
    return out


def rows(path: Path) -> list[dict[str, object]]:
    out = []
    for p, est, steady in estimates(path):
        decode = next(ph.bytes for ph in est.phases if ph.phase.value == "decode")
        measured = float(p["value"]) * MiB
        out.append(
            {
                "id": p["id"], "model": p["model"], "context": int(p["seq_len"]),
                "measured_mib": float(p["value"]), "predicted_mib": steady / MiB,
                "error": steady / measured - 1,
                "decode_peak_mib": decode / MiB, "decode_peak_error": decode / measured - 1,
                "peak_phase": est.peak_phase.value, "peak_allocated_mib": est.peak_allocated_bytes / MiB,
            }
        )  # fmt: skip
    return out


# vLLM memory-profiling logs (informative, not gating): vllm-project/vllm PR #10511 (2024-12-13),
# `vllm serve meta-llama/Meta-Llama-3-8B` on an 80 GB GPU (total_gpu_memory 79.22 GiB), util 0.90,
# max_model_len 8192: weights 14.96 GiB, available_kv_cache_memory 53.29 GiB; with -tp 2: weights
# 7.48 GiB, non_torch 3.58 GiB, activations 1.26 GiB -> 71.29 - 7.48 - 3.58 - 1.26 = 58.97 GiB.
VLLM_POINTS = (
    ("VLLM-10511-TP1", 1, 14.96, 53.29),
    ("VLLM-10511-TP2", 2, 7.48, 58.97),
)


def vllm_rows() -> list[str]:
    spec = spec_from_config(get_model("llama-3-8b").config, name="llama-3-8b")
    out = []
    for pid, tp, weights_gib, kv_gib in VLLM_POINTS:
        # the PR's logs are of vLLM's main branch between 0.6.4 and 0.6.5: V0, before the V1 worker's
        # accounting formulas/serving/vllm_profile.py models (0.9 on)
        setup = InferenceSetup(engine=Engine.VLLM, context=8192, tp=tp, engine_version="0.6")
        fit = serving_fit(spec, setup, int(79.22 * GiB))  # the pool vLLM carves out of that GPU
        pool = fit.pool_bytes
        w = fit.estimate.by_category()[Category.PARAMETERS]
        assert isinstance(pool, int)
        out.append(
            f"| {pid} | {weights_gib:.2f} | {w / GiB:.2f} | {kv_gib:.2f} | {pool / GiB:.2f} "
            f"| {pool / GiB / kv_gib - 1:+.1%} |"
        )
    return out


def main(argv: list[str]) -> int:
    from _validation import present_or_skip

    path = present_or_skip(Path(argv[1]) if len(argv) > 1 else DEFAULT_PATH, "accuracy_infer.py")
    table = rows(path)
    print("| id | model | context | measured MiB | predicted MiB | error | decode peak MiB | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(
            f"| {r['id']} | {r['model']} | {r['context']} | {r['measured_mib']:,.0f} "
            f"| {r['predicted_mib']:,.0f} | {r['error']:+.2%} | {r['decode_peak_mib']:,.0f} "
            f"| {r['decode_peak_error']:+.2%} |"
        )
    print("\nvLLM profiling logs (Llama-3-8B, informative):\n")
    print("| id | weights GiB | predicted | KV pool GiB | predicted | error |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(vllm_rows()))
    errors = [abs(float(str(r["error"]))) for r in table]
    worst = max(errors) if errors else 0.0
    mean = sum(errors) / max(1, len(errors))
    print(f"\nQwen3 speed benchmark: {len(table)} points; mean |error| {mean:.2%}, worst {worst:.2%}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
