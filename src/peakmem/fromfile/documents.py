"""Reading ``--from`` documents: the size cap, JSON, TOML (torchtitan) or YAML (PyYAML, the ``yaml``
extra), the files a config names (a DeepSpeed JSON, a torchtune checkpoint folder), and which framework
wrote a document. The only I/O of ``--from``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peakmem.errors import InputError
from peakmem.fromfile import openrlhf, torchtitan, verl
from peakmem.fromfile.mapper import (
    ACCELERATE,
    AXOLOTL,
    DEEPSPEED,
    FORMATS,
    HF_TRAINER,
    LLAMA_FACTORY,
    OPENRLHF,
    TORCHTITAN,
    TORCHTUNE,
    VERL,
)
from peakmem.fromfile.script import read_command
from peakmem.userfiles import parse_json, parse_toml, parse_yaml, read_user_text

MAX_FILE_BYTES = 1 << 20  # a training config is a few KiB; refuse anything past 1 MiB
YAML_SUFFIXES = (".yaml", ".yml")
TOML_SUFFIXES = (".toml",)  # torchtitan's train_configs
SCRIPT_SUFFIXES = (".sh", ".bash")  # launch scripts (verl, OpenRLHF): read, never run


def load_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's top-level mapping: JSON, TOML, or YAML (needs PyYAML). Errors name the file."""
    p = Path(path)
    text = read_user_text(p, what="a training config", max_bytes=MAX_FILE_BYTES, label="--from")
    return parse_document(text, str(p))


def parse_document(text: str, name: str) -> dict[str, Any]:
    """Parse JSON (``.json``, or text starting with ``{``), TOML (``.toml``), a launch script (``.sh``, a
    ``#!`` line, or text naming a verl / OpenRLHF entry point outside a ``.json`` / ``.yaml`` / ``.toml``
    file) or YAML; ``name`` is for errors."""
    doc: Any
    lower = name.lower()
    if lower.endswith(TOML_SUFFIXES):
        return parse_toml(text, f"--from {name}")
    if (
        lower.endswith(SCRIPT_SUFFIXES)
        or text.startswith("#!")
        or (not lower.endswith((".json", *YAML_SUFFIXES)) and any(mark in text for mark in SCRIPT_MARKERS))
    ):
        return parse_script(text, name)
    if lower.endswith(".json") or text.lstrip().startswith("{"):
        try:
            doc = parse_json(text)
        except json.JSONDecodeError as e:
            raise InputError(
                f"--from {name}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
            ) from None
        except ValueError as e:  # nested too deeply, an integer of too many digits
            raise InputError(f"--from {name}: invalid JSON: {e}") from None
    else:
        doc = parse_yaml(text, f"--from {name}")
    if not isinstance(doc, dict):
        raise InputError(f"--from {name}: the top level must be a mapping of keys, not {type(doc).__name__}")
    return doc


SCRIPT_MARKERS = (verl.MODULE, *openrlhf.MODULES, *openrlhf.OTHER_MODULES)


def parse_script(text: str, name: str) -> dict[str, Any]:
    """A launch script's training command as a document: verl's overrides nested as its YAML, OpenRLHF's
    flags under ``flags``; an error when it runs neither."""
    command = read_command(text, name, SCRIPT_MARKERS)
    if command is None:
        raise InputError(
            f"--from {name}: a shell script that runs no training command peakmem reads "
            f"(looked for: python -m {', '.join((verl.MODULE, *openrlhf.MODULES))})"
        )
    if command.module == verl.MODULE:
        return verl.overrides_document(command, name)
    return openrlhf.flags_document(command, name)


def find_referenced(ref: str, base: Path) -> Path | None:
    """A file another config names (``deepspeed: path``): relative to the referring file's folder, then
    to each folder above it (LLaMA-Factory and axolotl examples name paths from their repository's
    root), then to the current directory."""
    p = Path(ref).expanduser()
    if p.is_absolute():
        return p if p.is_file() else None
    for folder in (base, *base.parents, Path.cwd()):
        candidate = folder / p
        if candidate.is_file():
            return candidate
    return None


def local_model_dirs(docs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """torchtune checkpoint folders that hold a config.json (then the folder itself is the model)."""
    out: dict[str, str] = {}
    for _, doc in docs:
        ckpt = doc.get("checkpointer")
        folder = ckpt.get("checkpoint_dir") if isinstance(ckpt, dict) else None
        if isinstance(folder, str) and (Path(folder).expanduser() / "config.json").is_file():
            out[folder] = str(Path(folder).expanduser())
    return out


def deepspeed_refs(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, path) of DeepSpeed JSON files a document names."""
    refs: list[tuple[str, str]] = []
    ds = doc.get("deepspeed")
    if isinstance(ds, str) and ds.strip():
        refs.append(("deepspeed", ds.strip()))
    acc = doc.get("deepspeed_config")
    if isinstance(acc, dict):
        ref = acc.get("deepspeed_config_file")
        if isinstance(ref, str) and ref.strip() and ref.strip().lower() != "none":
            refs.append(("deepspeed_config.deepspeed_config_file", ref.strip()))
    return refs


def detect_format(doc: Mapping[str, Any]) -> str:
    """Which framework's file this is, from its keys; an error lists what was looked for."""
    keys = set(doc)
    if torchtitan.is_torchtitan(doc):
        return TORCHTITAN
    if verl.is_verl(doc):
        return VERL
    if openrlhf.is_openrlhf(doc):
        return OPENRLHF
    if "distributed_type" in keys or "compute_environment" in keys:
        return ACCELERATE
    if keys & {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"} and not keys & {
        "base_model",
        "model_name_or_path",
        "model",
        "per_device_train_batch_size",
    }:
        return DEEPSPEED
    if any(isinstance(v, dict) and "_component_" in v for v in doc.values()):
        return TORCHTUNE
    if keys & {"base_model", "micro_batch_size", "sequence_len", "adapter", "sample_packing"}:
        return AXOLOTL
    if keys & {"finetuning_type", "cutoff_len", "lora_target", "quantization_bit", "template", "stage"}:
        return LLAMA_FACTORY
    if keys & {
        "per_device_train_batch_size",
        "model_name_or_path",
        "output_dir",
        "gradient_accumulation_steps",
        "optim",
        "max_seq_length",
        "max_length",
        "use_peft",
    }:
        return HF_TRAINER
    raise InputError(
        f"--from: cannot tell which framework wrote this file "
        f"(keys: {', '.join(sorted(map(str, keys))[:12])}); "
        f"peakmem reads {', '.join(FORMATS)} configs"
    )
