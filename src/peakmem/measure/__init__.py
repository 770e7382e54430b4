"""Real-execution measurement (``peakmem measure``): the ground truth the estimators are tested
against. Needs torch and transformers (the ``torch`` extra); importing ``peakmem`` never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peakmem.breakdown import Estimate
    from peakmem.training import TrainingSetup

__all__ = ["measure_training"]


def measure_training(config: dict[str, Any], setup: TrainingSetup, **kwargs: Any) -> Estimate:
    """See :func:`peakmem.measure.runner.measure_training` (imported lazily: it needs torch)."""
    from peakmem.measure.runner import measure_training as run

    return run(config, setup, **kwargs)
