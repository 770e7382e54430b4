"""Fake-tensor simulation (``peakmem simulate``): a real transformers training step run under
``FakeTensorMode`` on the CPU, every allocation recorded, so any architecture gets an exact answer
without a GPU. Needs torch and transformers (the ``torch`` extra); ``import peakmem`` never imports it.

The faces (CLI, API) ask :func:`measuring_lookup` and :func:`deriver` for what they hand the estimator
and :mod:`peakmem.resolve`: the oracle measures block costs and derives specs; the core never imports it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peakmem.breakdown import Estimate
    from peakmem.model import BlockCosts, CostLookup, ModelSpec
    from peakmem.resolve import Deriver
    from peakmem.training import TrainingSetup

__all__ = ["deriver", "measuring_lookup", "oracles", "simulate_training"]


def available() -> bool:
    """Whether torch and transformers are importable (the oracle runs)."""
    return (
        importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
    )


def measuring_lookup() -> CostLookup | None:
    """The block-cost lookup that measures what is neither shipped nor cached, and caches it
    (:func:`peakmem.block_costs.provided_lookup` over :func:`peakmem.simulate.derive.measure_costs`:
    fake-tensor runs of the real model); None without torch and transformers (estimators read stored
    costs only). torch is imported only when a lookup finds nothing stored."""
    return _measuring if available() else None


def _measuring(spec: ModelSpec, family: str, key: str) -> BlockCosts | None:
    from peakmem import block_costs

    if block_costs.costs_ready(spec.derived_from, family):
        return block_costs.provided_lookup(spec, family, key)
    from peakmem import progress
    from peakmem.simulate.quiet import notes_that_matter, quiet_libraries

    method = family.split("|")[3] if family.count("|") >= 3 else family
    progress.stage(f"{spec.name}: loading transformers' code to measure its blocks ({method})")
    with quiet_libraries() as said:
        import peakmem.simulate.derive  # noqa: F401  (importing it registers it as the store's provider)

        found = block_costs.provided_lookup(spec, family, key)
    for text in notes_that_matter(said):
        progress.note(text)
    return found


def deriver() -> Deriver | None:
    """A spec deriver (:func:`peakmem.simulate.derive.derive_spec`: built from transformers' own modules),
    or None without torch and transformers; torch is imported only when it is called."""
    return _derive if available() else None


def _derive(config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
    from peakmem import progress
    from peakmem.simulate.quiet import quiet_libraries

    progress.stage(f"{name or config.get('model_type')}: building transformers' model on the meta device")
    with quiet_libraries():
        from peakmem.simulate.derive import derive_spec

        return derive_spec(config, name=name)


def oracles() -> dict[str, Any]:
    """What a face hands :func:`peakmem.question.ask` (and :func:`peakmem.resolve.info_answer`):
    ``derive`` and ``costs``, each None without torch and transformers."""
    return {"derive": deriver(), "costs": measuring_lookup()}


def simulate_training(config: dict[str, Any], setup: TrainingSetup, **kwargs: Any) -> Estimate:
    """See :func:`peakmem.simulate.runner.simulate_training` (imported lazily: it needs torch)."""
    from peakmem.simulate.runner import simulate_training as run

    return run(config, setup, **kwargs)
