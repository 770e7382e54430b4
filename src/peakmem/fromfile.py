"""``--from FILE``: read a training framework's own configuration and map it onto peakmem's options.

Readers (the key names each one knows, with the file of the framework that defines them):

* axolotl YAML (axolotl ``src/axolotl/utils/schemas/config.py`` ``AxolotlInputConfig``): ``base_model``,
  ``adapter``, ``load_in_4bit/8bit``, ``lora_*``, ``micro_batch_size``, ``sequence_len``, ``sample_packing``,
  ``gradient_checkpointing`` (``true`` or ``offload``), ``optimizer``, ``flash_attention``,
  ``sdp_attention``, Liger plugin keys, ``deepspeed``, ``fsdp``/``fsdp_config``;
* LLaMA-Factory YAML (``src/llamafactory/hparams/{model,finetuning,data}_args.py``):
  ``model_name_or_path``, ``finetuning_type``, ``quantization_bit``, ``lora_rank`` (default 8),
  ``lora_alpha`` (default ``2 x lora_rank``), ``lora_target`` (default ``all``), ``cutoff_len`` (default
  2048), ``pure_bf16``, ``flash_attn``, ``enable_liger_kernel``, ``use_unsloth(_gc)``, plus
  ``TrainingArguments``;
* torchtune recipe YAML (``recipes/configs/*``): ``model._component_`` (``lora_``/``qlora_`` builders,
  ``lora_rank``, ``lora_alpha``, ``lora_attn_modules``, ``apply_lora_to_mlp``), ``batch_size`` (per
  device), ``tokenizer.max_seq_len``, ``dtype``, ``optimizer._component_``, ``loss._component_``,
  ``enable_activation_checkpointing``, ``enable_activation_offloading``, ``optimizer_in_bwd``,
  ``compile``, ``dataset.packed``;
* transformers ``TrainingArguments`` / TRL ``SFTConfig`` + ``ModelConfig`` as JSON or YAML (alignment-handbook
  recipes): ``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``bf16``/``fp16``,
  ``gradient_checkpointing``, ``optim``, ``max_seq_length``/``max_length``, ``packing``,
  ``torch_dtype``, ``attn_implementation``, ``use_peft``/``lora_*``, ``load_in_4bit/8bit``,
  ``use_liger_kernel``, ``deepspeed``, ``fsdp``/``fsdp_config``;
* DeepSpeed JSON (deepspeed ``runtime/config.py``, ``runtime/zero/config.py``): ``zero_optimization.stage``,
  ``offload_optimizer.device``, ``offload_param.device``, ``train_micro_batch_size_per_gpu``,
  ``gradient_accumulation_steps``, ``train_batch_size`` (global: micro x accumulation x GPUs), ``bf16``/
  ``fp16.enabled``, bucket sizes;
* accelerate config YAML (accelerate ``commands/config/config_args.py``): ``distributed_type``,
  ``num_processes``, ``mixed_precision``, ``fsdp_config``, ``deepspeed_config``.

The mapping (:func:`map_documents`) is pure: dicts in, a :class:`FromFile` out, with every mapped field,
the key it came from, and the memory-relevant keys peakmem does not model. File reading
(:func:`read_from_files`) is the only I/O; YAML needs PyYAML (the ``yaml`` extra).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peakmem.errors import InputError, MissingExtraError
from peakmem.validate import read_user_text

AXOLOTL = "axolotl"
LLAMA_FACTORY = "llama-factory"
TORCHTUNE = "torchtune"
HF_TRAINER = "transformers/trl"
DEEPSPEED = "deepspeed"
ACCELERATE = "accelerate"
FORMATS = (AXOLOTL, LLAMA_FACTORY, TORCHTUNE, HF_TRAINER, DEEPSPEED, ACCELERATE)
MAX_FILE_BYTES = 1 << 20  # a training config is a few KiB; refuse anything past 1 MiB
YAML_SUFFIXES = (".yaml", ".yml")
AUTO = "auto"  # HF Trainer fills DeepSpeed "auto" values from TrainingArguments (integrations/deepspeed.py)

# --- defaults of the frameworks (used only when the file names the feature but not the value) -------
LLAMA_FACTORY_LORA_RANK = 8  # llamafactory/hparams/finetuning_args.py LoraArguments.lora_rank
LLAMA_FACTORY_CUTOFF_LEN = 2048  # llamafactory/hparams/data_args.py DataArguments.cutoff_len
AXOLOTL_SEQUENCE_LEN = 512  # axolotl src/axolotl/utils/schemas/config.py AxolotlInputConfig.sequence_len
TRL_LORA_R, TRL_LORA_ALPHA, TRL_LORA_DROPOUT = 16, 32, 0.05  # trl/trainer/model_config.py ModelConfig
TRL_MAX_LENGTH = 1024  # trl/trainer/sft_config.py SFTConfig.max_length

# HF TrainingArguments.optim (transformers 5.23 training_args.py OptimizerNames) and axolotl's additions ->
# peakmem optimizer, implementation (whose step temporaries it has, as transformers/trainer_optimizer.py
# builds it; None: the command line's default), note. The ONE table: ``--from`` and PeakmemCallback use it.
_BNB = "bitsandbytes: one fused kernel per tensor (trainer_optimizer.py _get_bitsandbytes_optimizer)"
_PAGED_32 = _BNB + "; paged 32-bit states (CUDA unified memory) counted as device fp32 states"
_TORCHAO = "torchao low-bit AdamW (trainer_optimizer.py _get_torchao_optimizer): one kernel per tensor"
TORCHAO_4BIT_NOTE = (
    "transformers passes torchao block_size=256; peakmem counts torchao's default 128 (two fp32 scales per "
    "block: over-counted by 2 x (4/128 - 4/256) = 1/32 byte per parameter)"
)
HF_OPTIMIZERS: dict[str, tuple[str, str | None, str]] = {
    "adamw_torch": ("adamw", "foreach", ""),  # torch.optim.AdamW: foreach is torch's default on CUDA
    "adamw_hf": ("adamw", "for-loop", ""),
    "adamw_torch_fused": ("adamw", "fused", ""),  # trainer_optimizer.py _get_adamw_torch: fused=True
    "adamw_apex_fused": ("adamw", "fused", ""),
    "adamw_torch_xla": ("adamw", None, ""),
    "adamw_torch_npu_fused": ("adamw", "fused", ""),
    "adamw_anyprecision": ("adamw", None, ""),
    "adam": ("adam", None, ""),
    "adamw_bnb_8bit": ("adamw-8bit", "fused", _BNB),
    "adamw_8bit": ("adamw-8bit", "fused", _BNB),
    "adam_8bit": ("adamw-8bit", "fused", _BNB),
    "bnb_8bit": ("adamw-8bit", "fused", _BNB),
    "paged_adamw_8bit": ("paged-adamw-8bit", "fused", _BNB),
    "paged_adam_8bit": ("paged-adamw-8bit", "fused", _BNB),
    "paged_adamw_32bit": ("adamw", "fused", _PAGED_32),
    "paged_adamw": ("adamw", "fused", _PAGED_32),
    "adamw_torch_4bit": ("adamw-4bit", "fused", f"{_TORCHAO}; {TORCHAO_4BIT_NOTE}"),
    "adamw_torch_8bit": ("adamw-8bit", "fused", f"{_TORCHAO}; 8-bit states counted as bitsandbytes 8-bit"),
    "lion_8bit": ("lion-8bit", "fused", _BNB),
    "paged_lion_8bit": ("lion-8bit", "fused", _BNB + "; paged states counted on the device"),
    "lion_32bit": ("lion", "fused", _BNB + "; one fp32 state"),
    "paged_lion_32bit": ("lion", "fused", _BNB + "; one fp32 state, paged: counted on the device"),
    "sgd": ("sgd", "foreach", ""),  # torch.optim.SGD; optim_args momentum=... -> sgd-momentum
    # transformers/optimization.py Adafactor steps tensor by tensor and has no foreach version
    "adafactor": ("adafactor", "for-loop", "transformers.optimization.Adafactor, tensor by tensor"),
    # galore_torch GaLoreAdamW.step: a Python loop over the parameters
    "galore_adamw": (
        "galore-adamw",
        "for-loop",
        "optim_args rank / optim_target_modules not read: galore-torch's rank 128 on the attention and MLP "
        "matrices counted (formulas/lowbit_optim.py)",
    ),
    "galore_adamw_layerwise": ("galore-adamw", "for-loop", "layer-wise GaLore counted as plain GaLore"),
}
# torchtune optimizer._component_ -> peakmem optimizer (and a note)
_COMPONENT_OPTIMIZERS: dict[str, tuple[str, str]] = {
    "torch.optim.AdamW": ("adamw", ""),
    "torch.optim.Adam": ("adam", ""),
    "torch.optim.SGD": ("sgd", ""),
    "bitsandbytes.optim.AdamW8bit": ("adamw-8bit", ""),
    "bitsandbytes.optim.PagedAdamW8bit": ("paged-adamw-8bit", ""),
    "bitsandbytes.optim.PagedAdamW": ("adamw", "paged 32-bit states counted as device fp32 states"),
    "bitsandbytes.optim.Lion8bit": ("lion-8bit", ""),
    "torchao.optim.AdamW8bit": ("adamw-8bit", "torchao 8-bit states counted as bitsandbytes 8-bit"),
    "torchao.prototype.low_bit_optim.AdamW8bit": ("adamw-8bit", "torchao 8-bit states counted as bnb 8-bit"),
    "torchao.optim.AdamW4bit": ("adamw-4bit", ""),
    "torchao.prototype.low_bit_optim.AdamW4bit": ("adamw-4bit", ""),
}
# DeepSpeed "optimizer.type" (deepspeed/runtime/config.py names, lower-cased) -> peakmem optimizer and
# implementation: deepspeed/runtime/engine.py _configure_basic_optimizer builds FusedAdam / FusedLion
# (DeepSpeedCPUAdam / DeepSpeedCPULion when offloaded): one kernel per group; other names are torch.optim's.
# With an "optimizer" section DeepSpeed builds its own and TrainingArguments.optim is unused
# (transformers integrations/deepspeed.py deepspeed_optim_sched: DummyOptim).
_DEEPSPEED_OPTIMIZERS = {
    "adam": ("adamw", "fused"),
    "adamw": ("adamw", "fused"),
    "lion": ("lion", "fused"),
    "sgd": ("sgd", "foreach"),
}
_ATTENTION = {  # transformers attn_implementation -> peakmem --attention
    "eager": "eager",
    "sdpa": "sdpa",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "kernels-community/flash-attn": "flash",
    "kernels-community/vllm-flash-attn3": "flash",
}  # other Hub kernels whose name says flash ("kernels-community/...flash...") count as flash too
_FSDP_STRATEGIES = {  # torch FSDP ShardingStrategy (name or accelerate's 1-based number)
    "full_shard": "full-shard",
    "1": "full-shard",
    "shard_grad_op": "shard-grad-op",
    "2": "shard-grad-op",
    "no_shard": "none",
    "3": "none",
    "hybrid_shard": "hybrid-shard",
    "4": "hybrid-shard",
    "hybrid_shard_zero2": "hybrid-shard",
    "5": "hybrid-shard",
}
# DeepSpeed knobs Parallelism models (deepspeed/runtime/zero/config.py names -> Parallelism fields)
_DS_BUCKETS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
}
# DeepSpeed zero_optimization keys that change memory and that peakmem does not model
_DS_NOT_MODELLED = {
    "zenflow": "ZenFlow keeps the top-k gradient columns on the GPU and updates the rest on the CPU",
    "offload_optimizer.ratio": "partial optimizer offload (ZeRO++ / SuperOffload ratio)",
    "zero_quantized_weights": "ZeRO++ quantized weight all-gather",
    "zero_quantized_gradients": "ZeRO++ quantized gradient reduce",
    "zero_hpz_partition_size": "ZeRO++ hierarchical partition: a secondary weight copy per node",
    "leaf_module": "ZeRO-3 leaf modules gathered whole (MoE blocks)",
    "mics_shard_size": "MiCS sharding within groups",
}
# Keys that change memory and that peakmem does not model (per format; prefix match on dotted keys).
_NOT_MODELLED: dict[str, str] = {
    "per_device_eval_batch_size": "evaluation batches (peakmem estimates the training step)",
    "eval_batch_size": "evaluation batches (peakmem estimates the training step)",
    "eval_accumulation_steps": "evaluation logits kept on the device between steps",
    "auto_find_batch_size": "the batch size is searched at run time",
    "neftune_noise_alpha": "",
    "unfrozen_parameters": "partial fine-tuning: only the named parameters train",
    "freeze_trainable_layers": "freeze fine-tuning: only some layers train",
    "lora_modules_to_save": "",
    "optim_target_modules": "",
    "liger_layer_norm": "Liger fused LayerNorm (kernels['liger'])",
    "unsloth_cross_entropy_loss": "unsloth fused cross-entropy (kernels['unsloth'])",
    "unsloth_lora_mlp": "unsloth fused LoRA MLP kernels (kernels['unsloth'])",
    "unsloth_lora_qkv": "unsloth fused LoRA QKV kernels (kernels['unsloth'])",
    "unsloth_lora_o": "unsloth fused LoRA O kernels (kernels['unsloth'])",
    "xformers_attention": "xformers attention counted as flash attention's memory",
    "flex_attention": "flex attention",
    "s2_attention": "shifted sparse attention",
    "tensor_parallel_size": "tensor parallelism from the file: give --tp",
    "sequence_parallel_degree": "sequence parallelism: give --cp",
    "context_parallel_size": "context parallelism: give --cp",
    "load_in_2bit": "",
    "relora": "ReLoRA",
    "lisa_n_layers": "LISA layer sampling",
    "use_badam": "BAdam block-wise training",
    "use_galore": "GaLore through LLaMA-Factory: give --optimizer galore-adamw",
    "use_apollo": "APOLLO optimizer",
    "use_dora": "",
    "pissa_init": "",
    "fp8": "fp8 training",
    "unsloth_rms_norm": "unsloth fused RMSNorm (kernels['unsloth'])",
    "unsloth_rope": "unsloth fused RoPE (kernels['unsloth'])",
    "lora_mlp_kernel": "axolotl fused LoRA MLP kernel",
    "lora_qkv_kernel": "axolotl fused LoRA QKV kernel",
    "lora_o_kernel": "axolotl fused LoRA O kernel",
    "flash_attn_cross_entropy": "flash-attn fused cross-entropy",
    "flash_attn_rms_norm": "flash-attn fused RMSNorm",
    "flash_attn_fuse_mlp": "flash-attn fused MLP",
    "gpu_memory_limit": "a device-map memory cap",
    "max_memory": "a device-map memory cap",
    "float16": "the model loaded in fp16 without autocast",
    "use_cpu": "a CPU run",
    "parallelism_config": "tensor/context parallelism from the file: give --tp / --cp",
}


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


# --- reading files ---------------------------------------------------------------------------------
def load_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's top-level mapping: JSON, or YAML (needs PyYAML). Errors name the file."""
    p = Path(path)
    text = read_user_text(p, what="a training config", max_bytes=MAX_FILE_BYTES, label="--from")
    return parse_document(text, str(p))


