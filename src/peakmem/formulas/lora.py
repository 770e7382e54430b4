"""LoRA / DoRA adapters as peft 0.21.2 creates them: which modules, how many parameters, what they save.

Target resolution (peft/tuners/tuners_utils.py):

* ``all-linear`` (``_maybe_include_all_linear_layers``): every ``nn.Linear`` / transformers ``Conv1D``
  except the output layer (``model.get_output_embeddings()``: the LM head) and, for sequence
  classification (``TaskType.SEQ_CLS``), the classifier head (``SEQ_CLS_HEAD_NAMES``). MoE routers in
  transformers 5.23 are ``*TopKRouter`` modules holding a bare ``nn.Parameter`` (not Linear), and fused
  experts are 3-D parameters: neither is matched.
* a list of names (``check_target_module_exists``): a module matches when its full name equals a
  key or ends with ``"." + key``. Matching a module that is neither Linear, Conv1D nor Embedding is an
  error in peft ("Target module ... is not supported"); peakmem raises it up front.
* ``target_parameters`` (``lora.ParamWrapper``): LoRA on a bare parameter such as the fused experts
  ``mlp.experts.gate_up_proj`` (E, a, b): ``lora_A`` Linear(in, r*E), ``lora_B`` Linear(r*E, out).
  No dropout, no DoRA (peft raises).
* ``modules_to_save`` (``ModulesToSaveWrapper``): a trainable copy of the module; the original stays
  frozen. ``PeftModelForSequenceClassification`` adds ``classifier`` / ``score`` itself.

Per adapted Linear with ``in`` inputs and ``out`` outputs (peft/tuners/lora/layer.py
``LoraLayer.update_layer``): ``lora_A`` = Linear(in, r, bias=False) (r x in), ``lora_B`` =
Linear(r, out, bias=lora_bias) (out x r); DoRA (``use_dora``, peft/tuners/lora/dora.py) adds the
magnitude vector ``lora_magnitude_vector`` (out). Embeddings: ``lora_embedding_A`` (r x V) and
``lora_embedding_B`` (h x r). GPT-2's ``Conv1D`` stores its weight (in, out) (``fan_in_fan_out``).

Adapter dtype: ``get_peft_model(..., autocast_adapter_dtype=True)`` (the default) upcasts fp16/bf16
adapter weights to fp32 (peft/tuners/tuners_utils.py ``_cast_adapter_dtype``); torchtune builds its
LoRA modules in the model's dtype (bf16).

Activations (peft ``lora.Linear.forward``): ``result = base_layer(x)``; ``x = x.to(lora_A.weight.dtype)``
(a new tensor per adapted module when the dtypes differ); ``lora_B(lora_A(dropout(x))) * scaling``
added to ``result``; ``result.to(result_dtype)``. Autograd saves (aten derivatives.yaml: ``mm`` keeps
``mat1`` only when ``mat2`` requires grad): lora_A's input (the cast, or the dropout output plus its
mask), lora_A's output (T x r) for lora_B. The frozen base no longer keeps what only its weight
gradients needed: Linear inputs, the RMSNorm output that multiplies the norm weight, the LM head input.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, cast

from peakmem import dtypes
from peakmem.breakdown import Category, MemoryItem, PerParamRow
from peakmem.derived import FIRST_BLOCK
from peakmem.dtypes import DType
from peakmem.errors import InputError, require
from peakmem.formulas.activations import (
    LayerActivations,
    Shapes,
    block_norm_count,
    norm_saved,
    post_mlp_norm_backward,
    qk_norm_width,
    rmsnorm_weight_side_bytes,
)
from peakmem.formulas.loss import HeadActivations
from peakmem.formulas.model_states import PrecisionPlan, precision_plan
from peakmem.formulas.qlora import QuantConfig, base_bytes, dequant_temporaries
from peakmem.model import Component, Layer, LayerGroup, ModelSpec, Tensor, TensorKind
from peakmem.training import Method, Precision
from peakmem.validate import MAX_WIDTH, check_int, check_real

ALL_LINEAR = "all-linear"  # peft/utils/constants.py INCLUDE_LINEAR_LAYERS_SHORTHAND
SEQ_CLS_HEAD_NAMES = ("score", "classifier")  # peft/utils/constants.py SEQ_CLS_HEAD_NAMES
# peft/peft_model.py PeftModelForSequenceClassification: classifier_module_names
SEQ_CLS_MODULES_TO_SAVE = ("classifier", "score")
# The two peft tables below stay keyed by ``model_type`` on purpose: peft itself looks them up by
# ``model.config.model_type``, so the key is peft's behaviour, not a property of the architecture that
# a ModelSpec field should carry (every other model-type behaviour is a ModelSpec field set by hf.py).
# peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING (the model types peakmem
# knows): what ``LoraConfig(target_modules=None)`` adapts.
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "gpt2": ("c_attn",), "bloom": ("query_key_value",), "opt": ("q_proj", "v_proj"),
    "gpt_neox": ("query_key_value",), "bert": ("query", "value"), "roberta": ("query", "value"),
    "llama": ("q_proj", "v_proj"), "falcon": ("query_key_value",), "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"), "gemma": ("q_proj", "v_proj"), "gemma2": ("q_proj", "v_proj"),
    "gemma3_text": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj"), "qwen3": ("q_proj", "v_proj"),
}  # fmt: skip
# peft/utils/transformers_weight_conversion.py ``_convert_peft_config_moe`` (run by ``inject_adapter`` on
# transformers >= 5): for MoE model types whose transformers checkpoint-conversion pattern is Mixtral's or
# Qwen2-MoE's (transformers/conversion_mapping.py ``_MODEL_TO_CONVERSION_PATTERN``; ``qwen2_moe`` itself
# has no entry), v4 module names (and every name ``all-linear`` finds, plus these keys) are mapped to
# ``target_parameters`` and removed from ``target_modules``. A fused parameter needs all its v4 names
# and gets rank r x len(names).
_MOE_MAPPING_MIXTRAL = {"gate": "gate.weight", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"}
_MOE_MAPPING_QWEN2 = {
    "gate": "gate.weight", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj",
}  # fmt: skip
_MOE_FUSED_MIXTRAL: dict[str, tuple[str, ...]] = {"gate_up_proj": ("w1", "w3")}
_MOE_FUSED_QWEN2: dict[str, tuple[str, ...]] = {"gate_up_proj": ("gate_proj", "up_proj")}
PEFT_MOE_CONVERSION: dict[str, tuple[dict[str, str], dict[str, tuple[str, ...]]]] = {
    "mixtral": (_MOE_MAPPING_MIXTRAL, _MOE_FUSED_MIXTRAL),
    "minimax": (_MOE_MAPPING_MIXTRAL, _MOE_FUSED_MIXTRAL),
    **{mt: (_MOE_MAPPING_QWEN2, _MOE_FUSED_QWEN2) for mt in (
        "deepseek_v2", "deepseek_v3", "qwen3_moe", "olmoe", "glm4_moe", "ernie4_5_moe", "dots1",
        "hunyuan_v1_moe", "qwen3_next", "flex_olmo",
    )},
}  # fmt: skip
DEFAULT_RANK = 8  # peft LoraConfig.r
DEFAULT_ALPHA = 8  # peft LoraConfig.lora_alpha
ADAPTER_DTYPES = ("fp32", "bf16", "fp16", "base")
SRC_LORA = "peft/tuners/lora/layer.py LoraLayer.update_layer: lora_A (r x in), lora_B (out x r)"
SRC_DORA = "peft/tuners/lora/dora.py DoraLinearLayer: magnitude (out), (m/||W+BA||-1)*Wx + m/||.||*BAx"
SRC_QLORA_BASE = "transformers BitsAndBytesConfig: Linear4bit/Linear8bitLt; embeddings, head, norms 16-bit"
SRC_SAVE = "aten mm/addmm save mat1 only when the weight requires grad (derivatives.yaml)"


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """peft's ``LoraConfig`` as far as memory goes. ``targets=()`` means peft's default for the
    model type (``target_modules=None``)."""

    rank: int = DEFAULT_RANK
    alpha: float = DEFAULT_ALPHA
    targets: tuple[str, ...] = (ALL_LINEAR,)
    target_parameters: tuple[str, ...] = ()
    dropout: float = 0.0
    dora: bool = False
    adapter_dtype: str = "fp32"  # "base": the base model's dtype (autocast_adapter_dtype=False)
    lora_bias: bool = False
    modules_to_save: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_int("lora_rank", self.rank, maximum=MAX_WIDTH, what="(wider than any layer)")
        check_real("lora_alpha", self.alpha)
        require(self.alpha > 0, "lora_alpha", self.alpha, "must be positive")
        check_real("lora_dropout", self.dropout, minimum=0.0, maximum=1.0, closed_max=False)
        require(self.adapter_dtype in ADAPTER_DTYPES, "adapter_dtype", self.adapter_dtype,
                f"choose one of {', '.join(ADAPTER_DTYPES)}")  # fmt: skip
        for key in self.targets:
            require(bool(key.strip()), "lora_targets", ",".join(self.targets), "empty module name")
        if ALL_LINEAR in self.targets and len(self.targets) > 1:
            raise InputError(
                f"lora_targets={','.join(self.targets)!r}: all-linear cannot be combined with names"
            )
        if self.target_parameters and self.dora:
            raise InputError("dora=True: peft's LoRA on target_parameters does not support DoRA")
        if self.target_parameters and self.dropout:
            raise InputError(
                f"lora_dropout={self.dropout!r}: peft's LoRA on target_parameters needs dropout 0"
            )

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def parse_targets(text: str) -> tuple[str, ...]:
    """``"q_proj,v_proj"`` -> ``("q_proj", "v_proj")``; ``"all-linear"``; ``"default"`` -> ``()``."""
    key = text.strip()
    if key.lower() == ALL_LINEAR:
        return (ALL_LINEAR,)
    if key.lower() in ("", "default"):
        return ()
    names = tuple(k.strip() for k in key.split(","))
    if any(not n for n in names):
        raise InputError(f"lora_targets={text!r}: empty module name")
    return names


@dataclass(frozen=True, kw_only=True)
class AdaptedModule:
    """One adapted module (per occurrence) of a layer group or of the outer model."""

    path: str  # module path inside its layer (or the model), e.g. "self_attn.q_proj"
    kind: str  # "linear" | "embedding" | "param" (target_parameters) | "saved" (modules_to_save copy)
    in_features: int
    out_features: int
    experts: int  # E for a 3-D parameter, else 1
    group: int | None  # index into spec.groups; None: outer module (embeddings, head, pooler)
    component: str
    numel: int = 0  # modules_to_save: parameters of the copy
    rank_factor: int = 1  # peft's MoE conversion: a fused gate_up_proj gets rank 2r

    @property
    def leaf(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def _is_linear(t: Tensor) -> bool:
    return t.kind == "linear_weight" and t.component != "router"  # routers: TopKRouter, bare Parameter


def _in_out(spec: ModelSpec, t: Tensor) -> tuple[int, int]:
    """(in_features, out_features) of a Linear/Conv1D weight as transformers stores it."""
    if t.module in spec.conv1d_modules:
        return t.shape[0], t.shape[1]  # Conv1D: (in, out)
    return t.shape[1], t.shape[0]


def _modules(spec: ModelSpec) -> list[tuple[str, Tensor, int | None]]:
    """(module path, its weight tensor, group index or None) for every module with a weight."""
    out: list[tuple[str, Tensor, int | None]] = []
    for t in spec.outer:
        if t.name.endswith(".weight"):
            out.append((t.name.removesuffix(".weight"), t, None))
    for gi, g in enumerate(spec.groups):
        for t in g.layer.tensors:
            if t.name.endswith(".weight"):
                out.append((t.name.removesuffix(".weight"), t, gi))
            elif t.kind == "expert_weight":
                out.append((t.name.rsplit(".", 1)[0], t, gi))  # the experts module
    return out


def _matches(path: str, key: str) -> bool:
    return path == key or path.endswith("." + key)


def _is_output_layer(spec: ModelSpec, t: Tensor) -> bool:
    """peft all-linear excludes ``get_output_embeddings()`` and, for SEQ_CLS, the classifier."""
    if t.component == "head":
        return True
    return spec.task == "sequence-classification" and t.module in SEQ_CLS_HEAD_NAMES


def _saved_names(spec: ModelSpec, lora: LoraConfig) -> tuple[str, ...]:
    names = list(lora.modules_to_save)
    if spec.task == "sequence-classification":
        names += [n for n in SEQ_CLS_MODULES_TO_SAVE if n not in names]
    return tuple(names)


def available_modules(spec: ModelSpec) -> list[str]:
    """Leaf names of the modules LoRA can adapt (Linear, Conv1D, Embedding), in model order."""
    seen: dict[str, None] = {}
    for _path, t, _g in _modules(spec):
        if _is_linear(t) or t.kind == "embedding":
            seen.setdefault(t.module, None)
    return list(seen)


def _make(spec: ModelSpec, path: str, t: Tensor, group: int | None) -> AdaptedModule:
    if t.kind == "embedding":
        return AdaptedModule(path=path, kind="embedding", in_features=t.shape[0], out_features=t.shape[1],
                             experts=1, group=group, component=t.component)  # fmt: skip
    fan_in, fan_out = _in_out(spec, t)
    return AdaptedModule(path=path, kind="linear", in_features=fan_in, out_features=fan_out, experts=1,
                         group=group, component=t.component)  # fmt: skip


def _moe_convert(
    spec: ModelSpec, modules: tuple[str, ...], all_linear_leaves: tuple[str, ...], params: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
    """peft's v4 -> v5 MoE target conversion: (remaining target_modules, (target parameter, rank factor))."""
    found = PEFT_MOE_CONVERSION.get(spec.model_type)
    out_params = [(p, 1) for p in params]
    if found is None:
        return modules, tuple(out_params)
    mapping, fused = found
    names = (*all_linear_leaves, *mapping) if modules == (ALL_LINEAR,) else modules
    remaining: list[str] = []
    present: dict[str, set[str]] = {new: set() for new in fused}
    for key in dict.fromkeys(names):
        hit = next(
            ((old, new) for old, new in mapping.items() if key == old or key.endswith("." + old)), None
        )
        if hit is None:
            remaining.append(key)
            continue
        old, new = hit
        present.setdefault(new, set()).add(old)
        if all(p != new for p, _f in out_params):
            out_params.append((new, 1))
    for new, olds in fused.items():
        got = present.get(new, set())
        if 0 < len(got) < len(olds):
            raise InputError(
                f"lora_targets={','.join(sorted(got))!r}: peft cannot adapt it without also targeting "
                f"{', '.join(sorted(set(olds) - got))}: they are fused into {new} in transformers 5"
            )
        if len(got) == len(olds) > 1:
            out_params = [(p, len(olds) if p == new else f) for p, f in out_params]
    return tuple(remaining), tuple(out_params)


