"""Reading a ``config.json``: the file (within bounds), the tree's sizes, and typed reads of its keys.

The bounds of a config (file size, nesting depth, node count, and the type and size of the architecture
keys) are checked here, before any work is done, with :mod:`peakmem.validate`'s physical limits; the
HF key names they apply to are :data:`CONFIG_INT_LIMITS`. :class:`_Reader` reads one key at a time and
names the key, the value and the model type in every error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peakmem.errors import ConfigError
from peakmem.userfiles import parse_json, read_user_text
from peakmem.validate import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
    MAX_WIDTH,
    too_large,
)

CONFIG_FILE = "config.json"

_MISSING: Any = object()

# --- config.json bounds ---------------------------------------------------------------------------------
MAX_CONFIG_FILE_BYTES = 10 * 1000 * 1000  # 10 MB; the largest real config.json files are ~100 KB
MAX_CONFIG_DEPTH = 32  # real configs nest 3-4 levels (text_config.rope_scaling.{...})
MAX_CONFIG_NODES = 200_000  # values in the whole tree (per-layer lists of ~100 layers x a few keys)

# Integer keys of config.json files and the largest value any model has a use for
# (:mod:`peakmem.validate` limits): a bigger one is refused before any work is done. These are the
# Hugging Face key names peakmem.hf reads (and their GPT-2/T5-style aliases); a key found anywhere in
# the tree (top level or a nested text_config) is checked.
CONFIG_INT_LIMITS: dict[str, int] = {
    **dict.fromkeys(
        ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers",
         "first_k_dense_replace", "num_nextn_predict_layers"),
        MAX_LAYERS,
    ),
    **dict.fromkeys(
        ("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "ffn_dim",
         "moe_intermediate_size", "shared_expert_intermediate_size", "head_dim", "kv_channels",
         "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
         "rotary_dim", "sliding_window"),
        MAX_WIDTH,
    ),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "num_heads", "num_key_value_heads", "n_head_kv",
         "multi_query_group_num"),
        MAX_HEADS,
    ),
    "vocab_size": MAX_VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "seq_length"), MAX_POSITIONS),
    **dict.fromkeys(
        ("num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
         "moe_topk", "num_shared_experts"),
        MAX_EXPERTS,
    ),
}  # fmt: skip

# Keys whose values are (low, high) bounds where transformers writes +Infinity for "no bound": the
# Mamba-2 family's ``time_step_limit`` defaults to (0.0, float("inf")) (transformers/models/mamba2/
# configuration_mamba2.py; bamba, falcon_h1, granitemoehybrid and nemotron_h copy it), and every config
# those classes save holds it (json.dumps writes Infinity). Elsewhere a float must be finite.
UNBOUNDED_KEYS = frozenset({"time_step_limit"})


# --- reading -----------------------------------------------------------------------------------------
def load_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json`` (or the one inside a folder) into a dict, within the bounds of
    :func:`read_config_file` (size, nesting); errors name the file."""
    p = Path(path)
    if p.is_dir():
        p = p / CONFIG_FILE
    if not p.exists():  # anything else there (a FIFO, a device) is refused by the reader, by name
        raise ConfigError(f"{p}: no such file")
    return read_config_file(p)


def read_config_file(path: Path) -> dict[str, Any]:
    """Read and parse a config.json within the bounds above; errors name the file."""
    text = read_user_text(path, what="a config.json", max_bytes=MAX_CONFIG_FILE_BYTES, error=ConfigError)
    depth = _text_depth(text)
    if depth > MAX_CONFIG_DEPTH:
        raise ConfigError(
            f"{path}: nested {depth} levels deep; a config.json nests at most {MAX_CONFIG_DEPTH}"
        )
    try:
        data = parse_json(text)
    except ValueError as e:
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise ConfigError(f"{path}: not valid JSON{where}: {msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object, not {type(data).__name__}")
    return data


def _text_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text (strings skipped), without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def check_config(config: Mapping[str, Any], int_limits: Mapping[str, int] | None = None) -> None:
    """Bounds of a config dict (from a file, the catalog, the Hub or a web request):

    nesting depth and node count; keys are strings; floats finite; every architecture key of
    :data:`CONFIG_INT_LIMITS` (or ``int_limits``), wherever it appears, an integer (or a list of
    integers, or null) no larger than its limit. Errors name the key and the value.
    """
    limits = CONFIG_INT_LIMITS if int_limits is None else int_limits
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: must be a JSON object, not {type(config).__name__}")
    nodes = 0
    stack: list[tuple[str, Any, int]] = [("", config, 1)]
    while stack:
        path, value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_CONFIG_NODES:
            raise ConfigError(f"config.json: more than {MAX_CONFIG_NODES:,} values; too large for a config")
        if isinstance(value, Mapping):
            if depth > MAX_CONFIG_DEPTH:
                raise ConfigError(f"config.json: {path} nested more than {MAX_CONFIG_DEPTH} levels deep")
            for key, item in value.items():
                if not isinstance(key, (str, int)) or isinstance(key, bool):  # transformers' to_dict(): int
                    where = path or "the top level"  # label keys (id2label); JSON has only strings
                    raise ConfigError(f"config.json: key {key!r} in {where} must be a string")
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and key in limits:
                    _check_config_int(where, item, limits[key])
                if key in UNBOUNDED_KEYS and _is_bounds(item):
                    continue
                stack.append((where, item, depth + 1))
        elif isinstance(value, (list, tuple)):
            if depth > MAX_CONFIG_DEPTH:
                raise ConfigError(f"config.json: {path} nested more than {MAX_CONFIG_DEPTH} levels deep")
            stack.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"config.json: {path}={value!r}: must be a finite number")
        elif not (value is None or isinstance(value, (str, int, float, bool))):
            raise ConfigError(f"config.json: {path}={value!r}: not a JSON value ({type(value).__name__})")