def parse_document(text: str, name: str) -> dict[str, Any]:
    """Parse JSON (``.json``, or text starting with ``{``) or YAML; ``name`` is for errors."""
    doc: Any
    if name.lower().endswith(".json") or text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(
                f"--from {name}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
            ) from None
    else:
        try:
            import yaml
        except ImportError:
            raise MissingExtraError("train --from FILE.yaml", "yaml", "pyyaml") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise InputError(f"--from {name}: invalid YAML{where}: {problem}") from None
    if not isinstance(doc, dict):
        raise InputError(f"--from {name}: the top level must be a mapping of keys, not {type(doc).__name__}")
    return doc


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


def read_from_files(paths: Sequence[str | os.PathLike[str]]) -> FromFile:
    """Read each file (and the DeepSpeed JSON each names), then map them all (:func:`map_documents`)."""
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        p = Path(path)
        doc = load_document(p)
        docs.append((str(p), doc))

        def load(ref: str, key: str, p: Path = p) -> tuple[str, dict[str, Any]]:
            found = find_referenced(ref, p.parent)
            if found is None:
                raise InputError(
                    f"--from {p}: {key}={ref!r}: no such file (looked relative to {p.parent}, "
                    "the folders above it and the current directory)"
                )
            return str(found), load_document(found)

        for key, ref in _deepspeed_refs(doc):
            docs.append(load(ref, key))
    return map_documents(docs, _local_model_dirs(docs))


