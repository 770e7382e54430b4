"""accelerate config YAML (accelerate ``commands/config/config_args.py``): ``distributed_type``,
``num_processes``, ``mixed_precision``, ``fsdp_config``, ``deepspeed_config``. Its ``fsdp_config`` reader
is also the one for TrainingArguments' and axolotl's ``fsdp_config``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakmem.fromfile.mapper import Row, _Mapper, as_int, as_offload_device, take, truthy

FSDP_STRATEGIES = {  # torch FSDP ShardingStrategy (name or accelerate's 1-based number)
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
FSDP_OFFLOAD_NOTE = "FSDP CPUOffload: parameters, gradients and the step on CPU"
_DEEPSPEED_ROWS = (
    Row("zero_stage", "zero", as_int),
    Row("offload_optimizer_device", "offload", as_offload_device),
    Row("offload_param_device", "offload_params", as_offload_device),
    Row("gradient_accumulation_steps", "grad_accum", as_int, keep=True),
    # accelerate DeepSpeedPlugin: zero3_init_flag unset is True under stage 3 (deepspeed.zero.Init)
    Row("zero3_init_flag", "no_zero_init", lambda m, key, v: None if v is None else not truthy(v)),
)


def map_accelerate(m: _Mapper, doc: Mapping[str, Any]) -> None:
    kind = str(doc.get("distributed_type") or "NO").upper()
    take(m, doc, (Row("num_processes", "gpus", as_int, "all processes, all machines"),))
    mp = str(doc.get("mixed_precision") or "no").lower()
    if mp in ("bf16", "fp16"):
        m.half = (mp, m.src("mixed_precision"))
    if kind == "FSDP":
        cfg = doc.get("fsdp_config")
        fsdp_config(m, cfg if isinstance(cfg, Mapping) else {}, "fsdp_config", default_version=1)
    if mp == "fp8":
        fp8_config(m, doc.get("fp8_config"), fsdp=kind == "FSDP")
    elif kind == "DEEPSPEED":
        m.deepspeed = True
        cfg = doc.get("deepspeed_config")
        take(m, cfg if isinstance(cfg, Mapping) else {}, _DEEPSPEED_ROWS, "deepspeed_config.")
    elif kind == "MEGATRON_LM":
        m.skip("distributed_type", kind, "give --tp/--pp for Megatron-LM layouts")
    if truthy(doc.get("use_cpu")):
        m.skip("use_cpu", True, "a CPU run")
    pc = doc.get("parallelism_config")
    if isinstance(pc, Mapping):
        parallelism_config(m, pc)


# accelerate 1.16 ``mixed_precision: fp8``: bf16 autocast and FSDP param dtype underneath
# (utils/modeling.py get_mixed_precision_context_manager, FullyShardedDataParallelPlugin
# set_mixed_precision "fp8" -> bfloat16), and with the torchao backend (``fp8_config.backend: AO``, or
# none named with torchao installed: Accelerator.__init__ prefers AO) AORecipeKwargs' default
# Float8LinearConfig() - the tensorwise recipe - with enable_fsdp_float8_all_gather true unless the
# file says false (commands/launch.py --fp8_enable_fsdp_float8_all_gather default "true"); FSDP2 only.
FP8_NOTE = (
    "torchao Float8Linear, tensorwise (accelerate AORecipeKwargs' default Float8LinearConfig); accelerate "
    "leaves the first and the last nn.Linear unconverted (utils/ao.py filter_linear_layers), peakmem only "
    "the head"
)
FP8_NO_FSDP_NOTE = (
    "; without FSDP accelerate keeps fp32 weights under bf16 autocast, priced here as mixed-bf16 states "
    "(fp32 master, bf16 weights)"
)


def fp8_config(m: _Mapper, cfg: Any, *, fsdp: bool) -> None:
    """``mixed_precision: fp8`` with its ``fp8_config`` (torchao: float8-tensorwise; TE / MS-AMP: not
    modelled). Under FSDP the bf16 param dtype over fp32 shards is the mixed-bf16 states peakmem's float8
    precisions price; without FSDP accelerate keeps fp32 weights under bf16 autocast (amp-bf16's states),
    which the note says."""
    cfg = cfg if isinstance(cfg, Mapping) else {}
    backend = str(cfg.get("backend") or "").strip().lower()
    if backend and backend != "ao":
        m.skip("fp8_config.backend", cfg["backend"], "Transformer Engine / MS-AMP fp8: no peakmem precision")
        m.half = ("bf16", m.src("mixed_precision"))  # the bf16 autocast under it stays
        return
    note = FP8_NOTE if fsdp else FP8_NOTE + FP8_NO_FSDP_NOTE
    m.set("precision", "float8-tensorwise", "fp8_config.backend" if backend else "mixed_precision", note)
    gather = cfg.get("enable_fsdp_float8_all_gather", True)
    key = (
        "fp8_config.enable_fsdp_float8_all_gather"
        if "enable_fsdp_float8_all_gather" in cfg
        else ("(accelerate's default: enable_fsdp_float8_all_gather true)")
    )
    if not truthy(gather):
        return
    if m.options.get("fsdp_version") == 2 and m.options.get("fsdp") not in (None, "none"):
        m.set("float8_all_gather", True, key)
    elif "enable_fsdp_float8_all_gather" in cfg:
        m.skip(key, gather, "no effect without FSDP2 sharding")


# accelerate parallelism_config (accelerate parallelism_config.py ParallelismConfig; TRL's ALST docs):
# sp_size with sp_backend "deepspeed" (its only backend) is DeepSpeed-Ulysses; cp_size is FSDP2's
# torch context parallel (ring attention); tp_size Transformers' tensor parallel; the dp sizes are the
# rest of num_processes (dp_replicate x dp_shard x cp x sp x tp = num_processes).
_PC = "parallelism_config."
_PC_ROWS = (
    Row("parallelism_config_sp_size", "ulysses", as_int, "DeepSpeed-Ulysses sequence parallelism"),
    Row("parallelism_config_cp_size", "cp", as_int, "context parallelism (ring attention)"),
)


def parallelism_config(m: _Mapper, pc: Mapping[str, Any]) -> None:
    take(m, pc, _PC_ROWS, _PC)
    attn = str(pc.get("parallelism_config_sp_attn_implementation") or "")
    if attn:  # transformers' attn_implementation: sdpa, flash_attention_2/3 or a flash Hub kernel
        key = _PC + "parallelism_config_sp_attn_implementation"
        kernel = "flash" if "flash" in attn else "sdpa" if attn == "sdpa" else ""
        if kernel:
            m.set("attention", kernel, key)
        else:
            m.skip(key, attn, "an attention kernel peakmem does not model under Ulysses")
    tp = as_int(m, _PC + "parallelism_config_tp_size", pc.get("parallelism_config_tp_size"))
    if tp is not None and tp > 1:
        m.skip(_PC + "parallelism_config_tp_size", tp, "Transformers tensor parallelism: give --tp")


def fsdp_config(m: _Mapper, cfg: Mapping[str, Any], prefix: str, *, default_version: int) -> None:
    """An FSDP plugin config (keys with or without accelerate's ``fsdp_`` prefix)."""

    def k(key: str) -> str:
        return f"{prefix}.{key}"

    def lookup(*names: str) -> tuple[str, Any]:
        for name in names:
            for key in (name, name.removeprefix("fsdp_")):
                if key in cfg:
                    return key, cfg[key]
        return "", None

    key, version = lookup("fsdp_version")
    v = as_int(m, k(key), version) if key else None
    m.set(
        "fsdp_version",
        v or default_version,
        k(key) if key else f"(FSDP{default_version}: accelerate's default)",
    )
    key, strategy = lookup("fsdp_sharding_strategy")
    if key and strategy is not None:
        mode = FSDP_STRATEGIES.get(str(strategy).strip().lower())
        if mode is None:
            m.skip(k(key), strategy, "an FSDP sharding strategy peakmem does not know")
        else:
            m.set("fsdp", mode, k(key))
    key, reshard = lookup("fsdp_reshard_after_forward")
    if key and isinstance(reshard, bool):
        m.set("fsdp", "full-shard" if reshard else "shard-grad-op", k(key))
    elif key and isinstance(reshard, str):
        mode = FSDP_STRATEGIES.get(reshard.strip().lower())
        if mode is not None:
            m.set("fsdp", mode, k(key))
    if "fsdp" not in m.options:
        m.set("fsdp", "full-shard", "(FSDP's default sharding: FULL_SHARD)")
    key, offload = lookup("fsdp_offload_params")
    if not key:
        key, offload = lookup("cpu_offload")  # transformers 5.23 fsdp_config (CPUOffload / OffloadPolicy)
    if key and truthy(offload):
        m.set("offload_params", "cpu", k(key), FSDP_OFFLOAD_NOTE)
        m.set("offload", "cpu", k(key))
    key, ckpt = lookup("fsdp_activation_checkpointing")
    if key and truthy(ckpt):
        m.set("checkpointing", "full", k(key))
