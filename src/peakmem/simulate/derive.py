# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""A ModelSpec from transformers itself, and measured block costs, for any architecture.

:func:`derive_spec` builds the model a ``config.json`` describes on the meta device (the class its
``architectures`` names; the causal-LM auto class otherwise; the whole model for vision-language and
encoder-decoder configs, since that is what ``from_pretrained`` loads) and reads its modules:

* every parameter (tied ones once: ``named_parameters(remove_duplicate=True)``) and buffer, with its
  module path and shape, so ``spec.params == sum(p.numel() for p in model.parameters())`` by
  construction;
* the repeated blocks: the children of every outermost ``nn.ModuleList`` of non-leaf modules;
  consecutive blocks with equal signatures (parameter names, shapes, module classes and the config's
  ``layer_types`` entry) form one :class:`~peakmem.model.LayerGroup`;
* each block's kind (:class:`~peakmem.model.DerivedBlock`): its token mixer (attention, sliding or
  chunked attention, linear attention, SSM) and feed-forward (dense, MoE), from ``layer_types`` and
  the module classes;
* which weights peft's ``all-linear`` adapts: every ``nn.Linear`` / transformers ``Conv1D``
  (``kind="linear_weight"``) except the output layer (peft ``_maybe_include_all_linear_layers``).

:func:`measure_costs` runs the real model's training step under fake tensors at five small shapes
(:data:`SHAPES`; micro-batch 1 apart where it differs) with :mod:`peakmem.simulate.runner`'s machinery and
tracker, and fits, per block kind, what each block saves for backward and, instant by instant, its
forward and backward bytes (:func:`peakmem.derived.block_cost`: the peak is the largest instant at the
shape asked). Importing this module registers it as :mod:`peakmem.derived`'s cost provider.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import multiprocessing
import os
import re
import sys
import traceback
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch

from peakmem import derived
from peakmem.errors import InputError
from peakmem.formulas.lora import SEQ_CLS_HEAD_NAMES
from peakmem.model import (
    Attention,
    Component,
    DerivedBlock,
    Layer,
    LayerGroup,
    Mlp,
    ModelSpec,
    Tensor,
    TensorKind,
)

DEFAULT_CONTEXT = 131072  # a config with no context key (SSMs): no limit of the architecture's own
_DROP = ("model_type", "transformers_version", "_name_or_path", "auto_map", "architectures")
# module-path segments that name a block's parts (transformers' module names across families)
_ATTN_SEGS = {"self_attn", "attn", "attention", "self_attention", "mixer", "linear_attn", "mamba",
              "ssm", "temporal_block", "linear_attention", "token_mixer", "mamba_mixer", "conv"}  # fmt: skip
_MLP_SEGS = {"mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "mlp_block", "dense", "channel_mixer",
             "intermediate", "fc1", "fc2"}  # fmt: skip
_LAYER_TYPES = {
    "full_attention": "attention", "attention": "attention", "global": "attention",
    "sliding_attention": "sliding_attention", "sliding": "sliding_attention", "local": "sliding_attention",
    "chunked_attention": "chunked_attention",
    "linear_attention": "linear_attention",
    "mamba": "ssm", "ssm": "ssm", "mamba2": "ssm", "conv": "ssm",
}  # fmt: skip


# ------------------------------------------------------------------------------------------------
# building the model
# ------------------------------------------------------------------------------------------------
def config_object(config: Mapping[str, Any]) -> Any:
    """transformers' config object for a ``config.json`` dict (an :class:`InputError` if it cannot)."""
    import transformers

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError("config: model_type is missing; deriving a spec needs a transformers config.json")
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES  # type: ignore[attr-defined]
    if model_type not in mapping:
        remote = (
            " (the config's auto_map names remote code, which peakmem never runs)"
            if config.get("auto_map")
            else ""
        )
        raise InputError(
            f"model_type={model_type!r}: transformers {transformers.__version__} does not know it{remote}"
        )
    # a deep copy: transformers normalises nested dicts (rope_scaling) in place, which would change the
    # caller's config (a catalog entry) and so its hash
    kwargs = copy.deepcopy({k: v for k, v in config.items() if k not in _DROP})
    try:
        return transformers.AutoConfig.for_model(model_type, **kwargs)
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise InputError(f"config: transformers cannot read this {model_type!r} config ({err})") from err


def model_class(config: Mapping[str, Any], cfg: Any) -> Any:
    """The class ``from_pretrained`` would load: ``architectures[0]`` when transformers has it, else
    the causal-LM auto class, else image-text-to-text, seq2seq, and the bare model."""
    import transformers

    arch = (config.get("architectures") or [None])[0]
    cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
    if cls is not None and hasattr(cls, "_from_config"):
        return cls
    for auto in ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModelForSeq2SeqLM", "AutoModel"):
        auto_cls = getattr(transformers, auto, None)
        if auto_cls is not None and type(cfg) in auto_cls._model_mapping:
            return auto_cls
    raise InputError(f"model_type={config.get('model_type')!r}: transformers has no model class for it")


def build_meta(config: Mapping[str, Any], *, attn: str = "sdpa") -> torch.nn.Module:
    """The model on the meta device, fp32 (dtype does not change shapes)."""
    cfg = config_object(config)
    cls = model_class(config, cfg)
    errors = (ValueError, ImportError, TypeError, NotImplementedError, AttributeError, KeyError,
              IndexError, AssertionError, RuntimeError, ZeroDivisionError)  # fmt: skip
    try:
        return _construct(cls, cfg, attn)
    except ValueError as err:
        if attn == "eager":
            raise InputError(
                f"model_type={config.get('model_type')!r}: transformers cannot build it ({err})"
            ) from err
        try:
            return _construct(cls, cfg, "eager")  # the class has no SDPA path: transformers' default
        except errors as err2:
            raise InputError(
                f"model_type={config.get('model_type')!r}: transformers cannot build it ({err2})"
            ) from err2
    except errors as err:
        raise InputError(f"model_type={config.get('model_type')!r}: transformers cannot build it "
                         f"({type(err).__name__}: {err})") from err  # fmt: skip


def _construct(cls: Any, cfg: Any, attn: str) -> torch.nn.Module:
    import transformers

    with torch.device("meta"):
        if cls.__name__.startswith("AutoModel") and hasattr(transformers, cls.__name__):
            return cls.from_config(cfg, dtype=torch.float32, attn_implementation=attn)
        return cls._from_config(cfg, dtype=torch.float32, attn_implementation=attn)


