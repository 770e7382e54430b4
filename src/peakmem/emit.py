"""``--emit deepspeed|fsdp``: the engine configuration for a setup, ready to pass to the engine.

* :func:`deepspeed_config` returns the DeepSpeed JSON config as a dict (keys as documented in
  deepspeed/runtime/config.py and deepspeed/runtime/zero/config.py, v0.19.8), for
  ``deepspeed --deepspeed_config ds.json`` or HF Trainer's ``--deepspeed ds.json``. The optimizer and
  scheduler are left to the training script (HF Trainer creates them), so no ``optimizer`` section.
* :func:`fsdp_accelerate_yaml` returns an ``accelerate launch --config_file`` YAML text for FSDP
  (keys as accelerate's ``FullyShardedDataParallelPlugin`` reads them: ``fsdp_version``,
  ``fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP``, ``fsdp_reshard_after_forward`` (v2) or
  ``fsdp_sharding_strategy`` (v1), ``fsdp_offload_params``, ``fsdp_cpu_ram_efficient_loading``...).

Pure functions: no file I/O (the CLI writes the text).
"""

from __future__ import annotations

import json

from peakmem.errors import InputError
from peakmem.model import ModelSpec
from peakmem.parallel import FsdpMode, Offload, Parallelism
from peakmem.training import FLOAT8_PREFIX, Checkpointing, Precision, TrainingSetup

# transformers decoder-layer class per model_type (the class accelerate's TRANSFORMER_BASED_WRAP wraps);
# others follow the ``<Arch>ForCausalLM`` -> ``<Arch>DecoderLayer`` convention of modeling_*.py.
LAYER_CLASSES = {
    "gpt2": "GPT2Block",
    "gpt_neox": "GPTNeoXLayer",
    "gptj": "GPTJBlock",
    "bloom": "BloomBlock",
    "bert": "BertLayer",
    "roberta": "RobertaLayer",
    "opt": "OPTDecoderLayer",
    "falcon": "FalconDecoderLayer",
    "gpt_neo": "GPTNeoBlock",
    "olmo": "OlmoDecoderLayer",
    "olmo2": "Olmo2DecoderLayer",
}
NVME_PATH = "/local_nvme"  # DeepSpeed's documentation example path; edit to your mount


def layer_class(spec: ModelSpec) -> str:
    if spec.model_type in LAYER_CLASSES:
        return LAYER_CLASSES[spec.model_type]
    for suffix in (
        "ForCausalLM",
        "ForSequenceClassification",
        "ForMaskedLM",
        "ForConditionalGeneration",
        "Model",
    ):
        if spec.architecture.endswith(suffix):
            return spec.architecture[: -len(suffix)] + "DecoderLayer"
    return spec.architecture + "DecoderLayer"


def _offload(device: Offload, *, param: bool) -> dict[str, object]:
    out: dict[str, object] = {"device": device.value, "pin_memory": True}
    if device is Offload.NVME:
        out["nvme_path"] = NVME_PATH
        if param:
            out["buffer_count"] = 5  # offload_config.py defaults, written out
            out["buffer_size"] = 100_000_000
    return out


