"""``--from FILE``: the frameworks' own example configs map onto the setups they state.

Fixtures are the projects' published files (tests/fixtures/frameworks/sources.md names repository, path
and commit of each). Every expected value below is read off the file by hand (or is the framework's
documented default, named in the test).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import peakmem
from peakmem import cli
from peakmem.errors import InputError
from peakmem.fromfile import detect_format, map_documents, parse_document, read_from_files

FIX = Path(__file__).parent / "fixtures" / "frameworks"
AXOLOTL_LORA = FIX / "axolotl" / "lora-8b.yml"
AXOLOTL_QLORA = FIX / "axolotl" / "qlora.yml"
AXOLOTL_FSDP = FIX / "axolotl" / "fft-8b-liger-fsdp.yaml"
LF_LORA = FIX / "llama-factory" / "examples" / "train_lora" / "llama3_lora_sft.yaml"
LF_DS3 = FIX / "llama-factory" / "examples" / "train_lora" / "llama3_lora_sft_ds3.yaml"
LF_QWEN3_FULL = FIX / "llama-factory" / "examples" / "train_full" / "qwen3_full_sft.yaml"
LF_Z3_OFFLOAD = FIX / "llama-factory" / "examples" / "deepspeed" / "ds_z3_offload_config.json"
TT_LORA = FIX / "torchtune" / "1B_lora_single_device.yaml"
TT_QLORA = FIX / "torchtune" / "1B_qlora_single_device.yaml"
TT_FULL = FIX / "torchtune" / "3B_full.yaml"
AH_FULL = FIX / "alignment-handbook" / "config_full.yaml"
AH_QLORA = FIX / "alignment-handbook" / "config_qlora.yaml"
AH_ZERO3 = FIX / "alignment-handbook" / "deepspeed_zero3.yaml"
ACC_FSDP = FIX / "accelerate" / "examples" / "config_yaml_templates" / "fsdp.yaml"
ACC_DS = FIX / "accelerate" / "examples" / "config_yaml_templates" / "deepspeed.yaml"
DS_ZENFLOW = FIX / "deepspeed" / "zf_config.json"
DS_LEAF = FIX / "deepspeed" / "ds_zero3_leaf_qwen3_5.json"

LLAMA_TARGETS = "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
CASES: list[tuple[Path, str, dict[str, Any]]] = [
    # axolotl lora-8b.yml: adapter lora on a load_in_8bit base = LoRA on an int8 base (peakmem's qlora+int8)
    (
        AXOLOTL_LORA,
        "axolotl",
        {
            "expandable_segments": True,  # axolotl's CLI sets PYTORCH_CUDA_ALLOC_CONF
            "alloc_roundup_divisions": 16,  # ... with roundup_power2_divisions:16
            "model": "NousResearch/Meta-Llama-3-8B",
            "method": "qlora",
            "quant": "int8",
            "kbit_prep": "axolotl",  # one GPU: peft's preparation, then norms / embeddings / head back
            "lora_rank": 32,
            "lora_alpha": 16.0,
            "lora_dropout": 0.05,
            "lora_targets": "all-linear",
            "batch": 2,
            "grad_accum": 4,
            "seq": 4096,
            "optimizer": "adamw-8bit",
            "attention": "flash",
            "checkpointing": "full",
            "precision": "bf16",
        },
    ),
    # axolotl qlora.yml: paged_adamw_32bit is bitsandbytes' PagedAdamW (fp32 states, paged)
    (
        AXOLOTL_QLORA,
        "axolotl",
        {
            "expandable_segments": True,  # axolotl's CLI sets PYTORCH_CUDA_ALLOC_CONF
            "alloc_roundup_divisions": 16,  # ... with roundup_power2_divisions:16
            "method": "qlora",
            "kbit_prep": "axolotl",
            "lora_rank": 32,
            "lora_alpha": 16.0,
            "batch": 2,
            "grad_accum": 4,
            "seq": 4096,
            "optimizer": "paged-adamw",
            "checkpointing": "full",
            "attention": "flash",
            "precision": "bf16",
        },
    ),
    (
        AXOLOTL_FSDP,
        "axolotl",
        {
            "expandable_segments": True,  # axolotl's CLI sets PYTORCH_CUDA_ALLOC_CONF
            "alloc_roundup_divisions": 16,  # ... with roundup_power2_divisions:16
            "model": "NousResearch/Meta-Llama-3.1-8B",
            "method": "full",
            "batch": 2,
            "grad_accum": 4,
            "seq": 4096,
            "optimizer": "adamw",
            "optimizer_impl": "fused",
            "liger": True,  # liger_rms_norm, liger_glu_activation and liger_fused_linear_cross_entropy
            "fsdp": "full-shard",
            "fsdp_version": 1,
            "offload_params": "cpu",
            "offload": "cpu",
            "checkpointing": "full",
            "precision": "bf16",
        },
    ),
    # LLaMA-Factory defaults (hparams/finetuning_args.py): lora_rank 8, lora_alpha = 2 x rank, dropout 0;
    # gradient checkpointing on unless disable_gradient_checkpointing
    (
        LF_LORA,
        "llama-factory",
        {
            "model": "meta-llama/Meta-Llama-3-8B-Instruct",
            "method": "lora",
            "lora_rank": 8,
            "lora_alpha": 16.0,
            "lora_dropout": 0.0,
            "lora_targets": "all-linear",
            "batch": 1,
            "grad_accum": 8,
            "seq": 1024,
            "checkpointing": "full",
            "precision": "bf16",
            "optimizer": "adamw",  # no optim: transformers' default adamw_torch_fused
            "optimizer_impl": "fused",
        },
    ),
    (
        LF_DS3,
        "llama-factory + deepspeed",
        {
            "method": "lora",
            "batch": 1,
            "grad_accum": 2,
            "seq": 2048,
            "zero": 3,
            "precision": "mixed-bf16",
        },
    ),
    (
        TT_LORA,
        "torchtune",
        {
            "model": "llama-3.2-1b",
            "framework": "torchtune",
            "method": "lora",
            "lora_rank": 64,
            "lora_alpha": 128.0,
            "lora_targets": LLAMA_TARGETS,
            "adapter_dtype": "base",
            "batch": 4,
            "grad_accum": 4,
            "precision": "bf16",
            "optimizer": "adamw",
            "optimizer_impl": "fused",
            "loss": "chunked",
            "checkpointing": "none",
            "activation_offload": False,
            "padded_lengths": "varying",  # no dataset.packed: torchtune pads each batch to its longest
        },
    ),
    (TT_QLORA, "torchtune", {"model": "llama-3.2-1b", "method": "qlora", "lora_rank": 64, "batch": 4}),
    (
        TT_FULL,
        "torchtune",
        {
            "model": "llama-3.2-3b",
            "method": "full",
            "batch": 4,
            "grad_accum": 4,
            "checkpointing": "full",
            "precision": "bf16",
            "loss": "chunked",
        },
    ),
    # TRL ModelConfig: use_bnb_nested_quant defaults to False (no double quantization)
    (
        AH_QLORA,
        "transformers/trl",
        {
            "model": "mistralai/Mistral-7B-v0.1",
            "method": "qlora",
            "no_double_quant": True,
            "lora_rank": 16,
            "lora_alpha": 16.0,
            "lora_dropout": 0.05,
            "lora_targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
            "batch": 4,
            "grad_accum": 2,
            "seq": 2048,
            "checkpointing": "full",
            "attention": "flash",
            "precision": "bf16",
        },
    ),
    (
        AH_FULL,
        "transformers/trl",
        {
            "method": "full",
            "batch": 32,
            "grad_accum": 2,
            "seq": 2048,
            "attention": "flash",
            "precision": "bf16",
            "optimizer": "adamw",  # no optim: transformers' default adamw_torch_fused
            "optimizer_impl": "fused",
        },
    ),
    (
        AH_ZERO3,
        "accelerate",
        {
            "gpus": 1,
            "zero": 3,
            "offload": "cpu",
            "offload_params": "cpu",
            "precision": "mixed-bf16",
        },
    ),
    (ACC_FSDP, "accelerate", {"gpus": 2, "fsdp": "full-shard", "fsdp_version": 1, "precision": "amp-bf16"}),
    # accelerate deepspeed.yaml names ../deepspeed_config_templates/zero_stage1_config.json (fp16 enabled)
    (ACC_DS, "accelerate + deepspeed", {"gpus": 2, "zero": 1, "grad_accum": 1, "precision": "mixed-fp16"}),
    (LF_Z3_OFFLOAD, "deepspeed", {"zero": 3, "offload": "cpu", "offload_params": "cpu"}),
    (
        DS_LEAF,
        "deepspeed",
        {"zero": 3, "batch": 2, "grad_accum": 1, "precision": "mixed-bf16", "optimizer": "adamw"},
    ),
]


@pytest.mark.parametrize(("path", "fmt", "expected"), CASES, ids=lambda v: getattr(v, "name", None))
def test_example_maps_to_the_setup_it_states(path: Path, fmt: str, expected: dict[str, Any]) -> None:
    found = read_from_files([path])
    assert found.format == fmt
    got = {k: found.options.get(k) for k in expected}
    assert got == expected
    for f in found.mapped:  # every mapped field says where it came from
        assert f.source


def test_echo_names_file_and_key() -> None:
    found = read_from_files([AXOLOTL_LORA])
    rank = next(f for f in found.mapped if f.field == "lora-rank")
    assert rank.source == f"{AXOLOTL_LORA}:lora_r"
    lines = "\n".join(found.echo_lines())
    assert "detected: axolotl" in lines
    assert f"lora-rank = 32  <- {AXOLOTL_LORA}:lora_r" in lines


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (AXOLOTL_LORA, "lora_modules_to_save"),  # trainable embed_tokens/lm_head copies
        (LF_LORA, "per_device_eval_batch_size"),
        (DS_ZENFLOW, "zero_optimization.zenflow"),
        (DS_LEAF, "zero_optimization.leaf_module"),
        (LF_DS3, "zero_optimization.reduce_bucket_size"),  # "auto": HF fills it from hidden_size
    ],
)
def test_memory_fields_not_modelled_are_named(path: Path, named: str) -> None:
    found = read_from_files([path])
    assert any(f":{named} = " in item for item in found.not_modelled), found.not_modelled


def test_kernel_flags_are_returned_for_framework_profiles() -> None:
    assert read_from_files([AXOLOTL_FSDP]).kernels == {
        "liger": ["rope", "rms_norm", "swiglu", "fused_linear_cross_entropy"]
    }
    doc = {"base_model": "x", "gradient_checkpointing": "offload", "torch_compile": True}
    found = map_documents([("a.yml", doc)])
    assert found.options["checkpointing"] == "full" and found.options["activation_offload"] is True
    assert found.kernels == {"offloaded_checkpointing": True, "compile": True}
    assert found.options["compile"] is True  # torch_compile: the compiled profile (formulas/profiles.py)
    # accelerate compiles the whole model, the loss inside its forward included (benchmarks/compiled_loss.py)
    assert found.options["loss"] == "compiled"
    partial = map_documents([("a.yml", {"base_model": "x", "liger_rms_norm": True})])
    assert "liger" not in partial.options  # one kernel alone is named, not modelled as all of Liger
    assert any("liger_rms_norm" in item for item in partial.not_modelled)


def test_deepspeed_global_batch_gives_the_micro_batch_per_gpu() -> None:
    # zf_config.json: train_batch_size 32, accumulation 1; on 8 GPUs each holds 32 / 8 = 4 sequences
    out = _cli_json(["train", "llama-3.2-1b", "--from", str(DS_ZENFLOW), "--gpus", "8"])
    assert out["setup"]["micro_batch"] == 4
    assert {
        "field": "batch",
        "value": 4,
        "from": f"{DS_ZENFLOW}:train_batch_size",
        "note": "32 / (1 accumulation x 8 GPUs)",
    } in out["from_file"]["mapped"]
    code, err = _cli_error(["train", "llama-3.2-1b", "--from", str(DS_ZENFLOW), "--gpus", "3"])
    assert code == 2 and "train_batch_size=32" in err


def test_recipe_plus_accelerate_deepspeed() -> None:
    """alignment-handbook runs `accelerate launch --config_file deepspeed_zero3.yaml ... config_full.yaml`:
    the DeepSpeed bf16 engine keeps fp32 master weights (mixed-bf16), whatever the recipe loads."""
    found = read_from_files([AH_FULL, AH_ZERO3])
    assert found.format == "transformers/trl + accelerate"
    assert found.options["precision"] == "mixed-bf16"
    assert (found.options["zero"], found.options["offload"], found.options["batch"]) == (3, "cpu", 32)


def test_torchtune_builder_names() -> None:
    from peakmem.fromfile.torchtune import _torchtune_model_name

    assert _torchtune_model_name("lora_llama3_2_1b") == "llama-3.2-1b"
    assert _torchtune_model_name("qlora_llama3_1_8b") == "llama-3.1-8b"
    assert _torchtune_model_name("llama3_8b") == "llama-3-8b"


def test_detect_format_errors_list_what_is_read() -> None:
    with pytest.raises(InputError, match="axolotl, llama-factory, torchtune"):
        detect_format({"foo": 1})


# --- the command line --------------------------------------------------------------------------------
def _cli_json(argv: list[str]) -> dict[str, Any]:
    from contextlib import redirect_stdout
    from io import StringIO

    buf = StringIO()
    with redirect_stdout(buf):
        code = cli.main([*argv, "--json"])
    assert code in (0, 1), code
    out: dict[str, Any] = json.loads(buf.getvalue())
    return out


def _cli_error(argv: list[str]) -> tuple[int, str]:
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO

    err = StringIO()
    with redirect_stderr(err), redirect_stdout(StringIO()):
        code = cli.main(argv)
    return code, err.getvalue()


def _without_from(out: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in out.items() if k != "from_file"}


@pytest.mark.parametrize(
    ("path", "model", "flags"),
    [
        # the Hub id in the file resolves offline through the catalog (llama-3-8b's alias)
        (
            LF_LORA,
            None,
            [
                "llama-3-8b",
                "--method",
                "lora",
                "--lora-rank",
                "8",
                "--lora-alpha",
                "16",
                "--lora-dropout",
                "0",
                "--lora-targets",
                "all-linear",
                "--batch",
                "1",
                "--grad-accum",
                "8",
                "--seq",
                "1024",
                "--checkpointing",
                "full",
                "--precision",
                "bf16",
                "--optimizer-impl",
                "fused",  # no optim in the file: transformers' default adamw_torch_fused
            ],
        ),
        # NousResearch/Meta-Llama-3-8B is not in the catalog: the command line names the same model
        (
            AXOLOTL_LORA,
            "llama-3-8b",
            [
                "llama-3-8b",
                "--method",
                "qlora",
                "--quant",
                "int8",
                "--kbit-prep",
                "axolotl",
                "--lora-rank",
                "32",
                "--lora-alpha",
                "16",
                "--lora-dropout",
                "0.05",
                "--lora-targets",
                "all-linear",
                "--batch",
                "2",
                "--grad-accum",
                "4",
                "--seq",
                "4096",
                "--optimizer",
                "adamw-8bit",
                "--optimizer-impl",
                "fused",  # bitsandbytes: one fused kernel per tensor (the unified HF_OPTIMIZERS)
                "--attention",
                "flash",
                "--checkpointing",
                "full",
                "--precision",
                "bf16",
                "--expandable-segments",  # axolotl's CLI sets PYTORCH_CUDA_ALLOC_CONF
                "--alloc-roundup-divisions",  # ... with roundup_power2_divisions:16
                "16",
            ],
        ),
        (
            AH_QLORA,
            None,
            [
                "mistral-7b-v0.1",
                "--method",
                "qlora",
                "--no-double-quant",
                "--lora-rank",
                "16",
                "--lora-alpha",
                "16",
                "--lora-dropout",
                "0.05",
                "--lora-targets",
                "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                "--batch",
                "4",
                "--grad-accum",
                "2",
                "--seq",
                "2048",
                "--checkpointing",
                "full",
                "--attention",
                "flash",
                "--precision",
                "bf16",
                "--optimizer-impl",
                "fused",  # no optim in the file: transformers' default adamw_torch_fused
            ],
        ),
        (
            TT_FULL,
            None,
            [
                "llama-3.2-3b",
                "--framework",
                "torchtune",
                "--batch",
                "4",
                "--grad-accum",
                "4",
                "--checkpointing",
                "full",
                "--precision",
                "bf16",
                "--optimizer-impl",
                "fused",
                "--loss",
                "chunked",
                "--padded-lengths",
                "varying",
            ],
        ),
        (
            LF_DS3,
            None,
            [
                "llama-3-8b",
                "--method",
                "lora",
                "--lora-rank",
                "8",
                "--lora-alpha",
                "16",
                "--lora-dropout",
                "0",
                "--lora-targets",
                "all-linear",
                "--batch",
                "1",
                "--grad-accum",
                "2",
                "--seq",
                "2048",
                "--checkpointing",
                "full",
                "--precision",
                "mixed-bf16",
                "--zero",
                "3",
                "--gpus",
                "4",
                "--optimizer-impl",
                "fused",  # no optim, and no optimizer section in ds_z3_config.json: transformers' default
            ],
        ),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_cli_from_equals_the_same_flags(path: Path, model: str | None, flags: list[str]) -> None:
    argv = ["train", *([model] if model else []), "--from", str(path)]
    if "--gpus" in flags:
        argv += ["--gpus", flags[flags.index("--gpus") + 1]]
    from_file = _cli_json(argv)
    assert "from_file" in from_file
    flagged = _cli_json(["train", *flags])
    if path == LF_DS3:  # the DeepSpeed file sets overlap_comm, which has no flag (DeepSpeed's default: None)
        assert from_file["parallelism"].pop("overlap_comm") is True
        flagged["parallelism"].pop("overlap_comm")
    assert _without_from(from_file) == flagged


def test_cli_options_override_the_file_and_defaults_do_not() -> None:
    # the file says micro_batch_size 2 and sequence_len 4096; --batch 1 wins, seq stays the file's
    out = _cli_json(["train", "llama-3-8b", "--from", str(AXOLOTL_QLORA), "--batch", "1", "--lora-rank", "8"])
    assert out["setup"]["micro_batch"] == 1
    assert out["setup"]["lora"]["rank"] == 8
    assert out["setup"]["seq_len"] == 4096  # argparse's default seq (None) did not override the file
    assert out["setup"]["precision"] == "bf16"  # nor the default --precision mixed-bf16
    overridden = {f["field"]: f["value"] for f in out["from_file"]["overridden"]}
    assert overridden == {"model": "llama-3-8b", "batch": 1, "lora-rank": 8}


def test_cli_method_full_drops_the_files_adapter() -> None:
    out = _cli_json(["train", "llama-3-8b", "--from", str(AXOLOTL_LORA), "--method", "full"])
    assert out["setup"]["method"] == "full" and out["setup"]["lora"] is None and out["setup"]["quant"] is None


def test_cli_text_output_prints_the_echo(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--from", str(LF_LORA)]) == 0
    text = capsys.readouterr().out
    assert "(detected: llama-factory)" in text
    assert "cutoff_len" in text and "not modelled:" in text


def test_fit_reads_the_file() -> None:
    out = _cli_json(["fit", "--from", str(TT_LORA), "--gpu", "rtx-4090", "--seq", "2048"])
    assert out["from_file"]["format"] == "torchtune"


def test_python_api_equals_cli_json() -> None:
    api = peakmem.train(from_file=str(AH_QLORA), seq=1024)
    assert api.to_dict() == _cli_json(["train", "--from", str(AH_QLORA), "--seq", "1024"])
    assert api.model == "mistralai/Mistral-7B-v0.1" and api["model"]["name"] == "mistral-7b-v0.1"
    fitted = peakmem.fit("llama-3.2-1b", from_file=[TT_QLORA], gpu="8GB", seq=512).to_dict()
    cli_fit = _cli_json(["fit", "llama-3.2-1b", "--from", str(TT_QLORA), "--gpu", "8GB", "--seq", "512"])
    fitted.pop("elapsed_s"), cli_fit.pop("elapsed_s")  # the search's wall time
    assert fitted == cli_fit


# --- errors: exit 2, naming the file and the key ------------------------------------------------------
def test_broken_yaml_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yml"
    bad.write_text("base_model: x\nlora_r: [32\nmicro_batch_size: 2\n")
    code, err = _cli_error(["train", "--from", str(bad)])
    assert code == 2 and str(bad) in err and "invalid YAML at line" in err


def test_broken_json_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text('{"zero_optimization": {"stage": 3,}}')
    code, err = _cli_error(["train", "gpt2", "--from", str(bad)])
    assert code == 2 and f"{bad}: invalid JSON at line 1" in err


def test_missing_referenced_deepspeed_file(tmp_path: Path) -> None:
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("model_name_or_path: gpt2\nfinetuning_type: full\ndeepspeed: configs/ds_z9.json\n")
    code, err = _cli_error(["train", "--from", str(recipe)])
    assert code == 2
    assert str(recipe) in err and "deepspeed='configs/ds_z9.json'" in err and "no such file" in err


def test_missing_referenced_deepspeed_file_matched_to_the_one_given(tmp_path: Path) -> None:
    """`--from recipe.yaml --from ds_z3.json`: the recipe's deepspeed path (written for another machine)
    does not resolve; the DeepSpeed file given is the one meant, and the echo says so."""
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        "model_name_or_path: gpt2\nfinetuning_type: full\ncutoff_len: 512\ndeepspeed: configs/ds_z9.json\n"
    )
    out = _cli_json(["train", "--from", str(recipe), "--from", str(LF_Z3_OFFLOAD), "--gpus", "2"])
    block = out["from_file"]
    assert block["files"] == [str(recipe), str(LF_Z3_OFFLOAD)]
    assert block["format"] == "llama-factory + deepspeed"
    assert (out["setup"]["method"], out["parallelism"]["zero_stage"]) == ("full", 3)
    assert any(
        f"{recipe}:deepspeed = configs/ds_z9.json: no such file; matched to the DeepSpeed file given: "
        f"{LF_Z3_OFFLOAD}" in note
        for note in block["notes"]
    ), block["notes"]


def test_bad_value_names_the_key(tmp_path: Path) -> None:
    f = tmp_path / "a.yml"
    f.write_text("base_model: gpt2\nmicro_batch_size: two\n")
    code, err = _cli_error(["train", "--from", str(f)])
    assert code == 2 and f"{f}: micro_batch_size='two'" in err


def test_no_model_anywhere_is_an_input_error() -> None:
    code, err = _cli_error(["train", "--from", str(DS_LEAF)])
    assert code == 2 and "names no model" in err
    code, err = _cli_error(["train"])
    assert code == 2 and "needs a model" in err


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    code, err = _cli_error(["train", "gpt2", "--from", str(tmp_path / "nope.yaml")])
    assert code == 2 and "no such file" in err
    other = tmp_path / "x.json"
    other.write_text('{"hello": 1}')
    code, err = _cli_error(["train", "gpt2", "--from", str(other)])
    assert code == 2 and "cannot tell which framework" in err


def test_yaml_without_pyyaml_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(Exception, match=r"peakmem\[yaml\]"):
        parse_document("a: 1\n", "x.yaml")
    assert parse_document('{"a": 1}', "x.json") == {"a": 1}  # JSON needs no extra


def test_zero3_outside_zero_init_from_accelerate_and_deepspeed_files(tmp_path: Path) -> None:
    """accelerate's ``zero3_init_flag: false`` (alignment-handbook's deepspeed_zero3.yaml, flag flipped)
    is ``--no-zero-init``; a DeepSpeed file's ``memory_efficient_linear: false`` keeps zero.Init but
    torch's F.linear (formulas/zero3.py): both hold the gathered Linear weights to their backward."""
    import yaml

    doc = yaml.safe_load(AH_ZERO3.read_text())
    doc["deepspeed_config"].update(zero3_init_flag=False, offload_optimizer_device="none",
                                   offload_param_device="none", num_processes=4)  # fmt: skip
    doc["num_processes"] = 4
    acc = tmp_path / "zero3_no_init.yaml"
    acc.write_text(yaml.safe_dump(doc))
    assert read_from_files([acc]).options["no_zero_init"] is True
    from_file = _cli_json(["train", "llama-3.2-1b", "--from", str(acc), "--seq", "512"])
    flagged = _cli_json(["train", "llama-3.2-1b", "--gpus", "4", "--zero", "3", "--precision", "mixed-bf16",
                         "--seq", "512", "--no-zero-init"])  # fmt: skip
    assert _without_from(from_file) == flagged
    assert flagged["parallelism"]["zero_init"] is False
    saved = [i for i in flagged["items"] if "F.linear" in i["path"]]
    assert saved and saved[0]["bytes"] > 0
    api = peakmem.train("llama-3.2-1b", gpus=4, zero=3, precision="mixed-bf16", seq=512, no_zero_init=True)
    assert api.data["peak_allocated_bytes"] == flagged["peak_allocated_bytes"]
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "memory_efficient_linear": False}}))
    out = _cli_json(["train", "llama-3.2-1b", "--from", str(ds), "--gpus", "4", "--seq", "512"])
    assert out["parallelism"]["memory_efficient_linear"] is False and out["parallelism"]["zero_init"] is True
    assert any("F.linear" in i["path"] for i in out["items"])
