"""benchmarks/cuda_context_logs.json (published non-torch memory of CUDA processes, brief h-ctxsurvey): the
file's integrity, the cases whose figure is derived from raw components re-derived by hand, and the
summary script's grouping."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from _bench import load_benchmark
from peakmem.formulas.band import CONTEXT_HIGH_BYTES, CONTEXT_LOW_BYTES
from peakmem.units import MiB

ROOT = Path(__file__).parents[1] / "benchmarks"
FIELDS = {
    "id", "source", "url", "quote", "gpu", "driver", "cuda", "torch", "lazy_loading", "stage", "evidence",
    "what_ran", "nccl", "mib", "includes", "note",
}  # fmt: skip
QUOTE_MAX = 300  # characters: a quote, not a copy of the thread
ROUNDING_MIB = 1.0  # the JSON keeps derived figures to 0.1 MiB or better


def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "cuda_context_logs.json").read_text())
    return data


def _script() -> ModuleType:
    return load_benchmark("cuda_context")


def test_every_case_is_cited_complete_and_short() -> None:
    script = _script()
    data = _data()
    cases = data["cases"]
    assert data["about"] and data["gathered"]
    assert len(cases) >= 12 and len({c["id"] for c in cases}) == len(cases)
    assert len({c["url"] for c in cases if c["evidence"] == "measured"}) >= 6  # independent sources
    for c in cases:
        assert set(c) >= FIELDS, (c["id"], FIELDS - set(c))
        assert c["source"] and c["what_ran"] and c["includes"], c["id"]
        assert c["url"].startswith("https://") and 0 < len(c["quote"]) <= QUOTE_MAX, c["id"]
        assert isinstance(c["mib"], (int, float)) and c["mib"] > 0, c["id"]
        assert c["lazy_loading"] in (True, False, None) and c["nccl"] in (True, False, None), c["id"]
        assert c["stage"] in script.STAGES and c["evidence"] in script.EVIDENCE, c["id"]
    for n in data["not_used"]:
        assert n["what"] and n["why"] and n["url"].startswith("https://"), n
        assert 0 < len(n["quote"]) <= QUOTE_MAX, n["what"]


def test_derived_figures_match_their_components() -> None:
    """Every case with raw components carries the figure they give, within ROUNDING_MIB."""
    script = _script()
    derived = [c for c in _data()["cases"] if c.get("derived")]
    assert len(derived) >= 10
    for c in derived:
        assert abs(script.derived_mib(c) - c["mib"]) <= ROUNDING_MIB, c["id"]


def test_two_derivations_by_hand() -> None:
    """J1 (litgpt OOM message): 78.93 GiB in use - 76.28 allocated - 2.14 reserved-but-unallocated = 0.51 GiB
    = 0.51 x 1024 = 522.24 MiB. P1 (pytorch #86509): 287,047,680 B = 273.75 MiB device-wide after a
    6,400,000 B tensor, which the caching allocator serves from one 20 MiB segment (1-10 MiB requests):
    273.75 - 20 = 253.75 MiB."""
    cases = {c["id"]: c for c in _data()["cases"]}
    assert round((78.93 - 76.28 - 2.14) * 1024, 2) == 522.24 == cases["J1"]["mib"]
    assert 287_047_680 / MiB - 20 == 253.75 == cases["P1"]["mib"]
    assert cases["P1"]["lazy_loading"] is True and cases["P2"]["lazy_loading"] is False


def test_groups_and_spread() -> None:
    """spread is (min, median, max); every case lands in exactly one (loading, stage) group; the comparison
    quotes peakmem's own band constants."""
    script = _script()
    assert script.spread([3.0, 1.0, 2.0]) == (1.0, 2.0, 3.0)
    assert script.spread([4.0, 1.0]) == (1.0, 2.5, 4.0)
    cases = _data()["cases"]
    grouped = script.groups(cases)
    assert sorted(c["id"] for members in grouped.values() for c in members) == sorted(c["id"] for c in cases)
    assert all(len({(c["lazy_loading"], c["stage"]) for c in m}) == 1 for m in grouped.values())
    band = f"{CONTEXT_LOW_BYTES / MiB:,.0f}..{CONTEXT_HIGH_BYTES / MiB:,.0f} MiB"
    assert band in script.comparison_lines(cases)[0]
