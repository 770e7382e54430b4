"""The command line: parse -> core -> render. Thin by design (DESIGN.md "The command line").

Exit codes: 0 ok/fits, 1 does not fit (with --gpu), 2 usage or input error, 3 unknown model or GPU.
User errors print one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from peakmem import __version__
from peakmem.errors import EXIT_DOES_NOT_FIT, EXIT_INPUT_ERROR, EXIT_OK, InputError, PeakmemError
from peakmem.render import train_headline
from peakmem.training import DEFAULT_SEQ_LEN
from peakmem.validate import MAX_TOKENS

Handler = Callable[[argparse.Namespace], int]
MAX_CLI_NUMBER = MAX_TOKENS  # 2^40 ~ 1.1e12: no count or size on the command line is larger
MAX_ERROR_CHARS = 400  # a usage error quotes at most this much of what it got
MIN_PORT, MAX_PORT = 1, 65535  # TCP ports (0 would pick a random one the user cannot know)
MAX_STEPS = 100  # simulate/measure: the peak settles by step 2; more steps only cost time
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `yes | head`
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


# --- shared option groups --------------------------------------------------------------------------
def _add_train_options(p: argparse.ArgumentParser) -> None:
    from peakmem.training import (
        AttentionKernel,
        Checkpointing,
        Framework,
        LossImpl,
        Method,
        OptimizerImpl,
        OptimizerName,
        Precision,
    )

    def choices(enum: Any) -> str:
        return "|".join(m.value for m in enum)

    p.add_argument("--method", default="full", help=choices(Method))
    p.add_argument("--precision", default="mixed-bf16", help=choices(Precision))
    p.add_argument("--optimizer", default="adamw", help=choices(OptimizerName))
    p.add_argument("--optimizer-impl", default="foreach", help=choices(OptimizerImpl))
    p.add_argument("--batch", type=int, default=1, help="micro-batch size per GPU")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: min(context, 2048))")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--checkpointing", default="none", help=choices(Checkpointing))
    p.add_argument("--attention", default="sdpa", help=choices(AttentionKernel))
    p.add_argument("--framework", default="hf", help=choices(Framework))
    g = p.add_argument_group("LoRA / QLoRA (with --method lora|qlora)")
    g.add_argument("--lora-rank", type=int, default=None, help="adapter rank r (default 8, as peft)")
    g.add_argument("--lora-alpha", type=float, default=None, help="scaling alpha (default 8)")
    g.add_argument("--lora-targets", default=None, help="all-linear (default) or module names: q_proj,v_proj")
    g.add_argument("--lora-dropout", type=float, default=None, help="dropout on the adapter input")
    g.add_argument("--dora", action="store_true", help="DoRA: weight-decomposed LoRA")
    g.add_argument("--adapter-dtype", default=None, help="fp32 (peft's default) or base")
    g.add_argument("--quant", default=None, help="qlora base: nf4 (default)|fp4|int8")
    g.add_argument("--no-double-quant", action="store_true", help="qlora: plain fp32 absmax per block")
    g = p.add_argument_group("memory-saving options")
    g.add_argument("--loss", default="standard", help=choices(LossImpl))
    g.add_argument("--optimizer-in-backward", action="store_true", help="step each parameter in backward")
    g.add_argument("--activation-offload", action="store_true", help="saved activations to CPU RAM")
    g.add_argument("--compile", action="store_true", help="torch.compile each layer")
    g.add_argument("--liger", action="store_true", help="Liger kernels (RMSNorm, SwiGLU, RoPE, fused CE)")


def _add_parallel_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("multi-GPU (per-rank memory)")
    g.add_argument("--gpus", type=int, default=1, help="world size")
    g.add_argument("--gpus-per-node", type=int, default=8)
    g.add_argument("--zero", type=int, default=0, help="DeepSpeed ZeRO stage 0|1|2|3")
    g.add_argument("--fsdp", default="none", help="none|full-shard|shard-grad-op|hybrid-shard")
    g.add_argument("--fsdp-version", type=int, default=2, help="1 (flat params) or 2 (fully_shard)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree")
    g.add_argument("--cp", type=int, default=1, help="context-parallel degree")
    g.add_argument("--ep", type=int, default=1, help="expert-parallel degree")
    g.add_argument("--sp", action="store_true", help="Megatron sequence parallelism (with --tp)")
    g.add_argument("--pp-schedule", default="1f1b", help="1f1b|interleaved")
    g.add_argument("--virtual-stages", type=int, default=1, help="interleaved schedule: chunks per rank")
    g.add_argument("--offload", default="none", help="optimizer states to none|cpu|nvme")
    g.add_argument("--offload-params", default="none", help="parameters to none|cpu|nvme (ZeRO-3/FSDP)")
    g.add_argument(
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


def _apply_from(args: argparse.Namespace, explicit: set[str]) -> None:
    """--from FILE: the file's options where the command line gave none (peakmem.fromfile)."""
    from peakmem.fromfile import load_and_apply

    load_and_apply(args, explicit)


