"""What peft creates per adapted module, and the estimator's view of a LoRA / QLoRA job's model states.

Per adapted Linear with ``in`` inputs and ``out`` outputs (peft/tuners/lora/layer.py
``LoraLayer.update_layer``): ``lora_A`` = Linear(in, r, bias=False) (r x in), ``lora_B`` =
Linear(r, out, bias=lora_bias) (out x r); DoRA (``use_dora``, peft/tuners/lora/dora.py) adds the
magnitude vector ``lora_magnitude_vector`` (out). Embeddings: ``lora_embedding_A`` (r x V) and
``lora_embedding_B`` (h x r). GPT-2's ``Conv1D`` stores its weight (in, out) (``fan_in_fan_out``).

Adapter dtype: ``get_peft_model(..., autocast_adapter_dtype=True)`` (the default) upcasts fp16/bf16
adapter weights to fp32 (peft/tuners/tuners_utils.py ``_cast_adapter_dtype``); torchtune builds its
LoRA modules in the model's dtype (bf16).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, cast

from peakmem import dtypes
from peakmem.adapters import LoraConfig, lora_of, quant_of
from peakmem.bnb_versions import BNB_CURRENT, release_facts
from peakmem.breakdown import Category, PerParamRow
from peakmem.dtypes import DType
from peakmem.model import Component, LayerGroup, ModelSpec, Tensor, TensorKind
from peakmem.peft_versions import PEFT_CURRENT
from peakmem.peft_versions import release_facts as peft_facts
from peakmem.training import Method, Precision
from peakmem.transformers_versions import TRANSFORMERS_CURRENT

from ..memo import Memo, memoised
from ..model_states import PrecisionPlan, precision_plan
from ..qlora import base_bytes
from .targets import PEFT_MOE_CONVERSION, AdaptedModule, resolve_targets

SRC_LORA = "peft/tuners/lora/layer.py LoraLayer.update_layer: lora_A (r x in), lora_B (out x r)"
# transformers 4.x MoE (formulas/lora/targets.py): one adapter per expert Linear, ``copies`` = E of them
SRC_DORA = "peft/tuners/lora/dora.py DoraLinearLayer: magnitude (out), (m/||W+BA||-1)*Wx + m/||.||*BAx"
SRC_QLORA_BASE = "transformers BitsAndBytesConfig: Linear4bit/Linear8bitLt; embeddings, head, norms 16-bit"


# --- parameter counts -----------------------------------------------------------------------------
def module_adapter_tensors(m: AdaptedModule, lora: LoraConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The trainable tensors peft creates for one adapted module: (name, shape)."""
    r = lora.rank
    if m.kind == "saved":
        return ((f"{m.path} (modules_to_save copy)", (m.numel,)),)
    if m.kind == "embedding":
        return (("lora_embedding_A", (r, m.in_features)), ("lora_embedding_B", (m.out_features, r)))
    rr = r * m.experts * m.rank_factor
    out: list[tuple[str, tuple[int, ...]]] = [
        ("lora_A", (rr, m.in_features)),
        ("lora_B", (m.out_features, rr)),
    ]
    if lora.lora_bias:
        out.append(("lora_B.bias", (m.out_features,)))
    if lora.dora:
        out.append(("lora_magnitude_vector", (m.out_features,)))
    return tuple(out)


def _occurrences(spec: ModelSpec, m: AdaptedModule) -> int:
    """How many of the model's layers hold ``m``: a parameter target naming layers is in those only."""
    if m.group is None:
        return 1
    return len(m.layers) if m.layers else spec.groups[m.group].count


def adapter_tensors(spec: ModelSpec, lora: LoraConfig) -> tuple[tuple[Tensor, int], ...]:
    """Every trainable tensor as a :class:`Tensor` with its occurrences (like ``spec.tensors()``)."""
    out: list[tuple[Tensor, int]] = []
    for m in resolve_targets(spec, lora):
        for name, shape in module_adapter_tensors(m, lora):
            kind: TensorKind = "linear_weight" if len(shape) == 2 else "other"
            component = cast(Component, m.component)
            t = Tensor(name=f"{m.path}.{name}", module=name, shape=shape, component=component, kind=kind,
                       copies=m.copies)  # fmt: skip
            out.append((t, _occurrences(spec, m)))
    return tuple(out)


