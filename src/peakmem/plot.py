"""Pictures of an estimate: the ways to bring it down as stacked bars, and memory against batch or seq.

matplotlib is an optional extra (``pip install peakmem[plot]``) and is imported only inside the
drawing functions, with the Agg backend, so ``import peakmem.plot`` stays light. The pure parts
(:func:`bar_segments`, :func:`sweep_values`, :func:`max_fitting`) are shared with the web page,
so the picture, the page's chart and the tables show the same numbers.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from peakmem.breakdown import Category, Estimate
from peakmem.errors import InputError
from peakmem.units import GB, fmt_gb

Axis = Literal["batch", "seq"]
AXES: tuple[Axis, ...] = ("batch", "seq")

# Segment keys beyond the breakdown categories: what nvidia-smi shows above the allocated bytes.
SLACK = "allocator_slack"  # max_memory_reserved - max_memory_allocated (caching-allocator rounding)
CONTEXT = "cuda_context"  # nvidia-smi - reserved: CUDA context, cuBLAS workspaces, NCCL buffers

SEGMENT_LABELS: dict[str, str] = {
    Category.PARAMETERS.value: "weights",
    Category.BUFFERS.value: "buffers",
    Category.GRADIENTS.value: "gradients",
    Category.MASTER_WEIGHTS.value: "master weights (fp32)",
    Category.OPTIMIZER_STATES.value: "optimizer states",
    Category.ACTIVATIONS.value: "activations",
    Category.TEMPORARIES.value: "temporaries",
    Category.KV_CACHE.value: "KV cache",
    Category.CUDA_GRAPHS.value: "CUDA graphs",
    Category.OVERHEAD.value: "overhead",
    SLACK: "allocator slack",
    CONTEXT: "CUDA context",
}
# One colour per segment, stable across every picture and the web page (style.css mirrors them).
SEGMENT_COLORS: dict[str, str] = {
    Category.PARAMETERS.value: "#4e79a7",
    Category.BUFFERS.value: "#9c755f",
    Category.GRADIENTS.value: "#f28e2b",
    Category.MASTER_WEIGHTS.value: "#76b7b2",
    Category.OPTIMIZER_STATES.value: "#e15759",
    Category.ACTIVATIONS.value: "#59a14f",
    Category.TEMPORARIES.value: "#edc948",
    Category.KV_CACHE.value: "#b07aa1",
    Category.CUDA_GRAPHS.value: "#ff9da7",
    Category.OVERHEAD.value: "#bab0ac",
    SLACK: "#d4cfcb",
    CONTEXT: "#8c8c8c",
}
# Sweep limits: batch 1..2**MAX_BATCH_EXP, seq 2**MIN_SEQ_EXP..min(context, 2**MAX_SEQ_EXP).
MAX_BATCH_EXP = 7
MIN_SEQ_EXP = 7
MAX_SEQ_EXP = 17


class GpuLike(Protocol):
    """What a picture needs of a GPU: :class:`peakmem.catalog.Gpu` has these."""

    @property
    def name(self) -> str: ...

    @property
    def usable_bytes(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class Segment:
    key: str  # a Category value, SLACK or CONTEXT
    label: str
    bytes: int


def bar_segments(est: Estimate) -> list[Segment]:
    """The stack of one bar: bytes per category at the peak, then the allocator slack up to the
    reserved bytes and the CUDA context up to the device total; the stack's top is the device total."""
    segments = [
        Segment(key=c.value, label=SEGMENT_LABELS[c.value], bytes=b)
        for c, b in est.by_category().items()
        if b > 0
    ]
    top = sum(s.bytes for s in segments)
    if est.peak_reserved_bytes > top:
        segments.append(Segment(key=SLACK, label=SEGMENT_LABELS[SLACK], bytes=est.peak_reserved_bytes - top))
        top = est.peak_reserved_bytes
    if est.device_total_bytes > top:
        segments.append(
            Segment(key=CONTEXT, label=SEGMENT_LABELS[CONTEXT], bytes=est.device_total_bytes - top)
        )
    return segments


def chart_json(
    est: Estimate, ways: Sequence[tuple[str, Estimate]] = (), base_label: str = "as asked"
) -> list[dict[str, Any]]:
    """The bars of :func:`plot_ways` as JSON, for the web page."""
    bars = [(base_label, est), *ways]
    return [
        {
            "label": label,
            "device_total_bytes": e.device_total_bytes,
            "segments": [{"key": s.key, "label": s.label, "bytes": s.bytes} for s in bar_segments(e)],
        }
        for label, e in bars
    ]


