"""``--from FILE``: the pure mapping on small documents, for keys the published fixtures
(tests/test_fromfile.py) do not use. Every expected value is the framework's documented default or
spelling, named in the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from peakmem.errors import InputError
from peakmem.fromfile import map_documents, read_from_files
from test_fromfile import FIX, LF_QWEN3_FULL, _cli_json


def _options(*docs: dict[str, Any]) -> dict[str, Any]:
    return map_documents([(f"f{i}.yaml", d) for i, d in enumerate(docs)]).options


def test_training_arguments_json_with_a_deepspeed_file(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "z2.json").write_text(
        json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}})
    )
    args = tmp_path / "args.json"
    args.write_text(json.dumps({
        "output_dir": "out", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "bf16": True,
        "optim": "paged_adamw_8bit", "gradient_checkpointing": True, "deepspeed": "ds/z2.json",
    }))  # fmt: skip
    found = read_from_files([args])
    assert found.format == "transformers/trl + deepspeed"
    o = found.options
    assert (o["batch"], o["grad_accum"], o["optimizer"], o["zero"]) == (8, 2, "paged-adamw-8bit", 2)
    assert o["precision"] == "mixed-bf16"  # DeepSpeed's bf16 engine (bf16 "auto" filled from bf16=True)
    assert o["checkpointing"] == "full"


def test_hf_precision_rules() -> None:
    # HF Trainer bf16=True over a model loaded in fp32 (no torch_dtype): autocast, fp32 weights
    assert _options({"output_dir": "o", "bf16": True})["precision"] == "amp-bf16"
    # no precision flag: fp32
    assert _options({"output_dir": "o"})["precision"] == "fp32"
    # LLaMA-Factory full fine-tuning upcasts trainable weights to fp32 unless pure_bf16
    assert _options({"finetuning_type": "full", "bf16": True})["precision"] == "amp-bf16"
    assert _options({"finetuning_type": "full", "pure_bf16": True})["precision"] == "bf16"


def test_fsdp_spellings() -> None:
    # transformers 5.23 training_args.py builds FSDP fsdp_config.get("version", 2): FSDP2 unless stated
    o = _options({"output_dir": "o", "fsdp": "full_shard auto_wrap offload"})
    assert (o["fsdp"], o["offload_params"], o["offload"], o["fsdp_version"]) == (
        "full-shard",
        "cpu",
        "cpu",
        2,
    )
    # ... and rewrites those legacy options into fsdp=True + fsdp_config (what to_dict() writes)
    live = {
        "output_dir": "o",
        "fsdp": True,
        "fsdp_config": {"reshard_after_forward": False, "cpu_offload": True},
    }
    o = _options(live)
    assert (o["fsdp"], o["offload_params"], o["offload"], o["fsdp_version"]) == (
        "shard-grad-op",
        "cpu",
        "cpu",
        2,
    )
    acc = {"distributed_type": "FSDP", "num_processes": 8, "mixed_precision": "bf16",
           "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": False,
                           "fsdp_activation_checkpointing": True}}  # fmt: skip
    o = _options(acc)
    assert (o["gpus"], o["fsdp"], o["fsdp_version"], o["checkpointing"]) == (8, "shard-grad-op", 2, "full")


def test_quantization_and_optimizer_names() -> None:
    o = _options({"finetuning_type": "lora", "quantization_bit": 4, "lora_rank": 16})
    assert (o["method"], o["lora_rank"], o["lora_alpha"]) == ("qlora", 16, 32.0)  # alpha = 2 x rank
    o = _options({"finetuning_type": "lora", "quantization_bit": 8})
    assert (o["method"], o["quant"]) == ("qlora", "int8")
    tt = {"model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b", "lora_rank": 8},
          "optimizer": {"_component_": "bitsandbytes.optim.PagedAdamW8bit"}, "optimizer_in_bwd": True,
          "enable_activation_offloading": True, "compile": True,
          "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"}}  # fmt: skip
    o = _options(tt)
    assert (o["model"], o["optimizer"], o["optimizer_in_backward"]) == (
        "llama-3.1-8b",
        "paged-adamw-8bit",
        True,
    )
    assert (o["activation_offload"], o["loss"]) == (True, "chunked-compiled")
    found = map_documents([("a.yml", {"base_model": "x", "optimizer": "ademamix"})])
    assert "optimizer" not in found.options
    assert any("a.yml:optimizer = ademamix" in item for item in found.not_modelled)


def test_liger_through_training_arguments() -> None:
    found = map_documents([("a.json", {"output_dir": "o", "use_liger_kernel": True})])
    assert found.options["liger"] is True and "loss" not in found.options  # Liger's own loss rule
    assert found.kernels["liger"] == ["rope", "rms_norm", "swiglu", "fused_linear_cross_entropy"]
    assert not any("use_liger_kernel" in item for item in found.not_modelled)


def test_liger_and_compile_from_a_file_equal_the_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "args.json"
    cfg.write_text(
        json.dumps({"output_dir": "o", "use_liger_kernel": True, "torch_compile": True, "bf16": True})
    )
    got = _cli_json(["train", "llama-3.2-1b", "--from", str(cfg)])
    flags = _cli_json(
        [
            "train",
            "llama-3.2-1b",
            "--precision",
            "amp-bf16",
            "--liger",
            "--compile",
            "--optimizer-impl",
            "fused",
        ]
    )  # no optim in the file: transformers' default adamw_torch_fused
    assert got["peak_allocated_bytes"] == flags["peak_allocated_bytes"]
    assert got["setup"]["liger"] is True and got["setup"]["compiled"] is True


def test_axolotl_defaults_and_spellings() -> None:
    # AxolotlInputConfig: sequence_len defaults to 512; gradient_checkpointing "unsloth" is rewritten
    # to "offload"; batch_size with accumulation gives the micro-batch
    doc = {
        "base_model": "x",
        "gradient_checkpointing": "unsloth",
        "batch_size": 16,
        "gradient_accumulation_steps": 4,
    }
    o = _options(doc)
    assert (o["seq"], o["checkpointing"], o["activation_offload"], o["batch"]) == (512, "full", True, 4)


def test_a_full_training_arguments_dump() -> None:
    """Every key TrainingArguments writes, most at their defaults: only the set ones map, and the
    defaults that concern other runs (eval batch 8, use_cpu) are named, not applied."""
    path = FIX / "transformers" / "training_args.json"
    found = read_from_files([path])
    assert found.format == "transformers/trl"
    o = found.options
    assert (o["batch"], o["grad_accum"], o["checkpointing"]) == (4, 8, "full")
    assert (o["optimizer"], o["optimizer_impl"], o["precision"]) == ("adamw", "fused", "fp32")
    assert "fsdp" not in o and "zero" not in o
    assert any(":per_device_eval_batch_size = 8" in item for item in found.not_modelled)
    assert any(":use_cpu = True" in item for item in found.not_modelled)


def test_optimizer_names_and_their_implementations() -> None:
    """The one HF_OPTIMIZERS table (``--from`` and PeakmemCallback): transformers' Adafactor has no foreach
    version (for-loop); bitsandbytes and torchao step one fused kernel per tensor."""
    cases = {
        "adafactor": ("adafactor", "for-loop"),
        "lion_32bit": ("lion", "fused"),
        "paged_lion_32bit": ("lion", "fused"),
        "paged_lion_8bit": ("lion-8bit", "fused"),
        "paged_adamw_32bit": ("paged-adamw", "fused"),
        "adamw_bnb_8bit": ("adamw-8bit", "fused"),
        "adamw_torch_8bit": ("adamw-8bit-torchao", "fused"),
        "adamw_torch_4bit": ("adamw-4bit", "fused"),
        "galore_adamw": ("galore-adamw", "for-loop"),
        "adamw_torch": ("adamw", "foreach"),
        "adamw_torch_fused": ("adamw", "fused"),
    }
    for optim, expected in cases.items():
        o = _options({"output_dir": "o", "optim": optim})
        assert (o["optimizer"], o["optimizer_impl"]) == expected, optim
    o = _options({"output_dir": "o", "optim": "sgd", "optim_args": "momentum=0.9,nesterov=True"})
    assert (o["optimizer"], o["optimizer_impl"]) == ("sgd-momentum", "foreach")


def test_a_deepspeed_optimizer_section_wins_over_optim() -> None:
    """transformers integrations/deepspeed.py deepspeed_optim_sched: with an "optimizer" section DeepSpeed
    builds its own (FusedAdam) and TrainingArguments.optim is unused, inline or in a separate file."""
    ds = {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    inline = _options({"output_dir": "o", "optim": "adafactor", "deepspeed": ds})
    separate = _options({"output_dir": "o", "optim": "adafactor"}, ds)
    for o in (inline, separate):
        assert (o["optimizer"], o["optimizer_impl"], o["zero"]) == ("adamw", "fused", 2)


def test_precision_follows_the_weights_dtype() -> None:
    """HF Trainer never casts the model: the loaded dtype decides, for every method."""
    full = {"output_dir": "o"}
    assert _options({**full, "torch_dtype": "float16"})["precision"] == "bf16"  # pure fp16: same bytes
    assert _options({**full, "torch_dtype": "bfloat16", "bf16": True})["precision"] == "bf16"
    assert _options({**full, "torch_dtype": "float32", "bf16": True})["precision"] == "amp-bf16"
    lora = {"output_dir": "o", "use_peft": True}
    assert _options({**lora, "torch_dtype": "float32", "bf16": True})["precision"] == "amp-bf16"
    assert _options({**lora, "torch_dtype": "float16", "bf16": True})["precision"] == "mixed-fp16"
    assert _options({**lora, "fp16": True})["precision"] == "mixed-fp16"
    with pytest.raises(InputError, match="Attempting to unscale FP16 gradients"):
        _options({**full, "torch_dtype": "float16", "fp16": True})


def test_map_training_arguments_strict_names_what_is_not_modelled() -> None:
    from peakmem.fromfile import map_training_arguments

    doc = {"per_device_train_batch_size": 2, "optim": "lomo"}
    found = map_training_arguments(doc, model="m", method="full", weights=None)
    assert "optimizer" not in found.options and any("optim = lomo" in i for i in found.not_modelled)
    with pytest.raises(InputError, match=r"TrainingArguments.optim='lomo': not modelled"):
        map_training_arguments(doc, model="m", method="full", weights=None, strict=True)
    doc = {"per_device_train_batch_size": 2, "attn_implementation": "kernels-community/some-flash-kernel"}
    found = map_training_arguments(doc, model="m", method="full", weights=("bf16", "live"))
    assert (found.options["attention"], found.options["precision"], found.options["batch"]) == (
        "flash",
        "bf16",
        2,
    )


def test_axolotl_context_parallel_size_is_cp(tmp_path: Path) -> None:
    """axolotl schemas/config.py context_parallel_size: each sequence split over that many GPUs (a divisor
    of the world; utils/distributed.py gives the rest to data parallelism): peakmem's --cp, and the GPUs
    it implies where no file says how many."""
    cfg = tmp_path / "cp.yml"
    cfg.write_text(
        "base_model: x\nsequence_len: 8192\nflash_attention: true\noptimizer: adamw_torch_fused\n"
        "context_parallel_size: 4\n"
    )
    out = _cli_json(["train", "llama-3.2-1b", "--from", str(cfg)])
    par = out["parallelism"]
    assert (par["cp"], par["gpus"], par["dp"]) == (4, 4, 1)
    mapped = {f["field"]: f for f in out["from_file"]["mapped"]}
    assert mapped["cp"]["value"] == 4 and mapped["cp"]["from"] == f"{cfg}:context_parallel_size"
    assert mapped["gpus"]["value"] == 4 and mapped["gpus"]["from"] == f"{cfg}:context_parallel_size"
    assert not any("context_parallel_size" in item for item in out["from_file"]["not_modelled"])
    assert out["setup"]["seq_len"] == 8192
    flags = _cli_json(["train", "llama-3.2-1b", "--seq", "8192", "--attention", "flash", "--cp", "4",
                       "--gpus", "4", "--precision", "fp32", "--optimizer-impl", "fused",
                       "--alloc-roundup-divisions", "16"])  # axolotl's allocator setting  # fmt: skip
    assert out["peak_allocated_bytes"] == flags["peak_allocated_bytes"]
    # the command line's GPUs win; the deprecated sequence_parallel_degree is read where cp is unset
    # (schemas/validation.py check_context_parallel_size)
    wide = _cli_json(["train", "llama-3.2-1b", "--from", str(cfg), "--gpus", "8"])
    assert (wide["parallelism"]["cp"], wide["parallelism"]["dp"]) == (4, 2)
    old = map_documents([("a.yml", {"base_model": "x", "sequence_parallel_degree": 2})])
    assert (old.options["cp"], old.options["gpus"]) == (2, 2)
    # another file's number of GPUs is kept (accelerate num_processes: all processes)
    both = map_documents([("a.yml", {"base_model": "x", "context_parallel_size": 2}),
                          ("acc.yaml", {"distributed_type": "MULTI_GPU", "num_processes": 8})])  # fmt: skip
    assert (both.options["cp"], both.options["gpus"]) == (2, 8)


def test_optim_left_out_is_the_frameworks_default() -> None:
    """transformers 5.23 training_args.py:806-813: optim defaults to adamw_torch_fused on torch >= 2.8
    (LLaMA-Factory's TrainingArguments keeps it; axolotl's schemas/training.py sets the same): --from maps
    the file that leaves optim out to fused AdamW, echoed with where the default is defined."""
    for doc, where in (
        ({"output_dir": "o"}, "transformers/training_args.py:806-813"),
        ({"finetuning_type": "full"}, "LLaMA-Factory's hparams/training_args.py keeps it"),
        ({"base_model": "x"}, "src/axolotl/utils/schemas/training.py HyperparametersConfig.optimizer"),
    ):
        found = map_documents([("a.yaml", doc)])
        assert (found.options["optimizer"], found.options["optimizer_impl"]) == ("adamw", "fused")
        mapped = {f.field: f.source for f in found.mapped}
        assert where in mapped["optimizer"] and mapped["optimizer"] == mapped["optimizer-impl"], mapped
        assert any(f"optimizer = adamw  <- {mapped['optimizer']}" in line for line in found.echo_lines())
    # a DeepSpeed optimizer section wins over the default, in either order of the files
    ds = {"zero_optimization": {"stage": 2}, "optimizer": {"type": "Lion"}}
    for docs in (({"output_dir": "o"}, ds), (ds, {"output_dir": "o"})):
        assert _options(*docs)["optimizer"] == "lion"


def test_llama_factory_full_sft_steps_with_fused_adamw() -> None:
    """LLaMA-Factory's qwen3_full_sft.yaml leaves optim out: the Trainer steps fused AdamW (no foreach
    temporaries). Its ZeRO-3 step on one GPU holds the fp32 gradient and, while casting it, the flattened
    bf16 copy (2 bytes a parameter); foreach's temporaries outweigh that copy."""
    argv = ["train", "qwen3-4b", "--from", str(LF_QWEN3_FULL)]
    out = _cli_json(argv)
    assert (out["setup"]["optimizer"], out["setup"]["optimizer_impl"]) == ("adamw", "fused")
    foreach = _cli_json([*argv, "--optimizer-impl", "foreach"])  # what --from counted before
    assert out["peak_phase"] == foreach["peak_phase"] == "optimizer"
    fused_step = {i["path"].split(" (")[0] for i in out["items"] if i["category"] == "temporaries"}
    assert "flattened gradient partition at the step" in fused_step
    assert out["device_total_bytes"] < foreach["device_total_bytes"]


