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
from dataclasses import dataclass

from peakmem import dtypes
from peakmem.breakdown import Category, MemoryItem
from peakmem.dtypes import DType
from peakmem.errors import InputError, require
from peakmem.model import Layer, ModelSpec, Tensor

ALL_LINEAR = "all-linear"  # peft/utils/constants.py INCLUDE_LINEAR_LAYERS_SHORTHAND
SEQ_CLS_HEAD_NAMES = ("score", "classifier")  # peft/utils/constants.py SEQ_CLS_HEAD_NAMES
# peft/peft_model.py PeftModelForSequenceClassification: classifier_module_names
SEQ_CLS_MODULES_TO_SAVE = ("classifier", "score")
# transformers/pytorch_utils.py Conv1D (weight stored in x out) is used by modeling_gpt2.py only here.
CONV1D_MODEL_TYPES = frozenset({"gpt2"})
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
_MOE_FUSED_MIXTRAL = {"gate_up_proj": ("w1", "w3")}
_MOE_FUSED_QWEN2 = {"gate_up_proj": ("gate_proj", "up_proj")}
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
        require(isinstance(self.rank, int) and self.rank >= 1, "lora_rank", self.rank,
                "must be a positive integer")  # fmt: skip
        require(self.alpha > 0, "lora_alpha", self.alpha, "must be positive")
        require(0.0 <= self.dropout < 1.0, "lora_dropout", self.dropout, "must be in [0, 1)")
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
    if spec.model_type in CONV1D_MODEL_TYPES and t.module in ("c_attn", "c_proj", "c_fc"):
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
        hit = next(((old, new) for old, new in mapping.items() if key == old or key.endswith("." + old)), None)
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


def resolve_targets(spec: ModelSpec, lora: LoraConfig) -> tuple[AdaptedModule, ...]:
    """The modules and parameters peft adapts (and the modules_to_save copies), per occurrence."""
    targets = lora.targets
    if not targets and not lora.target_parameters:
        if spec.model_type not in PEFT_DEFAULT_TARGETS:
            raise InputError(
                f"lora_targets='default': peft has no default target modules for model_type "
                f"{spec.model_type!r}; name them (modules: {', '.join(available_modules(spec))}) or use all-linear"
            )
        targets = PEFT_DEFAULT_TARGETS[spec.model_type]
    saved = _saved_names(spec, lora)
    modules = _modules(spec)

    def excluded(path: str) -> bool:
        return any(_matches(path, m) for m in saved)

    linear_all = [
        (path, t, g) for path, t, g in modules if _is_linear(t) and not _is_output_layer(spec, t) and not excluded(path)
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
        raise InputError(f"lora_targets={','.join(lora.targets)!r}: matches no adaptable module of {spec.name}")
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
            raise InputError(f"target_parameters={key!r}: matches no parameter (parameters: {', '.join(names)})")
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
            kind = "linear_weight" if len(shape) == 2 else "other"
            t = Tensor(name=f"{m.path}.{name}", module=name, shape=shape, component=m.component,  # type: ignore[arg-type]
                       kind=kind)  # fmt: skip
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


def _act(path: str, nbytes: int, source: str) -> MemoryItem:
    return MemoryItem(path=path, category=Category.ACTIVATIONS, bytes=nbytes, source=source)


def adapter_saved_per_module(
    m: AdaptedModule,
    lora: LoraConfig,
    *,
    tokens: int,
    x_bytes: int,
    a_bytes: int,
    cuda: bool,
    autocast_bytes: int = 0,
) -> tuple[int, int]:
    """(bytes lora_A's input costs beyond the shared x, bytes of the other saved adapter tensors).

    ``x_bytes``: element size of the module input; ``a_bytes``: of the adapter weights;
    ``autocast_bytes``: under torch autocast the 16-bit compute size (the adapter matmuls run on casts).
    """
    if m.kind in ("saved", "embedding"):
        return 0, 0
    r, t, n_in, n_out = lora.rank * m.experts * m.rank_factor, tokens, m.in_features, m.out_features
    if m.kind == "param":
        return 0, t * r * max(a_bytes, autocast_bytes)  # peft ParamWrapper: A(x) saved (approximation)
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


def _layer(spec: ModelSpec, group: int) -> Layer:
    return spec.groups[group].layer
