"""``PeakmemCallback``: peakmem's answer inside the Hugging Face ``Trainer`` (needs the ``torch`` extra).

::

    from peakmem.integrations.transformers import PeakmemCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[PeakmemCallback(gpu="24GB")])
    trainer.train()  # prints the estimate; raises DoesNotFitError before the first step if it will not fit

**At train begin** the callback reads the job from the live objects (:func:`job_from_trainer`: the model's
config, its peft adapter and bitsandbytes quantization, the ``TrainingArguments``, the first batch) and
asks the question ``peakmem train`` asks. The arguments go through the mapping ``peakmem train --from``
uses (:func:`peakmem.fromfile.map_training_arguments` on ``args.to_dict()`` with the resolved DeepSpeed
config): one table of optimizer names, one precision rule, one reading of DeepSpeed and FSDP; this module
adds only what the live objects know (peft config, bitsandbytes state, weight dtype, attention
implementation, the first batch's shape, the number of processes). It answers through the same function
(:func:`peakmem.planner.train_answer`), so its answer (:attr:`PeakmemCallback.json`) equals
``peakmem train MODEL <the same flags> --json``. It prints the same headline and tables
(:func:`peakmem.render.print_estimate`), with the ranked ways down, on the main process.

**The device** it judges against: ``gpu=`` (a catalog name or a size, as ``--gpu`` takes), else on CUDA
the device's total memory (``torch.cuda.mem_get_info``), else none (CPU: no verdict, the job runs).

**Stopping.** transformers 5.23 ``Trainer._inner_training_loop`` calls ``on_train_begin`` and then enters
the epoch loop whatever the control says; ``_run_epoch`` reads ``control.should_training_stop`` only
*after* a micro-batch's forward, backward and optimizer step. So the flag alone lets one step run
(``tests/test_callback_torch.py::test_the_flag_alone_lets_one_step_run`` pins it: ``global_step == 1``).
The callback therefore sets the flag *and* raises :class:`DoesNotFitError` from ``on_train_begin``:
``trainer.train()`` raises it before any batch is fetched, with the estimate and the ways down attached.

**The first batch.** The sequence length (and micro-batch) come from the first batch the Trainer's own
DataLoader yields. The callback never touches the Trainer's iterator (``_run_epoch`` makes it later): it
opens a fresh iterator on the underlying ``torch.utils.data.DataLoader`` (accelerate's wrapper keeps it as
``base_dataloader``; its own ``__iter__`` registers itself with the gradient state, which a half-read
iterator would leave behind), takes one batch and closes it. Opening an iterator draws the sampler's
seed from torch's global generator, so the Python, NumPy and torch (CPU and CUDA) RNG states are saved
before and restored after: the Trainer shuffles and drops out exactly as it would have. An
``IterableDataset`` is not read (a generator behind it could not be restarted): pass ``seq=``. With
dynamic padding the first batch need not be the longest: pass ``seq=`` the longest length to size for it.

**Measured against predicted.** On CUDA the callback resets the peak statistics at train begin (the
model's weights, already on the device, stay counted) and at the end of optimizer steps 1..``measure_steps``
appends ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` against the prediction to
``state.log_history`` (keys ``peakmem/...``, GiB; ``error_pct`` = (predicted - measured) / measured x 100),
and merges them into the ``logs`` of the next ``on_log``. Callbacks given to the Trainer run after its
reporters (wandb, tensorboard...), which therefore see them only in ``state.log_history``. On the CPU only
the prediction is logged (step 0).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from transformers import TrainerCallback

from peakmem.errors import EXIT_DOES_NOT_FIT, InputError, PeakmemError
from peakmem.model import ModelSpec
from peakmem.parallel import DEFAULT_GPUS_PER_NODE, Parallelism
from peakmem.training import (
    Method,
    TrainingSetup,
)
from peakmem.units import GiB, fmt_bytes

Read = list[tuple[str, str, str]]  # (field, value, where it came from), in reading order
LOG_PREFIX = "peakmem/"
DEFAULT_MEASURE_STEPS = 2  # the peak settles by step 2: optimizer states appear at step 1 (as measure's)
ERROR_DIGITS = 2  # decimals of the logged GiB and percentages

# The TrainingArguments-level fields (optimizer names, precision flags, checkpointing, attention, Liger,
# DeepSpeed, FSDP, batch, accumulation) map through peakmem.fromfile.map_training_arguments, the one
# mapping `peakmem train --from` uses; this module adds what only the live objects know.
# peft LoraConfig fields that change which modules are adapted or their rank: not modelled (an error,
# never a silent default).
PEFT_UNMODELLED = ("rank_pattern", "layers_to_transform", "exclude_modules", "layer_replication",
                   "trainable_token_indices")  # fmt: skip
# bitsandbytes / torch dtypes as peakmem names them
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class DoesNotFitError(PeakmemError, RuntimeError):
    """The job will not fit the device: raised from ``on_train_begin``, before the first step.

    ``estimate`` is the prediction, ``ways`` the planner's ways down (:class:`peakmem.planner.WaysDown`),
    ``capacity_bytes`` what the device holds."""

    exit_code = EXIT_DOES_NOT_FIT

    def __init__(self, message: str, *, estimate: Any, ways: Any, capacity_bytes: int) -> None:
        super().__init__(message)
        self.estimate = estimate
        self.ways = ways
        self.capacity_bytes = capacity_bytes


@dataclass(frozen=True, kw_only=True)
class Job:
    """A training job as read from the live Trainer objects."""

    name: str
    config: dict[str, Any]  # the model's config.json dict (the base model's, under peft)
    spec: ModelSpec
    setup: TrainingSetup
    parallelism: Parallelism | None  # None: one process, no sharding
    read: tuple[tuple[str, str, str], ...]  # (field, value, where it came from)
    notes: tuple[str, ...]  # what the mapping assumed or could not see

    def flags(self) -> list[str]:
        """The ``peakmem train`` flags of this job: the CLI answers the same for them, except for what has
        no flag (DeepSpeed bucket sizes and overlap_comm read from its config; peft target_parameters,
        modules_to_save and lora_bias)."""
        s = self.setup
        out = [
            "--method", s.method.value, "--precision", s.precision.value, "--optimizer", s.optimizer.value,
            "--optimizer-impl", s.optimizer_impl.value, "--batch", str(s.micro_batch),
            "--seq", str(s.seq_len),
            "--grad-accum", str(s.grad_accum), "--checkpointing", s.checkpointing_spelled,
            "--attention", s.attention.value, "--loss", s.loss.value,
        ]  # fmt: skip
        if s.lora is not None:
            lora = s.lora
            out += ["--lora-rank", str(lora.rank), "--lora-alpha", str(lora.alpha),
                    "--lora-targets", ",".join(lora.targets) or "default",
                    "--lora-dropout", str(lora.dropout), "--adapter-dtype", lora.adapter_dtype]  # fmt: skip
            if lora.dora:
                out.append("--dora")
        if s.quant is not None:
            out += ["--quant", s.quant.quant]
            if not s.quant.double_quant:
                out.append("--no-double-quant")
            out += ["--bitsandbytes", s.bitsandbytes, "--kbit-prep", s.quant.kbit_prep]
        out += ["--transformers", s.transformers, "--accelerate", s.accelerate]
        par = self.parallelism
        if par is not None:
            out += ["--gpus", str(par.gpus), "--gpus-per-node", str(par.gpus_per_node), "--zero",
                    str(par.zero_stage), "--fsdp", par.fsdp.value, "--fsdp-version", str(par.fsdp_version),
                    "--tp", str(par.tp), "--cp", str(par.cp), "--offload", par.offload_optimizer.value,
                    "--offload-params", par.offload_params.value]  # fmt: skip
            if not par.zero_init:
                out.append("--no-zero-init")
        return out


# --- reading the job from the live objects ------------------------------------------------------
def _unwrap(model: Any) -> Any:
    """The transformers/peft model inside DDP/FSDP/DeepSpeed/compile wrappers."""
    seen = 0
    while hasattr(model, "module") and not hasattr(model, "config") and seen < 8:
        model, seen = model.module, seen + 1
    return getattr(model, "_orig_mod", model)


def _is_peft(model: Any) -> bool:
    return isinstance(getattr(model, "peft_config", None), Mapping) and hasattr(model, "get_base_model")


def _config_dict(model: Any) -> tuple[str, dict[str, Any]]:
    base = model.get_base_model() if _is_peft(model) else model
    config = getattr(base, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise InputError(f"model={type(model).__name__}: has no transformers config (model.config.to_dict())")
    d = config.to_dict()
    name = getattr(config, "name_or_path", "") or d.get("model_type") or type(base).__name__
    return str(name), d


def _weight_dtype(model: Any, *, frozen: bool) -> torch.dtype:
    """The floating dtype holding most parameters (the frozen ones under peft; quantized storage,
    integer tensors, is skipped)."""
    by_dtype: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if not p.is_floating_point() or (frozen and p.requires_grad):
            continue
        by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + _numel(p)
    if not by_dtype:
        return torch.float32
    return max(by_dtype, key=lambda d: by_dtype[d])


def _numel(p: Any) -> int:
    ds = getattr(p, "ds_numel", None)  # DeepSpeed ZeRO-3 partitions a parameter to numel 0
    return int(ds) if isinstance(ds, int) else int(p.numel())


def _lora(model: Any, read: Read, notes: list[str]) -> Any:
    """peakmem's LoraConfig from the active peft adapter (peft fills ``target_modules`` with the module
    names it adapted, ``all-linear`` included)."""
    from peakmem.adapters import LoraConfig

    name = getattr(model, "active_adapter", None) or "default"
    if isinstance(name, (list, tuple)):
        name = name[0]
    cfg = model.peft_config[name]
    where = f"model.peft_config[{name!r}]"
    peft_type = str(getattr(getattr(cfg, "peft_type", ""), "value", getattr(cfg, "peft_type", "")))
    if peft_type.upper() != "LORA":
        raise InputError(f"{where}.peft_type={peft_type!r}: peakmem models LoRA adapters only")
    for key in PEFT_UNMODELLED:
        if getattr(cfg, key, None):
            raise InputError(f"{where}.{key}={getattr(cfg, key)!r}: not modelled by peakmem")
    targets = cfg.target_modules
    if isinstance(targets, str):
        if targets.replace("_", "-") != "all-linear":
            raise InputError(f"{where}.target_modules={targets!r}: a regular expression is not modelled; "
                             "give module names")  # fmt: skip
        target_names: tuple[str, ...] = ("all-linear",)
    else:
        # peft expands all-linear into full module paths (model.layers.0.self_attn.q_proj): peakmem matches
        # leaf names; a path naming some layers only shows as a trainable-count mismatch note
        target_names = tuple(sorted({str(t).rsplit(".", 1)[-1] for t in targets or ()}))
    trainable = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    a_dtype = _DTYPE_NAMES.get(trainable[0].dtype, "fp32") if trainable else "fp32"
    bias = getattr(cfg, "bias", "none")
    if bias != "none":
        notes.append(f"{where}.bias={bias!r}: the trainable biases are not counted")
    lora = LoraConfig(
        rank=int(cfg.r), alpha=float(cfg.lora_alpha), targets=target_names,
        target_parameters=tuple(getattr(cfg, "target_parameters", None) or ()),
        dropout=float(cfg.lora_dropout), dora=bool(getattr(cfg, "use_dora", False)), adapter_dtype=a_dtype,
        lora_bias=bool(getattr(cfg, "lora_bias", False)),
        modules_to_save=tuple(getattr(cfg, "modules_to_save", None) or ()),
    )  # fmt: skip
    read.append(("lora", f"r={lora.rank} alpha={lora.alpha:g} targets={','.join(target_names)} "
                 f"dropout={lora.dropout:g} adapters {a_dtype}", where))  # fmt: skip
    return lora


def _quant(model: Any, base: Any, float_dtype: str, read: Read) -> Any:
    """peakmem's QuantConfig for a bitsandbytes-quantized base, else None."""
    from peakmem.adapters import QuantConfig

    qc = getattr(getattr(base, "config", None), "quantization_config", None)
    to_dict = getattr(qc, "to_dict", None)  # a transformers BitsAndBytesConfig, or a plain dict
    q: Mapping[str, Any] = to_dict() if callable(to_dict) else (qc if isinstance(qc, Mapping) else {})
    four = bool(getattr(base, "is_loaded_in_4bit", False) or q.get("load_in_4bit"))
    eight = bool(getattr(base, "is_loaded_in_8bit", False) or q.get("load_in_8bit"))
    if not (four or eight):
        if q:
            method = q.get("quant_method", "?")
            raise InputError(f"model.config.quantization_config.quant_method={method!r}: only bitsandbytes "
                             "4-bit/8-bit bases are modelled")  # fmt: skip
        return None
    if not _is_peft(model):
        raise InputError("model is quantized with bitsandbytes but has no LoRA adapter: peakmem models a "
                         "quantized base only under LoRA (QLoRA)")  # fmt: skip
    if eight:
        quant = QuantConfig(quant="int8", float_dtype=float_dtype)
    else:
        quant = QuantConfig(quant=str(q.get("bnb_4bit_quant_type", "nf4")),
                            double_quant=bool(q.get("bnb_4bit_use_double_quant", False)),
                            float_dtype=float_dtype)  # fmt: skip
    read.append(("quant", quant.label, "model.config.quantization_config (bitsandbytes)"))
    return quant