_TARGETS_CACHE: dict[tuple[int, LoraConfig], tuple[ModelSpec, tuple[AdaptedModule, ...]]] = {}
_TARGETS_CACHE_MAX = 256


def resolve_targets(spec: ModelSpec, lora: LoraConfig) -> tuple[AdaptedModule, ...]:
    """The modules and parameters peft adapts (and the modules_to_save copies), per occurrence.

    Memoised by the spec's identity (kept alive in the memo) and the config: an estimate asks several
    times, a planner thousands. Errors are not memoised (raised again on every call)."""
    key = (id(spec), lora)
    hit = _TARGETS_CACHE.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    out = _resolve_targets(spec, lora)
    if len(_TARGETS_CACHE) >= _TARGETS_CACHE_MAX:
        _TARGETS_CACHE.clear()
    _TARGETS_CACHE[key] = (spec, out)
    return out


def _resolve_targets(spec: ModelSpec, lora: LoraConfig) -> tuple[AdaptedModule, ...]:
    targets = lora.targets
    if not targets and not lora.target_parameters:
        if spec.model_type not in PEFT_DEFAULT_TARGETS:
            raise InputError(
                f"lora_targets='default': peft has no default target modules for model_type "
                f"{spec.model_type!r}; name them (modules: {', '.join(available_modules(spec))}) "
                "or use all-linear"
            )
        targets = PEFT_DEFAULT_TARGETS[spec.model_type]
    saved = _saved_names(spec, lora)
    modules = _modules(spec)

    def excluded(path: str) -> bool:
        return any(_matches(path, m) for m in saved)

    linear_all = [
        (path, t, g)
        for path, t, g in modules
        if _is_linear(t) and not _is_output_layer(spec, t) and not excluded(path)
    ]
    if targets != (ALL_LINEAR,):
        for key in targets:
            if not any(_matches(path, key) for path, _t, _g in modules) and not _moe_name(spec, key):
                raise InputError(
                    f"lora_targets={key!r}: matches no module of {spec.name} "
                    f"(modules: {', '.join(available_modules(spec))})"
                )
    leaves = tuple(dict.fromkeys(path.rsplit(".", 1)[-1] for path, _t, _g in linear_all))
    targets, params = _moe_convert(spec, targets, leaves, lora.target_parameters)
    out: list[AdaptedModule] = []
    for path, t, g in modules:
        if excluded(path):
            if t.name.endswith(".weight"):
                numel = sum(x.numel for x in (spec.outer if g is None else spec.groups[g].layer.tensors)
                            if x.name.rsplit(".", 1)[0] == path)  # fmt: skip
                out.append(AdaptedModule(path=path, kind="saved", in_features=0, out_features=0, experts=1,
                                         group=g, component=t.component, numel=numel))  # fmt: skip
            continue
        if targets == (ALL_LINEAR,):
            if _is_linear(t) and not _is_output_layer(spec, t):
                out.append(_make(spec, path, t, g))
            continue
        if any(_matches(path, key) for key in targets):
            if not (_is_linear(t) or t.kind == "embedding"):
                what = "fused 3-D expert parameters" if t.kind == "expert_weight" else f"a {t.kind} module"
                raise InputError(
                    f"lora_targets={','.join(targets)!r}: {path} is {what}, not a Linear/Conv1D/Embedding; "
                    "peft cannot adapt it" + (" (use target_parameters)" if t.kind == "expert_weight" else "")
                )
            out.append(_make(spec, path, t, g))
    out += _resolve_parameters(spec, params)
    if not any(m.kind != "saved" for m in out):
        raise InputError(
            f"lora_targets={','.join(lora.targets)!r}: matches no adaptable module of {spec.name}"
        )
    return tuple(out)