def _from_block(args: argparse.Namespace) -> dict[str, Any] | None:
    found = getattr(args, "from_result", None)
    if found is None:
        return None
    block: dict[str, Any] = found.json(getattr(args, "from_overridden", ()))
    return block


def _print_from_echo(args: argparse.Namespace) -> None:
    """The echo of what --from read: on stdout before the tables, on stderr beside Markdown."""
    found = getattr(args, "from_result", None)
    if found is None:
        return
    out = sys.stderr if getattr(args, "markdown", False) else sys.stdout
    for line in found.echo_lines(getattr(args, "from_overridden", ())):
        print(line, file=out)
    print(file=out)


def _parallelism(args: argparse.Namespace) -> Any:
    """The Parallelism the flags ask for, or None for a plain single-GPU job."""
    from peakmem.parallel import FsdpMode, Offload, Parallelism, PipelineSchedule

    plain = (
        args.gpus == 1 and args.zero == 0 and args.fsdp == "none" and args.offload == "none"
        and args.offload_params == "none" and args.tp == args.pp == args.cp == args.ep == 1
        and args.emit is None
    )  # fmt: skip
    if plain:
        return None
    return Parallelism(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        tp=args.tp,
        pp=args.pp,
        cp=args.cp,
        ep=args.ep,
        sequence_parallel=args.sp,
        zero_stage=args.zero,
        fsdp=FsdpMode.parse(args.fsdp, "fsdp"),
        fsdp_version=args.fsdp_version,
        offload_optimizer=Offload.parse(args.offload, "offload"),
        offload_params=Offload.parse(args.offload_params, "offload-params"),
        pp_schedule=PipelineSchedule.parse(args.pp_schedule, "pp-schedule"),
        virtual_stages=args.virtual_stages,
        **getattr(args, "from_parallel", {}),  # DeepSpeed bucket sizes read with --from
    )


def _add_infer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", default="bf16",
                   help="bf16|fp16|fp32|fp8|int8|nf4|fp4|gptq-4bit-g128|awq-4bit|q4_k_m|...")  # fmt: skip
    p.add_argument("--kv-cache", default="auto", help="auto|bf16|fp16|fp8|int8|int4")
    p.add_argument("--context", type=int, default=None, help="tokens per sequence (default: model limit)")
    p.add_argument("--prompt", type=int, default=None, help="prefill tokens (default: the whole context)")
    p.add_argument("--engine", default="hf", help="hf|vllm|sglang|llamacpp")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM gpu_memory_utilization / SGLang mem_fraction_static (default: the engine's)",
    )
    p.add_argument("--n-gpu-layers", type=int, default=None, help="llama.cpp -ngl")
    p.add_argument("--keep-all-logits", action="store_true", help="logits for every prompt position")
    p.add_argument("--strict", action="store_true", help="context beyond the model's limit is an error")


