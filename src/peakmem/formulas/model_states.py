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
* ``float8-*``: torchao float8 training on mixed-bf16's states (the weights stay high precision).
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem import dtypes
from peakmem.breakdown import Category, PerParamRow
from peakmem.dtypes import DType
from peakmem.model import ModelSpec
from peakmem.training import Framework, Precision, TrainingSetup
from peakmem.transformers_versions import parse_transformers_version

from .memo import Memo, memoised
from .profiles import rope_cache_bytes
from .rope_buffers import rope_buffer_bytes


@dataclass(frozen=True, kw_only=True)
class PrecisionPlan:
    """The dtype of each model-state tensor and of the activations, for one precision."""

    weight: DType  # the parameters the model computes with
    grad: DType
    master: DType | None  # fp32 master copy kept by the optimizer wrapper (mixed-*)
    state: DType  # optimizer states
    compute: DType  # matmul outputs / most activations
    autocast: bool  # torch autocast: 16-bit casts of fp32 inputs and weights inside matmuls
    # the residual stream where something other than the precision decides it (a prepared quantized
    # base's fp32 norms: formulas/kbit_prep.py); None: see ``residual``
    residual_override: DType | None = None

    @property
    def residual(self) -> DType:
        """The residual stream: fp32 under autocast (embeddings and norms stay fp32), else compute."""
        if self.residual_override is not None:
            return self.residual_override
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
    """A float8 recipe's model states and unconverted modules are mixed-bf16's (``Precision.states``);
    what its converted Linears add is in :mod:`peakmem.formulas.activations.float8`."""
    return _PLANS[precision.states]


def trainable_params(spec: ModelSpec, setup: TrainingSetup, memo: Memo | None = None) -> int:
    """Parameters that get gradients and optimizer states (all of them in full fine-tuning)."""
    del setup  # adapters (LoRA/QLoRA) extend this; full fine-tuning trains everything
    return spec_facts(spec, memo).params


def _row(tensor: str, dtype: DType, params: int, category: Category, source: str) -> PerParamRow:
    return PerParamRow(
        tensor=tensor, dtype=dtype.name, bytes_per_param=dtype.itemsize, bytes=dtype.nbytes(params),
        params=params, category=category, source=source,
    )  # fmt: skip


def weight_rows(spec: ModelSpec, setup: TrainingSetup, memo: Memo | None = None) -> tuple[PerParamRow, ...]:
    """Weights, gradients and master weights (optimizer rows come from :mod:`.optimizer`)."""
    plan = precision_plan(setup.precision)
    trainable = trainable_params(spec, setup, memo)
    rows = [
        _row("weights", plan.weight, spec_facts(spec, memo).params, Category.PARAMETERS,
             f"{setup.precision.value}: model parameters in {plan.weight.name}"),
        _row("gradients", plan.grad, trainable, Category.GRADIENTS,
             "param.grad has the parameter's dtype (torch AccumulateGrad)"),
    ]  # fmt: skip
    if plan.master is not None:
        rows.append(_row("master weights", plan.master, trainable, Category.MASTER_WEIGHTS,
                         "fp32 master copy for the update (Micikevicius et al. 2018, §3.1)"))  # fmt: skip
    return tuple(rows)


def buffer_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Registered buffers (e.g. RoPE inv_freq) are kept in fp32 by transformers' RoPE init; a framework
    whose model code caches RoPE's cos/sin adds that cache (:func:`.profiles.rope_cache_bytes`), and so do
    transformers releases that kept one per layer (:mod:`.rope_buffers`), in the dtype the weights load in."""
    own = spec.derived_buffer_bytes or dtypes.FP32.nbytes(spec.buffer_numel)
    per_layer = 0
    if setup.framework is Framework.HF:
        version = parse_transformers_version(setup.transformers)
        loaded = precision_plan(setup.precision).weight.nbytes(1)  # from_pretrained's default dtype
        per_layer = rope_buffer_bytes(spec, version, setup.seq_len, loaded)
    return own + rope_cache_bytes(spec, setup) + per_layer


@dataclass(frozen=True, kw_only=True)
class SpecFacts:
    """Sums over a spec's tensor inventory that every estimate needs (computed once per spec)."""

    params: int
    largest: int  # elements of the largest single parameter tensor
    factored: int  # Adafactor second-moment elements (rows + cols of >= 2-D tensors, 1-D in full)
    sizes: tuple[tuple[int, int], ...]  # (elements per tensor, how many such tensors)
    layer_params: tuple[int, ...]  # per group: parameters of one layer
    mlp_params: tuple[int, ...]  # per group: MLP/expert/router parameters of one layer
    linear_params: tuple[int, ...]  # per group: Linear/expert weight elements of one layer
    same_as: tuple[int, ...]  # per group: the first group whose layer is equal (reuse its formulas)


_LINEAR_KINDS = ("linear_weight", "expert_weight")
_MLP_COMPONENTS = ("mlp", "experts", "shared_experts", "router")


def spec_facts(spec: ModelSpec, memo: Memo | None = None) -> SpecFacts:
    """The sums (``memo``: an estimator's keeps them by the spec's identity: a planner estimates one spec
    thousands of times)."""
    return memoised(memo, "spec_facts", spec, lambda: _spec_facts(spec))


def _spec_facts(spec: ModelSpec) -> SpecFacts:
    params = largest = factored = 0
    sizes: dict[int, int] = {}
    for t, n in spec.tensors():
        per_copy = t.numel // t.copies
        params += t.numel * n
        largest = max(largest, per_copy)
        sizes[per_copy] = sizes.get(per_copy, 0) + t.copies * n
        if len(t.shape) >= 2:
            factored += (per_copy // t.shape[-1] + per_copy // t.shape[-2]) * t.copies * n
        else:
            factored += t.numel * n
    layers = [g.layer for g in spec.groups]
    same_as = tuple(next(j for j in range(i + 1) if layers[j] == layers[i]) for i in range(len(layers)))
    facts = SpecFacts(
        same_as=same_as,
        params=params, largest=largest, factored=factored, sizes=tuple(sizes.items()),
        layer_params=tuple(g.layer.params for g in spec.groups),
        mlp_params=tuple(sum(t.numel for t in g.layer.tensors if t.component in _MLP_COMPONENTS)
                         for g in spec.groups),
        linear_params=tuple(sum(t.numel for t in g.layer.tensors if t.kind in _LINEAR_KINDS)
                            for g in spec.groups),
    )  # fmt: skip
    return facts
