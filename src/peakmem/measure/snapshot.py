"""Read a CUDA memory snapshot (``torch.cuda.memory._dump_snapshot()``), replay its allocation trace,
find the allocated peak and say which blocks were live there and what made them (``peakmem explain``);
also one :class:`~peakmem.calibrate.Measurement` from it (``peakmem calibrate``).

The format is PyTorch's (torch/cuda/memory.py ``_snapshot`` docstring, the structure
torch/cuda/_memory_viz.py and pytorch.org/memory_viz read): a dict with ``segments`` (each: device,
address, total_size, allocated_size, active_size, stream, segment_type, blocks: [{address, size,
requested_size, state: active_allocated | active_awaiting_free | inactive, frames}]) and
``device_traces`` (per device, the events of ``torch.cuda.memory._record_memory_history``: action
alloc | free_requested | free_completed | segment_alloc | segment_free | segment_map |
segment_unmap | oom | snapshot, with addr, size, stream, frames [{filename, line, name}]; an oom has
``device_free`` and no addr).

A snapshot pickle holds only dicts, lists, tuples, strings and numbers: it is read with an unpickler
that refuses every global (no class is ever imported, no code run), and without torch. Its work is
bounded by its size (:mod:`peakmem.userfiles`' rule): a gzip is inflated as the unpickler asks, at most
``MAX_GZIP_RATIO`` times its size (and ``MAX_SNAPSHOT_BYTES``) in all and ``MAX_PICKLE_REQUEST`` at
once; the objects built are at most one per opcode. Pickle memo references let a small file name one
record many times, and the replay walks records and stacks: torch writes each segment, block and trace
event once (torch/csrc/cuda/Module.cpp ``THCPModule_memorySnapshot`` builds one dict per record), so a
record met twice is refused; stacks are shared there (``py_symbolize`` returns one list per distinct
traceback), so each distinct stack is read and classified once (:class:`_Stacks`), and the replay's work
stays linear in the file's size; a stack longer than ``MAX_STACK_FRAMES`` is refused.

Replay (as MemoryViz.js does): the trace is a ring buffer of the last ``max_entries`` events, so a
free of an address the trace never allocated, and a block live at snapshot time that the trace never
allocated, were allocated before the trace began; both are counted as live from its first event.
``allocated`` drops at ``free_requested`` (CUDACachingAllocator ``free()`` decreases
``allocated_bytes`` before a stream-used block waits for its events), so the peak matches
``torch.cuda.max_memory_allocated``. Without a trace, the blocks live when the snapshot was taken
stand for the peak, and the report says so.
"""

from __future__ import annotations

import gzip
import io
import pickle
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from peakmem.breakdown import Category, Estimate
from peakmem.calibrate import Measurement
from peakmem.errors import InputError
from peakmem.units import fmt_bytes
from peakmem.userfiles import CappedStream, is_regular_file, read_user_file

MAX_SNAPSHOT_BYTES = 4 * 1000**3  # 4 GB: a 1M-event trace with deep stacks is ~1 GB
GZIP_MAGIC = b"\x1f\x8b"  # RFC 1952 ID1 ID2
PICKLE_PROTO = b"\x80"  # pickle's PROTO opcode: the first byte of every protocol 2+ pickle
# The most one read of the unpickler may ask of a gzip stream: pickle frames are 64 KiB
# (pickle._FRAME_SIZE_TARGET), and a snapshot's largest single object, a file name or a frame's
# source line, is far below 64 MiB; a request for more is a length field written to inflate a bomb.
MAX_PICKLE_REQUEST = 64 * 2**20
# A gzip snapshot inflates to at most this many times its own size (plus GZIP_SLACK_BYTES): a pickled
# trace compresses ~3x (measured on a synthetic 200k-event trace with shared stacks: 10.5 MB -> 3.4 MB;
# 10x margin), a bomb ~1000x. The worst pickle builds 8 bytes of stack per 2 bytes it holds (BININT1),
# so a 4.5 MB gzip bomb stops at ~210 MB inflated, under 1 GB of memory, where 100x took 2 GB.
MAX_GZIP_RATIO = 32
GZIP_SLACK_BYTES = 64 * 2**20
# Frames in one stack: Python's default recursion limit is 1,000 frames (sys.getrecursionlimit), and
# a C++ stack adds some tens of frames per Python one; no real stack comes near 20,000.
MAX_STACK_FRAMES = 20_000
READ_BUFFER_BYTES = 1 << 20
LIVE_STATES = ("active_allocated",)  # counted by allocated_bytes (awaiting-free blocks are not)
# allocated_bytes drops at free_requested; free_completed (the block reusable) changes no count.
FREE_ACTIONS = ("free_requested", "free")  # "free": older traces, one event per free
SEGMENT_GROW = ("segment_alloc", "segment_map")  # segment_map/unmap: expandable_segments
SEGMENT_SHRINK = ("segment_free", "segment_unmap")
LARGEST_BLOCKS = 12  # blocks listed in the report
SHOWN_FRAMES = 4  # frames of a block shown in text