# --- sweeps --------------------------------------------------------------------------------------
def with_axis(setup: Any, axis: Axis, value: int) -> Any:
    """``setup`` (a TrainingSetup) with its micro-batch or sequence length set to ``value``."""
    if axis == "batch":
        return replace(setup, micro_batch=value)
    if axis == "seq":
        return replace(setup, seq_len=value)
    raise InputError(f"axis={axis!r}: choose batch or seq")


def sweep_values(axis: Axis, max_positions: int, current: int) -> list[int]:
    """Powers of two along ``axis`` (batch 1..128; seq 128..the model's context), plus ``current``."""
    if axis == "batch":
        values = {2**k for k in range(MAX_BATCH_EXP + 1)}
    elif axis == "seq":
        top = max(min(max_positions, 2**MAX_SEQ_EXP), 2**MIN_SEQ_EXP)
        values = {2**k for k in range(MIN_SEQ_EXP, MAX_SEQ_EXP + 1) if 2**k <= top} | {top}
    else:
        raise InputError(f"axis={axis!r}: choose batch or seq")
    return sorted(values | {current})


def sweep_range(values: Sequence[int], marks: Sequence[int], min_points: int = 4) -> list[int]:
    """``values`` up to the first one beyond every mark (where the GPUs run out, the asked value), so
    the picture shows the crossings, not a curve running off to hundreds of GB."""
    ordered = sorted(values)
    beyond = [v for v in ordered if v > max(marks, default=0)]
    end = beyond[0] if beyond else ordered[-1]
    kept = [v for v in ordered if v <= end]
    return kept if len(kept) >= min_points else ordered[:min_points]


def _densify(values: Sequence[int], per_doubling: int = 8) -> list[int]:
    """``values`` plus integers spaced evenly on a log scale between neighbours."""
    out = set(values)
    for a, b in itertools.pairwise(values):
        steps = max(1, round(per_doubling * math.log2(b / a)))
        out.update(round(a * (b / a) ** (k / steps)) for k in range(1, steps))
    return sorted(out)


def max_fitting(total: Callable[[int], int], capacity_bytes: int, upper: int) -> int:
    """The largest ``v`` in ``1..upper`` with ``total(v) <= capacity_bytes`` (0 if none).

    Assumes ``total`` does not decrease with ``v`` (memory grows with batch and sequence length);
    the planner's bisection (:func:`peakmem.planner.search._largest_true`), about log2(upper) evaluations.
    """
    from peakmem.planner.search import _largest_true

    return _largest_true(1, upper, lambda v: total(v) <= capacity_bytes) or 0


def _estimator() -> Callable[[Any, Any], Estimate]:
    """The planner's memoised estimator (one per picture): the curve, the limits and ``fit`` ask the
    same search."""
    from peakmem.planner.search import _Estimator

    memo: dict[int, _Estimator] = {}

    def estimate(spec: Any, setup: Any) -> Estimate:
        est = memo.get(0)
        if est is None or est.spec is not spec:
            est = memo[0] = _Estimator(spec, None)
        res = est(setup)
        if res is None:
            from peakmem.estimate import estimate_training

            return estimate_training(spec, setup)  # raises the estimator's own error
        return res.estimate

    return estimate


def sweep(
    spec: Any,
    setup: Any,
    axis: Axis = "batch",
    values: Sequence[int] | None = None,
    estimator: Callable[[Any, Any], Estimate] | None = None,
) -> list[tuple[int, Estimate]]:
    """Estimates of ``setup`` with batch (or seq) set to each of ``values``."""
    estimate = estimator or _estimator()
    current = setup.micro_batch if axis == "batch" else setup.seq_len
    if values is None:
        values = sweep_values(axis, spec.max_position_embeddings, current)
    return [(v, estimate(spec, with_axis(setup, axis, v))) for v in values]


def limits(
    spec: Any,
    setup: Any,
    gpus: Sequence[GpuLike],
    axis: Axis = "batch",
    upper: int | None = None,
    estimator: Callable[[Any, Any], Estimate] | None = None,
) -> dict[str, int]:
    """For each GPU, the largest batch (or seq) whose need fits (``Estimate.needed_bytes``; 0: not even 1),
    found by the planner's search (the same bisection and memoised estimator as ``peakmem fit``'s limits)."""
    estimate = estimator or _estimator()
    if upper is None:
        upper = 2**MAX_BATCH_EXP if axis == "batch" else max(spec.max_position_embeddings, 1)
    cache: dict[int, int] = {}

    def total(v: int) -> int:
        if v not in cache:
            cache[v] = estimate(spec, with_axis(setup, axis, v)).needed_bytes
        return cache[v]

    return {g.name: max_fitting(total, g.usable_bytes, upper) for g in gpus}


