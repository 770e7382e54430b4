# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""A :class:`~peakmem.model.ModelSpec` read from the modules of a model built on the meta device.

:func:`spec_from_model` reads:

* every parameter (tied ones once: ``named_parameters(remove_duplicate=True)``) and buffer, with its
  module path and shape, so ``spec.params == sum(p.numel() for p in model.parameters())`` by
  construction;
* the repeated blocks: the children of every outermost ``nn.ModuleList`` of non-leaf modules;
  consecutive blocks with equal signatures (parameter names, shapes, module classes and the config's
  ``layer_types`` entry) form one :class:`~peakmem.model.LayerGroup`;
* each block's kind (:class:`~peakmem.model.DerivedBlock`): its token mixer (attention, sliding or
  chunked attention, linear attention, SSM) and feed-forward (dense, MoE), from ``layer_types`` and
  the module classes;
* the towers beside the language model (:class:`~peakmem.model.Tower`: a vision-language model's vision
  encoder, an audio encoder): the modules built from the config's other sub-configs, with their sizes;
* which weights peft's ``all-linear`` adapts: every ``nn.Linear`` / transformers ``Conv1D``
  (``kind="linear_weight"``) except the output layer (peft ``_maybe_include_all_linear_layers``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import torch

from peakmem import block_costs
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
    Tower,
)
from peakmem.simulate.derive.build import block_lists, block_paths, main_blocks, text_config

DEFAULT_CONTEXT = 131072  # a config with no context key (SSMs): no limit of the architecture's own
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
# A block that keeps no per-token cache (SSM, linear attention, a vision block): a window of 0 tokens,
# so formulas/kv_cache.py's ``cached_tokens`` caches nothing for it. Its constant recurrent state
# (conv + SSM state per sequence) is measured by :func:`peakmem.simulate.derive.spec.measure_state`
# (formulas/recurrent_state.py).
NO_KV_CACHE = Attention(num_heads=1, num_kv_heads=1, head_dim=1, v_head_dim=1, sliding_window=0)

Blocks = list[tuple[str, torch.nn.Module]]  # (module path, block) of every block of every block list
Signature = tuple[Any, ...]  # what makes consecutive blocks one LayerGroup


# ------------------------------------------------------------------------------------------------
# config values
# ------------------------------------------------------------------------------------------------
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


def _layer_type(tc: Any, i: int) -> str | None:
    types = _attr(tc, "layer_types", "layers_block_type", "block_types", "hybrid_override_pattern")
    if isinstance(types, (list, tuple)) and i < len(types) and isinstance(types[i], str):
        return types[i]
    return None


# ------------------------------------------------------------------------------------------------
# a parameter's kind and component
# ------------------------------------------------------------------------------------------------
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


@dataclasses.dataclass(frozen=True)
class _Heads:
    """The model's output layer and whether its weight is the input embedding's (tied)."""

    out: Any
    weight: Any
    tied: bool
    embedding: Any  # the input embedding module (None where the model has none)


def _heads(model: torch.nn.Module) -> _Heads:
    any_model: Any = model
    out_emb = any_model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    in_emb = any_model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head_w = getattr(out_emb, "weight", None)
    tied = head_w is not None and in_emb is not None and head_w is getattr(in_emb, "weight", None)
    return _Heads(out=out_emb, weight=head_w, tied=tied, embedding=in_emb)


def _outer_component(p: Any, kind: TensorKind, leaf: str, mod_path: str, heads: _Heads) -> Component:
    """The component of a parameter outside the blocks."""
    if heads.out is not None and p is heads.weight and not heads.tied:
        return "head"
    if kind == "embedding":
        return "positions" if re.search(r"pos|wpe", leaf) else "embeddings"
    if kind == "norm" and not any(s in mod_path for s in ("vision", "visual", "audio")):
        return "norms"
    if mod_path.split(".")[0] in SEQ_CLS_HEAD_NAMES:  # a sequence classifier's head
        return "classifier"
    if "pooler" in mod_path.split("."):
        return "pooler"
    return "other"


def _owner(name: str, in_block: set[str]) -> str | None:
    """The block whose module path ``name`` (a parameter's, a module's) lies under; None outside them."""
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:k])
        if prefix in in_block:
            return prefix
    return None