# The explanation's categories: the estimate's, with buffers folded into parameters, master weights
# into optimizer states, and what the frames do not tell as "other".
PARAMETERS, GRADIENTS, OPTIMIZER = Category.PARAMETERS.value, Category.GRADIENTS.value, "optimizer_states"
ACTIVATIONS, TEMPORARIES, OTHER = Category.ACTIVATIONS.value, Category.TEMPORARIES.value, "other"
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER, ACTIVATIONS, TEMPORARIES, OTHER)
ESTIMATE_CATEGORY = {
    Category.PARAMETERS: PARAMETERS, Category.BUFFERS: PARAMETERS, Category.GRADIENTS: GRADIENTS,
    Category.MASTER_WEIGHTS: OPTIMIZER, Category.OPTIMIZER_STATES: OPTIMIZER,
    Category.ACTIVATIONS: ACTIVATIONS, Category.TEMPORARIES: TEMPORARIES, Category.KV_CACHE: OTHER,
    Category.OVERHEAD: OTHER,
}  # fmt: skip
PERSISTENT = (PARAMETERS, OPTIMIZER)  # live across steps (calibration's persistent bytes)

# --- which code made a block, from its stack frames (checked in this order) ---
# torch/optim/{adam,adamw,sgd,...}.py: states are created in Optimizer._init_group (exp_avg,
# exp_avg_sq, momentum_buffer, step); everything else an optimizer file allocates is a step temporary
# (the foreach kernels' intermediate lists). bitsandbytes: bitsandbytes/optim/optimizer.py init_state.
OPTIMIZER_FILES = ("torch/optim/", "bitsandbytes/optim/", "transformers/optimization", "torchao/optim/")
OPTIMIZER_STATE_FUNCS = ("_init_group", "init_state", "_init_state", "_lazy_init")
# Backward: torch/_tensor.py Tensor.backward -> torch/autograd/__init__.py backward ->
# torch/autograd/graph.py _engine_run_backward; C++ frames torch::autograd::Engine.
BACKWARD_FUNCS = ("_engine_run_backward", "run_backward")
BACKWARD_FILES = ("torch/autograd/", "torch/_tensor.py")
BACKWARD_CPP = ("torch::autograd::Engine", "autograd::engine")
# torch/csrc/autograd/functions/accumulate_grad.h: AccumulateGrad makes param.grad
GRADIENT_FUNCS = ("AccumulateGrad", "accumulate_grad", "accumulateGrad")
CHECKPOINT_FILES = ("torch/utils/checkpoint.py",)  # recomputed forward inside backward
# Parameters: Module.to/cuda/_apply (torch/nn/modules/module.py), layer constructors, torch/nn/init.py,
# transformers' from_pretrained / load_state_dict.
PARAMETER_FUNCS = ("_apply", "from_pretrained", "_load_pretrained_model", "load_state_dict",
                   "_load_from_state_dict", "reset_parameters", "_init_weights", "init_weights")  # fmt: skip
PARAMETER_FILES = ("torch/nn/init.py", "torch/nn/parameter.py")
MODULE_FILE = "torch/nn/modules/module.py"
MODULE_MOVE_FUNCS = ("to", "cuda", "_apply")
# Forward: any module's forward, functional ops, a transformers model file
FORWARD_FUNCS = ("forward", "_call_impl", "_wrapped_call_impl")
FORWARD_FILES = ("torch/nn/functional.py", "transformers/models/", "torch/nn/modules/")


@dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} {self.name}"


@dataclass(frozen=True)
class Block:
    addr: int
    size: int
    frames: tuple[Frame, ...]
    category: str
    before_trace: bool = False  # allocated before the recorded trace began


@dataclass(frozen=True)
class Oom:
    size: int  # bytes requested
    device_free: int | None  # what CUDA still reported free
    frames: tuple[Frame, ...]
    event: int  # index in the trace
    reserved_bytes: int  # reserved when it failed
    allocated_bytes: int

    def capacity_bytes(self, context_bytes: int) -> int | None:
        """What the device held for this process when it failed: reserved + what CUDA still reported
        free + the CUDA context outside both (None: the trace did not record device_free)."""
        return None if self.device_free is None else self.reserved_bytes + self.device_free + context_bytes


@dataclass(frozen=True)
class Replay:
    device: int
    source: str  # "trace" or "segments"
    events: int
    truncated: bool
    peak_allocated_bytes: int
    peak_event: int  # index of the event that reached the peak (-1: the snapshot's blocks)
    peak_reserved_bytes: int  # the most reserved at any point (max_memory_reserved)
    reserved_at_peak_bytes: int
    live: tuple[Block, ...]  # at the peak, largest first
    oom: Oom | None
    notes: tuple[str, ...]

    def by_category(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for b in self.live:
            out[b.category] += b.size
        return out

    def measurement(
        self, source: str, device_total_bytes: int | None = None, gpu: str | None = None
    ) -> Measurement:
        """What calibration fits: the peaks, and the parameters + optimizer states live at the peak as
        the persistent part."""
        cats = self.by_category()
        return Measurement(
            source=source, peak_allocated_bytes=self.peak_allocated_bytes,
            peak_reserved_bytes=max(self.peak_reserved_bytes, self.peak_allocated_bytes),
            device_total_bytes=device_total_bytes, persistent_bytes=sum(cats[c] for c in PERSISTENT),
            gpu=gpu, notes=self.notes,
        )  # fmt: skip


# --- reading -----------------------------------------------------------------------------------------
class _Refused(pickle.UnpicklingError):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle's own opcodes build (dicts, lists, tuples, str, bytes, numbers, bool,
    None): any global - a class, a function - is refused, so loading runs no code."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"it names the Python object {module}.{name}")


def load_snapshot(path: Path) -> dict[str, Any]:
    """The snapshot at ``path`` as a dict with ``segments`` and ``device_traces``; an InputError names
    what is wrong with a file that is not one (exit 2)."""
    data = read_user_file(path, what="a memory snapshot", max_bytes=MAX_SNAPSHOT_BYTES)
    return parse_snapshot(data, str(path))


def is_snapshot_file(path: Path) -> bool:
    """A snapshot by its name (.pickle, .pkl, .gz) or its first byte (pickle protocol 2+: 0x80). A FIFO or
    a device is not looked into (the reader then refuses it by name)."""
    if path.suffix in (".pickle", ".pkl", ".gz"):
        return True
    if not is_regular_file(path):
        return False
    try:
        with path.open("rb") as fh:
            return fh.read(1) == PICKLE_PROTO
    except OSError:
        return False


def _unpickle(data: bytes, where: str) -> Any:
    """The object in ``data`` (a pickle, or its gzip inflated as it is read, within the caps)."""
    if data[:2] != GZIP_MAGIC:
        return _PlainUnpickler(io.BytesIO(data)).load()
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as z:
        cap = min(MAX_SNAPSHOT_BYTES, MAX_GZIP_RATIO * len(data) + GZIP_SLACK_BYTES)
        note = f" ({MAX_GZIP_RATIO}x its {len(data):,} bytes: no snapshot compresses that well)"
        capped = CappedStream(z, name=where, what="a memory snapshot", max_bytes=cap,
                              max_request=MAX_PICKLE_REQUEST, note=note)  # fmt: skip
        return _PlainUnpickler(io.BufferedReader(capped, READ_BUFFER_BYTES)).load()