def _add_output_options(p: argparse.ArgumentParser, gpu: bool = True) -> None:
    if gpu:
        p.add_argument("--gpu", default=None, help="GPU name(s) or size(s), comma-separated: rtx-4090,40GB")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--markdown", action="store_true", help="print Markdown, ready to paste")


def _training_setup(args: argparse.Namespace, max_positions: int) -> Any:
    from peakmem.training import (
        AttentionKernel,
        Checkpointing,
        Framework,
        LossImpl,
        Method,
        OptimizerImpl,
        OptimizerName,
        Precision,
        TrainingSetup,
    )

    seq = args.seq if args.seq is not None else min(max_positions, DEFAULT_SEQ_LEN)
    return TrainingSetup(
        method=Method.parse(args.method, "method"),
        precision=Precision.parse(args.precision, "precision"),
        optimizer=OptimizerName.parse(args.optimizer, "optimizer"),
        optimizer_impl=OptimizerImpl.parse(args.optimizer_impl, "optimizer-impl"),
        micro_batch=args.batch,
        seq_len=seq,
        grad_accum=args.grad_accum,
        checkpointing=Checkpointing.parse(args.checkpointing, "checkpointing"),
        attention=AttentionKernel.parse(args.attention, "attention"),
        framework=Framework.parse(args.framework, "framework"),
        lora=_lora_config(args),
        quant=_quant_config(args),
        loss=LossImpl.parse(args.loss, "loss"),
        optimizer_in_backward=args.optimizer_in_backward,
        activation_offload=args.activation_offload,
        compiled=args.compile,
        liger=args.liger,
    )


def _lora_config(args: argparse.Namespace) -> Any:
    """A LoraConfig when any LoRA option is given (TrainingSetup rejects it with --method full)."""
    from peakmem.adapters import LoraConfig, parse_targets

    given = {
        "rank": args.lora_rank,
        "alpha": args.lora_alpha,
        "targets": parse_targets(args.lora_targets) if args.lora_targets is not None else None,
        "dropout": args.lora_dropout,
        "dora": True if args.dora else None,
        "adapter_dtype": args.adapter_dtype,
    }
    options = {k: v for k, v in given.items() if v is not None}
    return LoraConfig(**options) if options else None


def _quant_config(args: argparse.Namespace) -> Any:
    """A QuantConfig when --quant or --no-double-quant is given; None keeps NF4 + double quant."""
    from peakmem.adapters import QuantConfig

    if args.quant is None and not args.no_double_quant:
        return None
    quant = args.quant or "nf4"
    # double quantization is a 4-bit feature (bitsandbytes bnb_4bit_use_double_quant): int8 has none
    return QuantConfig(quant=quant, double_quant=not args.no_double_quant and quant != "int8")


def _gpus(arg: str | None) -> list[Any]:
    if not arg:
        return []
    from peakmem.resolve import resolve_gpu

    return [resolve_gpu(part.strip()) for part in arg.split(",") if part.strip()]


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


def _verdicts(gpus: Sequence[Any], needed: int) -> list[Any]:
    from peakmem.breakdown import Verdict

    return [Verdict(gpu=g.name, capacity_bytes=g.usable_bytes, needed_bytes=needed) for g in gpus]


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
    from peakmem.units import fmt_both

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
        table.add_row(g.name, g.display_name, fmt_both(g.memory_bytes), ", ".join(g.aliases))
    Console().print(table)
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    from peakmem.render import print_info, spec_json

    spec, answered = info_answer(args.model, cross_check=args.cross_check)
    if args.json:
        _emit_json(spec_json(spec, answered))
    else:
        print_info(spec, answered)
    return EXIT_OK


def _measuring() -> Any:
    """What the face hands the estimators: the measuring block-cost lookup where torch and transformers
    are installed (:func:`peakmem.simulate.measuring_lookup`), else None (stored costs only)."""
    from peakmem.simulate import measuring_lookup

    return measuring_lookup()


