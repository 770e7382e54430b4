"""Estimate / ModelSpec -> terminal tables (rich) and Markdown; the JSON and headlines are
:mod:`peakmem.answers`'. Units are chosen here.

The terminal shows decimal GB first (as the seed and GPU vendors quote memory) and binary GiB in
parentheses.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from peakmem.answers import (
    CATEGORY_LABELS,
    answered_by_line,
    attention_kind,
    default_answered_by,
    fmt_per_param,
    language_layer,
    language_layers,
    language_params,
    states_per_param,
)
from peakmem.breakdown import Estimate, Verdict
from peakmem.model import ModelSpec, Tower
from peakmem.units import fmt_both, fmt_bytes, fmt_count, fmt_gb

if TYPE_CHECKING:
    from peakmem.resolve import AnsweredBy

PIPE_WIDTH = 110  # columns when stdout is not a terminal


# --- terminal ------------------------------------------------------------------------------------
def console() -> Any:
    import os
    import sys

    from rich.console import Console

    # Piped output (scripts, CI logs) gets a fixed, wide-enough width instead of rich's 80, unless an
    # exported COLUMNS names one (rich reads it; benchmarks/readme_answers.py sets it so nothing wraps).
    fixed = not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit()
    return Console(highlight=False, width=PIPE_WIDTH if fixed else None)


def print_info(spec: ModelSpec, answered: AnsweredBy | None = None) -> None:
    from rich.table import Table

    out = console()
    first = language_layer(spec)
    att = first.attention
    moe = ""
    if spec.is_moe:
        mlp = next(g.layer.mlp for g in spec.groups if g.layer.mlp.is_moe)
        moe = f", MoE {mlp.experts_per_token}/{mlp.num_experts} experts"
    shape = (
        f"{language_layers(spec)} layers, hidden {spec.hidden_size}, {att.num_heads} heads, "
        f"{attention_kind(att)}{moe}"
    )
    if spec.towers:
        lm = language_params(spec)
        shape = f"language model: {shape}; {lm:,} parameters ({fmt_count(lm)})"
    out.print(
        f"[bold]{spec.name}[/bold] ({spec.architecture}): {spec.params:,} parameters "
        f"({fmt_count(spec.params)}); {shape}"
    )
    for tower in spec.towers:
        out.print(tower_line(spec, tower), markup=False)
    if spec.is_moe:
        out.print(f"active per token: {spec.active_params:,} ({fmt_count(spec.active_params)})")
    title = "parameters by component" + (" (the towers' included)" if spec.towers else "")
    table = Table(title=title, title_justify="left")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("share", justify="right")
    for component, n in spec.params_by_component().items():
        table.add_row(component, f"{n:,}", f"{100 * n / spec.params:.1f}%")
    table.add_row("[bold]total[/bold]", f"[bold]{spec.params:,}[/bold]", "100.0%")
    out.print(table)
    facts = [
        f"vocab {spec.vocab_size:,}",
        f"context {spec.max_position_embeddings:,} ({spec.position} positions)",
        f"{spec.norm}",
        "tied head" if spec.tie_word_embeddings else "untied head",
        f"16-bit weights {fmt_both(2 * spec.params)}",
    ]
    out.print("; ".join(facts))
    answered = answered or default_answered_by(spec)
    out.print(answered_by_line(answered, spec), markup=False)
    for note in spec.notes:
        out.print(f"note: {note}")
    if answered.note:
        out.print(f"note: {answered.note}", markup=False)


def escape(text: str) -> str:
    """``text`` printed as it is by rich (no ``[...]`` read as markup)."""
    from rich.markup import escape as rich_escape

    return str(rich_escape(text))


_TOWER_LABELS = (("hidden_size", "hidden"), ("num_heads", "heads"), ("intermediate_size", "intermediate"),
                 ("patch_size", "patch"), ("temporal_patch_size", "temporal patch"),
                 ("spatial_merge_size", "spatial merge"), ("image_size", "image"),
                 ("out_hidden_size", "out"))  # fmt: skip


def tower_line(spec: ModelSpec, tower: Tower) -> str:
    """'vision tower (model.visual): 32 layers, hidden 1280, 16 heads, ...; 676,550,144 parameters': the
    sizes its sub-config names, then its parameters (its tensors' sum)."""
    sizes = [f"{tower.num_layers} layers"] if tower.num_layers else []
    for key, label in _TOWER_LABELS:
        value = getattr(tower, key)
        if value:
            sizes.append(f"{value} {label}" if key == "num_heads" else f"{label} {value}")
    n = spec.tower_params(tower)
    return f"{tower.kind} tower ({tower.prefix}): {', '.join(sizes)}; {n:,} parameters ({fmt_count(n)})"


def print_estimate(
    est: Estimate,
    headline: str,
    verdicts: Sequence[Verdict] = (),
    ways: Sequence[tuple[str, Estimate]] = (),
    ways_note: str = "",
) -> None:
    from rich.table import Table

    out = console()
    out.print(headline)
    for warning in est.warnings:
        out.print(f"[bold yellow]warning:[/bold yellow] {escape(warning)}")
    if est.per_param:
        table = Table(title="bytes per parameter (model states)", title_justify="left")
        table.add_column("tensor")
        table.add_column("dtype")
        table.add_column("bytes/param", justify="right")
        table.add_column("params", justify="right", no_wrap=True)
        table.add_column("total", justify="right", no_wrap=True)
        for r in est.per_param:
            table.add_row(
                r.tensor, r.dtype, fmt_per_param(r.bytes_per_param), f"{r.params:,}", fmt_both(r.bytes)
            )
        table.add_row(
            "[bold]model states[/bold]", "", f"[bold]{fmt_per_param(states_per_param(est))}[/bold]", "",
            f"[bold]{fmt_both(est.model_state_bytes)}[/bold]",
        )  # fmt: skip
        out.print(table)
        weights16 = 2 * est.params
        out.print(
            f"model states = {est.model_state_bytes / weights16:.1f}x the 16-bit weights "
            f"({fmt_gb(weights16)})"
        )
    table = Table(title=f"at the peak ({est.peak_phase.value})", title_justify="left")
    table.add_column("category")
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("share", justify="right")
    cats = est.by_category()
    for c, b in cats.items():
        table.add_row(CATEGORY_LABELS[c], fmt_both(b), f"{100 * b / max(est.peak_allocated_bytes, 1):.1f}%")
    table.add_row("[bold]peak allocated[/bold]", f"[bold]{fmt_both(est.peak_allocated_bytes)}[/bold]", "")
    table.add_row("peak reserved (caching allocator)", fmt_both(est.peak_reserved_bytes), "")
    table.add_row("[bold]device total (nvidia-smi)[/bold]",
                  f"[bold]{fmt_both(est.device_total_bytes)}[/bold]", "")  # fmt: skip
    if est.band is not None:
        span = est.band.device_total
        table.add_row("device total range (low-high)", f"{fmt_gb(span.low)} - {fmt_gb(span.high)}", "")
    if est.releasable_bytes:  # batches of varying lengths: cache the allocator frees before an OOM
        table.add_row("of it, cache freed before an OOM", fmt_both(est.releasable_bytes), "")
        table.add_row("[bold]needed on the device[/bold]", f"[bold]{fmt_both(est.needed_bytes)}[/bold]", "")
    out.print(table)
    if est.band is not None and est.band.terms:
        terms = "; ".join(f"{t.name} {fmt_bytes(t.low_bytes)}..+{fmt_bytes(t.high_bytes)} ({t.level})"
                          for t in est.band.terms)  # fmt: skip
        out.print(f"[dim]range from: {terms}[/dim]")
    if est.phases:
        table = Table(title="by phase (allocated at each phase's peak)", title_justify="left")
        table.add_column("phase")
        table.add_column("bytes", justify="right")
        for p in est.phases:
            mark = " ← peak" if p.phase == est.peak_phase else ""
            table.add_row(p.phase.value + mark, fmt_both(p.bytes))
        out.print(table)
    if verdicts:
        table = Table(title="verdict", title_justify="left")
        table.add_column("GPU")
        table.add_column("memory", justify="right")
        table.add_column("fits")
        table.add_column("headroom", justify="right")
        for v in verdicts:
            table.add_row(
                v.gpu, fmt_both(v.capacity_bytes), _STATE_MARKUP.get(v.state, v.state),
                fmt_bytes(v.headroom_bytes),
            )  # fmt: skip
        out.print(table)
    if ways:
        table = Table(title="ways to bring it down", title_justify="left")
        table.add_column("change")
        table.add_column("needs", justify="right")
        table.add_column("saving", justify="right")
        for label, w in ways:
            table.add_row(label, fmt_both(w.needed_bytes), fmt_gb(est.needed_bytes - w.needed_bytes))
        out.print(table)
    if ways_note:
        out.print(f"not listed: {ways_note}")
    if est.assumptions:
        out.print("[dim]assumptions:[/dim]")
        for a in est.assumptions:
            out.print(f"[dim]- {a}[/dim]")


_STATE_MARKUP = {"fits": "[green]fits[/green]", "tight": "[yellow]tight[/yellow]",
                 "does not fit": "[red]does not fit[/red]"}  # fmt: skip


def markdown_estimate(
    est: Estimate,
    headline: str,
    verdicts: Sequence[Verdict] = (),
    ways: Sequence[tuple[str, Estimate]] = (),
    ways_note: str = "",
) -> str:
    lines = [headline, ""]
    lines += [f"**Warning:** {w}" for w in est.warnings] + ([""] if est.warnings else [])
    if est.per_param:
        lines += ["| Tensor | Precision | Bytes/param | Total |", "|---|---|---:|---:|"]
        for r in est.per_param:
            lines.append(
                f"| {r.tensor} | {r.dtype} | {fmt_per_param(r.bytes_per_param)} | {fmt_both(r.bytes)} |"
            )
        total = fmt_per_param(states_per_param(est))
        lines.append(f"| **Model states** | | **{total}** | **{fmt_both(est.model_state_bytes)}** |")
        lines.append("")
    lines += [f"At the peak ({est.peak_phase.value}):", "", "| Category | Bytes |", "|---|---:|"]
    for c, b in est.by_category().items():
        lines.append(f"| {CATEGORY_LABELS[c]} | {fmt_both(b)} |")
    lines.append(f"| **Peak allocated** | **{fmt_both(est.peak_allocated_bytes)}** |")
    lines.append(f"| Peak reserved | {fmt_both(est.peak_reserved_bytes)} |")
    lines.append(f"| **Device total (nvidia-smi)** | **{fmt_both(est.device_total_bytes)}** |")
    if est.band is not None:
        span = est.band.device_total
        lines.append(f"| Device total range (low-high) | {fmt_gb(span.low)} - {fmt_gb(span.high)} |")
    if est.releasable_bytes:
        lines.append(f"| Of it, cache freed before an OOM | {fmt_both(est.releasable_bytes)} |")
        lines.append(f"| **Needed on the device** | **{fmt_both(est.needed_bytes)}** |")
    if verdicts:
        lines += ["", "| GPU | Memory | Fits | Headroom |", "|---|---:|---|---:|"]
        for v in verdicts:
            lines.append(
                f"| {v.gpu} | {fmt_both(v.capacity_bytes)} | {v.state} | {fmt_bytes(v.headroom_bytes)} |"
            )
    if ways:
        lines += ["", "Ways to bring it down:", "", "| Change | Needs | Saving |", "|---|---:|---:|"]
        for label, w in ways:
            lines.append(
                f"| {label} | {fmt_both(w.needed_bytes)} | {fmt_gb(est.needed_bytes - w.needed_bytes)} |"
            )
    if ways_note:
        lines += ["", f"Not listed: {ways_note}."]
    if est.assumptions:
        lines += ["", "Assumptions:", ""] + [f"- {a}" for a in est.assumptions]
    return "\n".join(lines) + "\n"


# --- progress of a long answer (peakmem.progress) ---------------------------------------------------
class StageDisplay:
    """peakmem.progress's reporter on stderr: a live progress display on a terminal, one line per stage
    otherwise (a log, a pipe); stdout keeps the answer alone."""

    def __init__(self) -> None:
        self.live: Any = None
        self.task: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("peakmem: {task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn())  # fmt: skip
            # transient and never redirecting stdout: the answer prints after the display, stdout alone
            self.live = Progress(*columns, console=Console(stderr=True), transient=True,
                                 redirect_stdout=False, redirect_stderr=False)  # fmt: skip

    def stage(self, text: str, total: int) -> None:
        if self.live is None:
            print(f"peakmem: {text}" + (f" ({total} steps)" if total else ""), file=sys.stderr, flush=True)
            return
        if self.task is not None:
            self.live.remove_task(self.task)
        self.live.start()
        self.task = self.live.add_task(text, total=total or None)

    def advance(self, done: int) -> None:
        if self.live is None or self.task is None:
            return
        self.live.update(self.task, completed=done)
        if done >= (self.live.tasks[0].total or 0):  # a stage's steps done: off the screen until the next
            self.close()

    def close(self) -> None:
        if self.live is not None and self.task is not None:
            self.live.remove_task(self.task)
            self.task = None
            self.live.stop()
