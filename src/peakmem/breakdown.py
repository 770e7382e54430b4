"""The result types every estimator returns: analytic, simulated or measured.

Categories match PyTorch's memory tracker (parameters, buffers, gradients, optimizer states,
activations, temporaries) plus the KV cache and device overhead; fp32 master weights get their
own row because users ask about them by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from peakmem.errors import require


class Category(str, Enum):
    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    GRADIENTS = "gradients"
    MASTER_WEIGHTS = "master_weights"
    OPTIMIZER_STATES = "optimizer_states"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    KV_CACHE = "kv_cache"
    CUDA_GRAPHS = "cuda_graphs"  # vLLM / SGLang captured graphs: their shared pool and per-graph memory
    OVERHEAD = "overhead"  # allocator slack, CUDA context, workspaces: above allocated bytes


class Phase(str, Enum):
    LOAD = "load"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    PREFILL = "prefill"
    DECODE = "decode"
    ROLLOUT = "rollout"  # a post-training job's generation (peakmem.jobs)
    SCORING = "scoring"  # its no-grad log-prob passes (reference, old policy)
    CRITIC_UPDATE = "critic update"  # PPO's value model: its forward, backward and step (peakmem.ppo)


@dataclass(slots=True)
class MemoryItem:
    """Bytes of one named thing alive at the peak, with where the formula comes from.

    A result, not an input: not frozen, because a planner builds tens of thousands of them a second
    and a frozen dataclass's ``__init__`` costs twice as much (``object.__setattr__`` per field).
    Treat it as read-only; derive changed items with ``dataclasses.replace``. Build it with keywords;
    the estimator's hottest loops pass the first four fields by position (half the cost of keywords).

    ``path`` is display text and may be reworded; ``key`` is the stable name that code and tests match
    on (``"attn.softmax"``, ``"optimizer.foreach_sqrt"``): never match on ``path``.
    """

    path: str  # e.g. "layers.*.mlp.act_fn output", "adam.exp_avg"
    category: Category
    bytes: int
    source: str = ""
    key: str = ""  # stable identifier (see above); "" for items nothing needs to find
    # how many tensors of equal size the bytes are (one item per layer: a gated MLP's gate, act, up and
    # product are 4): the allocator replay (formulas/step_sequence.py) needs request sizes, not sums
    tensors: int = 1
    # the tensors' sizes in the order they are made, where they are not equal (an RMSNorm's fp32 input,
    # its fp32 rstd and its 16-bit normed y); they add up to ``bytes``. Equal parts of a sum leave holes
    # that real sizes do not: Qwen3-0.6B's norm, q/k-norm and q/k/v items in equal parts (the q/k norms
    # as four 9.05 MiB parts, each leaving 2.95 MiB of a 12 MiB block) left 230 MiB of such holes, and
    # its second step's logits a new 594 MiB segment (formulas/step_sequence.py)
    sizes: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PerParamRow:
    """One row of the bytes-per-parameter table: the seed's table, built from named parts."""

    tensor: str  # "weights", "gradients", "master weights", "Adam m", ...
    dtype: str
    bytes_per_param: float
    bytes: int  # over the parameters this row applies to
    params: int  # how many parameters the row applies to (trainable only for grads/states)
    category: Category
    source: str = ""
    # CUDA unified memory (bitsandbytes' paged optimizer states, ``cudaMallocManaged``): on the device until
    # the driver pages it out, but outside torch's caching allocator (not in max_memory_allocated/reserved)
    unified_memory: bool = False


@dataclass(kw_only=True, slots=True)
class PhasePeak:
    phase: Phase
    bytes: int  # allocated bytes at this phase's own peak
    items: tuple[MemoryItem, ...] = ()


# --- the band: low / likely / high per quantity from named unknowns (its terms and formulas:
# formulas/band.py) ---
Level = Literal["allocated", "reserved", "device_total"]
LEVELS: tuple[Level, ...] = ("allocated", "reserved", "device_total")


# Results, not inputs: not frozen (a planner builds one band per estimate, and a frozen dataclass's
# __init__ costs twice as much; see MemoryItem). Treat them as read-only.
@dataclass(kw_only=True, slots=True)
class Range:
    """low <= likely <= high, in bytes."""

    low: int
    likely: int
    high: int

    def __post_init__(self) -> None:
        if not self.low <= self.likely <= self.high:
            require(False, "range", (self.low, self.likely, self.high), "must satisfy low <= likely <= high")

    @property
    def width(self) -> int:
        return self.high - self.low

    def json(self) -> dict[str, int]:
        return {"low_bytes": self.low, "likely_bytes": self.likely, "high_bytes": self.high}