def _local_model_dirs(docs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """torchtune checkpoint folders that hold a config.json (then the folder itself is the model)."""
    out: dict[str, str] = {}
    for _, doc in docs:
        ckpt = doc.get("checkpointer")
        folder = ckpt.get("checkpoint_dir") if isinstance(ckpt, dict) else None
        if isinstance(folder, str) and (Path(folder).expanduser() / "config.json").is_file():
            out[folder] = str(Path(folder).expanduser())
    return out


def _deepspeed_refs(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
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


# --- format detection --------------------------------------------------------------------------------
def detect_format(doc: Mapping[str, Any]) -> str:
    """Which framework's file this is, from its keys; an error lists what was looked for."""
    keys = set(doc)
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


# --- the pure mapping ----------------------------------------------------------------------------------
_FIELD_OF = {  # CLI dest -> the name shown in the echo (the flag without dashes)
    "model": "model",
    "method": "method",
    "precision": "precision",
    "optimizer": "optimizer",
    "optimizer_impl": "optimizer-impl",
    "batch": "batch",
    "seq": "seq",
    "grad_accum": "grad-accum",
    "checkpointing": "checkpointing",
    "attention": "attention",
    "framework": "framework",
    "lora_rank": "lora-rank",
    "lora_alpha": "lora-alpha",
    "lora_targets": "lora-targets",
    "lora_dropout": "lora-dropout",
    "dora": "dora",
    "adapter_dtype": "adapter-dtype",
    "quant": "quant",
    "no_double_quant": "no-double-quant",
    "loss": "loss",
    "optimizer_in_backward": "optimizer-in-backward",
    "activation_offload": "activation-offload",
    "gpus": "gpus",
    "zero": "zero",
    "fsdp": "fsdp",
    "fsdp_version": "fsdp-version",
    "offload": "offload",
    "offload_params": "offload-params",
}
LORA_DESTS = ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "dora", "adapter_dtype")
QUANT_DESTS = ("quant", "no_double_quant")


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

    def src(self, key: str) -> str:
        return f"{self.name}:{key}"

    def set(self, dest: str, value: Any, key: str, note: str = "", *, keep: bool = False) -> None:
        """Set ``dest`` from ``key`` (``keep``: only when not already set)."""
        if keep and dest in self.options:
            return
        self.options[dest] = value
        source = key if ":" in key or key.startswith("(") else self.src(key)
        self.fields[dest] = Field(_FIELD_OF.get(dest, dest), value, source, note)

    def info(self, name: str, value: Any, key: str, note: str = "") -> None:
        """A field echoed for the record that sets no option (packing, global batch, ...)."""
        self.extra_fields.append(Field(name, value, self.src(key), note))

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


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "auto", "on")
    return bool(value)


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def _int(m: _Mapper, key: str, value: Any) -> int | None:
    """An integer field; ``auto``/``null`` -> None; anything else names file and key."""
    if value is None or _is_auto(value):
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


def _float(m: _Mapper, key: str, value: Any) -> float | None:
    if value is None or _is_auto(value):
        return None
    if isinstance(value, bool):
        raise InputError(f"--from {m.name}: {key}={value!r}: must be a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"--from {m.name}: {key}={value!r}: must be a number") from None


def _get(doc: Mapping[str, Any], dotted: str) -> Any:
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _names_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.replace(" ", ",").split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return []


# --- shared pieces ---------------------------------------------------------------------------------
def _hf_optimizer(m: _Mapper, key: str, value: Any, optim_args: Any = None) -> None:
    name = str(getattr(value, "value", value)).strip().lower()  # an OptimizerNames member, live
    found = HF_OPTIMIZERS.get(name)
    if found is None:
        m.unknown(key, name, "an optimizer peakmem has no model of; peakmem's default AdamW counted instead",
                  list(HF_OPTIMIZERS))  # fmt: skip
        return
    opt, impl, note = found
    if opt == "sgd" and parse_optim_args(optim_args).get("momentum", "0") not in ("0", "0.0"):
        opt = "sgd-momentum"
    m.set("optimizer", opt, key, note)
    if impl is not None:
        m.set("optimizer_impl", impl, key)


def parse_optim_args(text: Any) -> dict[str, str]:
    """``optim_args="momentum=0.9,nesterov=True"`` as transformers trainer_optimizer.py parses it."""
    out: dict[str, str] = {}
    for part in str(text or "").replace(" ", "").split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key] = value
    return out


def _attention_impl(m: _Mapper, key: str, value: Any) -> None:
    name = str(value).strip()
    kernel = _ATTENTION.get(name) or ("flash" if "flash" in name else None)
    if kernel is not None:
        m.set("attention", kernel, key)
    else:
        m.unknown(key, name, "an attention kernel peakmem has no model of", list(_ATTENTION))


def _precision_flags(m: _Mapper, doc: Mapping[str, Any]) -> None:
    for key in ("bf16", "bfloat16"):
        if _truthy(doc.get(key)):
            m.half = ("bf16", m.src(key))
            if _is_auto(doc.get(key)):
                m.notes.append(
                    f"{m.src(key)} = auto: bf16 where the GPU has it (Ampere or newer), as assumed"
                )
            return
    for key in ("fp16", "float16"):
        if _truthy(doc.get(key)):
            m.half = ("fp16", m.src(key))
            return


def _weights_dtype(value: Any) -> str | None:
    """torch_dtype spellings -> 'bf16' | 'fp16' | 'fp32' | None (auto / unknown)."""
    name = str(value).strip().lower().removeprefix("torch.")
    return {
        "bfloat16": "bf16",
        "bf16": "bf16",
        "float16": "fp16",
        "fp16": "fp16",
        "half": "fp16",
        "float32": "fp32",
        "fp32": "fp32",
        "float": "fp32",
    }.get(name)


PURE_FP16_NOTE = (
    "fp16 weights trained as they are (no fp32 master, fp16 gradients and optimizer states): the bytes of "
    "peakmem's pure 16-bit regime"
)


def _hf_precision(m: _Mapper, method: str, weights: tuple[str, str] | None, upcast_full: bool) -> None:
    """HF Trainer precision (transformers 5.23 trainer.py + accelerate): ``bf16``/``fp16=True`` turn on
    autocast (and, for fp16, torch's GradScaler) over the weights in the dtype they were loaded in; the
    Trainer never casts the model itself. So the weights' dtype decides, for every method:

    * fp32 weights (or none stated, full fine-tuning): ``amp-*`` with a flag, else ``fp32``;
    * bf16 weights: ``bf16`` (weights, gradients and optimizer states in bf16: torch keeps the states in
      the parameter's dtype), with or without the flag;
    * fp16 weights under LoRA/QLoRA: ``mixed-fp16`` (fp16 base, fp32 adapters, no master copy);
    * fp16 weights in full fine-tuning: without ``fp16=True`` the Trainer trains them as they are (pure
      fp16: counted as ``bf16``, the same bytes, with a note); with it, GradScaler.unscale_ raises
      "Attempting to unscale FP16 gradients" (torch/amp/grad_scaler.py) at the first step: an error.

    LoRA/QLoRA with no dtype stated: the base is loaded in the flag's dtype (peft's adapters in fp32).
    ``upcast_full``: full fine-tuning with fp32 trainable weights (LLaMA-Factory without pure_bf16)."""
    if method == "full" and upcast_full and m.half is not None:
        weights = None
    dtype = weights[0] if weights is not None else "fp32"
    source = m.half[1] if m.half is not None else (weights[1] if weights is not None else "")
    if dtype == "fp32":
        if m.half is None:
            m.fp32_default = m.src("(no bf16/fp16 flag)")
        else:
            m.set(
                "precision",
                f"amp-{m.half[0]}",
                source,
                "fp32 trainable weights, autocast compute (HF Trainer amp)",
            )
    elif dtype == "bf16":
        m.set(
            "precision",
            "bf16",
            source,
            "bf16 weights" + (", autocast compute" if m.half else ", no autocast"),
        )
    elif method != "full":
        m.set("precision", "mixed-fp16", source, "fp16 base weights, fp32 adapters")
    elif m.half is not None and m.half[0] == "fp16":
        raise InputError(
            f"{m.half[1]}: fp16=True on fp16 weights ({weights[1] if weights else ''}) in full "
            'fine-tuning: torch\'s GradScaler refuses it ("Attempting to unscale FP16 gradients") at the '
            "first step; load the model in fp32 (HF Trainer amp) or bf16"
        )
    else:
        m.set("precision", "bf16", source, PURE_FP16_NOTE)


