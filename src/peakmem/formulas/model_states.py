"""Model states: weights, gradients and fp32 master weights, as rows of the bytes/param table.

The seed's table (``seeds/gpu-memory-to-train-an-llm.txt``) for mixed-precision Adam is
2 (fp16 weights) + 2 (fp16 grads) + 4 (fp32 master) + 4 (Adam m) + 4 (Adam v) = 16 bytes/param;
here every row is built from a dtype and a parameter count, never from a bare 16.

Precisions (DESIGN.md):
* ``fp32``: fp32 weights, grads and states.
* ``amp-bf16``/``amp-fp16``: PyTorch autocast (HF Trainer ``bf16=True``/``fp16=True``): the model
  stays fp32 (weights, grads, states); matmuls run in 16 bit on cached weight casts
  (torch/amp/autocast_mode.py, aten/src/ATen/autocast_mode.cpp ``cached_cast``) - those casts are
  activation-phase tensors, see :mod:`peakmem.formulas.activations`.
* ``mixed-bf16``/``mixed-fp16``: 16-bit weights and grads plus fp32 master weights and fp32 states
  (Micikevicius et al. 2018, arXiv 1710.03740 §3.1; DeepSpeed / Megatron; the seed's table).
* ``bf16``: pure bf16 weights, grads and optimizer states (torchtune's full fine-tune recipes).
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem import dtypes
from peakmem.breakdown import Category, PerParamRow
from peakmem.dtypes import DType
from peakmem.model import ModelSpec
from peakmem.training import Precision, TrainingSetup


@dataclass(frozen=True, kw_only=True)
class PrecisionPlan:
    """The dtype of each model-state tensor and of the activations, for one precision."""

    weight: DType  # the parameters the model computes with
    grad: DType
    master: DType | None  # fp32 master copy kept by the optimizer wrapper (mixed-*)
    state: DType  # optimizer states
    compute: DType  # matmul outputs / most activations
    autocast: bool  # torch autocast: 16-bit casts of fp32 inputs and weights inside matmuls

    @property
    def residual(self) -> DType:
        """The residual stream: fp32 under autocast (embeddings and norms stay fp32), else compute."""
        return self.weight if self.autocast else self.compute


_PLANS: dict[Precision, PrecisionPlan] = {
    Precision.FP32: PrecisionPlan(
        weight=dtypes.FP32, grad=dtypes.FP32, master=None, state=dtypes.FP32, compute=dtypes.FP32,
        autocast=False,
    ),
    Precision.AMP_BF16: PrecisionPlan(
        weight=dtypes.FP32, grad=dtypes.FP32, master=None, state=dtypes.FP32, compute=dtypes.BF16,
        autocast=True,
    ),
    Precision.AMP_FP16: PrecisionPlan(
        weight=dtypes.FP32, grad=dtypes.FP32, master=None, state=dtypes.FP32, compute=dtypes.FP16,
        autocast=True,
    ),
    Precision.MIXED_BF16: PrecisionPlan(
        weight=dtypes.BF16, grad=dtypes.BF16, master=dtypes.FP32, state=dtypes.FP32,
        compute=dtypes.BF16, autocast=False,
    ),
    Precision.MIXED_FP16: PrecisionPlan(
        weight=dtypes.FP16, grad=dtypes.FP16, master=dtypes.FP32, state=dtypes.FP32,
        compute=dtypes.FP16, autocast=False,
    ),
    Precision.BF16: PrecisionPlan(
        weight=dtypes.BF16, grad=dtypes.BF16, master=None, state=dtypes.BF16, compute=dtypes.BF16,
        autocast=False,
    ),
}  # fmt: skip


def precision_plan(precision: Precision) -> PrecisionPlan:
    return _PLANS[precision]


def trainable_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Parameters that get gradients and optimizer states (all of them in full fine-tuning)."""
    del setup  # adapters (LoRA/QLoRA) extend this; full fine-tuning trains everything
    return spec.params


def _row(tensor: str, dtype: DType, params: int, category: Category, source: str) -> PerParamRow:
    return PerParamRow(
        tensor=tensor, dtype=dtype.name, bytes_per_param=dtype.itemsize, bytes=dtype.nbytes(params),
        params=params, category=category, source=source,
    )  # fmt: skip


def weight_rows(spec: ModelSpec, setup: TrainingSetup) -> tuple[PerParamRow, ...]:
    """Weights, gradients and master weights (optimizer rows come from :mod:`.optimizer`)."""
    plan = precision_plan(setup.precision)
    trainable = trainable_params(spec, setup)
    rows = [
        _row("weights", plan.weight, spec.params, Category.PARAMETERS,
             f"{setup.precision.value}: model parameters in {plan.weight.name}"),
        _row("gradients", plan.grad, trainable, Category.GRADIENTS,
             "param.grad has the parameter's dtype (torch AccumulateGrad)"),
    ]  # fmt: skip
    if plan.master is not None:
        rows.append(_row("master weights", plan.master, trainable, Category.MASTER_WEIGHTS,
                         "fp32 master copy for the update (Micikevicius et al. 2018, §3.1)"))  # fmt: skip
    return tuple(rows)


def buffer_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Registered buffers (e.g. RoPE inv_freq) are kept in fp32 by transformers' RoPE init."""
    del setup
    return dtypes.FP32.nbytes(spec.buffer_numel)