def parse_snapshot(data: bytes, where: str = "snapshot") -> dict[str, Any]:
    """``data``: the pickle's bytes, or their gzip (``gzip dump_snapshot.pickle``)."""
    try:
        obj = _unpickle(data, where)
    except _Refused as err:
        raise InputError(f"{where}: not loaded: a memory snapshot holds only plain data, but {err}") from None
    except InputError:
        raise
    except (gzip.BadGzipFile, zlib.error) as err:
        raise InputError(f"{where}: a damaged gzip file ({err})") from None
    except MemoryError:  # an object whose length field asks for more than this process may hold
        raise InputError(f"{where}: not loaded: it asks for more memory than this process may use; "
                         "not a memory snapshot") from None  # fmt: skip
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        RecursionError,
        OSError,
    ) as err:
        raise InputError(f"{where}: not a pickle ({type(err).__name__}: {str(err)[:80]}); expected the file "
                         "torch.cuda.memory._dump_snapshot() writes") from None  # fmt: skip
    if isinstance(obj, list):  # torch.cuda.memory_snapshot(): the segments alone
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict) or not isinstance(obj.get("segments"), list):
        raise InputError(f"{where}: a pickle, but not a memory snapshot (no 'segments' list); expected the "
                         "file torch.cuda.memory._dump_snapshot() writes")  # fmt: skip
    traces = obj.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise InputError(f"{where}: 'device_traces' is not a list of event lists per device")
    for i, seg in enumerate(obj["segments"]):
        if not isinstance(seg, dict) or not isinstance(seg.get("total_size"), int):
            raise InputError(f"{where}: segment {i} has no total_size; not a memory snapshot")
    _check_records_once(obj, where)
    return obj


def _check_records_once(obj: Mapping[str, Any], where: str) -> None:
    """Each segment, block and trace event is its own object (see the module's docstring)."""
    seen: set[int] = set()

    def once(record: object, kind: str) -> None:
        if id(record) in seen:
            raise InputError(f"{where}: one {kind} record is listed more than once (pickle memo references); "
                             "torch writes each record once, so this is not a memory snapshot")  # fmt: skip
        seen.add(id(record))

    def stack(record: Mapping[str, Any], kind: str) -> None:
        frames = record.get("frames")
        if isinstance(frames, list) and len(frames) > MAX_STACK_FRAMES:
            raise InputError(f"{where}: a {kind}'s stack has {len(frames):,} frames; a real one has fewer "
                             f"than {MAX_STACK_FRAMES:,}, so this is not a memory snapshot")  # fmt: skip

    for seg in obj["segments"]:
        once(seg, "segment")
        blocks = seg.get("blocks")
        for block in blocks if isinstance(blocks, list) else ():
            if isinstance(block, (dict, list)):
                once(block, "block")
            if isinstance(block, dict):
                stack(block, "block")
    for trace in obj.get("device_traces", []):
        once(trace, "trace")
        for event in trace:
            if isinstance(event, (dict, list)):
                once(event, "trace event")
            if isinstance(event, dict):
                stack(event, "trace event")


# --- attribution -------------------------------------------------------------------------------------
def frames_of(raw: object) -> tuple[Frame, ...]:
    out = []
    for f in raw if isinstance(raw, list) else ():
        if isinstance(f, dict):
            out.append(Frame(str(f.get("filename", "")).replace("\\", "/"), _int(f.get("line")),
                             str(f.get("name", ""))))  # fmt: skip
    return tuple(out)


