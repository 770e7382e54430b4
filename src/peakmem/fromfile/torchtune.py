"""torchtune recipe YAML (``recipes/configs/*``): ``model._component_`` (``lora_``/``qlora_`` builders,
``lora_rank``, ``lora_alpha``, ``lora_attn_modules``, ``apply_lora_to_mlp``), ``batch_size`` (per device),
``tokenizer.max_seq_len``, ``dtype``, ``optimizer._component_``, ``loss._component_``,
``enable_activation_checkpointing``, ``enable_activation_offloading``, ``optimizer_in_bwd``, ``compile``,
``dataset.packed``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from peakmem.fromfile.hf_trainer import padded_lengths
from peakmem.fromfile.mapper import (
    Row,
    _Mapper,
    as_bool,
    as_checkpointing,
    as_float,
    as_int,
    get,
    names_list,
    take,
    truthy,
)

# torchtune optimizer._component_ -> peakmem optimizer (and a note)
_COMPONENT_OPTIMIZERS: dict[str, tuple[str, str]] = {
    "torch.optim.AdamW": ("adamw", ""),
    "torch.optim.Adam": ("adam", ""),
    "torch.optim.SGD": ("sgd", ""),
    "bitsandbytes.optim.AdamW8bit": ("adamw-8bit", ""),
    "bitsandbytes.optim.PagedAdamW8bit": ("paged-adamw-8bit", ""),
    "bitsandbytes.optim.PagedAdamW": ("paged-adamw", ""),
    "bitsandbytes.optim.Lion8bit": ("lion-8bit", ""),
    "torchao.optim.AdamW8bit": ("adamw-8bit-torchao", ""),
    "torchao.prototype.low_bit_optim.AdamW8bit": ("adamw-8bit-torchao", ""),
    "torchao.optim.AdamWFp8": ("adamw-fp8", ""),
    "torchao.prototype.low_bit_optim.AdamWFp8": ("adamw-fp8", ""),
    "torchao.optim.AdamW4bit": ("adamw-4bit", ""),
    "torchao.prototype.low_bit_optim.AdamW4bit": ("adamw-4bit", ""),
}
_LORA_ROWS = (
    Row("model.lora_rank", "lora_rank", as_int),
    Row("model.lora_alpha", "lora_alpha", as_float),
    Row("model.lora_dropout", "lora_dropout", as_float),
)
_ROWS = (
    Row("batch_size", "batch", as_int, "per device (torchtune)"),
    Row("gradient_accumulation_steps", "grad_accum", as_int),
    Row("tokenizer.max_seq_len", "seq", as_int),
)
_FLAG_ROWS = (
    Row("enable_activation_checkpointing", "checkpointing", as_checkpointing),
    Row("enable_activation_offloading", "activation_offload", as_bool),
    Row("optimizer_in_bwd", "optimizer_in_backward", as_bool),
)
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


def map_torchtune(m: _Mapper, doc: Mapping[str, Any], local_dirs: Mapping[str, str]) -> None:
    m.set("framework", "torchtune", "(torchtune recipe)")
    m.notes.append(
        "torchtune's *_distributed recipes shard with FSDP2 (fully_shard): for one, give --gpus N --fsdp "
        "full-shard (the config does not say which recipe runs it)"
    )
    component = str(get(doc, "model._component_") or "")
    builder = component.rsplit(".", 1)[-1]
    folder = get(doc, "checkpointer.checkpoint_dir")
    if isinstance(folder, str) and folder in local_dirs:
        m.set("model", local_dirs[folder], "checkpointer.checkpoint_dir")
    elif builder:
        m.set("model", _torchtune_model_name(builder), "model._component_")
    method = "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"
    m.set("method", method, "model._component_")
    if method != "full":
        model = doc.get("model") or {}
        take(m, doc, _LORA_ROWS)
        names = [_TORCHTUNE_TARGETS.get(n, n) for n in names_list(model.get("lora_attn_modules"))]
        if truthy(model.get("apply_lora_to_mlp")):
            names += list(_TORCHTUNE_MLP)
        if truthy(model.get("apply_lora_to_output")):
            names.append("lm_head")
        if names:
            m.set(
                "lora_targets",
                ",".join(names),
                "model.lora_attn_modules",
                "torchtune names mapped to HF (output_proj=o_proj; w1/w3/w2=gate/up/down_proj)",
            )
        m.set("adapter_dtype", "base", "(torchtune builds LoRA weights in the model dtype)")
        if truthy(model.get("use_dora")):
            m.set("dora", True, "model.use_dora")
    take(m, doc, _ROWS)
    if "seq" not in m.options:
        m.notes.append(
            f"{m.src('tokenizer.max_seq_len')} is null: samples are not truncated; give --seq "
            "(peakmem's default applies)"
        )
    padded_lengths(
        m, {"dataset.packed": get(doc, "dataset.packed")}, ("dataset.packed",),
        "(torchtune default: dataset.packed false; padded_collate_sft pads each batch to its longest)",
    )  # fmt: skip
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
    opt = str(get(doc, "optimizer._component_") or "")
    if opt:
        found = _COMPONENT_OPTIMIZERS.get(opt)
        if found is None:
            m.skip("optimizer._component_", opt, "an optimizer peakmem has no model of")
        else:
            name, note = found
            if name == "sgd" and as_float(m, "optimizer.momentum", get(doc, "optimizer.momentum")):
                name = "sgd-momentum"
            m.set("optimizer", name, "optimizer._component_", note)
            if get(doc, "optimizer.fused") is True:
                m.set("optimizer_impl", "fused", "optimizer.fused")
            elif get(doc, "optimizer.foreach") is False:
                m.set("optimizer_impl", "for-loop", "optimizer.foreach")
    compiled = truthy(doc.get("compile"))
    if compiled:
        m.set("compile", True, "compile", "compiled layers save what Inductor keeps (formulas/profiles.py)")
        m.kernel("compile", True)
    loss = str(get(doc, "loss._component_") or "")
    if loss.endswith("CEWithChunkedOutputLoss") or loss.endswith("LinearCrossEntropyLoss"):
        m.set("loss", "chunked-compiled" if compiled else "chunked", "loss._component_")
    elif loss and not loss.endswith("CrossEntropyLoss"):
        m.skip("loss._component_", loss, "a loss peakmem has no model of")
    take(m, doc, _FLAG_ROWS)
    if truthy(doc.get("fsdp_cpu_offload")):
        m.set("fsdp", "full-shard", "fsdp_cpu_offload")
        m.set("offload_params", "cpu", "fsdp_cpu_offload")
        m.set("offload", "cpu", "fsdp_cpu_offload")
    if doc.get("fsdp_reshard_after_forward") is False:
        m.set("fsdp", "shard-grad-op", "fsdp_reshard_after_forward")
    for key in ("tensor_parallel_dim", "context_parallel_dim"):
        if as_int(m, key, doc.get(key)) not in (None, 1):
            m.skip(key, doc[key], "give --tp / --cp")
    if truthy(doc.get("enable_fp8_training")):
        m.skip(
            "enable_fp8_training", True,
            "torchao float8 on torchtune's bf16 weights and bf16 optimizer states: peakmem's float8 "
            "precisions price mixed-bf16 states (an fp32 master copy)",
        )  # fmt: skip
