"""A ModelSpec from transformers itself, and measured block costs, for any architecture.

For a ``config.json`` the formulas do not know:

* :mod:`~peakmem.simulate.derive.build` builds the model transformers builds for it on the meta device,
  and cuts it to a few blocks of each kind for a fake step;
* :mod:`~peakmem.simulate.derive.from_model` reads a :class:`~peakmem.model.ModelSpec` off its modules;
  :mod:`~peakmem.simulate.derive.spec` gives it (:func:`derive_spec`) with the recurrent state its blocks
  keep at inference;
* :mod:`~peakmem.simulate.derive.costs` fits each block kind's costs (:func:`measure_costs`) over fake
  training steps (:mod:`~peakmem.simulate.derive.step`, :mod:`~peakmem.simulate.derive.analyse`) run side
  by side in forked processes (:mod:`~peakmem.simulate.derive.forked`);
* :mod:`~peakmem.simulate.derive.coverage` checks every causal-LM type transformers maps, and
  :mod:`~peakmem.simulate.derive.shipped` regenerates the catalog's shipped files.

Importing this package registers :func:`measure_costs` as :mod:`peakmem.block_costs`'s cost provider.
"""

from __future__ import annotations

from peakmem import block_costs
from peakmem.simulate.derive.build import build_meta, config_object, model_class, model_params
from peakmem.simulate.derive.costs import measure_costs
from peakmem.simulate.derive.coverage import causal_lm_types, check_type, tiny_config
from peakmem.simulate.derive.from_model import kernel_notes, spec_from_model
from peakmem.simulate.derive.shipped import shipped_document, shipped_families
from peakmem.simulate.derive.spec import derive_spec, measure_state, with_recurrent_state

block_costs.set_provider(measure_costs)

__all__ = [
    "build_meta",
    "causal_lm_types",
    "check_type",
    "config_object",
    "derive_spec",
    "kernel_notes",
    "measure_costs",
    "measure_state",
    "model_class",
    "model_params",
    "shipped_document",
    "shipped_families",
    "spec_from_model",
    "tiny_config",
    "with_recurrent_state",
]
