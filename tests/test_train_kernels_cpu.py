"""``train --kernels cpu`` against ``measure --device cpu`` for the same flags, on the CPU parity grid
(peakmem.measure.parity): the face builds the setup the grid checks, so anyone can hold an estimate
against a real CPU step. Tolerance 3 % of the measured peak (the grid's own worst is 2.3 %)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import peakmem
from peakmem.cli import main
from peakmem.measure.parity import Case, sampled_grid

pytestmark = [pytest.mark.torch, pytest.mark.slow]
TOLERANCE = 0.03
# a quarter of the sampled grid, every family, precision, attention, checkpointing and shape among them
# (tests/test_parity holds the formulas under the CPU kernel policy against all of it)
# gpt2 fp32 / bf16, llama amp-bf16 / mixed-bf16, qwen2 mixed-bf16 / fp32: both shapes, kernels, checkpointing
CASES = [sampled_grid()[i] for i in (1, 7, 10, 12, 16, 21)]


def _flags(case: Case) -> dict[str, Any]:
    s = case.setup
    return {"precision": s.precision.value, "attention": s.attention.value,
            "checkpointing": s.checkpointing.value, "batch": s.micro_batch, "seq": s.seq_len}  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_train_kernels_cpu_agrees_with_measure(case: Case, tmp_path: Path) -> None:
    from peakmem.measure import measure_training

    config = tmp_path / "config.json"
    config.write_text(json.dumps(case.config))
    estimate = peakmem.train(str(config), kernels="cpu", **_flags(case))
    setup = case.setup.__class__(
        **{**vars(case.setup), "optimizer_impl": estimate["setup"]["optimizer_impl"]}
    )
    measured = measure_training(case.config, setup, device="cpu", steps=2).peak_allocated_bytes
    error = estimate["peak_allocated_bytes"] / measured - 1
    assert abs(error) <= TOLERANCE, f"{case.name}: train --kernels cpu {error:+.2%} of measure --device cpu"


def test_cli_kernels_flag_is_the_apis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[0]
    config = tmp_path / "config.json"
    config.write_text(json.dumps(case.config))
    argv = ["train", str(config), "--kernels", "cpu", "--json"]
    for name, value in _flags(case).items():
        argv += [f"--{name}", str(value)]
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)
    api = peakmem.train(str(config), kernels="cpu", **_flags(case)).to_dict()
    assert cli == api and cli["setup"]["kernel_policy"] == "cpu"
    cuda = peakmem.train(str(config), kernels="cuda", **_flags(case))
    assert cuda["setup"]["kernel_policy"] == "cuda"