def _installed_bitsandbytes(read: Read) -> str | None:
    """The bitsandbytes release this process runs a quantized base with (its MatMul4Bit's saved tensors
    differ by release: peakmem.bnb_versions), or None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    from peakmem.bnb_versions import parse_bnb_version

    try:
        found = version("bitsandbytes")
    except PackageNotFoundError:
        return None
    parse_bnb_version(found)  # a release string peakmem cannot read is an InputError naming it
    read.append(("bitsandbytes", found, "importlib.metadata.version('bitsandbytes')"))
    return found


def _deepspeed_config(args: Any) -> dict[str, Any] | None:
    """The DeepSpeed config with transformers' "auto" values filled in when the Trainer has done so
    (``args.hf_deepspeed_config.config``), else ``args.deepspeed`` (a dict or a JSON file)."""
    hf = getattr(args, "hf_deepspeed_config", None)
    if hf is not None and isinstance(getattr(hf, "config", None), dict):
        return dict(hf.config)
    ds = getattr(args, "deepspeed", None)
    if not ds:
        return None
    if isinstance(ds, Mapping):
        return dict(ds)
    from peakmem.fromfile import load_document  # the one config reader (size cap, errors naming the file)

    try:
        return load_document(str(ds))
    except InputError as e:
        raise InputError(f"TrainingArguments.deepspeed={ds!r}: {e}") from None


def first_batch(dataloader: Any) -> Any:
    """The first batch of the Trainer's DataLoader, read from a fresh iterator on the underlying
    ``torch.utils.data.DataLoader`` with every RNG state restored (see the module's docstring); None
    for an IterableDataset or no DataLoader."""
    loader = getattr(dataloader, "base_dataloader", dataloader)
    if loader is None or not hasattr(loader, "__iter__"):
        return None
    if isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
        return None
    with _rng_kept(_generators(loader)):
        it = iter(loader)
        try:
            return next(it)
        except StopIteration:
            return None
        finally:
            del it  # shuts its workers down


def _generators(loader: Any) -> list[torch.Generator]:
    """The generators a fresh iterator draws from besides the global ones: the DataLoader's own (its
    base seed) and its sampler's (a RandomSampler given one)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(loader, "sampler", None)
    owners = (loader, sampler, batch_sampler, getattr(batch_sampler, "sampler", None))
    found: list[torch.Generator] = []
    for owner in owners:
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found):
            found.append(gen)
    return found