def deepspeed_config(setup: TrainingSetup, par: Parallelism) -> dict[str, object]:
    """A DeepSpeed config dict for ``setup`` under ``par`` (needs ``zero_stage`` 0-3, no FSDP)."""
    if par.fsdp is not FsdpMode.NONE:
        raise InputError(
            f"emit=deepspeed with fsdp={par.fsdp.value!r}: DeepSpeed configs describe ZeRO; use --emit fsdp"
        )
    cfg: dict[str, object] = {
        "train_batch_size": setup.micro_batch * setup.grad_accum * par.dp,
        "train_micro_batch_size_per_gpu": setup.micro_batch,
        "gradient_accumulation_steps": setup.grad_accum,
        "gradient_clipping": 1.0,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    if setup.precision in (Precision.MIXED_BF16, Precision.AMP_BF16, Precision.BF16):
        cfg["bf16"] = {"enabled": True}
    elif setup.precision in (Precision.MIXED_FP16, Precision.AMP_FP16):
        cfg["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    zero: dict[str, object] = {
        "stage": par.zero_stage,
        "overlap_comm": par.ds_overlap_comm,
        "contiguous_gradients": par.contiguous_gradients,
        "reduce_bucket_size": par.reduce_bucket_size,
    }
    if par.zero_stage in (1, 2):
        zero["allgather_bucket_size"] = par.allgather_bucket_size
    if par.zero_stage == 3:
        zero["stage3_prefetch_bucket_size"] = par.prefetch_bucket_size
        zero["stage3_max_live_parameters"] = par.max_live_parameters
        zero["stage3_param_persistence_threshold"] = par.param_persistence_threshold
        zero["sub_group_size"] = par.sub_group_size
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if not par.memory_efficient_linear:  # torch's F.linear under zero.Init (formulas/zero3.py)
            zero["memory_efficient_linear"] = False
    if par.offload_optimizer is not Offload.NONE:
        zero["offload_optimizer"] = _offload(par.offload_optimizer, param=False)
    if par.offload_params is not Offload.NONE:
        zero["offload_param"] = _offload(par.offload_params, param=True)
    if par.zero_stage:
        cfg["zero_optimization"] = zero
    if par.tp > 1:
        cfg["tensor_parallel"] = {
            "autotp_size": par.tp
        }  # DeepSpeed AutoTP training (runtime/tensor_parallel)
    if par.pp > 1:
        cfg["pipeline"] = {"stages": par.pp, "partition": "parameters"}  # deepspeed.pipe.PipelineModule
    if setup.checkpointing is not Checkpointing.NONE:
        cfg["activation_checkpointing"] = {
            "partition_activations": par.tp > 1,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return cfg


def deepspeed_json(setup: TrainingSetup, par: Parallelism) -> str:
    return json.dumps(deepspeed_config(setup, par), indent=2) + "\n"


def _yaml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    return text if text.replace("_", "").replace("-", "").replace(".", "").isalnum() else json.dumps(text)


def _yaml(mapping: dict[str, object], indent: int = 0) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for key, value in mapping.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines += _yaml(value, indent + 2)
        else:
            lines.append(f"{pad}{key}: {_yaml_value(value)}")
    return lines


def fsdp_accelerate_config(spec: ModelSpec, setup: TrainingSetup, par: Parallelism) -> dict[str, object]:
    """The accelerate config for FSDP as a nested dict (see :func:`fsdp_accelerate_yaml`)."""
    if par.zero_stage:
        raise InputError(f"emit=fsdp with zero={par.zero_stage}: use --emit deepspeed for ZeRO")
    if par.tp > 1 or par.pp > 1 or par.cp > 1:
        raise InputError(
            f"emit=fsdp with tp={par.tp}, pp={par.pp}, cp={par.cp}: the accelerate FSDP config "
            "describes data parallelism only; use Megatron/torchtitan for model parallelism"
        )
    if setup.precision.value.startswith(FLOAT8_PREFIX) and setup.precision is not Precision.FLOAT8_TENSORWISE:
        raise InputError(
            f"emit=fsdp with precision={setup.precision.value!r}: accelerate's config file runs torchao's "
            "default (tensorwise) recipe; pass "
            "AORecipeKwargs(config=Float8LinearConfig.from_recipe_name(...)) to Accelerator in code"
        )
    mode = FsdpMode.FULL_SHARD if par.fsdp is FsdpMode.NONE else par.fsdp
    fsdp: dict[str, object] = {
        "fsdp_version": par.fsdp_version,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": layer_class(spec),
        "fsdp_offload_params": par.offload_params is not Offload.NONE
        or par.offload_optimizer is not Offload.NONE,
        # accelerate refuses torchao fp8 with FSDP2 and cpu_ram_efficient_loading (accelerator.py __init__)
        "fsdp_cpu_ram_efficient_loading": par.zero_init
        and not (setup.precision is Precision.FLOAT8_TENSORWISE and par.fsdp_version == 2),
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_activation_checkpointing": setup.checkpointing is not Checkpointing.NONE,
    }
    if par.fsdp_version == 2:
        fsdp["fsdp_reshard_after_forward"] = mode is not FsdpMode.SHARD_GRAD_OP
    else:
        fsdp["fsdp_sharding_strategy"] = mode.value.upper().replace("-", "_")
        fsdp["fsdp_backward_prefetch"] = "BACKWARD_PRE"
        fsdp["fsdp_forward_prefetch"] = False
        fsdp["fsdp_use_orig_params"] = True
        fsdp["fsdp_sync_module_states"] = True
    cfg: dict[str, object] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "fsdp_config": fsdp,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": _accelerate_precision(setup.precision),
        **_accelerate_fp8(setup, par),
        "num_machines": par.nodes,
        "num_processes": par.gpus,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if mode is FsdpMode.HYBRID_SHARD and par.fsdp_version == 2:
        cfg["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": par.dp // par.shard_degree,
            "parallelism_config_dp_shard_size": par.shard_degree,
        }
    return cfg


def _accelerate_precision(precision: Precision) -> str:
    if precision is Precision.FLOAT8_TENSORWISE:
        return "fp8"
    if precision in (Precision.MIXED_BF16, Precision.AMP_BF16, Precision.BF16):
        return "bf16"
    if precision in (Precision.MIXED_FP16, Precision.AMP_FP16):
        return "fp16"
    return "no"


def _accelerate_fp8(setup: TrainingSetup, par: Parallelism) -> dict[str, object]:
    """accelerate 1.16's fp8 section for torchao float8 (``fp8_config``, read by commands/launch.py as
    ``--fp8_backend ao --fp8_enable_fsdp_float8_all_gather ...``; AORecipeKwargs builds the default
    Float8LinearConfig, the tensorwise recipe: a rowwise recipe needs ``AORecipeKwargs(config=...)`` in
    code, so it is refused in the caller)."""
    if setup.precision is not Precision.FLOAT8_TENSORWISE:
        return {}
    return {"fp8_config": {
        "backend": "AO",
        "enable_fsdp_float8_all_gather": setup.float8_all_gather and par.fsdp_version == 2,
        "pad_inner_dim": True,
    }}  # fmt: skip


def fsdp_accelerate_yaml(spec: ModelSpec, setup: TrainingSetup, par: Parallelism) -> str:
    """``accelerate launch --config_file fsdp.yaml`` text for ``setup`` under ``par``."""
    header = f"# peakmem --emit fsdp: {spec.name}, {par.describe()}\n"
    return header + "\n".join(_yaml(fsdp_accelerate_config(spec, setup, par))) + "\n"


def emit(kind: str, spec: ModelSpec, setup: TrainingSetup, par: Parallelism) -> str:
    """The text ``--emit KIND`` prints: ``deepspeed`` (JSON) or ``fsdp`` (accelerate YAML)."""
    if kind == "deepspeed":
        return deepspeed_json(setup, par)
    if kind == "fsdp":
        return fsdp_accelerate_yaml(spec, setup, par)
    raise InputError(f"emit={kind!r}: unknown; choose deepspeed or fsdp")
