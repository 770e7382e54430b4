"""One validation layer for every input: types, ranges, finiteness and physical limits.

The frozen input dataclasses (``TrainingSetup``, ``Parallelism``, ``Overheads``, ...) call these
checks in ``__post_init__``, so the CLI, the web API and the Python API get the same errors: an
:class:`~peakmem.errors.InputError` (a ``ValueError``) that names the field and the value.

Physical limits reject sizes no cluster holds *before any work is done* (a config with 10^9
layers would otherwise build 10^9 layer objects; ``hidden_size`` 10^30 would print a 60-digit
figure). They are deliberately far above every published model and job, so no real question is
refused; each names what it exceeds.

``config.json`` reading is bounded here too (:func:`read_config_file`, :func:`check_config`):
file size, nesting depth, node count, and the type and size of the architecture keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from peakmem.choice import Choice
from peakmem.errors import ConfigError, InputError

_C = TypeVar("_C", bound=Choice)

# --- physical limits ----------------------------------------------------------------------------------
# Tokens in one micro-batch (micro_batch x seq_len): 2^40 ~ 1.1e12, about a tenth of everything
# Llama 3 was pre-trained on (15.6e12 tokens, arXiv 2407.21783 §3.1) in ONE forward pass; its
# activations alone would exceed the memory of every cluster built so far.
MAX_TOKENS = 2**40
# Gradient-accumulation steps: 2^20 ~ 1e6 micro-steps per optimizer step, orders of magnitude
# beyond any published recipe (global batches are ~1e3-1e4 sequences).
MAX_GRAD_ACCUM = 2**20
# GPUs in one job: 10^6, ~10x the largest clusters announced (100k-200k H100/H200, 2024-2025).
MAX_GPUS = 10**6
# Bytes one device (or one engine buffer) holds: 2^50 = 1 PiB, ~3,500x a 288 GB B300.
MAX_DEVICE_BYTES = 2**50
# Elements in one engine bucket / parameter budget: 2^50 (as bytes, the same bound).
MAX_ELEMENTS = 2**50
MAX_SHOWN_VALUE = 80  # an error shows at most this much of a value, so that it stays one line

# --- config.json bounds ---------------------------------------------------------------------------------
MAX_CONFIG_FILE_BYTES = 10 * 1000 * 1000  # 10 MB; the largest real config.json files are ~100 KB
MAX_CONFIG_DEPTH = 32  # real configs nest 3-4 levels (text_config.rope_scaling.{...})
MAX_CONFIG_NODES = 200_000  # values in the whole tree (per-layer lists of ~100 layers x a few keys)
# Architecture keys and the largest value any model could plausibly have, each ~10-100x above
# the largest published one (GPT-3: 96 layers, hidden 12288; PaLM 540B: 118 layers, hidden 18432;
# vocabularies <= ~262k (Gemma 3); contexts <= 10M (Llama 4 Scout); experts <= 384 (Kimi K2)).
# These are the Hugging Face key names peakmem.hf reads (and their GPT-2/T5-style aliases); a
# key found anywhere in the tree (top level or a nested text_config) is checked.
MAX_LAYERS = 10_000
MAX_WIDTH = 2**20  # hidden / intermediate / head sizes: ~1e6
MAX_HEADS = 2**16
MAX_VOCAB = 2**26  # ~67M
MAX_POSITIONS = 2**34  # ~1.7e10 tokens
MAX_EXPERTS = 2**16


def too_large(field: str, value: object, limit: int, what: str) -> InputError:
    """``field=value: too large (more than LIMIT WHAT)``; a long value is cut to stay one line."""
    shown = repr(value)
    if len(shown) > MAX_SHOWN_VALUE:
        shown = shown[: MAX_SHOWN_VALUE - 3] + "..."
    return InputError(f"{field}={shown}: too large (more than {limit:,} {what})")


# --- scalar checks --------------------------------------------------------------------------------------
def check_int(
    field: str, value: object, *, minimum: int = 1, maximum: int | None = None, what: str = ""
) -> int:
    """``value`` as an int in [minimum, maximum]: no bool, no float (2.0 included), no string."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{field}={value!r}: must be an integer, not {type(value).__name__}")
    if value < minimum:
        bound = "positive" if minimum == 1 else f">= {minimum}"
        raise InputError(f"{field}={value!r}: must be {bound}")
    if maximum is not None and value > maximum:
        raise too_large(field, value, maximum, what or "allowed")  # what: "GPUs; no cluster has more"
    return value