def _moe_name(spec: ModelSpec, key: str) -> bool:
    found = PEFT_MOE_CONVERSION.get(spec.model_type)
    return found is not None and any(key == old or key.endswith("." + old) for old in found[0])


def _resolve_parameters(spec: ModelSpec, params: tuple[tuple[str, int], ...]) -> list[AdaptedModule]:
    out: list[AdaptedModule] = []
    for key, factor in params:
        found = False
        for gi, g in enumerate(spec.groups):
            for t in g.layer.tensors:
                if not _matches(t.name, key) or len(t.shape) < 2:
                    continue
                found = True
                if len(t.shape) == 3:
                    e, a, b = t.shape
                else:
                    e, (a, b) = 1, (t.shape[1], t.shape[0])
                out.append(AdaptedModule(path=t.name, kind="param", in_features=a, out_features=b,
                                         experts=e * t.copies, group=gi, component=t.component,
                                         rank_factor=factor))  # fmt: skip
        if not found:
            names = sorted({t.name for g in spec.groups for t in g.layer.tensors if len(t.shape) >= 2})
            raise InputError(
                f"target_parameters={key!r}: matches no parameter (parameters: {', '.join(names)})"
            )
    return out


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
    return 1 if m.group is None else spec.groups[m.group].count


def adapter_tensors(spec: ModelSpec, lora: LoraConfig) -> tuple[tuple[Tensor, int], ...]:
    """Every trainable tensor as a :class:`Tensor` with its occurrences (like ``spec.tensors()``)."""
    out: list[tuple[Tensor, int]] = []
    for m in resolve_targets(spec, lora):
        for name, shape in module_adapter_tensors(m, lora):
            kind: TensorKind = "linear_weight" if len(shape) == 2 else "other"
            component = cast(Component, m.component)
            t = Tensor(name=f"{m.path}.{name}", module=name, shape=shape, component=component, kind=kind)
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
            total += sum(math.prod(s) for _n, s in module_adapter_tensors(m, lora))
    return total


