"""The shared pieces of the ``--from`` mappers: the result types (:class:`Field`, :class:`FromFile`), the
per-document collector (:class:`_Mapper`), value conversions that name file and key on a bad value, and
:func:`take`, the one reading of "a key, converted, sets a CLI dest" that the framework mappers share."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peakmem.errors import InputError

AXOLOTL = "axolotl"
LLAMA_FACTORY = "llama-factory"
TORCHTUNE = "torchtune"
HF_TRAINER = "transformers/trl"
DEEPSPEED = "deepspeed"
ACCELERATE = "accelerate"
VERL = "verl"
OPENRLHF = "openrlhf"
TORCHTITAN = "torchtitan"
FORMATS = (AXOLOTL, LLAMA_FACTORY, TORCHTUNE, HF_TRAINER, DEEPSPEED, ACCELERATE, VERL, OPENRLHF, TORCHTITAN)
AUTO = "auto"  # HF Trainer fills DeepSpeed "auto" values from TrainingArguments (integrations/deepspeed.py)


@dataclass(frozen=True)
class Field:
    """One mapped field: peakmem's name, the value, the ``file:key`` it came from (and a note)."""

    field: str
    value: Any
    source: str
    note: str = ""

    def json(self) -> dict[str, Any]:
        out = {"field": self.field, "value": self.value, "from": self.source}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class FromFile:
    """What ``--from`` read: the detected formats, the CLI options it sets (by argparse ``dest``), the
    echo, the keys not modelled, and the kernel flags a framework profile may use."""

    files: tuple[str, ...]
    formats: tuple[str, ...]
    options: dict[str, Any]
    mapped: tuple[Field, ...]
    not_modelled: tuple[str, ...]
    notes: tuple[str, ...] = ()
    # Hook for framework profiles (unsloth, Liger, torch.compile): flags the file turns on, e.g.
    # {"liger": ["rms_norm", "swiglu", "rope", "fused_linear_cross_entropy"], "compile": True,
    #  "offloaded_checkpointing": True, "unsloth": [...]}. peakmem maps what it models (loss="fused",
    # activation offload); the rest waits for a profile and is listed in not_modelled.
    kernels: dict[str, Any] = field(default_factory=dict)
    parallel: dict[str, Any] = field(default_factory=dict)  # Parallelism fields the CLI has no flag for
    global_batch: tuple[int, str] | None = None  # DeepSpeed train_batch_size and its file:key

    @property
    def format(self) -> str:
        return " + ".join(self.formats)

    def json(self, overridden: Sequence[Field] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {
            "files": list(self.files),
            "format": self.format,
            "mapped": [f.json() for f in self.mapped],
            "not_modelled": list(self.not_modelled),
            "notes": list(self.notes),
            "kernels": dict(self.kernels),
        }
        if overridden:
            out["overridden"] = [f.json() for f in overridden]
        return out

    def echo_lines(self, overridden: Sequence[Field] = ()) -> list[str]:
        lines = [f"from {', '.join(self.files)} (detected: {self.format}):"]
        by_field = {f.field: f for f in overridden}
        for f in self.mapped:
            shown = f.value if not isinstance(f.value, bool) else str(f.value).lower()
            line = f"  {f.field} = {shown}  <- {f.source}"
            if f.note:
                line += f" ({f.note})"
            if f.field in by_field:
                line += f"  [overridden by the command line: {by_field[f.field].value}]"
            lines.append(line)
        lines.extend(f"  not modelled: {item}" for item in self.not_modelled)
        lines.extend(f"  note: {item}" for item in self.notes)
        return lines


FIELD_OF = {  # CLI dest -> the name shown in the echo (the flag without dashes); the echo's order
    "model": "model",
    "method": "method",
    "precision": "precision",
    "optimizer": "optimizer",
    "optimizer_impl": "optimizer-impl",
    "batch": "batch",
    "seq": "seq",
    "padded_lengths": "padded-lengths",
    "grad_accum": "grad-accum",
    "grad_sync": "grad-sync",
    "fsdp_reduce_dtype": "fsdp-reduce-dtype",
    "checkpointing": "checkpointing",
    "attention": "attention",
    "framework": "framework",
    "lora_rank": "lora-rank",
    "lora_alpha": "lora-alpha",
    "lora_targets": "lora-targets",
    "lora_target_parameters": "lora-target-parameters",
    "lora_dropout": "lora-dropout",
    "dora": "dora",
    "adapter_dtype": "adapter-dtype",
    "quant": "quant",
    "no_double_quant": "no-double-quant",
    "kbit_prep": "kbit-prep",
    "loss": "loss",
    "optimizer_in_backward": "optimizer-in-backward",
    "activation_offload": "activation-offload",
    "gpus": "gpus",
    "cp": "cp",
    "ulysses": "ulysses",
    "tiled_mlp": "tiled-mlp",
    "tiled_mlp_shards": "tiled-mlp-shards",
    "zero": "zero",
    "fsdp": "fsdp",
    "fsdp_version": "fsdp-version",
    "offload": "offload",
    "offload_params": "offload-params",
    "gpus_per_node": "gpus-per-node",
    "max_tokens_per_gpu": "max-tokens-per-gpu",
    "objective": "objective",
    "reference": "reference",
    "teacher": "teacher",
    "beta": "beta",
    "rollout": "rollout",
    "rollout_memory": "rollout-memory",
    "rollout_sleep": "rollout-sleep",
    "num_generations": "num-generations",
    "completion": "completion",
    "steps_per_generation": "steps-per-generation",
    "critic": "critic",
    "entropy": "entropy",
    "reward_model": "reward-model",
}
LORA_DESTS = ("lora_rank", "lora_alpha", "lora_targets", "lora_target_parameters", "lora_dropout", "dora",
              "adapter_dtype")  # fmt: skip
QUANT_DESTS = ("quant", "no_double_quant", "kbit_prep")


class _Mapper:
    """Collects options with their sources for one document (``name``), then merges."""

    def __init__(self, name: str, *, strict: bool = False) -> None:
        self.name = name
        self.strict = strict  # a value peakmem cannot model is an error (PeakmemCallback), not a skip
        self.options: dict[str, Any] = {}
        self.fields: dict[str, Field] = {}
        self.extra_fields: list[Field] = []
        self.not_modelled: list[str] = []
        self.notes: list[str] = []
        self.kernels: dict[str, Any] = {}
        self.parallel: dict[str, Any] = {}
        self.half: tuple[str, str] | None = None  # ("bf16"|"fp16", source) from the precision flags
        self.deepspeed = False  # a DeepSpeed engine config was read
        self.fp32_default: str | None = (
            None  # HF-family file with no precision flag: fp32 unless another says
        )
        self.global_batch: tuple[int, str] | None = None  # DeepSpeed train_batch_size and its source
        # GPUs a parallel degree in the file implies (axolotl context_parallel_size): used by the merge
        # only where no file gives the number of GPUs
        self.implied_gpus: Field | None = None
        # dests set from a framework's default (the optimizer a file leaves out): another file's value
        # wins over them, whichever comes first
        self.defaults: set[str] = set()
        # file fields filled from the default of the framework version the file is run with (an open-r1
        # recipe's TRL): the field -> the source shown for it
        self.defaults_from: dict[str, str] = {}

    def src(self, key: str) -> str:
        return f"{self.name}:{key}"

    def set(self, dest: str, value: Any, key: str, note: str = "", *, keep: bool = False) -> None:
        """Set ``dest`` from ``key`` (``keep``: only when not already set)."""
        if keep and dest in self.options:
            return
        self.options[dest] = value
        source = key if ":" in key or key.startswith("(") else self.src(key)
        self.fields[dest] = Field(FIELD_OF.get(dest, dest), value, source, note)

    def info(self, name: str, value: Any, key: str, note: str = "") -> None:
        """A field echoed for the record that sets no option (packing, global batch, ...)."""
        source = key if ":" in key or key.startswith("(") else self.src(key)
        self.extra_fields.append(Field(name, value, source, note))

    def skip(self, key: str, value: Any, why: str = "") -> None:
        self.not_modelled.append(f"{self.src(key)} = {_short(value)}" + (f": {why}" if why else ""))

    def unknown(self, key: str, value: Any, why: str, modelled: Sequence[str]) -> None:
        """A value the setup depends on that peakmem has no model of: skipped (peakmem's default counted
        instead) or, ``strict``, an error naming the field, the value and what is modelled."""
        if self.strict:
            raise InputError(f"{self.name}.{key}={value!r}: not modelled by peakmem "
                             f"(modelled: {', '.join(modelled)})")  # fmt: skip
        self.skip(key, value, why)

    def kernel(self, name: str, flag: Any) -> None:
        if isinstance(flag, str):
            self.kernels.setdefault(name, [])
            if flag not in self.kernels[name]:
                self.kernels[name].append(flag)
        else:
            self.kernels[name] = flag


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- value conversions: (mapper, key, value) -> the value, or None where the file leaves it open -------
def truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "auto", "on")
    return bool(value)


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def as_int(m: _Mapper, key: str, value: Any) -> int | None:
    """An integer field; ``auto``/``null`` -> None; anything else names file and key."""
    if value is None or is_auto(value):
        return None
    if isinstance(value, bool):
        raise InputError(f"--from {m.name}: {key}={value!r}: must be a whole number")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if number.is_integer():
                return int(number)
    raise InputError(f"--from {m.name}: {key}={value!r}: must be a whole number")