def _tensors(
    model: torch.nn.Module, blocks: Blocks, moe_blocks: dict[str, bool], heads: _Heads
) -> tuple[dict[str, list[Tensor]], list[Tensor], set[str]]:
    """Every parameter as a :class:`Tensor`: per block (named relative to it), those outside the
    blocks, and the leaf names of the transformers ``Conv1D`` modules."""
    conv1d = _conv1d_class()
    modules = dict(model.named_modules())
    in_block = {path for path, _ in blocks}
    block_tensors: dict[str, list[Tensor]] = {p: [] for p, _ in blocks}
    outer: list[Tensor] = []
    conv1d_modules: set[str] = set()
    for pname, p in model.named_parameters(remove_duplicate=True):
        mod_path, _, leaf_param = pname.rpartition(".")
        module = modules.get(mod_path, model)
        leaf = mod_path.rsplit(".", 1)[-1] if mod_path else leaf_param
        shape = tuple(int(d) for d in p.shape)
        if conv1d and isinstance(module, conv1d):
            conv1d_modules.add(leaf)
        blk = _owner(pname, in_block)
        if blk is None:
            kind = _kind(module, leaf_param, shape, False)
            comp = _outer_component(p, kind, leaf, mod_path, heads)
            outer.append(Tensor(name=pname, module=leaf, shape=shape, component=comp, kind=kind))
            continue
        rel = pname[len(blk) + 1 :]
        segs = rel.split(".")[:-1] or [leaf]
        in_experts = "experts" in segs
        kind = _kind(module, leaf_param, shape, in_experts)
        comp = _block_component(segs, module, moe_blocks[blk])
        block_tensors[blk].append(Tensor(name=rel, module=leaf, shape=shape, component=comp, kind=kind))
    return block_tensors, outer, conv1d_modules


# ------------------------------------------------------------------------------------------------
# a block's kind
# ------------------------------------------------------------------------------------------------
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


def _short_hash(sig: Signature) -> str:
    import hashlib

    return hashlib.sha256(repr(sig).encode()).hexdigest()[:10]


def _layer(
    tc: Any, chash: str, path: str, block: torch.nn.Module, lt: str | None, in_main: bool,
    tensors: tuple[Tensor, ...], moe: bool,
) -> tuple[Signature, Layer]:  # fmt: skip
    """A block as a :class:`Layer` (its kind in :class:`DerivedBlock`, keyed by the config's hash and
    the block's signature), with its signature."""
    mixer = _mixer(block, lt)
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
    return sig, Layer(attention=att, mlp=_mlp(tc, block, moe), tensors=tensors, derived=info)


def _groups(
    lists: list[tuple[str, torch.nn.ModuleList]], tc: Any, chash: str, blocks: Blocks,
    block_tensors: dict[str, list[Tensor]], moe_blocks: dict[str, bool],
) -> list[LayerGroup]:  # fmt: skip
    """The blocks of the block ``lists`` as layers, consecutive ones of equal signatures in one
    :class:`LayerGroup`."""
    index_in_list = {f"{lp}.{i}": i for lp, lst in lists for i, _ in enumerate(lst)}
    main_list = main_blocks(lists)[0] if lists else ""
    groups: list[LayerGroup] = []
    group_sigs: list[Signature] = []
    for path, block in blocks:
        in_main = path.rsplit(".", 1)[0] == main_list
        lt = _layer_type(tc, index_in_list[path]) if in_main else None
        sig, layer = _layer(tc, chash, path, block, lt, in_main, tuple(block_tensors[path]), moe_blocks[path])
        if group_sigs and group_sigs[-1] == sig:
            groups[-1] = LayerGroup(count=groups[-1].count + 1, layer=groups[-1].layer)
            continue
        groups.append(LayerGroup(count=1, layer=layer))
        group_sigs.append(sig)
    return groups


# ------------------------------------------------------------------------------------------------
# towers: the encoders beside the language model
# ------------------------------------------------------------------------------------------------
def _tower_roots(model: torch.nn.Module, main_list: str) -> list[tuple[str, str, Any]]:
    """(kind, module path, sub-config) of every tower: the outermost ``PreTrainedModel`` whose ``config``
    is one of the model's sub-configs other than the text model's (transformers 5.23 builds
    ``model.visual`` from ``config.vision_config``: ``Qwen2_5_VLModel.__init__``), and that does not hold
    the language model's blocks (``main_list``)."""
    from transformers import PreTrainedModel

    text = text_config(model)
    subs = {id(v): k for k, v in vars(model.config).items()
            if k.endswith("_config") and hasattr(v, "to_dict") and v is not text}  # fmt: skip
    found: list[tuple[str, str, Any]] = []
    for path, mod in model.named_modules():
        key = subs.get(id(getattr(mod, "config", None)))
        if (
            not path
            or key is None
            or not isinstance(mod, PreTrainedModel)
            or main_list.startswith(path + ".")
        ):
            continue
        if any(path.startswith(p + ".") for _, p, _ in found):
            continue
        found.append((key.removesuffix("_config"), path, mod.config))
    return found