def adapter_dtype(lora: LoraConfig, base: DType) -> DType:
    """peft autocasts 16-bit adapters to fp32 (``autocast_adapter_dtype=True``); "base" keeps the base's."""
    if lora.adapter_dtype == "base":
        return base
    return dtypes.parse_dtype(lora.adapter_dtype)


# --- activations ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AdapterActivations:
    """Per layer of a group: what the adapters add, and what the frozen base stops saving."""

    saved: tuple[MemoryItem, ...]  # added by the adapter path
    removed: int  # bytes full fine-tuning saves only for the frozen weights' gradients
    forward_transient: int  # the largest adapter temporary in forward (B output, sum, cast back)


def _act(path: str, nbytes: int, source: str, key: str) -> MemoryItem:
    return MemoryItem(path=path, category=Category.ACTIVATIONS, bytes=nbytes, source=source, key=key)


SRC_PARAM_WRAPPER = (
    "peft/tuners/lora/layer.py ParamWrapper._activate_lora: the parameter becomes W + scaling * lhs @ rhs "
    "(_LoraFactorsProxy: one baddbmm over the factors cast to W's dtype, when E > 1; else "
    "_LoraParameterProxy: W + delta), which its consumer (grouped_mm, F.linear) saves for the input gradient"
)


def param_wrapper_saved(
    m: AdaptedModule, lora: LoraConfig, param_bytes: int, a_bytes: int, *, merged_saved: bool = True
) -> int:
    """What an adapted bare parameter (peft ``ParamWrapper``, ``target_parameters``) keeps per forward:
    the merged weight ``W + scaling * B A`` (the parameter's size and dtype: its consumer saves it), and,
    for a 3-D expert stack (``_LoraFactorsProxy``'s ``baddbmm``), the two factors cast to the parameter's
    dtype when the adapter's differs (``baddbmm`` saves both). Nothing per token: the adapter never sees
    the input (:data:`SRC_PARAM_WRAPPER`)."""
    merged = m.experts * m.in_features * m.out_features * param_bytes if merged_saved else 0
    rr = lora.rank * m.experts * m.rank_factor
    cast = m.experts > 1 and a_bytes != param_bytes
    factors = rr * (m.in_features + m.out_features) * param_bytes if cast else 0
    return merged + factors


def adapter_saved_per_module(
    m: AdaptedModule,
    lora: LoraConfig,
    *,
    tokens: int,
    x_bytes: int,
    a_bytes: int,
    cuda: bool,
    autocast_bytes: int = 0,
    param_bytes: int = 0,
    merged_saved: bool = True,
) -> tuple[int, int]:
    """(bytes lora_A's input costs beyond the shared x, bytes of the other saved adapter tensors).

    ``x_bytes``: element size of the module input; ``a_bytes``: of the adapter weights;
    ``autocast_bytes``: under torch autocast the 16-bit compute size (the adapter matmuls run on casts).
    ``param_bytes``: element size of an adapted bare parameter (``target_parameters``; ``x_bytes`` when 0);
    ``merged_saved``: whether its consumer saves the merged weight itself (False: DeepSeek's router saves
    an fp32 copy of it instead, counted with the router).
    """
    if m.kind in ("saved", "embedding"):
        return 0, 0
    r, t, n_in, n_out = lora.rank * m.experts * m.rank_factor, tokens, m.in_features, m.out_features
    if m.kind == "param":
        return 0, param_wrapper_saved(m, lora, param_bytes or x_bytes, a_bytes, merged_saved=merged_saved)
    lin = autocast_bytes or a_bytes  # dtype lora_A computes in
    input_cost = 0
    if lora.dropout > 0:
        mask = t * n_in if cuda else t * n_in * (a_bytes if a_bytes != x_bytes else x_bytes)
        input_cost = t * n_in * lin + mask  # dropout output (cast when autocast) + its mask
    elif autocast_bytes or a_bytes != x_bytes:
        input_cost = t * n_in * lin  # x.to(adapter dtype) (or autocast's cast), one per adapted module
    other = t * r * lin  # lora_A output, saved by lora_B
    if lora.dora:
        other += t * n_out * (x_bytes + lin)  # base_result and lora_result saved by the DoRA muls
    return input_cost, other


