"""The derived path agrees with the formulas under LoRA (issue 14, item 3): the LoRA column of
``test_derive_agreement.py`` for the families of ``_derive_agreement.LORA_FAMILIES`` (every family's:
``benchmarks/derive_agreement.py``), in a module of its own so that it runs beside the full setups.
"""

from __future__ import annotations

import pytest

from _derive_agreement import LORA_FAMILIES, cases, check_peak, specs_fixture  # noqa: F401 ("specs")

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.parametrize(("family", "setup"), cases(("lora",), LORA_FAMILIES))
def test_lora_peak_agrees_within_two_percent(specs, family: str, setup: str) -> None:  # type: ignore[no-untyped-def]
    check_peak(specs, family, setup)


def test_the_lora_families_are_formula_families() -> None:
    from tiny_models import FAMILY_CONFIGS

    assert len(cases(("lora",), LORA_FAMILIES)) == len(LORA_FAMILIES)
    assert set(LORA_FAMILIES) <= set(FAMILY_CONFIGS)
