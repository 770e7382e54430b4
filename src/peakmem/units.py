"""Units: the only place where byte counts are parsed from or shown as text.

Inside peakmem every size is an ``int`` number of bytes. Binary units (KiB, MiB, GiB, TiB) are
powers of 1024; decimal units (KB, MB, GB, TB) powers of 1000, as vendors and the seed use them.
"""

from __future__ import annotations

import math
import re

from peakmem.errors import InputError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4
KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4

_UNITS: dict[str, int] = {
    "b": 1,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "ki": KiB, "mi": MiB, "gi": GiB, "ti": TiB,
    "kb": KB, "mb": MB, "gb": GB, "tb": TB,
    "k": KB, "m": MB, "g": GB, "t": TB,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
ACCEPTED_SIZE_FORMS = "a number with a unit: 24GB, 24 GB, 24GiB, 24g, 80GiB, 512MiB"


def parse_size(text: str) -> int:
    """Parse ``"24GB"``, ``"24 GiB"``, ``"24g"`` into bytes. A bare unit letter is decimal."""
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS or not match.group(2):
        raise InputError(f"size {text!r} not understood; use {ACCEPTED_SIZE_FORMS}")
    return math.ceil(float(match.group(1)) * _UNITS[match.group(2).lower()])


def looks_like_size(text: str) -> bool:
    match = _SIZE.match(text)
    return bool(match and match.group(2) and match.group(2).lower() in _UNITS)


def fmt_gb(n_bytes: int, digits: int = 2) -> str:
    return f"{n_bytes / GB:,.{digits}f} GB"


def fmt_gib(n_bytes: int, digits: int = 2) -> str:
    return f"{n_bytes / GiB:,.{digits}f} GiB"


def fmt_both(n_bytes: int, digits: int = 2) -> str:
    """``24.92 GB (23.21 GiB)``: decimal first, as the seed and vendors quote memory."""
    return f"{fmt_gb(n_bytes, digits)} ({fmt_gib(n_bytes, digits)})"


def fmt_bytes(n_bytes: int) -> str:
    """The shortest readable binary form: ``512 B``, ``3.50 MiB``, ``23.21 GiB``."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:,.2f} {unit}"
    return f"{n_bytes} B"


def fmt_count(n: int) -> str:
    """Parameter counts: ``1.56 B``, ``124.4 M``."""
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return str(n)
