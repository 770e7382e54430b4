"""What a long answer says while it works, and the notes its measuring leaves for the answer.

A question about a model the formulas do not know may start fake-tensor steps of its blocks (seconds to
a minute): the oracle says what it is doing through :func:`stage` and :func:`advance`, and a face that
wants it shown installs a :class:`Reporter` with :func:`reporting` (the CLI draws a progress display on a
terminal and one line per stage otherwise, on stderr). Nothing is shown where no reporter is installed
(the Python API, the web, the tests). Notes that matter to the answer (a kernel fallback that the
libraries announced while being measured) are kept with :func:`note` and read back by the one answer
(:func:`collected`), which adds them to its assumptions. Standard library only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol


class Reporter(Protocol):
    def stage(self, text: str, total: int) -> None:
        """A new stage of ``total`` steps (0: not counted) begins."""

    def advance(self, done: int) -> None:
        """``done`` steps of the current stage are finished."""

    def close(self) -> None:
        """The work is over (clear a live display)."""


class _Silent:
    def stage(self, text: str, total: int) -> None:
        pass

    def advance(self, done: int) -> None:
        pass

    def close(self) -> None:
        pass


_REPORTER: list[Reporter] = [_Silent()]
_COLLECTORS: list[list[str]] = []  # one per answer being computed, innermost last


def stage(text: str, total: int = 0) -> None:
    _REPORTER[-1].stage(text, total)


def advance(done: int) -> None:
    _REPORTER[-1].advance(done)


@contextlib.contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    """Show the stages of what runs inside on ``reporter``, then close it."""
    _REPORTER.append(reporter)
    try:
        yield
    finally:
        _REPORTER.pop()
        reporter.close()


def note(text: str) -> None:
    """A note for the answer being computed (kept once); dropped where no answer collects notes."""
    if _COLLECTORS and text not in _COLLECTORS[-1]:
        _COLLECTORS[-1].append(text)


@contextlib.contextmanager
def collecting() -> Iterator[list[str]]:
    """The notes left while the block runs, in the list it yields (those of an answer inside an answer
    stay with that one)."""
    found: list[str] = []
    _COLLECTORS.append(found)
    try:
        yield found
    finally:
        _COLLECTORS.pop()