def _deriver() -> Any:
    """What the face hands :mod:`peakmem.resolve`: a spec deriver where torch and transformers are
    installed (:func:`peakmem.simulate.deriver`), else None."""
    from peakmem.simulate import deriver

    return deriver()


def info_answer(model: str, *, cross_check: bool = False) -> tuple[Any, Any]:
    """``peakmem info``'s spec and which path answered it (:func:`peakmem.resolve.answered_by`): one
    function for the command and the Python API (``peakmem.info``)."""
    from peakmem.resolve import answered_by, resolve_config, spec_for_config

    name, config = resolve_config(model)
    spec = spec_for_config(config, name=name, derive=_deriver())
    return spec, answered_by(config, spec, name=name, cross_check=cross_check, derive=_deriver(),
                             costs=_measuring())  # fmt: skip


def _report(args: argparse.Namespace, est: Any, headline: str, ways: Any = None) -> int:
    """Print an estimate (and the ways down, a planner.WaysDown) as JSON, Markdown or tables."""
    from peakmem.render import answer_json, markdown_estimate, print_estimate, verdicts_of

    gpus = _gpus(getattr(args, "gpu", None))
    verdicts = verdicts_of(est, gpus)
    for note in est.assumptions:
        if note.startswith(WARNING_PREFIX):  # e.g. a context beyond the model's limit
            print(f"peakmem: {note}", file=sys.stderr)
    pairs = ways.pairs() if ways is not None else []
    note = ways.note if ways is not None else ""
    if args.json:
        out = answer_json(est, gpus, ways)
        if (block := _from_block(args)) is not None:
            out["from_file"] = block
        _emit_json(out)
    elif args.markdown:
        sys.stdout.write(markdown_estimate(est, headline, verdicts, pairs, note))
    else:
        print_estimate(est, headline, verdicts, pairs, note)
    if verdicts and not any(v.fits for v in verdicts):
        return EXIT_DOES_NOT_FIT
    return EXIT_OK


def _overheads(args: argparse.Namespace) -> Any:
    """The device overheads: peakmem's named defaults, or a calibrated --profile, unless
    --cuda-context / --fragmentation say."""
    from dataclasses import replace

    from peakmem.formulas.overhead import Overheads
    from peakmem.units import MiB

    given: dict[str, Any] = {}
    if getattr(args, "cuda_context_mib", None) is not None:
        given["context_bytes"] = int(args.cuda_context_mib * MiB)
        given["context_source"] = "--cuda-context-mib"
    if getattr(args, "fragmentation", None) is not None:
        given["fragmentation"] = args.fragmentation
    if getattr(args, "expandable_segments", False):
        given["expandable_segments"] = True
    if getattr(args, "profile", None):
        from peakmem.calibrate import load_profile

        return replace(load_profile(args.profile).overheads(), **given)
    return Overheads(**given)


