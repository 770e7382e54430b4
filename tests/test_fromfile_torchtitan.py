"""``--from`` a torchtitan TOML (peakmem.fromfile.torchtitan): real train_configs map to the job they run.

Each expected mapping is read off the file and torchtitan's source (cited per case), not off the code.
Fixtures: tests/fixtures/frameworks/torchtitan/*.toml, copied at the commit their first line names.
"""

from __future__ import annotations

import json
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from _bench import load_benchmark
from peakmem import cli
from peakmem.errors import InputError
from peakmem.fromfile import detect_format, map_documents, parse_document, read_from_files
from peakmem.userfiles import parse_toml
from test_fromfile import _cli_json

HERE = Path(__file__).resolve().parent / "fixtures" / "frameworks" / "torchtitan"
LLAMA3_8B = HERE / "llama3_8b.toml"  # 238fa995, the last TOML commit
LLAMA3_405B = HERE / "llama3_405b.toml"  # 9dec370, the 2024 layout of the published runs
DEEPSEEK_16B = HERE / "deepseek_v3_16b.toml"  # 238fa995, MoE with EP


def _doc(path: Path) -> dict[str, Any]:
    return parse_toml(path.read_text(), str(path))


def _map(doc: dict[str, Any], gpus: int | None = None) -> Any:
    return map_documents([("t.toml", doc)], gpus=gpus)