__all__ = [
    "ALL_LINEAR",
    "AdaptedModule",
    "AdapterActivations",
    "LoraConfig",
    "adapter_dtype",
    "adapter_saved_per_module",
    "adapter_tensors",
    "available_modules",
    "layer_trainable_params",
    "parse_targets",
    "resolve_targets",
    "trainable_params",
]


# --- the estimator's view of a LoRA / QLoRA job ---------------------------------------------------------
# What :func:`peakmem.estimate.estimate_training` asks when ``setup.method`` is lora or qlora. The
# setup is read duck-typed (``setup.method``, ``setup.lora``, ``setup.quant``) so that
# :mod:`peakmem.training` can hold these configs without importing this module at runtime.
def is_adapter_method(setup: Any) -> bool:
    return str(getattr(setup.method, "value", setup.method)) != "full"


_DEFAULT_LORA = LoraConfig()  # frozen: one instance for every setup without a config


def lora_of(setup: Any) -> LoraConfig:
    """The setup's LoRA config; peft's defaults (r=8, all-linear here) when none was given."""
    found = getattr(setup, "lora", None)
    return found if isinstance(found, LoraConfig) else _DEFAULT_LORA


def trainable_spec(spec: ModelSpec, lora: LoraConfig) -> ModelSpec:
    """The trainable tensors as a :class:`ModelSpec` (same layer groups and counts), so that optimizer
    formulas written for full fine-tuning run unchanged over the adapters."""
    per_group: list[list[Tensor]] = [[] for _ in spec.groups]
    outer: list[Tensor] = []
    for m in resolve_targets(spec, lora):
        for name, shape in module_adapter_tensors(m, lora):
            kind: TensorKind = "linear_weight" if len(shape) == 2 else "other"
            t = Tensor(name=f"{m.path}.{name}", module=name, shape=shape,
                       component=cast(Component, m.component), kind=kind)  # fmt: skip
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
    master copy: peft's default on a 16-bit base); 16-bit adapters keep the setup's precision."""
    if train_dtype(lora_of(setup), plan).bits == 32:
        return Precision.FP32
    return cast(Precision, setup.precision)


def finetune_weight_rows(spec: ModelSpec, setup: Any, plan: PrecisionPlan) -> tuple[PerParamRow, ...]:
    """Frozen base (16-bit, or quantized for QLoRA), adapters, their gradients (and master copies)."""
    lora = lora_of(setup)
    tspec = trainable_spec(spec, lora)
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


def quant_of(setup: Any) -> QuantConfig | None:
    """QLoRA's base format: the setup's, else NF4 with double quantization (Dettmers et al. 2023)."""
    if str(getattr(setup.method, "value", setup.method)) != "qlora":
        return None
    found = getattr(setup, "quant", None)
    return found if isinstance(found, QuantConfig) else QuantConfig(quant="nf4", double_quant=True)


def _module_dtypes_same(lora: LoraConfig, sh: Shapes) -> bool:
    """lora_A keeps the module input itself (no new storage): same dtype, no dropout, no autocast."""
    a = train_dtype(lora, sh.plan)
    return lora.dropout == 0 and not sh.plan.autocast and a.bits // 8 == sh.c


def _kept(readers: list[AdaptedModule], lora: LoraConfig, sh: Shapes, int8_base: bool) -> bool:
    return int8_base or (any(m.kind == "linear" for m in readers) and _module_dtypes_same(lora, sh))


def adapt_layer(
    spec: ModelSpec, group: int, la: LayerActivations, sh: Shapes, setup: Any
) -> LayerActivations:
    """One layer's saved tensors under LoRA: the frozen base drops what only its weight gradients needed
    (Linear inputs, the RMSNorm output multiplying the norm weight); the adapters add theirs."""
    lora = lora_of(setup)
    quant = quant_of(setup)
    int8_base = quant is not None and not quant.is_4bit  # MatMul8bitLt saves its input
    layer = spec.groups[group].layer
    mods = [m for m in resolve_targets(spec, lora) if m.group == group]
    t, c, h = sh.tokens, sh.c, spec.hidden_size
    att_readers, mlp_readers, o_proj, down = _roles(spec, layer, mods)
    # the normalised x each frozen RMSNorm kept only for its weight's gradient (0 for LayerNorm)
    y_norm = rmsnorm_weight_side_bytes(spec, sh, h)
    out: list[MemoryItem] = []
    down_dropped = 0
    for item in la.saved:
        nbytes = item.bytes
        # Falcon-7B's one shared norm output (key "input.attn_mlp"): one storage read by both halves,
        # kept while either the attention or the MLP readers keep it (``_kept``), else all of it goes
        if item.key == "input.attn_mlp":
            kept = _kept(att_readers, lora, sh, int8_base) or _kept(mlp_readers, lora, sh, int8_base)
            nbytes = nbytes if kept else 0
        elif item.key == "norms":
            nbytes -= block_norm_count(layer) * y_norm  # 2 pre-norms; Gemma 2/3's sandwich norms: 4
        elif item.key == "attn.qk_norm":  # Qwen3 / Gemma 3 / OLMo 2 q_norm, k_norm: frozen weights too
            nbytes -= rmsnorm_weight_side_bytes(spec, sh, qk_norm_width(layer))
        elif item.key == "input.attn":
            nbytes = nbytes if _kept(att_readers, lora, sh, int8_base) else 0
        elif item.key == "input.mlp":
            # an adapted router that reads the 16-bit norm output (not DeepSeek's fp32 copy) saves it too
            router = _router_adapted(mods) and not layer.mlp.router_fp32
            nbytes = nbytes if router or _kept(mlp_readers, lora, sh, int8_base) else 0
        elif item.key == "attn.output_copy" and not _kept(o_proj, lora, sh, int8_base):
            nbytes = 0  # the contiguous copy is o_proj's input only, saved for its frozen weight's grad
        elif item.key == "attn.output" and not _kept(o_proj, lora, sh, int8_base):
            # eager's o_proj input (SDPA keeps its own output for its backward: "attn.sdpa_output")
            nbytes -= t * layer.attention.num_heads * layer.attention.v_head_dim * c
        elif _drops_down_input(item.key, layer, down, lora, sh, int8_base):
            down_dropped = t * layer.mlp.intermediate_size * c
            nbytes -= down_dropped
        elif item.key in ("attn.mla_kv_latent", "attn.mla_q_latent"):
            nbytes -= _mla_latent_drop(item.key, spec, layer, mods, lora, sh, int8_base)
        elif layer.mlp.is_moe:
            nbytes -= _moe_frozen_drop(item.key, spec, layer, mods, down, lora, sh, int8_base)
        out.append(item if nbytes == item.bytes >= 0 else replace(item, bytes=max(0, nbytes)))
    a_bytes = train_dtype(lora, sh.plan).bits // 8
    cuda = sh.policy.value == "cuda"
    ac = c if sh.plan.autocast else 0
    inputs = others = early = down_early = 0
    for m in mods:
        x_bytes = sh.r if (sh.plan.autocast and m in att_readers + mlp_readers) else c
        merged = not (m.component == "router" and layer.mlp.router_fp32)
        i_cost, o_cost = adapter_saved_per_module(m, lora, tokens=t, x_bytes=x_bytes, a_bytes=a_bytes,
                                                  cuda=cuda, autocast_bytes=ac,
                                                  param_bytes=sh.plan.weight.bits // 8,
                                                  merged_saved=merged)  # fmt: skip
        inputs += i_cost
        others += o_cost
        if m in mlp_readers or m in down or m in o_proj:
            early += i_cost + o_cost
        if m in down:
            down_early += i_cost + o_cost
    if inputs:
        out.append(_act("lora: adapter inputs (casts / dropout)", inputs, SRC_SAVE, "lora.adapter_inputs"))
    if others:
        out.append(_act("lora: A outputs" + (" + DoRA products" if lora.dora else ""), others, SRC_LORA,
                        "lora.a_outputs"))  # fmt: skip
    if group == 0 and spec.groups[0].count == 1 and not _embeddings_adapted(spec, lora):
        # the first layer's first norm reads the frozen embeddings' output: nothing requires grad yet
        first_norm = norm_saved(spec, sh, h) - y_norm
        out = [replace(i, bytes=i.bytes - first_norm) if i.key == "norms" else i for i in out]
    saved = tuple(i for i in out if i.bytes)
    # an adapter's forward temporaries come before what its layer saves after that module: net of it, as
    # under recomputation (the last layer's all-linear LoRA on tiny Falcon peaked 5% high without it);
    # at the down projection, last, its input (not saved when the frozen base dropped it) and the
    # residual stream are alive next to them (tiny BERT's peak, measured under the simulator)
    fwd = max(
        la.forward_transient, _recompute_transient(saved, att_readers, o_proj, mlp_readers, down, lora, sh)
    )
    if down:
        fwd = max(fwd, adapter_forward_transient(down, lora, sh) + down_dropped + t * h * sh.r)
    # activations.py's backward transient is net of the down projection's input, freed once that
    # Linear's backward ran; a frozen down projection never saved it, so nothing is freed: its input
    # gradient and the activation's gradients (gelu_new: grad of 0.5x and of 1 + tanh; gated: of
    # act(gate) and up) sit next to every saved tensor. Measured with the tracker on CPU (tiny GPT-2,
    # c_attn LoRA, full checkpointing): 3 T x I gradient tensors above the 4 gelu_new saves.
    bwd = la.backward_transient + down_dropped
    freed = la.backward_freed
    if len(la.backward_stages) == 2:
        # the attention core's backward runs after the MLP half's and the output projection's: their
        # adapters' saved inputs and A outputs are freed by then (measured under the simulator: tiny
        # Falcon, all-linear LoRA, the last layer's softmax backward); the MLP stage's peak comes after
        # the down projection's backward, which freed its adapter's
        (m_net, m_freed, m_grads), (a_net, a_freed, a_grads) = la.backward_stages
        mlp_stage = (m_net + down_dropped - down_early, m_freed - down_dropped + down_early, m_grads)
        if down_early:
            # while the adapted down projection runs its backward, nothing of the layer is freed yet: the
            # incoming gradient, the frozen base's input gradient and lora_A's gradient of the cast input
            # (the activation's backward comes after): the parity grid's gpt2 LoRA peaks here (CPU)
            during = sum(t * m.in_features for m in down) * (c + a_bytes)
            mlp_stage = max(mlp_stage, (t * h * sh.r + m_grads + during, 0, m_grads))
        att_stage = (a_net + down_dropped - early, a_freed - down_dropped + early, a_grads)
        bwd, freed, _ = max(mlp_stage, att_stage)
    # a block ending with a norm (Gemma 2/3, OLMo 2) starts its backward in it: a frozen norm kept no
    # weight-side y, so nothing of the block is freed yet (activations.py post_mlp_norm_backward)
    post_norm = post_mlp_norm_backward(spec, layer, sh)
    if post_norm > bwd:
        bwd, freed = post_norm, 0
    if str(getattr(setup.checkpointing, "value", setup.checkpointing)) == "full":
        # the recomputation in backward runs the adapters' forward again: at each adapted module, its
        # temporaries next to what was recomputed before it (the layer's saved tensors minus those after)
        bwd = max(bwd, _recompute_transient(saved, att_readers, o_proj, mlp_readers, down, lora, sh))
    if quant is not None:
        tmp = dequant_temporaries(spec, quant, tokens=t, compute_bytes=c)
        fwd = max(fwd, tmp.forward)
        bwd = bwd + tmp.backward
    return replace(
        la, saved=saved, forward_transient=fwd, backward_transient=bwd, backward_freed=max(0, freed)
    )


def adapter_forward_transient(mods: list[AdaptedModule], lora: LoraConfig, sh: Shapes) -> int:
    """While one adapted module runs forward (peft ``result + lora_B(lora_A(x)) * scaling``): the base
    output (compute dtype), lora_B's output and its scaled copy (adapter dtype) at once; the largest
    module. Matters when little else is alive: under checkpointing, while a layer is recomputed."""
    a = sh.c if sh.plan.autocast else train_dtype(lora, sh.plan).bits // 8
    best = 0
    for m in mods:
        if m.kind == "linear":
            best = max(best, sh.tokens * m.out_features * (2 * a + sh.c))
            if lora.dora:  # DoRA builds B @ A through lora_B(lora_A(eye(in))) and W + s * BA each forward
                best = max(best, (m.in_features**2 + 3 * m.in_features * m.out_features) * a)
    return best


def _recompute_transient(
    saved: tuple[MemoryItem, ...],
    att: list[AdaptedModule],
    o_proj: list[AdaptedModule],
    mlp: list[AdaptedModule],
    down: list[AdaptedModule],
    lora: LoraConfig,
    sh: Shapes,
) -> int:
    """The most alive beyond the full recomputation while an adapted module recomputes its forward."""

    def total(prefixes: tuple[str, ...]) -> int:
        return sum(i.bytes for i in saved if i.key.startswith(prefixes))

    s_mlp = total(("mlp.", "moe."))
    s_mlp_in = total(("input.mlp",)) + total(("norms",)) // 2
    s_attn = total(("attn.",))
    best = 0
    for mods, after in ((att, s_attn + s_mlp_in + s_mlp), (o_proj, s_mlp_in + s_mlp), (down, 0)):
        best = max(best, adapter_forward_transient(mods, lora, sh) - after)
    for m in mlp:  # gated MLPs run gate_proj and its activation before up_proj
        after = s_mlp // 2 if m.leaf in ("up_proj", "w3") else s_mlp
        best = max(best, adapter_forward_transient([m], lora, sh) - after)
    return best


def _embeddings_adapted(spec: ModelSpec, lora: LoraConfig) -> bool:
    return any(
        m.group is None and m.kind != "saved" and m.component in ("embeddings", "positions")
        for m in resolve_targets(spec, lora)
    )


def _drops_down_input(
    key: str, layer: Layer, down: list[AdaptedModule], lora: LoraConfig, sh: Shapes, int8_base: bool
) -> bool:
    """The MLP's down-projection input (act * up, or act(fc)) is saved only for the frozen weight's grad;
    ReLU saves its own output, and MoE experts are left as full fine-tuning counts them."""
    if key != "mlp.interior" or _kept(down, lora, sh, int8_base):
        return False
    return layer.mlp.activation != "relu" and not layer.mlp.is_moe


def _router_adapted(mods: list[AdaptedModule]) -> bool:
    return any(m.component == "router" for m in mods)


def _expert_adapted(mods: list[AdaptedModule], leaf: str) -> bool:
    return any(m.component == "experts" and m.leaf == leaf for m in mods)


def _mla_latent_drop(
    key: str,
    spec: ModelSpec,
    layer: Layer,
    mods: list[AdaptedModule],
    lora: LoraConfig,
    sh: Shapes,
    int8_base: bool,
) -> int:
    """MLA's latent RMSNorm (kv_a_layernorm / q_a_layernorm) under LoRA: its normed ``y`` is saved only for
    the frozen norm weight's gradient, and the normed latent only for the frozen kv_b_proj / q_b_proj
    weight's (unless lora_A keeps that same tensor: ``_kept``). Its fp32 upcast and rstd stay."""
    att = layer.attention
    kv = key == "attn.mla_kv_latent"
    rank, reader = (att.kv_lora_rank, "kv_b_proj") if kv else (att.q_lora_rank or 0, "q_b_proj")
    t = sh.tokens
    drop = rmsnorm_weight_side_bytes(spec, sh, rank)
    if not _kept([m for m in mods if m.leaf == reader], lora, sh, int8_base):
        drop += t * rank * sh.c
    return drop


