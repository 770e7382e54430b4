"""Wall and CPU time of ``plan`` / ``train`` at 70B-405B scale, and a byte-identity check of their answers.

    .venv/bin/python benchmarks/plan_speed.py [--src DIR] [--runs N] [--save DIR] [--against DIR] [--more]

Each command runs as a user runs it (a fresh ``python -m peakmem`` process, ``PYTHONPATH`` = ``--src``,
default this checkout's ``src``), ``--runs`` times; printed: the best and median wall time and the best
user+sys CPU time of the child (``resource.getrusage(RUSAGE_CHILDREN)``; CPU time is steadier than wall
time on a shared machine). ``--save DIR`` writes each command's stdout (``--json`` answers) and
``benchmarks/published_scale.py``'s markdown there; ``--against DIR`` compares them byte for byte with a
directory saved the same way from another tree (e.g. main before a speed change; ``plan --json``'s
``elapsed_s``, a wall time, is left out), and the published-scale
markdown with ``benchmarks/published_scale.md`` apart from that file's first line (its generated-by comment).

Measured 2026-12-06 on the shared 2-core machine (load average 6-7 from other sessions' test runs, so the
wall times are inflated; CPU seconds, best of 3), main at 9969693 against h-planspeed (which also had a
hand-inlined allocator loop, ~1.3x faster, not merged: main keeps the plain one; plan 70B with the floor
alone measured 1.20-1.26 s of CPU):

| command | main CPU s | h-planspeed CPU s | answers |
|---|---:|---:|---|
| plan llama-3.1-70b --max-gpus 64 --seq 8192 | 3.62 | 1.13 | identical |
| plan llama-3.1-405b --max-gpus 128 --seq 8192 | 3.52 | 1.26 | identical |
| plan llama-3.1-405b --max-gpus 256 --seq 8192 | 6.22 | 1.53 | identical |
| train llama-3.1-70b FSDP32 x TP8 (published_scale's) | 0.63 | 0.61 | identical |
| train llama-3.1-405b FSDP8 x TP8 x PP8 | 0.44 | 0.46 | identical |
| published_scale.py (98 points) | 2.84 | 2.39 | identical, = published_scale.md |

Where the time went: plan 70B replayed 41 sharded steps of 80 layers (2 steps x 2 micro-batches, ~27,000
allocator requests each: 2.3-2.9 s of the 3.6-4.3 s); 39 of them were layouts whose closed-form floor
already exceeds the GPU, now ruled out unreplayed (planner/search.py ``floor_needed``).

To time and save a baseline tree: ``git archive main src benchmarks | tar -x -C /tmp/base`` then
``python benchmarks/plan_speed.py --src /tmp/base/src --save /tmp/base-out``.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = 3

# the layouts of benchmarks/published_scale.json tt2412-t4-70b-fsdp32-tp8 and
# tt2412-t5-405b-fsdp8-tp8-pp8-1f1b, as published_scale.train_options maps them
_TORCHTITAN = ["--precision", "float8-tensorwise", "--optimizer", "adamw", "--optimizer-impl", "foreach",
               "--seq", "8192", "--checkpointing", "full", "--compile", "--loss", "standard",
               "--attention", "sdpa", "--fsdp", "full-shard", "--fsdp-version", "2", "--sp"]  # fmt: skip
_PLAN = ["--gpu", "h100", "--seq", "8192", "--json"]
COMMANDS: dict[str, list[str]] = {
    "plan-70b-64": ["plan", "llama-3.1-70b", "--max-gpus", "64", *_PLAN],
    "plan-405b-128": ["plan", "llama-3.1-405b", "--max-gpus", "128", *_PLAN],
    "plan-405b-256": ["plan", "llama-3.1-405b", "--max-gpus", "256", *_PLAN],
    "train-70b-fsdp32-tp8": ["train", "llama-3.1-70b", *_TORCHTITAN, "--batch", "16", "--gpus", "256",
                             "--tp", "8", "--json"],
    "train-405b-fsdp8-tp8-pp8": ["train", "llama-3.1-405b", *_TORCHTITAN, "--batch", "4", "--gpus", "512",
                                 "--tp", "8", "--pp", "8", "--grad-accum", "8", "--pp-schedule", "1f1b",
                                 "--float8-all-gather", "--json"],
}  # fmt: skip
# other answers the planner's search gives (``--more``): fit's ways and limits on sharded layouts, plan on an
# MoE model and on small GPUs, the ways down that ``train`` prints
MORE: dict[str, list[str]] = {
    "fit-70b-fsdp8": ["fit", "llama-3.1-70b", "--gpu", "h100", "--gpus", "8", "--fsdp", "full-shard",
                      "--seq", "8192", "--json"],
    "fit-8b-zero3": ["fit", "llama-3.1-8b", "--gpu", "24GB", "--gpus", "4", "--zero", "3", "--json"],
    "fit-gpt2-xl": ["fit", "gpt2-xl", "--gpu", "24GB", "--seq", "1024", "--json"],
    "train-70b-fsdp16-ways": ["train", "llama-3.1-70b", "--gpus", "16", "--fsdp", "full-shard",
                              "--seq", "4096", "--gpu", "h100", "--json"],
    "plan-8b-4090": ["plan", "llama-3.1-8b", "--gpu", "rtx-4090", "--max-gpus", "8", "--json"],
    "plan-72b-a100": ["plan", "qwen2.5-72b", "--gpu", "a100-80gb", "--max-gpus", "32", "--json"],
    "plan-mixtral": ["plan", "mixtral-8x7b", "--gpu", "h100", "--max-gpus", "16", "--json"],
}  # fmt: skip


def _run(argv: list[str], src: Path) -> tuple[float, float, bytes]:
    """(wall s, child user+sys s, stdout) of one fresh process."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], check=False, capture_output=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # 1: does not fit, an answer too
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.decode()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def _comparable(out: bytes) -> bytes:
    """The answer less what is a clock, not an estimate: ``plan --json``'s ``elapsed_s`` (the search's own
    wall time) is blanked; every other byte counts."""
    return re.sub(rb'"elapsed_s": [0-9.e-]+', b'"elapsed_s": null', out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the peakmem sources to run")
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--save", type=Path, help="write each answer here")
    ap.add_argument("--against", type=Path, help="compare the answers with those saved here")
    ap.add_argument("--more", action="store_true", help="also the other searches (MORE)")
    ap.add_argument("--no-published", action="store_true", help="skip benchmarks/published_scale.py")
    args = ap.parse_args(argv)
    src = args.src.resolve()
    bench = src.parent / "benchmarks" / "published_scale.py"
    asked = {**COMMANDS, **(MORE if args.more else {})}
    jobs = {name: ["-m", "peakmem", *cmd] for name, cmd in asked.items()}
    if not args.no_published:
        jobs["published_scale.md"] = [str(bench if bench.exists() else ROOT / "benchmarks" / bench.name)]
    print(f"src: {src}")
    print(f"{'command':28} {'wall best':>9} {'median':>8} {'cpu best':>9}  identical")
    differ = 0
    for name, cmd in jobs.items():
        runs = [_run(cmd, src) for _ in range(args.runs)]
        out = runs[-1][2]
        same = "-"
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / name).write_bytes(out)
        if args.against:
            theirs = (args.against / name).read_bytes()
            ok = _comparable(theirs) == _comparable(out)
            same = "yes" if ok else "NO"
            differ += not ok
        if name == "published_scale.md":  # the committed report, less its generated-by line
            committed = (ROOT / "benchmarks" / "published_scale.md").read_bytes().split(b"\n", 1)[1]
            same += ", .md " + ("yes" if committed == out else "NO")
            differ += committed != out
        walls, cpu = [r[0] for r in runs], min(r[1] for r in runs)
        print(f"{name:28} {min(walls):9.3f} {statistics.median(walls):8.3f} {cpu:9.3f}  {same}", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
