"""Accuracy report: the analytic estimate against real CPU execution on the full parity grid.

    .venv/bin/python benchmarks/parity.py [--sample] [--selective] [--filter SUBSTRING] [--verbose]

Prints one row per case (measured peak, analytic peak, error, per-category errors at the
measured peak's phase); ``--verbose`` adds the failing details. Caches nothing on disk.
Needs torch and transformers (the ``torch`` extra).
"""

from __future__ import annotations

import argparse
import sys
import time

from peakmem.measure.parity import Comparison, analytic_available, full_grid, run_case, sampled_grid, table
from peakmem.measure.runner import measure_training


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", action="store_true", help="the sampled grid the test suite runs")
    ap.add_argument("--selective", action="store_true", help="add selective checkpointing to the grid")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    cases = [
        c
        for c in (sampled_grid() if args.sample else full_grid(selective=args.selective))
        if args.filter in c.name
    ]
    why = analytic_available()
    if why:
        print(f"{why}: measured peaks only", file=sys.stderr)
        for c in cases:
            est = measure_training(c.config, c.setup, device="cpu")
            print(f"{c.name:44} {est.peak_allocated_bytes:>10} {est.peak_phase.value}")
        return 0
    rows: list[Comparison] = []
    t0 = time.perf_counter()
    for c in cases:
        rows.append(run_case(c))
    print(table(rows))
    print(f"{len(rows)} cases in {time.perf_counter() - t0:.1f} s")
    if args.verbose:
        for r in rows:
            for f in r.failures():
                print(f"{r.case.name}: {f}")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