def json_answer(
    command: str, args: argparse.Namespace, *, spec: Any = None, detail: dict[str, Any] | None = None
) -> tuple[dict[str, Any], int]:
    """The ``--json`` answer of ``peakmem train|infer|fit|plan`` and its exit code: one function, which
    the commands print, the Python API (:mod:`peakmem.api`) returns and the web API serves. ``spec``: a
    ModelSpec already built (the web's pasted config.json) instead of resolving ``args.model``;
    ``detail``: a dict that receives the objects behind a train/infer answer (the page's chart)."""
    from peakmem import planner
    from peakmem.render import answer_json, infer_answer
    from peakmem.resolve import resolve_gpu, resolve_model

    spec = spec if spec is not None else resolve_model(args.model, derive=_deriver())
    if command == "plan":
        report = planner.plan(spec, _training_setup(args, spec.max_position_embeddings),
                              resolve_gpu(args.gpu), args.max_gpus, args.global_batch,
                              overheads=_overheads(args), costs=_measuring())  # fmt: skip
        return planner.plan_json(report), EXIT_OK if report.layouts else EXIT_DOES_NOT_FIT
    gpus = _gpus(args.gpu)
    if command == "fit":
        if not gpus:
            raise InputError("gpu=None: fit needs --gpu NAME|SIZE[,NAME|SIZE...]")
        if args.infer:
            served = planner.fit_inference(
                spec, _inference_setup(args, gpus), gpus, overheads=_overheads(args)
            )
            return planner.fit_inference_json(served), EXIT_OK if served.any_fits else EXIT_DOES_NOT_FIT
        found = planner.fit(spec, _training_setup(args, spec.max_position_embeddings), gpus,
                            overheads=_overheads(args), margin=args.margin, costs=_measuring())  # fmt: skip
        fitted = planner.fit_json(found)
        if (block := _from_block(args)) is not None:
            fitted["from_file"] = block
        return fitted, EXIT_OK if found.any_fits else EXIT_DOES_NOT_FIT
    if command == "infer":
        served_answer = infer_answer(spec, _inference_setup(args, gpus), gpus, _overheads(args))
        if detail is not None:
            detail.update(spec=spec, answer=served_answer)
        verdicts = served_answer.verdicts
        code = EXIT_DOES_NOT_FIT if verdicts and not any(v.fits for v in verdicts) else EXIT_OK
        return served_answer.json, code
    if command != "train":
        raise InputError(f"command={command!r}: one of train, infer, fit, plan")
    setup = _training_setup(args, spec.max_position_embeddings)
    from peakmem.estimate import with_kernel_alternatives

    par = _parallelism(args)
    costs = _measuring()
    answer = planner.train_answer(spec, setup, par, overheads=_overheads(args),
                                  capacity_bytes=_capacity(gpus), costs=costs)  # fmt: skip
    est = with_kernel_alternatives(spec, setup, answer.estimate, gpus, overheads=_overheads(args), par=par,
                                   costs=costs)  # fmt: skip
    if detail is not None:
        detail.update(spec=spec, setup=setup, par=par, answer=answer)
    out = answer_json(est, gpus, answer.ways)
    if (block := _from_block(args)) is not None:
        out["from_file"] = block
    fits = [v.fits for v in _verdicts(gpus, est.device_total_bytes)]
    return out, EXIT_DOES_NOT_FIT if fits and not any(fits) else EXIT_OK


def cmd_train(args: argparse.Namespace) -> int:
    from peakmem.planner import train_answer
    from peakmem.resolve import resolve_model

    spec = resolve_model(args.model, derive=_deriver())
    setup = _training_setup(args, spec.max_position_embeddings)
    par = _parallelism(args)
    if par is not None and args.emit:
        from peakmem.emit import emit

        sys.stdout.write(emit(args.emit, spec, setup, par))
        return EXIT_OK
    gpus = _gpus(args.gpu)
    _notices(gpus, setup)
    from peakmem.estimate import with_kernel_alternatives

    costs = _measuring()
    answer = train_answer(spec, setup, par, overheads=_overheads(args), capacity_bytes=_capacity(gpus),
                          costs=costs)  # fmt: skip
    est = with_kernel_alternatives(spec, setup, answer.estimate, gpus, overheads=_overheads(args), par=par,
                                   costs=costs)  # fmt: skip
    if args.plot:
        from peakmem.plot import plot_training

        path = plot_training(spec, setup, args.plot, gpus=gpus, est=est, ways=answer.ways.pairs())
        print(f"peakmem: wrote {path}", file=sys.stderr)
    headline = train_headline(spec.name, setup, est, par=par)
    if not args.json:
        _print_from_echo(args)
    code = _report(args, est, headline, answer.ways)
    if answer.ranks is not None and not (args.json or args.markdown):
        from peakmem.render import console

        out = console()
        out.print("[bold]per rank[/bold]")
        for line in answer.ranks.summary_lines():
            out.print(f"- {line}")
    return code


def _capacity(gpus: Sequence[Any]) -> int | None:
    """The smallest GPU asked about: the ways down close the gap to it (None: no GPU given)."""
    return min((g.usable_bytes for g in gpus), default=None)


