"""FitReport / PlanReport -> terminal tables (rich, imported lazily). JSON is in :mod:`peakmem.planner`."""

from __future__ import annotations

from typing import Any

from peakmem.answers import band_text
from peakmem.breakdown import Verdict
from peakmem.planner import Candidate, FitReport, GpuFit, InferFitReport, Limits, PlanReport
from peakmem.planner.post_training import PostFitReport
from peakmem.render import console as _console
from peakmem.units import fmt_gb


def fmt_seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1000:.1f} ms"


def _fits(ok: bool) -> str:
    return "[green]yes[/green]" if ok else "[red]no[/red]"


_STATE_STYLE = {"fits": "green", "tight": "yellow", "does not fit": "red"}


def _state(v: Verdict) -> str:
    """A verdict's three states: fits (the band's high end fits), tight, does not fit."""
    return f"[{_STATE_STYLE[v.state]}]{v.state}[/{_STATE_STYLE[v.state]}]"


def _signed(n: int) -> str:
    return ("+" if n >= 0 else "-") + fmt_gb(abs(n))


def fit_headline(report: FitReport) -> str:
    s = report.setup
    job = (f"{report.model} {s.method.value} ({s.precision.value}, {s.optimizer.value}, "
           f"batch {s.micro_batch} x "
           f"seq {s.seq_len}, checkpointing {s.checkpointing_spelled})")  # fmt: skip
    if report.parallelism is not None:
        job += f" on {report.parallelism.describe()}, per GPU (the most loaded rank)"
    need = fmt_gb(report.baseline.needed_bytes) + band_text(report.baseline)
    if report.smallest_sufficient is None:
        return f"{job} needs ≈ {need}: it fits none of the GPUs given; changes that make it fit are below."
    return f"{job} needs ≈ {need}: the smallest sufficient option is {report.smallest_sufficient}."


def _candidate_row(c: Candidate, base_need: int) -> list[str]:
    extra = []
    overheads = c.step.overheads()
    if overheads:
        name, seconds = overheads[0]
        extra.append(f"{name} {fmt_seconds(seconds)}")
    if c.gpus > 1:
        extra.append(f"{c.gpus} GPUs")
    if c.cpu_bytes:
        extra.append(f"CPU {fmt_gb(c.cpu_bytes)}")
    if c.changes_job:
        extra.append("[yellow]changes the job[/yellow]")
    return [
        c.label, fmt_gb(c.needed_bytes), _signed(c.needed_bytes - base_need), _fits(c.fits),
        _signed(c.headroom_bytes), fmt_seconds(c.step.total_s), f"{c.relative_cost:.2f}x", ", ".join(extra),
    ]  # fmt: skip