def trainable_params(spec: ModelSpec, lora: LoraConfig) -> int:
    """``sum(p.numel() for p in peft_model.parameters() if p.requires_grad)``."""
    return sum(t.numel * n for t, n in adapter_tensors(spec, lora))


def saved_copy_params(spec: ModelSpec, lora: LoraConfig) -> int:
    """Parameters of the modules_to_save copies (the originals stay in the frozen base)."""
    return sum(m.numel * _occurrences(spec, m) for m in resolve_targets(spec, lora) if m.kind == "saved")


def layer_trainable_params(spec: ModelSpec, lora: LoraConfig, group: int) -> int:
    """Trainable parameters of one layer of ``spec.groups[group]`` (its gradients per layer)."""
    total = 0
    for m in resolve_targets(spec, lora):
        if m.group == group:
            total += sum(math.prod(s) for _n, s in module_adapter_tensors(m, lora)) * m.copies
    return total


def adapter_dtype(lora: LoraConfig, base: DType) -> DType:
    """peft autocasts 16-bit adapters to fp32 (``autocast_adapter_dtype=True``); "base" keeps the base's."""
    if lora.adapter_dtype == "base":
        return base
    return dtypes.parse_dtype(lora.adapter_dtype)


# --- the estimator's view of a LoRA / QLoRA job ---------------------------------------------------------
# What :func:`peakmem.estimate.estimate_training` asks when ``setup.method`` is lora or qlora. The
# setup is read duck-typed (``setup.method``, ``setup.lora``, ``setup.quant``; the configs are inputs:
# :mod:`peakmem.adapters`).
def is_adapter_method(setup: Any) -> bool:
    return str(getattr(setup.method, "value", setup.method)) != "full"


def trainable_spec(spec: ModelSpec, lora: LoraConfig, memo: Memo | None = None) -> ModelSpec:
    """The trainable tensors as a :class:`ModelSpec` (same layer groups and counts), so that optimizer
    formulas written for full fine-tuning run unchanged over the adapters (``memo``: an estimator's keeps
    it by the spec's identity and the config; a planner asks thousands of times)."""
    return memoised(memo, "trainable_spec", spec, lambda: _trainable_spec(spec, lora, memo), key=lora)


def _trainable_spec(spec: ModelSpec, lora: LoraConfig, memo: Memo | None) -> ModelSpec:
    per_group: list[list[Tensor]] = [[] for _ in spec.groups]
    outer: list[Tensor] = []
    for m in resolve_targets(spec, lora, memo):
        for name, shape in module_adapter_tensors(m, lora):
            kind: TensorKind = "linear_weight" if len(shape) == 2 else "other"
            t = Tensor(name=f"{m.path}.{name}", module=name, shape=shape,
                       component=cast(Component, m.component), kind=kind, copies=m.copies)  # fmt: skip
            (outer if m.group is None else per_group[m.group]).append(t)
    groups = tuple(
        LayerGroup(count=g.count, layer=replace(g.layer, tensors=tuple(per_group[i])))
        for i, g in enumerate(spec.groups)
    )
    return replace(spec, name=f"{spec.name} (adapters)", groups=groups, outer=tuple(outer), buffers=())


def train_dtype(lora: LoraConfig, plan: PrecisionPlan) -> DType:
    """The adapters' parameter dtype (and so their gradients')."""
    return adapter_dtype(lora, plan.weight)


def optimizer_precision(setup: Any, plan: PrecisionPlan) -> Precision:
    """The precision whose rows describe the adapters' optimizer: fp32 adapters train like fp32 (no
    master copy: peft's default on a 16-bit base); bf16 adapters under a precision without master weights
    (the HF Trainer's autocast, fp32: TRL 0.26+ casts QLoRA adapters to bf16, peakmem.trl_versions) train
    like pure bf16, their states ``torch.zeros_like(p)`` in bf16 (torch 2.13 optim/adam.py
    ``Adam._init_group``, which AdamW inherits); other 16-bit adapters keep the setup's precision."""
    a_dtype = train_dtype(lora_of(setup), plan)
    if a_dtype.bits == 32:
        return Precision.FP32
    if plan.master is None and a_dtype == dtypes.BF16:
        return Precision.BF16
    return cast(Precision, setup.precision)


