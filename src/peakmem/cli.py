"""The command line: parse -> core -> render. Thin by design (DESIGN.md "The command line").

Exit codes: 0 ok/fits, 1 does not fit (with --gpu), 2 usage or input error, 3 unknown model or GPU.
User errors print one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from peakmem import __version__
from peakmem.answers import train_headline
from peakmem.errors import EXIT_INPUT_ERROR, EXIT_OK, InputError, PeakmemError
from peakmem.options import MAX_NUMBER
from peakmem.training import DEFAULT_SEQ_LEN

Handler = Callable[[argparse.Namespace], int]
MAX_ERROR_CHARS = 400  # a usage error quotes at most this much of what it got
MIN_PORT, MAX_PORT = 1, 65535  # TCP ports (0 would pick a random one the user cannot know)
MAX_STEPS = 100  # simulate/measure: the peak settles by step 2; more steps only cost time
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `yes | head`
HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")  # --allow-host
MAX_SMI_CSV_BYTES = 1 << 20  # --nvidia-smi-used FILE: nvidia-smi's CSV is a line per GPU
TORCH_EXTRA_MODULES = ("torch", "transformers")  # the 'torch' extra simulate and measure need
WARNING_PREFIX = "warning:"  # assumptions a user must not miss are also printed on stderr


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors on one line with exit code 2."""

    def error(self, message: str) -> Any:
        if len(message) > MAX_ERROR_CHARS:  # a 5,000-digit value: keep the line readable
            half = MAX_ERROR_CHARS // 2
            message = f"{message[:half]}...{message[-half:]}"
        self.exit(EXIT_INPUT_ERROR, f"peakmem: error: {message} (see `{self.prog} --help`)\n")


def _emit_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


# --- options: built from the one table (peakmem.options) ---------------------------------------------
def _add_options(p: argparse.ArgumentParser, command: str, *, required: tuple[str, ...] = ()) -> None:
    """The flags of ``command``, from :data:`peakmem.options.OPTIONS` (grouped as the table groups them)."""
    from peakmem import options

    groups: dict[str, Any] = {}
    for o in options.of(command):
        target = p if not o.group else groups.setdefault(o.group, p.add_argument_group(o.group))
        if o.kind is bool:
            target.add_argument(o.flag, action="store_true", help=o.help)
            continue
        target.add_argument(o.flag, type=o.kind, default=o.default, help=o.help,
                            choices=o.choices or None, required=o.name in required)  # fmt: skip


def _add_emit_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--emit", default=None, choices=("deepspeed", "fsdp"),
        help="print the engine's configuration for this setup instead of the estimate",
    )  # fmt: skip


def _add_from_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from", dest="from_file", action="append", default=None, metavar="FILE",
        help="read the job from a framework's config (axolotl, LLaMA-Factory, torchtune, "
        "TrainingArguments/TRL, DeepSpeed JSON, accelerate YAML); repeat for several; options given "
        "here override the file",
    )  # fmt: skip


