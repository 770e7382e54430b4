"""The accuracy table of the README, regenerated from every measured case the project ships.

    .venv/bin/python benchmarks/validate.py [--no-cpu-grid] [--check]      (``make validate``)

Cases, each compared on the quantity its source measured:

* the published points in ``../shared/validation/published-measurements.json`` (training points
  mapped as ``benchmarks/accuracy.py`` and ``benchmarks/accuracy_finetune.py`` map them; the Qwen3
  inference points as ``benchmarks/accuracy_infer.py`` does); points those scripts do not cover are
  counted as not covered, with no estimate;
* the CPU parity grid (``peakmem.measure.parity.sampled_grid``: real training steps on the CPU,
  allocated bytes), unless ``--no-cpu-grid``;
* GPU fixtures in ``tests/fixtures/gpu/*.json`` written by ``benchmarks/gpu_fixtures.py`` on a lent
  GPU, when there are any.

For each (job, quantity) it prints the count, median and worst relative error of the likely value,
the share of cases inside the estimate's band (low..high of the same quantity) and the median band
width relative to the likely value. The table is written into README.md between the
``<!-- validate:begin -->`` and ``<!-- validate:end -->`` markers; ``--check`` only prints it.
Nothing is tuned per case: every mapping lives in the accuracy scripts this one imports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy  # noqa: E402
import accuracy_finetune  # noqa: E402
import accuracy_infer  # noqa: E402
from _validation import VALIDATION_FILE  # noqa: E402
from peakmem.answers import estimate_json  # noqa: E402
from peakmem.breakdown import Estimate  # noqa: E402
from peakmem.catalog import get_model  # noqa: E402
from peakmem.estimate import estimate_training  # noqa: E402
from peakmem.hf import spec_from_config  # noqa: E402
from peakmem.units import GiB, MiB  # noqa: E402

README = HERE.parent / "README.md"
FIXTURES = HERE.parent / "tests" / "fixtures" / "gpu"
BEGIN, END = "<!-- validate:begin -->", "<!-- validate:end -->"
# estimate attribute and band key of each measured quantity
QUANTITIES = {
    "allocated": ("peak_allocated_bytes", "allocated"),
    "reserved": ("peak_reserved_bytes", "reserved"),
    "device_total": ("device_total_bytes", "device_total"),
}


@dataclass(frozen=True)
class Case:
    origin: str  # "published" | "cpu grid" | "gpu fixture"
    name: str
    job: str  # "train" | "infer"
    quantity: str  # a key of QUANTITIES
    measured: int
    predicted: int
    low: int | None  # the band's ends for that quantity; None when the estimate has no band
    high: int | None

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def inside(self) -> bool | None:
        if self.low is None or self.high is None:
            return None
        return self.low <= self.measured <= self.high

    @property
    def width(self) -> float | None:
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / self.predicted


def _oom_side(c: Case) -> bool:
    """A miss on the OOM side: the band below a measured use, or above a measured pool
    (_scale_bands.miss_side)."""
    from _scale_bands import miss_side

    return miss_side(c.quantity, c.low or 0, c.high or 0, c.measured) == "low"


def case_of(origin: str, name: str, job: str, quantity: str, measured: int, est: Estimate) -> Case:
    attr, key = QUANTITIES[quantity]
    band = estimate_json(est).get("band")
    ends = band.get(key) if isinstance(band, dict) else None
    low = ends["low_bytes"] if ends else None
    high = ends["high_bytes"] if ends else None
    return Case(origin, name, job, quantity, measured, getattr(est, attr), low, high)


def published(path: Path) -> Iterator[Case]:
    points = json.loads(path.read_text())
    by_id = {p["id"]: p for p in points}
    carried: set[str] = set()
    for point in points:
        if point.get("phase") != "training":
            continue
        carried = accuracy._features(point, carried)
        if accuracy._not_covered(point, carried) is not None:
            continue
        mapped = accuracy._map(point)
        spec = spec_from_config(get_model(mapped.catalog_name).config)
        est = estimate_training(spec, mapped.setup, overheads=mapped.overheads)
        measured = accuracy._measured_bytes(point)
        yield case_of("published", point["id"], "train", mapped.quantity, measured, est)
    spec = spec_from_config(get_model("llama-3.2-3b").config, name="llama-3.2-3b")
    for pid, setup in accuracy_finetune.TT_SETUPS.items():
        if pid in by_id:
            est = estimate_training(spec, setup)
            yield case_of("published", pid, "train", "allocated", int(by_id[pid]["value"] * GiB), est)
    for pid in ("HF-A08", "HF-A09"):
        if pid in by_id:
            mapped, measured = accuracy_finetune._hf_map(by_id[pid])
            hf_spec = spec_from_config(get_model(mapped.catalog_name).config)
            est = estimate_training(hf_spec, mapped.setup, overheads=mapped.overheads)
            yield case_of("published", pid, "train", mapped.quantity, measured, est)
    for point, est, predicted in accuracy_infer.estimates(path):
        measured = int(float(point["value"]) * MiB)
        case = case_of("published", point["id"], "infer", "allocated", measured, est)
        # the Qwen3 benchmark reads memory held after generate() (accuracy_infer.py): the band spans the
        # peak, so its allocated terms (the formulas' residual, the published residual) are carried over
        # to the held bytes, not the peak's ends
        assert case.low is not None and case.high is not None
        yield replace(
            case, predicted=predicted, low=predicted + case.low - case.predicted,
            high=predicted + case.high - case.predicted,
        )  # fmt: skip


def cpu_grid() -> Iterator[Case]:
    from peakmem.measure.parity import run_case, sampled_grid

    for c in sampled_grid():
        cmp = run_case(c)
        measured = cmp.measured.peak_allocated_bytes
        yield case_of("cpu grid", c.name, "train", "allocated", measured, cmp.analytic)


def gpu_fixtures() -> Iterator[Case]:
    """Cases from ``benchmarks/gpu_fixtures.py`` records: the command each ran (``peakmem train MODEL
    ARGV`` / ``peakmem infer ...``) is answered by the CLI's own JSON, and compared on the peaks the
    record holds (``peak_allocated_bytes``, ``peak_reserved_bytes``, ``device_total_bytes``)."""
    import shlex

    from peakmem.cli import answer_argv

    for path in sorted(FIXTURES.glob("*.json")):
        fx: dict[str, Any] = json.loads(path.read_text())
        if "command" not in fx or "error" in fx:
            continue
        argv = shlex.split(fx["command"])[1:]
        out = answer_argv(argv).json
        for quantity, (attr, key) in QUANTITIES.items():
            measured = fx.get(attr)
            if not isinstance(measured, int):
                continue
            band = out.get("band", {}).get(key)
            yield Case(
                "gpu fixture", path.stem, "train" if argv[0] == "train" else "infer", quantity, measured,
                int(out[attr]), band["low_bytes"] if band else None, band["high_bytes"] if band else None,
            )  # fmt: skip


def at_scale() -> Iterator[Case]:
    """benchmarks/published_scale.json, split before any estimate: the fitting set (it sets the band's
    published_residual term, formulas/band.py) and the held-out set (never used to set a formula, a
    constant or a band term). Points peakmem cannot be asked are left out (the script lists them)."""
    import tempfile

    import published_scale

    doc = json.loads(published_scale.POINTS_FILE.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for p in doc["points"]:
            r = published_scale.estimate(p, Path(tmp))
            if "error" not in r:
                continue
            origin = "at scale, fitting" if p["set"] == "fit" else "at scale, held out"
            job = "train" if p["job"]["mode"] == "train" else "infer"
            low, likely, high = (round(r[k] * GiB) for k in ("low_gib", "estimate_gib", "high_gib"))
            yield Case(origin, p["id"], job, r["quantity"], p["measured"]["value_bytes"], likely, low, high)


def _examined_note(held: list[Case]) -> str:
    """The held-out points read after a miss (published_scale.json ``examined_after_miss``), and the band
    on the others."""
    import published_scale

    doc = json.loads(published_scale.POINTS_FILE.read_text())
    examined = {p["id"] for p in doc["points"] if p.get("examined_after_miss")}
    unseen = [c for c in held if c.name not in examined]
    n = len(held) - len(unseen)
    if not n:
        return "."
    inside = sum(bool(c.inside) for c in unseen)
    return (
        f". {n} of them were read after their miss (flag E in benchmarks/published_scale.md: a mapping or a "
        f"formula then taken from the framework's source, nothing fit to them); the {len(unseen)} never read "
        f"after an estimate: {inside} inside their band."
    )


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def table(cases: list[Case]) -> str:
    lines = [
        "| cases | job | quantity | count | median error | worst error | inside band | median band width |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str, str], list[Case]] = {}
    for c in cases:
        groups.setdefault((c.origin, c.job, c.quantity), []).append(c)
    for (origin, job, quantity), group in sorted(groups.items()):
        errors = [c.error for c in group]
        worst = max(errors, key=abs)
        inside = [c.inside for c in group if c.inside is not None]
        widths = [c.width for c in group if c.width is not None]
        share = f"{sum(inside)}/{len(inside)} ({sum(inside) / len(inside):.0%})" if inside else "no band"
        width = f"{statistics.median(widths):.1%}" if widths else "-"
        lines.append(
            f"| {origin} | {job} | {quantity.replace('_', ' ')} | {len(group)} "
            f"| {_pct(statistics.median(errors))} | {_pct(worst)} | {share} | {width} |"
        )
    held = [c for c in cases if c.origin == "at scale, held out" and c.inside is not None]
    if held:
        misses = [c for c in held if not c.inside]
        low = sum(_oom_side(c) for c in misses)
        lines.append("")
        lines.append(
            "Held out at scale (never used to set a formula, a constant or a band term): "
            f"{len(held) - len(misses)} of {len(held)} inside their band; of the misses, {low} on the OOM "
            f"side (the band below the measured use, or above the logged KV pool), {len(misses) - low} "
            "on the other; median band width "
            f"{statistics.median(c.width for c in held if c.width is not None):.1%} of the likely value"
            + _examined_note(held)
        )
    pub = [c for c in cases if c.origin == "published" and c.inside is not None]
    if pub:
        widths = [c.width for c in pub if c.width is not None]
        lines.append("")
        lines.append(
            f"Published points inside their band: {sum(bool(c.inside) for c in pub)} of {len(pub)} "
            f"({sum(bool(c.inside) for c in pub) / len(pub):.0%}); median band width "
            f"{statistics.median(widths):.1%} of the likely value."
        )
    return "\n".join(lines)


def write_readme(text: str) -> None:
    readme = README.read_text()
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    README.write_text(readme[:start] + "\n" + text + "\n" + readme[end:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-cpu-grid", action="store_true", help="skip the CPU parity grid (needs torch)")
    ap.add_argument("--check", action="store_true", help="print the table; leave README.md alone")
    args = ap.parse_args(argv)
    cases: list[Case] = []
    if VALIDATION_FILE.exists():
        cases += published(VALIDATION_FILE)
    else:
        print(f"validate.py: {VALIDATION_FILE} is absent: no published points", file=sys.stderr)
    if not args.no_cpu_grid:
        cases += cpu_grid()
    cases += gpu_fixtures()
    cases += at_scale()
    text = table(cases)
    print(text)
    for c in cases:
        mark = {True: "in", False: "OUT", None: ""}[c.inside]
        print(f"{c.origin:12} {c.name:44} {c.quantity:13} {_pct(c.error):>7} {mark}", file=sys.stderr)
    if not args.check:
        write_readme(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
