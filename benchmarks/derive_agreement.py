"""Formulas vs derived path on every family the formulas know (issue 14: "agrees within 2%").

For each model type :mod:`peakmem.hf` builds a spec for, the same tiny config
(``tests/tiny_models.py`` ``FAMILY_CONFIGS``) goes through both paths
(:func:`peakmem.resolve.spec_for_config` with ``path="formulas"`` and ``path="derived"``) and through
``peakmem simulate`` (fake tensors, an exact training step: the arbiter where the two disagree), in the
setups of the tests (``tests/_derive_agreement.py``). Writes a Markdown table.

    PYTHONPATH=src python benchmarks/derive_agreement.py [--no-simulate] [--out FILE.md] [FAMILY ...]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-simulate", action="store_true", help="skip the simulate column")
    ap.add_argument("--out", default=str(HERE / "derive_agreement.md"))
    ap.add_argument("families", nargs="*")
    args = ap.parse_args()
    os.environ.setdefault("PEAKMEM_DERIVED_CACHE", tempfile.mkdtemp(prefix="peakmem-derived-"))
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from _derive_agreement import BATCH, SEQ, SETUPS, TOLERANCE
    from peakmem.estimate import estimate_training
    from peakmem.hf import SUPPORTED_MODEL_TYPES
    from peakmem.resolve import spec_for_config
    from peakmem.simulate import deriver, measuring_lookup
    from peakmem.simulate.runner import simulate_training
    from peakmem.training import TrainingSetup
    from tiny_models import FAMILY_CONFIGS

    lines = [
        "# Formulas vs derived path, every family the formulas know",
        "",
        f"Tiny configs (`tests/tiny_models.py` FAMILY_CONFIGS), mixed-bf16 AdamW, batch {BATCH} x seq {SEQ}, "
        "CUDA kernel policy; peak allocated bytes; diff = (derived - formulas) / formulas; "
        "sim = `peakmem simulate` (fake-tensor training step), the arbiter; "
        f"**bold**: outside {TOLERANCE:.0%}. Written by `benchmarks/derive_agreement.py`.",
        "",
        "| family | params equal | "
        + " | ".join(f"{s}: diff | {s}: formulas/sim | {s}: derived/sim" for s in SETUPS)
        + " | s |",
        "|---|---|" + "---:|---:|---:|" * len(SETUPS) + "---:|",
    ]
    for family in SUPPORTED_MODEL_TYPES:
        if args.families and family not in args.families:
            continue
        config = FAMILY_CONFIGS.get(family)
        if config is None:
            lines.append(
                f"| {family} | excluded (see tests/test_derive_agreement.py EXCLUDED) |"
                + " |" * (3 * len(SETUPS) + 1)
            )
            continue
        t0 = time.perf_counter()
        f = spec_for_config(dict(config), path="formulas")
        d = spec_for_config(dict(config), path="derived", derive=deriver())
        cells = [family, "yes" if f.params == d.params else f"**no** ({f.params:,} vs {d.params:,})"]
        for kw in SETUPS.values():
            setup = TrainingSetup(seq_len=SEQ, micro_batch=BATCH, **kw)
            pf = estimate_training(f, setup).peak_allocated_bytes
            pd = estimate_training(d, setup, costs=measuring_lookup()).peak_allocated_bytes
            diff = (pd - pf) / pf
            cells.append(f"**{diff:+.2%}**" if abs(diff) > TOLERANCE else f"{diff:+.2%}")
            if args.no_simulate:
                cells += ["", ""]
                continue
            try:
                ps = simulate_training(dict(config), setup).peak_allocated_bytes
                cells += [f"{pf / ps:.3f}", f"{pd / ps:.3f}"]
            except Exception as err:  # a model simulate cannot run: say so in the row
                cells += [f"failed: {type(err).__name__}", ""]
        cells.append(f"{time.perf_counter() - t0:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
