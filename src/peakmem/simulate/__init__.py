"""Fake-tensor simulation (``peakmem simulate``): a real transformers training step run under
``FakeTensorMode`` on the CPU, every allocation recorded, so any architecture gets an exact answer
without a GPU. Needs torch and transformers (the ``torch`` extra); ``import peakmem`` never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peakmem.breakdown import Estimate
    from peakmem.training import TrainingSetup

__all__ = ["simulate_training"]


def simulate_training(config: dict[str, Any], setup: TrainingSetup, **kwargs: Any) -> Estimate:
    """See :func:`peakmem.simulate.runner.simulate_training` (imported lazily: it needs torch)."""
    from peakmem.simulate.runner import simulate_training as run

    return run(config, setup, **kwargs)