def _towers(
    model: torch.nn.Module, main_list: str, blocks: Blocks, groups: list[LayerGroup]
) -> tuple[Tower, ...]:
    """The model's towers (:class:`~peakmem.model.Tower`): sizes from their sub-configs, blocks by path."""
    layers = [g.layer for g in groups for _ in range(g.count)]
    out = []
    for kind, prefix, cfg in _tower_roots(model, main_list):
        mine = [(path, layer) for (path, _), layer in zip(blocks, layers, strict=True)
                if path.startswith(prefix + ".")]  # fmt: skip
        keys = tuple(dict.fromkeys(layer.derived.key for _, layer in mine if layer.derived is not None))
        per_list: dict[str, int] = {}
        for path, _ in mine:
            per_list[path.rsplit(".", 1)[0]] = per_list.get(path.rsplit(".", 1)[0], 0) + 1
        depth = _int(cfg, "depth", "num_hidden_layers", "conf_num_hidden_layers", "num_layers")
        out.append(Tower(
            kind=kind, prefix=prefix, num_layers=depth or max(per_list.values(), default=0),
            hidden_size=_int(cfg, "hidden_size", "d_model", "width") or 0,
            num_heads=_int(cfg, "num_heads", "num_attention_heads", "conf_num_attention_heads") or 0,
            intermediate_size=_int(cfg, "intermediate_size") or 0, block_keys=keys,
            patch_size=_int(cfg, "patch_size", "spatial_patch_size") or 0,
            temporal_patch_size=_int(cfg, "temporal_patch_size") or 0,
            spatial_merge_size=_int(cfg, "spatial_merge_size") or 0, image_size=_int(cfg, "image_size") or 0,
            out_hidden_size=_int(cfg, "out_hidden_size", "vision_output_dim") or 0,
        ))  # fmt: skip
    return tuple(out)


# ------------------------------------------------------------------------------------------------
# the rest of the model
# ------------------------------------------------------------------------------------------------
def _buffers(model: torch.nn.Module) -> tuple[tuple[Tensor, ...], int]:
    """The model's buffers as tensors, and their bytes: floating buffers are fp32 (RoPE inv_freq:
    formulas/model_states.py); others keep their dtype."""
    buffers = tuple(
        Tensor(name=bname, module=bname.rsplit(".", 2)[-2] if "." in bname else bname,
               shape=tuple(int(d) for d in b.shape),
               component="positions" if "rotary" in bname or "inv_freq" in bname else "other", kind="other")
        for bname, b in model.named_buffers(remove_duplicate=True)
    )  # fmt: skip
    buffer_bytes = sum(
        b.numel() * (4 if b.is_floating_point() else b.element_size())
        for _, b in model.named_buffers(remove_duplicate=True)
    )
    return buffers, buffer_bytes


def _embedding_ops(model: torch.nn.Module, in_block: set[str]) -> tuple[bool, float]:
    """What the embedding module itself runs (BERT-style decoders: a LayerNorm and a dropout over the
    summed embeddings), read from the modules outside the blocks whose path names an embedding: whether
    it has a norm, and its dropout probability."""
    emb_norm, emb_dropout = False, 0.0
    for mpath, mod in model.named_modules():
        if _owner(mpath + ".x", in_block) is not None or "embed" not in mpath.lower():
            continue
        if "norm" in type(mod).__name__.lower():
            emb_norm = True
        if isinstance(mod, torch.nn.Dropout) and mod.p > 0:
            emb_dropout = max(emb_dropout, float(mod.p))
    return emb_norm, emb_dropout


