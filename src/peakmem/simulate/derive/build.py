# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""The model a ``config.json`` describes, built by transformers on the meta device, and cut to a few blocks.

:func:`build_meta` builds the class the config's ``architectures`` names (the causal-LM auto class
otherwise; the whole model for vision-language and encoder-decoder configs, since that is what
``from_pretrained`` loads). Its repeated blocks are the children of every outermost ``nn.ModuleList`` of
non-leaf modules (:func:`block_lists`). :func:`truncate` cuts the main block list to a few blocks of each
kind for a fake step, cutting the config's per-layer lists and renumbering the kept blocks' ``layer_idx``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from peakmem.errors import InputError

_DROP = ("model_type", "transformers_version", "_name_or_path", "auto_map", "architectures")
# what a failed build raises from transformers' code
_BUILD_ERRORS = (ValueError, ImportError, TypeError, NotImplementedError, AttributeError, KeyError,
                 IndexError, AssertionError, RuntimeError, ZeroDivisionError)  # fmt: skip
KEEP_PER_KIND = 3  # blocks of each kind a truncated measurement keeps (the middle one is measured)
# blocks of a long kind a long step keeps (the second is measured), with the first of every other kind
LONG_KEEP = 2


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
    """The model on the meta device, fp32 (dtype does not change shapes), with the attention
    implementation :func:`build_with` gives peakmem's kernel ``attn`` (eager, sdpa or flash)."""
    cfg = config_object(config)
    cls = model_class(config, cfg)
    try:
        return build_with(cls, cfg, attn)
    except _BUILD_ERRORS as err:
        raise InputError(f"model_type={config.get('model_type')!r}: transformers cannot build it "
                         f"({type(err).__name__}: {err})") from err  # fmt: skip


def build_with(cls: Any, cfg: Any, kernel: str) -> torch.nn.Module:
    """``cls`` built for peakmem's attention kernel ``kernel`` on this CPU (raises what transformers raises).

    * ``sdpa`` and ``flash``: built with SDPA (flash-attn is not importable on the CPU; SDPA's flash kernel
      allocates as FlashAttention-2/3 do: the output and its logsumexp, no scores);
    * a class transformers refuses SDPA for (``_supports_sdpa = False``: BLOOM, Gemma 2, GPT-J, gpt-oss) is
      built eager, transformers' own default then; when ``flash`` was asked and the class has a flash
      path (``_supports_flash_attn``: gpt-oss's sink kernels, Gemma 2's softcapping), its attention is
      switched to SDPA after the build (:func:`_sdpa_stands_in`), so that the fake step measures a flash
      kernel's memory rather than the eager path's materialised scores.
    """
    if kernel == "eager":
        return _construct(cls, cfg, "eager")
    try:
        return _construct(cls, cfg, "sdpa")
    except ValueError:
        model = _construct(cls, cfg, "eager")  # the class has no SDPA path: transformers' default
    if kernel == "flash" and has_flash_path(cls):
        _sdpa_stands_in(model)
    return model


def has_flash_path(cls: Any) -> bool:
    """Whether transformers implements FlashAttention for the class (``_supports_flash_attn``; before
    transformers 4.51 ``_supports_flash_attn_2``)."""
    return bool(getattr(cls, "_supports_flash_attn", False) or getattr(cls, "_supports_flash_attn_2", False))


def _sdpa_stands_in(model: torch.nn.Module) -> None:
    """Run ``model``'s attention through SDPA: the attention modules read ``config._attn_implementation`` at
    every forward and look the function up in ``ALL_ATTENTION_FUNCTIONS`` (transformers 5
    modeling_<family>.py); SDPA's takes the extra arguments (gpt-oss's ``s_aux`` sinks) as ``**kwargs`` and
    ignores them, which changes no tensor's size."""
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and has_flash_path(type(module)) and cfg._attn_implementation == "eager":
            cfg._attn_implementation = "sdpa"


def _construct(cls: Any, cfg: Any, attn: str) -> torch.nn.Module:
    import transformers

    with torch.device("meta"):
        if cls.__name__.startswith("AutoModel") and hasattr(transformers, cls.__name__):
            return cls.from_config(cfg, dtype=torch.float32, attn_implementation=attn)
        return cls._from_config(cfg, dtype=torch.float32, attn_implementation=attn)


def model_params(model: torch.nn.Module) -> int:
    """``sum(p.numel() for p in model.parameters())``: what a derived spec's count must equal."""
    return sum(p.numel() for p in model.parameters())


def why(err: BaseException) -> str:
    """An error as one short line (a table cell, a note)."""
    text = " ".join(f"{type(err).__name__}: {err}".split()).replace("|", "/")
    return text[:160]


def text_config(model: torch.nn.Module) -> Any:
    """The config of the model's text decoder (the model's own config where it has no other)."""
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except TypeError:
            return get()
    return cfg


def block_lists(model: torch.nn.Module) -> list[tuple[str, torch.nn.ModuleList]]:
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


def main_blocks(lists: list[tuple[str, torch.nn.ModuleList]]) -> tuple[str, torch.nn.ModuleList]:
    """The block list holding the most parameters (the decoder's layers); a ValueError if none."""
    return max(lists, key=lambda x: sum(p.numel() for p in x[1].parameters()))


def block_paths(model: torch.nn.Module) -> list[str]:
    """The module path of every block of every block list, in order."""
    return [f"{lp}.{i}" for lp, lst in block_lists(model) for i in range(len(lst))]


def truncate(
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
    lists = block_lists(model)
    if not lists:
        return None
    main_path, main = main_blocks(lists)
    n = len(main)
    kept = _kept(main_path, n, path_keys, prefix=prefix, kinds=kinds)
    if len(kept) == n:
        return None
    parent_path, _, attr = main_path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, attr, torch.nn.ModuleList([main[i] for i in kept]))
    _renumber(main, kept)
    _cut_configs(model, n, kept)
    head = f"{main_path}."
    out = {p: k for p, k in path_keys.items() if not p.startswith(head)}
    for j, i in enumerate(kept):
        if f"{head}{i}" in path_keys:
            out[f"{head}{j}"] = path_keys[f"{head}{i}"]
    return out


def _kept(
    main_path: str, n: int, path_keys: dict[str, str], *, prefix: bool, kinds: frozenset[str] | None
) -> list[int]:
    """The positions in the main block list that :func:`truncate` keeps."""
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
    return kept


def _renumber(blocks: torch.nn.ModuleList, kept: list[int]) -> None:
    """The kept blocks' modules get ``layer_idx`` = their new position (a cache is indexed by it)."""
    for j, i in enumerate(kept):
        for module in blocks[i].modules():
            if getattr(module, "layer_idx", None) == i:
                setattr(module, "layer_idx", j)  # noqa: B010 (a torch Module attribute: typed as one)


def _cut_configs(model: torch.nn.Module, n: int, kept: list[int]) -> None:
    """The model's (and its text decoder's) layer count and per-layer lists cut to the ``kept`` of ``n``."""
    for cfg in (model.config, text_config(model)):
        for name, value in list(vars(cfg).items()):
            if name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers") and value == n:
                setattr(cfg, name, len(kept))
            elif isinstance(value, list) and len(value) == n:
                setattr(cfg, name, [value[i] for i in kept])