@contextlib.contextmanager
def _rng_kept(generators: list[torch.Generator]) -> Iterator[None]:
    """Every RNG state as it was: Python's, NumPy's, torch's (CPU, CUDA once initialized), ``generators``."""
    kept = [(g, g.get_state()) for g in generators]
    py = random.getstate()
    cpu = torch.get_rng_state()
    initialized: Any = torch.cuda.is_initialized  # untyped in torch 2.13; never initialize CUDA just for this
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and initialized() else None
    np_state = None
    np = sys.modules.get("numpy")
    if np is not None:
        np_state = np.random.get_state()
    try:
        yield
    finally:
        random.setstate(py)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if np is not None and np_state is not None:
            np.random.set_state(np_state)
        for g, state in kept:
            g.set_state(state)


def _batch_shape(batch: Any) -> tuple[int, int] | None:
    """(batch, seq) of ``input_ids`` (or the first 2-D tensor) in a batch."""
    if isinstance(batch, Mapping):
        values = [batch.get("input_ids"), *batch.values()]
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        values = [batch]
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim() == 2:
            return int(v.shape[0]), int(v.shape[1])
    return None


def _arguments_doc(
    args: Any, ds: dict[str, Any] | None, attention: str, checkpointing: bool
) -> dict[str, Any]:
    """``args`` as the dict ``--from`` reads from a TrainingArguments JSON (``to_dict()``; a plain object's
    attributes), with the resolved DeepSpeed config inline, the model's attention implementation and
    the model's own checkpointing switch."""
    to_dict = getattr(args, "to_dict", None)
    doc = dict(to_dict()) if callable(to_dict) else {k: v for k, v in vars(args).items() if k[0] != "_"}
    doc["deepspeed"] = ds
    doc["attn_implementation"] = attention
    if checkpointing:
        doc["gradient_checkpointing"] = True
    for key in ("parallelism_config", "world_size", "device", "hf_deepspeed_config"):
        doc.pop(key, None)  # read live below (tp/cp, processes), or not an argument
    return doc