def _moe_frozen_drop(
    key: str,
    spec: ModelSpec,
    layer: Layer,
    mods: list[AdaptedModule],
    down: list[AdaptedModule],
    lora: LoraConfig,
    sh: Shapes,
    int8_base: bool,
) -> int:
    """Bytes of an MoE layer's saved tensor that only a frozen weight's gradient needed (derivatives.yaml:
    mm / grouped_mm save their input only when the weight requires grad). Frozen experts: the up
    grouped_mm's gathered input and the down grouped_mm's input (the act * up product) are not kept; a
    frozen DeepSeek router keeps its fp32 weight copy but not its fp32 input copy; a frozen shared
    experts' down projection does not keep the gated product (``_drops_down_input`` for dense MLPs)."""
    mlp, t, c = layer.mlp, sh.tokens, sh.c
    s = t * mlp.experts_per_token
    if key == "moe.routed_inputs" and not _expert_adapted(mods, "gate_up_proj"):
        return s * spec.hidden_size * c
    if key == "mlp.interior" and not _expert_adapted(mods, "down_proj"):
        return s * mlp.intermediate_size * c
    if key == "moe.router_fp32" and not _router_adapted(mods) and not sh.plan.autocast and c != 4:
        return t * spec.hidden_size * 4
    if key == "mlp.shared_experts" and not _kept(down, lora, sh, int8_base):
        return t * mlp.shared_intermediate_size * c
    return 0


