"""The estimator's memos (peakmem.estimate._STATES, lora.resolve_targets, activations._STRUCTURE) never
change a number: an estimate made cold equals the same estimate made after other shapes warmed them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peakmem import estimate
from peakmem.catalog.models import MODEL_ENTRIES
from peakmem.estimate import estimate_training
from peakmem.formulas import activations, lora
from peakmem.formulas.lora import LoraConfig
from peakmem.resolve import resolve_model
from peakmem.training import Checkpointing, Method, OptimizerName, Precision, TrainingSetup


def _clear() -> None:
    estimate._STATES.clear()
    lora._TARGETS_CACHE.clear()
    activations._STRUCTURE.clear()


SETUPS = [
    TrainingSetup(micro_batch=2, seq_len=256, grad_accum=4, checkpointing=Checkpointing.SELECTIVE),
    TrainingSetup(precision=Precision.AMP_BF16, optimizer=OptimizerName.ADAMW_8BIT, grads_set_to_none=False),
    TrainingSetup(method=Method.LORA, lora=LoraConfig(rank=16, dora=True), checkpointing=Checkpointing.FULL),
    TrainingSetup(method=Method.QLORA, seq_len=512),
]


@pytest.mark.parametrize("model", ["gpt2", "llama-3.1-8b"])
@pytest.mark.parametrize("setup", SETUPS, ids=range(len(SETUPS)))
def test_warm_equals_cold(model: str, setup: TrainingSetup) -> None:
    assert any(e["name"] == model for e in MODEL_ENTRIES)
    spec = resolve_model(model)
    _clear()
    cold = estimate_training(spec, setup)
    _clear()
    for mb, seq in ((7, 33), (1, 4096)):  # other shapes fill the memos first
        estimate_training(spec, replace(setup, micro_batch=mb, seq_len=seq))
    warm = estimate_training(spec, setup)
    assert warm == cold
    assert warm.setup == estimate.setup_dict(setup)
    assert warm.setup is not cold.setup


def test_setup_json_not_shared() -> None:
    spec = resolve_model("gpt2")
    s = TrainingSetup(method=Method.LORA, lora=LoraConfig(rank=4))
    a = estimate_training(spec, s)
    b = estimate_training(spec, replace(s, micro_batch=3))
    assert a.setup["micro_batch"] == 1 and b.setup["micro_batch"] == 3
    assert a.setup["lora"] == b.setup["lora"] and a.setup["lora"] is not b.setup["lora"]