# ------------------------------------------------------------------------------------------------
# modules -> ModelSpec
# ------------------------------------------------------------------------------------------------
def derive_spec(config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of the model transformers builds for ``config`` (see the module doc)."""
    config = dict(config)
    model = build_meta(config)
    spec = spec_from_model(model, config, name=name)
    mixers = {layer.derived.mixer for layer in spec.layers() if layer.derived is not None}
    if mixers & {"ssm", "linear_attention"} or _STATEFUL.search(
        " ".join({type(m).__name__ for m in model.modules()})
    ):
        spec = with_recurrent_state(spec, config)
    derived.register_config(config)
    derived.cache_spec(config, spec)
    return spec


def _text_config(model: torch.nn.Module) -> Any:
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except TypeError:
            return get()
    return cfg


def _attr(cfg: Any, *names: str) -> Any:
    for n in names:
        try:
            v = getattr(cfg, n, None)
        except Exception:  # per-layer attributes (Gemma 4, dots3) refuse a global read: not one value
            continue
        if v is not None:
            return v
    return None


def _int(cfg: Any, *names: str) -> int | None:
    v = _attr(cfg, *names)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _float(cfg: Any, *names: str) -> float:
    v = _attr(cfg, *names)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _block_lists(model: torch.nn.Module) -> list[tuple[str, torch.nn.ModuleList]]:
    """Outermost ``nn.ModuleList``s whose children are non-leaf modules holding parameters."""
    out: list[tuple[str, torch.nn.ModuleList]] = []
    for path, mod in model.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or len(mod) == 0:
            continue
        if any(path.startswith(p + ".") for p, _ in out):
            continue
        children = list(mod)
        if all(len(list(c.children())) > 0 and any(True for _ in c.parameters()) for c in children):
            out.append((path, mod))
    return out


def _conv1d_class() -> Any:
    try:
        from transformers.pytorch_utils import Conv1D

        return Conv1D
    except ImportError:  # pragma: no cover
        return ()


def _kind(module: torch.nn.Module, pname: str, shape: tuple[int, ...], in_experts: bool) -> TensorKind:
    if isinstance(module, (torch.nn.Linear, _conv1d_class())):
        return "linear_weight" if pname == "weight" else "linear_bias"
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    if "norm" in type(module).__name__.lower():
        return "norm"
    if in_experts and len(shape) == 3:
        return "expert_weight"
    return "other"


def _block_component(segs: list[str], module: torch.nn.Module, moe: bool) -> Component:
    """The component of a block's parameter from its module path (``segs``, outermost first), labelled
    as :mod:`peakmem.hf` labels the families it knows: a norm is "norms" wherever it sits (Qwen3 /
    OLMo-2 q_norm and k_norm, MLA's q_a / kv_a layernorms, BERT's attention.output.LayerNorm), and
    otherwise the outermost named part decides (gpt_neox's attention.dense is attention's output
    projection, not an MLP's dense)."""
    lower = [s.lower() for s in segs]
    if any(s == "experts" for s in lower):
        return "experts"
    if any("shared_expert" in s for s in lower):
        return "shared_experts"
    if moe and any(s in ("router", "gate") for s in lower[-2:]) and not isinstance(module, torch.nn.Linear):
        return "router"
    if "norm" in type(module).__name__.lower() or "norm" in lower[-1]:
        return "norms"
    for s in lower:
        if s in _ATTN_SEGS:
            return "attention"
        if s in _MLP_SEGS or s.startswith("mlp"):
            return "mlp"
    return "other"


def _mixer(block: torch.nn.Module, layer_type: str | None) -> str:
    names = " ".join(type(m).__name__ for m in block.modules())
    ssm = bool(re.search(r"Mamba|SSM|Ssm|Mixer(?!tral)", names)) and "Attention" not in names
    if layer_type is not None and layer_type in _LAYER_TYPES:
        kind = _LAYER_TYPES[layer_type]
        # transformers 5 labels Mamba layers "linear_attention" (MambaConfig.layer_types): an SSM here
        return "ssm" if kind == "linear_attention" and ssm else kind
    if ssm:
        return "ssm"
    if re.search(r"DeltaNet|LinearAttention|Lightning|Rwkv|RWKV|Retention", names):
        return "linear_attention"
    if "Attention" in names or "Attn" in names:
        return "attention"
    return "other"


def _is_moe(block: torch.nn.Module) -> bool:
    for path, m in block.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        cname = type(m).__name__
        if leaf == "experts" or re.search(r"Experts|SparseMoe|MoE|Moe(?!Config)", cname):
            return True
    return False


def _has_ffn(block: torch.nn.Module) -> bool:
    return any(
        path.rsplit(".", 1)[-1].lower() in _MLP_SEGS or path.rsplit(".", 1)[-1].lower().startswith("mlp")
        for path, _ in block.named_modules()
        if path
    )


# A block that keeps no per-token cache (SSM, linear attention, a vision block): a window of 0 tokens,
# so formulas/kv_cache.py's ``cached_tokens`` caches nothing for it. Its constant recurrent state
# (conv + SSM state per sequence) is measured by :func:`measure_state` (formulas/recurrent_state.py).
NO_KV_CACHE = Attention(num_heads=1, num_kv_heads=1, head_dim=1, v_head_dim=1, sliding_window=0)


def _attention(tc: Any, mixer: str) -> Attention:
    hidden = _int(tc, "hidden_size", "d_model", "n_embd") or 1
    heads = _int(tc, "num_attention_heads", "n_head", "num_heads", "n_heads")
    if heads is None or mixer in ("ssm", "linear_attention", "other"):
        return NO_KV_CACHE
    kv = _int(tc, "num_key_value_heads", "num_kv_heads", "n_head_kv", "num_key_value_groups")
    if getattr(tc, "multi_query", False) is True:
        kv = 1
    kv = kv if kv is not None and heads % kv == 0 else heads
    head_dim = _int(tc, "head_dim", "attention_head_size") or max(1, hidden // heads)
    window = None
    if mixer == "sliding_attention":
        window = _int(tc, "sliding_window", "attention_window")
    elif mixer == "chunked_attention":
        window = _int(tc, "attention_chunk_size")
    return Attention(num_heads=heads, num_kv_heads=kv, head_dim=head_dim, v_head_dim=head_dim,
                     sliding_window=window)  # fmt: skip


def _mlp(tc: Any, block: torch.nn.Module, moe: bool) -> Mlp:
    hidden = _int(tc, "hidden_size", "d_model", "n_embd") or 1
    width = _int(tc, "moe_intermediate_size", "expert_intermediate_size") if moe else None
    width = (
        width or _int(tc, "intermediate_size", "ffn_dim", "n_inner", "d_ff", "ffn_hidden_size") or 4 * hidden
    )
    leaves = {p.rsplit(".", 1)[-1] for p, _ in block.named_modules()}
    params = {p.rsplit(".", 1)[-1] for p, _ in block.named_parameters()}
    gated = bool(leaves & {"gate_proj", "gate_up_proj", "w1", "w3"} or params & {"gate_up_proj"})
    act = _attr(tc, "hidden_act", "activation_function", "hidden_activation", "activation")
    if not moe:
        return Mlp(intermediate_size=width, gated=gated, activation=str(act or "unknown"))
    experts = _int(tc, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts") or 1
    topk = _int(tc, "num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token", "moe_k") or 1
    return Mlp(intermediate_size=width, gated=gated, activation=str(act or "unknown"), num_experts=experts,
               experts_per_token=min(topk, experts))  # fmt: skip


def _layer_type(tc: Any, i: int) -> str | None:
    types = _attr(tc, "layer_types", "layers_block_type", "block_types", "hybrid_override_pattern")
    if isinstance(types, (list, tuple)) and i < len(types) and isinstance(types[i], str):
        return types[i]
    return None


def spec_from_model(
    model: torch.nn.Module, config: Mapping[str, Any], *, name: str | None = None
) -> ModelSpec:
    """``model`` (built on the meta device from ``config``) as a :class:`ModelSpec` (module doc)."""
    tc = _text_config(model)
    chash = derived.config_hash(config)
    conv1d = _conv1d_class()
    modules = dict(model.named_modules())
    any_model: Any = model
    out_emb = any_model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    in_emb = any_model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head_w = getattr(out_emb, "weight", None)
    tied = head_w is not None and in_emb is not None and head_w is getattr(in_emb, "weight", None)
    lists = _block_lists(model)
    block_paths: list[tuple[str, torch.nn.Module]] = [
        (f"{lp}.{i}", blk) for lp, lst in lists for i, blk in enumerate(lst)
    ]
    in_block = {path for path, _ in block_paths}
    conv1d_modules: set[str] = set()

    def owner(pname: str) -> str | None:
        parts = pname.split(".")
        for k in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:k])
            if prefix in in_block:
                return prefix
        return None

    block_tensors: dict[str, list[Tensor]] = {p: [] for p, _ in block_paths}
    outer: list[Tensor] = []
    moe_blocks = {p: _is_moe(b) for p, b in block_paths}
    for pname, p in model.named_parameters(remove_duplicate=True):
        mod_path, _, leaf_param = pname.rpartition(".")
        module = modules.get(mod_path, model)
        leaf = mod_path.rsplit(".", 1)[-1] if mod_path else leaf_param
        shape = tuple(int(d) for d in p.shape)
        if conv1d and isinstance(module, conv1d):
            conv1d_modules.add(leaf)
        blk = owner(pname)
        if blk is None:
            kind = _kind(module, leaf_param, shape, False)
            comp: Component
            if out_emb is not None and p is head_w and not tied:
                comp = "head"
            elif kind == "embedding":
                comp = "positions" if re.search(r"pos|wpe", leaf) else "embeddings"
            elif kind == "norm" and not any(s in mod_path for s in ("vision", "visual", "audio")):
                comp = "norms"
            elif mod_path.split(".")[0] in SEQ_CLS_HEAD_NAMES:  # a sequence classifier's head
                comp = "classifier"
            elif "pooler" in mod_path.split("."):
                comp = "pooler"
            else:
                comp = "other"
            outer.append(Tensor(name=pname, module=leaf, shape=shape, component=comp, kind=kind))
            continue
        rel = pname[len(blk) + 1 :]
        segs = rel.split(".")[:-1] or [leaf]
        in_experts = "experts" in segs
        kind = _kind(module, leaf_param, shape, in_experts)
        comp = _block_component(segs, module, moe_blocks[blk])
        block_tensors[blk].append(Tensor(name=rel, module=leaf, shape=shape, component=comp, kind=kind))

    # blocks -> layers -> groups of consecutive equal signatures
    layers: list[tuple[tuple[Any, ...], Layer]] = []
    index_in_list: dict[str, int] = {}
    for lp, lst in lists:
        for i, _ in enumerate(lst):
            index_in_list[f"{lp}.{i}"] = i
    main_list = max(lists, key=lambda x: sum(p.numel() for p in x[1].parameters()))[0] if lists else ""
    for path, block in block_paths:
        tensors = tuple(block_tensors[path])
        i = index_in_list[path]
        in_main = path.rsplit(".", 1)[0] == main_list
        lt = _layer_type(tc, i) if in_main else None
        mixer = _mixer(block, lt)
        moe = moe_blocks[path]
        ffn = "moe" if moe else ("dense" if _has_ffn(block) else "none")
        att = _attention(tc, mixer) if in_main else NO_KV_CACHE
        sig = (
            path.rsplit(".", 1)[0], type(block).__name__, mixer, ffn, lt,
            tuple((t.name, t.shape) for t in tensors),
            tuple(type(m).__name__ for m in block.modules()),
        )  # fmt: skip
        key = f"{chash}:{_short_hash(sig)}"
        kv = att.kv_width if in_main and mixer.endswith("attention") and mixer != "linear_attention" else 0
        info = DerivedBlock(key=key, mixer=mixer if in_main else "other", ffn=ffn, kv_elements_per_token=kv)
        layers.append((sig, Layer(attention=att, mlp=_mlp(tc, block, moe), tensors=tensors, derived=info)))
    groups: list[LayerGroup] = []
    group_sigs: list[tuple[Any, ...]] = []
    for sig, layer in layers:
        if group_sigs and group_sigs[-1] == sig:
            groups[-1] = LayerGroup(count=groups[-1].count + 1, layer=groups[-1].layer)
            continue
        groups.append(LayerGroup(count=1, layer=layer))
        group_sigs.append(sig)
    if not groups:
        raise InputError(
            f"model_type={config.get('model_type')!r}: no repeated blocks found in {type(model).__name__}"
        )

    buffers = tuple(
        Tensor(name=bname, module=bname.rsplit(".", 2)[-2] if "." in bname else bname,
               shape=tuple(int(d) for d in b.shape),
               component="positions" if "rotary" in bname or "inv_freq" in bname else "other", kind="other")
        for bname, b in model.named_buffers(remove_duplicate=True)
    )  # fmt: skip
    # floating buffers are fp32 (RoPE inv_freq: formulas/model_states.py); others keep their dtype
    buffer_bytes = sum(
        b.numel() * (4 if b.is_floating_point() else b.element_size())
        for _, b in model.named_buffers(remove_duplicate=True)
    )
    names = " ".join({type(m).__name__ for m in model.modules()})
    hidden = _int(tc, "hidden_size", "d_model", "n_embd", "dim") or (
        in_emb.weight.shape[1] if in_emb is not None else 1
    )
    vocab = _int(tc, "vocab_size") or (in_emb.weight.shape[0] if in_emb is not None else 1)
    context = _int(tc, "max_position_embeddings", "n_positions", "seq_length", "n_ctx", "max_sequence_length")
    notes = [
        f"derived from transformers' {type(model).__name__} (built on the meta device): exact parameter "
        "count; block activations measured under fake tensors, not computed by the formulas"
    ]
    notes += kernel_notes(
        str(config.get("model_type")), {g.layer.derived.mixer for g in groups if g.layer.derived}
    )
    if context is None:
        notes.append(f"the config names no context length; assuming up to {DEFAULT_CONTEXT:,} tokens")
    kernels = ["eager"]
    if getattr(model, "_supports_sdpa", False):
        kernels.append("sdpa")
    if getattr(model, "_supports_flash_attn", False) or getattr(model, "_supports_flash_attn_2", False):
        kernels.append("flash")
    final_cap = _attr(tc, "final_logit_softcapping")
    classifier = type(model).__name__.endswith("ForSequenceClassification")
    # what the embedding module itself runs (BERT-style decoders: a LayerNorm and a dropout over the
    # summed embeddings), read from the modules outside the blocks whose path names an embedding
    emb_norm, emb_dropout = False, 0.0
    for mpath, mod in modules.items():
        if owner(mpath + ".x") is not None or "embed" not in mpath.lower():
            continue
        if "norm" in type(mod).__name__.lower():
            emb_norm = True
        if isinstance(mod, torch.nn.Dropout) and mod.p > 0:
            emb_dropout = max(emb_dropout, float(mod.p))
    return ModelSpec(
        name=name or str(config.get("_name_or_path") or config.get("model_type")),
        model_type=str(config.get("model_type")),
        architecture=type(model).__name__,
        # a classifier's loss reads a pooled token, not vocab-wide logits (formulas/loss.py): what the
        # model class is (transformers names them <Model>ForSequenceClassification), not a causal LM
        task="sequence-classification" if classifier else "causal-lm",
        num_labels=int(getattr(model.config, "num_labels", 0) or 0) if classifier else 0,
        vocab_size=vocab,
        hidden_size=hidden,
        max_position_embeddings=context or DEFAULT_CONTEXT,
        position="rope" if "Rotary" in names else "learned",
        norm="rmsnorm" if "RMSNorm" in names or "RmsNorm" in names else "layernorm",
        groups=tuple(groups),
        outer=tuple(outer),
        tie_word_embeddings=bool(tied),
        attention_dropout=_float(tc, "attention_dropout", "attn_pdrop"),
        hidden_dropout=_float(tc, "hidden_dropout", "resid_pdrop", "hidden_dropout_prob"),
        embedding_dropout=emb_dropout or _float(tc, "embd_pdrop", "embedding_dropout"),
        embedding_norm=emb_norm,
        attention_kernels=tuple(kernels),
        final_logit_softcap=float(final_cap) if isinstance(final_cap, (int, float)) and final_cap else None,
        conv1d_modules=tuple(sorted(conv1d_modules)),
        buffers=buffers,
        notes=tuple(notes),
        derived_from=chash,
        derived_buffer_bytes=buffer_bytes,
    )


def _short_hash(sig: tuple[Any, ...]) -> str:
    import hashlib

    return hashlib.sha256(repr(sig).encode()).hexdigest()[:10]


# ------------------------------------------------------------------------------------------------
# recurrent state at inference (formulas/recurrent_state.py)
# ------------------------------------------------------------------------------------------------
# module classes of blocks that keep a recurrent state in transformers' cache (Mamba/Mamba-2 mixers,
# gated delta-nets, LFM2's short convolution, ...) beside SSM / linear-attention mixers (Falcon-H1's
# blocks run attention and Mamba-2 side by side): only their specs run the prefill below
_STATEFUL = re.compile(r"Mamba|Mixer(?!tral)|SSM|Ssm|Delta|ShortConv|LinearAttention|Lightning|Rwkv|RWKV")
STATE_PREFILL = (2, 8)  # (batch, tokens) of the fake prefill: longer than every conv kernel


def measure_state(config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Per block key: (elements in the model's dtype, elements in fp32) of the recurrent state one
    sequence keeps in transformers' cache after a prefill of :data:`STATE_PREFILL` under fake tensors
    (bf16 model, ``use_cache=True``): the ``conv_states`` and ``recurrent_states`` of each cache layer
    (``cache_utils.py`` ``LinearAttentionLayer``; Mamba's ``cache_params``), divided by the batch.
    The model is cut to a few blocks of each kind first (:func:`_truncate`: a prefix, so the cache's
    layer indices keep their blocks)."""
    from peakmem.simulate import kernels as kern
    from peakmem.simulate import runner
    from peakmem.simulate.fakeify import fakeify_module

    config = dict(config)
    model = build_meta(config)
    spec = spec_from_model(model, config)
    lists = _block_lists(model)
    main_path = max(lists, key=lambda x: sum(p.numel() for p in x[1].parameters()))[0]
    all_paths = [f"{lp}.{i}" for lp, lst in lists for i in range(len(lst))]
    path_keys = {
        path: layer.derived.key
        for path, layer in zip(all_paths, spec.layers(), strict=True)
        if layer.derived is not None
    }
    _truncate(model, path_keys, prefix=True)
    model.to(dtype=torch.bfloat16)
    model.eval()
    mode = runner._fake_mode()
    fakeify_module(model, mode)
    batch, tokens = STATE_PREFILL
    # explicit positions: a cache of linear-attention layers only (a cut model) has no token count
    # (``DynamicCache.get_seq_length`` raises), which a model reads when it makes positions itself
    positions = "position_ids" in inspect.signature(model.forward).parameters
    with runner._transformers_patches(), mode, kern.ScalarValueMode(), torch.no_grad():
        inputs: dict[str, Any] = {
            "input_ids": torch.zeros((batch, tokens), dtype=torch.long),
            "use_cache": True,
        }
        if positions:
            inputs["position_ids"] = torch.arange(tokens).unsqueeze(0).expand(batch, -1)
        out = model(**inputs)
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache_params", None)
    layers = list(getattr(cache, "layers", None) or ())
    linear = list(getattr(cache, "linear_cache", None) or ())  # MiniMaxCache: lightning-attention state
    result: dict[str, tuple[int, int]] = {}
    for i in range(max(len(layers), len(linear))):
        states: list[Any] = []
        if i < len(layers):
            for attr in ("conv_states", "recurrent_states"):
                states += list((getattr(layers[i], attr, None) or {}).values())
        if i < len(linear):
            states.append(linear[i])
        model_dtype = fp32 = 0
        for state in states:
            if not isinstance(state, torch.Tensor):
                continue
            if state.dtype == torch.float32:
                fp32 += state.numel()
            else:
                model_dtype += state.numel()
        key = path_keys.get(f"{main_path}.{i}")
        if key is not None and (model_dtype or fp32):
            result[key] = (model_dtype // batch, fp32 // batch)
    return result


def with_recurrent_state(spec: ModelSpec, config: Mapping[str, Any]) -> ModelSpec:
    """``spec`` with each block's measured recurrent state (:func:`measure_state`); a note, and no
    state, when the prefill cannot run under fake tensors."""
    import dataclasses

    try:
        state = measure_state(config)
    except Exception as err:  # a model whose prefill needs tensor values: say so, keep the spec
        note = f"inference: the recurrent state per sequence could not be measured ({_why(err)}); not counted"
        return dataclasses.replace(spec, notes=(*spec.notes, note))
    groups = []
    for g in spec.groups:
        info = g.layer.derived
        if info is not None and info.key in state:
            elems, fp32 = state[info.key]
            info = dataclasses.replace(info, state_elements=elems, state_fp32_elements=fp32)
            g = LayerGroup(count=g.count, layer=dataclasses.replace(g.layer, derived=info))
        groups.append(g)
    return dataclasses.replace(spec, groups=tuple(groups))


# ------------------------------------------------------------------------------------------------
# measured costs
# ------------------------------------------------------------------------------------------------
# (batch, seq) of the five fake-tensor runs the costs are fitted over: three sequence lengths separate
# per-token, per-sequence-squared and constant bytes, two batches separate what scales with the batch from
# what the batch shares (a broadcast causal mask). Short, so a run is cheap; micro-batch 2 and 4, not 1:
# at micro-batch 1 a tensor broadcast over a size-1 batch can stay a view where a larger batch copies it
# (matmul's expand + reshape of a one-head k/v against every query head: Falcon's multi-query attention on
# SDPA's math kernel, ATen/native/LinearAlgebra.cpp ``_matmul_impl``), which no term of the fit can carry:
# fitted over batch-1 and batch-2 shapes together, tiny Falcon's costs came out 4-7% low at batch 2.
SHAPES = ((2, 32), (2, 64), (4, 64), (2, derived.SHORT_MAX_SEQ), (4, 32))
# micro-batch 1 is checked at BATCH1_CHECK; where the batch-linear costs do not give it back, the costs at
# micro-batch 1 are measured on their own at BATCH1_SHAPES (three lengths: s^2, s and a constant)
BATCH1_CHECK = (1, 64)
BATCH1_SHAPES = ((1, 32), BATCH1_CHECK, (1, derived.SHORT_MAX_SEQ))
# The fit is checked at SEQ_CHECK, four times the longest fitted sequence. A block whose kernel works in
# chunks pads the sequence to a multiple of its chunk (transformers' Mamba-2 torch path: mamba_chunk_size
# 256; the gated delta-net's torch_chunk_gated_delta_rule: chunk_size 64), so its bytes are a step
# function below a few chunks and the polynomial through SHAPES extrapolates wrongly: Granite 4.0-H's
# Mamba-2 block saved 0.68x, Qwen3-Next's gated delta-net block 2.7x its measured bytes at 2 x 512. Where
# the fit does not give SEQ_CHECK back, the block gets costs fitted over LONG_SHAPES (sixteen times as
# long: at least two whole chunks of 256, since a single chunk skips the passing of states between
# chunks: Granite 4.0-H's Mamba-2 block runs 194 events at 2 x 256 and 199 from 2 x 512 on, its saved
# bytes linear in the sequence from there), used beyond the short shapes (BlockCost.long), and checked at
# micro-batch 1 at LONG_BATCH1_CHECK.
SEQ_CHECK = (2, 4 * derived.SHORT_MAX_SEQ)
LONG = 16
LONG_SHAPES = tuple((b, LONG * s) for b, s in SHAPES)
LONG_BATCH1_CHECK = (1, LONG * BATCH1_CHECK[1])
LONG_BATCH1_SHAPES = tuple((b, LONG * s) for b, s in BATCH1_SHAPES)


Shape = tuple[int, int]  # (micro-batch, sequence)
Steps = dict[str, derived.Measured]  # block key -> its bytes in one step
Point = tuple[int, int, derived.Measured]


def measure_costs(config: Mapping[str, Any], family: str) -> derived.Costs:
    """Measured :class:`~peakmem.derived.BlockCost` of every block kind of ``config`` in ``family``
    (``precision|kernel|policy|method``), fitted over :data:`SHAPES` (:func:`peakmem.derived.block_cost`),
    with costs of their own at micro-batch 1 where it differs (:data:`BATCH1_SHAPES`) and beyond the short
    shapes where a longer sequence's bytes are not given back (:data:`SEQ_CHECK`, :data:`LONG_SHAPES`)."""
    from peakmem.training import AttentionKernel, KernelPolicy, Method, Precision, TrainingSetup

    parts = family.split("|", 4)
    precision, kernel, policy = parts[:3]
    method = parts[3] if len(parts) > 3 else "full"
    lora = quant = None
    if method != "full":
        objects = derived.adapter_objects(parts[4] if len(parts) > 4 else "")
        if objects is None:
            raise InputError(f"setup family {family!r}: the adapter is not known in this process")
        lora, quant = objects

    def measure(
        shapes: tuple[Shape, ...],
        *,
        optional: bool = False,
        only: Mapping[Shape, frozenset[str]] | None = None,
    ) -> dict[Shape, Steps]:
        """Each shape's bytes per block key, the steps side by side (:func:`_measure_steps`), the model cut
        to blocks of the kinds ``only`` names for a shape; with ``optional``, a shape the model cannot run
        (tiny BERT's 256 learned positions at 512 tokens) is left out, and the costs it would have
        checked stay as they are."""
        tasks: list[Task] = [
            (TrainingSetup(
                precision=Precision(precision), attention=AttentionKernel(kernel),
                kernel_policy=KernelPolicy(policy), micro_batch=batch, seq_len=seq,
                method=Method(method), lora=lora, quant=quant,
            ), (only or {}).get((batch, seq)))
            for batch, seq in shapes
        ]  # fmt: skip
        found: dict[Shape, Steps] = {}
        for shape, step in zip(shapes, _measure_steps(dict(config), tasks), strict=True):
            if isinstance(step, Exception) and optional:
                continue
            if isinstance(step, InputError):
                raise step
            if isinstance(step, Exception):
                raise _step_error(step, config, method, precision) from step
            found[shape] = step
        return found

    def points(at: dict[Shape, Steps], key: str, shapes: tuple[Shape, ...]) -> list[Point] | None:
        """``key``'s measurements at ``shapes``, in their order; None unless all of them were measured."""
        pts = [(b, s, at[(b, s)][key]) for b, s in shapes if key in at.get((b, s), {})]
        return pts if len(pts) == len(shapes) else None

    def differs(pts: list[Point] | None, at: dict[Shape, Steps], key: str, shape: Shape) -> bool:
        """Whether the costs fitted over ``pts`` miss the bytes measured at ``shape`` (False where that
        shape, or the key in it, was not measured)."""
        there = at.get(shape, {}).get(key)
        return pts is not None and there is not None and not derived.batch_linear_at(pts, *shape, there)

    at = measure(SHAPES)
    short = {key: pts for key in at[SHAPES[0]] if (pts := points(at, key, SHAPES)) is not None}
    out: derived.Costs = {key: derived.block_cost(pts) for key, pts in short.items()}
    # the two checks in one round of steps (the fit at a longer sequence, and at micro-batch 1)
    at |= measure((SEQ_CHECK, BATCH1_CHECK), optional=True)
    long = [key for key in out if differs(short[key], at, key, SEQ_CHECK)]
    # micro-batch 1 under the short shapes only for blocks without long costs: for the others (a chunked
    # kernel, a step function of the sequence below a few chunks) it would take three more steps for
    # sequences of at most SHORT_MAX_SEQ tokens at micro-batch 1, where the batch-linear costs answer
    batch1 = [key for key in out if key not in long and differs(short[key], at, key, BATCH1_CHECK)]
    # the shapes those need, in one more round: a long block's micro-batch-1 shapes with its long ones
    # (its micro-batch 1 is checked at LONG_BATCH1_CHECK, one of them: a round of its own for the check
    # would cost more time than the two steps it may save). The long shapes run two blocks of each long
    # kind (the measured second one followed by another) and one of every other kind (:func:`_truncate`;
    # one, since a model may need each: Qwen3.5's training forward builds a cache that wants an attention
    # layer): Qwen3.5-27B's step at 2 x 1024 takes 4.2 s instead of 6.3 s (three of each kind), and the
    # six shipped models with long costs regenerate to the same bytes
    long_shapes = (*LONG_SHAPES, *LONG_BATCH1_SHAPES) if long else ()
    kinds = frozenset(derived.block_kind(k) for k in long)
    more = (*long_shapes, *(BATCH1_SHAPES if batch1 else ()))
    at |= measure(
        tuple(shape for shape in more if shape not in at),
        optional=True,
        only=dict.fromkeys(long_shapes, kinds),
    )
    for key in batch1:
        if (pts := points(at, key, BATCH1_SHAPES)) is not None:
            out[key] = dataclasses.replace(out[key], batch1=derived.block_cost(pts, single=True))
    for key in long:
        if (pts := points(at, key, tuple(sorted(LONG_SHAPES)))) is None:
            continue
        cost = derived.block_cost(pts)
        if differs(pts, at, key, LONG_BATCH1_CHECK) and (b1 := points(at, key, LONG_BATCH1_SHAPES)):
            cost = dataclasses.replace(cost, batch1=derived.block_cost(b1, single=True))
        out[key] = dataclasses.replace(out[key], long=cost)
    # an edge block measured like the others of its kind is not kept apart (derived.block_key_costs)
    for key in [k for k in out if k.endswith((derived.FIRST_BLOCK, derived.LAST_BLOCK))]:
        if out[key] == derived.block_key_costs(out, derived.block_kind(key)):
            del out[key]
    return out


def _step_error(err: Exception, config: Mapping[str, Any], method: str, precision: str) -> InputError:
    """The user's error for a fake step that failed in transformers' or peft's code."""
    trace = "".join(traceback.format_exception(err))
    if not (isinstance(err, RuntimeError) and "grouped_mm" in trace):
        # transformers / peft code that does not run under this method (peft's LoRA Linear on Llama 4's
        # router, which returns a tuple): a named error, not a traceback
        return InputError(
            f"model_type={config.get('model_type')!r}: a fake-tensor training step of its blocks "
            f"failed under {method} ({precision}): {type(err).__name__}: {str(err)[:300]}"
        )
    # transformers' grouped_mm experts (integrations/moe.py) cast the input to the experts' dtype, and
    # torch 2.13's _grouped_mm (meta registration, as the CUDA kernel) takes bf16 only
    return InputError(
        f"precision={precision!r}: model_type={config.get('model_type')!r} runs its experts through "
        "torch._grouped_mm, which takes bf16 weights only; with fp32 expert weights transformers cannot "
        "run it. Use --precision bf16 or mixed-bf16"
    )


KEEP_PER_KIND = 3  # blocks of each kind a truncated measurement keeps (the middle one is measured)
# blocks of a long kind a long step keeps (the second is measured), with the first of every other kind
LONG_KEEP = 2


def _truncate(
    model: torch.nn.Module,
    path_keys: dict[str, str],
    *,
    prefix: bool = False,
    kinds: frozenset[str] | None = None,
) -> dict[str, str] | None:
    """Keep the first :data:`KEEP_PER_KIND` blocks of every kind of the main block list (with ``kinds``,
    :data:`LONG_KEEP` of those kinds and the first block of every other kind, and the block after the
    last if that one is of those kinds), in their order, and drop the rest (with the config's layer
    count and per-layer lists): a block's costs do not depend on how many follow it, and a fake run's
    time is linear in depth. Granite 4.0-H's four attention blocks sit at 5, 15, 25
    and 35 among 36 Mamba-2 ones: 6 blocks run instead of the 26 a cut after the third of every kind
    kept. The kept blocks' ``layer_idx`` are renumbered as the config's per-layer lists are cut (the
    decoder loop reads the lists by position; a cache, which a vision-language model whose text config
    keeps ``use_cache`` builds in training too, by ``layer_idx``); ``prefix`` keeps every block up to
    the last one needed instead. Returns ``path_keys`` for the kept blocks at their new positions; None
    when nothing was cut."""
    lists = _block_lists(model)
    if not lists:
        return None
    main_path, main = max(lists, key=lambda x: sum(p.numel() for p in x[1].parameters()))
    n = len(main)
    seen: dict[str, int] = {}
    kept: list[int] = []
    for i in range(n):
        key = path_keys.get(f"{main_path}.{i}", "")
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= (KEEP_PER_KIND if kinds is None else LONG_KEEP if key in kinds else 1):
            kept.append(i)
    if kinds is not None and path_keys.get(f"{main_path}.{kept[-1]}") in kinds and kept[-1] + 1 < n:
        kept.append(kept[-1] + 1)  # the measured block is followed by one, as in the cut of every kind
    if prefix:
        kept = list(range(kept[-1] + 1))
    if len(kept) == n:
        return None
    parent_path, _, attr = main_path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, attr, torch.nn.ModuleList([main[i] for i in kept]))
    for j, i in enumerate(kept):
        for module in main[i].modules():
            if getattr(module, "layer_idx", None) == i:
                setattr(module, "layer_idx", j)  # noqa: B010 (a torch Module attribute: typed as one)
    configs = [model.config, _text_config(model)]
    for cfg in configs:
        for name, value in list(vars(cfg).items()):
            if name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers") and value == n:
                setattr(cfg, name, len(kept))
            elif isinstance(value, list) and len(value) == n:
                setattr(cfg, name, [value[i] for i in kept])
    head = f"{main_path}."
    out = {p: k for p, k in path_keys.items() if not p.startswith(head)}
    for j, i in enumerate(kept):
        if f"{head}{i}" in path_keys:
            out[f"{head}{j}"] = path_keys[f"{head}{i}"]
    return out


# how a model is cut for its measurement (:func:`_truncate`), tried in this order: the first that runs is
# remembered per config for the process's later shapes
CUTS = ("select", "prefix", "none")
_CUT_THAT_RUNS: dict[str, str] = {}


def _measure_once(
    config: dict[str, Any], setup: Any, kinds: frozenset[str] | None = None
) -> dict[str, derived.Measured]:
    """:func:`_measure_one` on the model cut to a few blocks of each kind; cut to a prefix if that one
    does not run (Qwen3.5's blocks index the config's per-layer list by their own ``layer_idx``), on the
    whole model if neither does (a model that reads its depth elsewhere). With ``kinds``, on the cut that
    runs reduced to fewer blocks of the other kinds (:func:`_truncate`) where that runs too."""
    chash = derived.config_hash(config)
    known = _CUT_THAT_RUNS.get(chash)
    if kinds is not None and known is not None:
        try:
            return _measure_one(config, setup, cut=known, kinds=kinds)
        except Exception:
            pass
    tries = CUTS[CUTS.index(known) :] if known else CUTS
    for cut in tries[:-1]:
        try:
            out = _measure_one(config, setup, cut=cut)
        except Exception:
            continue
        _CUT_THAT_RUNS[chash] = cut
        return out
    out = _measure_one(config, setup, cut=tries[-1])
    _CUT_THAT_RUNS[chash] = tries[-1]
    return out


def _workers() -> int:
    """How many fake steps run side by side: one per CPU this process may use, where a process can be
    forked (Linux); one elsewhere."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return len(os.sched_getaffinity(0))


Task = tuple[Any, frozenset[str] | None]  # a step's TrainingSetup, and the block kinds it keeps (all: None)


def _measure_steps(config: dict[str, Any], tasks: list[Task]) -> list[Steps | Exception]:
    """:func:`_measure_once` for every task (a step that fails gives its error in its place), side by
    side in processes forked from this one (:func:`_workers`), the longest sequences first: the steps
    are independent and each is single-threaded Python (Qwen3-Next-80B's default family measures 14 of
    2.3-12 s). The cut models are built here first (:func:`_cut_model`; the first build of a family
    imports its transformers code, 4 s for Qwen3-Next), which the forked processes then share."""
    jobs = min(_workers(), len(tasks))
    if jobs < 2:
        return [_step_or_error(config, task) for task in tasks]
    chash = derived.config_hash(config)
    cut = _CUT_THAT_RUNS.get(chash, CUTS[0])
    for attn, kinds in {(_attn(setup), kinds) for setup, kinds in tasks}:
        with contextlib.suppress(Exception):  # where it does not build, the step says why
            _cut_model(config, attn, cut, kinds)
    by_length = sorted(
        range(len(tasks)), key=lambda i: (tasks[i][0].seq_len, tasks[i][0].micro_batch), reverse=True
    )
    done: list[Steps | Exception] = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {i: pool.submit(_forked_step, config, tasks[i]) for i in by_length}
        for i in range(len(tasks)):
            err = futures[i].exception()
            if isinstance(err, Exception):
                done.append(err)
                continue
            steps, ran = futures[i].result()
            _CUT_THAT_RUNS.setdefault(chash, ran)
            done.append(steps)
    return done


def _step_or_error(config: dict[str, Any], task: Task) -> Steps | Exception:
    try:
        return _measure_once(config, *task)
    except Exception as err:
        return err


def _forked_step(config: dict[str, Any], task: Task) -> tuple[Steps, str]:
    """:func:`_measure_once` in a forked process, and the cut that ran; an error whose type may not
    unpickle in the parent (a library's exception with arguments of its own) comes back as a
    RuntimeError naming it, its traceback kept as the error's cause (sent along as text)."""
    try:
        return _measure_once(config, *task), _CUT_THAT_RUNS[derived.config_hash(config)]
    except Exception as err:
        if isinstance(err, InputError) or type(err).__module__ == "builtins":
            raise
        raise RuntimeError(f"{type(err).__name__}: {err}") from err


def _attn(setup: Any) -> str:
    """The attention implementation a step builds the model with (flash's fake step runs SDPA)."""
    return {"eager": "eager", "sdpa": "sdpa", "flash": "sdpa"}[setup.attention.value]


# the meta model cut for measuring, per (config, attention kernel, cut, kinds), with its blocks' keys: built
# once per process, before the steps are forked (:func:`_measure_steps`), and copied for each step (Qwen3-
# Next-80B: the first build 4.3 s with the import of its transformers code, later ones 0.2 s, a copy of
# the cut 0.02 s; a family measures 7 to 14 steps)
_CUT_MODELS: dict[tuple[str, str, str, frozenset[str] | None], tuple[torch.nn.Module, dict[str, str]]] = {}
_CUT_MODELS_MAX = 4


def _cut_model(
    config: dict[str, Any], attn: str, cut: str, kinds: frozenset[str] | None = None
) -> tuple[torch.nn.Module, dict[str, str]]:
    """The model ``config`` builds with ``attn``, cut as ``cut`` says (:func:`_truncate`; to blocks of
    ``kinds`` when given), and its blocks' paths -> kind keys; remembered (not to be changed by the
    caller: copy it)."""
    key = (derived.config_hash(config), attn, cut, kinds)
    hit = _CUT_MODELS.get(key)
    if hit is not None:
        return hit
    model = build_meta(config, attn=attn)
    spec = spec_from_model(model, config)
    all_paths = [f"{lp}.{i}" for lp, lst in _block_lists(model) for i in range(len(lst))]
    path_keys = {
        path: layer.derived.key
        for path, layer in zip(all_paths, spec.layers(), strict=True)
        if layer.derived is not None
    }
    if cut != "none":
        kept = _truncate(model, path_keys, prefix=cut == "prefix", kinds=kinds)
        path_keys = kept if kept is not None else path_keys
    if len(_CUT_MODELS) >= _CUT_MODELS_MAX:
        _CUT_MODELS.clear()
    _CUT_MODELS[key] = (model, path_keys)
    return model, path_keys


def _measure_one(
    config: dict[str, Any], setup: Any, *, cut: str, kinds: frozenset[str] | None = None
) -> dict[str, derived.Measured]:
    """One fake-tensor training step; per block kind (saved, forward transient, backward transient,
    freed at the backward peak) of a representative block (the middle one of its kind)."""
    import gc

    from peakmem.measure.tracker import LiveStorageTracker
    from peakmem.measure.trainer import model_dtype
    from peakmem.simulate import kernels as kern
    from peakmem.simulate import runner
    from peakmem.simulate.fakeify import fakeify_module, prepare_adapters

    template, path_keys = _cut_model(config, _attn(setup), cut, kinds)
    model = copy.deepcopy(template)  # each step prepares, fakes and converts its own copy
    model.to(dtype=model_dtype(setup.precision))
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    # the blocks, before peft turns Linears into modules with children (a ModuleList of Linears, such as
    # Gemma 3n's altup_projections, would then look like a block list)
    blocks = {f"{lp}.{i}" for lp, lst in _block_lists(model) for i in range(len(lst))}
    quant = prepare_adapters(model, setup, setup.lora)
    mode = runner._fake_mode()
    fakeify_module(model, mode)
    model.train()
    tracker = LiveStorageTracker()
    log = kern.KernelLog()
    block_paths = [
        f"{lp}.{i}" for lp, lst in _block_lists(model) for i in range(len(lst))
        if f"{lp}.{i}".removeprefix("base_model.model.") in blocks
    ]  # fmt: skip
    outputs: dict[str, set[int]] = {}  # block module path -> the storages of its forward's output
    hooks = [
        model.get_submodule(p).register_forward_hook(_output_hook(tracker, outputs.setdefault(p, set())))
        for p in block_paths
    ]
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        _forward_backward(model, setup, tracker, mode, log, quant)
    except runner._fake_limits() as err:
        raise InputError(
            f"model_type={config.get('model_type')!r}: its blocks cannot be measured with fake tensors "
            f"({type(err).__name__}: {err})"
        ) from err
    finally:
        for h in hooks:
            h.remove()
        if was:
            gc.enable()
    paths = [p.removeprefix("base_model.model.") if p not in path_keys else p for p in block_paths]
    keys = [path_keys[p] for p in paths]
    tracked = _tracked(model, paths)
    outs = [outputs[b] for b in block_paths]
    return _analyse(tracker.ledger, tracked, keys, outs, adapters=setup.method.value != "full")


def _output_hook(tracker: Any, sids: set[int]) -> Any:
    """A forward hook recording the ledger id of a block's output hidden states (which the next block or
    the final norm may keep for backward): the first tensor it returns (transformers' decoder layers
    return the hidden states first; BLOOM's also returns its attention probabilities, which its own
    backward keeps)."""
    from torch.utils._pytree import tree_flatten

    def hook(module: Any, args: Any, out: Any) -> None:
        first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
        if first is not None:
            sids.add(tracker.sid_of(first))

    return hook


def _tracked(model: torch.nn.Module, paths: list[str]) -> list[str]:
    """The block paths as the tracker names modules (a peft wrapper prefixes them)."""
    names = {name for name, _ in model.named_modules()}
    return [p if p in names else f"base_model.model.{p}" for p in paths]


def _forward_backward(model: Any, setup: Any, tracker: Any, mode: Any, log: Any, quant: Any) -> None:
    """One forward and backward of a training step as :func:`peakmem.simulate.runner._run` runs
    them (same trainer, modes and tracker), without the optimizer step the costs do not need."""
    import contextlib

    from peakmem.breakdown import Phase
    from peakmem.measure.tracker import INPUT
    from peakmem.measure.trainer import make_trainer
    from peakmem.simulate import kernels as kern
    from peakmem.simulate import runner

    policy = setup.kernel_policy
    tracker.register_module(model)
    quant.register(tracker)
    fmode = kern.function_mode(policy, log)
    # flash's backward pads its fp32 scratch to round128(S) rows, a per-sequence constant below 128
    # tokens (B x const) that the five terms of the fit cannot represent: fitted over SHAPES (32..128)
    # it went into the s^2 and s terms and the backward transient at batch 2 x seq 128 came out 0 (tiny
    # Gemma, Qwen3, Phi-3 under full checkpointing: the derived peak 4.5-5.5% under simulate's). Measured
    # at S rows the scratch is per-token; at a length that is a multiple of 128 that is exact, elsewhere
    # the padding (< 128 rows) is left out. Longer SHAPES would not fit models of 256 positions.
    dmode = kern.dispatch_mode(policy, log, pad_rows=False)
    with contextlib.ExitStack() as stack:
        runner.enter_fake_modes(stack, mode, tracker, dmode, fmode)
        tracker.set_phase(Phase.LOAD, 0)
        trainer = make_trainer(model, setup, torch.device("cpu"), tracker)
        tracker.watch_gradients(model.named_parameters())
        tracker.set_phase(Phase.FORWARD, 1)
        batch = runner._batch(model, (setup.micro_batch, setup.seq_len))
        for t in batch.values():
            tracker.tag(t, INPUT)
        with trainer.autocast():
            out = model(**batch, use_cache=False) if runner._takes_use_cache(model) else model(**batch)
        loss = out.loss
        del out
        tracker.set_phase(Phase.BACKWARD, 1)
        trainer.backward(loss)
        del loss, batch
        tracker.set_phase(Phase.LOAD, 2)  # closes the backward segment


def _analyse(
    ledger: Any,
    paths: list[str],
    keys: list[str],
    outputs: list[set[int]] | None = None,
    *,
    adapters: bool = False,
) -> dict[str, derived.Measured]:
    """Per block kind, the middle block's :class:`~peakmem.derived.Measured`; the last block's too, under
    its key plus :data:`~peakmem.derived.LAST_BLOCK`, and with ``adapters`` (LoRA/QLoRA) the first block's,
    under :data:`~peakmem.derived.FIRST_BLOCK`."""
    from peakmem.breakdown import Phase
    from peakmem.measure.tracker import BUFFER, GRAD, MASTER, OPTIM_STATE, PARAM

    persistent = {PARAM, BUFFER, GRAD, MASTER, OPTIM_STATE}
    events = ledger._events
    segs = {(step, phase): (a, b) for a, b, step, phase in ledger.segments() if step == 1}
    f0, f1 = segs[(1, Phase.FORWARD)]
    b0, b1 = segs[(1, Phase.BACKWARD)]
    totals = [0]
    for _, delta in events:
        totals.append(totals[-1] + delta)
    order = sorted(paths, key=len, reverse=True)

    def owner(module: str) -> str:
        module = module.removesuffix(" (backward)")
        for p in order:
            if module == p or module.startswith(p + "."):
                return p
        return "~" + module

    # the first event of every storage: its allocation
    first: dict[int, int] = {}
    for k, (sid, delta) in enumerate(events):
        if delta > 0 and sid not in first:
            first[sid] = k

    def runs(a: int, b: int) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []  # (owner, index of the run's first allocation)
        for k in range(a, b):
            sid, delta = events[k]
            if delta > 0 and first.get(sid) == k:
                o = owner(ledger.records[sid].module)
                if not out or out[-1][0] != o:
                    out.append((o, k))
        return out

    def ranges(a: int, b: int) -> dict[str, tuple[int, int, int]]:
        """owner -> (start, end, start of the run before its first)"""
        rs = runs(a, b)
        out: dict[str, tuple[int, int, int]] = {}
        for i, (o, k) in enumerate(rs):
            end = rs[i + 1][1] if i + 1 < len(rs) else b
            prev = rs[i - 1][1] if i > 0 else a
            if o in out:
                out[o] = (out[o][0], end, out[o][2])
            else:
                out[o] = (k, end, prev)
        return out

    live_at_fwd_end: set[int] = set()
    live: dict[int, int] = {}
    for k in range(f1):
        sid, delta = events[k]
        live[sid] = live.get(sid, 0) + delta
        if live[sid] <= 0:
            del live[sid]
    live_at_fwd_end = set(live)
    fr = ranges(f0, f1)
    br = ranges(b0, b1)
    result: dict[str, list[derived.Measured]] = {}
    for path, key in zip(paths, keys, strict=True):
        if path not in fr:
            result.setdefault(key, []).append(derived.Measured(saved=0, forward=(), backward=()))
            continue
        a, b, _ = fr[path]
        mine = [
            sid for sid, k in first.items()
            if a <= k < b and not (ledger.records[sid].tags & persistent)
        ]  # fmt: skip
        saved_sids = {sid for sid in mine if sid in live_at_fwd_end}
        saved = sum(live.get(sid, 0) for sid in saved_sids)
        # of those, the block's output that what follows keeps (the next block's first Linear or norm)
        # and that is still alive when this block's backward starts (the next block's backward frees what
        # its Linears kept): under checkpointing the next block's kept input, not rebuilt by recomputation
        out_sids = saved_sids & (outputs[paths.index(path)] if outputs else set())
        output = sum(live.get(sid, 0) for sid in out_sids)
        forward = tuple(totals[k] - totals[a] - saved for k in range(a, b + 1))
        backward: list[tuple[int, int, int]] = []
        grads = 0
        if path in br:
            c, d, prev = br[path]
            # X(k): backward temporaries allocated since the run before this block's backward
            # (the incoming gradient included), minus this block's saved bytes freed so far; G(k): its
            # weight gradients written so far (tagged by parameter name: tracker.watch_gradients)
            cur = freed = 0
            for k in range(prev, d):
                sid, delta = events[k]
                rec = ledger.records[sid]
                if sid in out_sids and delta < 0 and k < c:
                    output += delta
                if sid in saved_sids:
                    if delta < 0:
                        freed -= delta
                elif GRAD in rec.tags and rec.name.startswith(path + "."):
                    if delta > 0 and first.get(sid) == k:
                        grads += delta
                elif first.get(sid, -1) >= prev and not (rec.tags & persistent):
                    cur += delta
                if k >= c:
                    backward.append((cur - freed, freed, grads))
        result.setdefault(key, []).append(
            derived.Measured(
                saved=saved, forward=forward, backward=tuple(backward), grads=grads, output=output
            )
        )
    out = {key: vals[len(vals) // 2] for key, vals in result.items()}
    if keys:
        out[keys[-1] + derived.LAST_BLOCK] = result[keys[-1]][-1]
    if adapters and keys:
        out[keys[0] + derived.FIRST_BLOCK] = result[keys[0]][0]
    return out


def kernel_notes(model_type: str, mixers: set[str]) -> list[str]:
    """What the measured costs assume about kernels the training path may swap (issue 14, item 6)."""
    out: list[str] = []
    if "ssm" in mixers:
        out.append(
            "SSM blocks measured with transformers' torch fallback (torch_forward: the selective scan's "
            "per-chunk states materialised and saved); with the mamba-ssm/causal-conv1d CUDA kernels "
            "(selective_scan_fn, mamba_chunk_scan_combined) the scan saves only its inputs and recomputes "
            "states in backward: real CUDA runs need less. Inference: the constant conv + SSM state per "
            "sequence (measured from transformers' cache: conv state in the model dtype, SSM state fp32) "
            "is counted beside the KV cache, times the batch"
        )
    if "linear_attention" in mixers:
        out.append(
            "linear-attention (gated delta-net) blocks measured with transformers' torch chunked fallback "
            "(torch_chunk_gated_delta_rule); fla's Triton kernels (chunk_gated_delta_rule) save less. "
            "Inference: the recurrent state per sequence (measured from transformers' cache after a prefill, "
            "in the dtypes it keeps: conv state in the model dtype, delta-rule state fp32) is counted beside "
            "the KV cache, times the batch"
        )
    if "chunked_attention" in mixers:
        out.append(
            "chunked attention (Llama 4) measured with the requested kernel and transformers' chunked "
            "causal mask; the KV cache keeps attention_chunk_size tokens for those layers"
        )
    if model_type == "gpt_oss":
        out.append(
            "gpt-oss attention sinks measured on the eager/SDPA path (sink logits concatenated to the "
            "scores, so scores are materialised); flash-attn 3 sink kernels (vLLM) do not. MXFP4 experts: "
            "counted as the bf16 weights transformers builds for training (dequantized); MXFP4 storage "
            "(4-bit values + e8m0 scale per 32) applies only to inference weights"
        )
    return out


def model_params(model: torch.nn.Module) -> int:
    """``sum(p.numel() for p in model.parameters())``: what a derived spec's count must equal."""
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------
# coverage: every causal-LM model type transformers maps
# ------------------------------------------------------------------------------------------------
# Sizes a default config is shrunk to (only keys it has; ints larger than these are replaced), so
# that building and simulating it is cheap. Layer-type lists are cut to the layer count.
TINY = {
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "intermediate_size": 128, "ffn_dim": 128, "d_ff": 128,
    "n_inner": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2, "num_attention_heads": 4,
    "n_head": 4, "num_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "max_position_embeddings": 512, "n_positions": 512, "state_size": 16, "d_state": 16,
    "expand": 2, "time_step_rank": 8, "conv_kernel": 4, "n_groups": 1, "mamba_n_heads": 4,
    "mamba_d_head": 32, "mamba_n_groups": 1, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "kv_lora_rank": 16, "q_lora_rank": 32,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "sliding_window": 64,
}  # fmt: skip


def tiny_config(model_type: str, *, shrink: bool = True) -> dict[str, Any]:
    """transformers' default config for ``model_type``, shrunk to :data:`TINY` sizes where it has the
    keys (a key whose default is smaller stays), as a ``config.json`` dict."""
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type)
    data = cfg.to_dict()
    if shrink:
        _shrink(data)
    data["model_type"] = model_type
    return data


def _shrink(data: dict[str, Any]) -> None:
    for key, small in TINY.items():
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > small:
            data[key] = small
    vocab = data.get("vocab_size")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(vocab, int) and isinstance(data.get(key), int) and data[key] >= vocab:
            data[key] = 0
    heads = data.get("num_attention_heads")
    kv = data.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and kv and heads % kv:
        data["num_key_value_heads"] = heads
    layer_keys = ("num_hidden_layers", "n_layer", "num_layers")
    layers = next((data[k] for k in layer_keys if isinstance(data.get(k), int)), None)
    for key in ("layer_types", "layers_block_type", "block_types"):
        if isinstance(data.get(key), list) and layers is not None:
            data[key] = data[key][:layers]
    for key, value in list(data.items()):
        if key.endswith("_config") and isinstance(value, dict):
            _shrink(value)


def causal_lm_types() -> list[str]:
    """transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` keys, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_type(model_type: str) -> tuple[str, str, int]:
    """("ok", "", params) when the derived spec's count equals the meta-built model's; else
    ("cannot build" | "mismatch" | "error", why, 0)."""
    try:
        config = tiny_config(model_type)
        config.pop("architectures", None)
        model = build_meta(config)
    except Exception:
        try:
            config = tiny_config(model_type, shrink=False)
            config.pop("architectures", None)
            model = build_meta(config)
        except Exception as err:
            return "cannot build", _why(err), 0
    try:
        spec = spec_from_model(model, config)
    except Exception as err:
        return "error", _why(err), 0
    want = model_params(model)
    if spec.params != want:
        return "mismatch", f"spec {spec.params:,} != model {want:,}", 0
    return "ok", "", spec.params


def _why(err: BaseException) -> str:
    text = " ".join(f"{type(err).__name__}: {err}".split()).replace("|", "/")
    return text[:160]


# ------------------------------------------------------------------------------------------------
# shipped data (benchmarks/derive_catalog.py)
# ------------------------------------------------------------------------------------------------
# The families shipped for catalog models: every precision on CUDA's SDPA kernels, full fine-tuning
# (the defaults of `peakmem train`); others are measured on demand where torch is installed.
def shipped_families() -> tuple[str, ...]:
    """The setup families shipped per model: full training in each precision, and LoRA and QLoRA
    with their default adapters at the default precision, which ``train`` and ``fit`` estimate for
    the changes that make a setup fit (planner/fit.py ``_family_adapter``): shipped, a catalog model
    answers them without torch, and with torch without measuring first."""
    from peakmem.formulas.activations import derived_family
    from peakmem.training import Method, TrainingSetup

    full = tuple(
        derived.family_key(precision=p, kernel="sdpa", policy="cuda", method="full")
        for p in ("mixed-bf16", "amp-bf16", "bf16", "fp32")
    )
    return full + tuple(derived_family(TrainingSetup(method=m)) for m in (Method.LORA, Method.QLORA))


def shipped_document(
    config: Mapping[str, Any], name: str, families: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The JSON document of ``peakmem/catalog/derived/<name>.json``: the derived spec, its costs in
    ``families`` and the config they came from (so that a test can regenerate it)."""
    spec = derive_spec(config, name=name)
    costs: dict[str, Any] = {}
    unmeasured: dict[str, str] = {}
    for fam in shipped_families() if families is None else families:
        try:
            costs[fam] = measure_costs(config, fam)
        except InputError as err:  # fp32 experts: torch's grouped_mm takes bf16 only
            unmeasured[fam] = str(err).splitlines()[0][:200]
    doc = derived.shipped_document(spec, costs)
    doc["config"] = dict(config)
    if unmeasured:
        doc["unmeasured_families"] = unmeasured  # measured on demand where torch is installed
    return doc


derived.set_provider(measure_costs)

__all__ = ["build_meta", "derive_spec", "measure_costs", "model_params", "spec_from_model"]