def _lora_from(m: _Mapper, doc: Mapping[str, Any], rank_key: str, defaults: Mapping[str, Any]) -> None:
    rank = _int(m, rank_key, doc.get(rank_key))
    if rank is not None:
        m.set("lora_rank", rank, rank_key)
    elif "rank" in defaults:
        m.set("lora_rank", defaults["rank"], f"({defaults['who']} default)")
    alpha = _float(m, "lora_alpha", doc.get("lora_alpha"))
    if alpha is not None:
        m.set("lora_alpha", alpha, "lora_alpha")
    elif "alpha" in defaults:
        value = (
            defaults["alpha"](m.options.get("lora_rank"))
            if callable(defaults["alpha"])
            else defaults["alpha"]
        )
        if value is not None:
            m.set("lora_alpha", float(value), f"({defaults['who']} default)")
    dropout = _float(m, "lora_dropout", doc.get("lora_dropout"))
    if dropout is not None:
        m.set("lora_dropout", dropout, "lora_dropout")
    elif "dropout" in defaults:
        m.set("lora_dropout", defaults["dropout"], f"({defaults['who']} default)")
    if _truthy(doc.get("use_dora")) or _truthy(doc.get("peft_use_dora")):
        m.set("dora", True, "use_dora" if "use_dora" in doc else "peft_use_dora")


def _deepspeed(m: _Mapper, ds: Mapping[str, Any], prefix: str) -> None:
    """A DeepSpeed config (a file or an inline dict)."""
    m.deepspeed = True
    p = f"{prefix}." if prefix else ""
    zero = ds.get("zero_optimization")
    if isinstance(zero, Mapping):
        stage = _int(m, p + "zero_optimization.stage", zero.get("stage"))
        if stage is not None:
            m.set("zero", stage, p + "zero_optimization.stage")
        for sub, dest in (("offload_optimizer", "offload"), ("offload_param", "offload_params")):
            device = _get(zero, f"{sub}.device")
            if isinstance(device, str) and device.lower() in ("cpu", "nvme"):
                m.set(dest, device.lower(), f"{p}zero_optimization.{sub}.device")
        for key, attr in _DS_BUCKETS.items():
            value = zero.get(key)
            if _is_auto(value):
                m.skip(
                    f"{p}zero_optimization.{key}",
                    value,
                    "HF Trainer sizes it from hidden_size; peakmem uses DeepSpeed's default",
                )
            elif value is not None:
                number = _int(m, f"{p}zero_optimization.{key}", value)
                if number is not None:
                    m.parallel[attr] = number
                    m.info(attr, number, f"{p}zero_optimization.{key}")
        for key, why in _DS_NOT_MODELLED.items():
            value = _get(zero, key)
            if value not in (None, False, 0, "none"):
                m.skip(f"{p}zero_optimization.{key}", value, why)
        if isinstance(zero.get("overlap_comm"), bool):
            m.parallel["overlap_comm"] = zero["overlap_comm"]
            m.info("overlap_comm", zero["overlap_comm"], f"{p}zero_optimization.overlap_comm")
        if isinstance(zero.get("contiguous_gradients"), bool):
            m.parallel["contiguous_gradients"] = zero["contiguous_gradients"]
    micro = _int(m, p + "train_micro_batch_size_per_gpu", ds.get("train_micro_batch_size_per_gpu"))
    if micro is not None:
        m.set("batch", micro, p + "train_micro_batch_size_per_gpu", keep=True)
    accum = _int(m, p + "gradient_accumulation_steps", ds.get("gradient_accumulation_steps"))
    if accum is not None:
        m.set("grad_accum", accum, p + "gradient_accumulation_steps", keep=True)
    total = _int(m, p + "train_batch_size", ds.get("train_batch_size"))
    if total is not None:
        m.info("global batch", total, p + "train_batch_size", "global: micro-batch x accumulation x GPUs")
        m.global_batch = (total, m.src(p + "train_batch_size"))
    for key in ("bf16", "fp16"):
        block = ds.get(key)
        enabled = block.get("enabled") if isinstance(block, Mapping) else None
        if enabled is True and m.half is None:
            m.half = (key, m.src(f"{p}{key}.enabled"))
    opt = _get(ds, "optimizer.type")
    if isinstance(opt, str):
        found = _DEEPSPEED_OPTIMIZERS.get(opt.lower())
        if found is None:
            m.unknown(p + "optimizer.type", opt, "a DeepSpeed optimizer peakmem has no model of",
                      list(_DEEPSPEED_OPTIMIZERS))  # fmt: skip
        else:
            note = "DeepSpeed builds its own optimizer; TrainingArguments.optim is unused"
            m.set("optimizer", found[0], p + "optimizer.type", note)
            m.set("optimizer_impl", found[1], p + "optimizer.type")
    if _truthy(_get(ds, "activation_checkpointing.cpu_checkpointing")):
        m.skip(p + "activation_checkpointing.cpu_checkpointing", True, "Megatron-style CPU checkpointing")


def _fsdp_hf(m: _Mapper, doc: Mapping[str, Any], default_version: int) -> None:
    """TrainingArguments / axolotl ``fsdp`` (``True``, or the legacy string or list of options) +
    ``fsdp_config``. transformers 5.23 rewrites the legacy options into ``fsdp=True`` with
    ``fsdp_config`` ``reshard_after_forward`` / ``cpu_offload`` (training_args.py
    ``_process_fsdp_args``) and builds FSDP ``fsdp_config.get("version", 2)``."""
    value = doc.get("fsdp")
    words = [w.lower() for w in _names_list(value)] if value not in (None, False, True, "") else []
    for word in words:
        if word in _FSDP_STRATEGIES:
            m.set("fsdp", _FSDP_STRATEGIES[word], "fsdp")
        elif word == "offload":
            m.set(
                "offload_params", "cpu", "fsdp", "FSDP CPUOffload: parameters, gradients and the step on CPU"
            )
            m.set("offload", "cpu", "fsdp")
    config = doc.get("fsdp_config")
    # TrainingArguments always writes an fsdp_config; it means FSDP only with fsdp options (or, in
    # axolotl's newer style, an fsdp_version or a sharding key inside the config)
    sharding_keys = {
        "fsdp_version",
        "version",
        "cpu_offload",
        "reshard_after_forward",
        "fsdp_reshard_after_forward",
        "sharding_strategy",
        "fsdp_sharding_strategy",
        "offload_params",
        "fsdp_offload_params",
    }
    uses_fsdp = (
        bool(words)
        or value is True
        or (
            isinstance(config, Mapping)
            and (doc.get("fsdp_version") is not None or bool(sharding_keys & set(config)))
        )
    )
    if isinstance(config, Mapping) and uses_fsdp:
        version = doc.get("fsdp_version")
        if version is not None and "fsdp_version" not in config:
            config = {**config, "fsdp_version": version}
        _fsdp_config(m, config, "fsdp_config", default_version=default_version)
    elif words or value is True:
        m.set("fsdp_version", default_version, f"(FSDP{default_version} unless fsdp_config says otherwise)")
        if "fsdp" not in m.options:
            m.set("fsdp", "full-shard", "(FSDP's default sharding: FULL_SHARD)")


