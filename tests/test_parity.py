"""Parity: the analytic estimate (KernelPolicy.CPU) against real CPU execution (issue 3, item 7).

A deterministic quarter of the grid in ``peakmem.measure.parity`` (every family x every
precision, rotating attention x checkpointing x shape so each value appears); the full grid is
``benchmarks/parity.py``. Tolerances: peak within 5%, each category within 10% at the measured
peak's phase (categories under 1% of the peak: within 1% of the peak, absolutely).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from peakmem.measure.parity import analytic_available, run_case, sampled_grid

pytestmark = [pytest.mark.torch, pytest.mark.slow]

_WHY = analytic_available()
CASES = sampled_grid()


@pytest.mark.skipif(_WHY is not None, reason=_WHY or "")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_analytic_matches_measured(case):
    result = run_case(case)
    assert result.ok, f"{case.name}: " + "; ".join(result.failures())
