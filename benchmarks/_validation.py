"""The published measurements the accuracy benchmarks compare with.

They are not part of the repository: they live in the shared folder next to the checkout,
``../shared/validation/published-measurements.json`` (the folder that also holds ``DESIGN.md``).
On a fresh clone without it, the benchmarks that need it say so and skip (exit 0).
"""

from __future__ import annotations

import sys
from pathlib import Path

VALIDATION_FILE = (
    Path(__file__).resolve().parents[2] / "shared" / "validation" / "published-measurements.json"
)


def present_or_skip(path: Path, script: str) -> Path:
    """``path`` if it exists; otherwise print why the benchmark is skipped and exit 0."""
    if not path.exists():
        print(f"{script}: skipped: {path} is absent (the shared validation folder next to the checkout)")
        sys.exit(0)
    return path
