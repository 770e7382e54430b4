"""transformers ``TrainingArguments`` / TRL ``SFTConfig`` + ``ModelConfig`` as JSON or YAML
(alignment-handbook recipes): ``per_device_train_batch_size``, ``gradient_accumulation_steps``,
``bf16``/``fp16``, ``gradient_checkpointing``, ``optim``, ``max_seq_length``/``max_length``, ``packing``,
``torch_dtype``, ``attn_implementation``, ``use_peft``/``lora_*``, ``load_in_4bit/8bit``,
``use_liger_kernel``, ``deepspeed``, ``fsdp``/``fsdp_config``.

The TrainingArguments-level pieces here (optimizer names, precision rule, checkpointing, attention,
Liger, FSDP, :func:`common_hf`) are shared with axolotl and LLaMA-Factory, which hand them to the HF
Trainer, and with PeakmemCallback's live ``args.to_dict()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peakmem.errors import InputError
from peakmem.fromfile.accelerate import FSDP_OFFLOAD_NOTE, FSDP_STRATEGIES, fsdp_config
from peakmem.fromfile.deepspeed import map_deepspeed
from peakmem.fromfile.mapper import Row, _Mapper, as_float, as_int, get, is_auto, names_list, take, truthy
from peakmem.fromfile.post_training import map_post_training, objective

TRL_LORA_R, TRL_LORA_ALPHA, TRL_LORA_DROPOUT = 16, 32, 0.05  # trl/trainer/model_config.py ModelConfig
TRL_MAX_LENGTH = 1024  # trl/trainer/sft_config.py SFTConfig.max_length
# what TRL does to a quantized base differs by release (peakmem.trl_versions) and a config file names none
TRL_RELEASE_NOTE = (
    "the file names no TRL release: the quantized base is counted as the options say (--kbit-prep none, "
    "peft's fp32 adapters: neither SFTTrainer 0.7.5-0.25's kbit preparation nor 0.26+'s bf16 adapters); "
    "--trl VERSION counts that release's"
)

# HF TrainingArguments.optim (transformers 5.23 training_args.py OptimizerNames) and axolotl's additions ->
# peakmem optimizer, implementation (whose step temporaries it has, as transformers/trainer_optimizer.py
# builds it; None: the command line's default), note. The ONE table: ``--from`` and PeakmemCallback use it.
_BNB = "bitsandbytes: one fused kernel per tensor (trainer_optimizer.py _get_bitsandbytes_optimizer)"
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
    "paged_adamw_32bit": ("paged-adamw", "fused", _BNB),
    "paged_adamw": ("paged-adamw", "fused", _BNB),
    "adamw_torch_4bit": ("adamw-4bit", "fused", f"{_TORCHAO}; {TORCHAO_4BIT_NOTE}"),
    "adamw_torch_8bit": ("adamw-8bit-torchao", "fused", _TORCHAO),
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

_ATTENTION = {  # transformers attn_implementation -> peakmem --attention
    "eager": "eager",
    "sdpa": "sdpa",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "kernels-community/flash-attn": "flash",
    "kernels-community/vllm-flash-attn3": "flash",
}  # other Hub kernels whose name says flash ("kernels-community/...flash...") count as flash too
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
    "parallelism_config": "tensor/context/sequence parallelism from the file: give --tp / --cp / --ulysses",
}


# A file that leaves ``optim`` out gets TrainingArguments' default: transformers 5.23 training_args.py
# lines 806-813, default_optim = "adamw_torch", "adamw_torch_fused" where is_torch_greater_or_equal_than_2_8
# (peakmem assumes a current torch, as the installed one). Counted as a field of its own, so the echo
# shows it; another file's optimizer (a DeepSpeed "optimizer" section) wins over it in either order.
HF_DEFAULT_OPTIM = "adamw_torch_fused"
HF_DEFAULT_OPTIM_SOURCE = (
    "(transformers default optim=adamw_torch_fused on torch >= 2.8: transformers/training_args.py:806-813)"
)


def default_optimizer(m: _Mapper, name: str, source: str) -> None:
    """The framework's default ``optim`` (``source``: where it is defined), weaker than any file's value."""
    hf_optimizer(m, source, name)
    m.defaults.update(("optimizer", "optimizer_impl"))


def hf_optimizer(m: _Mapper, key: str, value: Any, optim_args: Any = None) -> None:
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


def precision_flags(m: _Mapper, doc: Mapping[str, Any]) -> None:
    for key in ("bf16", "bfloat16"):
        if truthy(doc.get(key)):
            m.half = ("bf16", m.src(key))
            if is_auto(doc.get(key)):
                m.notes.append(
                    f"{m.src(key)} = auto: bf16 where the GPU has it (Ampere or newer), as assumed"
                )
            return
    for key in ("fp16", "float16"):
        if truthy(doc.get(key)):
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


@dataclass(frozen=True)
class LoraDefaults:
    """A framework's LoRA defaults, used where the file turns LoRA on but leaves a value out."""

    who: str
    rank: int
    alpha: Callable[[int], float]  # of the rank
    dropout: float