def _live_parallel(args: Any, read: Read) -> dict[str, int]:
    """What only the running job knows: the number of processes, per node, and tp/cp sizes."""
    gpus = int(getattr(args, "world_size", 1) or 1)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or min(gpus, DEFAULT_GPUS_PER_NODE)
    out = {"gpus": gpus, "gpus_per_node": per_node}
    if gpus > 1:
        read.append(("gpus", str(gpus), "TrainingArguments.world_size"))
    pc = getattr(args, "parallelism_config", None)
    for attr, key in (("tp_size", "tp"), ("cp_size", "cp")):
        size = getattr(pc, attr, 1) if pc is not None else 1
        if isinstance(size, int) and size > 1:
            out[key] = size
            read.append((key, str(size), f"TrainingArguments.parallelism_config.{attr}"))
    return out


def built_under_zero_init(model: Any) -> bool | None:
    """Whether ``model``'s parameters are DeepSpeed ZeRO-3 partitioned ones (``zero.Init`` gives each an
    ``ds_id``: deepspeed partition_parameters.py ``_convert_to_deepspeed_param``), read where the Trainer
    has built the model but not yet run ``deepspeed.initialize`` (which converts the rest); None without
    parameters."""
    params = list(getattr(_unwrap(model), "parameters", lambda: [])()) if model is not None else []
    if not params:
        return None
    return all(hasattr(p, "ds_id") for p in params)