def cmd_plot(args: argparse.Namespace) -> int:
    from peakmem.plot import plot_training
    from peakmem.resolve import resolve_model

    spec = resolve_model(args.model, derive=_deriver())
    setup = _training_setup(args, spec.max_position_embeddings)
    path = plot_training(spec, setup, args.out, gpus=_gpus(args.gpu), kind=args.kind)
    print(f"peakmem: wrote {path}")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from peakmem.errors import InputError
    from peakmem.web import serve

    if not MIN_PORT <= args.port <= MAX_PORT:
        raise InputError(f"--port={args.port}: must be in {MIN_PORT}..{MAX_PORT}")
    _check_port_free(args.host, args.port)
    try:
        serve(host=args.host, port=args.port, open_browser=args.open)
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
    return name, config, _training_setup(args, context_length(config) or DEFAULT_SEQ_LEN)


def cmd_measure(args: argparse.Namespace) -> int:
    _check_steps(args.steps)
    _require_torch_extra("measure")
    from peakmem.measure import measure_training

    name, config, setup = _config_and_setup(args)
    est = measure_training(config, setup, device=args.device, steps=args.steps, model_name=name)
    return _report(args, est, train_headline(name, setup, est, verb="measured"))


def cmd_simulate(args: argparse.Namespace) -> int:
    _check_steps(args.steps)
    _require_torch_extra("simulate")
    from peakmem.simulate import simulate_training

    name, config, setup = _config_and_setup(args)
    est = simulate_training(config, setup, kernels=args.kernels, steps=args.steps, model_name=name)
    return _report(args, est, train_headline(name, setup, est, verb="simulated at"))


def _check_steps(steps: int) -> None:
    from peakmem.validate import check_int

    check_int("--steps", steps, maximum=MAX_STEPS, what="steps; the memory peak settles by step 2")


def _inference_setup(args: argparse.Namespace, gpus: Sequence[Any]) -> Any:
    from peakmem.inference import InferenceSetup

    return InferenceSetup(
        weights=args.weights,
        kv_cache=args.kv_cache,
        batch=args.batch,
        context=args.context,
        prompt=args.prompt,
        engine=args.engine,
        tp=args.tp,
        gpu_bytes=gpus[0].usable_bytes if gpus else None,
        gpu_memory_utilization=args.gpu_memory_utilization,
        n_gpu_layers=args.n_gpu_layers,
        keep_all_logits=args.keep_all_logits,
        strict=args.strict,
    )


def cmd_infer(args: argparse.Namespace) -> int:
    from peakmem.render import infer_answer, markdown_estimate, print_estimate
    from peakmem.resolve import resolve_model

    spec = resolve_model(args.model, derive=_deriver())
    gpus = _gpus(args.gpu)
    _notices(gpus)
    answer = infer_answer(spec, _inference_setup(args, gpus), gpus, _overheads(args))
    est, verdicts = answer.estimate, list(answer.verdicts)
    for note in est.assumptions:
        if note.startswith(WARNING_PREFIX):  # e.g. a context beyond the model's limit
            print(f"peakmem: {note}", file=sys.stderr)
    if args.json:
        _emit_json(answer.json)
    elif args.markdown:
        sys.stdout.write(markdown_estimate(est, answer.headline, verdicts))
    else:
        print_estimate(est, answer.headline, verdicts)
    if verdicts and not any(v.fits for v in verdicts):
        return EXIT_DOES_NOT_FIT
    return EXIT_OK