def _fsdp_config(m: _Mapper, cfg: Mapping[str, Any], prefix: str, *, default_version: int) -> None:
    def k(key: str) -> str:
        return f"{prefix}.{key}"

    def get(*names: str) -> tuple[str, Any]:
        for name in names:
            for key in (name, name.removeprefix("fsdp_")):
                if key in cfg:
                    return key, cfg[key]
        return "", None

    key, version = get("fsdp_version")
    v = _int(m, k(key), version) if key else None
    m.set(
        "fsdp_version",
        v or default_version,
        k(key) if key else f"(FSDP{default_version}: accelerate's default)",
    )
    key, strategy = get("fsdp_sharding_strategy")
    if key and strategy is not None:
        mode = _FSDP_STRATEGIES.get(str(strategy).strip().lower())
        if mode is None:
            m.skip(k(key), strategy, "an FSDP sharding strategy peakmem does not know")
        else:
            m.set("fsdp", mode, k(key))
    key, reshard = get("fsdp_reshard_after_forward")
    if key and isinstance(reshard, bool):
        m.set("fsdp", "full-shard" if reshard else "shard-grad-op", k(key))
    elif key and isinstance(reshard, str):
        mode = _FSDP_STRATEGIES.get(reshard.strip().lower())
        if mode is not None:
            m.set("fsdp", mode, k(key))
    if "fsdp" not in m.options:
        m.set("fsdp", "full-shard", "(FSDP's default sharding: FULL_SHARD)")
    key, offload = get("fsdp_offload_params")
    if not key:
        key, offload = get("cpu_offload")  # transformers 5.23 fsdp_config (CPUOffload / OffloadPolicy)
    if key and _truthy(offload):
        m.set("offload_params", "cpu", k(key), "FSDP CPUOffload: parameters, gradients and the step on CPU")
        m.set("offload", "cpu", k(key))
    key, ckpt = get("fsdp_activation_checkpointing")
    if key and _truthy(ckpt):
        m.set("checkpointing", "full", k(key))


LIGER_NOTE = "Liger RMSNorm, SwiGLU, RoPE and fused linear cross-entropy (formulas/profiles.py)"


def _liger(m: _Mapper, key: str) -> None:
    m.set("liger", True, key, LIGER_NOTE)
    for kernel in ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy"):
        m.kernel("liger", kernel)


# transformers 5.23 training_args.py: FSDP version fsdp_config.get("version", 2)
HF_FSDP_DEFAULT_VERSION = 2
AXOLOTL_FSDP_DEFAULT_VERSION = 1  # axolotl fsdp_config without fsdp_version: accelerate's FSDP1 plugin


def _common_hf(m: _Mapper, doc: Mapping[str, Any], fsdp_version: int = HF_FSDP_DEFAULT_VERSION) -> None:
    """TrainingArguments keys shared by axolotl, LLaMA-Factory and TRL files (and PeakmemCallback's live
    ``args.to_dict()``)."""
    if "per_device_train_batch_size" in doc:
        value = _int(m, "per_device_train_batch_size", doc["per_device_train_batch_size"])
        if value is not None:
            m.set("batch", value, "per_device_train_batch_size")
    if "gradient_accumulation_steps" in doc:
        value = _int(m, "gradient_accumulation_steps", doc["gradient_accumulation_steps"])
        if value is not None:
            m.set("grad_accum", value, "gradient_accumulation_steps")
    # transformers 5 renames gradient_checkpointing to activation_checkpointing (both are written)
    present = [k for k in ("gradient_checkpointing", "activation_checkpointing") if doc.get(k) is not None]
    gc_key = next((k for k in present if _truthy(doc[k])), present[0] if present else "")
    gc = doc[gc_key] if gc_key else None
    # axolotl: "offload" (and the deprecated "unsloth", rewritten to "offload" by
    # AxolotlInputConfig.check_offload_grad_checkpointing) keeps the checkpoints in CPU RAM
    if isinstance(gc, str) and gc.strip().lower() in ("offload", "offload_disk", "unsloth"):
        m.set("checkpointing", "full", gc_key)
        m.set(
            "activation_offload",
            True,
            gc_key,
            "offloaded checkpointing: layer inputs kept in CPU RAM (kernels['offloaded_checkpointing'])",
        )
        m.kernel("offloaded_checkpointing", True)
    elif gc is not None and _truthy(gc):
        m.set("checkpointing", "full", gc_key)
    elif gc is not None:
        m.set("checkpointing", "none", gc_key)
    if "optim" in doc and doc["optim"] is not None:
        _hf_optimizer(m, "optim", doc["optim"], doc.get("optim_args"))
    if doc.get("attn_implementation"):
        _attention_impl(m, "attn_implementation", doc["attn_implementation"])
    elif _truthy(doc.get("use_flash_attention_2")):
        m.set("attention", "flash", "use_flash_attention_2")
    if _truthy(doc.get("use_liger_kernel")):
        _liger(m, "use_liger_kernel")
    if _truthy(doc.get("torch_compile")):
        m.set(
            "compile",
            True,
            "torch_compile",
            "compiled layers save what Inductor keeps (formulas/profiles.py)",
        )
        m.kernel("compile", True)
    ds = doc.get("deepspeed")
    if isinstance(ds, Mapping):
        _deepspeed(m, ds, "deepspeed")
    _fsdp_hf(m, doc, fsdp_version)
    for key in sorted(doc):
        if key in _NOT_MODELLED and doc[key] not in (None, False, "", [], 0):
            if key in ("use_dora", "lora_modules_to_save", "optim_target_modules"):
                continue  # mapped elsewhere, or a kernel flag
            m.skip(key, doc[key], _NOT_MODELLED[key])


def _quant_hf(m: _Mapper, doc: Mapping[str, Any], *, double_quant_default: bool, who: str) -> str | None:
    """load_in_4bit / load_in_8bit -> 'nf4' / 'int8'."""
    if _truthy(doc.get("load_in_4bit")):
        qtype = str(doc.get("bnb_4bit_quant_type") or "nf4").lower()
        if qtype != "nf4":
            m.set("quant", qtype, "bnb_4bit_quant_type")
        dq_key = next((k for k in ("bnb_4bit_use_double_quant", "use_bnb_nested_quant") if k in doc), None)
        dq = _truthy(doc[dq_key]) if dq_key else double_quant_default
        if not dq:
            m.set("no_double_quant", True, dq_key or f"({who} default: no double quantization)")
        return "load_in_4bit"
    if _truthy(doc.get("load_in_8bit")):
        m.set("quant", "int8", "load_in_8bit", "bitsandbytes LLM.int8 base")
        return "load_in_8bit"
    return None


