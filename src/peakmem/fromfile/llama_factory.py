"""LLaMA-Factory YAML (``src/llamafactory/hparams/{model,finetuning,data}_args.py``): ``model_name_or_path``,
``finetuning_type``, ``quantization_bit``, ``lora_rank`` (default 8), ``lora_alpha`` (default
``2 x lora_rank``), ``lora_target`` (default ``all``), ``cutoff_len`` (default 2048), ``pure_bf16``,
``flash_attn``, ``enable_liger_kernel``, ``use_unsloth(_gc)``, plus ``TrainingArguments`` (LLaMA-Factory's
``hparams/training_args.py`` TrainingArguments is transformers' Seq2SeqTrainingArguments:
:func:`peakmem.fromfile.hf_trainer.common_hf`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakmem.fromfile.hf_trainer import (
    LoraDefaults,
    common_hf,
    finish_precision,
    liger,
    lora_from,
    padded_lengths,
    precision_flags,
)
from peakmem.fromfile.mapper import Row, _Mapper, as_int, names_list, take, truthy

LLAMA_FACTORY_LORA_RANK = 8  # llamafactory/hparams/finetuning_args.py LoraArguments.lora_rank
LLAMA_FACTORY_CUTOFF_LEN = 2048  # llamafactory/hparams/data_args.py DataArguments.cutoff_len
# llamafactory/hparams/training_args.py TrainingArguments subclasses transformers' Seq2SeqTrainingArguments
# without an optim field: transformers' default optimizer stands (hf_trainer.HF_DEFAULT_OPTIM)
LLAMA_FACTORY_DEFAULT_OPTIM_SOURCE = (
    "(transformers default optim=adamw_torch_fused on torch >= 2.8, transformers/training_args.py:806-813; "
    "LLaMA-Factory's hparams/training_args.py keeps it)"
)


def _twice(rank: int) -> float:
    return float(2 * rank)  # LoraArguments.lora_alpha: None -> lora_rank * 2 (finetuning_args.py)


LLAMA_FACTORY_LORA = LoraDefaults(
    who="LLaMA-Factory", rank=LLAMA_FACTORY_LORA_RANK, alpha=_twice, dropout=0.0
)


def map_llama_factory(m: _Mapper, doc: Mapping[str, Any]) -> None:
    if doc.get("model_name_or_path"):
        m.set("model", str(doc["model_name_or_path"]), "model_name_or_path")
    kind = str(doc.get("finetuning_type") or "lora").lower()
    if kind == "lora":
        bits = as_int(m, "quantization_bit", doc.get("quantization_bit"))
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
            if "double_quantization" in doc and not truthy(doc["double_quantization"]):
                m.set("no_double_quant", True, "double_quantization")
        elif bits is not None:
            m.skip("quantization_bit", bits, "a base format peakmem's QLoRA does not model")
        lora_from(m, doc, "lora_rank", LLAMA_FACTORY_LORA)
        target = doc.get("lora_target", "all")
        names = names_list(target)
        src = "lora_target" if "lora_target" in doc else "(LLaMA-Factory default: all)"
        m.set("lora_targets", "all-linear" if names in (["all"], []) else ",".join(names), src)
        if doc.get("additional_target"):
            m.skip("additional_target", doc["additional_target"], "trainable copies of these modules")
    elif kind == "full":
        m.set("method", "full", "finetuning_type")
    else:
        m.set("method", "full", "finetuning_type", "counted as full fine-tuning (an upper bound)")
        m.skip("finetuning_type", kind, "only some layers train")
    take(m, doc, (Row("cutoff_len", "seq", as_int),))
    m.set("seq", LLAMA_FACTORY_CUTOFF_LEN, "(LLaMA-Factory default cutoff_len)", keep=True)
    padded_lengths(m, doc, ("packing", "neat_packing"))
    fa = str(doc.get("flash_attn") or "").lower()
    if fa in ("fa2", "fa3"):
        m.set("attention", "flash", "flash_attn")
    elif fa == "sdpa":
        m.set("attention", "sdpa", "flash_attn")
    elif fa == "disabled":
        m.set("attention", "eager", "flash_attn")
    if truthy(doc.get("enable_liger_kernel")):
        liger(m, "enable_liger_kernel")
    if truthy(doc.get("use_unsloth")):
        m.set("framework", "unsloth", "use_unsloth", "unsloth's kernels and loss (formulas/profiles.py)")
        m.kernel("unsloth", "model")
    if truthy(doc.get("use_unsloth_gc")):
        m.set("checkpointing", "full", "use_unsloth_gc")
        m.set(
            "activation_offload",
            True,
            "use_unsloth_gc",
            "unsloth offloaded checkpointing: layer inputs in CPU RAM (kernels['offloaded_checkpointing'])",
        )
        m.kernel("offloaded_checkpointing", True)
    precision_flags(m, doc)
    pure = truthy(doc.get("pure_bf16"))
    if pure:
        m.half = ("bf16", m.src("pure_bf16"))
    weights = (
        ("bf16", m.half[1]) if m.half and m.half[0] == "bf16" else (("fp16", m.half[1]) if m.half else None)
    )
    # LLaMA-Factory's default (disable_gradient_checkpointing: false) turns checkpointing on
    # (llamafactory/model/model_utils/checkpointing.py prepare_model_for_training).
    if "gradient_checkpointing" not in doc:
        off = truthy(doc.get("disable_gradient_checkpointing"))
        m.set(
            "checkpointing",
            "none" if off else "full",
            "disable_gradient_checkpointing" if off else "(LLaMA-Factory default: gradient checkpointing on)",
            keep=True,
        )
    common_hf(m, doc, default_optim=LLAMA_FACTORY_DEFAULT_OPTIM_SOURCE)
    finish_precision(m, weights, upcast_full=not pure)
