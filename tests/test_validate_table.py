"""`make validate`: benchmarks/validate.py builds the README's accuracy table from the shipped cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from _bench import load_benchmark

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load() -> object:
    return load_benchmark("validate", "_validate")


def test_table_groups_cases_by_origin_job_and_quantity() -> None:
    v = _load()
    Case = v.Case  # type: ignore[attr-defined]
    cases = [
        Case("published", "a", "train", "device_total", 100, 110, 90, 120),  # +10%, inside, width 30/110
        Case("published", "b", "train", "device_total", 100, 95, 96, 99),  # -5%, outside
        Case("cpu grid", "c", "train", "allocated", 200, 200, None, None),
    ]
    text = v.table(cases)  # type: ignore[attr-defined]
    assert "| published | train | device total | 2 | +2.5% | +10.0% | 1/2 (50%) |" in text
    assert "| cpu grid | train | allocated | 1 | +0.0% | +0.0% | no band | - |" in text
    assert "Published points inside their band: 1 of 2 (50%)" in text


def test_readme_has_the_markers_the_script_writes_between() -> None:
    v = _load()
    readme = (BENCH.parent / "README.md").read_text()
    assert readme.index(v.BEGIN) < readme.index(v.END)  # type: ignore[attr-defined]


def test_published_points_are_all_compared() -> None:
    v = _load()
    if not v.VALIDATION_FILE.exists():  # type: ignore[attr-defined]
        pytest.skip("the shared validation folder is absent")
    cases = list(v.published(v.VALIDATION_FILE))  # type: ignore[attr-defined]
    assert len({c.name for c in cases}) == len(cases)
    assert sum(c.job == "infer" for c in cases) >= 28
    assert all(c.measured > 0 and c.predicted > 0 for c in cases)