def _minimal(**sections: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": {"name": "llama3", "flavor": "8B"}, "parallelism": {}}
    for name, values in sections.items():
        doc.setdefault(name, {}).update(values)
    return doc


# --- the fixtures, each field read off the file ----------------------------------------------------------
def test_llama3_8b_on_64_gpus() -> None:
    found = read_from_files([LLAMA3_8B], gpus=64)
    assert found.formats == ("torchtitan",)
    assert found.options == {
        "model": "llama-3.1-8b",  # [model] llama3 8B (hf_assets_path Llama-3.1-8B)
        "fsdp": "full-shard",  # data_parallel_shard_degree -1 -> 64 / (1 x 1 x 1 x 1) = 64 > 1: FSDP2
        "fsdp_version": 2,
        "seq": 8192,  # training.seq_len
        "batch": 1,  # training.local_batch_size
        "precision": "mixed-bf16",  # mixed_precision_param default bfloat16 under FSDP2, no autocast
        "fsdp_reduce_dtype": "fp32",  # training.mixed_precision_reduce default float32
        "checkpointing": "op",  # selective + selective_ac_option 'op'
        "optimizer": "adamw",  # optimizer.name AdamW
        "optimizer_impl": "fused",  # optimizer.implementation default at 238fa995
    }  # [compile] enable=false: neither compile nor the compiled loss; converters commented out: no float8
    assert found.not_modelled == ()  # every other key is logging, data, checkpoint folders or float8 off


def test_llama3_405b_2024_layout_on_64_gpus() -> None:
    found = read_from_files([LLAMA3_405B], gpus=64)
    assert found.options == {
        "model": "llama-3.1-405b",
        "fsdp": "full-shard",  # 64 / tp 8 = dp_shard 8
        "fsdp_version": 2,
        "tp": 8,  # training.tensor_parallel_degree (the 2024 layout)
        "sp": True,  # the TP plan's SequenceParallel norms
        "seq": 8192,
        "batch": 2,  # training.batch_size (renamed local_batch_size in 2025-06)
        "precision": "float8-tensorwise",  # [float8] enable_float8_linear, no recipe then
        "fsdp_reduce_dtype": "fp32",  # training.mixed_precision_reduce default float32 (9dec370)
        "float8_all_gather": True,  # enable_fsdp_float8_all_gather with dp_shard 8 > 1
        "checkpointing": "full",
        "compile": True,  # training.compile; the loss stays eager at 9dec370
        "optimizer": "adamw",
        "optimizer_impl": "foreach",  # 9dec370 optimizer.py: fused off -> foreach
    }
    assert len(found.not_modelled) == 1 and "enable_async_tensor_parallel" in found.not_modelled[0]
    assert any("runs the loss eagerly" in n for n in found.notes)


def test_deepseek_16b_moe_with_ep() -> None:
    found = read_from_files([DEEPSEEK_16B], gpus=16)
    assert found.options == {
        "model": "deepseek-v2-lite",  # the 16B flavour's arguments are DeepSeek-V2-Lite's
        "fsdp": "full-shard",
        "fsdp_version": 2,
        "ep": 8,  # parallelism.expert_parallel_degree
        "seq": 4096,
        "batch": 4,
        "precision": "mixed-bf16",
        "fsdp_reduce_dtype": "fp32",
        "checkpointing": "op",
        "loss": "compiled",  # [compile] enable, components ["loss"]: the model is not compiled
        "optimizer": "adamw",
        "optimizer_impl": "fused",
    }
    assert found.not_modelled == ()  # [quantize.grouped_mm.float8] without its converter does nothing


def test_the_2024_release_matches_the_published_scale_mapping() -> None:
    """The 405B run of torchtitan's 2024-12 H100 benchmark (9dec370): its TOML with the run's overrides,
    mapped here, equals the options benchmarks/published_scale.py builds from the point's facts."""
    bench = load_benchmark("published_scale")
    points = json.loads(bench.POINTS_FILE.read_text())["points"]
    point = next(p for p in points if p["id"] == "tt2412-t5-405b-fsdp8-tp8-pp8-1f1b")
    doc = _doc(LLAMA3_405B)
    doc["training"]["batch_size"] = point["job"]["local_batch"]
    doc["experimental"]["pipeline_parallel_degree"] = point["layout"]["pp"]
    doc["experimental"]["pipeline_parallel_microbatches"] = point["layout"]["pp_microbatches"]
    found = _map(doc, gpus=point["layout"]["gpus"])
    expected = bench.train_options(point)
    # peakmem's defaults, which the file leaves; the model, which the point names outside its options
    defaults = {"method": "full", "attention": "sdpa", "loss": "standard", "gpus": point["layout"]["gpus"]}
    got = {**defaults, **found.options}
    assert got.pop("model") == point["model"]
    # 9dec370 parallelize_llama.py apply_fsdp: "For PP, do not reshard after forward": peakmem's FSDP2
    # full-shard under PP keeps every unit of the stage unsharded (formulas/fsdp2.py in_layer)
    assert got == expected


# --- the world size ---------------------------------------------------------------------------------------
def test_shard_degree_minus_one_needs_gpus() -> None:
    with pytest.raises(InputError, match=r"data_parallel_shard_degree = -1 .* give --gpus N"):
        read_from_files([LLAMA3_8B])


def test_degrees_all_given_set_the_gpus_and_refuse_another_count() -> None:
    doc = _minimal(parallelism={"data_parallel_shard_degree": 4, "tensor_parallel_degree": 2})
    assert _map(doc).options["gpus"] == 8
    with pytest.raises(InputError, match=r"--gpus 16 != data_parallel_shard 4 x .* = 8"):
        _map(doc, gpus=16)
    with pytest.raises(InputError, match="not a multiple"):
        _map(_minimal(parallelism={"tensor_parallel_degree": 3}), gpus=8)


def test_hsdp_ddp_and_one_gpu() -> None:
    hsdp = _map(_minimal(parallelism={"data_parallel_replicate_degree": 4, "data_parallel_shard_degree": 8}))
    assert hsdp.options["fsdp"] == "hybrid-shard" and hsdp.options["gpus"] == 32
    assert hsdp.options["gpus_per_node"] == 8  # a node of the shard group: peakmem shards within a node
    ddp = _map(_minimal(parallelism={"data_parallel_replicate_degree": 4, "data_parallel_shard_degree": 1}))
    assert "fsdp" not in ddp.options and ddp.options["gpus"] == 4
    assert ddp.options["precision"] == "amp-bf16"  # maybe_enable_amp: autocast under DDP
    old = _minimal(parallelism={"data_parallel_shard_degree": 1}, training={"batch_size": 2})
    assert _map(old).options["precision"] == "fp32"  # no autocast before 2025-06-16
    tp_only = _map(_minimal(parallelism={"data_parallel_shard_degree": 1, "tensor_parallel_degree": 2}))
    assert tp_only.options["precision"] == "fp32"  # mixed precision off with TP and no FSDP
    cp = _map(_minimal(parallelism={"data_parallel_shard_degree": 1, "context_parallel_degree": 2}))
    assert cp.options["fsdp"] == "full-shard" and cp.options["cp"] == 2  # FSDP over dp_shard x cp
    assert cp.options["cp_rotate"] == "allgather"


# --- batch, accumulation, pipeline -----------------------------------------------------------------------
def test_global_batch_gives_the_accumulation() -> None:
    doc = _minimal(training={"local_batch_size": 2, "global_batch_size": 64})
    found = _map(doc, gpus=8)  # dp 8: 64 / (2 x 8) = 4 steps
    assert found.options["batch"] == 2 and found.options["grad_accum"] == 4
    assert found.options["grad_sync"] == "each-micro-batch"  # train_step: no no_sync (peakmem.defaults)
    with pytest.raises(InputError, match="global_batch_size=60"):
        _map(_minimal(training={"local_batch_size": 2, "global_batch_size": 60}), gpus=8)


def test_pipeline_micro_batches() -> None:
    doc = _minimal(
        training={"local_batch_size": 8},
        parallelism={"pipeline_parallel_degree": 4, "pipeline_parallel_microbatch_size": 2,
                     "pipeline_parallel_schedule": "Interleaved1F1B"},
    )  # fmt: skip
    found = _map(doc, gpus=8)  # dp_shard 2
    assert found.options["batch"] == 2 and found.options["grad_accum"] == 4  # 8 / 2 micro-batches
    assert found.options["pp_schedule"] == "interleaved" and found.options["virtual_stages"] == 2
    # "default" keeps the parameters with PP, which peakmem's FSDP2 full-shard under PP models
    assert found.options["fsdp"] == "full-shard"
    gpipe = _minimal(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "GPipe"})
    assert any("GPipe" in s for s in _map(gpipe, gpus=4).not_modelled)


