"""Wall time of a new family's first ``peakmem train`` and of the same command again (issue 14).

Target: at most 60 s the first time on a laptop's 2 CPU cores, at most 2 s after (cached). "New" as a
user with torch meets it: a model type the formulas do not know, no shipped derived data, an empty
cache. Each command runs in a fresh process with the package's shipped derived data hidden (its
folder pointed at an empty one) and its own empty cache, so the first run derives the spec and
measures the block costs of the setup asked for (``peakmem train`` defaults: full fine-tuning,
mixed-bf16 AdamW, batch 1 x seq 2048 or the model's limit); the second reads them back.

    PYTHONPATH=src python benchmarks/first_train.py [NAMES...]

Prints a table: model, its type and parameter count, first and cached seconds, what the ways
down left unmeasured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

DEFAULT = (
    "smollm3-3b",
    "phi-2",
    "olmoe-1b-7b-0924",
    "gpt-oss-20b",
    "falcon-h1-7b",
    "granite-4.0-h-small",
    "qwen3-next-80b-a3b",
    "qwen3.5-27b",
    "llama-4-scout",
    "gemma-4-26b-a4b",
    "deepseek-v3.2",
    "glm-4.5-air",
)
FIRST_TARGET_S = 60.0
CACHED_TARGET_S = 2.0
# hide the shipped data: the run is then a model peakmem has never seen
_RUN = (
    "import pathlib, sys; import peakmem.block_costs as d; d.SHIPPED = pathlib.Path(sys.argv[1]); "
    "from peakmem.cli import main; sys.exit(main(sys.argv[2:]))"
)


def timed(argv: list[str], env: dict[str, str], empty: str) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-c", _RUN, empty, *argv]
    done = subprocess.run(cmd, env=env, capture_output=True, check=False)
    took = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"peakmem {' '.join(argv)}: exit {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took, json.loads(done.stdout)


def main() -> None:
    from peakmem.catalog import get_model

    names = sys.argv[1:] or list(DEFAULT)
    print(f"| model | model_type | parameters | first s (<= {FIRST_TARGET_S:.0f}) | cached s "
          f"(<= {CACHED_TARGET_S:.0f}) | ways not measured |")  # fmt: skip
    print("|---|---|---:|---:|---:|---|")
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
            first, out = timed(argv, env, empty)
            cached, _ = timed(argv, env, empty)
        params = out["model"]["params"] if "model" in out else 0
        print(f"| {name} | {config.get('model_type')} | {params:,} | {first:.1f} | {cached:.1f} | "
              f"{', '.join(out.get('ways_not_measured', [])) or '-'} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
