"""The typed question and its one answer (peakmem.question): every face asks the same question, so the
same job gets the same bytes whether it is asked with train or fit, and the defaults the framework
decides are named in the answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

import peakmem
from peakmem import defaults, options
from peakmem.cli import main
from peakmem.question import ask, verdict_code
from peakmem.training import Framework, OptimizerImpl, OptimizerName, Precision

LAYOUTS = [
    {"gpus": 8, "zero": 3},
    {"gpus": 8, "zero": 2, "offload": "cpu"},
    {"gpus": 8, "fsdp": "full-shard"},
    {"gpus": 8, "tp": 2, "pp": 2},
    {"gpus": 4, "cp": 2, "zero": 1},
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_fit_judges_the_per_rank_device_total_train_reports(layout: dict[str, Any]) -> None:
    train = peakmem.train("llama-3.1-8b", seq=4096, **layout).to_dict()
    fit = peakmem.fit("llama-3.1-8b", seq=4096, gpu="h100-80gb,24GB", **layout).to_dict()
    assert [g["needed_bytes"] for g in fit["gpus"]] == [train["device_total_bytes"]] * 2
    assert fit["parallelism"] == train["layout"]


def test_fit_shards_an_moe_over_experts_as_train_does() -> None:
    train = peakmem.train("qwen3-30b-a3b", seq=2048, gpus=8, ep=8, zero=1, gpu="h100-80gb").to_dict()
    fit = peakmem.fit("qwen3-30b-a3b", seq=2048, gpus=8, ep=8, zero=1, gpu="h100-80gb").to_dict()
    assert fit["gpus"][0]["needed_bytes"] == train["device_total_bytes"]
    # a Hopper GPU named: torch's 32 MiB cuBLAS workspace (formulas/overhead.py), 24 MiB over the default
    plain = peakmem.train("qwen3-30b-a3b", seq=2048, gpus=8, ep=8, zero=1).to_dict()
    assert train["device_total_bytes"] - plain["device_total_bytes"] == 32 * 2**20 - (8 * 2**20 + 128 * 1024)


def test_the_cli_fit_takes_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["llama-3.1-8b", "--gpus", "8", "--zero", "3", "--seq", "4096", "--json"]
    assert main(["train", *argv]) == 0
    train = json.loads(capsys.readouterr().out)
    main(["fit", *argv, "--gpu", "24GB"])
    fit = json.loads(capsys.readouterr().out)
    assert fit["gpus"][0]["needed_bytes"] == train["device_total_bytes"]


def test_the_seeds_question_names_the_40_gb_card(capsys: pytest.CaptureFixture[str]) -> None:
    """The seed: GPT-2 XL, mixed-precision Adam, which of 8/16/24/40 GB holds it: D) 40 GB."""
    seed = ["gpt2-xl", "--gpu", "8GB,16GB,24GB,40GB", "--precision", "mixed-fp16", "--seq", "1024"]
    code = main(["fit", *seed, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["smallest_sufficient"] == "40gb"
    assert [g["fits"] for g in out["gpus"]] == [False, False, False, True]
    assert out["setup"]["optimizer_impl"] == "fused" and out["defaults"][0].startswith("optimizer-impl fused")


@pytest.mark.parametrize(
    ("optimizer", "precision", "framework", "impl"),
    [
        (OptimizerName.ADAMW, Precision.MIXED_FP16, Framework.TORCHTUNE, OptimizerImpl.FUSED),  # fp32 masters
        (OptimizerName.ADAM, Precision.AMP_BF16, Framework.HF, OptimizerImpl.FUSED),  # the HF Trainer's optim
        (OptimizerName.ADAMW, Precision.BF16, Framework.TORCHTUNE, OptimizerImpl.FOREACH),  # torch.optim
        (OptimizerName.SGD_MOMENTUM, Precision.MIXED_BF16, Framework.HF, OptimizerImpl.FOREACH),
        (OptimizerName.ADAFACTOR, Precision.FP32, Framework.HF, OptimizerImpl.FOREACH),
    ],
)  # fmt: skip
def test_the_optimizer_step_default_follows_the_framework(
    optimizer: OptimizerName, precision: Precision, framework: Framework, impl: OptimizerImpl
) -> None:
    row = defaults.optimizer_step(optimizer, precision, framework)
    assert row.value == impl.value
    given = {"optimizer": optimizer.value, "precision": precision.value, "framework": framework.value}
    q = ask("train", given, model="llama-3.2-1b")
    assert q.training is not None and q.training.optimizer_impl is impl
    assert q.defaults == (row.assumption,)
    named = ask("train", {**given, "optimizer_impl": "for-loop"}, model="llama-3.2-1b")
    assert named.defaults == () and named.training is not None
    assert named.training.optimizer_impl is OptimizerImpl.FOR_LOOP  # a value given is never overridden


@pytest.mark.parametrize(
    ("release", "impl"),
    [("4.46.3", OptimizerImpl.FOREACH), ("4.53.0", OptimizerImpl.FOREACH), ("4.54.0", OptimizerImpl.FUSED),
     ("4.57.1", OptimizerImpl.FUSED), (None, OptimizerImpl.FUSED)],
)  # fmt: skip
def test_the_hf_trainer_optimizer_default_follows_the_transformers_release(
    release: str | None, impl: OptimizerImpl
) -> None:
    # TrainingArguments.optim: adamw_torch (torch.optim.AdamW, foreach on CUDA) before 4.54.0,
    # adamw_torch_fused from 4.54.0 (transformers 4.53.0 / 4.54.0 training_args.py); a DeepSpeed
    # master-weight setup keeps FusedAdam whatever the release
    row = defaults.optimizer_step(OptimizerName.ADAMW, Precision.BF16, Framework.HF, transformers=release)
    assert row.value == impl.value
    master = defaults.optimizer_step(
        OptimizerName.ADAMW, Precision.MIXED_BF16, Framework.HF, transformers=release
    )
    assert master.value == OptimizerImpl.FUSED.value
    given: dict[str, Any] = {"method": "full", "precision": "bf16", "seq": 64}
    if release is not None:
        given["transformers"] = release
    auto = peakmem.train("gpt2", **given).to_dict()
    named = peakmem.train("gpt2", **given, optimizer_impl=impl.value).to_dict()
    assert auto["peak_allocated_bytes"] == named["peak_allocated_bytes"]
    assert auto["phases"] == named["phases"]
    other = OptimizerImpl.FUSED if impl is OptimizerImpl.FOREACH else OptimizerImpl.FOREACH
    unlike = peakmem.train("gpt2", **given, optimizer_impl=other.value).to_dict()
    assert unlike["phases"]["optimizer"] != named["phases"]["optimizer"]  # the choice moves the step's bytes


def test_one_exit_code_rule() -> None:
    assert (verdict_code([]), verdict_code([False]), verdict_code([False, True]), verdict_code([True])) == (
        0, 1, 0, 0)  # fmt: skip
    assert peakmem.train("gpt2-xl", gpu="8GB").exit_code == 1
    assert peakmem.plan("gpt2", gpu="h100-80gb", max_gpus=1).exit_code == 0


def test_every_job_command_takes_the_options_its_setups_need() -> None:
    names = {c: {o.name for o in options.of(c)} for c in options.JOB_COMMANDS}
    assert {"gpus", "zero", "fsdp", "tp", "pp", "cp", "ep", "offload", "kernels"} <= names["fit"]
    assert {"weights", "kv_cache", "context", "engine", "infer"} <= names["fit"]
    assert {"kernels", "cuda_context_mib", "fragmentation", "profile"} <= names["plan"]


def test_the_cublas_workspace_follows_the_gpus_architecture() -> None:
    """torch's CublasHandlePool.cpp default: ":4096:2:16:8" = 2 x 4 MiB + 8 x 16 KiB below Hopper,
    ":4096:8" = 32 MiB on Hopper and Blackwell, 128 MiB on ROCm's gfx942 / gfx950; GPUs of several kinds
    keep the default."""
    from peakmem.catalog import get_gpu
    from peakmem.formulas.overhead import CUBLAS_WORKSPACE_BYTES
    from peakmem.question import overheads

    o = {"cuda_context_mib": None, "fragmentation": None, "expandable_segments": False, "profile": None}
    got = {
        g: overheads(o, [get_gpu(g)]).cublas_workspace_bytes
        for g in ("a100-80gb", "h100-sxm", "b200", "mi300x")
    }
    assert got == {"a100-80gb": 8_519_680, "h100-sxm": 32 * 2**20, "b200": 32 * 2**20, "mi300x": 128 * 2**20}
    assert CUBLAS_WORKSPACE_BYTES == 2 * 4 * 2**20 + 8 * 16 * 1024 == 8_519_680
    assert overheads(o, [get_gpu("a100-80gb"), get_gpu("h100-sxm")]).cublas_workspace_bytes == 8_519_680
