"""An exact ledger of live tensor storage, split by category and phase.

Two layers, so a fake-tensor simulator can reuse the bookkeeping without real memory:

* :class:`StorageLedger` is pure Python: it receives ``alloc(key, nbytes, ...)``, ``free(key)``,
  ``tag(key, ...)`` and ``set_phase(...)`` calls, keeps an append-only event log, and afterwards
  answers "what was alive, by category, at the peak of each phase of each step" by replaying
  the log. Categories are decided *after* the run from each storage's final tags (a tensor
  created inside ``optimizer.step()`` is known to be an optimizer state only once the step
  returns; a backward temporary becomes a gradient when ``AccumulateGrad`` steals it).
* :class:`LiveStorageTracker` feeds a ledger from a real PyTorch run: a ``TorchDispatchMode``
  sees every op's outputs (forward, backward, optimizer, factory functions), keys each output
  by its ``untyped_storage()`` (views and in-place results share a storage, so they count
  once) and attaches ``weakref.finalize`` to the storage object to observe its free. PyTorch
  preserves a storage's Python object while the C++ ``StorageImpl`` lives, so the finalizer
  runs exactly when the storage's memory goes back to the allocator. Saved-for-backward
  tensors are seen through ``torch.autograd.graph.saved_tensors_hooks``; parameters,
  buffers, gradients, master weights and optimizer states are tagged by identity.

Bytes are ``UntypedStorage.nbytes()``: what the tensor asked for, before any allocator
rounding (the CPU allocator aligns to 64 bytes, the CUDA caching allocator rounds blocks to
512 bytes; neither is counted here).

Known blind spots (also echoed in ``Estimate.assumptions`` by the runner):

* memory a kernel allocates internally and frees before returning without it ever becoming a
  tensor returned to the dispatcher (oneDNN/MKL scratchpads, per-thread buffers of the CPU
  flash-attention kernel, ``at::empty`` calls inside a C++ kernel) is invisible to a dispatch
  mode; so is memory outside PyTorch's tensors (Python objects, the autograd graph's nodes).
  Measured with the allocator cross-check (``measure_training(cross_check=True)``): 0-64 bytes
  on 32 tiny GPT-2/Llama cases without checkpointing; with checkpointing the allocator also
  holds ``torch.utils.checkpoint``'s saved CPU RNG state (5056 bytes per checkpointed layer,
  host memory on a GPU run) and, in bf16 runs, buffers oneDNN allocates inside ``aten::mm``
  (165632 bytes in one amp-bf16 case; 460544 bytes, 2.4% of the peak, in one mixed-bf16 case
  with SDPA and full checkpointing);
* a storage created before tracking starts is seen only if it is registered explicitly
  (the runner registers parameters and buffers);
* a storage is attributed to the op that first returned it; its category comes from its final
  tags, so a temporary that later becomes a gradient counts as a gradient from its creation.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from peakmem.breakdown import Category, Phase

# Tags a storage can carry; the category is decided by the first matching rule in _category().
PARAM = "param"
BUFFER = "buffer"
MASTER = "master"  # fp32 master copy of a 16-bit weight (mixed-* trainer)
OPTIM_STATE = "optim_state"
GRAD = "grad"
SAVED = "saved"  # saved for backward (autograd pack hook)
RECOMPUTED = "recomputed"  # created while checkpointing recomputes a layer (label only; saved -> SAVED)
INPUT = "input"  # the batch: input_ids, labels
WEIGHT_CAST = "weight_cast"  # autocast's cached 16-bit copy of a weight

IGNORED = -1  # sid_of() of a storage on a device type the tracker does not count

_LAYER_INDEX = re.compile(r"\.\d+(?=\.|$)")


def normalize_path(path: str) -> str:
    """``model.layers.3.mlp.up_proj`` -> ``model.layers.*.mlp.up_proj`` (groups repeated layers)."""
    return _LAYER_INDEX.sub(".*", path)


@dataclass
class StorageRecord:
    """What the ledger knows about one storage (one allocation)."""

    sid: int
    nbytes: int
    step: int
    phase: Phase
    op: str
    module: str = ""
    dtype: str = ""
    shape: tuple[int, ...] = ()
    name: str = ""  # parameter / state name when tagged by identity
    tags: set[str] = field(default_factory=set)

    @property
    def category(self) -> Category:
        return _category(self.tags)

    @property
    def label(self) -> str:
        """How items are grouped at a peak: category-specific, layer indices folded to ``*``."""
        cat = self.category
        if cat in (Category.PARAMETERS, Category.BUFFERS, Category.MASTER_WEIGHTS, Category.GRADIENTS):
            return str(cat.value)
        if cat == Category.OPTIMIZER_STATES:
            return f"optimizer.{self.name or 'state'}"
        if INPUT in self.tags:
            return "inputs (input_ids, labels)"
        where = normalize_path(self.module) if self.module else f"{self.phase.value}"
        if WEIGHT_CAST in self.tags:
            return f"autocast weight cast: {normalize_path(self.name) or where}"
        prefix = "recomputed: " if RECOMPUTED in self.tags else ""
        return f"{prefix}{where}: {self.op}"


def _category(tags: set[str]) -> Category:
    if MASTER in tags:
        return Category.MASTER_WEIGHTS
    if PARAM in tags:
        return Category.PARAMETERS
    if BUFFER in tags:
        return Category.BUFFERS
    if OPTIM_STATE in tags:
        return Category.OPTIMIZER_STATES
    if GRAD in tags:
        return Category.GRADIENTS
    if tags & {SAVED, INPUT}:
        return Category.ACTIVATIONS
    return Category.TEMPORARIES


@dataclass(frozen=True)
class Snapshot:
    """The live storages at one instant."""

    step: int
    phase: Phase
    event_index: int  # live set after this many events
    bytes: int
    records: tuple[StorageRecord, ...]

    def by_category(self) -> dict[Category, int]:
        out: dict[Category, int] = {}
        for r in self.records:
            out[r.category] = out.get(r.category, 0) + r.nbytes
        return {c: out[c] for c in Category if c in out}

    def by_label(self) -> list[tuple[Category, str, int]]:
        """(category, label, bytes), biggest first within the category order of ``Category``."""
        sums: dict[tuple[Category, str], int] = {}
        for r in self.records:
            key = (r.category, r.label)
            sums[key] = sums.get(key, 0) + r.nbytes
        order = {c: i for i, c in enumerate(Category)}
        return sorted(((c, lab, b) for (c, lab), b in sums.items()), key=lambda x: (order[x[0]], -x[2]))

    def largest(self, n: int = 10) -> list[StorageRecord]:
        return sorted(self.records, key=lambda r: -r.nbytes)[:n]


class StorageLedger:
    """Append-only log of allocations and frees, with phase markers; replayed for peaks."""

    def __init__(self) -> None:
        self.records: dict[int, StorageRecord] = {}
        self._events: list[tuple[int, int]] = []  # (sid, signed byte delta)
        self._segments: list[tuple[int, int, Phase]] = []  # (first event index, step, phase)
        self._live: dict[int, int] = {}  # sid -> bytes, now
        self.current = 0
        self.step = 0
        self.phase = Phase.LOAD
        self._next_sid = 0
        self.set_phase(Phase.LOAD, 0)

    # --- recording ----------------------------------------------------------------------------
    def set_phase(self, phase: Phase, step: int) -> None:
        self.phase, self.step = phase, step
        if self._segments and self._segments[-1][0] == len(self._events):
            self._segments[-1] = (len(self._events), step, phase)  # empty segment: replace it
        else:
            self._segments.append((len(self._events), step, phase))

    def alloc(
        self,
        nbytes: int,
        *,
        op: str,
        module: str = "",
        dtype: str = "",
        shape: tuple[int, ...] = (),
        tags: Iterable[str] = (),
        name: str = "",
    ) -> int:
        sid = self._next_sid
        self._next_sid += 1
        self.records[sid] = StorageRecord(
            sid=sid, nbytes=nbytes, step=self.step, phase=self.phase, op=op, module=module,
            dtype=dtype, shape=shape, name=name, tags=set(tags),
        )  # fmt: skip
        self._apply(sid, nbytes)
        return sid

    def resize(self, sid: int, nbytes: int) -> None:
        """A storage grew or shrank in place (``resize_``, ``out=`` ops)."""
        old = self._live.get(sid)
        if old is None or old == nbytes:
            return
        self.records[sid].nbytes = max(self.records[sid].nbytes, nbytes)
        self._apply(sid, nbytes - old)

    def free(self, sid: int) -> None:
        nbytes = self._live.get(sid)
        if nbytes is not None:
            self._apply(sid, -nbytes)

    def tag(self, sid: int, tag: str, name: str = "") -> None:
        rec = self.records[sid]
        rec.tags.add(tag)
        if name and not rec.name:
            rec.name = name

    def is_live(self, sid: int) -> bool:
        return sid in self._live

    def _apply(self, sid: int, delta: int) -> None:
        self._events.append((sid, delta))
        self.current += delta
        new = self._live.get(sid, 0) + delta
        if new <= 0 and delta < 0:
            self._live.pop(sid, None)
        else:
            self._live[sid] = new

    # --- analysis -----------------------------------------------------------------------------
    def segments(self) -> Iterator[tuple[int, int, int, Phase]]:
        """(start, end, step, phase) event ranges, in order."""
        for i, (start, step, phase) in enumerate(self._segments):
            end = self._segments[i + 1][0] if i + 1 < len(self._segments) else len(self._events)
            yield start, end, step, phase

    def peaks(self) -> list[Snapshot]:
        """The live set at the peak of every (step, phase) segment, merging repeated segments of
        the same (step, phase) (gradient accumulation's micro-batches) into one peak."""
        totals = [0]
        for _, delta in self._events:
            totals.append(totals[-1] + delta)
        # Live bytes after k events is totals[k]; a segment [start, end) spans totals[start..end].
        best: dict[tuple[int, Phase], tuple[int, int]] = {}  # (step, phase) -> (bytes, index)
        for start, end, step, phase in self.segments():
            idx = max(range(start, end + 1), key=lambda k: (totals[k], -k))
            key = (step, phase)
            if key not in best or totals[idx] > best[key][0]:
                best[key] = (totals[idx], idx)
        wanted = sorted({idx for _, idx in best.values()})
        live_at: dict[int, tuple[StorageRecord, ...]] = {}
        live: dict[int, int] = {}
        k = 0
        for idx in wanted:
            while k < idx:
                sid, delta = self._events[k]
                new = live.get(sid, 0) + delta
                if new <= 0 and delta < 0:
                    live.pop(sid, None)
                else:
                    live[sid] = new
                k += 1
            live_at[idx] = tuple(_sized(self.records[s], b) for s, b in live.items())
        return [
            Snapshot(step=step, phase=phase, event_index=idx, bytes=b, records=live_at[idx])
            for (step, phase), (b, idx) in best.items()
        ]

    def live_snapshot(self) -> Snapshot:
        recs = tuple(_sized(self.records[s], b) for s, b in self._live.items())
        return Snapshot(
            step=self.step, phase=self.phase, event_index=len(self._events), bytes=self.current, records=recs
        )


def _sized(rec: StorageRecord, nbytes: int) -> StorageRecord:
    return rec if rec.nbytes == nbytes else replace(rec, nbytes=nbytes)


# ------------------------------------------------------------------------------------------------
# The live tracker: a real PyTorch run feeds the ledger.
# ------------------------------------------------------------------------------------------------


class LiveStorageTracker:
    """Records every storage a real run creates and frees into a :class:`StorageLedger`.

    Use::

        tracker = LiveStorageTracker()
        tracker.register_module(model)               # parameters and buffers, phase LOAD
        with tracker:                                # dispatch mode + saved-tensor hooks
            tracker.set_phase(Phase.FORWARD, step=1)
            ...
    """

    def __init__(self, ledger: StorageLedger | None = None, *, device_type: str | None = None) -> None:
        self.ledger = ledger or StorageLedger()
        self.device_type = device_type  # count only storages on this device type (None: all)
        self._sids: dict[int, int] = {}  # id(storage object) -> sid, while alive
        self._module_stack: list[str] = []
        self._module_names: dict[int, str] = {}
        self._param_names: dict[int, str] = {}  # id(storage object) -> parameter name
        self._hooks: list[Any] = []
        self._stack: list[Any] = []
        self.recomputing = 0  # >0 while activation checkpointing recomputes a layer

    # --- storage identity ---------------------------------------------------------------------
    def sid_of(self, tensor: Any, *, op: str = "untracked", tags: Iterable[str] = (), name: str = "") -> int:
        """The ledger id of ``tensor``'s storage, registering it (as allocated now) if unseen;
        ``IGNORED`` for a tensor on another device type than the one tracked."""
        if self.device_type is not None and tensor.device.type != self.device_type:
            return IGNORED
        st = tensor.untyped_storage()
        key = id(st)
        sid = self._sids.get(key)
        nbytes = int(st.nbytes())
        if sid is not None:
            self.ledger.resize(sid, nbytes)
            for t in tags:
                self.ledger.tag(sid, t, name)
            return sid
        sid = self.ledger.alloc(
            nbytes, op=op, module=self._module_stack[-1] if self._module_stack else "",
            dtype=str(tensor.dtype).removeprefix("torch."), shape=tuple(tensor.shape), tags=tags, name=name,
        )  # fmt: skip
        self._sids[key] = sid
        weakref.finalize(st, self._on_free, key, sid).atexit = False
        return sid

    def defers_to(self, types: Any) -> bool:
        """Whether an op on these tensor types goes to a tensor subclass's own ``__torch_dispatch__``
        before the mode (no subclass here; see ``measure.parallel.ParallelTracker``)."""
        return False

    def _on_free(self, key: int, sid: int) -> None:
        if self._sids.get(key) == sid:
            del self._sids[key]
        self.ledger.free(sid)

    def tag(self, tensor: Any, tag: str, name: str = "") -> None:
        self.sid_of(tensor, op=f"tagged {tag}", tags=(tag,), name=name)

    def set_phase(self, phase: Phase, step: int) -> None:
        self._module_stack.clear()  # phase boundaries lie outside every module's forward
        self.ledger.set_phase(phase, step)

    # --- identity registration ----------------------------------------------------------------
    def register_module(self, model: Any) -> None:
        """Parameters and buffers as they are now (call before entering the tracker)."""
        for name, mod in model.named_modules():
            self._module_names[id(mod)] = name or type(mod).__name__
        for name, p in model.named_parameters(remove_duplicate=True):
            self.sid_of(p, op="parameter", tags=(PARAM,), name=name)
            self._param_names[id(p.untyped_storage())] = name
        for name, b in model.named_buffers(remove_duplicate=True):
            self.sid_of(b, op="buffer", tags=(BUFFER,), name=name)

    def watch_gradients(self, params: Iterable[tuple[str, Any]]) -> None:
        """Tag each parameter's ``.grad`` when autograd accumulates it."""
        for name, p in params:
            if p.requires_grad:
                h = p.register_post_accumulate_grad_hook(
                    lambda q, n=name: self.tag(q.grad, GRAD, n) if q.grad is not None else None
                )
                self._hooks.append(h)

    def tag_optimizer_states(self, optimizer: Any, names: dict[int, str] | None = None) -> None:
        """Tag every tensor in ``optimizer.state`` (call after a step)."""
        for state in optimizer.state.values():
            for key, value in state.items():
                if _is_tensor(value):
                    self.tag(value, OPTIM_STATE, str(key))

    @contextmanager
    def recompute(self) -> Iterator[None]:
        """Context for activation checkpointing's recomputation (``context_fn``'s second half).

        ``torch.utils.checkpoint`` (non-reentrant) saves the recomputed tensors through its own
        saved-tensor hook, which sits on top of ours; this context wraps that hook so the
        tensors it keeps are tagged as saved (activations) before it stores them.
        """
        import torch
        from torch.autograd.graph import saved_tensors_hooks

        inner = torch._C._autograd._top_saved_tensors_default_hooks(True)
        depth = len(self._module_stack)  # an early-stopped recomputation skips forward post-hooks
        self.recomputing += 1
        try:
            if inner is None:
                yield
                return
            inner_pack, inner_unpack = inner

            def pack(tensor: Any) -> Any:
                self.sid_of(tensor, op="saved", tags=(SAVED,))
                return inner_pack(tensor)

            with saved_tensors_hooks(pack, inner_unpack):
                yield
        finally:
            self.recomputing -= 1
            del self._module_stack[depth:]

    # --- entering and leaving -----------------------------------------------------------------
    def __enter__(self) -> LiveStorageTracker:
        import torch
        from torch.autograd.graph import saved_tensors_hooks
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        mode = _make_mode(self)
        hooks = saved_tensors_hooks(self._pack, _unpack)
        pre = register_module_forward_pre_hook(self._enter_module)
        post = register_module_forward_hook(self._leave_module)
        self._stack = [mode, hooks, pre, post]
        mode.__enter__()
        hooks.__enter__()
        self._torch = torch
        return self

    def __exit__(self, *exc: object) -> None:
        mode, hooks, pre, post = self._stack
        hooks.__exit__(None, None, None)
        mode.__exit__(None, None, None)
        pre.remove()
        post.remove()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._stack = []

    def _pack(self, tensor: Any) -> Any:
        self.sid_of(tensor, op="saved", tags=(SAVED,))
        return tensor

    def _enter_module(self, module: Any, args: Any) -> None:
        self._module_stack.append(self._module_names.get(id(module), type(module).__name__))

    def _leave_module(self, module: Any, args: Any, output: Any) -> None:
        if self._module_stack:
            self._module_stack.pop()

    def _on_op(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        from torch.utils._pytree import tree_flatten

        name = _op_name(func)
        outs = [t for t in tree_flatten(out)[0] if _is_tensor(t)]
        for t in outs:
            # Only storages the recomputation creates are "recomputed" (not views of older ones).
            fresh = self.recomputing and id(t.untyped_storage()) not in self._sids
            sid = self.sid_of(t, op=name, tags=(RECOMPUTED,) if fresh else ())
            src = args[0] if name == "_to_copy" and args else None
            if src is not None and _is_tensor(src):  # autocast's weight cast (autocast is off in here)
                key = id(src.untyped_storage())
                pname = self._param_names.get(key)
                if pname is not None and sid != IGNORED and sid != self._sids.get(key):
                    self.ledger.tag(sid, WEIGHT_CAST, pname)


def _unpack(tensor: Any) -> Any:
    return tensor


def _is_tensor(x: object) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", str(func))  # "mm.default"
    return str(name).split(".")[0]


def _make_mode(tracker: LiveStorageTracker) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _StorageMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if tracker.defers_to(types):
                return NotImplemented  # the subclass runs first; its ops on plain tensors come back here
            out = func(*args, **(kwargs or {}))
            tracker._on_op(func, args, kwargs, out)
            return out

    return _StorageMode()  # type: ignore[no-untyped-call]
