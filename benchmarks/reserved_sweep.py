"""Analytic reserved vs simulate's allocator replay over a sweep of sequence lengths (issue 16).

``benchmarks/reserved_vs_replay.py`` compares the two at one setup per model (seq = min(context, 2048)).
The reserved peak is a step function of the request sizes: a segment is reused or a new one is cut
depending on whether a freed block happens to fit, so one sequence length can land on a coincidence
that the other sequence lengths around it do not share. This sweeps the four models issue 16 names over
several lengths (mixed-bf16, AdamW foreach, batch 1, SDPA: the defaults) and prints, per point,
simulate's reserved, the analytic estimate's likely reserved and its band, and the gap
``simulated / analytic - 1``. Writes ``reserved_sweep.json`` beside it (read by
``tests/test_step_sequence.py``). Needs torch + transformers; ~7 min on 2 cores.

    PYTHONPATH=src .venv/bin/python benchmarks/reserved_sweep.py [--out benchmarks/reserved_sweep.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import warnings
from pathlib import Path

SWEEP = {  # model -> sequence lengths (the catalog default, 2048 or the context, among them)
    "qwen3-0.6b": (1536, 1792, 2048, 2304, 2560, 3072),
    "llama-3.2-1b": (1536, 2048, 2560, 3072),
    "gemma-3-1b": (1536, 2048, 2560, 3072),
    "gpt2-xl": (512, 768, 1024),
}
TOLERANCE = 0.03  # issue 16
GiB = 2**30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).with_name("reserved_sweep.json")))
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from peakmem import catalog
    from peakmem.estimate import estimate_training
    from peakmem.resolve import resolve_model
    from peakmem.simulate import simulate_training
    from peakmem.training import TrainingSetup

    rows = []
    print(f"{'model':<14} {'seq':>5} {'simulated':>10} {'analytic':>10} {'gap':>7} {'band':>17} inside")
    for name, seqs in SWEEP.items():
        config = dict(catalog.get_model(name).config)
        spec = resolve_model(name)
        for seq in seqs:
            setup = TrainingSetup(seq_len=seq)
            sim = simulate_training(config, setup, model_name=name).peak_reserved_bytes
            est = estimate_training(spec, setup)
            band = est.band.reserved if est.band is not None else None
            lo, hi = (band.low, band.high) if band else (est.peak_reserved_bytes,) * 2
            analytic = est.peak_reserved_bytes
            gap = sim / analytic - 1
            rows.append({
                "model": name, "seq": seq, "simulated_reserved": sim, "analytic_reserved": analytic,
                "band_low": lo, "band_high": hi,
            })  # fmt: skip
            inside = "yes" if lo <= sim <= hi else "NO"
            print(f"{name:<14} {seq:>5} {sim / GiB:>9.2f}G {analytic / GiB:>9.2f}G {gap:>+7.1%} "
                  f"{lo / GiB:>7.2f}-{hi / GiB:>6.2f}G  {inside}", flush=True)  # fmt: skip
    gaps = [abs(r["simulated_reserved"] / r["analytic_reserved"] - 1) for r in rows]
    within = sum(g <= TOLERANCE for g in gaps)
    inside_band = sum(r["band_low"] <= r["simulated_reserved"] <= r["band_high"] for r in rows)
    print(f"{within} of {len(gaps)} within {TOLERANCE:.0%}; median |gap| {statistics.median(gaps):.1%}; "
          f"inside the band {inside_band}")  # fmt: skip
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
