"""A memo of what formulas compute from a spec's (or a layer's) tensors alone, kept for one estimator.

:class:`peakmem.estimate.TrainingEstimator` owns one and hands it to the formulas it calls (directly,
or through :class:`~peakmem.formulas.activations.Shapes`); a planner keeps one estimator per question,
so the memo lives and dies with the question. Entries are keyed by the object's identity and hold the
object itself, so an id is never reused while its entry lives. Formulas called without a memo compute.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")
MEMO_MAX = 4096  # entries before the memo starts again (a search asks about a few specs and layers)


class Memo:
    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int, Hashable], tuple[object, Any]] = {}

    def get(self, what: str, obj: object, compute: Callable[[], T], key: Hashable = None) -> T:
        """``compute()``, remembered for (``what``, ``obj``'s identity, ``key``)."""
        k = (what, id(obj), key)
        hit = self._entries.get(k)
        if hit is not None and hit[0] is obj:
            return hit[1]  # type: ignore[no-any-return]
        value = compute()
        if len(self._entries) >= MEMO_MAX:
            self._entries.clear()
        self._entries[k] = (obj, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def memoised(memo: Memo | None, what: str, obj: object, compute: Callable[[], T], key: Hashable = None) -> T:
    """``memo.get(...)``, or ``compute()`` where there is no memo."""
    return compute() if memo is None else memo.get(what, obj, compute, key)


__all__ = ["Memo", "memoised"]