class _Stacks:
    """Each distinct stack (a frames list, shared by the records of one traceback) read and classified
    once, so that a stack named by many records costs its length once, not once per record."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, tuple[Frame, ...], str]] = {}  # id -> (raw kept alive, ...)

    def _get(self, raw: object) -> tuple[object, tuple[Frame, ...], str]:
        hit = self._seen.get(id(raw))
        if hit is None:
            fr = frames_of(raw)
            hit = self._seen[id(raw)] = (raw, fr, classify(fr))
        return hit

    def frames(self, raw: object) -> tuple[Frame, ...]:
        return self._get(raw)[1]

    def category(self, raw: object) -> str:
        return self._get(raw)[2]


def classify(frames: Sequence[Frame]) -> str:
    """The explanation's category of a block from the stack that allocated it (see the tables above)."""
    files = [f.filename for f in frames]
    names = [f.name for f in frames]

    def in_files(parts: Iterable[str]) -> bool:
        return any(p in f for f in files for p in parts)

    def named(funcs: Iterable[str]) -> bool:
        return any(fn in n for n in names for fn in funcs)

    if not frames:
        return OTHER
    if in_files(OPTIMIZER_FILES):
        opt = [f for f in frames if any(p in f.filename for p in OPTIMIZER_FILES)]
        return OPTIMIZER if any(f.name in OPTIMIZER_STATE_FUNCS for f in opt) else TEMPORARIES
    if in_backward(frames):
        if in_files(CHECKPOINT_FILES):
            return ACTIVATIONS
        if named(GRADIENT_FUNCS):
            return GRADIENTS
        # Python-only stacks (_record_memory_history(stacks="python")) cannot tell a .grad from a
        # gradient in flight: gradients here; _live_at makes those freed within backward temporaries.
        return GRADIENTS if python_only(frames) else TEMPORARIES
    moved = any(f.name in MODULE_MOVE_FUNCS and f.filename.endswith(MODULE_FILE) for f in frames)
    if moved or any(f.name in PARAMETER_FUNCS for f in frames) or in_files(PARAMETER_FILES):
        return PARAMETERS
    if any(f.name == "__init__" and "torch/nn/modules/" in f.filename for f in frames):
        return PARAMETERS
    if any(f.name in FORWARD_FUNCS for f in frames) or in_files(FORWARD_FILES):
        return ACTIVATIONS
    return OTHER


def in_backward(frames: Sequence[Frame]) -> bool:
    """Allocated by the autograd engine (Tensor.backward / torch.autograd.backward / its C++ engine)."""
    return any(cpp in f.name for f in frames for cpp in BACKWARD_CPP) or any(
        f.name in (*BACKWARD_FUNCS, "backward") and any(p in f.filename for p in BACKWARD_FILES)
        for f in frames
    )


def python_only(frames: Sequence[Frame]) -> bool:
    return all(f.filename.endswith(".py") for f in frames)