def _roles(
    spec: ModelSpec, layer: Layer, mods: list[AdaptedModule]
) -> tuple[list[AdaptedModule], list[AdaptedModule], list[AdaptedModule], list[AdaptedModule]]:
    """Adapted modules by what they read: attention input, MLP input, attention output, MLP interior."""
    att_in_names = {"q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "query_key_value", "query", "key",
                    "value", "q_a_proj", "kv_a_proj_with_mqa"}  # fmt: skip
    mlp_in_names = {"gate_proj", "up_proj", "gate_up_proj", "c_fc", "fc1", "dense_h_to_4h", "w1", "w3"}
    o_names = {"o_proj", "out_proj", "dense"}
    down_names = {"down_proj", "fc2", "dense_4h_to_h", "w2"}
    att, mlp, o, down = [], [], [], []
    for m in mods:
        leaf, comp = m.leaf, m.component
        if comp == "attention" and leaf in att_in_names:
            att.append(m)
        elif comp == "attention" and (leaf in o_names or (leaf == "c_proj")):
            o.append(m)
        elif comp in ("mlp", "shared_experts") and (
            leaf in mlp_in_names or m.path.endswith("intermediate.dense")
        ):
            mlp.append(m)
        elif comp in ("mlp", "shared_experts") and (
            leaf in down_names or leaf == "c_proj" or leaf == "dense"
        ):
            down.append(m)
    del spec, layer
    return att, mlp, o, down


