"""``peakmem measure`` under a float8 precision: torchao's ``convert_to_float8_training`` with the recipe
and torchtitan's filter (commit b5bcd76c, components/quantization/utils.py ``module_filter_fn``: both
dimensions divisible by 16; models/llama3/config_registry.py ``filter_fqns=["lm_head"]``: not the output
head), applied to the model before it trains."""

from __future__ import annotations

from typing import Any

from peakmem.errors import InputError
from peakmem.formulas.activations.float8 import DIM_MULTIPLE, recipe_of
from peakmem.training import TrainingSetup

HEAD_NAMES = ("lm_head", "score", "classifier")  # the output head torchtitan leaves out ("output" there)


def _eligible(module: Any, fqn: str) -> bool:
    import torch

    if not isinstance(module, torch.nn.Linear):
        return False
    if fqn.rsplit(".", 1)[-1] in HEAD_NAMES:
        return False
    return module.in_features % DIM_MULTIPLE == 0 and module.out_features % DIM_MULTIPLE == 0


def convert_float8(model: Any, setup: TrainingSetup) -> None:
    """Swap the eligible Linears of ``model`` for torchao ``Float8Linear`` (in place) for a float8 recipe."""
    recipe = recipe_of(setup.precision)
    if recipe is None:
        return
    if recipe.mx:
        raise InputError(
            f"precision={setup.precision.value!r}: measure does not run MXFP8 (its cast and matmul kernels "
            "need an SM100 GPU; torchao's emulated casts on the CPU are not the GPU's); peakmem train "
            "estimates it"
        )
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise InputError(f"precision={setup.precision.value!r}: measure needs torchao ({exc})") from exc
    config = Float8LinearConfig.from_recipe_name(recipe.name)
    convert_to_float8_training(model, config=config, module_filter_fn=_eligible)


def float8_notes(model: Any, setup: TrainingSetup) -> list[str]:
    recipe = recipe_of(setup.precision)
    if recipe is None:
        return []
    names = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    return [
        f"torchao float8 training, recipe {recipe.name!r} (convert_to_float8_training): {len(names)} Linears "
        "converted (torchtitan's filter: not the head, both dimensions divisible by 16); eager, no compile"
    ]
