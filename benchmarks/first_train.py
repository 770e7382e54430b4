"""Wall time of a new family's first ``peakmem train`` and of the same command again (issues 14, 33).

Target: at most 15 s the first time on a laptop's 2 CPU cores for a dense or MoE transformer, at most
1 s after (cached); hybrids (Mamba-2 / gated-delta-net layers) are reported beside them. "New" as a
user with torch meets it: a model type the formulas do not know, no shipped derived data, an empty
cache. Each command runs in a fresh process with the package's shipped derived data hidden (its
folder pointed at an empty one) and its own empty cache, so the first run derives the spec and
measures the block costs of the setup asked for (``peakmem train`` defaults: full fine-tuning,
mixed-bf16 AdamW, batch 1 x seq 2048 or the model's limit); the second reads them back.

    PYTHONPATH=src python benchmarks/first_train.py [NAMES...]

Without names: one model of each model type the package ships derived data for (the catalog's
derived models). Prints a table: model, its type and kind (dense, moe, hybrid), parameter count,
first and cached seconds, whether the targets hold, what the ways down left unmeasured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

FIRST_TARGET_S = 15.0
CACHED_TARGET_S = 1.0
# hide the shipped data: the run is then a model peakmem has never seen
_RUN = (
    "import pathlib, sys; import peakmem.block_costs as d; d.SHIPPED = pathlib.Path(sys.argv[1]); "
    "from peakmem.cli import main; sys.exit(main(sys.argv[2:]))"
)


class NotAnswered(Exception):
    """The command exited with an input error (e.g. transformers cannot build the type here)."""


def timed(argv: list[str], env: dict[str, str], empty: str) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-c", _RUN, empty, *argv]
    done = subprocess.run(cmd, env=env, capture_output=True, check=False)
    took = time.perf_counter() - t0
    if done.returncode == 2:  # an input error: its one line says why (e.g. a library missing here)
        error = [line for line in done.stderr.decode().splitlines() if "error:" in line]
        raise NotAnswered(error[-1].split("error: ", 1)[-1][:120] if error else "exit 2")
    if done.returncode not in (0, 1):
        raise SystemExit(f"peakmem {' '.join(argv)}: exit {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took, json.loads(done.stdout)


def shipped() -> dict[str, dict[str, Any]]:
    """One shipped derived file per model type: name -> its parsed file."""
    import peakmem.block_costs as costs

    out: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for path in sorted(costs.SHIPPED.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        kind = doc["config"].get("model_type")
        if kind not in seen:
            seen.add(kind)
            out[path.stem] = doc
    return out


# Model types whose layers hold a recurrent mixer (Mamba-2 in Falcon-H1 beside attention and in Granite-4.0-H
# and Jamba between attention layers; gated delta net in Qwen3-Next / Qwen3.5): their fake steps run the
# torch fallback of the mixer's scan, which the issue asks to report beside the dense and MoE families.
HYBRID_TYPES = frozenset(
    {"falcon_h1", "granitemoehybrid", "jamba", "nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_moe"}
)


def kind_of(doc: dict[str, Any]) -> str:
    """hybrid (a recurrent mixer), moe (routed experts in some layer) or dense."""
    if doc["config"].get("model_type") in HYBRID_TYPES:
        return "hybrid"
    layers = [group["layer"] for group in doc["spec"].get("groups", [])]
    return "moe" if any(layer.get("mlp", {}).get("num_experts") for layer in layers) else "dense"


def main() -> None:
    from peakmem.catalog import get_model

    files = shipped()
    names = sys.argv[1:] or list(files)
    print(f"| model | model_type | kind | parameters | first s (<= {FIRST_TARGET_S:.0f}) | cached s "
          f"(<= {CACHED_TARGET_S:.0f}) | targets | ways not measured |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---|---|")
    for name in names:
        config = dict(get_model(name).config)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(config, f)
            empty = os.path.join(tmp, "no-shipped-data")
            os.mkdir(empty)
            env = {**os.environ, "PEAKMEM_DERIVED_CACHE": os.path.join(tmp, "cache")}
            argv = ["train", path, "--json"]
            try:
                first, out = timed(argv, env, empty)
                cached, _ = timed(argv, env, empty)
            except NotAnswered as why:
                print(f"| {name} | {config.get('model_type')} | - | - | - | - | - | not answered: {why} |")
                continue
        params = out["model"]["params"] if "model" in out else 0
        kind = kind_of(files[name]) if name in files else "?"
        held = "yes" if first <= FIRST_TARGET_S and cached <= CACHED_TARGET_S else "no"
        print(f"| {name} | {config.get('model_type')} | {kind} | {params:,} | {first:.1f} | {cached:.1f} | "
              f"{held} | {', '.join(out.get('ways_not_measured', [])) or '-'} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