def test_accelerate_fp8_backends() -> None:
    """accelerate ``mixed_precision: fp8``: torchao (named, or none named: accelerate prefers torchao)
    is float8-tensorwise, its FSDP2 all-gather on unless the file says false and only under FSDP2;
    Transformer Engine is not modelled and leaves the bf16 autocast under it."""
    fsdp2 = {"distributed_type": "FSDP", "num_processes": 8, "fsdp_config": {"fsdp_version": 2}}
    o = _options({**fsdp2, "mixed_precision": "fp8"})
    assert (o["precision"], o["float8_all_gather"]) == ("float8-tensorwise", True)
    o = _options(
        {
            **fsdp2,
            "mixed_precision": "fp8",
            "fp8_config": {"backend": "ao", "enable_fsdp_float8_all_gather": False},
        }
    )
    assert o["precision"] == "float8-tensorwise" and "float8_all_gather" not in o
    fsdp1 = {**fsdp2, "fsdp_config": {"fsdp_version": 1}}
    assert "float8_all_gather" not in _options({**fsdp1, "mixed_precision": "fp8"})
    found = map_documents([("a.yaml", {**fsdp2, "mixed_precision": "fp8", "fp8_config": {"backend": "TE"}})])
    assert found.options["precision"] == "amp-bf16"
    assert any("fp8_config.backend = TE" in line for line in found.not_modelled)


def test_packing_keys_set_padded_lengths() -> None:
    # TRL SFTConfig packing=False / LLaMA-Factory packing: false: each batch padded to its longest sample
    assert _options({"output_dir": "o", "packing": False})["padded_lengths"] == "varying"
    assert _options({"output_dir": "o", "packing": True})["padded_lengths"] == "fixed"
    # no packing key in a TrainingArguments file: the collator is the script's, so nothing is set
    assert "padded_lengths" not in _options({"output_dir": "o"})
    # axolotl: pad_to_sequence_len pads every row to sequence_len even without sample packing
    axolotl = {"base_model": "m", "sequence_len": 512, "sample_packing": False}
    assert _options(axolotl)["padded_lengths"] == "varying"
    assert _options({**axolotl, "pad_to_sequence_len": True})["padded_lengths"] == "fixed"