def _is_bounds(value: Any) -> bool:
    """A list of numbers, none NaN (infinite ones allowed)."""
    return isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) for v in value
    )


def _check_config_int(where: str, value: Any, limit: int) -> None:
    items = value if isinstance(value, list) else [value]
    for item in items:
        if item is None:
            continue
        if isinstance(item, bool) or not isinstance(item, int):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise ConfigError(f"config.json: {where}={shown}: must be an integer")
        if item > limit:
            error = too_large(where, item, limit, "for this key; no model has that")
            raise ConfigError(f"config.json: {error}")


class _Reader:
    """Typed reads from a config dict; every error names the key, the value and the model type.

    A key set to ``null`` counts as unset, as transformers' config classes derive such keys
    (``num_key_value_heads``, ``head_dim``, ``n_inner``, ...). Keys where ``null`` means something
    (``sliding_window``, ``q_lora_rank``) are read with :meth:`int_or_none`.
    """

    def __init__(self, raw: Mapping[str, Any], model_type: str, family: str) -> None:
        self.raw = raw
        self.model_type = model_type
        self.family = family  # the transformers config class, for notes: "LlamaConfig"
        self.notes: list[str] = []

    def fail(self, message: str) -> ConfigError:
        return ConfigError(f"{CONFIG_FILE}: {message} (model_type={self.model_type})")

    def _find(self, keys: Sequence[str]) -> tuple[str, Any]:
        for k in keys:
            if self.raw.get(k) is not None:
                return k, self.raw[k]
        return keys[0], _MISSING

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def _default(self, key: str, default: Any, note: bool) -> Any:
        if default is _MISSING:
            raise self.fail(f"missing key {key!r}")
        if note:
            self.notes.append(f"{key} not set; using {default!r} as transformers' {self.family} does")
        return default

    def get_int(self, *keys: str, default: Any = _MISSING, minimum: int = 1, note: bool = True) -> int:
        key, value = self._find(keys)
        if value is _MISSING:
            return int(self._default(key, default, note))
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(f"{key}={value!r}: must be an integer")
        if value < minimum:
            bound = "positive" if minimum == 1 else f">= {minimum}"
            raise self.fail(f"{key}={value!r}: must be {bound}")
        return value

    def int_or_none(self, key: str, default: int | None, minimum: int = 1) -> int | None:
        """An int where ``null`` is a meaningful value (feature off); absent -> ``default``."""
        if key not in self.raw:
            if default is not None:
                self.notes.append(f"{key} not set; using {default!r} as transformers' {self.family} does")
            return default
        if self.raw[key] is None:
            return None
        return self.get_int(key, minimum=minimum)

    def float_or_none(self, key: str, default: float | None) -> float | None:
        """A positive number where ``null`` is a meaningful value (feature off); absent -> ``default``."""
        if key not in self.raw:
            return default
        value = self.raw[key]
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise self.fail(f"{key}={value!r}: must be a positive number or null")
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"{key}={value!r}: must be true or false")
        return value

    def get_float(self, *keys: str, default: float = 0.0) -> float:
        key, value = self._find(keys)
        if value is _MISSING:
            return default
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise self.fail(f"{key}={value!r}: must be a number >= 0")
        return float(value)

    def get_str(self, *keys: str, default: str) -> str:
        key, value = self._find(keys)
        if value is _MISSING:
            return default
        if not isinstance(value, str):
            raise self.fail(f"{key}={value!r}: must be a string")
        return value

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self.raw.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self.fail(f"{key}={value!r}: must be a list of integers")
        return tuple(value)

    def str_list(self, key: str, length: int) -> tuple[str, ...] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{key}={value!r}: must be a list of strings")
        if len(value) != length:
            raise self.fail(f"{key} has {len(value)} entries: must have one per layer ({length})")
        return tuple(value)

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"{key}={value!r}: must be an object")
        return value

    def heads(self, heads: int, kv_heads: int, kv_key: str = "num_key_value_heads") -> None:
        if heads % kv_heads:
            raise self.fail(f"{kv_key}={kv_heads}: must divide num_attention_heads={heads}")

    def derived_head_dim(self, hidden: int, heads: int) -> int:
        if hidden % heads:
            raise self.fail(f"num_attention_heads={heads}: must divide hidden_size={hidden}")
        return hidden // heads


def _partial_rotary(r: _Reader, default: float, legacy_key: str | None = None) -> float:
    """The rotated fraction of each head (rope_parameters / rope_scaling / a legacy top-level key)."""
    for nested in ("rope_parameters", "rope_scaling"):
        value = r.mapping(nested).get("partial_rotary_factor")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    for key in (legacy_key, "partial_rotary_factor"):
        if key is not None and r.has(key):
            return r.get_float(key)
    return default
