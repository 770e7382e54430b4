"""Wall time of CLI answers, as a user runs them (a fresh process each time).

Targets: `peakmem info gpt2-xl` and `peakmem info path/to/config.json` under 0.5 s (issue 2);
`peakmem plan llama-3.1-405b --gpu h100-80gb --max-gpus 1024` and `peakmem fit gpt2-xl --gpu 24GB
--seq 1024` under 1 s (issue 13). Prints a table: command, best and median of N runs, its target.
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
SEARCH_TARGET_S = 1.0  # the planner's searches (fit, plan)


def wall(argv: list[str]) -> list[float]:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "peakmem", *argv], check=False, capture_output=True)
        if done.returncode not in (0, 1):  # 1: does not fit, an answer too
            raise SystemExit(f"peakmem {' '.join(argv)}: exit {done.returncode}: {done.stderr.decode()}")
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
            ["fit", "gpt2-xl", "--gpu", "24GB", "--seq", "1024"],
            ["plan", "llama-3.1-405b", "--gpu", "h100-80gb", "--max-gpus", "1024"],
        ]
        print(f"{'command':72} {'best':>8} {'median':>8}  target")
        for argv in commands:
            times = wall(argv)
            target = SEARCH_TARGET_S if argv[0] in ("fit", "plan") else TARGET_S
            label = "peakmem " + " ".join(a if a != str(config) else "path/to/config.json" for a in argv)
            ok = "ok" if min(times) < target else "SLOW"
            print(f"{label:72} {min(times):8.3f} {statistics.median(times):8.3f}  {target} s {ok}")


if __name__ == "__main__":
    main()