def check_real(
    field: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    closed_max: bool = True,
) -> float:
    """A finite int or float (no bool) in [minimum, maximum] (or [minimum, maximum))."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{field}={value!r}: must be a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{field}={value!r}: must be a finite number")
    if minimum is not None and value < minimum:
        raise InputError(f"{field}={value!r}: must be >= {minimum}")
    if maximum is not None and (value > maximum if closed_max else value >= maximum):
        bracket = "]" if closed_max else ")"
        raise InputError(f"{field}={value!r}: must be in [{minimum}, {maximum}{bracket}")
    return float(value)


def check_bool(field: str, value: object, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, bool):
        raise InputError(f"{field}={value!r}: must be True or False, not {type(value).__name__}")


def check_str(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise InputError(f"{field}={value!r}: must be a string, not {type(value).__name__}")


def coerce_choice(obj: object, attr: str, enum: type[_C], field: str | None = None) -> _C:
    """The enum member of ``obj.attr`` (a member or its spelling), set back on the frozen ``obj``.

    ``precision="bf16"`` becomes ``Precision.BF16``; ``precision="bogus"`` raises an InputError
    that names the field and lists the choices (never a bare KeyError later on).
    """
    value = getattr(obj, attr)
    name = field or attr
    if isinstance(value, enum):
        return value
    if not isinstance(value, str):
        choices = ", ".join(m.value for m in enum)
        raise InputError(f"{name}={value!r}: must be one of {choices}, not {type(value).__name__}")
    member = enum.parse(value, name)
    object.__setattr__(obj, attr, member)
    return member


# --- config.json ------------------------------------------------------------------------------------------
def read_user_file(
    path: Path, *, what: str, max_bytes: int, label: str = "", error: type[InputError] = InputError
) -> bytes:
    """The bytes of a file the user named, at most ``max_bytes`` (checked before reading); every failure
    is ``error`` (exit 2) naming the file (``label``: how it was given, e.g. ``--from``) and ``what``
    was expected. The one reader of user files: config.json, --from, calibrate's inputs, snapshots."""
    name = f"{label} {path}" if label else str(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{name}: {size:,} bytes is too large for {what} (at most {max_bytes:,})")
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{name}: no such file") from None
    except IsADirectoryError:
        raise error(f"{name}: a folder, not {what}") from None
    except OSError as e:
        raise error(f"{name}: cannot read it ({e.strerror or e})") from None


def read_user_text(
    path: Path, *, what: str, max_bytes: int, label: str = "", error: type[InputError] = InputError
) -> str:
    """:func:`read_user_file` decoded as UTF-8; other bytes are ``error`` naming the file."""
    data = read_user_file(path, what=what, max_bytes=max_bytes, label=label, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        name = f"{label} {path}" if label else str(path)
        raise error(f"{name}: not UTF-8 text ({e.reason}); expected {what}") from None


def read_config_file(path: Path) -> dict[str, Any]:
    """Read and parse a config.json within the bounds above; errors name the file."""
    text = read_user_text(path, what="a config.json", max_bytes=MAX_CONFIG_FILE_BYTES, error=ConfigError)
    depth = _text_depth(text)
    if depth > MAX_CONFIG_DEPTH:
        raise ConfigError(
            f"{path}: nested {depth} levels deep; a config.json nests at most {MAX_CONFIG_DEPTH}"
        )
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as e:
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
    :data:`peakmem.hf.CONFIG_INT_LIMITS` (or ``int_limits``), wherever it appears, an integer (or a list
    of integers, or null) no larger than its limit. Errors name the key and the value.
    """
    if int_limits is None:
        from peakmem.hf import CONFIG_INT_LIMITS  # the HF key names live in hf.py

        int_limits = CONFIG_INT_LIMITS
    limits = int_limits
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


# Keys whose values are (low, high) bounds where transformers writes +Infinity for "no bound": the
# Mamba-2 family's ``time_step_limit`` defaults to (0.0, float("inf")) (transformers/models/mamba2/
# configuration_mamba2.py; bamba, falcon_h1, granitemoehybrid and nemotron_h copy it), and every config
# those classes save holds it (json.dumps writes Infinity). Elsewhere a float must be finite.
UNBOUNDED_KEYS = frozenset({"time_step_limit"})


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