# --- replay ------------------------------------------------------------------------------------------
def replay(snapshot: Mapping[str, Any], device: int | None = None) -> Replay:
    """Replay ``snapshot``'s trace on ``device`` (default: the device with the longest trace, else
    the most reserved) and find its allocated peak."""
    segments: list[dict[str, Any]] = snapshot["segments"]
    traces: list[list[dict[str, Any]]] = snapshot.get("device_traces") or []
    dev = _device(segments, traces) if device is None else device
    segs = [s for s in segments if _int(s.get("device", 0)) == dev]
    trace = [e for e in (traces[dev] if dev < len(traces) else []) if isinstance(e, dict)]
    stacks = _Stacks()
    end_live = _blocks_at_snapshot(segs, stacks)
    reserved_end = sum(_int(s.get("total_size")) for s in segs)
    notes: list[str] = []

    # pass 1: what the trace allocated, and what it freed without having allocated it
    seen: dict[int, int] = {}  # addr -> size, live within the trace
    before: dict[int, Block] = {}  # allocated before the trace began, freed during it
    seg_delta = 0
    for e in trace:
        action, addr, size = e.get("action"), _int(e.get("addr")), _int(e.get("size"))
        if action == "alloc":
            seen[addr] = size
        elif action in FREE_ACTIONS:
            if addr in seen:
                del seen[addr]
            elif addr not in before:
                before[addr] = Block(addr=addr, size=size, frames=(), category=OTHER, before_trace=True)
        elif action in SEGMENT_GROW:
            seg_delta += size
        elif action in SEGMENT_SHRINK:
            seg_delta -= size
    freed_before = len(before)
    # live at the snapshot but never allocated in the trace: allocated before it began
    for addr, b in end_live.items():
        if addr not in seen and addr not in before:
            before[addr] = Block(
                addr=addr, size=b.size, frames=b.frames, category=b.category, before_trace=True
            )
    truncated = freed_before > 0

    if not any(e.get("action") == "alloc" for e in trace):
        live = sorted(end_live.values(), key=lambda b: -b.size)
        notes.append(
            "no allocation trace in the snapshot (record one with torch.cuda.memory._record_memory_history() "
            "before the run): the blocks live when the snapshot was taken stand for the peak"
        )
        total = sum(b.size for b in live)
        return Replay(
            device=dev, source="segments", events=len(trace), truncated=False, peak_allocated_bytes=total,
            peak_event=-1, peak_reserved_bytes=reserved_end, reserved_at_peak_bytes=reserved_end,
            live=tuple(live), oom=_oom(trace, reserved_end, total, stacks), notes=tuple(notes),
        )  # fmt: skip
    if truncated:
        notes.append(
            f"the trace is truncated (its ring buffer kept the last {len(trace):,} events; "
            f"{freed_before:,} blocks freed in it were allocated "
            "before it began, without their stacks): those count as live from its first event, and "
            "the peak is the highest within the recorded window (raise max_entries to see it all)"
        )

    # pass 2: running totals from the reconstructed start
    live_now: dict[int, Block] = dict(before)
    allocated = sum(b.size for b in live_now.values())
    reserved = max(0, reserved_end - seg_delta)
    peak, peak_at, peak_reserved, reserved_at_peak = allocated, -1, reserved, reserved
    ooms: list[Oom] = []
    for i, e in enumerate(trace):
        action, addr, size = e.get("action"), _int(e.get("addr")), _int(e.get("size"))
        if action == "alloc":
            live_now[addr] = Block(addr=addr, size=size, frames=(), category=OTHER)
            allocated += size
            if allocated > peak:
                peak, peak_at, reserved_at_peak = allocated, i, reserved
        elif action in FREE_ACTIONS:
            gone = live_now.pop(addr, None)
            if gone is not None:
                allocated -= gone.size
        elif action in SEGMENT_GROW:
            reserved += size
            peak_reserved = max(peak_reserved, reserved)
        elif action in SEGMENT_SHRINK:
            reserved -= size
        elif action == "oom":
            ooms.append(Oom(size=size, device_free=_opt_int(e.get("device_free")),
                            frames=stacks.frames(e.get("frames")), event=i, reserved_bytes=reserved,
                            allocated_bytes=allocated))  # fmt: skip
    peak_live = _live_at(trace, before, peak_at, stacks)
    if allocated != sum(b.size for b in end_live.values()):
        notes.append("the replayed trace ends with a different allocated total than the snapshot's blocks "
                     "(a trace and segments of different moments?); the trace is used")  # fmt: skip
    return Replay(
        device=dev, source="trace", events=len(trace), truncated=truncated, peak_allocated_bytes=peak,
        peak_event=peak_at, peak_reserved_bytes=max(peak_reserved, reserved_end),
        reserved_at_peak_bytes=reserved_at_peak,
        live=tuple(sorted(peak_live.values(), key=lambda b: -b.size)),
        oom=ooms[-1] if ooms else None, notes=tuple(notes),
    )  # fmt: skip


def _live_at(
    trace: list[dict[str, Any]], before: dict[int, Block], last: int, stacks: _Stacks
) -> dict[int, Block]:
    """The blocks live just after event ``last`` (-1: at the trace's start), with their categories."""
    live = dict(before)
    for e in trace[: last + 1]:
        action, addr = e.get("action"), _int(e.get("addr"))
        if action == "alloc":
            raw = e.get("frames")
            live[addr] = Block(addr=addr, size=_int(e.get("size")), frames=stacks.frames(raw),
                               category=stacks.category(raw))  # fmt: skip
        elif action in FREE_ACTIONS:
            live.pop(addr, None)
    # A Python-only backward stack made each "gradient": the ones freed again within backward
    # (activation gradients in flight) were temporaries; a .grad lives on to zero_grad or the step.
    guessed = {a for a, b in live.items() if b.category == GRADIENTS and python_only(b.frames)}
    for e in trace[last + 1 :]:
        if not guessed:
            break
        addr = _int(e.get("addr"))
        if e.get("action") in FREE_ACTIONS and addr in guessed:
            guessed.discard(addr)
            if in_backward(stacks.frames(e.get("frames"))):
                live[addr] = replace(live[addr], category=TEMPORARIES)
        elif e.get("action") == "alloc" and addr in guessed:
            guessed.discard(addr)  # reused without a recorded free: leave it
    return live


