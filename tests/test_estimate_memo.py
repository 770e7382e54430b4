"""The estimator's memos (a TrainingEstimator's static parts, and its formulas memo: lora.resolve_targets,
activations' layer structure, spec facts) never change a number: an estimate made cold equals the same
estimate made after other shapes warmed them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peakmem import estimate
from peakmem.adapters import LoraConfig
from peakmem.catalog.models import MODEL_ENTRIES
from peakmem.estimate import TrainingEstimator, estimate_training
from peakmem.resolve import resolve_model
from peakmem.training import Checkpointing, Method, OptimizerName, Precision, TrainingSetup

SETUPS = [
    TrainingSetup(micro_batch=2, seq_len=256, grad_accum=4, checkpointing=Checkpointing.SELECTIVE),
    TrainingSetup(precision=Precision.AMP_BF16, optimizer=OptimizerName.ADAMW_8BIT, grads_set_to_none=False),
    TrainingSetup(method=Method.LORA, lora=LoraConfig(rank=16, dora=True), checkpointing=Checkpointing.FULL),
    TrainingSetup(method=Method.QLORA, seq_len=512),
    TrainingSetup(
        precision=Precision.BF16, optimizer=OptimizerName.PAGED_ADAMW_8BIT, activation_offload=True
    ),
    TrainingSetup(precision=Precision.BF16, optimizer_in_backward=True, checkpointing=Checkpointing.FULL),
]


@pytest.mark.parametrize("model", ["gpt2", "llama-3.1-8b"])
@pytest.mark.parametrize("setup", SETUPS, ids=range(len(SETUPS)))
def test_warm_equals_cold(model: str, setup: TrainingSetup) -> None:
    assert any(e["name"] == model for e in MODEL_ENTRIES)
    spec = resolve_model(model)
    setup = replace(setup, seq_len=min(setup.seq_len, spec.max_position_embeddings))  # gpt2: 1,024 learned
    cold = estimate_training(spec, setup)  # a fresh estimator: its memos empty
    est = TrainingEstimator(spec)
    for mb, seq in ((7, 33), (1, spec.max_position_embeddings)):  # other shapes fill the memos first
        est.estimate(replace(setup, micro_batch=mb, seq_len=seq))
    warm = est.estimate(setup)
    assert len(est.memo) > 0  # the formulas' memo lives on the estimator
    assert warm == cold
    assert warm.setup == estimate.setup_dict(setup)
    assert warm.setup is not cold.setup
    # results are not frozen: nothing mutable is shared between two estimates
    assert warm.extra is not cold.extra
    assert all(w is not c for w, c in zip(warm.phases, cold.phases, strict=True))


def test_setup_json_not_shared() -> None:
    spec = resolve_model("gpt2")
    s = TrainingSetup(method=Method.LORA, lora=LoraConfig(rank=4), seq_len=512)
    est = TrainingEstimator(spec)
    a = est.estimate(s)
    b = est.estimate(replace(s, micro_batch=3))
    assert a.setup["micro_batch"] == 1 and b.setup["micro_batch"] == 3
    assert a.setup["lora"] == b.setup["lora"] and a.setup["lora"] is not b.setup["lora"]


def test_shape_independent_parts_are_memoised_per_spec_and_setup() -> None:
    """The paged-state bytes and the optimizer phase come from the memo and still match each setup."""
    spec = resolve_model("gpt2")
    paged = TrainingSetup(precision=Precision.BF16, optimizer=OptimizerName.PAGED_ADAMW_8BIT, seq_len=1024)
    plain = replace(paged, optimizer=OptimizerName.ADAMW)
    est = TrainingEstimator(spec)
    p1, p2 = (est.estimate(replace(paged, micro_batch=mb)) for mb in (1, 5))
    assert p1.extra["paged_optimizer_bytes"] == p2.extra["paged_optimizer_bytes"] > 0
    assert "paged_optimizer_bytes" not in est.estimate(plain).extra
    assert p1.phases[2] == p2.phases[2]  # the optimizer step does not depend on the shapes
    assert len(est._static) == 2  # one memo entry per setup, none per shape