# --- drawing -------------------------------------------------------------------------------------
def default_gpus() -> list[Any]:
    """Capacities people compare against when no GPU is given: 24, 40, 48 and 80 GB cards."""
    from peakmem.catalog import find_gpu

    names = ("rtx-4090", "a100-40gb", "l40s", "h100-sxm")
    found: list[Any] = []
    for name in names:
        g = find_gpu(name)
        if g is not None and all(g.usable_bytes != f.usable_bytes for f in found):
            found.append(g)
    return found


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise InputError("plots need matplotlib: pip install 'peakmem[plot]'") from error
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, out: Path, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> None:
    """Write the figure; SVG keeps its text as text (searchable, and testable)."""
    fig.tight_layout(rect=rect)
    with plt.rc_context({"svg.fonttype": "none"}):
        fig.savefig(out)
    plt.close(fig)


def _check_path(path: str | Path) -> Path:
    out = Path(path)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise InputError(f"plot={str(path)!r}: the file name must end in .png, .svg or .pdf")
    return out


def _short_name(g: Any) -> str:
    """``NVIDIA GeForce RTX 4090`` -> ``RTX 4090``."""
    name: str = getattr(g, "display_name", g.name)
    return name.removeprefix("NVIDIA ").removeprefix("GeForce ")


def _gpu_label(g: Any) -> str:
    return f"{_short_name(g)} ({fmt_gb(g.usable_bytes, 1)})"


def plot_ways(
    est: Estimate,
    ways: Sequence[tuple[str, Estimate]],
    gpus: Sequence[GpuLike],
    path: str | Path,
    *,
    title: str | None = None,
) -> Path:
    """Horizontal stacked bars: the setup as asked, then each way to bring it down, split by
    category; each GPU's memory as a vertical line; every bar labelled with its device total in GB."""
    out = _check_path(path)
    plt = _pyplot()
    bars = [("as asked", est), *ways]
    n = len(bars)
    fig, ax = plt.subplots(figsize=(11, 2.4 + 0.55 * n), dpi=110)
    seen: set[str] = set()
    for row, (_label, e) in enumerate(bars):
        y = n - 1 - row
        left = 0.0
        for s in bar_segments(e):
            width = s.bytes / GB
            ax.barh(
                y, width, left=left, height=0.62, color=SEGMENT_COLORS[s.key], edgecolor="white",
                linewidth=0.6,
            )  # fmt: skip
            seen.add(s.key)
            left += width
        ax.text(
            e.device_total_bytes / GB, y, f" {fmt_gb(e.device_total_bytes)}", va="center", ha="left",
            fontsize=9, fontweight="bold" if row == 0 else "normal", zorder=4,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.9},
        )  # fmt: skip
    ax.set_yticks(range(n))
    ax.set_yticklabels([textwrap.fill(label, 30) for label, _ in reversed(bars)], fontsize=9)
    largest = max(e.device_total_bytes for _, e in bars)
    for i, g in enumerate(sorted(gpus, key=lambda g: g.usable_bytes)):
        x = g.usable_bytes / GB
        ax.axvline(x, color="#333333", linestyle=(0, (4, 3)), linewidth=1.0, zorder=3)
        ax.text(
            x, n - 0.45 + 0.28 * (i % 2), _gpu_label(g), rotation=0, fontsize=8, ha="center", va="bottom",
            color="#333333", bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
        )  # fmt: skip
        largest = max(largest, g.usable_bytes)
    ax.set_xlim(0, largest / GB * 1.18)
    ax.set_ylim(-0.6, n + 0.25)
    ax.set_xlabel("GPU memory (GB, as nvidia-smi shows it)")
    ax.grid(axis="x", color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"{est.model_name}: memory by technique", loc="left", fontsize=11)
    from matplotlib.patches import Patch

    handles = [Patch(color=SEGMENT_COLORS[k], label=SEGMENT_LABELS[k]) for k in SEGMENT_LABELS if k in seen]
    fig.legend(handles=handles, loc="lower center", fontsize=8, frameon=False, ncol=min(len(handles), 9))
    _save(plt, fig, out, rect=(0, 0.07, 1, 1))
    return out


