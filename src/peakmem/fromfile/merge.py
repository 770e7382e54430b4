"""``--from`` end to end: read the files (:func:`read_from_files`), map each document with its framework's
mapper (:func:`map_documents`), merge them (a later file's value wins; DeepSpeed's engine decides the
precision; DeepSpeed's global batch gives the missing one of micro-batch and GPUs) and apply the result
to the command line's namespace where the user gave no option (:func:`apply`, :func:`load_and_apply`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from peakmem.errors import InputError
from peakmem.fromfile.accelerate import map_accelerate
from peakmem.fromfile.axolotl import map_axolotl
from peakmem.fromfile.deepspeed import map_deepspeed
from peakmem.fromfile.documents import (
    deepspeed_refs,
    detect_format,
    find_referenced,
    load_document,
    local_model_dirs,
)
from peakmem.fromfile.hf_trainer import map_hf, training_arguments
from peakmem.fromfile.llama_factory import map_llama_factory
from peakmem.fromfile.mapper import (
    AXOLOTL,
    DEEPSPEED,
    FIELD_OF,
    HF_TRAINER,
    LLAMA_FACTORY,
    LORA_DESTS,
    OPENRLHF,
    QUANT_DESTS,
    TORCHTITAN,
    TORCHTUNE,
    VERL,
    Field,
    FromFile,
    _Mapper,
)
from peakmem.fromfile.openrlhf import map_openrlhf
from peakmem.fromfile.torchtitan import map_torchtitan
from peakmem.fromfile.torchtune import map_torchtune
from peakmem.fromfile.verl import map_verl


def read_from_files(paths: Sequence[str | os.PathLike[str]], gpus: int | None = None) -> FromFile:
    """Read each file (and the DeepSpeed JSON each names), then map them all (:func:`map_documents`;
    ``gpus``: the command line's, for a file that leaves the world size to the launcher).
    A DeepSpeed path a file names that does not resolve is an error unless a DeepSpeed JSON was given
    with another ``--from``: then that one is the file meant (a recipe names the path on the machine it
    was written for), and the echo says so."""
    given = [(Path(path), load_document(path)) for path in paths]
    ds_given = [str(p) for p, doc in given if _is_deepspeed(doc)]
    docs: list[tuple[str, dict[str, Any]]] = []
    notes: list[str] = []
    for p, doc in given:
        docs.append((str(p), doc))
        for key, ref in deepspeed_refs(doc):
            named = find_referenced(ref, p.parent)
            if named is not None:
                docs.append((str(named), load_document(named)))
            elif ds_given:
                notes.append(
                    f"{p}:{key} = {ref}: no such file; matched to the DeepSpeed file given: "
                    + ", ".join(ds_given)
                )
            else:
                raise InputError(
                    f"--from {p}: {key}={ref!r}: no such file (looked relative to {p.parent}, "
                    "the folders above it and the current directory)"
                )
    found = map_documents(docs, local_model_dirs(docs), gpus=gpus)
    return replace(found, notes=(*found.notes, *notes)) if notes else found


def _is_deepspeed(doc: Mapping[str, Any]) -> bool:
    try:
        return detect_format(doc) == DEEPSPEED
    except InputError:
        return False  # map_documents names the file it cannot place


def map_training_arguments(
    doc: Mapping[str, Any],
    *,
    name: str = "TrainingArguments",
    model: str,
    method: str,
    weights: tuple[str, str] | None,
    gpus: tuple[int, str] | None = None,
    strict: bool = False,
) -> FromFile:
    """A live ``TrainingArguments.to_dict()`` (with ``deepspeed`` the resolved config dict and
    ``attn_implementation`` the model's) through the same mapping ``--from`` uses. What only the live
    objects know is given: ``model`` (its name), ``method`` (peft adapter / quantized base), ``weights``
    (the dtype the parameters are in, and where that was read), ``gpus`` (the number of processes and
    where that was read; it checks DeepSpeed's global batch). ``strict``: an optimizer or attention
    kernel peakmem has no model of is an error instead of a skip."""
    m = _Mapper(name, strict=strict)
    m.set("model", model, "(the Trainer's model)")
    m.set("method", method, "(the Trainer's model)")
    if gpus is not None:
        m.set("gpus", gpus[0], f"({gpus[1]})")
    training_arguments(m, doc, weights)
    return _merge([(name, doc)], [HF_TRAINER], [m])


def map_documents(
    docs: Sequence[tuple[str, Mapping[str, Any]]],
    local_dirs: Mapping[str, str] | None = None,
    *,
    gpus: int | None = None,
) -> FromFile:
    """Map parsed config documents (``(name, dict)``, in order: a later file's value wins) onto
    peakmem's CLI options. Pure: no file I/O (``local_dirs``: torchtune checkpoint folders that hold a
    config.json, found by the reader; ``gpus``: the command line's ``--gpus``, which a torchtitan file
    with ``data_parallel_shard_degree = -1`` needs)."""
    if not docs:
        raise InputError("--from: no file given")
    mappers: list[_Mapper] = []
    formats: list[str] = []
    for name, doc in docs:
        fmt = detect_format(doc)
        formats.append(fmt)
        m = _Mapper(name)
        mappers.append(m)
        if fmt == AXOLOTL:
            map_axolotl(m, doc)
        elif fmt == LLAMA_FACTORY:
            map_llama_factory(m, doc)
        elif fmt == HF_TRAINER:
            map_hf(m, doc)
        elif fmt == TORCHTUNE:
            map_torchtune(m, doc, local_dirs or {})
        elif fmt == DEEPSPEED:
            map_deepspeed(m, doc, "")
        elif fmt == VERL:
            map_verl(m, doc)
        elif fmt == OPENRLHF:
            map_openrlhf(m, doc)
        elif fmt == TORCHTITAN:
            map_torchtitan(m, doc, gpus)
        else:
            map_accelerate(m, doc)
    return _merge(docs, formats, mappers)


def _merge(
    docs: Sequence[tuple[str, Mapping[str, Any]]], formats: Sequence[str], mappers: Sequence[_Mapper]
) -> FromFile:
    options: dict[str, Any] = {}
    fields: dict[str, Field] = {}
    extra: list[Field] = []
    not_modelled: list[str] = []
    notes: list[str] = []
    kernels: dict[str, Any] = {}
    parallel: dict[str, Any] = {}
    half: tuple[str, str] | None = None
    deepspeed = False
    global_batch: tuple[int, str] | None = None
    implied_gpus: Field | None = None
    fp32_default: str | None = None
    for m, fmt in zip(mappers, formats, strict=True):
        for dest, value in m.options.items():
            # A DeepSpeed file's batch, accumulation and optimizer never override the training file's
            # own (HF Trainer fills DeepSpeed's values from its arguments and refuses a mismatch).
            # Its optimizer section does win: DeepSpeed builds that optimizer (deepspeed.py).
            if dest in options and dest in m.defaults:
                continue  # a framework's default never overrides another file's value
            if dest in options and fmt == DEEPSPEED and dest in ("batch", "grad_accum"):
                if options[dest] != value:
                    notes.append(
                        f"{m.fields[dest].source} = {value} differs from {fields[dest].source} = "
                        f"{options[dest]}; HF Trainer refuses the mismatch; using the latter"
                    )
                continue
            options[dest] = value
            fields[dest] = m.fields[dest]
        extra.extend(m.extra_fields)
        not_modelled.extend(m.not_modelled)
        notes.extend(m.notes)
        for k, v in m.kernels.items():
            if isinstance(v, list):
                kernels.setdefault(k, [])
                kernels[k].extend(x for x in v if x not in kernels[k])
            else:
                kernels[k] = v
        parallel.update(m.parallel)
        half = half or m.half
        deepspeed = deepspeed or m.deepspeed
        global_batch = m.global_batch or global_batch
        implied_gpus = m.implied_gpus or implied_gpus
        fp32_default = fp32_default or m.fp32_default
    if deepspeed and half is not None:
        # DeepSpeed's bf16/fp16 engine: 16-bit weights and grads, fp32 master weights and optimizer states
        # (deepspeed/runtime/bf16_optimizer.py, zero/stage_1_and_2.py, zero/stage3.py).
        precision = f"mixed-{half[0]}"
        options["precision"] = precision
        fields["precision"] = Field(
            "precision",
            precision,
            half[1],
            "DeepSpeed engine: 16-bit weights and grads, fp32 master weights and states",
        )
    elif half is not None and "precision" not in options:
        precision = f"amp-{half[0]}"
        options["precision"] = precision
        fields["precision"] = Field("precision", precision, half[1], "autocast over fp32 weights")
    elif fp32_default is not None and "precision" not in options:
        options["precision"] = "fp32"
        fields["precision"] = Field("precision", "fp32", fp32_default, "fp32 weights, no autocast")
    if global_batch is not None:
        _split_global_batch(global_batch, options, fields, notes)
    if implied_gpus is not None and "gpus" not in options:  # no file gives them otherwise
        options["gpus"] = implied_gpus.value
        fields["gpus"] = implied_gpus
    if "gpus" not in options and (options.get("zero") or options.get("fsdp") not in (None, "none")):
        notes.append("the number of GPUs is not in the file(s): give --gpus N (1 is assumed)")
    if "model" not in options:
        notes.append("no model in the file(s): give MODEL on the command line")
    ordered = [fields[d] for d in FIELD_OF if d in fields] + [
        f for d, f in fields.items() if d not in FIELD_OF
    ]
    ordered += extra
    return FromFile(
        files=tuple(name for name, _ in docs),
        formats=tuple(formats),
        options=options,
        mapped=tuple(ordered),
        not_modelled=tuple(not_modelled),
        notes=tuple(notes),
        kernels=kernels,
        parallel=parallel,
        global_batch=global_batch,
    )


def _split_global_batch(
    global_batch: tuple[int, str], options: dict[str, Any], fields: dict[str, Field], notes: list[str]
) -> None:
    """DeepSpeed's train_batch_size = micro-batch x accumulation x GPUs: derive the missing one."""
    total, source = global_batch
    micro, accum, gpus = options.get("batch"), options.get("grad_accum", 1), options.get("gpus")
    if micro is not None and gpus is None:
        world, rest = divmod(total, micro * accum)
        if rest or world < 1:
            raise InputError(
                f"--from {source}={total}: not micro-batch {micro} x accumulation {accum} x GPUs"
            )
        options["gpus"] = world
        fields["gpus"] = Field("gpus", world, source, f"{total} / ({micro} x {accum})")
    elif micro is None and gpus is not None:
        per, rest = divmod(total, accum * gpus)
        if rest or per < 1:
            raise InputError(f"--from {source}={total}: not micro-batch x accumulation {accum} x GPUs {gpus}")
        options["batch"] = per
        fields["batch"] = Field("batch", per, source, f"{total} / ({accum} x {gpus})")
    elif micro is not None and gpus is not None and micro * accum * gpus != total:
        notes.append(
            f"{source} = {total} != micro-batch {micro} x accumulation {accum} x GPUs {gpus}; "
            "DeepSpeed refuses it"
        )


# --- applying to the command line's namespace ------------------------------------------------------
ROLE_DESTS = ("critic", "reward_model")  # models beside the policy (PPO's critic, a reward model)


def apply(args: Any, found: FromFile, explicit: set[str]) -> tuple[FromFile, list[Field]]:
    """Set on ``args`` every option the file gives that the command line did not (``explicit``: the
    argparse dests the user typed). Returns the mapping (with a micro-batch derived from DeepSpeed's
    global batch and the command line's GPUs, if any) and the file's fields the command line overrode."""
    overridden: list[Field] = []
    method = getattr(args, "method", None) if "method" in explicit else None
    by_dest = {dest: f for dest in found.options for f in found.mapped if f.field == FIELD_OF.get(dest, dest)}
    unasked: list[str] = []
    for dest, value in found.options.items():
        if not hasattr(args, dest):
            if dest in ROLE_DESTS:
                unasked.append(f"{by_dest[dest].source} = {value}: {dest} is not an option of this command")
            continue
        if method == "full" and dest in LORA_DESTS + QUANT_DESTS:
            continue  # --method full drops the file's adapter options
        if method == "lora" and dest in QUANT_DESTS:
            continue
        if dest in explicit:
            if dest in by_dest:
                overridden.append(Field(by_dest[dest].field, getattr(args, dest), "command line"))
            continue
        setattr(args, dest, value)
    if unasked:  # a role the file names that the answer cannot hold: said, never dropped silently
        found = replace(found, not_modelled=(*found.not_modelled, *unasked))
    if found.parallel:
        args.from_parallel = dict(found.parallel)
    if found.global_batch is not None and "batch" not in found.options and "batch" not in explicit:
        total, source = found.global_batch
        accum, gpus = int(getattr(args, "grad_accum", 1)), int(getattr(args, "gpus", 1))
        per, rest = divmod(total, accum * gpus)
        if rest or per < 1:
            raise InputError(
                f"--from {source}={total}: not a whole micro-batch per GPU with accumulation {accum} and "
                f"{gpus} GPU(s) (train_batch_size = micro-batch x accumulation x GPUs); "
                "give --batch or --gpus"
            )
        args.batch = per
        derived = Field("batch", per, source, f"{total} / ({accum} accumulation x {gpus} GPUs)")
        found = replace(found, mapped=(*found.mapped, derived))
    return found, overridden


def _drop_answered_notes(found: FromFile, explicit: set[str]) -> FromFile:
    """Notes asking for an option the command line gave are answered: leave them out of the echo."""
    asks = {"gpus": "give --gpus", "model": "give MODEL", "seq": "give --seq"}
    answered = tuple(text for dest, text in asks.items() if dest in explicit)
    notes = tuple(n for n in found.notes if not any(a in n for a in answered))
    return replace(found, notes=notes)


def load_and_apply(args: Any, explicit: set[str], reader: Callable[..., FromFile] = read_from_files) -> None:
    """``--from`` for the CLI and the Python API: read the files (``reader(paths, gpus=...)``, with the
    ``--gpus`` the command line gave), set ``args``, keep the echo on it."""
    paths = args.from_file if isinstance(args.from_file, (list, tuple)) else [args.from_file]
    gpus = getattr(args, "gpus", None) if "gpus" in explicit else None
    found = _drop_answered_notes(reader([str(p) for p in paths], gpus=gpus), explicit)
    found, overridden = apply(args, found, explicit)
    args.from_result = found
    args.from_overridden = overridden
    if getattr(args, "model", None) is None:
        why = next((f" ({n.split('; give MODEL')[0]})" for n in found.notes if "; give MODEL (" in n), "")
        raise InputError(
            f"MODEL: {', '.join(found.files)} names no model{why}; give MODEL on the command line"
        )
