"""Which modules peft 0.21.2 adapts (peft/tuners/tuners_utils.py).

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
* transformers before 5.0 (``LoraConfig.expert_linears``, set from :mod:`peakmem.transformers_versions` by
  :func:`peakmem.step_setup.setup_that_runs`): the MoE experts are one ``nn.Linear`` per expert and
  projection (4.48.1 modeling_qwen2_moe.py l. 603-617 ``Qwen2MoeSparseMoeBlock``: ``experts =
  nn.ModuleList`` of ``Qwen2MoeMLP``, ``gate = nn.Linear``; modeling_mixtral.py l. 67-107: ``w1`` / ``w2`` /
  ``w3``) and peft's matching is the one above over their names (``mlp.experts.7.up_proj`` ends with
  ``.up_proj``; peft 0.13.2 tuners_utils.py ``check_target_module_exists`` l. 908-925,
  ``_maybe_include_all_linear_layers`` l. 973-1018: every Linear's leaf name but the output layer's), so
  each expert's Linear gets its own adapter; the routers are ``nn.Linear`` in the model types of
  :data:`V4_LINEAR_ROUTERS` (all-linear adapts them). No v4 -> v5 conversion runs (it needs transformers 5).
* ``modules_to_save`` (``ModulesToSaveWrapper``): a trainable copy of the module; the original stays
  frozen. ``PeftModelForSequenceClassification`` adds ``classifier`` / ``score`` itself.
* Lit-GPT (``LoraConfig.qkv_slices``): its attention is one fused q/k/v Linear whatever the model, and
  ``LoRAQKVLinear`` adapts the slices its ``lora_query`` / ``lora_key`` / ``lora_value`` flags name:
  ``lora_A`` (r x enabled slices, in), ``lora_B`` (the enabled slices' widths, r), q = heads x head size,
  k = v = query groups x head size (litgpt/lora.py@5895df1 l. 220-243). Where the transformers model fuses
  them too (Falcon's ``query_key_value``, GPT-NeoX's, Phi-3's ``qkv_proj``) the names ``q_proj`` /
  ``k_proj`` / ``v_proj`` stand for those slices: one adapted module each, in = the hidden size, out = the
  slice's width, the same adapter tensors (formulas/lora/deltas.py fused_qkv_adapter counts the input they
  share and the zero pad).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from peakmem.adapters import ALL_LINEAR, EXPERTS, LoraConfig
from peakmem.errors import InputError
from peakmem.model import ModelSpec, Tensor

from ..memo import Memo, memoised

SEQ_CLS_HEAD_NAMES = ("score", "classifier")  # peft/utils/constants.py SEQ_CLS_HEAD_NAMES
# peft/peft_model.py PeftModelForSequenceClassification: classifier_module_names
SEQ_CLS_MODULES_TO_SAVE = ("classifier", "score")
# The two peft tables below stay keyed by ``model_type`` on purpose: peft itself looks them up by
# ``model.config.model_type``, so the key is peft's behaviour, not a property of the architecture that
# a ModelSpec field should carry (every other model-type behaviour is a ModelSpec field set by peakmem.hf).
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

# transformers 4.x per-expert MLP Linears (gate, up, down), by model type where they are not
# gate_proj / up_proj / down_proj (4.55.0 modeling_mixtral.py l. 62, modeling_minimax.py l. 406,
# modeling_phimoe.py l. 527: ``w1`` gate, ``w3`` up, ``w2`` down)
V4_EXPERT_LEAVES: dict[str, tuple[str, str, str]] = {
    mt: ("w1", "w3", "w2") for mt in ("mixtral", "minimax", "phimoe")
}
V4_DEFAULT_EXPERT_LEAVES = ("gate_proj", "up_proj", "down_proj")
# model types whose 4.x router is an ``nn.Linear`` (4.55.0 / 4.57.1 modeling files: ``self.gate = nn.Linear``
# in mixtral, minimax, phimoe, olmoe, flex_olmo, qwen2_moe, qwen3_moe, qwen3_next, ernie4_5_moe; jamba's
# ``router``); DeepSeek-V2's ``DeepseekV2MoEGate``, DeepSeek-V3's / dots1's / glm4_moe's / longcat_flash's
# ``*TopkRouter`` hold a bare ``nn.Parameter``; HunYuan's ``HunYuanMoEV1Gate`` wraps a Linear ``wg`` (not
# modelled: the spec's router is the bare weight)
V4_LINEAR_ROUTERS = frozenset({
    "mixtral", "minimax", "phimoe", "olmoe", "flex_olmo", "qwen2_moe", "qwen3_moe", "qwen3_next",
    "ernie4_5_moe", "jamba",
})  # fmt: skip


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
    # target_parameters naming layers (``22.mlp.experts.gate_up_proj``): the model's layer indices it is in
    # (in its group: split_target_layers gives each its own); (): every layer of the group
    layers: tuple[int, ...] = ()
    # transformers 4.x MoE: one Linear per expert (E), each with its own adapter, each run on the tokens
    # routed to its expert (over the E of them: tokens x experts_per_token rows)
    copies: int = 1

    @property
    def leaf(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def _is_linear(t: Tensor, routers: bool = False) -> bool:
    """A Linear peft can adapt; ``routers``: the MoE routers are ``nn.Linear`` too (transformers 4.x,
    :data:`V4_LINEAR_ROUTERS`; in 5.23 they are ``*TopKRouter`` modules holding a bare Parameter)."""
    return t.kind == "linear_weight" and (routers or t.component != "router")


def _linear_routers(spec: ModelSpec, lora: LoraConfig) -> bool:
    return lora.expert_linears and spec.model_type in V4_LINEAR_ROUTERS


def _in_out(spec: ModelSpec, t: Tensor) -> tuple[int, int]:
    """(in_features, out_features) of a Linear/Conv1D weight as transformers stores it."""
    if t.module in spec.conv1d_modules:
        return t.shape[0], t.shape[1]  # Conv1D: (in, out)
    return t.shape[1], t.shape[0]


def _modules(spec: ModelSpec, expert_linears: bool = False) -> list[tuple[str, Tensor, int | None]]:
    """(module path, its weight tensor, group index or None) for every module with a weight;
    ``expert_linears``: the fused experts as transformers 4.x's per-expert Linears (:func:`_v4_experts`)."""
    out: list[tuple[str, Tensor, int | None]] = []
    for t in spec.outer:
        if t.name.endswith(".weight"):
            out.append((t.name.removesuffix(".weight"), t, None))
    for gi, g in enumerate(spec.groups):
        for t in g.layer.tensors:
            if t.name.endswith(".weight"):
                out.append((t.name.removesuffix(".weight"), t, gi))
            elif t.kind == "expert_weight" and expert_linears:
                out += [(w.name.removesuffix(".weight"), w, gi) for w in _v4_experts(spec, t)]
            elif t.kind == "expert_weight":
                out.append((t.name.rsplit(".", 1)[0], t, gi))  # the experts module
    return out


