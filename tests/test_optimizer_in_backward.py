"""Optimizer-in-backward (torchtune ``optimizer_in_bwd``) at every micro-batch: the step runs per
parameter inside backward, so its temporaries are one tensor's, whatever the batch; accumulation is
refused as torchtune's recipes refuse it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import peakmem
from peakmem.breakdown import Category, Phase
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas.sharding import one_tensor_step_bytes
from peakmem.formulas.technique import technique
from peakmem.hf import spec_from_config
from peakmem.training import OptimizerImpl, OptimizerName, Precision, TrainingSetup

RECIPE = Path(__file__).parent / "fixtures/frameworks/torchtune/1B_full_single_device.yaml"
# vocab 10, hidden 8, MLP 16, 2 layers, untied head: the largest tensor is an MLP weight, 16 x 8
TINY: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "tie_word_embeddings": False,
}  # fmt: skip
LARGEST = 16 * 8
FP32 = 4


@pytest.mark.parametrize("batch", [1, 4])
def test_step_temporaries_are_one_tensors_at_any_batch(batch: int) -> None:
    spec = spec_from_config(TINY)
    base = TrainingSetup(micro_batch=batch, seq_len=16, optimizer_in_backward=True)
    # mixed-bf16 AdamW keeps fp32 states: foreach's exp_avg_sq_sqrt of the one tensor stepped
    assert one_tensor_step_bytes(technique(spec, base)) == FP32 * LARGEST
    fused = replace(base, optimizer_impl=OptimizerImpl.FUSED)
    assert one_tensor_step_bytes(technique(spec, fused)) == 0
    # for-loop: denom and exp_avg.clone() of that tensor
    loop = replace(base, optimizer_impl=OptimizerImpl.FOR_LOOP)
    assert one_tensor_step_bytes(technique(spec, loop)) == 2 * FP32 * LARGEST
    pure = replace(base, precision=Precision.BF16)  # torchtune's bf16: states in bf16
    assert one_tensor_step_bytes(technique(spec, pure)) == 2 * LARGEST
    eight_bit = replace(base, optimizer=OptimizerName.ADAMW_8BIT)  # bitsandbytes updates in place
    assert one_tensor_step_bytes(technique(spec, eight_bit)) == 0


@pytest.mark.parametrize("batch", [1, 4])
def test_backward_holds_the_tensors_step_and_the_optimizer_phase_none(batch: int) -> None:
    """On the tiny llama the peak lies in a layer's backward: foreach and fused differ there by exactly
    one tensor's temporaries (fp32 exp_avg_sq_sqrt of the 16 x 8 MLP weight), at any batch; after
    backward no gradient and no step temporary is left (the optimizer phase holds the states alone)."""
    spec = spec_from_config(TINY)
    foreach = TrainingSetup(micro_batch=batch, seq_len=16, optimizer_in_backward=True)
    a = estimate_training(spec, foreach)
    b = estimate_training(spec, replace(foreach, optimizer_impl=OptimizerImpl.FUSED))
    assert a.peak_phase is b.peak_phase is Phase.BACKWARD

    def at(e: Any, phase: Phase) -> int:
        return next(p.bytes for p in e.phases if p.phase is phase)

    assert at(a, Phase.BACKWARD) - at(b, Phase.BACKWARD) == FP32 * LARGEST
    assert at(a, Phase.OPTIMIZER) == at(b, Phase.OPTIMIZER) == sum(
        i.bytes for i in next(p for p in b.phases if p.phase is Phase.OPTIMIZER).items
        if i.category is not Category.GRADIENTS and i.category is not Category.TEMPORARIES
    )  # fmt: skip


def test_micro_batch_above_one_answers_from_cli_api_and_from() -> None:
    r = peakmem.train("llama-3.2-1b", optimizer_in_backward=True, batch=2, grad_accum=1)
    assert r["setup"]["micro_batch"] == 2
    smaller = [w for w in r["ways_down"] if w["change"].startswith("micro-batch 1")]
    assert smaller and "optimizer-in-backward cannot accumulate" in smaller[0]["change"]
    tt = peakmem.train(from_file=str(RECIPE)).to_dict()  # torchtune's low-memory recipe: batch 4
    assert (tt["setup"]["micro_batch"], tt["setup"]["optimizer_in_backward"]) == (4, True)


def test_accumulation_is_refused_naming_the_value_given() -> None:
    with pytest.raises(InputError, match=r"^grad_accum=3: optimizer-in-backward"):
        peakmem.train("llama-3.2-1b", optimizer_in_backward=True, batch=4, grad_accum=3)


def test_plan_steps_every_micro_batch() -> None:
    """plan keeps accumulation at 1: the job's micro-batch over the data-parallel ranks, or the
    global batch asked for made by ranks x micro-batch alone."""
    free = peakmem.plan("llama-3.2-1b", optimizer_in_backward=True, batch=4, gpu="h100-80gb", max_gpus=8)
    asked = peakmem.plan("llama-3.2-1b", optimizer_in_backward=True, batch=4, gpu="h100-80gb", max_gpus=8,
                         global_batch=16)  # fmt: skip
    for r in (free, asked):
        layouts = r.to_dict()["layouts"]
        assert layouts and all(lay["grad_accum"] == 1 for lay in layouts)
    assert all(lay["micro_batch"] == 4 for lay in free.to_dict()["layouts"])
    assert all(lay["dp"] * lay["micro_batch"] == 16 for lay in asked.to_dict()["layouts"])
