"""How often the published measurements fall inside peakmem's band, and how wide the band is.

For every published point the accuracy benchmarks already map to a setup (``accuracy.py``: the
training points; ``accuracy_finetune.py``: LoRA/QLoRA/8-bit; ``accuracy_infer.py``: the Qwen3 speed
benchmark), this prints the band (formulas/band.py) of the quantity the source measured (nvidia-smi:
``device_total``; torch allocated/active: ``allocated``), whether the measurement lies inside, and the
band's width relative to its likely value; then the share inside and the median width.

The Qwen3 speed benchmark's "GPU Memory" behaves like memory held after generation (weights + KV
cache, see accuracy_infer.py), which is none of the band's three quantities: those points are listed
against the allocated band for information and counted apart.

Run: ``.venv/bin/python benchmarks/band_coverage.py [path/to/published-measurements.json]``
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from peakmem.breakdown import Band
from peakmem.catalog import get_model
from peakmem.estimate import estimate_training
from peakmem.formulas.serving import estimate_inference
from peakmem.hf import spec_from_config
from peakmem.inference import InferenceSetup
from peakmem.units import GiB, MiB

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published-measurements.json"
HERE = Path(__file__).resolve().parent
GENERATED = 2048  # accuracy_infer.GENERATED: tokens the Qwen3 benchmark generates after each input


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"_{name}"] = module
    spec.loader.exec_module(module)
    return module


def rows(path: Path) -> list[tuple[str, str, int, Band, str]]:
    """(id, quantity, measured bytes, band, group) per covered point."""
    acc, fin = _load("accuracy"), _load("accuracy_finetune")
    points: list[dict[str, Any]] = json.loads(path.read_text())
    by_id = {p["id"]: p for p in points}
    out: list[tuple[str, str, int, Band, str]] = []
    carried: set[str] = set()
    for p in points:
        if "inference" in (p.get("method") or "").lower() and p.get("phase") == "inference":
            continue
        features = carried = acc._features(p, carried)
        if acc._not_covered(p, features) is not None:
            continue
        m = acc._map(p)
        est = estimate_training(
            spec_from_config(get_model(m.catalog_name).config), m.setup, overheads=m.overheads
        )
        assert est.band is not None
        out.append((p["id"], m.quantity, acc._measured_bytes(p), est.band, "training"))
    for pid, setup in fin.TT_SETUPS.items():
        if pid in by_id:
            spec = spec_from_config(get_model("llama-3.2-3b").config, name="llama-3.2-3b")
            est = estimate_training(spec, setup)
            assert est.band is not None
            out.append((pid, "allocated", int(by_id[pid]["value"] * GiB), est.band, "training"))
    for pid in ("HF-A08", "HF-A09"):
        if pid in by_id:
            m, measured = fin._hf_map(by_id[pid])
            est = estimate_training(
                spec_from_config(get_model(m.catalog_name).config), m.setup, overheads=m.overheads
            )
            assert est.band is not None
            out.append((pid, m.quantity, measured, est.band, "training"))
    for p in points:
        if not str(p["id"]).startswith("QWEN3-INF"):
            continue
        name = str(p["model"]).lower()
        context = int(p["seq_len"])
        setup = InferenceSetup(weights="bf16", context=context, prompt=context - GENERATED, batch=1)
        est = estimate_inference(spec_from_config(get_model(name).config, name=name), setup)
        assert est.band is not None
        out.append((p["id"], "allocated", int(float(p["value"]) * MiB), est.band, "held memory"))
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def main(argv: list[str]) -> int:
    from _validation import present_or_skip

    path = present_or_skip(Path(argv[1]) if len(argv) > 1 else DEFAULT_PATH, "band_coverage.py")
    table = rows(path)
    print("| id | quantity | measured GiB | low | likely | high | width | inside |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    groups: dict[str, list[tuple[bool, float]]] = {}
    for pid, quantity, measured, band, group in table:
        r = getattr(band, quantity)
        inside = r.low <= measured <= r.high
        width = r.width / r.likely
        groups.setdefault(group, []).append((inside, width))
        print(f"| {pid} | {quantity}{' (held)' if group == 'held memory' else ''} | {measured / GiB:.2f} | "
              f"{r.low / GiB:.2f} | {r.likely / GiB:.2f} | {r.high / GiB:.2f} | {width:.1%} | "
              f"{'yes' if inside else 'no'} |")  # fmt: skip
    print()
    for group, vals in groups.items():
        n_in = sum(ok for ok, _ in vals)
        print(f"{group}: {n_in} of {len(vals)} inside ({n_in / len(vals):.0%}); median band width "
              f"{_median([w for _, w in vals]):.1%} of the likely value")  # fmt: skip
    every = [v for vals in groups.values() for v in vals]
    n_in = sum(ok for ok, _ in every)
    print(f"all: {n_in} of {len(every)} inside ({n_in / len(every):.0%}); median band width "
          f"{_median([w for _, w in every]):.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