def job_from_trainer(
    args: Any, model: Any, batch: Any = None, *, seq: int | None = None, zero_init: bool | None = None
) -> Job:
    """The training job the Trainer will run: ``args`` (``TrainingArguments``), ``model`` (as the Trainer
    holds it: a transformers model, a peft ``PeftModel``, possibly wrapped), ``batch`` (its first batch,
    :func:`first_batch`) and ``seq`` (overrides the batch's length). The arguments map through
    :func:`peakmem.fromfile.map_training_arguments` (what ``peakmem train --from`` does with the same
    arguments written to JSON); the model adds its peft adapter, bitsandbytes quantization, weight dtype
    and attention implementation, the first batch its shape; ``zero_init`` whether the model was built under
    ZeRO-3's ``zero.Init`` (:func:`built_under_zero_init`, read before ``deepspeed.initialize``; None: not
    known). Every field is echoed in ``Job.read`` with the place it came from; what is not modelled raises
    :class:`InputError`."""
    from dataclasses import replace
    from types import SimpleNamespace

    from peakmem import options
    from peakmem.fromfile import apply, map_training_arguments
    from peakmem.hf import spec_from_config
    from peakmem.question import parallelism, training_setup

    model = _unwrap(model)
    read: Read = []
    notes: list[str] = []
    name, config = _config_dict(model)
    spec = spec_from_config(config, name=name)
    peft = _is_peft(model)
    base = model.get_base_model() if peft else model
    weights = _weight_dtype(model, frozen=peft)
    weights_name = _DTYPE_NAMES.get(weights, str(weights))
    read.append(("weights", weights_name, "the model's parameters"))
    lora = _lora(model, read, notes) if peft else None
    quant = _quant(model, base, _DTYPE_NAMES.get(weights, "bf16"), read)
    method = Method.QLORA if quant is not None else Method.LORA if peft else Method.FULL
    read.append(("method", method.value, "peft adapter / bitsandbytes base" if peft else "no peft adapter"))
    ds = _deepspeed_config(args)
    # transformers 5.23 renamed is_gradient_checkpointing (deprecated, warns) to is_activation_checkpointing
    flag = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else (
        "is_gradient_checkpointing")  # fmt: skip
    attention = str(getattr(base.config, "_attn_implementation", None) or "eager")
    doc = _arguments_doc(args, ds, attention, bool(getattr(base, flag, False)))
    if weights_name not in ("fp32", "bf16", "fp16"):
        raise InputError(f"model weights {weights}: not a dtype peakmem trains in (fp32, bf16, fp16)")
    parallel = _live_parallel(args, read)
    found = map_training_arguments(doc, model=name, method=method.value, strict=True,
                                   weights=(weights_name, "the model's parameters"),
                                   gpus=(parallel["gpus"], "TrainingArguments.world_size"))  # fmt: skip
    autocast = bool(doc.get("bf16") or doc.get("fp16"))
    if autocast and weights != torch.float32 and ds is None:
        notes.append(f"bf16={bool(doc.get('bf16'))} fp16={bool(doc.get('fp16'))} on {weights_name} weights: "
                     f"HF Trainer runs autocast over them; peakmem's {found.options.get('precision')} regime "
                     "has none (ops autocast keeps in fp32, and under LoRA the adapters' input casts, are "
                     "counted as without it)")  # fmt: skip
    notes.extend(found.notes)
    notes.extend(f"not modelled: {item}" for item in found.not_modelled)
    shown = {
        "model",
        "method",
        "gpus",
        "lora-rank",
        "lora-alpha",
        "lora-targets",
        "lora-dropout",
        "dora",
        "quant",
    }
    live = {"attention": f"model.config._attn_implementation={attention}"}  # set into doc above
    read.extend((f.field, str(f.value), live.get(f.field, f.source) + (f": {f.note}" if f.note else ""))
                for f in found.mapped if f.field not in shown)  # fmt: skip
    micro_batch = int(args.per_device_train_batch_size)
    shape = _batch_shape(batch)
    if shape is not None and shape[0] != micro_batch:
        notes.append(f"the first batch holds {shape[0]} rows, per_device_train_batch_size={micro_batch}: "
                     f"counting {shape[0]} (what the model sees, e.g. a flattening collator)")  # fmt: skip
        micro_batch = shape[0]
        read.append(("batch", str(micro_batch), "the first batch"))
    if seq is not None:
        seq_len, seq_from = seq, "seq= given to PeakmemCallback"
    elif shape is not None:
        seq_len, seq_from = shape[1], "the first batch's input_ids"
    else:
        raise InputError("seq=None: no first batch to read the sequence length from (an IterableDataset or "
                         "no DataLoader); give PeakmemCallback(seq=...)")  # fmt: skip
    read.append(("seq", str(seq_len), seq_from))
    ns = SimpleNamespace(**options.defaults("train"), model=name)  # the options `peakmem train` takes
    apply(ns, found, explicit=set())
    ns.method, ns.batch, ns.seq = Method.FULL.value, micro_batch, seq_len  # the adapter is set below
    for key, value in parallel.items():
        setattr(ns, key, value)
    # transformers before 5.0 marks a model built under ZeRO-3's zero.Init (modeling_utils.py
    # _from_config / from_pretrained: model._transformers_zero3_init_used = is_deepspeed_zero3_enabled());
    # on any release the callback looks at the parameters before deepspeed.initialize (on_init_end)
    marked = getattr(base, "_transformers_zero3_init_used", None)
    if ns.zero == 3 and False in (marked, zero_init):
        ns.no_zero_init = True
        where = ("model._transformers_zero3_init_used=False" if marked is False
                 else "the model's parameters before deepspeed.initialize (no ds_id)")  # fmt: skip
        read.append(("no-zero-init", "True", where))
    o = options.convert("train", {k: getattr(ns, k) for k in options.defaults("train")})
    setup, _ = training_setup(o, spec.max_position_embeddings)
    setup = replace(setup, method=method, lora=lora, quant=quant)
    bnb = _installed_bitsandbytes(read) if quant is not None else None
    if bnb is not None:
        setup = replace(setup, bitsandbytes=bnb)
    # the transformers release whose model code and loss this Trainer runs (peakmem.transformers_versions),
    # and the accelerate release under it (peakmem.accelerate_versions: its no_sync on FSDP2)
    import accelerate

    setup = replace(setup, transformers=transformers.__version__, accelerate=accelerate.__version__)
    read.append(("transformers", transformers.__version__, "transformers.__version__"))
    read.append(("accelerate", accelerate.__version__, "accelerate.__version__"))
    if method is not Method.FULL:  # what a TRL trainer's release did to the peft model (peakmem.trl_versions)
        setup = _trl_preparation(args, o, setup, read, notes)
    extra = getattr(ns, "from_parallel", None)
    return Job(name=name, config=config, spec=spec, setup=setup, parallelism=parallelism(o, extra),
               read=tuple(read), notes=tuple(notes))  # fmt: skip