# --- checkpointing, compile, float8, optimizer, precision ------------------------------------------------
@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"mode": "none"}, "none"),
        ({"mode": "full"}, "full"),
        ({"mode": "selective", "selective_ac_option": "op"}, "op"),
        ({"mode": "selective", "selective_ac_option": "3"}, "every-3"),
        ({"mode": "selective", "selective_ac_option": "1"}, "full"),
        ({}, "every-2"),  # torchtitan's defaults: selective, "2"
    ],
)
def test_activation_checkpoint(section: dict[str, Any], expected: str) -> None:
    doc = _minimal(activation_checkpoint=section) if section else _minimal()
    assert _map(doc, gpus=8).options["checkpointing"] == expected


def test_compile_components_and_float8_recipes() -> None:
    both = _map(_minimal(compile={"enable": True}), gpus=8).options  # components default model, loss
    assert both["compile"] is True and both["loss"] == "compiled"
    model_only = _map(_minimal(compile={"enable": True, "components": ["model"]}), gpus=8).options
    assert model_only["compile"] is True and "loss" not in model_only
    rowwise = _minimal(quantize={"linear": {"float8": {"recipe_name": "rowwise", "filter_fqns": ["output"]}}})
    rowwise["model"]["converters"] = ["quantize.linear.float8"]
    found = _map(rowwise, gpus=8)
    assert found.options["precision"] == "float8-rowwise" and "float8_all_gather" not in found.options
    head = _minimal(quantize={"linear": {"float8": {"filter_fqns": []}}})
    head["model"]["converters"] = ["float8"]
    assert any("output head" in s for s in _map(head, gpus=8).not_modelled)


def test_optimizer_and_pure_bf16() -> None:
    doc = _minimal(optimizer={"name": "Adam", "implementation": "for-loop", "early_step_in_backward": True},
                   training={"dtype": "bfloat16", "enable_cpu_offload": True})  # fmt: skip
    found = _map(doc, gpus=8)
    assert found.options["optimizer"] == "adam" and found.options["optimizer_impl"] == "for-loop"
    assert found.options["optimizer_in_backward"] is True
    assert found.options["precision"] == "bf16"
    assert found.options["offload"] == "cpu" and found.options["offload_params"] == "cpu"
    muon = _map(_minimal(optimizer={"name": "Muon"}), gpus=8)
    assert "optimizer" not in muon.options and any("Muon" in s for s in muon.not_modelled)


