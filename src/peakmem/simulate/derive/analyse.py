"""Each block kind's bytes in one fake step, read off the tracker's ledger of allocation events.

:func:`analyse` gives, per block kind, what a representative block (the middle one of its kind) saves
for backward and, event by event, its forward and backward bytes (:class:`peakmem.block_costs.Measured`),
which :func:`peakmem.block_costs.block_cost` fits over the shapes of
:mod:`peakmem.simulate.derive.costs`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from peakmem import block_costs
from peakmem.breakdown import Phase
from peakmem.measure.tracker import BUFFER, GRAD, MASTER, OPTIM_STATE, PARAM
from peakmem.model import FIRST_BLOCK, LAST_BLOCK

_PERSISTENT = {PARAM, BUFFER, GRAD, MASTER, OPTIM_STATE}
Span = tuple[int, int, int]  # (start, end, start of the run before its first) of a block's events


@dataclasses.dataclass(frozen=True)
class _View:
    """A step's ledger with what every block's reading needs (computed once)."""

    ledger: Any
    events: list[tuple[int, int]]  # (storage id, bytes allocated (+) or freed (-))
    first: dict[int, int]  # storage id -> the index of its first event: its allocation
    totals: list[int]  # bytes live before each event (and after the last)
    live: dict[int, int]  # storage id -> bytes live at the end of the forward
    order: list[str]  # the block paths, longest first (the innermost owner matches first)


def _view(ledger: Any, paths: list[str], forward_end: int) -> _View:
    events = ledger._events
    totals = [0]
    for _, delta in events:
        totals.append(totals[-1] + delta)
    first: dict[int, int] = {}
    for k, (sid, delta) in enumerate(events):
        if delta > 0 and sid not in first:
            first[sid] = k
    live: dict[int, int] = {}
    for k in range(forward_end):
        sid, delta = events[k]
        live[sid] = live.get(sid, 0) + delta
        if live[sid] <= 0:
            del live[sid]
    order = sorted(paths, key=len, reverse=True)
    return _View(ledger=ledger, events=events, first=first, totals=totals, live=live, order=order)


def _owner(view: _View, module: str) -> str:
    """The block a module (as the tracker names it) lies in; ``~module`` outside the blocks."""
    module = module.removesuffix(" (backward)")
    for p in view.order:
        if module == p or module.startswith(p + "."):
            return p
    return "~" + module


def _runs(view: _View, a: int, b: int) -> list[tuple[str, int]]:
    """(owner, index of the run's first allocation) of each run of allocations by one owner in [a, b)."""
    out: list[tuple[str, int]] = []
    for k in range(a, b):
        sid, delta = view.events[k]
        if delta > 0 and view.first.get(sid) == k:
            o = _owner(view, view.ledger.records[sid].module)
            if not out or out[-1][0] != o:
                out.append((o, k))
    return out


def _ranges(view: _View, a: int, b: int) -> dict[str, Span]:
    """owner -> (start, end, start of the run before its first) over the events in [a, b)."""
    rs = _runs(view, a, b)
    out: dict[str, Span] = {}
    for i, (o, k) in enumerate(rs):
        end = rs[i + 1][1] if i + 1 < len(rs) else b
        prev = rs[i - 1][1] if i > 0 else a
        if o in out:
            out[o] = (out[o][0], end, out[o][2])
        else:
            out[o] = (k, end, prev)
    return out


def _backward(
    view: _View, path: str, span: Span, saved_sids: set[int], out_sids: set[int]
) -> tuple[tuple[tuple[int, int, int], ...], int, int]:
    """The block's backward, event by event from ``span``'s start: X(k), backward temporaries allocated
    since the run before this block's backward (the incoming gradient included), minus this block's
    saved bytes freed so far; those freed bytes; G(k), its weight gradients written so far (tagged by
    parameter name: tracker.watch_gradients). With the weight gradients' bytes, and the (negative)
    change of its output's bytes before its backward starts."""
    c, d, prev = span
    backward: list[tuple[int, int, int]] = []
    cur = freed = grads = output = 0
    for k in range(prev, d):
        sid, delta = view.events[k]
        rec = view.ledger.records[sid]
        if sid in out_sids and delta < 0 and k < c:
            output += delta
        if sid in saved_sids:
            if delta < 0:
                freed -= delta
        elif GRAD in rec.tags and rec.name.startswith(path + "."):
            if delta > 0 and view.first.get(sid) == k:
                grads += delta
        elif view.first.get(sid, -1) >= prev and not (rec.tags & _PERSISTENT):
            cur += delta
        if k >= c:
            backward.append((cur - freed, freed, grads))
    return tuple(backward), grads, output


def _measured(
    view: _View, path: str, span: Span, back: Span | None, outputs: set[int]
) -> block_costs.Measured:
    """One block's bytes: those of its forward's ``span`` still live at the forward's end (saved), of
    which its output ones (``outputs``) that what follows keeps, and its forward and backward instants."""
    a, b, _ = span
    mine = [
        sid for sid, k in view.first.items()
        if a <= k < b and not (view.ledger.records[sid].tags & _PERSISTENT)
    ]  # fmt: skip
    saved_sids = {sid for sid in mine if sid in view.live}
    saved = sum(view.live.get(sid, 0) for sid in saved_sids)
    # of those, the block's output that what follows keeps (the next block's first Linear or norm)
    # and that is still alive when this block's backward starts (the next block's backward frees what
    # its Linears kept): under checkpointing the next block's kept input, not rebuilt by recomputation
    out_sids = saved_sids & outputs
    output = sum(view.live.get(sid, 0) for sid in out_sids)
    forward = tuple(view.totals[k] - view.totals[a] - saved for k in range(a, b + 1))
    backward: tuple[tuple[int, int, int], ...] = ()
    grads = 0
    if back is not None:
        backward, grads, freed_output = _backward(view, path, back, saved_sids, out_sids)
        output += freed_output
    return block_costs.Measured(saved=saved, forward=forward, backward=backward, grads=grads, output=output)


def analyse(
    ledger: Any,
    paths: list[str],
    keys: list[str],
    outputs: list[set[int]] | None = None,
    *,
    adapters: bool = False,
) -> dict[str, block_costs.Measured]:
    """Per block kind, the middle block's :class:`~peakmem.block_costs.Measured`; the last block's too, under
    its key plus :data:`~peakmem.LAST_BLOCK`, and with ``adapters`` (LoRA/QLoRA) the first block's,
    under :data:`~peakmem.FIRST_BLOCK`."""
    segs = {(step, phase): (a, b) for a, b, step, phase in ledger.segments() if step == 1}
    f0, f1 = segs[(1, Phase.FORWARD)]
    b0, b1 = segs[(1, Phase.BACKWARD)]
    view = _view(ledger, paths, f1)
    fr = _ranges(view, f0, f1)
    br = _ranges(view, b0, b1)
    result: dict[str, list[block_costs.Measured]] = {}
    for path, key in zip(paths, keys, strict=True):
        if path not in fr:
            result.setdefault(key, []).append(block_costs.Measured(saved=0, forward=(), backward=()))
            continue
        mine = outputs[paths.index(path)] if outputs else set()
        result.setdefault(key, []).append(_measured(view, path, fr[path], br.get(path), mine))
    out = {key: vals[len(vals) // 2] for key, vals in result.items()}
    if keys:
        out[keys[-1] + LAST_BLOCK] = result[keys[-1]][-1]
    if adapters and keys:
        out[keys[0] + FIRST_BLOCK] = result[keys[0]][0]
    return out