_LORA_ROWS = (Row("lora_alpha", "lora_alpha", as_float), Row("lora_dropout", "lora_dropout", as_float))


def lora_from(m: _Mapper, doc: Mapping[str, Any], rank_key: str, defaults: LoraDefaults | None) -> None:
    take(m, doc, (Row(rank_key, "lora_rank", as_int), *_LORA_ROWS))
    if defaults is not None:
        source = f"({defaults.who} default)"
        m.set("lora_rank", defaults.rank, source, keep=True)
        m.set("lora_alpha", defaults.alpha(m.options["lora_rank"]), source, keep=True)
        m.set("lora_dropout", defaults.dropout, source, keep=True)
    if truthy(doc.get("use_dora")) or truthy(doc.get("peft_use_dora")):
        m.set("dora", True, "use_dora" if "use_dora" in doc else "peft_use_dora")


def _fsdp_hf(m: _Mapper, doc: Mapping[str, Any], default_version: int) -> None:
    """TrainingArguments / axolotl ``fsdp`` (``True``, or the legacy string or list of options) +
    ``fsdp_config``. transformers 5.23 rewrites the legacy options into ``fsdp=True`` with
    ``fsdp_config`` ``reshard_after_forward`` / ``cpu_offload`` (training_args.py
    ``_process_fsdp_args``) and builds FSDP ``fsdp_config.get("version", 2)``."""
    value = doc.get("fsdp")
    words = [w.lower() for w in names_list(value)] if value not in (None, False, True, "") else []
    for word in words:
        if word in FSDP_STRATEGIES:
            m.set("fsdp", FSDP_STRATEGIES[word], "fsdp")
        elif word == "offload":
            m.set("offload_params", "cpu", "fsdp", FSDP_OFFLOAD_NOTE)
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
        fsdp_config(m, config, "fsdp_config", default_version=default_version)
    elif words or value is True:
        m.set("fsdp_version", default_version, f"(FSDP{default_version} unless fsdp_config says otherwise)")
        if "fsdp" not in m.options:
            m.set("fsdp", "full-shard", "(FSDP's default sharding: FULL_SHARD)")


LIGER_NOTE = "Liger RMSNorm, SwiGLU, RoPE and fused linear cross-entropy (formulas/profiles.py)"


# accelerate's TorchDynamoPlugin (transformers trainer.py create_accelerator_and_postprocess) compiles the
# whole model, and transformers' ForCausalLMLoss runs inside its forward when labels are passed: one graph,
# no break (transformers 5.23, torch 2.13; benchmarks/compiled_loss.py)
COMPILED_LOSS_NOTE = "the cross-entropy is compiled with the model: the fp32 logits copy never exists"


def liger(m: _Mapper, key: str) -> None:
    m.set("liger", True, key, LIGER_NOTE)
    for kernel in ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy"):
        m.kernel("liger", kernel)


# transformers 5.23 training_args.py: FSDP version fsdp_config.get("version", 2)
HF_FSDP_DEFAULT_VERSION = 2