def _trl_preparation(args: Any, o: Mapping[str, Any], setup: TrainingSetup, read: Read,
                     notes: list[str]) -> TrainingSetup:  # fmt: skip
    """``setup`` with the ``kbit_prep`` the installed TRL release's trainer applied to its quantized base,
    where ``args`` is a TRL config (SFTConfig, DPOConfig...); the adapters' dtype is the live one (read).
    The release is echoed in ``read`` and its rule's line in ``notes``; the job's flags carry the
    ``--kbit-prep`` it decided (not ``--trl``: the CLI's objective is sft whatever TRL trainer ran)."""
    from dataclasses import replace
    from importlib.metadata import PackageNotFoundError, version

    from peakmem.question import with_trl_release
    from peakmem.trl_versions import parse_trl_version, trl_objective

    objective = trl_objective(type(args))
    if objective is None:
        return setup
    try:
        found = version("trl")
    except PackageNotFoundError:
        return setup
    parse_trl_version(found)  # a release string peakmem cannot read is an InputError naming it
    read.append(("trl", found, f"importlib.metadata.version('trl'), {type(args).__name__}"))
    quant, lora = setup.quant, setup.lora
    asked = {"trl": found, "objective": objective, "method": setup.method.value,
             "precision": setup.precision.value, "quant": quant.quant if quant else None, "zero": o["zero"],
             "fsdp": o["fsdp"], "kbit_prep": None,
             "adapter_dtype": lora.adapter_dtype if lora else None}  # fmt: skip
    filled, lines = with_trl_release(asked)
    notes.extend(lines)
    if quant is None:
        return setup
    return replace(setup, quant=replace(quant, kbit_prep=filled.get("kbit_prep") or "none"))