def cmd_fit(args: argparse.Namespace) -> int:
    from peakmem import planner
    from peakmem.errors import InputError
    from peakmem.render_plan import print_fit, print_fit_inference
    from peakmem.resolve import resolve_model

    if args.gpu:
        _notices(_gpus(args.gpu), None if args.infer else _training_setup(args, DEFAULT_SEQ_LEN))
    if args.json:
        out, code = json_answer("fit", args)
        _emit_json(out)
        return code
    if not args.gpu:
        raise InputError("gpu=None: fit needs --gpu NAME|SIZE[,NAME|SIZE...]")
    spec = resolve_model(args.model, derive=_deriver())
    gpus = _gpus(args.gpu)
    if args.infer:
        report: Any = planner.fit_inference(
            spec, _inference_setup(args, gpus), gpus, overheads=_overheads(args)
        )
        if args.json:
            _emit_json(planner.fit_inference_json(report))
        else:
            print_fit_inference(report)
    else:
        report = planner.fit(spec, _training_setup(args, spec.max_position_embeddings), gpus,
                             overheads=_overheads(args), margin=args.margin, costs=_measuring())  # fmt: skip
        if args.json:
            _emit_json(planner.fit_json(report))
        else:
            _print_from_echo(args)
            print_fit(report)
    return EXIT_OK if report.any_fits else EXIT_DOES_NOT_FIT


def cmd_plan(args: argparse.Namespace) -> int:
    from peakmem import planner
    from peakmem.render_plan import print_plan
    from peakmem.resolve import resolve_gpu, resolve_model

    if args.json:
        out, code = json_answer("plan", args)
        _emit_json(out)
        return code
    spec = resolve_model(args.model, derive=_deriver())
    setup = _training_setup(args, spec.max_position_embeddings)
    report = planner.plan(spec, setup, resolve_gpu(args.gpu), args.max_gpus, args.global_batch,
                          overheads=_overheads(args), costs=_measuring())  # fmt: skip
    if args.json:
        _emit_json(planner.plan_json(report))
    else:
        print_plan(report)
    return EXIT_OK if report.layouts else EXIT_DOES_NOT_FIT


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

    path = Path(value)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"--nvidia-smi-used={value!r}: cannot read it ({err})") from None
    return value


