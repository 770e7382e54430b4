"""axolotl YAML (axolotl ``src/axolotl/utils/schemas/config.py`` ``AxolotlInputConfig``): ``base_model``,
``adapter``, ``load_in_4bit/8bit``, ``lora_*``, ``micro_batch_size``, ``sequence_len``, ``sample_packing``,
``gradient_checkpointing`` (``true`` or ``offload``), ``optimizer``, ``flash_attention``, ``sdp_attention``,
Liger plugin keys, ``deepspeed``, ``fsdp``/``fsdp_config``; the rest of its keys are TrainingArguments'
(axolotl hands them to the HF Trainer: :func:`peakmem.fromfile.hf_trainer.common_hf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakmem.fromfile.hf_trainer import (
    common_hf,
    default_optimizer,
    finish_precision,
    hf_optimizer,
    liger,
    lora_from,
    padded_lengths,
    precision_flags,
    quant_hf,
)
from peakmem.fromfile.mapper import Field, Row, _Mapper, as_int, names_list, take, truthy

AXOLOTL_FSDP_DEFAULT_VERSION = 1  # axolotl fsdp_config without fsdp_version: accelerate's FSDP1 plugin
# axolotl src/axolotl/utils/schemas/training.py HyperparametersConfig.optimizer: default "adamw_torch_fused"
# (handed to TrainingArguments.optim; the same as transformers' own default on torch >= 2.8)
AXOLOTL_DEFAULT_OPTIMIZER = "adamw_torch_fused"
AXOLOTL_DEFAULT_OPTIMIZER_SOURCE = (
    "(axolotl default optimizer=adamw_torch_fused: "
    "src/axolotl/utils/schemas/training.py HyperparametersConfig.optimizer)"
)
AXOLOTL_SEQUENCE_LEN = 512  # axolotl src/axolotl/utils/schemas/config.py AxolotlInputConfig.sequence_len
_ROWS = (
    Row("micro_batch_size", "batch", as_int),
    Row("gradient_accumulation_steps", "grad_accum", as_int),
    Row("sequence_len", "seq", as_int),
)

# keys read here that TrainingArguments does not take (common_hf reads the rest)
_OWN_KEYS = (
    "optimizer",
    "context_parallel_size",
    "sequence_parallel_degree",
    "tiled_mlp",
    "tiled_mlp_num_shards",
    "activation_offloading",
    "heads_k_stride",
    "ring_attn_func",
)
# axolotl src/axolotl/utils/schemas/config.py AxolotlInputConfig.context_parallel_size: "a divisor of the
# number of GPUs available to split sequences into chunks of equal size" (ring-flash-attn across the
# group; utils/schemas/validation.py check_context_parallel_size takes the deprecated
# sequence_parallel_degree where context_parallel_size is unset). utils/distributed.py
# _get_parallel_config_kwargs: the world is tp x cp x the data-parallel rest, so cp GPUs at the least.
_CP_KEYS = ("context_parallel_size", "sequence_parallel_degree")
CP_NOTE = "context parallelism: each sequence split into cp equal chunks across cp GPUs, ring attention"
CP_GPUS_NOTE = "the context-parallel group and no data parallelism; give --gpus for more"


def _context_parallel(m: _Mapper, doc: Mapping[str, Any]) -> None:
    key = next((k for k in _CP_KEYS if doc.get(k)), None)
    cp = as_int(m, key, doc[key]) if key else None
    if key is None or cp is None:
        return
    m.set("cp", cp, key, CP_NOTE)
    if cp > 1:
        m.implied_gpus = Field("gpus", cp, m.src(key), CP_GPUS_NOTE)


# axolotl src/axolotl/utils/schemas/config.py: tiled_mlp (ALST TiledMLP), tiled_mlp_num_shards (unset: the
# patch's own rule, src/axolotl/monkeypatch/tiled_mlp/patch.py: ceil(seqlen / 32768) over each rank's
# tokens, peakmem.formulas.long_context.AXOLOTL_SHARD_TOKENS); activation_offloading true | "legacy" |
# "hidden_states" keep saved activations (or checkpoint inputs) in CPU RAM, "disk" writes them to disk
# (TRL's offloader); heads_k_stride and ring_attn_func tune ring-flash-attn's K/V exchange.
TILED_NOTE = "ALST tiled MLP: the MLP in sequence shards, recomputed in backward"
RING_NOTE = "ring-flash-attn's K/V exchange (heads_k_stride k/v heads at a time); counted as the ring's own"


def _long_context(m: _Mapper, doc: Mapping[str, Any]) -> None:
    from peakmem.formulas.long_context import AXOLOTL_SHARD_TOKENS

    if truthy(doc.get("tiled_mlp")):
        m.set("tiled_mlp", True, "tiled_mlp", TILED_NOTE)
        shards = as_int(m, "tiled_mlp_num_shards", doc.get("tiled_mlp_num_shards"))
        if shards is not None:
            m.set("tiled_mlp_shards", shards, "tiled_mlp_num_shards")
        else:
            local = int(m.options.get("seq") or AXOLOTL_SEQUENCE_LEN) // int(m.options.get("cp") or 1)
            rule = max(1, -(-local // AXOLOTL_SHARD_TOKENS))
            m.set("tiled_mlp_shards", rule, "(axolotl tiled_mlp default)",
                  f"ceil(seq/cp / {AXOLOTL_SHARD_TOKENS:,}): monkeypatch/tiled_mlp/patch.py")  # fmt: skip
    offload = doc.get("activation_offloading")
    mode = offload.strip().lower() if isinstance(offload, str) else ""
    if mode == "disk":
        m.skip("activation_offloading", offload, "activations written to disk (TRL's offloader)")
    elif mode in ("legacy", "hidden_states") or truthy(offload):
        m.set("activation_offload", True, "activation_offloading", "saved activations kept in CPU RAM")
    for key in ("heads_k_stride", "ring_attn_func"):
        if doc.get(key) is not None:
            m.skip(key, doc[key], RING_NOTE)


# roundup_power2_divisions in the PYTORCH_CUDA_ALLOC_CONF axolotl's CLI sets (utils/__init__.py
# set_pytorch_cuda_alloc_conf, @ba3dba3e .. @c1193823)
AXOLOTL_ROUNDUP_DIVISIONS = 16


def map_axolotl(m: _Mapper, doc: Mapping[str, Any]) -> None:
    if doc.get("base_model"):
        m.set("model", str(doc["base_model"]), "base_model")
    # axolotl's CLI (cli/main.py, @ba3dba3e .. @c1193823) calls set_pytorch_cuda_alloc_conf() before torch
    # touches CUDA: PYTORCH_CUDA_ALLOC_CONF (PYTORCH_ALLOC_CONF on torch >= 2.9) =
    # "expandable_segments:True,roundup_power2_divisions:16" unless the user set one (torch >= 2.2)
    note = (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,roundup_power2_divisions:16 unless already set "
        "(utils/__init__.py set_pytorch_cuda_alloc_conf)"
    )
    m.set("expandable_segments", True, "(axolotl's CLI)", note)
    m.set(
        "alloc_roundup_divisions",
        AXOLOTL_ROUNDUP_DIVISIONS,
        "(axolotl's CLI)",
        "each block above 8 KiB rounded up to the next 16th of its power of two: up to 6 % more",
    )
    adapter = str(doc.get("adapter") or "").lower()
    quant_key = None
    if adapter in ("lora", "qlora"):
        quant_key = quant_hf(m, doc, double_quant_default=True, who="axolotl")
        method = "qlora" if adapter == "qlora" or quant_key else "lora"
        m.set("method", method, "adapter", f"with {quant_key}" if quant_key and adapter == "lora" else "")
        if quant_key and not any(doc.get(k) for k in ("fsdp", "fsdp_config", "deepspeed")):
            # loaders/model.py (@c1193823) _prepare_model_for_quantization: peft's
            # prepare_model_for_kbit_training (skipped under qlora + FSDP and ZeRO-3, left at none here
            # for any sharded run), then _convert_embedding_modules_dtype: norms, embeddings, head back
            # (formulas/kbit_prep.py)
            note = "axolotl's QLoRA preparation: the rest's 16-bit weights fp32"
            m.set("kbit_prep", "axolotl", quant_key, note)
        lora_from(m, doc, "lora_r", None)
        if truthy(doc.get("lora_target_linear")):
            m.set("lora_targets", "all-linear", "lora_target_linear")
        elif doc.get("lora_target_modules"):
            m.set("lora_targets", ",".join(names_list(doc["lora_target_modules"])), "lora_target_modules")
        if doc.get("lora_target_parameters"):  # peft target_parameters (examples/gpt-oss: experts of 22-23)
            names = ",".join(names_list(doc["lora_target_parameters"]))
            m.set("lora_target_parameters", names, "lora_target_parameters")
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
    take(m, doc, _ROWS)
    micro, accum = m.options.get("batch"), m.options.get("grad_accum")
    total = as_int(m, "batch_size", doc.get("batch_size"))
    # axolotl: two of micro_batch_size, gradient_accumulation_steps and batch_size give the third
    if accum is not None and micro is None and total is not None:
        m.set(
            "batch",
            max(1, total // accum),
            "batch_size",
            "axolotl: batch_size // gradient_accumulation_steps",
        )
    elif accum is None and micro and total is not None:
        m.set("grad_accum", max(1, total // micro), "batch_size", "axolotl: batch_size // micro_batch_size")
    m.set("seq", AXOLOTL_SEQUENCE_LEN, "(axolotl default sequence_len)", keep=True)
    padded_lengths(m, doc, ("sample_packing", "pad_to_sequence_len"))
    if doc.get("optimizer"):
        hf_optimizer(m, "optimizer", doc["optimizer"])
    else:
        default_optimizer(m, AXOLOTL_DEFAULT_OPTIMIZER, AXOLOTL_DEFAULT_OPTIMIZER_SOURCE)
    if truthy(doc.get("flash_attention")):
        m.set("attention", "flash", "flash_attention")
    elif truthy(doc.get("sdp_attention")):
        m.set("attention", "sdpa", "sdp_attention")
    elif truthy(doc.get("eager_attention")):
        m.set("attention", "eager", "eager_attention")
    plugins = [str(p) for p in doc.get("plugins") or []]
    liger_flags = ("liger_fused_linear_cross_entropy", "liger_rms_norm", "liger_glu_activation")
    if all(truthy(doc.get(flag)) for flag in liger_flags):
        liger(m, "liger_fused_linear_cross_entropy")  # the kernels --liger models, all on
    elif truthy(doc.get("liger_fused_linear_cross_entropy")) or truthy(doc.get("liger_cross_entropy")):
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
        if truthy(doc.get(flag)):
            m.kernel("liger", name)
            if not m.options.get("liger"):
                m.skip(flag, True, "one Liger kernel alone: peakmem models them together (--liger)")
    if any("CutCrossEntropy" in p for p in plugins) or truthy(doc.get("cut_cross_entropy")):
        m.set(
            "loss",
            "fused",
            "plugins" if plugins else "cut_cross_entropy",
            "cut-cross-entropy: no full logits",
        )
        m.kernel("cut_cross_entropy", True)
    for flag in ("unsloth_cross_entropy_loss", "unsloth_lora_mlp", "unsloth_lora_qkv", "unsloth_lora_o"):
        if truthy(doc.get(flag)):
            m.kernel("unsloth", flag.removeprefix("unsloth_"))
    weights = ("bf16", m.src("bf16")) if truthy(doc.get("bf16")) else None
    if weights is None and truthy(doc.get("fp16")):
        weights = ("fp16", m.src("fp16"))
    if weights is None and truthy(doc.get("float32")):
        weights = ("fp32", m.src("float32"))
    precision_flags(m, doc)
    _context_parallel(m, doc)
    _long_context(m, doc)
    common_hf(m, {k: v for k, v in doc.items() if k not in _OWN_KEYS}, AXOLOTL_FSDP_DEFAULT_VERSION, None)
    finish_precision(m, weights, upcast_full=False)
