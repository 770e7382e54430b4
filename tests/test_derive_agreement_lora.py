"""The derived path agrees with the formulas under LoRA on every family the formulas know (issue 14,
item 3): the LoRA column of ``test_derive_agreement.py``, in a module of its own so that it runs beside
the full setups (see ``_derive_agreement.py``).
"""

from __future__ import annotations

import pytest

from _derive_agreement import cases, check_peak, specs_fixture  # noqa: F401 (the "specs" fixture)

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.parametrize(("family", "setup"), cases(("lora",)))
def test_lora_peak_agrees_within_two_percent(specs, family: str, setup: str) -> None:  # type: ignore[no-untyped-def]
    check_peak(specs, family, setup)
