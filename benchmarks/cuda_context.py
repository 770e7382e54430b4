"""What a CUDA process holds outside PyTorch's allocator, as published, next to peakmem's context term.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/cuda_context.py [--cases]``.

Reads benchmarks/cuda_context_logs.json (each case: nvidia-smi's used memory minus
``torch.cuda.memory_reserved()`` at the same moment, or what its source reports in place of that, with the
source, a quote and the stack) and prints, per (lazy loading, stage) group, the number of cases and the
min / median / max in MiB, the NCCL-free figures of the group apart, then peakmem's current default
(formulas/overhead.py ``CONTEXT_SIZES[DEFAULT_CONTEXT]``) and band (formulas/band.py ``CONTEXT_LOW_BYTES`` /
``CONTEXT_HIGH_BYTES``) and how many measured lazy-loading figures fall inside that band. ``--cases`` first
lists every case. Stage ``job_increment`` (vLLM's ``non_torch_increase``) starts after the context exists,
so it is what a job adds to the context, not a context; it is kept apart. Exits 0; nothing is enforced.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from peakmem.formulas.band import CONTEXT_HIGH_BYTES, CONTEXT_LOW_BYTES
from peakmem.formulas.overhead import CONTEXT_SIZES, DEFAULT_CONTEXT
from peakmem.units import GiB, MiB

LOGS = Path(__file__).resolve().parent / "cuda_context_logs.json"
STAGES = ("bare_init", "engine_init", "job", "job_increment")
EVIDENCE = ("measured", "stated")
LAZY = {True: "lazy", False: "eager", None: "unknown"}
BIG_GPUS = ("A100", "H100")


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(LOGS.read_text())
    return data


def derived_mib(case: dict[str, Any]) -> float | None:
    """The non-torch MiB recomputed from the case's raw components (None when it has none): the torch OOM
    message's process total minus allocated minus reserved-but-unallocated, used minus reserved, a
    device-wide used figure minus the allocator segment of the one tensor, or NVML after minus before
    minus cached."""
    d = case.get("derived")
    if not d:
        return None
    if "process_gib" in d:
        unallocated = d["unallocated_gib"] * GiB if "unallocated_gib" in d else d["unallocated_mib"] * MiB
        return float((d["process_gib"] * GiB - d["allocated_gib"] * GiB - unallocated) / MiB)
    if "used_mib" in d:
        return float(d["used_mib"] - d["reserved_mib"])
    if "device_used_bytes" in d:
        return float(d["device_used_bytes"] / MiB - d["allocator_segment_mib"])
    return float(d["used_after_mib"] - d["used_before_mib"] - d["reserved_mib"])


def spread(values: Iterable[float]) -> tuple[float, float, float]:
    """(min, median, max) of the values."""
    vals = sorted(values)
    return vals[0], float(statistics.median(vals)), vals[-1]


def groups(cases: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Cases by (lazy loading, stage), in STAGES order, lazy first."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    order = sorted(cases, key=lambda c: (list(LAZY).index(c["lazy_loading"]), STAGES.index(c["stage"])))
    for c in order:
        out.setdefault((LAZY[c["lazy_loading"]], c["stage"]), []).append(c)
    return out


def _fmt(triple: tuple[float, float, float]) -> str:
    return " | ".join(f"{v:,.0f}" for v in triple)


def group_lines(cases: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| loading | stage | n | min MiB | median MiB | max MiB | no NCCL: n | min | median | max | ids |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (lazy, stage), members in groups(cases).items():
        alone = [c["mib"] for c in members if c["nccl"] is False]
        no_nccl = f"{len(alone)} | {_fmt(spread(alone))}" if alone else "0 | | |"
        ids = ", ".join(c["id"] + ("*" if c["evidence"] == "stated" else "") for c in members)
        lines.append(f"| {lazy} | {stage} | {len(members)} | {_fmt(spread(c['mib'] for c in members))} | "
                     f"{no_nccl} | {ids} |")  # fmt: skip
    lines.append("(* stated, not a logged measurement)")
    return lines


def case_lines(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| id | loading | stage | evidence | GPU | CUDA | torch | NCCL | MiB | what ran |",
             "|---|---|---|---|---|---|---|---|---:|---|"]  # fmt: skip
    for c in cases:
        stack = f"{c['gpu'] or '?'} | {c['cuda'] or '?'} | {c['torch'] or '?'}"
        lines.append(f"| {c['id']} | {LAZY[c['lazy_loading']]} | {c['stage']} | {c['evidence']} | {stack} | "
                     f"{c['nccl']} | {c['mib']:,.0f} | {c['what_ran']} |")  # fmt: skip
    return lines


def comparison_lines(cases: list[dict[str, Any]]) -> list[str]:
    """peakmem's default and band next to the measured lazy-loading figures that are whole non-torch
    totals (bare_init and job, NCCL-free or not), and to the job increments vLLM reports."""
    low, high = CONTEXT_LOW_BYTES / MiB, CONTEXT_HIGH_BYTES / MiB
    default = CONTEXT_SIZES[DEFAULT_CONTEXT].bytes / MiB
    whole = [c for c in cases if c["lazy_loading"] is True and c["evidence"] == "measured"
             and c["stage"] in ("bare_init", "job")]  # fmt: skip
    inside = [c["id"] for c in whole if low <= c["mib"] <= high]
    below = [c["id"] for c in whole if c["mib"] < low]
    above = [c["id"] for c in whole if c["mib"] > high]
    incr = [c["mib"] for c in cases if c["stage"] == "job_increment"]
    big = [c for c in whole if c["stage"] == "job" and any(g in (c["gpu"] or "") for g in BIG_GPUS)]
    return [
        f"peakmem default context: {default:,.0f} MiB ({DEFAULT_CONTEXT!r}); band CONTEXT_LOW..HIGH: "
        f"{low:,.0f}..{high:,.0f} MiB",
        f"measured lazy-loading totals (bare_init + job): {len(whole)}; min / median / max "
        f"{_fmt(spread(c['mib'] for c in whole))} MiB",
        f"  inside the band: {len(inside)} ({', '.join(inside)}); below: {len(below)} ({', '.join(below)}); "
        f"above: {len(above)} ({', '.join(above)})",
        f"  of which jobs on A100/H100: {', '.join(c['id'] for c in big)}; min / median / max "
        f"{_fmt(spread(c['mib'] for c in big))} MiB",
        f"vLLM job increments over the context (job_increment): min / median / max {_fmt(spread(incr))} MiB",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", action="store_true", help="list every case first")
    args = parser.parse_args()
    cases = load()["cases"]
    if args.cases:
        print("\n".join(case_lines(cases)), end="\n\n")
    print("\n".join(group_lines(cases)), end="\n\n")
    print("\n".join(comparison_lines(cases)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
