"""The libraries' warnings and log lines raised while peakmem measures, captured instead of printed.

A first answer for a new model runs fake-tensor steps of transformers' own model (with peft and
bitsandbytes for LoRA and QLoRA), and those libraries announce things meant for someone training:
bitsandbytes logs "Failed to load CPU gemm_4bit_forward from kernels-community" at import
(bitsandbytes/backends/cpu/ops.py), peft reads transformers' deprecated ``is_gradient_checkpointing``
(a FutureWarning, transformers 5.23 modeling_utils.py). Inside :func:`quiet_libraries` they are kept,
not printed; :func:`notes_that_matter` picks those that say a kernel falls back or cannot run, which
become a note of the answer (:func:`peakmem.progress.note`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterable, Iterator

LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "torchao", "timm")
# what a message says when it changes what runs: a fallback taken, a kernel or feature that cannot run
MATTERS = re.compile(r"fall(s|ing)?[ -]?back|not supported|unsupported|cannot (be )?(run|use)", re.I)
MAX_NOTE_CHARS = 200  # a note quotes at most this much of a library's message


class _Keep(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.into.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def quiet_libraries() -> Iterator[list[str]]:
    """Inside, the libraries' log records and every warning are captured into the list it yields (filled
    when the block ends), not printed; outside, the loggers and warning filters are as they were. A
    process forked inside inherits the same state, so its libraries stay quiet too."""
    messages: list[str] = []
    keep = _Keep(messages)
    saved = [(lg, lg.handlers[:], lg.propagate) for lg in map(logging.getLogger, LIBRARIES)]
    for lg, _, _ in saved:
        lg.handlers, lg.propagate = [keep], False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield messages
            finally:
                messages.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    finally:
        for lg, handlers, propagate in saved:
            lg.handlers, lg.propagate = handlers, propagate


def notes_that_matter(messages: Iterable[str]) -> list[str]:
    """The messages that say a kernel falls back or cannot run, once each, shortened to a note."""
    out: list[str] = []
    for text in messages:
        line = " ".join(str(text).split())
        if MATTERS.search(line):
            note = "measured with a library fallback: " + line[:MAX_NOTE_CHARS]
            if note not in out:
                out.append(note)
    return out