# --- what is not read ------------------------------------------------------------------------------------
def test_unknown_keys_are_named() -> None:
    doc = _minimal(training={"frobnicate": 3}, wizard={"spell": "x"})
    found = _map(doc, gpus=8)
    assert any("training.frobnicate = 3" in s for s in found.not_modelled)
    assert any("wizard.spell = x" in s for s in found.not_modelled)
    doc = _minimal(parallelism={"pipeline_parallel_degree": 2, "pipeline_parallel_layers_per_stage": 4})
    assert any("layers_per_stage" in s for s in _map(doc, gpus=4).not_modelled)


def test_a_flavour_not_in_the_catalog_is_named(tmp_path: Path) -> None:
    path = tmp_path / "llama4.toml"
    text = '[model]\nname = "llama4"\nflavor = "17bx16e"\n[parallelism]\ndata_parallel_shard_degree = 8\n'
    path.write_text(text)
    code, err = _cli(["train", "--from", str(path)])
    assert code == 2 and "llama4 17bx16e" in err and "vision-language" in err and err.count("\n") == 1
    out = _cli_json(["train", "llama-3.1-8b", "--from", str(path)])  # MODEL given: the file's layout used
    assert out["parallelism"]["gpus"] == 8


def test_detection_and_bad_toml(tmp_path: Path) -> None:
    assert detect_format(_doc(LLAMA3_8B)) == "torchtitan"
    assert detect_format({"model": {"_component_": "torchtune.models.llama3_2.llama3_2_1b"}}) == "torchtune"
    with pytest.raises(InputError, match=r"t.toml: invalid TOML at line 2, column \d+"):
        parse_document("[model]\nname = llama3\n", "t.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[training]\nseq_len = 8192\n[training]\n")
    code, err = _cli(["train", "--from", str(bad), "--gpus", "8"])
    assert code == 2 and "invalid TOML at line 3" in err and err.count("\n") == 1


# --- the command line: --from FILE equals the same flags -------------------------------------------------
def _cli(argv: list[str]) -> tuple[int, str]:
    err = StringIO()
    with redirect_stderr(err), redirect_stdout(StringIO()):
        code = cli.main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("path", "gpus", "flags"),
    [
        (LLAMA3_8B, 64, ["llama-3.1-8b", "--fsdp", "full-shard", "--fsdp-version", "2", "--seq", "8192",
                         "--batch", "1", "--precision", "mixed-bf16", "--checkpointing", "op",
                         "--optimizer", "adamw", "--optimizer-impl", "fused", "--fsdp-reduce-dtype", "fp32"]),
        (LLAMA3_405B, 64, ["llama-3.1-405b", "--fsdp", "full-shard", "--fsdp-version", "2", "--tp", "8",
                           "--sp", "--seq", "8192", "--batch", "2", "--precision", "float8-tensorwise",
                           "--float8-all-gather", "--checkpointing", "full", "--compile",
                           "--optimizer", "adamw", "--optimizer-impl", "foreach",
                           "--fsdp-reduce-dtype", "fp32"]),
    ],
    ids=["llama3_8b", "llama3_405b"],
)  # fmt: skip
def test_cli_from_equals_the_same_flags(path: Path, gpus: int, flags: list[str]) -> None:
    from_file = _cli_json(["train", "--from", str(path), "--gpus", str(gpus)])
    assert from_file["from_file"]["format"] == "torchtitan"
    flagged = _cli_json(["train", *flags, "--gpus", str(gpus)])
    assert {k: v for k, v in from_file.items() if k != "from_file"} == flagged


def test_fit_reads_the_file() -> None:
    out = _cli_json(["fit", "--from", str(LLAMA3_8B), "--gpus", "64", "--gpu", "h100-80gb"])
    assert out["from_file"]["format"] == "torchtitan"


def test_the_fixtures_are_unchanged_copies() -> None:
    for path in (LLAMA3_8B, LLAMA3_405B, DEEPSEEK_16B):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# Source: https://github.com/pytorch/torchtitan/blob/"), path