def adapt_head(spec: ModelSpec, head: HeadActivations, sh: Shapes, setup: Any) -> HeadActivations:
    """The frozen head keeps neither its input nor the final norm's weight-side output."""
    del setup
    h = spec.hidden_size
    out = []
    for item in head.saved:
        nbytes = item.bytes
        if item.key == "head.lm_head_input":
            nbytes = 0
        elif item.key == "head.final_norm":
            nbytes -= rmsnorm_weight_side_bytes(spec, sh, h)
        out.append(item if nbytes == item.bytes >= 0 else replace(item, bytes=max(0, nbytes)))
    return replace(head, saved=tuple(i for i in out if i.bytes))


_TRAINABLE_CACHE: dict[tuple[int, LoraConfig], tuple[ModelSpec, ModelSpec]] = {}


def trainable_spec_cached(spec: ModelSpec, lora: LoraConfig) -> ModelSpec:
    """:func:`trainable_spec`, memoised by the spec's identity (a planner asks thousands of times)."""
    key = (id(spec), lora)
    hit = _TRAINABLE_CACHE.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    if len(_TRAINABLE_CACHE) > 256:
        _TRAINABLE_CACHE.clear()
    out = trainable_spec(spec, lora)
    _TRAINABLE_CACHE[key] = (spec, out)
    return out


def optimizer_view(spec: ModelSpec, setup: Any) -> tuple[ModelSpec, Any]:
    """(the trainable tensors as a spec, a full fine-tuning setup that trains them in their dtype): the
    optimizer formulas of :mod:`peakmem.formulas.optimizer` run unchanged on this pair."""
    if not is_adapter_method(setup):
        return spec, setup
    plan = precision_plan(setup.precision)
    names = {f.name for f in fields(setup)}
    changes: dict[str, Any] = {"method": Method.FULL, "precision": optimizer_precision(setup, plan)}
    changes.update({k: None for k in ("lora", "quant") if k in names})
    return trainable_spec_cached(spec, lora_of(setup)), replace(setup, **changes)


def weight_rows_for(
    spec: ModelSpec, setup: Any, full_rows: Callable[[ModelSpec, Any], tuple[PerParamRow, ...]]
) -> tuple[PerParamRow, ...]:
    if not is_adapter_method(setup):
        return full_rows(spec, setup)
    return finetune_weight_rows(spec, setup, precision_plan(setup.precision))


def layer_grad_bytes(spec: ModelSpec, setup: Any, group: int) -> int:
    """Gradient bytes one layer of ``spec.groups[group]`` writes in backward: its adapters'."""
    lora = lora_of(setup)
    a_dtype = train_dtype(lora, precision_plan(setup.precision))
    return a_dtype.nbytes(trainable_spec_cached(spec, lora).groups[group].layer.params)


def outer_grad_split(spec: ModelSpec, setup: Any) -> int:
    """Gradients of trainable tensors outside the layers (modules_to_save copies, adapted embeddings or
    pooler), written at the start of backward."""
    lora = lora_of(setup)
    a_dtype = train_dtype(lora, precision_plan(setup.precision))
    return a_dtype.nbytes(sum(t.numel for t in trainable_spec_cached(spec, lora).outer))


def split_first_layer(spec: ModelSpec) -> ModelSpec:
    """The same spec with its first layer as a group of its own: under LoRA nothing before the first
    adapter requires grad, so the first layer saves less than the others (see :func:`adapt_layer`)."""
    first = spec.groups[0]
    layer = first.layer
    if layer.derived is not None:  # a derived block: its costs measured on the first block itself
        layer = replace(layer, derived=replace(layer.derived, key=layer.derived.key + FIRST_BLOCK))
    if first.count == 1:
        return (
            spec
            if layer is first.layer
            else replace(spec, groups=(replace(first, layer=layer), *spec.groups[1:]))
        )
    groups = (LayerGroup(count=1, layer=layer), replace(first, count=first.count - 1), *spec.groups[1:])
    return replace(spec, groups=groups)


def adapt_embedding_items(
    spec: ModelSpec, items: tuple[MemoryItem, ...], setup: Any
) -> tuple[MemoryItem, ...]:
    """Frozen embeddings: the embedding dropout records no autograd node, so it saves no mask.

    Except under full checkpointing: transformers' ``_activation_checkpointing_enable``
    (modeling_utils.py; peft's ``_prepare_model_for_gradient_checkpointing`` too) calls
    ``enable_input_require_grads``, whose hook runs ``output.requires_grad_(True)`` on the input
    embeddings' output. That output becomes a leaf requiring grad: its ``AccumulateGrad`` node holds it
    for the whole backward, and the embedding dropout after it saves its mask again. Measured with the
    tracker on CPU (tiny GPT-2, c_attn LoRA, full checkpointing): both alive at the backward peak. The
    leaf is a tensor of its own only when something (learned positions added, dropout) runs between it
    and the first layer; otherwise (Llama, Qwen2) it is the first layer's checkpointed input itself."""
    if not is_adapter_method(setup) or _embeddings_adapted(spec, lora_of(setup)):
        return items
    if str(getattr(setup.checkpointing, "value", setup.checkpointing)) == "full":
        if spec.position != "learned" and spec.embedding_dropout <= 0:
            return items
        tokens = setup.micro_batch * setup.seq_len
        leaf = precision_plan(setup.precision).weight.nbytes(tokens * spec.hidden_size)
        src = "transformers enable_input_require_grads: embedding output.requires_grad_(True), a leaf"
        return (*items, MemoryItem(path="embeddings output (leaf requiring grad)",
                                   category=Category.ACTIVATIONS, bytes=leaf, source=src,
                                   key="embed.leaf_output"))  # fmt: skip
    return tuple(i for i in items if i.key != "embed.dropout_mask")


def assumptions(spec: ModelSpec, setup: Any) -> tuple[str, ...]:
    """What the LoRA / QLoRA estimate assumed, for ``Estimate.assumptions``."""
    if not is_adapter_method(setup):
        return ()
    lora = lora_of(setup)
    mods = resolve_targets(spec, lora)
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
        out.append(
            f"QLoRA base: bitsandbytes {quant.label} (blocksize {quant.blocksize}); embeddings, head, "
            "norms, MoE routers and fused experts stay 16-bit; one layer's weight dequantized at a time"
        )
    if any(m.kind == "param" for m in mods):
        out.append(
            "MoE: peft 0.21.2 maps v4 expert/router names onto transformers 5 fused parameters "
            "(target_parameters; gate_up_proj at rank 2r)"
        )
    return tuple(out)