def _oom(trace: list[dict[str, Any]], reserved: int, allocated: int, stacks: _Stacks) -> Oom | None:
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        if e.get("action") == "oom":
            return Oom(size=_int(e.get("size")), device_free=_opt_int(e.get("device_free")),
                       frames=stacks.frames(e.get("frames")), event=i, reserved_bytes=reserved,
                       allocated_bytes=allocated)  # fmt: skip
    return None


def _blocks_at_snapshot(segs: list[dict[str, Any]], stacks: _Stacks) -> dict[int, Block]:
    out: dict[int, Block] = {}
    for seg in segs:
        addr = _int(seg.get("address"))
        for b in seg.get("blocks") or []:
            if not isinstance(b, dict):
                continue
            size = _int(b.get("size"))
            at = _int(b.get("address")) if isinstance(b.get("address"), int) else addr  # older: no address
            if b.get("state") in LIVE_STATES:
                raw = b.get("frames")
                history = b.get("history")  # torch 2.0's snapshots: the stack sits in history[0]
                if raw is None and isinstance(history, list) and history and isinstance(history[0], dict):
                    raw = history[0].get("frames")
                out[at] = Block(addr=at, size=size, frames=stacks.frames(raw), category=stacks.category(raw))
            addr = at + size
    return out


def _device(segments: list[dict[str, Any]], traces: list[list[dict[str, Any]]]) -> int:
    if any(traces):
        return max(range(len(traces)), key=lambda d: len(traces[d]))
    per: dict[int, int] = {}
    for s in segments:
        d = _int(s.get("device", 0))
        per[d] = per.get(d, 0) + _int(s.get("total_size"))
    return max(per, key=lambda d: per[d]) if per else 0


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _opt_int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# --- explanation -------------------------------------------------------------------------------------
def predicted_by_category(est: Estimate) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for cat, b in est.by_category().items():
        out[ESTIMATE_CATEGORY[cat]] += b
    return out


def comparison_rows(measured: Mapping[str, int], predicted: Mapping[str, int] | None) -> list[dict[str, Any]]:
    """Per category: measured, predicted and their difference, largest absolute difference first
    (without a prediction: largest measured first)."""
    rows = []
    for c in CATEGORIES:
        m = measured.get(c, 0)
        row: dict[str, Any] = {"category": c, "measured_bytes": m}
        if predicted is not None:
            p = predicted.get(c, 0)
            row.update(predicted_bytes=p, difference_bytes=p - m)
        rows.append(row)
    key = (
        (lambda r: -abs(r["difference_bytes"])) if predicted is not None else (lambda r: -r["measured_bytes"])
    )
    return sorted(rows, key=key)


def _top_frame(frames: Sequence[Frame]) -> str:
    """The innermost Python frame outside torch's own files, else the innermost frame."""
    for f in frames:
        if f.filename.endswith(".py") and "/torch/" not in f.filename:
            return str(f)
    return str(frames[0]) if frames else "(no stack recorded)"