@dataclass(kw_only=True, slots=True)
class BandTerm:
    """One named unknown: how far it may move the ``level`` below (low) and above (high) the likely value."""

    name: str
    level: Level
    low_bytes: int  # <= 0
    high_bytes: int  # >= 0
    source: str

    def __post_init__(self) -> None:
        if self.level not in LEVELS or self.low_bytes > 0 or self.high_bytes < 0:
            require(self.level in LEVELS, "level", self.level, f"one of {', '.join(LEVELS)}")
            require(self.low_bytes <= 0, "low_bytes", self.low_bytes, "must be <= 0 (a delta below likely)")
            require(self.high_bytes >= 0, "high_bytes", self.high_bytes, "must be >= 0 (a delta above)")

    def json(self) -> dict[str, object]:
        return {"name": self.name, "applies_to": self.level, "low_bytes": self.low_bytes,
                "high_bytes": self.high_bytes, "source": self.source}  # fmt: skip


@dataclass(kw_only=True, slots=True)
class Band:
    allocated: Range
    reserved: Range
    device_total: Range
    terms: tuple[BandTerm, ...]

    def json(self) -> dict[str, object]:
        return {
            "allocated": self.allocated.json(),
            "reserved": self.reserved.json(),
            "device_total": self.device_total.json(),
            "terms": [t.json() for t in self.terms],
        }


@dataclass(kw_only=True, slots=True)
class Estimate:
    """What peakmem answers. ``items`` are the allocations alive at the overall peak.

    Results are not frozen (see :class:`MemoryItem`); treat them as read-only and derive changed
    ones with ``dataclasses.replace``."""

    method: str  # "analytic" | "simulated" | "measured"
    job: str  # "train" | "infer"
    model_name: str
    params: int
    trainable_params: int
    per_param: tuple[PerParamRow, ...]
    items: tuple[MemoryItem, ...]
    phases: tuple[PhasePeak, ...]
    peak_phase: Phase
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_total_bytes: int
    assumptions: tuple[str, ...] = ()
    setup: dict[str, object] = field(default_factory=dict)  # echo of the inputs, JSON-ready
    extra: dict[str, object] = field(default_factory=dict)  # per-rank, CPU RAM, limits, ...
    band: Band | None = None  # low / likely / high per quantity from named unknowns (formulas/band.py)
    # what the answer says first, after its headline (bitsandbytes leaving fused experts 16-bit)
    warnings: tuple[str, ...] = ()

    def by_category(self) -> dict[Category, int]:
        out: dict[Category, int] = {}
        for item in self.items:
            out[item.category] = out.get(item.category, 0) + item.bytes
        return {c: out[c] for c in Category if c in out}

    @property
    def model_state_bytes(self) -> int:
        return sum(r.bytes for r in self.per_param)

    @property
    def releasable_bytes(self) -> int:
        """Cached segments the caching allocator frees before it raises an out-of-memory error: what batches
        padded to varying lengths reserve above the fixed-length step (formulas/padded_lengths.py
        ``RELEASE``); 0 for other jobs."""
        value = self.extra.get("releasable_cache_bytes", 0)
        return value if isinstance(value, int) else 0

    @property
    def needed_bytes(self) -> int:
        """What a device must hold for the job to run: the device total less :attr:`releasable_bytes`
        (the device total is what a card with room shows)."""
        return self.device_total_bytes - self.releasable_bytes

    @property
    def needed_high_bytes(self) -> int | None:
        """The high end of the device-total band less :attr:`releasable_bytes` (None without a band)."""
        return None if self.band is None else self.band.device_total.high - self.releasable_bytes


FITS, TIGHT, DOES_NOT_FIT = "fits", "tight", "does not fit"


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a job fits on one GPU (or a plain memory size).

    Three states: "fits" (the high end of the device-total band fits), "tight" (the likely value fits,
    the high end does not), "does not fit" (the likely value does not). ``fits`` (the likely value
    fits) stays for compatibility; without a band (``high_bytes`` None) the high end is the likely one."""

    gpu: str
    capacity_bytes: int
    needed_bytes: int
    high_bytes: int | None = None  # the high end of the device-total band

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.capacity_bytes

    @property
    def state(self) -> str:
        if not self.fits:
            return DOES_NOT_FIT
        high = self.needed_bytes if self.high_bytes is None else self.high_bytes
        return FITS if high <= self.capacity_bytes else TIGHT

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.needed_bytes