def _explicit_dests(argv: Sequence[str]) -> set[str]:
    """The options the user typed (argparse dests): parse again with every default suppressed, so
    that a default never overrides a value read with --from."""
    parser = build_parser()
    parsers = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.extend(action.choices.values())
    for p in parsers:
        for action in p._actions:
            if action.dest != "help":
                action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(list(argv))))


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags as the options mapping of the command (peakmem.options)."""
    from peakmem import options

    return {o.name: getattr(args, o.name) for o in options.of(args.command)}


def _question(args: argparse.Namespace, explicit: set[str] | None = None, command: str | None = None) -> Any:
    """The typed question the command line asks (``--from`` files read first, the flags typed over them);
    ``command``: the job command to ask it as, its other options at their defaults (explain asks train's)."""
    from peakmem import options
    from peakmem.question import ask, read_from

    given = {**options.defaults(command), **_given(args)} if command else _given(args)
    read, model = None, args.model
    if getattr(args, "from_file", None):
        read, model = read_from(given, args.from_file, explicit or set(), model)
    from peakmem.simulate import oracles

    return ask(command or args.command, given, model=model, from_file=read, **oracles())


def answer_argv(argv: Sequence[str]) -> Any:
    """The answer (:class:`peakmem.question.Answer`) to ``peakmem train|infer|fit|plan ...`` given as
    its arguments, without printing: for scripts that hold recorded commands against the CLI."""
    from peakmem.question import answer

    args = build_parser().parse_args(list(argv))
    return answer(_question(args, _explicit_dests(argv) if getattr(args, "from_file", None) else None))


def _training(args: argparse.Namespace, max_positions: int | None) -> Any:
    """The TrainingSetup of a command that runs or draws one setup (measure, simulate, plot, explain)."""
    from peakmem import options
    from peakmem.question import training_setup

    return training_setup(options.convert(args.command, _given(args)), max_positions)[0]


def _print_from_echo(q: Any, markdown: bool = False) -> None:
    """The echo of what --from read: on stdout before the tables, on stderr beside Markdown."""
    if q.from_file is None:
        return
    out = sys.stderr if markdown else sys.stdout
    for line in q.from_file.found.echo_lines(q.from_file.overridden):
        print(line, file=out)
    print(file=out)


def _gpus(arg: str | None) -> tuple[Any, ...]:
    from peakmem.resolve import resolve_gpus

    return resolve_gpus(arg) if arg else ()


def _notices(gpus: Sequence[Any], setup: Any = None) -> None:
    """One stderr line per plain size (the bytes it means, the cards sold under it) and per GPU that
    cannot run what the setup asks (bf16 or flash attention before Ampere): the estimate stands, as
    asked, but the user hears why it would not run."""
    for g in gpus:
        if g.vendor == "unknown":
            print(f"peakmem: --gpu {g.name} = {g.note}", file=sys.stderr)
        if setup is None or not g.pre_ampere:
            continue
        precision = getattr(setup, "precision", None)
        if precision is not None and "bf16" in precision.value:
            print(f"peakmem: warning: {g.display_name} has no bf16 ({g.architecture}; bf16 needs Ampere or "
                  f"newer): {precision.value} would not run there; --precision mixed-fp16 or amp-fp16 does",
                  file=sys.stderr)  # fmt: skip
        attention = getattr(setup, "attention", None)
        if attention is not None and attention.value == "flash":
            print(f"peakmem: warning: {g.display_name} cannot run flash-attn 2 ({g.architecture}; it needs "
                  "Ampere or newer): --attention sdpa runs there", file=sys.stderr)  # fmt: skip


# --- commands --------------------------------------------------------------------------------------
def cmd_models(args: argparse.Namespace) -> int:
    from peakmem.catalog import MODELS

    if args.json:
        _emit_json([
            {"name": m.name, "family": m.family, "hub_id": m.hub_id, "aliases": list(m.aliases),
             "source": m.source}
            for m in MODELS
        ])  # fmt: skip
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(MODELS)} models (any config.json or Hub id works too)", title_justify="left")
    table.add_column("name")
    table.add_column("family")
    table.add_column("Hub id")
    for m in MODELS:
        table.add_row(m.name, m.family, m.hub_id)
    Console().print(table)
    return EXIT_OK


def cmd_gpus(args: argparse.Namespace) -> int:
    from peakmem.catalog import GPUS
    from peakmem.units import fmt_both, fmt_gib

    if args.json:
        _emit_json([
            {"name": g.name, "display_name": g.display_name, "vendor": g.vendor,
             "memory_bytes": g.memory_bytes, "usable_bytes": g.usable_bytes, "aliases": list(g.aliases),
             "bf16_tflops": g.bf16_tflops, "bandwidth_gbps": g.bandwidth_gbps, "source": g.memory_source}
            for g in GPUS
        ])  # fmt: skip
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(GPUS)} GPUs (or pass a size: 24GB, 80GiB)", title_justify="left")
    for col in ("name", "GPU", "memory", "aliases"):
        table.add_column(col)
    for g in GPUS:
        # what PyTorch sees where the driver keeps some (catalog driver_reserved_bytes): what verdicts use
        torch_sees = f"; torch {fmt_gib(g.usable_bytes)}" if g.usable_bytes != g.memory_bytes else ""
        table.add_row(g.name, g.display_name, fmt_both(g.memory_bytes) + torch_sees, ", ".join(g.aliases))
    Console().print(table)
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    from peakmem.answers import spec_json
    from peakmem.render import print_info
    from peakmem.resolve import info_answer
    from peakmem.simulate import oracles

    spec, answered = info_answer(args.model, cross_check=args.cross_check, **oracles())
    if args.json:
        _emit_json(spec_json(spec, answered))
    else:
        print_info(spec, answered)
    return EXIT_OK