def _candidate_table(title: str, cands: tuple[Candidate, ...], base_need: int) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name, justify in (
        ("change", "left"),
        ("needs", "right"),
        ("vs now", "right"),
        ("fits", "left"),
        ("headroom", "right"),
        ("step", "right"),
        ("cost", "right"),
        ("note", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in cands:
        table.add_row(*_candidate_row(c, base_need))
    return table


def _print_gpu(console: Any, g: GpuFit, base_need: int) -> None:
    v = g.verdict
    lim = g.limits
    tight = (
        " (the likely value fits, the high end of its range does not:"
        " --margin ranks changes that fit with margin)"
        if v.state == "tight"
        else ""
    )
    console.print(
        f"\n[bold]{g.gpu.display_name}[/bold] ({fmt_gb(v.capacity_bytes)}): {_state(v)}"
        + f", headroom {_signed(v.headroom_bytes)}{tight}"
    )
    if not v.fits:
        if g.candidates:
            console.print(_candidate_table("what makes it fit (fewest, then cheapest changes)", g.candidates,
                                           base_need))  # fmt: skip
        else:
            console.print("no combination of the searched changes fits")
        console.print(_candidate_table("each change alone (why not X)", g.singles, base_need))
    console.print(limits_line(lim))


def limits_line(lim: Limits) -> str:
    """The limits of the job as it is: 0 reads as what it means (not even 1 fits)."""
    mb = f"{lim.largest_micro_batch:,}" if lim.largest_micro_batch else "none (micro-batch 1 does not fit)"
    seq = f"{lim.longest_seq:,}" + (" (the model's context)" if lim.seq_capped else "")
    if not lim.longest_seq:
        seq = "none (sequence 1 does not fit)"
    fewest = lim.fewest_gpus_layout or lim.note or "-"
    return f"limits: largest micro-batch {mb}; longest sequence {seq}; fewest GPUs: {fewest}"


def print_fit(report: FitReport) -> None:
    from rich.table import Table

    console = _console()
    console.print(fit_headline(report))
    table = Table(title="verdict", title_justify="left")
    for name in ("GPU", "memory", "verdict", "headroom"):
        table.add_column(name, justify="left" if name in ("GPU", "verdict") else "right")
    for g in report.gpus:
        v = g.verdict
        table.add_row(g.gpu.name, fmt_gb(v.capacity_bytes), _state(v), _signed(v.headroom_bytes))
    console.print(table)
    base_need = report.baseline.needed_bytes
    for g in report.gpus:
        _print_gpu(console, g, base_need)
    console.print("\n[dim]search space:[/dim]")
    for f in report.search_space:
        what = ", ".join(f.options)
        console.print(f"[dim]- {f.name}: {f.status}" + (f" ({f.reason})" if f.reason else "")
                      + (f": {what}" if what and f.status == "searched" else "") + "[/dim]")  # fmt: skip
    console.print("[dim]assumptions:[/dim]")
    for a in report.assumptions:
        console.print(f"[dim]- {a}[/dim]")
    console.print(f"[dim]{report.estimates} setups estimated in {fmt_seconds(report.elapsed_s)}[/dim]")


def print_plan(report: PlanReport) -> None:
    from rich.table import Table

    console = _console()
    if report.layouts:
        best = report.layouts[0]
        console.print(
            f"{report.model} on up to {report.max_gpus} x {report.gpu.display_name}: fastest layout "
            f"{best.description} — {fmt_seconds(best.step.total_s)} per step of {report.global_batch} x "
            f"{report.seq_len} tokens; most loaded rank {fmt_gb(best.needed_bytes)} of "
            f"{fmt_gb(best.capacity_bytes)}."
        )  # fmt: skip
    else:
        console.print(
            f"{report.model}: no layout searched fits on up to {report.max_gpus} x {report.gpu.display_name}."
        )
    console.print(f"scope: {report.scope}")
    table = Table(title="layouts by estimated step time", title_justify="left")
    for name in ("#", "GPUs", "dp x tp x pp", "engine", "micro-batch x n", "ckpt", "per rank (most loaded)",
                 "headroom", "step", "tokens/s/GPU"):  # fmt: skip
        table.add_column(name, justify="right" if name not in ("engine", "ckpt", "dp x tp x pp") else "left")
    for i, lay in enumerate(report.layouts, 1):
        par = lay.parallelism
        shape = "1 x 1 x 1"
        if par is not None:
            shape = f"{par.dp} x {par.tp} x {par.pp}" + "".join(
                f", {name}={getattr(par, name)}" for name in ("cp", "ep") if getattr(par, name) > 1
            )
        engine = par.engine if par is not None else "none"
        role, _, top, _ = lay.ranks[0]  # the most loaded rank type comes first
        per_rank = fmt_gb(top) + (f" ({role})" if role != "all ranks" else "")
        table.add_row(
            str(i), str(lay.step.gpus), shape, engine, f"{lay.setup.micro_batch} x {lay.setup.grad_accum}",
            lay.setup.checkpointing_spelled, per_rank, _signed(lay.headroom_bytes),
            fmt_seconds(lay.step.total_s),
            f"{lay.step.tokens_per_s / max(1, lay.step.gpus):,.0f}",
        )  # fmt: skip
    console.print(table)
    if report.fewest_gpus is not None:
        f = report.fewest_gpus
        console.print(f"fewest GPUs: {f.description}; most loaded rank {fmt_gb(f.needed_bytes)}; "
                      f"{fmt_seconds(f.step.total_s)} per step")  # fmt: skip
    console.print("[dim]search space:[/dim]")
    for fam in report.search_space:
        console.print(f"[dim]- {fam.name}: {fam.status}" + (f" ({fam.reason})" if fam.reason else "")
                      + (f": {', '.join(fam.options)}" if fam.options else "") + "[/dim]")  # fmt: skip
    console.print("[dim]assumptions:[/dim]")
    for a in report.assumptions:
        console.print(f"[dim]- {a}[/dim]")
    console.print(f"[dim]{report.scored:,} layouts scored, {report.estimates} estimated in "
                  f"{fmt_seconds(report.elapsed_s)}[/dim]")  # fmt: skip


def print_fit_inference(report: InferFitReport) -> None:
    from rich.table import Table

    console = _console()
    s = report.setup
    ctx = f"context {s.context:,}" if s.context else "the model's full context"
    job = f"{report.model} serving ({s.engine.value}, weights {s.weight_format.name}, {s.batch} x {ctx})"
    if report.smallest_sufficient is None:
        console.print(f"{job}: fits none of the GPUs given; changes that make it fit are below.")
    else:
        console.print(f"{job}: the smallest sufficient option is {report.smallest_sufficient}.")
    table = Table(title="verdict", title_justify="left")
    for name in ("GPU", "memory", "needs", "fits", "longest context", "most sequences"):
        table.add_column(name, justify="left" if name in ("GPU", "fits") else "right")
    for g in report.gpus:
        table.add_row(g.gpu.name, fmt_gb(g.capacity_bytes), fmt_gb(g.needed_bytes), _fits(g.fits),
                      f"{g.max_context:,}", f"{g.max_concurrent:,}")  # fmt: skip
    console.print(table)
    for g in report.gpus:
        if g.fits:
            continue
        for title, cands in (("what makes it fit", g.candidates), ("each change alone", g.singles)):
            t = Table(title=f"{g.gpu.name}: {title}", title_justify="left")
            for name in ("change", "per GPU", "fits", "GPUs", "sequences the pool holds", "note"):
                t.add_column(name, justify="right" if name in ("per GPU", "GPUs") else "left")
            for c in cands:
                conc = "" if c.max_concurrent is None else f"{c.max_concurrent:,}"
                note = "[yellow]changes the job[/yellow]" if c.changes_job else ""
                t.add_row(c.label, fmt_gb(c.needed_bytes), _fits(c.fits), str(c.gpus), conc, note)
            console.print(t)
    console.print("[dim]search space:[/dim]")
    for f in report.search_space:
        console.print(f"[dim]- {f.name}: {f.status}" + (f" ({f.reason})" if f.reason else "")
                      + (f": {', '.join(f.options)}" if f.options and f.status == "searched" else "")
                      + "[/dim]")  # fmt: skip
    console.print("[dim]assumptions:[/dim]")
    for a in report.assumptions:
        console.print(f"[dim]- {a}[/dim]")


def print_post_fit(report: PostFitReport) -> None:
    """``fit --objective ...``: the verdict per GPU and the changes that make the job fit."""
    from rich.table import Table

    console = _console()
    b, p = report.baseline, report.post
    console.print(
        f"{report.model} {p.objective.value.upper()} (reference {p.reference.value}"
        + (f", rollout {p.rollout.value}" if p.online else "")
        + f") needs ≈ {fmt_gb(b.needed_bytes)}{band_text(b)}, peak in {b.peak_phase.value}"
    )
    for g in report.gpus:
        console.print(
            f"\n[bold]{g.gpu.display_name}[/bold] ({fmt_gb(g.verdict.capacity_bytes)}): "
            f"{_state(g.verdict)}, headroom {_signed(g.verdict.headroom_bytes)}"
        )
        if g.verdict.fits:
            continue
        if g.combined is not None:
            c, v = g.combined
            console.print(
                f"no change alone fits; together: {c.label}: {fmt_gb(c.estimate.needed_bytes)} ({_state(v)})"
            )
        elif not g.fitting:
            console.print("no change alone fits, nor all of them together")
        table = Table(title="each change alone (least invasive first)", title_justify="left")
        for name in ("change", "needs", "peak phase", "fits"):
            table.add_column(name, justify="right" if name == "needs" else "left")
        for c, v in g.singles:
            table.add_row(c.label, fmt_gb(c.estimate.needed_bytes), c.estimate.peak_phase.value, _state(v))
        console.print(table)
