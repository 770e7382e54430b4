"""--emit deepspeed|fsdp: the engine configuration for a setup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peakmem.emit import deepspeed_config, emit, fsdp_accelerate_config, fsdp_accelerate_yaml, layer_class
from peakmem.errors import InputError
from peakmem.parallel import FsdpMode, Offload, Parallelism
from peakmem.training import Checkpointing, Precision, TrainingSetup
from test_parallel import tiny


def test_deepspeed_zero3_offload() -> None:
    setup = TrainingSetup(micro_batch=2, grad_accum=4)
    par = Parallelism(gpus=16, zero_stage=3, offload_optimizer=Offload.CPU, offload_params=Offload.NVME)
    cfg = deepspeed_config(setup, par)
    assert cfg["train_batch_size"] == 2 * 4 * 16
    assert cfg["train_micro_batch_size_per_gpu"] == 2 and cfg["gradient_accumulation_steps"] == 4
    assert cfg["bf16"] == {"enabled": True}
    zero = cfg["zero_optimization"]
    assert isinstance(zero, dict)
    assert zero["stage"] == 3 and zero["overlap_comm"] is True
    assert zero["stage3_prefetch_bucket_size"] == 50_000_000
    assert zero["stage3_max_live_parameters"] == 1_000_000_000
    assert zero["stage3_param_persistence_threshold"] == 100_000
    assert zero["sub_group_size"] == 1_000_000_000
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"]["device"] == "nvme" and "nvme_path" in zero["offload_param"]  # type: ignore[index]
    json.loads(emit("deepspeed", tiny(), setup, par))  # valid JSON
    assert "memory_efficient_linear" not in zero  # DeepSpeed's default, true
    torch_linear = deepspeed_config(setup, Parallelism(gpus=16, zero_stage=3, memory_efficient_linear=False))
    assert torch_linear["zero_optimization"]["memory_efficient_linear"] is False  # type: ignore[index]


def test_deepspeed_zero2_fp16_and_no_zero() -> None:
    cfg = deepspeed_config(TrainingSetup(precision=Precision.MIXED_FP16), Parallelism(gpus=8, zero_stage=2))
    zero = cfg["zero_optimization"]
    assert isinstance(zero, dict)
    assert zero["allgather_bucket_size"] == 500_000_000 and zero["overlap_comm"] is False
    assert cfg["fp16"]["loss_scale"] == 0  # type: ignore[index]
    assert "zero_optimization" not in deepspeed_config(TrainingSetup(), Parallelism(gpus=8))


def test_deepspeed_refuses_fsdp() -> None:
    with pytest.raises(InputError, match="emit=deepspeed with fsdp='full-shard'"):
        deepspeed_config(TrainingSetup(), Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD))


def test_fsdp2_yaml() -> None:
    setup = TrainingSetup(checkpointing=Checkpointing.FULL)
    text = fsdp_accelerate_yaml(tiny(), setup, Parallelism(gpus=16, fsdp=FsdpMode.FULL_SHARD))
    lines = text.splitlines()
    assert "distributed_type: FSDP" in lines
    assert "  fsdp_version: 2" in lines
    assert "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer" in lines
    assert "  fsdp_reshard_after_forward: true" in lines
    assert "  fsdp_activation_checkpointing: true" in lines
    assert "num_machines: 2" in lines and "num_processes: 16" in lines and "mixed_precision: bf16" in lines


def test_fsdp1_strategies_and_hybrid() -> None:
    cfg = fsdp_accelerate_config(
        tiny(), TrainingSetup(), Parallelism(gpus=8, fsdp=FsdpMode.SHARD_GRAD_OP, fsdp_version=1)
    )
    assert cfg["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"  # type: ignore[index]
    v2 = fsdp_accelerate_config(tiny(), TrainingSetup(), Parallelism(gpus=8, fsdp=FsdpMode.SHARD_GRAD_OP))
    assert v2["fsdp_config"]["fsdp_reshard_after_forward"] is False  # type: ignore[index]
    hybrid = fsdp_accelerate_config(tiny(), TrainingSetup(), Parallelism(gpus=32, fsdp=FsdpMode.HYBRID_SHARD))
    assert hybrid["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 4,
        "parallelism_config_dp_shard_size": 8,
    }


def test_fsdp_refuses_zero_and_model_parallel() -> None:
    with pytest.raises(InputError, match="emit=fsdp with zero=3"):
        fsdp_accelerate_config(tiny(), TrainingSetup(), Parallelism(gpus=8, zero_stage=3))
    with pytest.raises(InputError, match="tp=2"):
        fsdp_accelerate_config(tiny(), TrainingSetup(), Parallelism(gpus=8, tp=2, fsdp=FsdpMode.FULL_SHARD))
    with pytest.raises(InputError, match="emit='yaml'"):
        emit("yaml", tiny(), TrainingSetup(), Parallelism())


def test_layer_class_names() -> None:
    from peakmem.resolve import resolve_model

    assert layer_class(resolve_model("gpt2-xl")) == "GPT2Block"
    assert layer_class(resolve_model("mixtral-8x7b")) == "MixtralDecoderLayer"
    assert layer_class(resolve_model("qwen2.5-7b")) == "Qwen2DecoderLayer"


def test_fsdp_float8_round_trips_through_accelerate_yaml(tmp_path: Path) -> None:
    """float8-tensorwise emits accelerate 1.16's ``mixed_precision: fp8`` with the torchao backend (its
    AORecipeKwargs default is the tensorwise recipe), the all-gather as asked, and no
    cpu_ram_efficient_loading (accelerate refuses it with torchao fp8 under FSDP2); reading the file back
    with --from gives the same precision and all-gather. A rowwise recipe has no field in that file."""
    from peakmem.fromfile import read_from_files

    par = Parallelism(gpus=8, fsdp=FsdpMode.FULL_SHARD, zero_init=True)
    for gather in (True, False):
        setup = TrainingSetup(precision=Precision.FLOAT8_TENSORWISE, float8_all_gather=gather)
        cfg = fsdp_accelerate_config(tiny(), setup, par)
        assert cfg["mixed_precision"] == "fp8"
        assert cfg["fp8_config"] == {
            "backend": "AO",
            "enable_fsdp_float8_all_gather": gather,
            "pad_inner_dim": True,
        }
        assert cfg["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is False  # type: ignore[index]
        path = tmp_path / f"f8_{gather}.yaml"
        path.write_text(fsdp_accelerate_yaml(tiny(), setup, par))
        options = read_from_files([path]).options
        assert options["precision"] == "float8-tensorwise"
        assert options.get("float8_all_gather", False) is gather
    plain = fsdp_accelerate_config(tiny(), TrainingSetup(), par)
    assert "fp8_config" not in plain and plain["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is True  # type: ignore[index]
    with pytest.raises(InputError, match="emit=fsdp with precision='float8-rowwise'"):
        fsdp_accelerate_config(tiny(), TrainingSetup(precision=Precision.FLOAT8_ROWWISE), par)
