"""``keep_grads``: ``optimizer.zero_grad(set_to_none=False)``, torch < 2.0's default (Lightning 1.x and 2022
HF Trainer loops). The zeroed gradients stay allocated between steps, so the next forward runs with
them: hand-derived bytes, parity with a real CPU step, the same answer from the CLI, the API and the page,
and no effect where the master-weight step already dropped the 16-bit gradients."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

import peakmem
from peakmem.breakdown import Phase
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.hf import spec_from_config
from peakmem.measure.parity import FAMILIES
from peakmem.training import KernelPolicy, TrainingSetup

LLAMA = {**FAMILIES["llama"], "num_hidden_layers": 2}
TOLERANCE = 0.01  # measured: 0 bytes apart for fp32, amp-bf16 and bf16 (tiny Llama, batch 2 x seq 64)


def _setup(precision: str, keep: bool) -> TrainingSetup:
    return TrainingSetup(precision=precision, micro_batch=2, seq_len=64, kernel_policy=KernelPolicy.CPU,  # type: ignore[arg-type]
                         grads_set_to_none=not keep)  # fmt: skip


def _forward(precision: str, keep: bool) -> int:
    est = estimate_training(spec_from_config(LLAMA, name="llama2"), _setup(precision, keep))
    return next(p.bytes for p in est.phases if p.phase is Phase.FORWARD)


@pytest.mark.parametrize(("precision", "grad_bytes"), [("fp32", 4), ("amp-bf16", 4), ("bf16", 2)])
def test_the_forward_carries_every_gradient(precision: str, grad_bytes: int) -> None:
    # a gradient has its parameter's dtype (torch AccumulateGrad): fp32 weights under amp, bf16 under bf16
    h, ffn, vocab, kv = 128, 344, 512, 2 * 32  # 2 KV heads of head_dim 32; the head is untied
    layer = h * h * 2 + h * kv * 2 + 3 * h * ffn + 2 * h  # q, o; k, v; gate, up, down; two RMSNorms
    params = 2 * vocab * h + 2 * layer + h  # embedding, head, 2 layers, final norm
    assert params == spec_from_config(LLAMA, name="llama2").params
    assert _forward(precision, keep=True) - _forward(precision, keep=False) == params * grad_bytes


@pytest.mark.parametrize("precision", ["mixed-bf16", "mixed-fp16"])
def test_master_weight_steps_leave_nothing_to_keep(precision: str) -> None:
    est = estimate_training(spec_from_config(LLAMA, name="llama2"), _setup(precision, keep=True))
    bare = estimate_training(spec_from_config(LLAMA, name="llama2"), _setup(precision, keep=False))
    assert est.peak_allocated_bytes == bare.peak_allocated_bytes
    assert any("keep_grads" in note for note in est.assumptions), est.assumptions


@pytest.mark.torch
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "mixed-bf16"])
def test_keep_grads_agrees_with_a_real_cpu_step(precision: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from peakmem.measure import measure_training

    setup = _setup(precision, keep=True)
    measured = measure_training(dict(LLAMA), setup).peak_allocated_bytes
    analytic = estimate_training(spec_from_config(LLAMA, name="llama2"), setup).peak_allocated_bytes
    assert abs(analytic / measured - 1) <= TOLERANCE, (precision, analytic, measured)


def _cli(*args: str) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["train", *args, "--json"])
    return json.loads(buf.getvalue())


def test_cli_api_and_page_agree(tmp_path: Path) -> None:
    flags = {"precision": "amp-fp16", "gpus": 4, "batch": 2}
    api = peakmem.train("gpt2", keep_grads=True, **flags)
    assert api["setup"]["grads_set_to_none"] is False
    cli = _cli("gpt2", "--keep-grads", "--precision", "amp-fp16", "--gpus", "4", "--batch", "2")
    assert cli["peak_allocated_bytes"] == api["peak_allocated_bytes"]
    assert api["peak_allocated_bytes"] > peakmem.train("gpt2", **flags)["peak_allocated_bytes"]
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from peakmem.web import app as web

    with TestClient(web.create_app()) as client:
        body = {"model": "gpt2", "keep_grads": True, "precision": "amp-fp16", "gpu_count": 4, "batch": 2}
        page = client.post("/api/train", json=body).json()
        bad = client.post("/api/train", json={"model": "gpt2", "keep_grads": "sometimes"})
    assert page["peak_allocated_bytes"] == api["peak_allocated_bytes"]
    assert bad.status_code == 422 and "keep_grads" in bad.text


def test_a_non_bool_is_one_line_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match="keep_grads"):
        peakmem.train("gpt2", keep_grads="yes please")
    with pytest.raises(SystemExit) as exited:  # argparse: a flag takes no value
        main(["train", "gpt2", "--keep-grads=yes"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "keep" in err and "\n" not in err


def test_fit_offers_to_free_the_gradients() -> None:
    # gpt2, amp-fp16, batch 4 x 1024: 8.67 GiB with the gradients kept, 8.04 GiB freed; an 8.3 GiB card
    flags = {"precision": "amp-fp16", "batch": 4, "seq": 1024, "gpu": "8.3GiB"}
    kept = peakmem.fit("gpt2", keep_grads=True, **flags)
    labels = {c["label"]: c for c in kept["gpus"][0]["candidates"]}
    freed = labels["zero_grad(set_to_none=True)"]
    assert freed["fits"] and freed["needed_bytes"] == peakmem.train("gpt2", **flags)["device_total_bytes"]
    family = {f["name"]: f for f in peakmem.fit("gpt2", **flags)["search_space"]}
    assert family["free gradients between steps"]["status"] == "not applicable"