def cmd_explain(args: argparse.Namespace) -> int:
    """Replay a memory snapshot; with --model, put peakmem's prediction next to it."""
    from pathlib import Path

    from peakmem.measure.snapshot import explanation_json, explanation_lines, load_snapshot, replay

    rep = replay(load_snapshot(Path(args.snapshot)), device=args.device)
    est, ways, capacity = None, [], None
    if args.model:
        from peakmem.planner import train_answer
        from peakmem.resolve import resolve_model

        spec = resolve_model(args.model, derive=_deriver())
        setup = _training_setup(args, spec.max_position_embeddings)
        overheads = _overheads(args)
        gpus = _gpus(args.gpu)
        if rep.oom is not None:
            capacity = _capacity(gpus) or rep.oom.capacity_bytes(overheads.context_bytes)
        answer = train_answer(spec, setup, _parallelism(args), overheads=overheads, capacity_bytes=capacity,
                              costs=_measuring())  # fmt: skip
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
def _add_expandable_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--expandable-segments", action="store_true",
        help="model PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (reserved grows by pages; "
        "little fragmentation)",
    )  # fmt: skip


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
    p.set_defaults(handler=cmd_info)

    p = sub.add_parser("train", help="GPU memory to train a model")
    p.add_argument("model", nargs="?", default=None, help="optional with --from FILE naming the model")
    _add_from_option(p)
    _add_train_options(p)
    _add_output_options(p)
    p.add_argument("--plot", metavar="FILE", help="also draw the ways down: .png, .svg or .pdf")
    p.add_argument(
        "--cuda-context-mib", type=float, default=None,
        help="CUDA context as nvidia-smi shows it after torch.ones(1, device='cuda')",
    )  # fmt: skip
    p.add_argument(
        "--fragmentation", type=float, default=None,
        help="allocator fragmentation, a fraction of the per-step churn (default: one-GPU full fine-tuning "
        "replays the step through the caching-allocator model, at least 0.10; elsewhere 0.10)",
    )  # fmt: skip
    p.add_argument("--profile", default=None, help="a calibrated profile (peakmem calibrate)")
    _add_expandable_option(p)
    _add_parallel_options(p)
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("plot", help="memory by technique, or against batch or sequence length")
    p.add_argument("model")
    _add_train_options(p)
    p.add_argument("--gpu", default=None, help="GPU name(s) or size(s) to draw as lines")
    p.add_argument("--kind", default="ways", choices=("ways", "batch", "seq"))
    p.add_argument("-o", "--out", required=True, metavar="FILE", help=".png, .svg or .pdf")
    p.set_defaults(handler=cmd_plot)

    p = sub.add_parser("measure", help="run real training steps and measure their memory")
    p.add_argument("model")
    _add_train_options(p)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--steps", type=int, default=2)
    _add_output_options(p)
    p.set_defaults(handler=cmd_measure)

    p = sub.add_parser("simulate", help="run the real model under fake tensors: exact, no GPU needed")
    p.add_argument("model")
    _add_train_options(p)
    p.add_argument("--kernels", default="cuda", choices=("cuda", "cpu"), help="whose kernels allocate")
    p.add_argument("--steps", type=int, default=2)
    _add_output_options(p)
    p.set_defaults(handler=cmd_simulate)

    p = sub.add_parser("infer", help="GPU memory to serve a model")
    p.add_argument("model")
    p.add_argument("--batch", type=int, default=1, help="concurrent sequences")
    _add_infer_options(p)
    p.add_argument("--profile", default=None, help="a calibrated profile (peakmem calibrate)")
    _add_expandable_option(p)
    _add_output_options(p)
    p.set_defaults(handler=cmd_infer)

    p = sub.add_parser("fit", help="verdict per GPU and the ranked changes that make it fit")
    p.add_argument("model", nargs="?", default=None, help="optional with --from FILE naming the model")
    _add_from_option(p)
    _add_train_options(p)
    p.add_argument("--infer", action="store_true", help="fit a serving job instead of training")
    p.add_argument("--profile", default=None, help="a calibrated profile (peakmem calibrate; training)")
    p.add_argument(
        "--margin", action="store_true",
        help="rank changes that make it fit with margin: the band's high end fits ('fits', not 'tight')",
    )  # fmt: skip
    _add_expandable_option(p)
    _add_infer_options(p)
    _add_output_options(p)
    p.set_defaults(handler=cmd_fit)

    p = sub.add_parser(
        "plan", help="the fastest parallel layout that fits, up to N GPUs",
        description="Search data, tensor, pipeline, context (long sequences) and expert (MoE) parallel "
        "degrees, the ZeRO stage or FSDP, checkpointing and micro-batch; rank the layouts by the "
        "step-time model and show the fastest that fit, with per-rank memory.",
    )  # fmt: skip
    p.add_argument("model")
    _add_train_options(p)
    p.add_argument("--max-gpus", type=int, required=True, help="the most GPUs to use")
    p.add_argument("--global-batch", type=int, default=None, help="sequences per optimizer step")
    _add_expandable_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--gpu", required=True, help="GPU name or size")
    p.add_argument("--profile", default=None, help="a calibrated profile (peakmem calibrate)")
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
    _add_train_options(p)
    p.add_argument("--device", type=int, default=None, help="which CUDA device (default: busiest trace)")
    p.add_argument("--gpu", default=None, help="the GPU it ran on (OOM: the capacity to fit)")
    p.add_argument("--profile", default=None, help="a calibrated profile (peakmem calibrate)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _add_parallel_options(p)
    p.set_defaults(handler=cmd_explain)

    p = sub.add_parser("serve", help="local web page and JSON API (needs peakmem[web])")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
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
        if abs(value) > MAX_CLI_NUMBER:
            raise InputError(f"{flag}={value!r}: too large (more than {MAX_CLI_NUMBER:,})")


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
        if getattr(args, "from_file", None):
            _apply_from(args, _explicit_dests(sys.argv[1:] if argv is None else argv))
        elif getattr(args, "command", None) in ("train", "fit") and args.model is None:
            raise InputError(f"MODEL: peakmem {args.command} needs a model (or --from FILE naming one)")
        _check_numbers(args)
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
