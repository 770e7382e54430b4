"""Speed report: setups estimated per second on one core, and the wall time of ``fit`` and ``plan``.

    .venv/bin/python benchmarks/speed.py [--seconds S] [--profile]

Every estimate is a distinct setup: no (micro-batch, sequence, checkpointing) repeats within a
measurement (48,000 setups per model, each estimated at most once), so no memo of whole answers could
help; what does not depend on the shapes is memoised per spec, as it is for the planner. The process
is pinned to one core where the OS allows it. ``--profile`` prints where ``estimate_training`` spends
its time (cProfile, top functions by own time).
Target (issue 6): >= 20,000 setups/s and ``plan llama-3.1-405b --gpu h100-80gb --max-gpus 1024``
under 2 s.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import os
import pstats
import time
from collections.abc import Callable
from dataclasses import replace

from peakmem import planner
from peakmem.estimate import estimate_training
from peakmem.formulas import step_time as st
from peakmem.parallel import Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.resolve import resolve_gpu, resolve_gpus, resolve_model
from peakmem.training import Checkpointing, TrainingSetup

TARGET_PER_S = 20_000
TARGET_PLAN_S = 2.0


def _rate(fn: Callable[[int], object], seconds: float) -> tuple[float, int]:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(50):
            fn(n)
            n += 1
    return n / (time.perf_counter() - t0), n


def _setups(base: TrainingSetup) -> list[TrainingSetup]:
    """64 micro-batches x 250 sequence lengths (32 to 8000) x 3 checkpointing modes, all distinct."""
    return [
        replace(base, micro_batch=mb, seq_len=seq, checkpointing=ck)
        for mb, seq, ck in itertools.product(range(1, 65), range(32, 8001, 32), tuple(Checkpointing))
    ]


def _distinct_rate(fn: Callable[[TrainingSetup], object], setups: list[TrainingSetup],
                   seconds: float) -> tuple[float, int]:  # fmt: skip
    """Estimates per second over the setups in order, each at most once, for ``seconds`` at most."""
    n, t0 = 0, time.perf_counter()
    while n < len(setups) and time.perf_counter() - t0 < seconds:
        for s in setups[n : n + 50]:
            fn(s)
        n = min(n + 50, len(setups))
    return n / (time.perf_counter() - t0), n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per rate measurement")
    ap.add_argument("--profile", action="store_true", help="profile estimate_training")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    print("single-GPU estimator (estimate_training), distinct setups on one core:")
    setups = _setups(TrainingSetup())
    for name in ("gpt2-xl", "llama-3.1-8b", "llama-3.1-405b"):
        spec = resolve_model(name)
        # learned positions (GPT-2 XL: 1,024) refuse a longer sequence: those setups are left out
        runs = [s for s in setups if spec.position != "learned" or s.seq_len <= spec.max_position_embeddings]
        rate, n = _distinct_rate(lambda s, spec=spec: estimate_training(spec, s), runs, args.seconds)
        flag = "ok" if rate >= TARGET_PER_S else f"below the {TARGET_PER_S:,}/s target"
        print(f"  {name:16s} {rate:10,.0f} setups/s  ({n} estimates; {flag})")

    print("per-rank estimator (estimate_ranks), llama-3.1-405b:")
    spec = resolve_model("llama-3.1-405b")
    setup = TrainingSetup(checkpointing=Checkpointing.FULL, grad_accum=16)
    for par in (Parallelism(gpus=1024, tp=8, pp=16, zero_stage=1, sequence_parallel=True),
                Parallelism(gpus=512, tp=8, zero_stage=3, sequence_parallel=True)):  # fmt: skip
        rate, n = _rate(lambda i, par=par: estimate_ranks(spec, replace(setup, micro_batch=1 + i % 8), par),
                        args.seconds)  # fmt: skip
        print(f"  {par.describe():40s} {rate:10,.0f} layouts/s")

    print("step-time model (layouts scored, arithmetic only):")
    sf = st.spec_flops(spec)
    rates = st.rates_for(resolve_gpu("h100-80gb"))
    lay = st.Layout(gpus=1024, tp=8, pp=16, engine="zero-1")

    def score(i: int) -> object:
        s = replace(setup, micro_batch=1 + i % 8)
        return st.step_time(sf, s, rates, lay, trainable_params=spec.params, params=spec.params)

    rate, _ = _rate(score, args.seconds)
    print(f"  {rate:10,.0f} layouts/s")

    gpt2 = resolve_model("gpt2-xl")
    t0 = time.perf_counter()
    fr = planner.fit(gpt2, TrainingSetup(seq_len=1024), resolve_gpus("8GB,16GB,24GB,40GB"))
    print(
        f"fit gpt2-xl --gpu 8GB,16GB,24GB,40GB: {time.perf_counter() - t0:.3f} s, "
        f"{fr.estimates} setups estimated"
    )

    t0 = time.perf_counter()
    pr = planner.plan(spec, TrainingSetup(), resolve_gpu("h100-80gb"), 1024)
    wall = time.perf_counter() - t0
    flag = "ok" if wall < TARGET_PLAN_S else f"above the {TARGET_PLAN_S} s target"
    print(f"plan llama-3.1-405b --gpu h100-80gb --max-gpus 1024: {wall:.3f} s ({flag}); "
          f"{pr.scored:,} layouts scored, {pr.estimates} estimated, {len(pr.layouts)} shown")  # fmt: skip

    if args.profile:
        spec8 = resolve_model("llama-3.1-8b")
        prof = cProfile.Profile()
        prof.enable()
        for s in setups[:5000]:
            estimate_training(spec8, s)
        prof.disable()
        print("\nestimate_training, llama-3.1-8b, by own time:")
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