def trainable_count(model: Any) -> int:
    """Parameters the live model trains (``requires_grad``), ZeRO-3 partitions counted whole."""
    return sum(_numel(p) for p in _unwrap(model).parameters() if p.requires_grad)


def cuda_gpu(device: Any = None) -> Any:
    """The CUDA device as an anonymous :class:`peakmem.catalog.Gpu` of its total memory."""
    from dataclasses import replace

    from peakmem.resolve import gpu_of_size

    _free, total = torch.cuda.mem_get_info(device)
    gpu = gpu_of_size(f"{total}B")
    return replace(gpu, display_name=torch.cuda.get_device_name(device),
                   memory_source="torch.cuda.mem_get_info() total")  # fmt: skip


def job_question(job: Any, gpus: tuple[Any, ...], costs: Any = None) -> Any:
    """The one question a mapped job asks, as ``peakmem train <its flags> --gpu ...`` asks it: the GPUs'
    overheads too (their cuBLAS workspace, and the total a load's replay may reserve up to)."""
    from peakmem.question import Question, overheads

    return Question(command="train", spec=job.spec, training=job.setup, parallel=job.parallelism, gpus=gpus,
                    overheads=overheads({}, gpus), costs=costs)  # fmt: skip


# --- the callback ------------------------------------------------------------------------------------
class PeakmemCallback(TrainerCallback):
    """Estimate the job at train begin; stop it before the first step when it will not fit; on CUDA, log
    measured against predicted peaks after the first optimizer steps.

    ``gpu``: a catalog GPU name or a size (``"H100"``, ``"24GB"``), as ``peakmem --gpu`` takes; default:
    the CUDA device's total memory, or none on the CPU. ``stop_if_no_fit``: raise
    :class:`DoesNotFitError` from ``on_train_begin`` when the job needs more than the device holds.
    ``log``: add the ``peakmem/...`` keys to the Trainer's logs. ``seq``: the sequence length to size for
    (default: the first batch's). ``measure_steps``: optimizer steps whose peaks are logged on CUDA.
    ``strict``: a job peakmem cannot model raises instead of printing why and letting it run.
    ``quiet``: print nothing (the answer stays in :attr:`json`)."""

    def __init__(
        self, gpu: str | None = None, stop_if_no_fit: bool = True, log: bool = True, *,
        seq: int | None = None, measure_steps: int = DEFAULT_MEASURE_STEPS, strict: bool = False,
        quiet: bool = False,
    ) -> None:  # fmt: skip
        from peakmem.resolve import resolve_gpu
        from peakmem.validate import check_bool, check_int

        for flag, value in (("stop_if_no_fit", stop_if_no_fit), ("log", log), ("strict", strict),
                            ("quiet", quiet)):  # fmt: skip
            check_bool(flag, value)
        if seq is not None:
            check_int("seq", seq)
        check_int("measure_steps", measure_steps, minimum=0, maximum=100)
        self.gpu = resolve_gpu(gpu) if gpu is not None else None
        self.stop_if_no_fit = stop_if_no_fit
        self.log = log
        self.seq = seq
        self.measure_steps = measure_steps
        self.strict = strict
        self.quiet = quiet
        self.job: Job | None = None
        self.answer: Any = None  # peakmem.question.Answer
        self.json: dict[str, Any] | None = None  # equals `peakmem train ... --json`
        self.measured: list[dict[str, float]] = []
        self._pending: dict[str, float] = {}
        self._device: Any = None
        self._start_step = 0
        self._zero_init: bool | None = None  # read at on_init_end, before deepspeed.initialize

    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        """The end of ``Trainer.__init__``: the model as built, before ``deepspeed.initialize`` partitions
        it (:func:`built_under_zero_init`)."""
        self._zero_init = built_under_zero_init(model)
        return control

    # The Trainer passes model, train_dataloader, ... as keywords (trainer_callback.CallbackHandler).
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        from peakmem.answers import train_headline
        from peakmem.question import answer
        from peakmem.render import print_estimate
        from peakmem.simulate import measuring_lookup

        main = bool(getattr(state, "is_world_process_zero", True))
        say = main and not self.quiet
        try:
            batch = first_batch(train_dataloader) if self.seq is None else None
            job = job_from_trainer(args, model, batch, seq=self.seq, zero_init=self._zero_init)
        except PeakmemError as e:
            if self.strict:
                raise
            if say:
                print(f"peakmem: cannot estimate this job, training goes on unchecked: {e}", file=sys.stderr)
            return control
        gpu = self.gpu
        device = getattr(args, "device", None)
        on_cuda = torch.cuda.is_available() and getattr(device, "type", None) == "cuda"
        if gpu is None and on_cuda:
            gpu = cuda_gpu(device)
        gpus = [gpu] if gpu is not None else []
        got = answer(job_question(job, tuple(gpus), measuring_lookup()))
        est = got.estimate
        assert est is not None
        self.job, self.answer = job, got
        self.json = got.json
        notes = list(job.notes)
        live = trainable_count(model)
        if live != est.trainable_params:
            notes.append(f"the model trains {live:,} parameters; peakmem counts {est.trainable_params:,} "
                         "(frozen or added parameters it cannot see)")  # fmt: skip
        if say:
            from peakmem.breakdown import Verdict

            read = ", ".join(f"{f}={v} ({w})" for f, v, w in job.read)
            print(f"peakmem: read from the Trainer: {read}", file=sys.stderr)
            for note in notes:
                print(f"peakmem: note: {note}", file=sys.stderr)
            need = est.needed_bytes
            verdicts = [Verdict(gpu=g.name, capacity_bytes=g.usable_bytes, needed_bytes=need) for g in gpus]
            headline = train_headline(job.name, job.setup, est, par=job.parallelism)
            print_estimate(est, headline, verdicts, got.ways.pairs(), got.ways.note)
        self._start_step = int(getattr(state, "global_step", 0) or 0)
        self._record(state, self._predicted(est))
        if on_cuda:
            self._device = device
            torch.cuda.reset_peak_memory_stats(device)
        if gpu is not None and est.needed_bytes > gpu.usable_bytes and self.stop_if_no_fit:
            control.should_training_stop = True
            fitting = [w for w in got.ways.ways if w.needed_bytes <= gpu.usable_bytes]
            best = (f"changes that fit: {'; '.join(w.label for w in fitting[:3])}" if fitting else
                    "no single change makes it fit; `peakmem fit` searches combinations")  # fmt: skip
            raise DoesNotFitError(
                f"{job.name}: the job needs ≈ {fmt_bytes(est.needed_bytes)} on the device, "
                f"{gpu.display_name} holds {fmt_bytes(gpu.usable_bytes)}; stopped before the first step "
                f"({best}; the ways down are printed above and in error.ways)",
                estimate=est,
                ways=got.ways,
                capacity_bytes=gpu.usable_bytes,
            )
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._device is None or self.answer is None:
            return control
        step = int(state.global_step) - self._start_step
        if not 1 <= step <= self.measure_steps:
            return control
        est = self.answer.estimate
        alloc = torch.cuda.max_memory_allocated(self._device)
        reserved = torch.cuda.max_memory_reserved(self._device)
        entry = {
            **self._predicted(est),
            f"{LOG_PREFIX}measured_allocated_gib": round(alloc / GiB, ERROR_DIGITS + 2),
            f"{LOG_PREFIX}measured_reserved_gib": round(reserved / GiB, ERROR_DIGITS + 2),
            f"{LOG_PREFIX}error_pct": _error_pct(est.peak_allocated_bytes, alloc),
            f"{LOG_PREFIX}reserved_error_pct": _error_pct(est.peak_reserved_bytes, reserved),
        }
        self.measured.append(entry)
        self._record(state, entry)
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        if self.log and isinstance(logs, dict) and self._pending:
            logs.update(self._pending)
            self._pending = {}
        return control

    def _predicted(self, est: Any) -> dict[str, float]:
        return {
            f"{LOG_PREFIX}predicted_allocated_gib": round(est.peak_allocated_bytes / GiB, ERROR_DIGITS + 2),
            f"{LOG_PREFIX}predicted_reserved_gib": round(est.peak_reserved_bytes / GiB, ERROR_DIGITS + 2),
            f"{LOG_PREFIX}predicted_device_gib": round(est.device_total_bytes / GiB, ERROR_DIGITS + 2),
        }

    def _record(self, state: Any, entry: Mapping[str, float]) -> None:
        if not self.log:
            return
        history = getattr(state, "log_history", None)
        if isinstance(history, list):
            history.append({**entry, "step": int(getattr(state, "global_step", 0) or 0)})
        self._pending.update(entry)


def _error_pct(predicted: int, measured: int) -> float:
    """(predicted - measured) / measured, in percent (positive: peakmem over-predicts)."""
    return round(100.0 * (predicted - measured) / measured, ERROR_DIGITS) if measured else 0.0


__all__ = ["DoesNotFitError", "Job", "PeakmemCallback", "first_batch", "job_from_trainer", "job_question"]