def _report(args: argparse.Namespace, est: Any, headline: str, ways: Any = None, out: Any = None) -> int:
    """Print an estimate (and the ways down, a planner.WaysDown) as JSON, Markdown or tables; ``out``:
    the answer's JSON when there is one (train), else the estimate's."""
    from peakmem.answers import answer_json, verdicts_of
    from peakmem.question import verdict_code
    from peakmem.render import markdown_estimate, print_estimate

    gpus = _gpus(getattr(args, "gpu", None))
    verdicts = verdicts_of(est, gpus)
    for note in est.assumptions:
        if note.startswith(WARNING_PREFIX):  # e.g. a context beyond the model's limit
            print(f"peakmem: {note}", file=sys.stderr)
    pairs = ways.pairs() if ways is not None else []
    note = ways.note if ways is not None else ""
    if args.json:
        _emit_json(out if out is not None else answer_json(est, gpus, ways))
    elif args.markdown:
        sys.stdout.write(markdown_estimate(est, headline, verdicts, pairs, note))
    else:
        print_estimate(est, headline, verdicts, pairs, note)
    return verdict_code([v.fits for v in verdicts])


def cmd_train(args: argparse.Namespace) -> int:
    from peakmem.question import answer

    q = _question(args, getattr(args, "explicit", None))
    assert q.training is not None
    if args.emit:
        from peakmem.emit import emit
        from peakmem.parallel import Parallelism

        par = q.parallel or Parallelism(**dict(q.from_file.parallel if q.from_file else {}))
        sys.stdout.write(emit(args.emit, q.spec, q.training, par))
        return EXIT_OK
    got = answer(q)  # a question that cannot be answered errors in one line, before any notice
    _notices(q.gpus, q.training)
    assert got.estimate is not None
    if args.plot:
        from peakmem.plot import plot_training

        path = plot_training(
            q.spec, q.training, args.plot, gpus=q.gpus, est=got.estimate, ways=got.ways.pairs()
        )
        print(f"peakmem: wrote {path}", file=sys.stderr)
    headline = train_headline(q.spec.name, q.training, got.estimate, par=q.parallel)
    if not args.json:
        _print_from_echo(q, args.markdown)
    code = _report(args, got.estimate, headline, got.ways, got.json)
    if got.ranks is not None and not (args.json or args.markdown):
        from peakmem.render import console

        out = console()
        out.print("[bold]per rank[/bold]")
        for line in got.ranks.summary_lines():
            out.print(f"- {line}")
    return code


def cmd_plot(args: argparse.Namespace) -> int:
    from peakmem.plot import plot_training
    from peakmem.resolve import resolve_model
    from peakmem.simulate import deriver

    spec = resolve_model(args.model, derive=deriver())
    setup = _training(args, spec.max_position_embeddings)
    path = plot_training(spec, setup, args.out, gpus=_gpus(args.gpu), kind=args.kind)
    print(f"peakmem: wrote {path}")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from peakmem.errors import InputError
    from peakmem.web import serve

    if not MIN_PORT <= args.port <= MAX_PORT:
        raise InputError(f"--port={args.port}: must be in {MIN_PORT}..{MAX_PORT}")
    for name in args.allow_host:
        if not HOST_NAME.fullmatch(name):
            raise InputError(f"--allow-host={name[:MAX_ERROR_CHARS]!r}: not a host name (letters, digits, "
                             "'.', '-', or an IPv6 address in brackets; no port)")  # fmt: skip
    _check_port_free(args.host, args.port)
    try:
        serve(host=args.host, port=args.port, open_browser=args.open, allow_hosts=args.allow_host)
    except SystemExit as stop:  # uvicorn exits 3 when it cannot bind (3 means "unknown model" here)
        if stop.code in (None, 0):
            return EXIT_OK
        raise InputError(
            f"--host={args.host!r} --port={args.port}: the server could not start (see the line above)"
        ) from None
    return EXIT_OK