def _kernels(model: torch.nn.Module) -> tuple[str, ...]:
    """The attention implementations the model class supports."""
    kernels = ["eager"]
    if getattr(model, "_supports_sdpa", False):
        kernels.append("sdpa")
    if getattr(model, "_supports_flash_attn", False) or getattr(model, "_supports_flash_attn_2", False):
        kernels.append("flash")
    return tuple(kernels)


def _notes(
    model: torch.nn.Module, config: Mapping[str, Any], groups: list[LayerGroup], context: Any
) -> list[str]:
    notes = [
        f"derived from transformers' {type(model).__name__} (built on the meta device): exact parameter "
        "count; block activations measured under fake tensors, not computed by the formulas"
    ]
    notes += kernel_notes(
        str(config.get("model_type")), {g.layer.derived.mixer for g in groups if g.layer.derived}
    )
    if context is None:
        notes.append(f"the config names no context length; assuming up to {DEFAULT_CONTEXT:,} tokens")
    return notes


def spec_from_model(
    model: torch.nn.Module, config: Mapping[str, Any], *, name: str | None = None
) -> ModelSpec:
    """``model`` (built on the meta device from ``config``) as a :class:`ModelSpec` (module doc)."""
    tc = text_config(model)
    chash = block_costs.config_hash(config)
    heads = _heads(model)
    lists = block_lists(model)
    blocks: Blocks = [(f"{lp}.{i}", blk) for lp, lst in lists for i, blk in enumerate(lst)]
    moe_blocks = {p: _is_moe(b) for p, b in blocks}
    block_tensors, outer, conv1d_modules = _tensors(model, blocks, moe_blocks, heads)
    groups = _groups(lists, tc, chash, blocks, block_tensors, moe_blocks)
    if not groups:
        raise InputError(
            f"model_type={config.get('model_type')!r}: no repeated blocks found in {type(model).__name__}"
        )
    buffers, buffer_bytes = _buffers(model)
    towers = _towers(model, main_blocks(lists)[0], blocks, groups)
    names = " ".join({type(m).__name__ for m in model.modules()})
    in_emb = heads.embedding
    hidden = _int(tc, "hidden_size", "d_model", "n_embd", "dim") or (
        in_emb.weight.shape[1] if in_emb is not None else 1
    )
    vocab = _int(tc, "vocab_size") or (in_emb.weight.shape[0] if in_emb is not None else 1)
    context = _int(tc, "max_position_embeddings", "n_positions", "seq_length", "n_ctx", "max_sequence_length")
    final_cap = _attr(tc, "final_logit_softcapping")
    classifier = type(model).__name__.endswith("ForSequenceClassification")
    emb_norm, emb_dropout = _embedding_ops(model, {path for path, _ in blocks})
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
        tie_word_embeddings=bool(heads.tied),
        attention_dropout=_float(tc, "attention_dropout", "attn_pdrop"),
        hidden_dropout=_float(tc, "hidden_dropout", "resid_pdrop", "hidden_dropout_prob"),
        embedding_dropout=emb_dropout or _float(tc, "embd_pdrop", "embedding_dropout"),
        embedding_norm=emb_norm,
        attention_kernels=_kernels(model),
        final_logit_softcap=float(final_cap) if isinstance(final_cap, (int, float)) and final_cap else None,
        conv1d_modules=tuple(sorted(conv1d_modules)),
        buffers=buffers,
        notes=tuple(_notes(model, config, groups, context)),
        derived_from=chash,
        derived_buffer_bytes=buffer_bytes,
        towers=towers,
    )


def block_keys(model: torch.nn.Module, config: Mapping[str, Any]) -> dict[str, str]:
    """Every block's module path -> its kind's key in the spec ``model`` gives (:func:`spec_from_model`)."""
    spec = spec_from_model(model, config)
    return {
        path: layer.derived.key
        for path, layer in zip(block_paths(model), spec.layers(), strict=True)
        if layer.derived is not None
    }


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
            "gpt-oss attention sinks: transformers has no SDPA path for gpt-oss, so --attention sdpa runs "
            "eager (sink logits concatenated to the scores: scores materialised); --attention flash (the "
            "flash-attn 3 sink kernels, kernels-community/vllm-flash-attn3) is measured with SDPA's flash "
            "kernel standing in (no scores; the sinks change no tensor's size). MXFP4 experts: "
            "counted as the bf16 weights transformers builds for training (dequantized); MXFP4 storage "
            "(4-bit values + e8m0 scale per 32) applies only to inference weights"
        )
    return out