def finetune_weight_rows(
    spec: ModelSpec, setup: Any, plan: PrecisionPlan, memo: Memo | None = None
) -> tuple[PerParamRow, ...]:
    """Frozen base (16-bit, or quantized for QLoRA), adapters, their gradients (and master copies)."""
    lora = lora_of(setup)
    tspec = trainable_spec(spec, lora, memo)
    trainable = tspec.params
    a_dtype = train_dtype(lora, plan)
    quant = quant_of(setup)
    if quant is None:
        base = PerParamRow(tensor="base weights (frozen)", dtype=plan.weight.name,
                           bytes_per_param=plan.weight.itemsize, bytes=plan.weight.nbytes(spec.params),
                           params=spec.params, category=Category.PARAMETERS,
                           source="peft: the base model keeps its dtype, requires_grad=False")  # fmt: skip
    else:
        nbytes = base_bytes(spec, quant)
        base = PerParamRow(tensor=f"base weights (frozen, {quant.label})", dtype=quant.quant,
                           bytes_per_param=nbytes / spec.params, bytes=nbytes, params=spec.params,
                           category=Category.PARAMETERS, source=SRC_QLORA_BASE)  # fmt: skip
    rows = [
        base,
        PerParamRow(tensor="LoRA adapters (A, B" + (", magnitude" if lora.dora else "") + ")",
                    dtype=a_dtype.name, bytes_per_param=a_dtype.itemsize, bytes=a_dtype.nbytes(trainable),
                    params=trainable, category=Category.PARAMETERS, source=SRC_LORA),
        PerParamRow(tensor="gradients (adapters only)", dtype=a_dtype.name, bytes_per_param=a_dtype.itemsize,
                    bytes=a_dtype.nbytes(trainable), params=trainable, category=Category.GRADIENTS,
                    source="the frozen base gets no .grad; adapters' grads take their dtype"),
    ]  # fmt: skip
    if a_dtype.bits < 32 and plan.master is not None:
        rows.append(PerParamRow(tensor="master weights (adapters)", dtype=plan.master.name,
                                bytes_per_param=plan.master.itemsize, bytes=plan.master.nbytes(trainable),
                                params=trainable, category=Category.MASTER_WEIGHTS,
                                source="fp32 master copy of the 16-bit adapters"))  # fmt: skip
    return tuple(rows)


def optimizer_view(spec: ModelSpec, setup: Any, memo: Memo | None = None) -> tuple[ModelSpec, Any]:
    """(the trainable tensors as a spec, a full fine-tuning setup that trains them in their dtype): the
    optimizer formulas of :mod:`peakmem.formulas.optimizer` run unchanged on this pair."""
    if not is_adapter_method(setup):
        return spec, setup
    plan = precision_plan(setup.precision)
    names = {f.name for f in fields(setup)}
    changes: dict[str, Any] = {"method": Method.FULL, "precision": optimizer_precision(setup, plan)}
    changes.update({k: None for k in ("lora", "quant") if k in names})
    return trainable_spec(spec, lora_of(setup), memo), replace(setup, **changes)


def weight_rows_for(
    spec: ModelSpec, setup: Any, full_rows: Callable[[ModelSpec, Any], tuple[PerParamRow, ...]]
) -> tuple[PerParamRow, ...]:
    if not is_adapter_method(setup):
        return full_rows(spec, setup)
    return finetune_weight_rows(spec, setup, precision_plan(setup.precision))


def layer_grad_bytes(spec: ModelSpec, setup: Any, group: int, memo: Memo | None = None) -> int:
    """Gradient bytes one layer of ``spec.groups[group]`` writes in backward: its adapters'."""
    lora = lora_of(setup)
    a_dtype = train_dtype(lora, precision_plan(setup.precision))
    return a_dtype.nbytes(trainable_spec(spec, lora, memo).groups[group].layer.params)


