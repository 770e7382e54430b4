"""Optimizer states and the temporaries of one optimizer step.

States (per trainable parameter tensor):
* AdamW/Adam: ``exp_avg`` and ``exp_avg_sq`` shaped like the parameter (torch/optim/adam.py
  ``_init_group``); ``step`` is a CPU scalar unless fused/capturable (not counted: 4 B/tensor).
* SGD: none; SGD with momentum: ``momentum_buffer`` (torch/optim/sgd.py).
* Adafactor (transformers/optimization.py ``Adafactor.step``, ``beta1=None`` as HF Trainer's
  ``optim="adafactor"``): for >= 2-D parameters the factored second moment
  ``exp_avg_sq_row`` (shape[:-1]) and ``exp_avg_sq_col`` (shape[:-2] + shape[-1:]); 1-D
  parameters keep a full ``exp_avg_sq``. States take the dtype of ``grad.float()``: fp32.
* Lion (Chen et al. 2023, arXiv 2302.06675, Alg. 2; lion-pytorch): one ``exp_avg``.

Step temporaries, by implementation (torch 2.13 torch/optim/adam.py):
* foreach (``_multi_tensor_adam``): ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``
  allocates one state-sized tensor per parameter of the device/dtype group, all alive until the
  final ``_foreach_addcdiv_`` (decoupled weight decay is an in-place ``_foreach_mul_``).
* fused (``_fused_adam``): one kernel, no temporaries.
* for-loop (``_single_tensor_adam``): ``denom = exp_avg_sq.sqrt() / ...`` then
  ``exp_avg.clone()``: two tensors of the parameter being updated; the largest one counts.

Adafactor step temporaries:
* foreach: only ``torch.optim.Adafactor`` has one (transformers' has none). torch 2.13
  torch/optim/_adafactor.py ``_multi_tensor_adafactor`` groups the tensors by (device, dtype,
  is-matrix). Matrix group: ``var_estimates = [row_var @ col_var ...]`` (l. 564-569) is one
  full-size tensor per parameter, in the gradient's dtype, all alive together; the following
  ``_foreach_clamp_min_``/``_foreach_rsqrt_``/``_foreach_mul_`` (l. 589-599) turn them in place
  into ``updates`` (the row/col means and ``row_var_means`` are row/column-sized). Vector group:
  ``grads_squared = _foreach_mul(grads, grads)`` (l. 581) then ``var_estimates = [v.clone() ...]``
  (l. 586), each vector-sized, while the matrix group's ``var_estimates``/``updates`` names still
  hold its list. So the step holds one gradient-sized tensor per trainable parameter at once.
* for-loop: transformers/optimization.py ``Adafactor.step`` (HF Trainer's ``optim="adafactor"``),
  tensor by tensor: the largest tensor's ``grad**2 + eps`` and row x col product (see below).
"""

from __future__ import annotations

from peakmem import dtypes
from peakmem.breakdown import Category, MemoryItem, PerParamRow
from peakmem.dtypes import DType
from peakmem.model import ModelSpec
from peakmem.training import OptimizerImpl, OptimizerName, TrainingSetup

from . import lowbit_optim
from .memo import Memo
from .model_states import SpecFacts, precision_plan, spec_facts, trainable_params

SOURCE_ADAM = "torch/optim/adam.py _init_group: exp_avg, exp_avg_sq = zeros_like(param)"
SOURCE_SGD = "torch/optim/sgd.py: momentum_buffer = clone(grad)"
SOURCE_ADAFACTOR = "transformers/optimization.py Adafactor.step: exp_avg_sq_row/col (factored), fp32"
SOURCE_LION = "Chen et al. 2023 (arXiv 2302.06675) Alg. 2: one momentum exp_avg"
SOURCE_FOREACH = "torch/optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)"
SOURCE_FOR_LOOP = "torch/optim/adam.py _single_tensor_adam: denom = exp_avg_sq.sqrt()/..; exp_avg.clone()"
SOURCE_ADAFACTOR_TMP = "transformers Adafactor.step: update = grad**2 + eps; _approx_sq_grad(row, col)"
SOURCE_ADAFACTOR_FOREACH = (
    "torch/optim/_adafactor.py _multi_tensor_adafactor: var_estimates = [row_var @ col_var ...] "
    "(one per matrix) + vector group's grads_squared / v.clone(), all in the gradients' dtype"
)
SOURCE_MASTER_GRAD = (
    "master.grad = p.grad.float(); p.grad = None, tensor by tensor: the 16-bit grads become fp32 "
    "(DeepSpeed FP16_Optimizer/BF16_Optimizer, Megatron Float16OptimizerWithFloat16Params)"
)


# Step temporaries sized by every trainable parameter (an engine that shards the states shards them
# too); the others are sized by the largest tensor being updated.
KEY_FOREACH_SQRT = "optimizer.foreach_sqrt"
KEY_ADAFACTOR_FOREACH = "optimizer.adafactor_foreach"
PER_PARAM_TEMPORARIES = frozenset({KEY_FOREACH_SQRT, KEY_ADAFACTOR_FOREACH})


def _shapes(spec: ModelSpec, memo: Memo | None) -> SpecFacts:
    return spec_facts(spec, memo)


def state_dtype(setup: TrainingSetup) -> DType:
    """Adafactor keeps fp32 states whatever the weights (``grad.float()``); others follow the plan."""
    if setup.optimizer is OptimizerName.ADAFACTOR:
        return dtypes.FP32
    return precision_plan(setup.precision).state