_BATCH_ROWS = (
    Row("per_device_train_batch_size", "batch", as_int),
    Row("gradient_accumulation_steps", "grad_accum", as_int),
    # transformers 5.23 trainer.py _inner_training_loop: every micro-batch synced with sync_each_batch
    # (peakmem.defaults GRAD_SYNC: accelerate's no_sync otherwise)
    Row("accelerator_config.gradient_accumulation_kwargs.sync_each_batch", "grad_sync",
        lambda m, key, value: None if value is None else ("each-micro-batch" if truthy(value) else None)),
)  # fmt: skip


def common_hf(
    m: _Mapper,
    doc: Mapping[str, Any],
    fsdp_version: int = HF_FSDP_DEFAULT_VERSION,
    default_optim: str | None = HF_DEFAULT_OPTIM_SOURCE,
) -> None:
    """TrainingArguments keys shared by axolotl, LLaMA-Factory and TRL files (and PeakmemCallback's live
    ``args.to_dict()``). ``default_optim``: the source of transformers' default optimizer where ``doc``
    has no ``optim`` (None: the caller read the optimizer itself)."""
    take(m, doc, _BATCH_ROWS)
    # transformers 5 renames gradient_checkpointing to activation_checkpointing (both are written)
    present = [k for k in ("gradient_checkpointing", "activation_checkpointing") if doc.get(k) is not None]
    gc_key = next((k for k in present if truthy(doc[k])), present[0] if present else "")
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
    elif gc is not None and truthy(gc):
        m.set("checkpointing", "full", gc_key)
    elif gc is not None:
        m.set("checkpointing", "none", gc_key)
    if doc.get("optim") is not None:
        hf_optimizer(m, "optim", doc["optim"], doc.get("optim_args"))
    elif default_optim is not None:
        default_optimizer(m, HF_DEFAULT_OPTIM, default_optim)
    if doc.get("attn_implementation"):
        _attention_impl(m, "attn_implementation", doc["attn_implementation"])
    elif truthy(doc.get("use_flash_attention_2")):
        m.set("attention", "flash", "use_flash_attention_2")
    if truthy(doc.get("use_liger_kernel")):
        liger(m, "use_liger_kernel")
    if truthy(doc.get("torch_compile")):
        m.set(
            "compile",
            True,
            "torch_compile",
            "compiled layers save what Inductor keeps (formulas/profiles.py)",
        )
        m.kernel("compile", True)
        if not truthy(doc.get("use_liger_kernel")):
            m.set("loss", "compiled", "torch_compile", COMPILED_LOSS_NOTE)
    ds = doc.get("deepspeed")
    if isinstance(ds, Mapping):
        map_deepspeed(m, ds, "deepspeed")
    _fsdp_hf(m, doc, fsdp_version)
    for key in sorted(doc):
        if key in _NOT_MODELLED and doc[key] not in (None, False, "", [], 0):
            if key in ("use_dora", "lora_modules_to_save", "optim_target_modules"):
                continue  # mapped elsewhere, or a kernel flag
            m.skip(key, doc[key], _NOT_MODELLED[key])
    map_post_training(m, doc)


def quant_hf(m: _Mapper, doc: Mapping[str, Any], *, double_quant_default: bool, who: str) -> str | None:
    """load_in_4bit / load_in_8bit -> 'nf4' / 'int8'."""
    if truthy(doc.get("load_in_4bit")):
        qtype = str(doc.get("bnb_4bit_quant_type") or "nf4").lower()
        if qtype != "nf4":
            m.set("quant", qtype, "bnb_4bit_quant_type")
        dq_key = next((k for k in ("bnb_4bit_use_double_quant", "use_bnb_nested_quant") if k in doc), None)
        dq = truthy(doc[dq_key]) if dq_key else double_quant_default
        if not dq:
            m.set("no_double_quant", True, dq_key or f"({who} default: no double quantization)")
        return "load_in_4bit"
    if truthy(doc.get("load_in_8bit")):
        m.set("quant", "int8", "load_in_8bit", "bitsandbytes LLM.int8 base")
        return "load_in_8bit"
    return None


