"""Errors a user can cause, each with the exit code DESIGN.md assigns.

Exit codes: 0 ok/fits, 1 does not fit, 2 usage or input error, 3 unknown model or GPU.
The CLI prints ``str(error)`` on one line and exits with ``error.exit_code``; no traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

EXIT_OK = 0
EXIT_DOES_NOT_FIT = 1
EXIT_INPUT_ERROR = 2
EXIT_UNKNOWN_NAME = 3
MAX_SHOWN_NAME = 80  # an error shows at most this much of a name, so that it stays one line


class PeakmemError(Exception):
    """Base class for errors caused by the user's input."""

    exit_code = EXIT_INPUT_ERROR


class InputError(PeakmemError, ValueError):
    """A value is invalid or a set of options does not combine. Names the field and the value."""

    exit_code = EXIT_INPUT_ERROR


class ConfigError(InputError):
    """A config.json that cannot be read or lacks a key the architecture needs."""


class MissingExtraError(PeakmemError, ImportError):
    """A command needs an optional extra that is not installed; names the pip command."""

    exit_code = EXIT_INPUT_ERROR

    def __init__(self, command: str, extra: str, missing: str) -> None:
        self.extra = extra
        super().__init__(
            f"peakmem {command} needs the {extra!r} extra ({missing} is not installed): "
            f"pip install 'peakmem[{extra}]'"
        )


class UnknownNameError(PeakmemError, LookupError):
    """An unknown model or GPU name, with close matches."""

    exit_code = EXIT_UNKNOWN_NAME

    def __init__(
        self, kind: str, name: str, known: Iterable[str], *, suggestions: list[str] | None = None
    ) -> None:
        self.kind = kind
        self.name = name
        self.suggestions = suggest(name, known) if suggestions is None else suggestions
        hint = f"; did you mean {', '.join(self.suggestions)}?" if self.suggestions else ""
        shown = repr(name) if len(name) <= MAX_SHOWN_NAME else repr(name[:MAX_SHOWN_NAME]) + "..."
        super().__init__(f"unknown {kind} {shown}{hint} (list them with `peakmem {kind}s`)")


def suggest(name: str, known: Iterable[str], limit: int = 3) -> list[str]:
    """Close matches for ``name`` among ``known`` (case-insensitive), best first."""
    lowered = {k.lower(): k for k in known}
    key = name.lower()
    hits = difflib.get_close_matches(key, list(lowered), n=limit, cutoff=0.6)
    if not hits:
        hits = [k for k in lowered if key in k or k in key][:limit]
    return [lowered[h] for h in hits]


def require(condition: bool, field: str, value: object, reason: str) -> None:
    """Raise InputError naming ``field`` and ``value`` unless ``condition`` holds."""
    if not condition:
        raise InputError(f"{field}={value!r}: {reason}")
