"""DeepSpeed JSON (deepspeed ``runtime/config.py``, ``runtime/zero/config.py``), as a file of its own or
inline in TrainingArguments: ``zero_optimization.stage``, ``offload_optimizer.device``,
``offload_param.device``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``train_batch_size`` (global: micro x accumulation x GPUs), ``bf16``/``fp16.enabled``, bucket sizes,
``optimizer.type``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakmem.fromfile.mapper import Row, _Mapper, as_int, as_offload_device, get, is_auto, take, truthy

# DeepSpeed "optimizer.type" (deepspeed/runtime/config.py names, lower-cased) -> peakmem optimizer and
# implementation: deepspeed/runtime/engine.py _configure_basic_optimizer builds FusedAdam / FusedLion
# (DeepSpeedCPUAdam / DeepSpeedCPULion when offloaded): one kernel per group; other names are torch.optim's.
# With an "optimizer" section DeepSpeed builds its own and TrainingArguments.optim is unused
# (transformers integrations/deepspeed.py deepspeed_optim_sched: DummyOptim).
DEEPSPEED_OPTIMIZERS = {
    "adam": ("adamw", "fused"),
    "adamw": ("adamw", "fused"),
    "lion": ("lion", "fused"),
    "sgd": ("sgd", "foreach"),
}
# DeepSpeed knobs Parallelism models (deepspeed/runtime/zero/config.py names -> Parallelism fields)
_DS_BUCKETS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "sub_group_size": "sub_group_size",
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
_ROWS = (
    Row("zero_optimization.stage", "zero", as_int),
    Row("zero_optimization.offload_optimizer.device", "offload", as_offload_device),
    Row("zero_optimization.offload_param.device", "offload_params", as_offload_device),
    # the training file's own batch and accumulation win (HF Trainer fills DeepSpeed's from them)
    Row("train_micro_batch_size_per_gpu", "batch", as_int, keep=True),
    Row("gradient_accumulation_steps", "grad_accum", as_int, keep=True),
)


def map_deepspeed(m: _Mapper, ds: Mapping[str, Any], prefix: str) -> None:
    """A DeepSpeed config (a file, ``prefix`` empty, or an inline dict at key ``prefix``)."""
    m.deepspeed = True
    p = f"{prefix}." if prefix else ""
    take(m, ds, _ROWS, p)
    zero = ds.get("zero_optimization")
    if isinstance(zero, Mapping):
        _zero_knobs(m, zero, f"{p}zero_optimization.")
    total = as_int(m, p + "train_batch_size", ds.get("train_batch_size"))
    if total is not None:
        m.info("global batch", total, p + "train_batch_size", "global: micro-batch x accumulation x GPUs")
        m.global_batch = (total, m.src(p + "train_batch_size"))
    for key in ("bf16", "fp16"):
        block = ds.get(key)
        enabled = block.get("enabled") if isinstance(block, Mapping) else None
        if enabled is True and m.half is None:
            m.half = (key, m.src(f"{p}{key}.enabled"))
    opt = get(ds, "optimizer.type")
    if isinstance(opt, str):
        found = DEEPSPEED_OPTIMIZERS.get(opt.lower())
        if found is None:
            m.unknown(p + "optimizer.type", opt, "a DeepSpeed optimizer peakmem has no model of",
                      list(DEEPSPEED_OPTIMIZERS))  # fmt: skip
        else:
            note = "DeepSpeed builds its own optimizer; TrainingArguments.optim is unused"
            m.set("optimizer", found[0], p + "optimizer.type", note)
            m.set("optimizer_impl", found[1], p + "optimizer.type")
    if truthy(get(ds, "activation_checkpointing.cpu_checkpointing")):
        m.skip(p + "activation_checkpointing.cpu_checkpointing", True, "Megatron-style CPU checkpointing")


def _zero_knobs(m: _Mapper, zero: Mapping[str, Any], p: str) -> None:
    """zero_optimization's bucket sizes and communication flags (Parallelism fields with no CLI flag),
    and the keys that change memory that peakmem does not model."""
    for key, attr in _DS_BUCKETS.items():
        value = zero.get(key)
        if is_auto(value):
            m.skip(p + key, value, "HF Trainer sizes it from hidden_size; peakmem uses DeepSpeed's default")
        elif value is not None:
            number = as_int(m, p + key, value)
            if number is not None:
                m.parallel[attr] = number
                m.info(attr, number, p + key)
    for key, why in _DS_NOT_MODELLED.items():
        value = get(zero, key)
        if value not in (None, False, 0, "none"):
            m.skip(p + key, value, why)
    if isinstance(zero.get("overlap_comm"), bool):
        m.parallel["overlap_comm"] = zero["overlap_comm"]
        m.info("overlap_comm", zero["overlap_comm"], f"{p}overlap_comm")
    if isinstance(zero.get("contiguous_gradients"), bool):
        m.parallel["contiguous_gradients"] = zero["contiguous_gradients"]
    if zero.get("memory_efficient_linear") is False:  # torch's F.linear under zero.Init (formulas/zero3.py)
        m.parallel["memory_efficient_linear"] = False
        m.info("memory_efficient_linear", False, f"{p}memory_efficient_linear")