_PACKED = "every row holds seq tokens (packed, or padded to seq)"
_PADDED = "each batch padded to its longest sample: the step replayed at rising lengths"


def padded_lengths(m: _Mapper, doc: Mapping[str, Any], keys: Sequence[str], default: str = "") -> None:
    """Packing keys -> ``--padded-lengths``: ``fixed`` where any key packs rows or pads them to seq,
    ``varying`` where the keys given leave each batch padded to its longest sample; ``default`` (a source
    such as "(torchtune default: ...)") sets ``varying`` where no key is given."""
    given = [key for key in keys if key in doc and doc[key] is not None]
    packed = [key for key in given if truthy(doc[key])]
    if packed:
        m.set("padded_lengths", "fixed", packed[0], _PACKED)
    elif given:
        m.set("padded_lengths", "varying", given[0], _PADDED)
    elif default:
        m.set("padded_lengths", "varying", default, _PADDED)


def finish_precision(m: _Mapper, weights: tuple[str, str] | None, *, upcast_full: bool) -> None:
    method = str(m.options.get("method", "full"))
    _hf_precision(m, method, weights, upcast_full)


def _trl_alpha(rank: int) -> float:
    return float(TRL_LORA_ALPHA)


TRL_LORA = LoraDefaults(who="TRL ModelConfig", rank=TRL_LORA_R, alpha=_trl_alpha, dropout=TRL_LORA_DROPOUT)


def map_hf(m: _Mapper, doc: Mapping[str, Any]) -> None:
    model = doc.get("model_name_or_path") or doc.get("model_id")
    if model:
        m.set("model", str(model), "model_name_or_path" if "model_name_or_path" in doc else "model_id")
    quant_key = quant_hf(m, doc, double_quant_default=False, who="TRL ModelConfig")
    if truthy(doc.get("use_peft")) or quant_key:
        m.set("method", "qlora" if quant_key else "lora", quant_key or "use_peft")
        lora_from(m, doc, "lora_r", TRL_LORA)
        targets = names_list(doc.get("lora_target_modules"))
        if targets:
            joined = ",".join(targets)
            m.set("lora_targets", "all-linear" if joined == "all-linear" else joined, "lora_target_modules")
        else:
            m.set("lora_targets", "default", "(peft default targets for the model type)")
        if doc.get("lora_modules_to_save"):
            m.skip("lora_modules_to_save", doc["lora_modules_to_save"], "trainable copies of these modules")
        if quant_key:
            m.notes.append(TRL_RELEASE_NOTE)
    else:
        m.set("method", "full", "(no use_peft: full fine-tuning)")
    for key in ("max_seq_length", "max_length", "model_max_length"):
        if doc.get(key) is not None:
            value = as_int(m, key, doc[key])
            if value is not None:
                m.set("seq", value, key)
                break
    else:
        if (
            objective(doc) is None or "max_prompt_length" not in doc
        ):  # else: prompt + completion (post_training)
            m.notes.append(
                f"no sequence length in the file: TRL SFTConfig's default max_length is {TRL_MAX_LENGTH}; "
                "peakmem's default applies unless --seq is given"
            )
    padded_lengths(m, doc, ("packing",))
    precision_flags(m, doc)
    weights = None
    for key in ("torch_dtype", "dtype", "model_init_kwargs.torch_dtype", "model_init_kwargs.dtype"):
        value = get(doc, key)
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
    training_arguments(m, doc, weights)


def training_arguments(m: _Mapper, doc: Mapping[str, Any], weights: tuple[str, str] | None) -> None:
    """The TrainingArguments-level fields: precision flags (with the weights' dtype), batch, accumulation,
    checkpointing, optimizer, attention, Liger, DeepSpeed, FSDP. The one mapping of them, for ``--from``
    (:func:`map_hf`) and for PeakmemCallback's live arguments (:func:`map_training_arguments`)."""
    precision_flags(m, doc)
    if weights is None and m.options.get("method") in ("lora", "qlora") and m.half:
        weights = (m.half[0], m.half[1])
    common_hf(m, doc)
    finish_precision(m, weights, upcast_full=False)
