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

from peakmem.catalog import get_model
from peakmem.formulas.serving import estimate_inference
from peakmem.hf import spec_from_config
from peakmem.inference import InferenceSetup
from peakmem.units import MiB

TOLERANCE = 0.05
GENERATED = 2048  # the benchmark generates 2048 tokens after each input
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published-measurements.json"


def rows(path: Path) -> list[dict[str, object]]:
    points = json.loads(path.read_text())
    out = []
    for p in points:
        if not str(p["id"]).startswith("QWEN3-INF"):
            continue
        name = str(p["model"]).lower()
        spec = spec_from_config(get_model(name).config, name=name)
        context = int(p["seq_len"])
        setup = InferenceSetup(weights="bf16", context=context, prompt=context - GENERATED, batch=1)
        est = estimate_inference(spec, setup)
        steady = est.extra["steady_state_bytes"]
        assert isinstance(steady, int)
        decode = next(ph.bytes for ph in est.phases if ph.phase.value == "decode")
        measured = float(p["value"]) * MiB
        out.append(
            {
                "id": p["id"], "model": p["model"], "context": context, "measured_mib": float(p["value"]),
                "predicted_mib": steady / MiB, "error": steady / measured - 1,
                "decode_peak_mib": decode / MiB, "decode_peak_error": decode / measured - 1,
                "peak_phase": est.peak_phase.value, "peak_allocated_mib": est.peak_allocated_bytes / MiB,
            }
        )  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else DEFAULT_PATH
    table = rows(path)
    print("| id | model | context | measured MiB | predicted MiB | error | decode peak MiB | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(
            f"| {r['id']} | {r['model']} | {r['context']} | {r['measured_mib']:,.0f} "
            f"| {r['predicted_mib']:,.0f} | {r['error']:+.2%} | {r['decode_peak_mib']:,.0f} "
            f"| {r['decode_peak_error']:+.2%} |"
        )
    errors = [abs(float(str(r["error"]))) for r in table]
    worst = max(errors) if errors else 0.0
    print(f"\n{len(table)} points; mean |error| {sum(errors) / max(1, len(errors)):.2%}, worst {worst:.2%}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
