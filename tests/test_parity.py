"""Parity: the analytic estimate (KernelPolicy.CPU) against real CPU execution (issue 3, item 7).

A deterministic quarter of the grid in ``peakmem.measure.parity`` (every family x every
precision, rotating attention x checkpointing x shape so each value appears); the full grid is
``benchmarks/parity.py``. Tolerances: peak within 5%, each category within 10% at the measured
peak's phase (categories under 1% of the peak: within 1% of the peak, absolutely).

The peak tolerance is enforced on every case. Cases in :data:`CATEGORY_GAPS` are those whose
*category split* at the backward peak still misses (the analytic timeline picks a slightly
different instant of the backward pass than the one measured); they are marked xfail, not
skipped, and only for the category check: remove an entry once the benchmark shows it passing.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from peakmem.measure.parity import analytic_available, run_case, sampled_grid

pytestmark = [pytest.mark.torch, pytest.mark.slow]

_WHY = analytic_available()
CASES = sampled_grid()

# From `benchmarks/parity.py` at 19:31 UTC: 96/96 cases within every tolerance (worst peak 2.3%, worst
# category 5.9%), so no case is expected to miss; add "case name": "why" here only for a known gap.
CATEGORY_GAPS: dict[str, str] = {}


@pytest.mark.skipif(_WHY is not None, reason=_WHY or "")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_analytic_matches_measured(case):
    result = run_case(case)
    assert result.peak_ok, f"{case.name}: " + "; ".join(result.failures())
    if not result.ok and case.name in CATEGORY_GAPS:
        pytest.xfail(f"{CATEGORY_GAPS[case.name]}: " + "; ".join(result.failures()))
    assert result.ok, f"{case.name}: " + "; ".join(result.failures())
