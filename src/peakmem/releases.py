"""Release numbers as users type them (``--engine-version``, ``--bitsandbytes``, ``--torchao``), read once.

``0.21``, ``v0.10.1.1``, ``0.8.5.post1``, ``0.50.2.dev0``, ``0.5.0+cu121`` -> (major, minor, patch): a
leading ``v``, two to four numeric parts (a fourth is ignored), a ``post`` / ``dev`` / ``rc`` suffix and a
``+local`` tag are accepted, as pip's version strings of these projects carry them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from peakmem.errors import InputError

Release = tuple[int, int, int]
_RELEASE = re.compile(
    r"v?(\d{1,3})\.(\d{1,3})(?:\.(\d{1,4}))?(?:\.\d{1,4})?(?:\.?(?:post|dev|rc)\d{0,8})?(?:\+[0-9a-z_.]{1,32})?"
)


def parse_release(text: object, *, field: str, examples: str) -> Release:
    """(major, minor, patch) of ``text``; else an InputError naming ``field`` and the ``examples``."""
    match = _RELEASE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise InputError(f"{field}={text!r}: a release number such as {examples}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


class _Row(Protocol):
    @property
    def since(self) -> Release: ...


RowT = TypeVar("RowT", bound=_Row)


def in_force(rows: Sequence[RowT], version: Release) -> RowT:
    """The first of ``rows`` (newest first, the last from (0, 0, 0)) whose ``since`` is at most ``version``:
    what that release does (peakmem.bnb_versions, peakmem.torchao_versions)."""
    return next(r for r in rows if r.since <= version)


@dataclass(frozen=True)
class ReleaseTable(Generic[RowT]):
    """One library's release table: its option's name (``field``), an old release for the error's example,
    today's release, and its rows newest first (each ``since`` the first release that does what it says)."""

    field: str
    example: str
    current: str
    rows: tuple[RowT, ...]

    def parse(self, text: object) -> Release:
        """(major, minor, patch) of ``text``; else an InputError naming the field and two examples."""
        return parse_release(text, field=self.field, examples=f"{self.example} or {self.current}")

    def facts(self, version: str) -> RowT:
        """The row in force for ``version`` (an InputError if it is malformed)."""
        return in_force(self.rows, self.parse(version))


__all__ = ["Release", "ReleaseTable", "in_force", "parse_release"]
