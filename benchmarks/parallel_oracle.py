"""Parallel layouts: peakmem's per-rank estimate against the execution oracle (issue 27).

    .venv/bin/python benchmarks/parallel_oracle.py [--filter S] [--gpipe] [--precision fp32|mixed-bf16]

For every layout of :data:`peakmem.measure.parallel.GRID` (FSDP2, TP, PP, their products up to
TP2 x PP2 x FSDP2 on 8 ranks; CP2 alone, with FSDP2 over dp x cp and with TP2, as torch's
``context_parallel`` runs it: :mod:`peakmem.measure.parallel_cp`) and every rank type (one rank per
pipeline stage), runs the real PyTorch parallel code for that rank over torch's fake process group on CPU
(:func:`peakmem.measure.parallel.measure_rank`) and prints, per phase, the oracle's peak, the estimate
(``KernelPolicy.CPU``) and the error. ``--gpipe`` adds the pipeline layouts under GPipe (oracle
only: peakmem has no GPipe schedule). Needs torch and transformers (the ``torch`` extra).
"""

from __future__ import annotations

import argparse
import time

from peakmem.measure.parallel import GRID, TINY_LLAMA, PhaseCheck, compare_rank, describe, rank_types, table
from peakmem.parallel import FsdpMode
from peakmem.training import KernelPolicy, OptimizerImpl, Precision, TrainingSetup

TOLERANCE = 0.03  # issue 27's done-when


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--filter", default="", help="only layouts whose name contains this")
    ap.add_argument("--gpipe", action="store_true", help="also run the pipeline layouts under GPipe")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "mixed-bf16"))
    ap.add_argument("--grad-accum", type=int, default=2, help="micro-batches per step (>= pp for 1F1B)")
    args = ap.parse_args(argv)
    setup = TrainingSetup(
        precision=Precision(args.precision), micro_batch=2, seq_len=64, grad_accum=args.grad_accum,
        kernel_policy=KernelPolicy.CPU, optimizer_impl=OptimizerImpl.FOREACH,
    )  # fmt: skip
    rows: list[PhaseCheck] = []
    t0 = time.perf_counter()
    for par in GRID:
        schedules = ("1f1b", "gpipe") if args.gpipe and par.pp > 1 else ("1f1b",)
        for schedule in schedules:
            if args.filter not in describe(par, schedule):
                continue
            if setup.precision is Precision.MIXED_BF16 and par.fsdp is FsdpMode.NONE:
                continue  # the oracle's mixed precision is FSDP2's MixedPrecisionPolicy
            for rank in rank_types(par):
                rows.extend(compare_rank(TINY_LLAMA, setup, par, rank, schedule=schedule))
    print(
        f"tiny Llama (hidden 128, 2 layers, vocab 512), {setup.precision.value}, AdamW foreach, "
        f"micro-batch {setup.micro_batch} x seq {setup.seq_len}, {setup.grad_accum} micro-batches per step"
    )
    print(table(rows, TOLERANCE))
    print(f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