def _check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` once, as uvicorn will, so that a busy port is an input error (exit 2)."""
    import socket

    from peakmem.errors import InputError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise InputError(f"--host={host!r}: cannot resolve it ({e})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind(address)
        except OSError as e:
            raise InputError(
                f"--host={host!r} --port={port}: cannot listen there ({e.strerror or e}); "
                "choose another port with --port"
            ) from None


def _require_torch_extra(command: str) -> None:
    """simulate and measure build the real model: without torch/transformers, exit 2 naming the extra."""
    from peakmem.errors import MissingExtraError

    for module in TORCH_EXTRA_MODULES:
        try:
            __import__(module)
        except ImportError:
            raise MissingExtraError(command, "torch", module) from None


def _config_and_setup(args: argparse.Namespace) -> tuple[str, dict[str, Any], Any]:
    """For the commands that build the real model: its name, config dict and the setup. The
    architecture need not be one peakmem's formulas know: transformers builds it."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # keep transformers' notices off the answer
    from peakmem.hf import context_length
    from peakmem.resolve import resolve_config

    name, config = resolve_config(args.model)
    return name, config, _training(args, context_length(config) or DEFAULT_SEQ_LEN)


def _post_training(args: argparse.Namespace, setup: Any) -> Any:
    """The post-training roles ``--objective`` asks for (None: sft)."""
    from peakmem import options
    from peakmem.question import post_training_of

    return post_training_of(options.convert(args.command, _given(args)), setup)


def _measure_post_training(args: argparse.Namespace, name: str, config: Any, setup: Any, post: Any) -> int:
    """``measure --objective dpo|grpo``: TRL's own trainer on the CPU, phase by phase."""
    from peakmem.errors import MissingExtraError

    if args.device != "cpu":
        raise InputError(
            f"device={args.device!r}: TRL's trainers are measured on the CPU here (--device cpu)"
        )
    try:
        __import__("trl")
    except ImportError:
        raise MissingExtraError("measure", "rl", "trl") from None
    from peakmem.measure.post_training import measure_post_training
    from peakmem.resolve import resolve_config

    teacher = resolve_config(args.teacher)[1] if getattr(args, "teacher", None) else None
    with _quiet() as notes:
        est = measure_post_training(config, setup, post, model_name=name, teacher_config=teacher)
    est = replace(est, assumptions=(*est.assumptions, *notes))
    return _report(args, est, train_headline(name, setup, est, verb="measured"))


def cmd_measure(args: argparse.Namespace) -> int:
    _check_steps(args.steps)
    from peakmem.measure import measure_training

    name, config, setup = _config_and_setup(args)  # the files checked before torch loads (seconds)
    post = _post_training(args, setup)
    _require_torch_extra("measure")
    if post is not None:
        return _measure_post_training(args, name, config, setup, post)
    with _quiet() as notes:
        est = measure_training(config, setup, device=args.device, steps=args.steps, model_name=name)
    est = replace(est, assumptions=(*est.assumptions, *notes))
    return _report(args, est, train_headline(name, setup, est, verb="measured"))


def cmd_simulate(args: argparse.Namespace) -> int:
    _check_steps(args.steps)
    from peakmem.simulate import simulate_training

    name, config, setup = _config_and_setup(args)  # the files checked before torch loads (seconds)
    _require_torch_extra("simulate")
    with _quiet() as notes:
        est = simulate_training(config, setup, kernels=args.kernels, steps=args.steps, model_name=name)
    est = replace(est, assumptions=(*est.assumptions, *notes))
    return _report(args, est, train_headline(name, setup, est, verb="simulated at"))


@contextlib.contextmanager
def _quiet() -> Iterator[list[str]]:
    """The libraries' warnings and log lines while the real model runs: captured, not printed; those that
    say a kernel falls back are yielded as notes for the answer (peakmem.simulate.quiet)."""
    from peakmem.simulate.quiet import notes_that_matter, quiet_libraries

    notes: list[str] = []
    with quiet_libraries() as said:
        yield notes
    notes.extend(notes_that_matter(said))


def _check_steps(steps: int) -> None:
    from peakmem.validate import check_int

    check_int("--steps", steps, maximum=MAX_STEPS, what="steps; the memory peak settles by step 2")


def cmd_infer(args: argparse.Namespace) -> int:
    from peakmem.question import answer
    from peakmem.render import markdown_estimate, print_estimate

    q = _question(args)
    got = answer(q)
    _notices(q.gpus)
    est, verdicts = got.served.estimate, list(got.served.verdicts)
    for note in est.assumptions:
        if note.startswith(WARNING_PREFIX):  # e.g. a context beyond the model's limit
            print(f"peakmem: {note}", file=sys.stderr)
    if args.json:
        _emit_json(got.json)
    elif args.markdown:
        sys.stdout.write(markdown_estimate(est, got.served.headline, verdicts))
    else:
        print_estimate(est, got.served.headline, verdicts)
    return int(got.exit_code)


def cmd_fit(args: argparse.Namespace) -> int:
    from peakmem.question import answer
    from peakmem.render_plan import print_fit, print_fit_inference, print_post_fit

    q = _question(args, getattr(args, "explicit", None))
    got = answer(q)
    _notices(q.gpus, q.training)
    if args.json:
        _emit_json(got.json)
    elif q.search.infer:
        print_fit_inference(got.report)
    elif q.post is not None:
        _print_from_echo(q)
        print_post_fit(got.report)
    else:
        _print_from_echo(q)
        print_fit(got.report)
    return int(got.exit_code)


def cmd_plan(args: argparse.Namespace) -> int:
    from peakmem.question import answer
    from peakmem.render_plan import print_plan

    got = answer(_question(args))
    if args.json:
        _emit_json(got.json)
    else:
        print_plan(got.report)
    return int(got.exit_code)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Fit a profile from measurement files (JSON of peakmem measure / memory_stats, or snapshots)."""
    from pathlib import Path

    from peakmem import calibrate as cal

    if args.list:
        profiles = cal.list_profiles()
        if args.json:
            _emit_json({"folder": str(cal.profiles_dir()), "profiles": [p.to_json() for p in profiles]})
        else:
            print(
                f"profiles in {cal.profiles_dir()}:" if profiles else f"no profiles in {cal.profiles_dir()}"
            )
            for p in profiles:
                print(f"  {p.name}: CUDA context {p.context_bytes / 2**20:.0f} MiB, fragmentation "
                      f"{p.fragmentation:.1%}{' (' + p.gpu + ')' if p.gpu else ''}")  # fmt: skip
        return EXIT_OK
    if not args.files or not args.name:
        raise InputError("calibrate needs FILE... and --name NAME (or --list)")
    cal.check_profile_name(args.name)
    used, gpu = (
        cal.parse_nvidia_smi_used(_file_or_text(args.nvidia_smi_used))
        if args.nvidia_smi_used
        else (None, None)
    )
    from peakmem.measure.snapshot import is_snapshot_file, load_snapshot, replay

    measurements = []
    for name in args.files:
        path = Path(name)
        if is_snapshot_file(path):
            rep = replay(load_snapshot(path), device=args.device)
            measurements.append(rep.measurement(f"snapshot {path.name}", device_total_bytes=used, gpu=gpu))
        else:
            measurements.append(cal.measurement_from_json_file(path, device_total_bytes=used, gpu=gpu))
    profile = cal.fit_profile(args.name, measurements)
    where = cal.save_profile(profile)
    if args.json:
        _emit_json({**profile.to_json(), "path": str(where)})
    else:
        print(f"profile {profile.name!r}: CUDA context {profile.context_bytes / 2**20:.0f} MiB, "
              f"fragmentation {profile.fragmentation:.1%} of the per-step churn, from "
              f"{len(measurements)} measurement(s); saved to {where}; use it with "
              f"--profile {profile.name}")  # fmt: skip
        for note in profile.notes:
            print(f"  - {note}")
    return EXIT_OK


def _file_or_text(value: str) -> str:
    """--nvidia-smi-used: a file holding nvidia-smi's CSV, or the value itself."""
    from pathlib import Path

    from peakmem.userfiles import read_user_text

    path = Path(value)
    if path.exists():  # a FIFO or a device too: refused by name, unread
        return read_user_text(path, what="nvidia-smi's CSV", max_bytes=MAX_SMI_CSV_BYTES,
                              label="--nvidia-smi-used")  # fmt: skip
    return value


def cmd_explain(args: argparse.Namespace) -> int:
    """Replay a memory snapshot; with --model, put peakmem's prediction next to it."""
    from pathlib import Path

    from peakmem.measure.snapshot import explanation_json, explanation_lines, load_snapshot, replay

    rep = replay(load_snapshot(Path(args.snapshot)), device=args.device)
    est, ways, capacity = None, [], None
    if args.model or args.from_file:
        from peakmem.planner import train_answer

        q = _question(args, getattr(args, "explicit", None), command="train")
        if q.post is not None:
            raise InputError(f"objective={q.post.objective.value}: explain compares one training step; "
                             "predict the post-training job with peakmem train")  # fmt: skip
        if not args.json:
            _print_from_echo(q)
        if rep.oom is not None:
            capacity = min((g.usable_bytes for g in q.gpus), default=None) or rep.oom.capacity_bytes(
                q.overheads.context_bytes
            )
        answer = train_answer(q.spec, q.training, q.parallel, overheads=q.overheads, capacity_bytes=capacity,
                              costs=q.costs)  # fmt: skip
        est = answer.estimate
        if capacity is not None:
            ways = [w for w in answer.ways.ways if w.needed_bytes <= capacity]
    out = explanation_json(rep, args.snapshot, est, ways, capacity)
    if args.json:
        _emit_json(out)
    else:
        print("\n".join(explanation_lines(out)))
    return EXIT_OK


# --- parser ----------------------------------------------------------------------------------------
def _add_output_format(p: argparse.ArgumentParser) -> None:
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--markdown", action="store_true", help="print Markdown, ready to paste")
    _add_quiet_option(p)


def _add_quiet_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true",
                   help="say nothing on stderr while a new model's blocks are measured")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="peakmem",
        description="How much GPU memory an LLM job takes, where every byte goes, and what makes it fit.",
        epilog="MODEL: a catalog name (peakmem models), a config.json or its folder, or a Hub id. "
        "Exit codes: 0 ok/fits, 1 does not fit, 2 input error, 3 unknown model or GPU.",
    )
    parser.add_argument("--version", action="version", version=f"peakmem {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("models", help="list the model catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_models)

    p = sub.add_parser("gpus", help="list the GPU catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_gpus)

    p = sub.add_parser("info", help="architecture and exact parameter breakdown")
    p.add_argument("model", help="catalog name, path to config.json (or its folder), or Hub id")
    p.add_argument("--json", action="store_true")
    p.add_argument("--cross-check", action="store_true",
                   help="for a family the formulas know, also derive the spec from transformers' modules "
                        "and measure its blocks (needs torch), and say how the two paths agree")  # fmt: skip
    _add_quiet_option(p)
    p.set_defaults(handler=cmd_info)

    p = sub.add_parser("train", help="GPU memory to train a model")
    p.add_argument("model", nargs="?", default=None, help="optional with --from FILE naming the model")
    _add_from_option(p)
    _add_options(p, "train")
    _add_output_format(p)
    p.add_argument("--plot", metavar="FILE", help="also draw the ways down: .png, .svg or .pdf")
    _add_emit_option(p)
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("plot", help="memory by technique, or against batch or sequence length")
    p.add_argument("model")
    _add_options(p, "plot")
    p.add_argument("--kind", default="ways", choices=("ways", "batch", "seq"))
    p.add_argument("-o", "--out", required=True, metavar="FILE", help=".png, .svg or .pdf")
    p.set_defaults(handler=cmd_plot)

    p = sub.add_parser("measure", help="run real training steps and measure their memory")
    p.add_argument("model")
    _add_options(p, "measure")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--steps", type=int, default=2)
    _add_output_format(p)
    p.set_defaults(handler=cmd_measure)

    p = sub.add_parser("simulate", help="run the real model under fake tensors: exact, no GPU needed")
    p.add_argument("model")
    _add_options(p, "simulate")
    p.add_argument("--steps", type=int, default=2)
    _add_output_format(p)
    p.set_defaults(handler=cmd_simulate)

    p = sub.add_parser("infer", help="GPU memory to serve a model")
    p.add_argument("model")
    _add_options(p, "infer")
    _add_output_format(p)
    p.set_defaults(handler=cmd_infer)

    p = sub.add_parser("fit", help="verdict per GPU and the ranked changes that make it fit")
    p.add_argument("model", nargs="?", default=None, help="optional with --from FILE naming the model")
    _add_from_option(p)
    _add_options(p, "fit")
    _add_output_format(p)
    p.set_defaults(handler=cmd_fit)

    p = sub.add_parser(
        "plan", help="the fastest parallel layout that fits, up to N GPUs",
        description="Search data, tensor, pipeline, context (long sequences) and expert (MoE) parallel "
        "degrees, the ZeRO stage or FSDP, checkpointing and micro-batch; rank the layouts by the "
        "step-time model and show the fastest that fit, with per-rank memory.",
    )  # fmt: skip
    p.add_argument("model")
    _add_options(p, "plan", required=("gpu", "max_gpus"))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_quiet_option(p)
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser(
        "calibrate", help="fit your GPU's CUDA context and fragmentation from a real run; save a profile",
        description="FILE: the JSON of `peakmem measure --device cuda --json`, a JSON dump of "
        "torch.cuda.memory_stats() taken after a step, or a snapshot pickle of "
        "torch.cuda.memory._dump_snapshot(). The profile goes to $PEAKMEM_CONFIG_DIR/profiles, else "
        "$XDG_CONFIG_HOME/peakmem/profiles (~/.config/peakmem/profiles); --profile NAME uses it.",
    )  # fmt: skip
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument("--name", default=None, help="the profile's name")
    p.add_argument("--nvidia-smi-used", default=None,
                   help="nvidia-smi's used memory at the peak: 40.1GiB, MiB as a number, or a file with "
                   "the CSV of nvidia-smi --query-gpu=memory.used,name --format=csv")  # fmt: skip
    p.add_argument("--device", type=int, default=None, help="snapshots: which CUDA device (default: busiest)")
    p.add_argument("--list", action="store_true", help="list the saved profiles")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=cmd_calibrate)

    p = sub.add_parser(
        "explain", help="replay a CUDA memory snapshot: its peak by category next to the prediction",
        description="SNAPSHOT: the pickle of torch.cuda.memory._dump_snapshot() (record the trace with "
        "torch.cuda.memory._record_memory_history() first). With --model and train options, peakmem's "
        "prediction is shown side by side; for an OOM snapshot, the changes that would have fit.",
    )  # fmt: skip
    p.add_argument("snapshot", metavar="SNAPSHOT")
    p.add_argument("--model", default=None, help="the job's model: predict it with the train options")
    _add_from_option(p)
    _add_options(p, "explain")
    p.add_argument("--device", type=int, default=None, help="which CUDA device (default: busiest trace)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_quiet_option(p)
    p.set_defaults(handler=cmd_explain)

    p = sub.add_parser(
        "serve", help="local web page and JSON API (needs peakmem[web])",
        description="Serve the page and the JSON API. Only requests whose Host header names this server "
        "(127.0.0.1, localhost, [::1] or --host, bare or with --port) are answered, a guard against DNS "
        "rebinding; to serve another host name (a LAN name, a reverse proxy's), add --allow-host NAME.",
    )  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME", dest="allow_host",
                   help="also answer requests for this host name (repeatable)")  # fmt: skip
    p.add_argument("--open", action="store_true", help="open the page in a browser")
    p.set_defaults(handler=cmd_serve)

    return parser


def _check_numbers(args: argparse.Namespace) -> None:
    """Every number on the command line is finite and of a size a computer can mean: the setups
    check ranges and physical limits; this stops nan, inf and 40-digit values at the door."""
    from peakmem.errors import InputError

    for name, value in vars(args).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{flag}={value!r}: must be a finite number")
        if abs(value) > MAX_NUMBER:
            raise InputError(f"{flag}={value!r}: too large (more than {MAX_NUMBER:,})")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (pytest's capture)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_INPUT_ERROR
    try:
        if getattr(args, "from_file", None):  # the options typed win over the files' (peakmem.question)
            args.explicit = _explicit_dests(sys.argv[1:] if argv is None else argv)
        elif getattr(args, "command", None) in ("train", "fit") and args.model is None:
            raise InputError(f"MODEL: peakmem {args.command} needs a model (or --from FILE naming one)")
        _check_numbers(args)
        if getattr(args, "quiet", True):
            return handler(args)
        from peakmem import progress
        from peakmem.render import StageDisplay

        with progress.reporting(StageDisplay()):
            return handler(args)
    except PeakmemError as error:
        print(f"peakmem: error: {error}", file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:  # `peakmem ... | head`: the reader left; stop quietly, as `yes | head` does
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as error:  # a file the user named: --plot or plot -o into a missing folder, ...
        where = f": {error.filename}" if error.filename else ""
        print(f"peakmem: error: {error.strerror or error}{where}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        return 130