# --- per-format mappers ------------------------------------------------------------------------------
def _map_axolotl(m: _Mapper, doc: Mapping[str, Any]) -> None:
    if doc.get("base_model"):
        m.set("model", str(doc["base_model"]), "base_model")
    adapter = str(doc.get("adapter") or "").lower()
    quant_key = None
    if adapter in ("lora", "qlora"):
        quant_key = _quant_hf(m, doc, double_quant_default=True, who="axolotl")
        method = "qlora" if adapter == "qlora" or quant_key else "lora"
        m.set("method", method, "adapter", f"with {quant_key}" if quant_key and adapter == "lora" else "")
        _lora_from(m, doc, "lora_r", {})
        if _truthy(doc.get("lora_target_linear")):
            m.set("lora_targets", "all-linear", "lora_target_linear")
        elif doc.get("lora_target_modules"):
            m.set("lora_targets", ",".join(_names_list(doc["lora_target_modules"])), "lora_target_modules")
        if doc.get("lora_modules_to_save"):
            m.skip(
                "lora_modules_to_save",
                doc["lora_modules_to_save"],
                "trainable copies of these modules (embeddings, LM head) are not counted",
            )
    elif adapter:
        m.skip("adapter", adapter, "an adapter peakmem has no model of; counted as full fine-tuning")
        m.set("method", "full", "adapter")
    else:
        m.set("method", "full", "(no adapter: full fine-tuning)")
    micro = _int(m, "micro_batch_size", doc.get("micro_batch_size"))
    if micro is not None:
        m.set("batch", micro, "micro_batch_size")
    accum = _int(m, "gradient_accumulation_steps", doc.get("gradient_accumulation_steps"))
    if accum is not None:
        m.set("grad_accum", accum, "gradient_accumulation_steps")
        total = _int(m, "batch_size", doc.get("batch_size"))
        if micro is None and total is not None:  # axolotl: two of micro_batch_size, accumulation, batch_size
            m.set(
                "batch",
                max(1, total // accum),
                "batch_size",
                "axolotl: batch_size // gradient_accumulation_steps",
            )
    elif doc.get("batch_size") is not None and micro:
        total = _int(m, "batch_size", doc["batch_size"])
        if total is not None:
            m.set(
                "grad_accum", max(1, total // micro), "batch_size", "axolotl: batch_size // micro_batch_size"
            )
    seq = _int(m, "sequence_len", doc.get("sequence_len"))
    m.set(
        "seq",
        seq if seq is not None else AXOLOTL_SEQUENCE_LEN,
        "sequence_len" if seq is not None else "(axolotl default sequence_len)",
    )
    _packing(m, doc, ("sample_packing", "pad_to_sequence_len"))
    if doc.get("optimizer"):
        _hf_optimizer(m, "optimizer", doc["optimizer"])
    if _truthy(doc.get("flash_attention")):
        m.set("attention", "flash", "flash_attention")
    elif _truthy(doc.get("sdp_attention")):
        m.set("attention", "sdpa", "sdp_attention")
    elif _truthy(doc.get("eager_attention")):
        m.set("attention", "eager", "eager_attention")
    plugins = [str(p) for p in doc.get("plugins") or []]
    liger_flags = ("liger_fused_linear_cross_entropy", "liger_rms_norm", "liger_glu_activation")
    if all(_truthy(doc.get(flag)) for flag in liger_flags):
        _liger(m, "liger_fused_linear_cross_entropy")  # the kernels --liger models, all on
    elif _truthy(doc.get("liger_fused_linear_cross_entropy")) or _truthy(doc.get("liger_cross_entropy")):
        key = (
            "liger_fused_linear_cross_entropy"
            if "liger_fused_linear_cross_entropy" in doc
            else "liger_cross_entropy"
        )
        m.set("loss", "fused", key, "Liger fused linear cross-entropy: no full logits")
        m.kernel("liger", "fused_linear_cross_entropy")
    for flag, name in (
        ("liger_rope", "rope"),
        ("liger_rms_norm", "rms_norm"),
        ("liger_glu_activation", "swiglu"),
    ):
        if _truthy(doc.get(flag)):
            m.kernel("liger", name)
            if not m.options.get("liger"):
                m.skip(flag, True, "one Liger kernel alone: peakmem models them together (--liger)")
    if any("CutCrossEntropy" in p for p in plugins) or _truthy(doc.get("cut_cross_entropy")):
        m.set(
            "loss",
            "fused",
            "plugins" if plugins else "cut_cross_entropy",
            "cut-cross-entropy: no full logits",
        )
        m.kernel("cut_cross_entropy", True)
    for flag in ("unsloth_cross_entropy_loss", "unsloth_lora_mlp", "unsloth_lora_qkv", "unsloth_lora_o"):
        if _truthy(doc.get(flag)):
            m.kernel("unsloth", flag.removeprefix("unsloth_"))
    weights = ("bf16", m.src("bf16")) if _truthy(doc.get("bf16")) else None
    if weights is None and _truthy(doc.get("fp16")):
        weights = ("fp16", m.src("fp16"))
    if weights is None and _truthy(doc.get("float32")):
        weights = ("fp32", m.src("float32"))
    _precision_flags(m, doc)
    _common_hf(m, {k: v for k, v in doc.items() if k not in ("optimizer",)}, AXOLOTL_FSDP_DEFAULT_VERSION)
    _finish_precision(m, weights, upcast_full=False)


def _packing(m: _Mapper, doc: Mapping[str, Any], keys: Sequence[str]) -> None:
    for key in keys:
        if key in doc and doc[key] is not None:
            m.info(
                "packing" if "pack" in key else key,
                _truthy(doc[key]),
                key,
                "every row holds seq tokens: peakmem's assumption"
                if _truthy(doc[key])
                else "rows padded to the batch's longest; peakmem counts seq tokens (the most)",
            )
            return


def _finish_precision(m: _Mapper, weights: tuple[str, str] | None, *, upcast_full: bool) -> None:
    method = str(m.options.get("method", "full"))
    _hf_precision(m, method, weights, upcast_full)


def _map_llama_factory(m: _Mapper, doc: Mapping[str, Any]) -> None:
    if doc.get("model_name_or_path"):
        m.set("model", str(doc["model_name_or_path"]), "model_name_or_path")
    kind = str(doc.get("finetuning_type") or "lora").lower()
    who = {
        "who": "LLaMA-Factory",
        "rank": LLAMA_FACTORY_LORA_RANK,
        "alpha": lambda r: 2 * r if r else None,
        "dropout": 0.0,
    }
    if kind == "lora":
        bits = _int(m, "quantization_bit", doc.get("quantization_bit"))
        method = "qlora" if bits in (4, 8) else "lora"
        m.set(
            "method",
            method,
            "finetuning_type" if "finetuning_type" in doc else "(LLaMA-Factory default: lora)",
        )
        if bits == 8:
            m.set("quant", "int8", "quantization_bit")
        elif bits == 4:
            qtype = str(doc.get("quantization_type") or "nf4").lower()
            if qtype != "nf4":
                m.set("quant", qtype, "quantization_type")
            if "double_quantization" in doc and not _truthy(doc["double_quantization"]):
                m.set("no_double_quant", True, "double_quantization")
        elif bits is not None:
            m.skip("quantization_bit", bits, "a base format peakmem's QLoRA does not model")
        _lora_from(m, doc, "lora_rank", who)
        target = doc.get("lora_target", "all")
        names = _names_list(target)
        src = "lora_target" if "lora_target" in doc else "(LLaMA-Factory default: all)"
        m.set("lora_targets", "all-linear" if names in (["all"], []) else ",".join(names), src)
        if doc.get("additional_target"):
            m.skip("additional_target", doc["additional_target"], "trainable copies of these modules")
    elif kind == "full":
        m.set("method", "full", "finetuning_type")
    else:
        m.set("method", "full", "finetuning_type", "counted as full fine-tuning (an upper bound)")
        m.skip("finetuning_type", kind, "only some layers train")
    seq = _int(m, "cutoff_len", doc.get("cutoff_len"))
    m.set(
        "seq",
        seq if seq is not None else LLAMA_FACTORY_CUTOFF_LEN,
        "cutoff_len" if seq is not None else "(LLaMA-Factory default cutoff_len)",
    )
    _packing(m, doc, ("packing", "neat_packing"))
    fa = str(doc.get("flash_attn") or "").lower()
    if fa in ("fa2", "fa3"):
        m.set("attention", "flash", "flash_attn")
    elif fa == "sdpa":
        m.set("attention", "sdpa", "flash_attn")
    elif fa == "disabled":
        m.set("attention", "eager", "flash_attn")
    if _truthy(doc.get("enable_liger_kernel")):
        _liger(m, "enable_liger_kernel")
    if _truthy(doc.get("use_unsloth")):
        m.set("framework", "unsloth", "use_unsloth", "unsloth's kernels and loss (formulas/profiles.py)")
        m.kernel("unsloth", "model")
    if _truthy(doc.get("use_unsloth_gc")):
        m.set("checkpointing", "full", "use_unsloth_gc")
        m.set(
            "activation_offload",
            True,
            "use_unsloth_gc",
            "unsloth offloaded checkpointing: layer inputs in CPU RAM (kernels['offloaded_checkpointing'])",
        )
        m.kernel("offloaded_checkpointing", True)
    _precision_flags(m, doc)
    pure = _truthy(doc.get("pure_bf16"))
    if pure:
        m.half = ("bf16", m.src("pure_bf16"))
    weights = (
        ("bf16", m.half[1]) if m.half and m.half[0] == "bf16" else (("fp16", m.half[1]) if m.half else None)
    )
    # LLaMA-Factory's default (disable_gradient_checkpointing: false) turns checkpointing on
    # (llamafactory/model/model_utils/checkpointing.py prepare_model_for_training).
    if "gradient_checkpointing" not in doc:
        off = _truthy(doc.get("disable_gradient_checkpointing"))
        m.set(
            "checkpointing",
            "none" if off else "full",
            "disable_gradient_checkpointing" if off else "(LLaMA-Factory default: gradient checkpointing on)",
            keep=True,
        )
    _common_hf(m, doc)
    _finish_precision(m, weights, upcast_full=not pure)


def _map_hf(m: _Mapper, doc: Mapping[str, Any]) -> None:
    model = doc.get("model_name_or_path") or doc.get("model_id")
    if model:
        m.set("model", str(model), "model_name_or_path" if "model_name_or_path" in doc else "model_id")
    quant_key = _quant_hf(m, doc, double_quant_default=False, who="TRL ModelConfig")
    if _truthy(doc.get("use_peft")) or quant_key:
        m.set("method", "qlora" if quant_key else "lora", quant_key or "use_peft")
        _lora_from(
            m,
            doc,
            "lora_r",
            {
                "who": "TRL ModelConfig",
                "rank": TRL_LORA_R,
                "alpha": TRL_LORA_ALPHA,
                "dropout": TRL_LORA_DROPOUT,
            },
        )
        targets = _names_list(doc.get("lora_target_modules"))
        if targets:
            joined = ",".join(targets)
            m.set("lora_targets", "all-linear" if joined == "all-linear" else joined, "lora_target_modules")
        else:
            m.set("lora_targets", "default", "(peft default targets for the model type)")
        if doc.get("lora_modules_to_save"):
            m.skip("lora_modules_to_save", doc["lora_modules_to_save"], "trainable copies of these modules")
    else:
        m.set("method", "full", "(no use_peft: full fine-tuning)")
    for key in ("max_seq_length", "max_length", "model_max_length"):
        if doc.get(key) is not None:
            value = _int(m, key, doc[key])
            if value is not None:
                m.set("seq", value, key)
                break
    else:
        m.notes.append(
            f"no sequence length in the file: TRL SFTConfig's default max_length is {TRL_MAX_LENGTH}; "
            "peakmem's default applies unless --seq is given"
        )
    _packing(m, doc, ("packing",))
    _precision_flags(m, doc)
    weights = None
    for key in ("torch_dtype", "dtype", "model_init_kwargs.torch_dtype", "model_init_kwargs.dtype"):
        value = _get(doc, key)
        if value is not None:
            dtype = _weights_dtype(value)
            if dtype is None:
                m.notes.append(
                    f"{m.src(key)} = {value}: the checkpoint's dtype; counted as the bf16/fp16 flag says"
                )
                weights = (m.half[0], m.src(key)) if m.half else None
            else:
                weights = (dtype, m.src(key))
            break
    _training_arguments(m, doc, weights)


def _training_arguments(m: _Mapper, doc: Mapping[str, Any], weights: tuple[str, str] | None) -> None:
    """The TrainingArguments-level fields: precision flags (with the weights' dtype), batch, accumulation,
    checkpointing, optimizer, attention, Liger, DeepSpeed, FSDP. The one mapping of them, for ``--from``
    (:func:`_map_hf`) and for PeakmemCallback's live arguments (:func:`map_training_arguments`)."""
    _precision_flags(m, doc)
    if weights is None and m.options.get("method") in ("lora", "qlora") and m.half:
        weights = (m.half[0], m.half[1])
    _common_hf(m, doc)
    _finish_precision(m, weights, upcast_full=False)


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
    _training_arguments(m, doc, weights)
    return _merge([(name, doc)], [HF_TRAINER], [m])


_TORCHTUNE_TARGETS = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
_TORCHTUNE_MLP = ("gate_proj", "up_proj", "down_proj")  # torchtune w1, w3, w2 = HF gate, up, down
_TORCHTUNE_BUILDER = re.compile(
    r"^(?:q?lora_)?(?P<family>[a-z]+)(?P<ver>\d+(?:_\d+)?)_(?P<size>\d+(?:_\d+)?[bm])$"
)


def _torchtune_model_name(builder: str) -> str:
    """``llama3_2_1b`` -> ``llama-3.2-1b`` (torchtune builder names follow family, version, size)."""
    match = _TORCHTUNE_BUILDER.match(builder)
    if match is None:
        return builder
    family, ver, size = match["family"], match["ver"].replace("_", "."), match["size"].replace("_", ".")
    return f"{family}-{ver}-{size}"


def _map_torchtune(m: _Mapper, doc: Mapping[str, Any], local_dirs: Mapping[str, str]) -> None:
    m.set("framework", "torchtune", "(torchtune recipe)")
    m.notes.append(
        "torchtune's *_distributed recipes shard with FSDP2 (fully_shard): for one, give --gpus N --fsdp "
        "full-shard (the config does not say which recipe runs it)"
    )
    component = str(_get(doc, "model._component_") or "")
    builder = component.rsplit(".", 1)[-1]
    folder = _get(doc, "checkpointer.checkpoint_dir")
    if isinstance(folder, str) and folder in local_dirs:
        m.set("model", local_dirs[folder], "checkpointer.checkpoint_dir")
    elif builder:
        m.set("model", _torchtune_model_name(builder), "model._component_")
    method = "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"
    m.set("method", method, "model._component_")
    if method != "full":
        model = doc.get("model") or {}
        rank = _int(m, "model.lora_rank", model.get("lora_rank"))
        if rank is not None:
            m.set("lora_rank", rank, "model.lora_rank")
        alpha = _float(m, "model.lora_alpha", model.get("lora_alpha"))
        if alpha is not None:
            m.set("lora_alpha", alpha, "model.lora_alpha")
        dropout = _float(m, "model.lora_dropout", model.get("lora_dropout"))
        if dropout is not None:
            m.set("lora_dropout", dropout, "model.lora_dropout")
        names = [_TORCHTUNE_TARGETS.get(n, n) for n in _names_list(model.get("lora_attn_modules"))]
        if _truthy(model.get("apply_lora_to_mlp")):
            names += list(_TORCHTUNE_MLP)
        if _truthy(model.get("apply_lora_to_output")):
            names.append("lm_head")
        if names:
            m.set(
                "lora_targets",
                ",".join(names),
                "model.lora_attn_modules",
                "torchtune names mapped to HF (output_proj=o_proj; w1/w3/w2=gate/up/down_proj)",
            )
        m.set("adapter_dtype", "base", "(torchtune builds LoRA weights in the model dtype)")
        if _truthy(model.get("use_dora")):
            m.set("dora", True, "model.use_dora")
    batch = _int(m, "batch_size", doc.get("batch_size"))
    if batch is not None:
        m.set("batch", batch, "batch_size", "per device (torchtune)")
    accum = _int(m, "gradient_accumulation_steps", doc.get("gradient_accumulation_steps"))
    if accum is not None:
        m.set("grad_accum", accum, "gradient_accumulation_steps")
    seq = _int(m, "tokenizer.max_seq_len", _get(doc, "tokenizer.max_seq_len"))
    if seq is not None:
        m.set("seq", seq, "tokenizer.max_seq_len")
    else:
        m.notes.append(
            f"{m.src('tokenizer.max_seq_len')} is null: samples are not truncated; give --seq "
            "(peakmem's default applies)"
        )
    if _get(doc, "dataset.packed") is not None:
        _packing(m, {"dataset.packed": _get(doc, "dataset.packed")}, ("dataset.packed",))
    dtype = str(doc.get("dtype") or "fp32").lower()
    precision = {"bf16": "bf16", "fp32": "fp32", "fp16": "fp16"}.get(dtype)
    if precision == "fp16":
        m.skip("dtype", dtype, "torchtune refuses fp16 training")
    elif precision:
        m.set(
            "precision",
            precision,
            "dtype" if "dtype" in doc else "(torchtune default: fp32)",
            "pure: weights, grads and optimizer states in this dtype",
        )
    opt = str(_get(doc, "optimizer._component_") or "")
    if opt:
        found = _COMPONENT_OPTIMIZERS.get(opt)
        if found is None:
            m.skip("optimizer._component_", opt, "an optimizer peakmem has no model of")
        else:
            name, note = found
            if name == "sgd" and _float(m, "optimizer.momentum", _get(doc, "optimizer.momentum")):
                name = "sgd-momentum"
            m.set("optimizer", name, "optimizer._component_", note)
            if _get(doc, "optimizer.fused") is True:
                m.set("optimizer_impl", "fused", "optimizer.fused")
            elif _get(doc, "optimizer.foreach") is False:
                m.set("optimizer_impl", "for-loop", "optimizer.foreach")
    compiled = _truthy(doc.get("compile"))
    if compiled:
        m.set("compile", True, "compile", "compiled layers save what Inductor keeps (formulas/profiles.py)")
        m.kernel("compile", True)
    loss = str(_get(doc, "loss._component_") or "")
    if loss.endswith("CEWithChunkedOutputLoss") or loss.endswith("LinearCrossEntropyLoss"):
        m.set("loss", "chunked-compiled" if compiled else "chunked", "loss._component_")
    elif loss and not loss.endswith("CrossEntropyLoss"):
        m.skip("loss._component_", loss, "a loss peakmem has no model of")
    for key, dest in (
        ("enable_activation_checkpointing", "checkpointing"),
        ("enable_activation_offloading", "activation_offload"),
        ("optimizer_in_bwd", "optimizer_in_backward"),
    ):
        if key in doc and doc[key] is not None:
            on = _truthy(doc[key])
            value: Any = ("full" if on else "none") if dest == "checkpointing" else on
            m.set(dest, value, key)
    if _truthy(doc.get("fsdp_cpu_offload")):
        m.set("fsdp", "full-shard", "fsdp_cpu_offload")
        m.set("offload_params", "cpu", "fsdp_cpu_offload")
        m.set("offload", "cpu", "fsdp_cpu_offload")
    if doc.get("fsdp_reshard_after_forward") is False:
        m.set("fsdp", "shard-grad-op", "fsdp_reshard_after_forward")
    for key in ("tensor_parallel_dim", "context_parallel_dim"):
        if _int(m, key, doc.get(key)) not in (None, 1):
            m.skip(key, doc[key], "give --tp / --cp")
    if _truthy(doc.get("enable_fp8_training")):
        m.skip("enable_fp8_training", True, "fp8 training")


def _map_accelerate(m: _Mapper, doc: Mapping[str, Any]) -> None:
    kind = str(doc.get("distributed_type") or "NO").upper()
    procs = _int(m, "num_processes", doc.get("num_processes"))
    if procs is not None:
        m.set("gpus", procs, "num_processes", "all processes, all machines")
    mp = str(doc.get("mixed_precision") or "no").lower()
    if mp in ("bf16", "fp16"):
        m.half = (mp, m.src("mixed_precision"))
    elif mp == "fp8":
        m.skip("mixed_precision", mp, "fp8 training")
    if kind == "FSDP":
        cfg = doc.get("fsdp_config")
        _fsdp_config(m, cfg if isinstance(cfg, Mapping) else {}, "fsdp_config", default_version=1)
    elif kind == "DEEPSPEED":
        m.deepspeed = True
        cfg = doc.get("deepspeed_config")
        cfg = cfg if isinstance(cfg, Mapping) else {}
        stage = _int(m, "deepspeed_config.zero_stage", cfg.get("zero_stage"))
        if stage is not None:
            m.set("zero", stage, "deepspeed_config.zero_stage")
        for key, dest in (
            ("offload_optimizer_device", "offload"),
            ("offload_param_device", "offload_params"),
        ):
            device = str(cfg.get(key) or "none").lower()
            if device in ("cpu", "nvme"):
                m.set(dest, device, f"deepspeed_config.{key}")
        accum = _int(
            m, "deepspeed_config.gradient_accumulation_steps", cfg.get("gradient_accumulation_steps")
        )
        if accum is not None:
            m.set("grad_accum", accum, "deepspeed_config.gradient_accumulation_steps", keep=True)
    elif kind == "MEGATRON_LM":
        m.skip("distributed_type", kind, "give --tp/--pp for Megatron-LM layouts")
    if _truthy(doc.get("use_cpu")):
        m.skip("use_cpu", True, "a CPU run")


def map_documents(
    docs: Sequence[tuple[str, Mapping[str, Any]]], local_dirs: Mapping[str, str] | None = None
) -> FromFile:
    """Map parsed config documents (``(name, dict)``, in order: a later file's value wins) onto
    peakmem's CLI options. Pure: no file I/O (``local_dirs``: torchtune checkpoint folders that hold a
    config.json, found by the reader)."""
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
            _map_axolotl(m, doc)
        elif fmt == LLAMA_FACTORY:
            _map_llama_factory(m, doc)
        elif fmt == HF_TRAINER:
            _map_hf(m, doc)
        elif fmt == TORCHTUNE:
            _map_torchtune(m, doc, local_dirs or {})
        elif fmt == DEEPSPEED:
            _deepspeed(m, doc, "")
        else:
            _map_accelerate(m, doc)
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
    fp32_default: str | None = None
    for m, fmt in zip(mappers, formats, strict=True):
        for dest, value in m.options.items():
            # A DeepSpeed file's batch, accumulation and optimizer never override the training file's
            # own (HF Trainer fills DeepSpeed's values from its arguments and refuses a mismatch).
            # Its optimizer section does win: DeepSpeed builds that optimizer (see _DEEPSPEED_OPTIMIZERS).
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
    if "gpus" not in options and (options.get("zero") or options.get("fsdp") not in (None, "none")):
        notes.append("the number of GPUs is not in the file(s): give --gpus N (1 is assumed)")
    if "model" not in options:
        notes.append("no model in the file(s): give MODEL on the command line")
    ordered = [fields[d] for d in _FIELD_OF if d in fields] + extra
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
def apply(args: Any, found: FromFile, explicit: set[str]) -> tuple[FromFile, list[Field]]:
    """Set on ``args`` every option the file gives that the command line did not (``explicit``: the
    argparse dests the user typed). Returns the mapping (with a micro-batch derived from DeepSpeed's
    global batch and the command line's GPUs, if any) and the file's fields the command line overrode."""
    from dataclasses import replace

    overridden: list[Field] = []
    method = getattr(args, "method", None) if "method" in explicit else None
    by_dest = {
        dest: f for dest in found.options for f in found.mapped if f.field == _FIELD_OF.get(dest, dest)
    }
    for dest, value in found.options.items():
        if not hasattr(args, dest):
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
    from dataclasses import replace

    asks = {"gpus": "give --gpus", "model": "give MODEL", "seq": "give --seq"}
    answered = tuple(text for dest, text in asks.items() if dest in explicit)
    notes = tuple(n for n in found.notes if not any(a in n for a in answered))
    return replace(found, notes=notes)


def load_and_apply(
    args: Any, explicit: set[str], reader: Callable[[Sequence[str]], FromFile] = read_from_files
) -> None:
    """``--from`` for the CLI and the Python API: read the files, set ``args``, keep the echo on it."""
    paths = args.from_file if isinstance(args.from_file, (list, tuple)) else [args.from_file]
    found = _drop_answered_notes(reader([str(p) for p in paths]), explicit)
    found, overridden = apply(args, found, explicit)
    args.from_result = found
    args.from_overridden = overridden
    if getattr(args, "model", None) is None:
        raise InputError(f"MODEL: {', '.join(found.files)} names no model; give MODEL on the command line")
