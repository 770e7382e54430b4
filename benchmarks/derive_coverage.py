"""Coverage of the derived path (issue 14): every causal-LM model type of transformers' auto mapping.

For each type in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: build its default config (shrunk to tiny
sizes where that still builds) on the meta device, derive the spec, and check its parameter count
against the built model. Then, for up to ``--parity N`` of the types the formulas do not know, a
real CPU training step (``peakmem measure``, fp32, CPU kernels) against the derived estimate.

    PYTHONPATH=src python benchmarks/derive_coverage.py [--parity 25] [--out benchmarks/derive_coverage.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parity", type=int, default=25)
    ap.add_argument("--out", default=str(Path(__file__).with_name("derive_coverage.md")))
    args = ap.parse_args()
    os.environ.setdefault("PEAKMEM_DERIVED_CACHE", tempfile.mkdtemp(prefix="peakmem-derived-"))
    warnings.filterwarnings("ignore")
    from peakmem.errors import InputError
    from peakmem.estimate import estimate_training
    from peakmem.hf import SUPPORTED_MODEL_TYPES
    from peakmem.measure.runner import measure_training
    from peakmem.simulate import derive, measuring_lookup
    from peakmem.training import TrainingSetup

    costs = measuring_lookup()

    rows = []
    t0 = time.perf_counter()
    for mt in derive.causal_lm_types():
        status, why, params = derive.check_type(mt)
        rows.append((mt, status, why, params))
    t_cov = time.perf_counter() - t0
    ok = [r for r in rows if r[1] == "ok"]
    lines = [
        "# Derived-path coverage (transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)",
        "",
        f"{len(ok)} of {len(rows)} model types build and get the exact parameter count "
        f"({t_cov:.0f} s for all).",
        "",
        "| model_type | result | parameters | why not |",
        "|---|---|---:|---|",
    ]
    lines += [f"| {mt} | {st} | {p:,} | {why} |" for mt, st, why, p in rows]
    setup = TrainingSetup(precision="fp32", seq_len=64, micro_batch=2, kernel_policy="cpu")
    ratios = []
    prow = ["", "## Parity: derived estimate vs a real CPU step (fp32, batch 2 x 64)", ""]
    prow += [
        "| model_type | derived | measured | ratio | first s | cached s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mt, st, _, _ in rows:
        if len(ratios) >= args.parity:
            break
        if st != "ok" or mt in SUPPORTED_MODEL_TYPES:
            continue
        try:
            config = derive.tiny_config(mt)
            config.pop("architectures", None)
            t1 = time.perf_counter()
            spec = derive.derive_spec(config)
            run = setup if "sdpa" in spec.attention_kernels else replace(setup, attention="eager")
            try:
                t1 = time.perf_counter()
                est = estimate_training(derive.derive_spec(config), run, costs=costs).peak_allocated_bytes
            except InputError as err:  # torch's meta grouped_mm (MoE experts) takes bf16 only
                if "grouped_mm" not in str(err):
                    raise
                run = replace(run, precision="bf16")
                t1 = time.perf_counter()
                est = estimate_training(derive.derive_spec(config), run, costs=costs).peak_allocated_bytes
            t2 = time.perf_counter()
            estimate_training(derive.derive_spec(config), run, costs=costs)
            t3 = time.perf_counter()
            real = measure_training(config, run, device="cpu").peak_allocated_bytes
        except Exception as err:
            why = " ".join(str(err).split()).replace("|", "/")[:100]
            prow.append(f"| {mt} | failed: {type(err).__name__}: {why} | | | | |")
            continue
        ratios.append(est / real)
        prow.append(f"| {mt} | {est:,} | {real:,} | {est / real:.4f} | {t2 - t1:.1f} | {t3 - t2:.1f} |")
        print(prow[-1], flush=True)
    if ratios:
        errs = [abs(r - 1) for r in ratios]
        prow += [
            "",
            f"{len(ratios)} types: median |error| {statistics.median(errs):.2%}, worst {max(errs):.2%}",
        ]
    Path(args.out).write_text("\n".join(lines + prow) + "\n")
    print("\n".join(prow[-1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
