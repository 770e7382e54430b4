"""Hugging Face ``config.json`` -> :class:`~peakmem.model.ModelSpec`; the only package that knows HF keys.

Each supported ``model_type`` has a builder that lists every parameter tensor the way transformers
5.23 creates it (module names, shapes, biases, tied heads), so that ``ModelSpec.params`` equals
``sum(p.numel() for p in model.parameters())`` of transformers' own model built from the same config
(checked by ``tests/test_param_counts_torch.py`` on the meta device). The file each builder follows is
named in its docstring (``transformers/models/<family>/modeling_<family>.py``); optional keys take the
defaults of that family's ``configuration_<family>.py``, and a structural default applied to a key the
config does not set is recorded in ``ModelSpec.notes``.

Size keys (vocabulary, width, depth, heads, MLP width, expert counts) are required: a missing one is
a :class:`~peakmem.errors.ConfigError` naming the key, never a silent default.

The package: :mod:`~peakmem.hf.reader` reads a config (the file and the tree within bounds, typed
reads of keys); :mod:`~peakmem.hf.tensors` holds the tensor builders every family shares and
:mod:`~peakmem.hf.decoder` the Llama-style decoder builder; the families are in
:mod:`~peakmem.hf.gpt` (GPT-2, GPT-NeoX, OPT, BLOOM, Falcon), :mod:`~peakmem.hf.llama` (Llama,
Mistral, Mixtral, Qwen, Gemma, Phi-3, StarCoder2, OLMo), :mod:`~peakmem.hf.deepseek` and
:mod:`~peakmem.hf.bert`; the dispatch on ``model_type`` is here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from peakmem.errors import ConfigError
from peakmem.hf.bert import _bert
from peakmem.hf.deepseek import _deepseek
from peakmem.hf.gpt import _bloom, _falcon, _gpt2, _gpt_neox, _opt
from peakmem.hf.llama import (
    _gemma_like,
    _llama,
    _mistral,
    _mixtral,
    _olmo,
    _phi3,
    _qwen2,
    _qwen2_moe,
    _qwen3,
    _qwen3_moe,
    _starcoder2,
)
from peakmem.hf.reader import (
    CONFIG_FILE,
    CONFIG_INT_LIMITS,
    _Reader,
    check_config,
    load_config,
    read_config_file,
)
from peakmem.model import ModelSpec

__all__ = [
    "CONFIG_INT_LIMITS",
    "CONTEXT_KEYS",
    "MULTIMODAL",
    "SUPPORTED_MODEL_TYPES",
    "check_config",
    "context_length",
    "load_config",
    "read_config_file",
    "spec_from_config",
]

# --- dispatch ----------------------------------------------------------------------------------------
_Builder = Callable[[_Reader, "str | None"], ModelSpec]

_FAMILIES: dict[str, tuple[str, _Builder]] = {
    "gpt2": ("GPT2Config", _gpt2),
    "gpt_neox": ("GPTNeoXConfig", _gpt_neox),
    "opt": ("OPTConfig", _opt),
    "bloom": ("BloomConfig", _bloom),
    "falcon": ("FalconConfig", _falcon),
    "llama": ("LlamaConfig", _llama),
    "mistral": ("MistralConfig", _mistral),
    "mixtral": ("MixtralConfig", _mixtral),
    "qwen2": ("Qwen2Config", _qwen2),
    "qwen3": ("Qwen3Config", _qwen3),
    "qwen2_moe": ("Qwen2MoeConfig", _qwen2_moe),
    "qwen3_moe": ("Qwen3MoeConfig", _qwen3_moe),
    "gemma": ("GemmaConfig", lambda r, n: _gemma_like(r, n, 1)),
    "gemma2": ("Gemma2Config", lambda r, n: _gemma_like(r, n, 2)),
    "gemma3_text": ("Gemma3TextConfig", lambda r, n: _gemma_like(r, n, 3)),
    "phi3": ("Phi3Config", _phi3),
    "starcoder2": ("Starcoder2Config", _starcoder2),
    "olmo": ("OlmoConfig", lambda r, n: _olmo(r, n, 1)),
    "olmo2": ("Olmo2Config", lambda r, n: _olmo(r, n, 2)),
    "deepseek_v2": ("DeepseekV2Config", lambda r, n: _deepseek(r, n, 2)),
    "deepseek_v3": ("DeepseekV3Config", lambda r, n: _deepseek(r, n, 3)),
    # Kimi-K2's config.json (moonshotai/Kimi-K2-Instruct) says model_type "kimi_k2", maps AutoConfig to
    # remote code whose class is DeepseekV3Config and names DeepseekV3ForCausalLM: DeepSeek-V3's modules
    "kimi_k2": ("DeepseekV3Config", lambda r, n: _deepseek(r, n, 3)),
    "bert": ("BertConfig", _bert),
}
MULTIMODAL = ("gemma3",)  # read through their text_config
SUPPORTED_MODEL_TYPES: tuple[str, ...] = (*_FAMILIES, *MULTIMODAL)


def spec_from_config(config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
    """Build the :class:`ModelSpec` of the transformers model a ``config.json`` dict describes (its
    keys' types and sizes checked first: every caller, the web's posted configs too)."""
    check_config(config)
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(
            f"{CONFIG_FILE}: missing key 'model_type' (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    notes: list[str] = []
    family_type = model_type
    if model_type == "gemma3":
        text = config.get("text_config")
        if text is None:
            text = {}
        if not isinstance(text, dict):
            raise ConfigError(f"{CONFIG_FILE}: text_config={text!r}: must be an object (model_type=gemma3)")
        notes.append(
            "gemma3 is multimodal: counting the text-only Gemma3ForCausalLM built from text_config "
            "(vision tower and projector not included)"
        )
        name = name or _str_or_none(config.get("_name_or_path"))
        config = text
        family_type = "gemma3_text"
    entry = _FAMILIES.get(family_type)
    if entry is None:
        raise ConfigError(
            f"{CONFIG_FILE}: model_type={model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    family, build = entry
    reader = _Reader(config, model_type, family)
    reader.notes.extend(notes)
    return build(reader, name)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "seq_length", "n_ctx", "max_sequence_length")


def context_length(config: dict[str, Any]) -> int | None:
    """The context a config declares under any common key, for architectures peakmem's formulas do not
    know (``peakmem simulate`` still runs them); None when no key is there."""
    for key in CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
