"""One validation layer for every input: types, ranges, finiteness and physical limits.

The frozen input dataclasses (``TrainingSetup``, ``Parallelism``, ``Overheads``, ...) call these
checks in ``__post_init__``, so the CLI, the web API and the Python API get the same errors: an
:class:`~peakmem.errors.InputError` (a ``ValueError``) that names the field and the value.

Physical limits reject sizes no cluster holds *before any work is done* (a config with 10^9
layers would otherwise build 10^9 layer objects; ``hidden_size`` 10^30 would print a 60-digit
figure). They are deliberately far above every published model and job, so no real question is
refused; each names what it exceeds.

User files are read within bounds by :mod:`peakmem.userfiles` (regular files only, a size cap read
incrementally, capped decompression, bounded YAML). A ``config.json``'s own bounds (nesting, node
count, its architecture keys' sizes) are checked in :mod:`peakmem.hf.reader`, the one place that knows
HF key names, with the limits below.
"""

from __future__ import annotations

import math
from typing import TypeVar

from peakmem.choice import Choice
from peakmem.errors import InputError

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

# Architecture sizes: the largest value any model could plausibly have, each ~10-100x above
# the largest published one (GPT-3: 96 layers, hidden 12288; PaLM 540B: 118 layers, hidden 18432;
# vocabularies <= ~262k (Gemma 3); contexts <= 10M (Llama 4 Scout); experts <= 384 (Kimi K2)).
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