def explanation_json(
    rep: Replay,
    path: str,
    est: Estimate | None = None,
    ways: Sequence[Any] = (),
    capacity_bytes: int | None = None,
) -> dict[str, Any]:
    """The JSON of ``peakmem explain``: the measured peak by category next to the estimate's, the largest
    live blocks, and for an OOM what failed and the changes that fit (``ways``: planner.Way)."""
    measured = rep.by_category()
    predicted = predicted_by_category(est) if est is not None else None
    out: dict[str, Any] = {
        "snapshot": path,
        "device": rep.device,
        "source": rep.source,
        "events": rep.events,
        "truncated": rep.truncated,
        "peak_allocated_bytes": rep.peak_allocated_bytes,
        "peak_event": rep.peak_event,
        "peak_reserved_bytes": rep.peak_reserved_bytes,
        "reserved_at_peak_bytes": rep.reserved_at_peak_bytes,
        "measured": measured,
        "predicted": predicted,
        "rows": comparison_rows(measured, predicted),
        "largest_blocks": [
            {
                "bytes": b.size,
                "category": b.category,
                "before_trace": b.before_trace,
                "frame": _top_frame(b.frames),
                "frames": [str(f) for f in b.frames[:SHOWN_FRAMES]],
            }
            for b in rep.live[:LARGEST_BLOCKS]
        ],
        "notes": list(rep.notes),
    }
    if est is not None:
        out["prediction"] = {
            "model": est.model_name,
            "peak_phase": est.peak_phase.value,
            "peak_allocated_bytes": est.peak_allocated_bytes,
            "peak_reserved_bytes": est.peak_reserved_bytes,
            "device_total_bytes": est.device_total_bytes,
            "setup": est.setup,
            "assumptions": list(est.assumptions),
        }
        out["difference_bytes"] = est.peak_allocated_bytes - rep.peak_allocated_bytes
    oom = rep.oom
    out["oom"] = None
    if oom is not None:
        out["oom"] = {
            "requested_bytes": oom.size,
            "device_free_bytes": oom.device_free,
            "allocated_bytes": oom.allocated_bytes,
            "reserved_bytes": oom.reserved_bytes,
            "frame": _top_frame(oom.frames),
            "frames": [str(f) for f in oom.frames],
            "capacity_bytes": capacity_bytes,
            "ways": [
                {"change": w.label, "device_total_bytes": w.needed_bytes, "saving_bytes": w.saving_bytes}
                for w in ways
            ],
        }
    return out


def explanation_lines(out: Mapping[str, Any]) -> list[str]:
    """Plain text of :func:`explanation_json`'s answer (the CLI prints it)."""
    lines = [
        f"{out['snapshot']} (device {out['device']}, {out['events']:,} trace events): peak allocated "
        f"{fmt_bytes(out['peak_allocated_bytes'])}, max reserved {fmt_bytes(out['peak_reserved_bytes'])}"
    ]
    pred = out.get("prediction")
    if pred is not None:
        lines.append(
            f"peakmem predicts {fmt_bytes(pred['peak_allocated_bytes'])} allocated at the "
            f"{pred['peak_phase']} peak for {pred['model']} (difference {_signed(out['difference_bytes'])})"
        )
    lines.append("")
    header = f"{'category':<18}{'measured':>12}" + (f"{'predicted':>12}{'difference':>13}" if pred else "")
    lines.append(header)
    for r in out["rows"]:
        row = f"{r['category']:<18}{fmt_bytes(r['measured_bytes']):>12}"
        if pred is not None:
            row += f"{fmt_bytes(r['predicted_bytes']):>12}{_signed(r['difference_bytes']):>13}"
        lines.append(row)
    lines += ["", "largest blocks live at the peak:"]
    lines += [
        f"  {fmt_bytes(b['bytes']):>10}  {b['category']:<17} {b['frame']}" for b in out["largest_blocks"]
    ]
    oom = out.get("oom")
    if oom is not None:
        free = (
            f", {fmt_bytes(oom['device_free_bytes'])} free on the device"
            if oom["device_free_bytes"] is not None
            else ""
        )
        lines += ["", f"out of memory: {fmt_bytes(oom['requested_bytes'])} requested at {oom['frame']}{free}"]
        lines += [f"    {f}" for f in oom["frames"][:SHOWN_FRAMES]]
        if oom["ways"]:
            cap = f" (capacity {fmt_bytes(oom['capacity_bytes'])})" if oom["capacity_bytes"] else ""
            lines.append(f"changes that would have fit{cap}:")
            lines += [f"  - {w['change']}: {fmt_bytes(w['device_total_bytes'])}" for w in oom["ways"]]
        elif pred is None:
            lines.append(
                "give the job's model and options (--model MODEL ...) for the changes that would fit"
            )
    lines += [f"note: {n}" for n in out["notes"]]
    return lines


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))
