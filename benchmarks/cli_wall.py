"""Wall time of CLI answers, as a user runs them (a fresh process each time).

Target (issue 2): `peakmem info gpt2-xl` and `peakmem info path/to/config.json` under 0.5 s.
Prints a table: command, best and median of N runs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 7
TARGET_S = 0.5


def wall(argv: list[str]) -> list[float]:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "peakmem", *argv], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    from peakmem.catalog import get_model

    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(dict(get_model("llama-3.1-8b").config)))
        commands = [
            ["info", "gpt2-xl"],
            ["info", str(config)],
            ["info", "deepseek-v3", "--json"],
            ["train", "gpt2-xl", "--precision", "mixed-fp16", "--seq", "1024"],
            ["infer", "llama-3.1-8b", "--context", "8192"],
        ]
        print(f"{'command':60} {'best':>8} {'median':>8}  target {TARGET_S} s")
        for argv in commands:
            times = wall(argv)
            label = "peakmem " + " ".join(a if a != str(config) else "path/to/config.json" for a in argv)
            ok = "ok" if min(times) < TARGET_S else "SLOW"
            print(f"{label:60} {min(times):8.3f} {statistics.median(times):8.3f}  {ok}")


if __name__ == "__main__":
    main()
