"""Write the shipped derived data of models the formulas do not know (issue 14, item 4).

For each MODEL (a catalog name, a path to a config.json or a folder holding one, or a Hub id, as
``peakmem train`` takes it), derive the spec from transformers' own modules and measure its blocks'
costs in the shipped setup families, and write ``src/peakmem/catalog/derived/<name>.json``. Without
torch, ``peakmem`` then answers these models from the file (``peakmem.block_costs``). The spec carries each
SSM / linear-attention block's recurrent state per sequence (``derive.measure_state``), which inference
estimates count beside the KV cache.

    PYTHONPATH=src python benchmarks/derive_catalog.py gpt-oss-20b ./configs/falcon-h1/config.json
    PYTHONPATH=src python benchmarks/derive_catalog.py --all-unsupported   # every catalog entry hf.py lacks
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "peakmem" / "catalog" / "derived"


def file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") + ".json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="catalog names, config.json paths or Hub ids")
    ap.add_argument("--all-unsupported", action="store_true", help="every catalog model hf.py does not know")
    ap.add_argument("--families", default="", help="comma-separated setup families (default: shipped set)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    from peakmem.catalog import MODELS
    from peakmem.hf import SUPPORTED_MODEL_TYPES
    from peakmem.resolve import resolve_config
    from peakmem.simulate import derive

    names = list(args.models)
    if args.all_unsupported:
        names += [m.name for m in MODELS if m.config.get("model_type") not in SUPPORTED_MODEL_TYPES]
    families = tuple(f for f in args.families.split(",") if f) or None  # None: derive.shipped_families()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in names if args.models or not (out / file_name(n)).exists()]  # resume
    for arg in names:
        name, config = resolve_config(arg)
        t0 = time.perf_counter()
        doc = derive.shipped_document(config, name, families)
        path = out / file_name(name)
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {doc['spec']['model_type']} -> {path} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