def outer_grad_split(spec: ModelSpec, setup: Any, memo: Memo | None = None) -> int:
    """Gradients of trainable tensors outside the layers (modules_to_save copies, adapted embeddings or
    pooler), written at the start of backward."""
    lora = lora_of(setup)
    a_dtype = train_dtype(lora, precision_plan(setup.precision))
    return a_dtype.nbytes(sum(t.numel for t in trainable_spec(spec, lora, memo).outer))


def assumptions(spec: ModelSpec, setup: Any, memo: Memo | None = None) -> tuple[str, ...]:
    """What the LoRA / QLoRA estimate assumed, for ``Estimate.assumptions``."""
    if not is_adapter_method(setup):
        return ()
    lora = lora_of(setup)
    mods = resolve_targets(spec, lora, memo)
    names = sorted({m.leaf for m in mods if m.kind != "saved"})
    out = [
        f"LoRA (peft 0.21.2): r={lora.rank}, alpha={lora.alpha:g}, "
        f"targets {', '.join(lora.targets) or 'peft default'}"
        f" -> {', '.join(names)}; adapters in {lora.adapter_dtype}"
        + (" (peft upcasts 16-bit adapters to fp32)" if lora.adapter_dtype == "fp32" else ""),
        "frozen base: no gradients or optimizer states; Linear inputs and RMSNorm outputs saved only for the "
        "frozen weights' gradients are not kept; nothing before the first adapter requires grad",
    ]
    if lora.dora:
        out.append(
            "DoRA: magnitude vector per adapted module; base and LoRA outputs saved by the DoRA scaling"
        )
    quant = quant_of(setup)
    if quant is not None:
        version = getattr(setup, "bitsandbytes", BNB_CURRENT)
        out.append(
            f"QLoRA base: bitsandbytes {quant.label} (blocksize {quant.blocksize}); embeddings, head, "
            "norms, MoE routers and fused experts stay 16-bit; one layer's weight dequantized at a time"
        )
        if quant.is_4bit and release_facts(version).matmul4bit_saves_input:
            out.append(
                f"bitsandbytes {version}: each 4-bit Linear whose input requires grad keeps that input for "
                f"backward ({release_facts(version).source}; dropped in 0.43.2, PR #1270)"
                + ("; kept by the 4-bit stand-ins of this derived model's measured blocks"
                   if spec.derived_from else "")
            )  # fmt: skip
    if lora.target_parameters:
        out.append(_parameter_targets_note(lora, getattr(setup, "peft", PEFT_CURRENT)))
    converted = PEFT_MOE_CONVERSION.get(spec.model_type) is not None  # not the user's target_parameters
    if converted and any(m.kind == "param" for m in mods):
        out.append(
            "MoE: peft 0.21.2 maps v4 expert/router names onto transformers 5 fused parameters "
            "(target_parameters; gate_up_proj at rank 2r)"
        )
    experts = [m for m in mods if m.copies > 1]
    if experts:
        out.append(
            f"MoE (transformers {getattr(setup, 'transformers', TRANSFORMERS_CURRENT)}: per-expert nn.Linear "
            f"modules): peft adapts each expert's {', '.join(sorted({m.leaf for m in experts}))} on its own "
            "(one adapter per expert), each run on the tokens routed to its expert"
            + ("; the routers are nn.Linear too" if any(m.component == "router" for m in mods) else "")
        )
    return tuple(out)


def _parameter_targets_note(lora: LoraConfig, version: str) -> str:
    """What the ParamWrapper estimate of ``lora.target_parameters`` assumed (lora/param_wrapper.py)."""
    facts = peft_facts(version)
    how = (
        "W + scaling * lhs @ rhs in one baddbmm (3-D parameters)"
        if facts.factors
        else "a full-size delta per forward (einsum and its scaled copy in the adapters' dtype, cast to W's)"
    )
    note = (
        f"target_parameters {', '.join(lora.target_parameters)} (peft {version} ParamWrapper): {how}; the "
        "merged weight saved by its consumer, read once per forward; its gradient in backward"
    )
    if not facts.cached_forward:
        note += "; peft < 0.19 merges again at every access of the parameter (per-expert loops: not modelled)"
    return note