def _v4_experts(spec: ModelSpec, t: Tensor) -> tuple[Tensor, ...]:
    """A fused expert parameter as transformers 4.x built it: ``gate_up_proj`` (E, 2I, H) was a gate and
    an up ``nn.Linear`` (I x H) per expert, ``down_proj`` (E, H, I) a down one (H x I): each a Linear
    weight with ``copies`` = E, named by its 4.x leaf (:data:`V4_EXPERT_LEAVES`)."""
    gate, up, down = V4_EXPERT_LEAVES.get(spec.model_type, V4_DEFAULT_EXPERT_LEAVES)
    experts, rows, cols = t.shape[-3], t.shape[-2], t.shape[-1]
    copies = experts * t.copies * math.prod(t.shape[:-3])
    base = t.name.rsplit(".", 1)[0]
    leaves: tuple[str, ...] = (gate, up) if t.name.endswith("gate_up_proj") else (down,)
    shape = (rows // len(leaves), cols)
    return tuple(
        Tensor(
            name=f"{base}.{leaf}.weight",
            module=leaf,
            shape=shape,
            component=t.component,
            kind="linear_weight",
            copies=copies,
        )
        for leaf in leaves
    )


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


def available_modules(spec: ModelSpec, lora: LoraConfig | None = None) -> list[str]:
    """Leaf names of the modules LoRA can adapt (Linear, Conv1D, Embedding), in model order."""
    seen: dict[str, None] = {}
    v4, routers = (False, False) if lora is None else (lora.expert_linears, _linear_routers(spec, lora))
    for _path, t, _g in _modules(spec, v4):
        if _is_linear(t, routers) or t.kind == "embedding":
            seen.setdefault(t.module, None)
    return list(seen)


def _make(spec: ModelSpec, path: str, t: Tensor, group: int | None) -> AdaptedModule:
    if t.kind == "embedding":
        return AdaptedModule(path=path, kind="embedding", in_features=t.shape[0], out_features=t.shape[1],
                             experts=1, group=group, component=t.component)  # fmt: skip
    fan_in, fan_out = _in_out(spec, t)
    return AdaptedModule(path=path, kind="linear", in_features=fan_in, out_features=fan_out, experts=1,
                         group=group, component=t.component, copies=t.copies)  # fmt: skip


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


def resolve_targets(spec: ModelSpec, lora: LoraConfig, memo: Memo | None = None) -> tuple[AdaptedModule, ...]:
    """The modules and parameters peft adapts (and the modules_to_save copies), per occurrence.

    An estimate asks several times, a planner thousands: an estimator's ``memo`` keeps the answer by the
    spec's identity and the config. Errors are not memoised (raised again on every call)."""
    return memoised(memo, "resolve_targets", spec, lambda: _resolve_targets(spec, lora), key=lora)


def _resolve_targets(spec: ModelSpec, lora: LoraConfig) -> tuple[AdaptedModule, ...]:
    targets = lora.targets
    if not targets and not lora.target_parameters:
        if spec.model_type not in PEFT_DEFAULT_TARGETS:
            raise InputError(
                f"lora_targets='default': peft has no default target modules for model_type "
                f"{spec.model_type!r}; name them (modules: {', '.join(available_modules(spec, lora))}) "
                "or use all-linear"
            )
        targets = PEFT_DEFAULT_TARGETS[spec.model_type]
    saved = _saved_names(spec, lora)
    modules = _modules(spec, lora.expert_linears)
    routers = _linear_routers(spec, lora)

    def excluded(path: str) -> bool:
        return any(_matches(path, m) for m in saved)

    linear_all = [
        (path, t, g)
        for path, t, g in modules
        if _is_linear(t, routers) and not _is_output_layer(spec, t) and not excluded(path)
    ]
    slices = _qkv_slices(spec, modules, targets) if lora.qkv_slices and targets != (ALL_LINEAR,) else []
    sliced = {m.leaf for m in slices}
    if targets != (ALL_LINEAR,):
        for key in targets:
            converted = not lora.expert_linears and _moe_name(spec, key)
            found = any(_matches(path, key) for path, _t, _g in modules) or key in sliced
            if not found and not converted:
                raise InputError(
                    f"lora_targets={key!r}: matches no module of {spec.name} "
                    f"(modules: {', '.join(available_modules(spec, lora))})"
                )
    leaves = tuple(dict.fromkeys(path.rsplit(".", 1)[-1] for path, _t, _g in linear_all))
    if lora.expert_linears:  # transformers 4.x: peft's v4 -> v5 conversion does not run
        params = tuple((p, 1) for p in lora.target_parameters)
    else:
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
            if _is_linear(t, routers) and not _is_output_layer(spec, t):
                out.append(_make(spec, path, t, g))
            continue
        if any(_matches(path, key) for key in targets):
            if not (_is_linear(t, routers) or t.kind == "embedding"):
                what = (
                    "fused 3-D expert parameters" if t.kind == "expert_weight"
                    else "an MoE router holding a bare Parameter" if t.component == "router"
                    else f"a {t.kind} module"
                )  # fmt: skip
                raise InputError(
                    f"lora_targets={','.join(targets)!r}: {path} is {what}, not a Linear/Conv1D/Embedding; "
                    "peft cannot adapt it" + (" (use target_parameters)" if t.kind == "expert_weight" else "")
                )
            out.append(_make(spec, path, t, g))
    out += slices
    out += _resolve_parameters(spec, params, lora.expert_linears)
    if not any(m.kind != "saved" for m in out):
        raise InputError(
            f"lora_targets={','.join(lora.targets)!r}: matches no adaptable module of {spec.name}"
        )
    return tuple(out)


QKV_SLICES = ("q_proj", "k_proj", "v_proj")
# the transformers names of one Linear that computes q, k and v together (Falcon / GPT-NeoX / BLOOM,
# Phi-3, GPT-2's Conv1D, MPT / DBRX)
FUSED_QKV_LEAVES = ("query_key_value", "qkv_proj", "c_attn", "Wqkv")


def _qkv_slices(
    spec: ModelSpec, modules: list[tuple[str, Tensor, int | None]], targets: tuple[str, ...]
) -> list[AdaptedModule]:
    """Lit-GPT's q / k / v slices of each fused attention Linear that ``targets`` name (module docstring);
    none where the model has separate q / k / v modules (they match as names)."""
    keys = [k for k in QKV_SLICES if k in targets]
    if not keys or any(_matches(path, k) for path, _t, _g in modules for k in keys):
        return []
    out: list[AdaptedModule] = []
    for path, t, g in modules:
        if g is None or not _is_linear(t) or path.rsplit(".", 1)[-1] not in FUSED_QKV_LEAVES:
            continue
        att = spec.groups[g].layer.attention
        fan_in, _ = _in_out(spec, t)
        parent = path.rsplit(".", 1)[0]
        for key in keys:
            heads = att.num_heads if key == "q_proj" else att.num_kv_heads
            width = heads * (att.v_head_dim if key == "v_proj" else att.head_dim)
            out.append(AdaptedModule(path=f"{parent}.{key}", kind="linear", in_features=fan_in,
                                     out_features=width, experts=1, group=g, component=t.component,
                                     copies=t.copies))  # fmt: skip
    return out


def _moe_name(spec: ModelSpec, key: str) -> bool:
    found = PEFT_MOE_CONVERSION.get(spec.model_type)
    return found is not None and any(key == old or key.endswith("." + old) for old in found[0])


# peft 0.21.2 tuners_utils.py ``BaseTuner._inject_parameters`` adapts a parameter whose full name
# (``model.layers.22.mlp.experts.gate_up_proj``) is a key or ends with ``"." + key``: a key with a layer
# index (``22.mlp...``, ``layers.22.mlp...``) names that layer only
_LAYER_KEY = re.compile(r"(?:^|\.)(\d+)\.([^\d].*)$")


def layer_key(key: str) -> tuple[int | None, str]:
    """(the layer index a target_parameters key names, or None; the name inside the layer)."""
    found = _LAYER_KEY.search(key)
    return (int(found.group(1)), found.group(2)) if found else (None, key)


def _group_starts(spec: ModelSpec) -> list[int]:
    starts, n = [], 0
    for g in spec.groups:
        starts.append(n)
        n += g.count
    return starts


def _resolve_parameters(
    spec: ModelSpec, params: tuple[tuple[str, int], ...], expert_linears: bool = False
) -> list[AdaptedModule]:
    out: list[AdaptedModule] = []
    starts = _group_starts(spec)
    for key, factor in params:
        index, name = layer_key(key)
        found = False
        for gi, g in enumerate(spec.groups):
            if index is not None and not starts[gi] <= index < starts[gi] + g.count:
                continue
            for t in g.layer.tensors:
                if key == EXPERTS:
                    if t.kind != "expert_weight" or len(t.shape) != 3:
                        continue
                elif not _matches(t.name, name) or len(t.shape) < 2:
                    continue
                if t.kind == "expert_weight" and expert_linears:
                    raise InputError(
                        f"lora_target_parameters={key!r}: before transformers 5.0 {spec.model_type}'s "
                        "experts are one nn.Linear per expert, not a fused parameter; name their Linears in "
                        "lora_targets"
                    )
                found = True
                if len(t.shape) == 3:
                    e, a, b = t.shape
                else:
                    e, (a, b) = 1, (t.shape[1], t.shape[0])
                out.append(AdaptedModule(path=t.name, kind="param", in_features=a, out_features=b,
                                         experts=e * t.copies, group=gi, component=t.component,
                                         rank_factor=factor,
                                         layers=() if index is None else (index,)))  # fmt: skip
        if not found:
            names = sorted({t.name for g in spec.groups for t in g.layer.tensors if len(t.shape) >= 2})
            layers = sum(g.count for g in spec.groups)
            where = f" in layer {index} ({layers} layers)" if index is not None else ""
            raise InputError(
                f"lora_target_parameters={key!r}: matches no parameter{where} "
                f"(parameters: {', '.join(names)})"
            )
    return out


def embeddings_adapted(spec: ModelSpec, lora: LoraConfig, memo: Memo | None = None) -> bool:
    return any(
        m.group is None and m.kind != "saved" and m.component in ("embeddings", "positions")
        for m in resolve_targets(spec, lora, memo)
    )