def plot_sweep(
    spec: Any,
    setup: Any,
    gpus: Sequence[GpuLike],
    path: str | Path,
    axis: Axis = "batch",
    *,
    estimator: Callable[[Any, Any], Estimate] | None = None,
    title: str | None = None,
) -> Path:
    """Device total (and allocated) against batch or sequence length, log2 x axis; each GPU's
    memory as a horizontal line, and the largest batch (seq) that fits it marked on the curve."""
    if axis not in AXES:
        raise InputError(f"axis={axis!r}: choose batch or seq")
    out = _check_path(path)
    estimate = estimator or _estimator()
    current = setup.micro_batch if axis == "batch" else setup.seq_len
    name = "batch" if axis == "batch" else "seq"
    values = sweep_values(axis, spec.max_position_embeddings, current)
    fit = limits(spec, setup, gpus, axis, upper=values[-1], estimator=estimate)
    values = sweep_range(values, [*fit.values(), current])
    # the curve through every tick, every GPU's limit and 8 points per doubling in between
    dense = sorted({*_densify(values), *(b for b in fit.values() if values[0] <= b <= values[-1])})
    points = sweep(spec, setup, axis, dense, estimator=estimate)
    ticks = set(values)
    plt = _pyplot()
    xs = values
    fig, ax = plt.subplots(figsize=(11, 6.5), dpi=110)
    ax.plot([v for v, _ in points], [e.device_total_bytes / GB for _, e in points], color="#4e79a7",
            marker="o", markevery=[i for i, (v, _) in enumerate(points) if v in ticks],
            label="device total (nvidia-smi)")  # fmt: skip
    ax.plot([v for v, _ in points], [e.peak_allocated_bytes / GB for _, e in points], linestyle="--",
            color="#59a14f", label="peak allocated")  # fmt: skip
    for v, e in points:
        if v == current:
            ax.plot([v], [e.device_total_bytes / GB], marker="o", markersize=13, markerfacecolor="none",
                    markeredgecolor="#000000", markeredgewidth=1.5, linestyle="none",
                    label=f"as asked ({name} {v:,}): {fmt_gb(e.device_total_bytes)}")  # fmt: skip
    for g in sorted(gpus, key=lambda g: g.usable_bytes):
        cap = g.usable_bytes / GB
        best = fit[g.name]
        if best == 0:
            note = f"{_gpu_label(g)}: does not fit at {name} 1"
        elif best >= values[-1] and best == xs[-1]:
            limit = (
                "the model's context"
                if axis == "seq" and best == spec.max_position_embeddings
                else "the range"
            )
            note = f"{_gpu_label(g)}: fits up to {name} {best:,} (all of {limit})"
        else:
            note = f"{_gpu_label(g)}: fits up to {name} {best:,}"
            at = estimate(spec, with_axis(setup, axis, best)).device_total_bytes / GB
            ax.plot([best], [at], marker="X", markersize=10, color="#e15759", zorder=5, linestyle="none")
            ax.annotate(f"{name} {best:,}", (best, at), textcoords="offset points", xytext=(8, -12),
                        fontsize=8, color="#e15759")  # fmt: skip
        ax.axhline(cap, color="#888888", linestyle=(0, (4, 3)), linewidth=1.0, label=note)
        ax.text(1.01, cap, _short_name(g), transform=ax.get_yaxis_transform(), va="center", ha="left",
                fontsize=8, color="#333333", clip_on=False)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{v:,}" for v in xs], fontsize=8, rotation=45 if axis == "seq" else 0)
    ax.set_xlabel("micro-batch size" if axis == "batch" else "sequence length (tokens)")
    ax.set_ylabel("GPU memory (GB)")
    top = max([e.device_total_bytes for _, e in points] + [g.usable_bytes for g in gpus])
    ax.set_ylim(0, top / GB * 1.08)
    ax.grid(color="#e5e5e5", linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    other = f"seq {setup.seq_len:,}" if axis == "batch" else f"batch {setup.micro_batch}"
    ax.set_title(title or f"{spec.name}: memory against {name} ({other})", loc="left", fontsize=11)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.13), fontsize=8, frameon=False, ncol=2)
    _save(plt, fig, out)
    return out


KINDS = ("ways", "batch", "seq")


def plot_training(
    spec: Any,
    setup: Any,
    path: str | Path,
    *,
    gpus: Sequence[GpuLike] = (),
    kind: str = "ways",
    est: Estimate | None = None,
    ways: Sequence[tuple[str, Estimate]] | None = None,
) -> Path:
    """What ``peakmem train --plot FILE`` and ``peakmem plot`` draw: the ways down (``kind="ways"``),
    or memory against batch or seq; with the common 24/40/48/80 GB cards when no GPU is given."""
    if kind not in KINDS:
        raise InputError(f"kind={kind!r}: choose {', '.join(KINDS)}")
    shown = list(gpus) or default_gpus()
    if kind == "ways":
        if est is None or ways is None:
            from peakmem.planner import train_answer

            capacity = min((g.usable_bytes for g in gpus), default=None)
            answer = train_answer(spec, setup, capacity_bytes=capacity)
            est = answer.estimate if est is None else est
            ways = answer.ways.pairs() if ways is None else ways
        return plot_ways(est, ways, shown, path)
    return plot_sweep(spec, setup, shown, path, axis="batch" if kind == "batch" else "seq")