def _state_row(tensor: str, dtype: DType, numel: int, params: int, source: str) -> PerParamRow:
    nbytes = dtype.nbytes(numel)
    return PerParamRow(
        tensor=tensor, dtype=dtype.name, bytes_per_param=nbytes / params if params else 0.0,
        bytes=nbytes, params=params, category=Category.OPTIMIZER_STATES, source=source,
    )  # fmt: skip


def optimizer_rows(
    spec: ModelSpec, setup: TrainingSetup, memo: Memo | None = None
) -> tuple[PerParamRow, ...]:
    """The optimizer-state rows of the bytes/param table (``memo``: an estimator's)."""
    if lowbit_optim.handles(setup):
        return lowbit_optim.optimizer_rows(spec, setup)
    params = trainable_params(spec, setup, memo)
    dt = state_dtype(setup)
    name = setup.optimizer
    if name in (OptimizerName.ADAMW, OptimizerName.ADAM):
        label = "AdamW" if name is OptimizerName.ADAMW else "Adam"
        return (
            _state_row(f"{label} m (exp_avg)", dt, params, params, SOURCE_ADAM),
            _state_row(f"{label} v (exp_avg_sq)", dt, params, params, SOURCE_ADAM),
        )
    if name is OptimizerName.SGD_MOMENTUM:
        return (_state_row("SGD momentum buffer", dt, params, params, SOURCE_SGD),)
    if name is OptimizerName.LION:
        return (_state_row("Lion momentum (exp_avg)", dt, params, params, SOURCE_LION),)
    if name is OptimizerName.ADAFACTOR:
        factored = _shapes(spec, memo).factored
        return (_state_row("Adafactor v (factored row/col)", dt, factored, params, SOURCE_ADAFACTOR),)
    return ()  # plain SGD keeps no state


def step_temporaries(
    spec: ModelSpec, setup: TrainingSetup, memo: Memo | None = None
) -> tuple[MemoryItem, ...]:
    """Tensors the optimizer step allocates beyond the states (its own peak, all at once)."""
    if lowbit_optim.handles(setup):
        return lowbit_optim.step_temporaries(spec, setup)
    plan = precision_plan(setup.precision)
    shapes = _shapes(spec, memo)
    params = trainable_params(spec, setup, memo)
    dt = state_dtype(setup)
    items: list[MemoryItem] = []
    name, impl = setup.optimizer, setup.optimizer_impl
    if name in (OptimizerName.ADAMW, OptimizerName.ADAM):
        if impl is OptimizerImpl.FOREACH:
            items.append(MemoryItem(
                path="optimizer.foreach exp_avg_sq_sqrt", category=Category.TEMPORARIES,
                bytes=dt.nbytes(params), source=SOURCE_FOREACH, key=KEY_FOREACH_SQRT,
            ))  # fmt: skip
        elif impl is OptimizerImpl.FOR_LOOP:
            items.append(MemoryItem(
                path="optimizer.denom + exp_avg.clone (largest tensor)", category=Category.TEMPORARIES,
                bytes=2 * dt.nbytes(shapes.largest), source=SOURCE_FOR_LOOP, key="optimizer.for_loop_denom",
            ))  # fmt: skip
    elif name is OptimizerName.ADAFACTOR and impl is OptimizerImpl.FOREACH:
        # every trainable parameter's var_estimate/update at once, in the dtype of the grads it reads
        grad_dt = plan.master if plan.master is not None else plan.grad
        items.append(MemoryItem(
            path="optimizer.foreach adafactor var_estimates", category=Category.TEMPORARIES,
            bytes=grad_dt.nbytes(params), source=SOURCE_ADAFACTOR_FOREACH, key=KEY_ADAFACTOR_FOREACH,
        ))  # fmt: skip
    elif name is OptimizerName.ADAFACTOR:
        # grad**2 (+eps) and the row x col product, both fp32 and full-size, for the largest tensor;
        # 16-bit weights add the fp32 copies of grad and of the parameter (grad.float(), p.float()).
        n_full = 2 if plan.weight.bits == 32 else 4
        items.append(MemoryItem(
            path="optimizer.adafactor update (largest tensor)", category=Category.TEMPORARIES,
            bytes=n_full * dtypes.FP32.nbytes(shapes.largest), source=SOURCE_ADAFACTOR_TMP,
            key="optimizer.adafactor_update",
        ))  # fmt: skip
    elif name is OptimizerName.LION:
        items.append(MemoryItem(
            path="optimizer.lion update (largest tensor)", category=Category.TEMPORARIES,
            bytes=2 * dt.nbytes(shapes.largest),
            source="lion-pytorch update_fn: exp_avg.clone().mul_(b1).add(grad).sign_()",
            key="optimizer.lion_update",
        ))  # fmt: skip
    return tuple(items)


def optimizer_phase_grads(spec: ModelSpec, setup: TrainingSetup, memo: Memo | None = None) -> MemoryItem:
    """The gradients the optimizer step reads: the model's own, or (mixed-*) their fp32 copies on
    the master weights, which replace the 16-bit ones one tensor at a time."""
    plan = precision_plan(setup.precision)
    params = trainable_params(spec, setup, memo)
    if plan.master is not None:
        return MemoryItem(path="gradients (fp32, on the master weights)", category=Category.GRADIENTS,
                          bytes=plan.master.nbytes(params), source=SOURCE_MASTER_GRAD,
                          key="gradients.master")  # fmt: skip
    return MemoryItem(path="gradients", category=Category.GRADIENTS, bytes=plan.grad.nbytes(params),
                      source="param.grad has the parameter's dtype (torch AccumulateGrad)",
                      key="gradients")  # fmt: skip