def as_float(m: _Mapper, key: str, value: Any) -> float | None:
    if value is None or is_auto(value):
        return None
    if isinstance(value, bool):
        raise InputError(f"--from {m.name}: {key}={value!r}: must be a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"--from {m.name}: {key}={value!r}: must be a number") from None


def as_bool(m: _Mapper, key: str, value: Any) -> bool | None:
    return None if value is None else truthy(value)


def as_checkpointing(m: _Mapper, key: str, value: Any) -> str | None:
    """An on/off activation-checkpointing flag -> peakmem's ``full`` / ``none``."""
    return None if value is None else ("full" if truthy(value) else "none")


def as_offload_device(m: _Mapper, key: str, value: Any) -> str | None:
    """A DeepSpeed offload device: ``cpu`` / ``nvme`` (anything else, ``none`` included, offloads nothing)."""
    return value.lower() if isinstance(value, str) and value.lower() in ("cpu", "nvme") else None


def get(doc: Mapping[str, Any], dotted: str) -> Any:
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def leaves(doc: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every leaf of a nested document as (dotted key, value), the keys :func:`get` reads."""
    out: list[tuple[str, Any]] = []
    for key, value in doc.items():
        dotted = f"{prefix}{key}"
        out.extend(leaves(value, dotted + ".") if isinstance(value, Mapping) else [(dotted, value)])
    return out


def names_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.replace(" ", ",").split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return []


def packed_rows(samples: int, seq: int, budget: int, multiple: int) -> tuple[int, str]:
    """The packed micro-batches (rows of ``budget`` tokens, verl ``use_dynamic_bsz`` / OpenRLHF
    ``dynamic_batch_enable``) that one rank's ``samples`` of up to ``seq`` tokens fill at most, rounded up
    to a multiple of ``multiple`` (peakmem's generation batch holds whole groups of completions), and the
    arithmetic."""
    rows = max(1, -(-samples * seq // budget))
    rounded = -(-rows // multiple) * multiple
    note = f"{samples} samples x {seq} tokens per rank in rows of {budget}: {rows} rows"
    return rounded, note + (f", rounded up to a multiple of n {multiple}" if rounded != rows else "")


Converter = Callable[[_Mapper, str, Any], Any]


@dataclass(frozen=True)
class Row:
    """One row of a mapping table: the file's (dotted) ``key``, converted, sets the CLI ``dest``."""

    key: str
    dest: str
    convert: Converter
    note: str = ""
    keep: bool = False  # only where an earlier key did not set ``dest`` (a DeepSpeed file's batch)


def take(m: _Mapper, doc: Mapping[str, Any], rows: Sequence[Row], prefix: str = "") -> None:
    """Each row whose key ``doc`` holds (``prefix``: where ``doc`` sits in the file, for sources and
    errors) sets its dest from the converted value; a key absent, ``null`` or ``auto`` sets nothing."""
    for row in rows:
        value = row.convert(m, prefix + row.key, get(doc, row.key))
        if value is not None:
            m.set(row.dest, value, prefix + row.key, row.note, keep=row.keep)
