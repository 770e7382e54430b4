"""Full checkpointing of every N-th layer (``--checkpointing every-N``, issue 27 part 3).

Saved activations on a tiny 4-layer llama: every-2 keeps two layers' tensors whole and only the
input of the other two (hand-derived: b x s x hidden bf16 bytes each); the layers wrapped follow
transformers 5.23's ``every_n_layers`` rule for the HF framework, torchtitan's for the others. Parity:
``train --kernels cpu`` against ``measure --device cpu`` at every-2, within 3 % of the measured peak
(tests/test_train_kernels_cpu's tolerance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import peakmem
from peakmem.breakdown import Category, Phase
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.hf import spec_from_config
from peakmem.measure.parity import FAMILIES
from peakmem.training import (
    Checkpointing,
    Framework,
    KernelPolicy,
    TrainingSetup,
    checkpointed_layers,
    parse_checkpointing,
)

LLAMA4 = {**FAMILIES["llama"], "num_hidden_layers": 4}
BATCH, SEQ = 1, 128
HIDDEN = LLAMA4["hidden_size"]
LAYER_INPUT = BATCH * SEQ * HIDDEN * 2  # mixed-bf16: the hidden states between layers are bf16
TOLERANCE = 0.03


def _forward_activations(checkpointing: Checkpointing, every: int = 1) -> dict[str, int]:
    setup = TrainingSetup(checkpointing=checkpointing, checkpoint_every=every, micro_batch=BATCH,
                          seq_len=SEQ, kernel_policy=KernelPolicy.CPU)  # fmt: skip
    est = estimate_training(spec_from_config(LLAMA4, name="llama4"), setup)
    forward = next(p for p in est.phases if p.phase is Phase.FORWARD)
    return {i.path: i.bytes for i in forward.items if i.category is Category.ACTIVATIONS}


def _layers(acts: dict[str, int]) -> int:
    return sum(b for path, b in acts.items() if path.startswith("layers["))


def test_every_2_saves_two_layers_whole_and_two_inputs() -> None:
    none, full, every2 = (_forward_activations(Checkpointing.NONE), _forward_activations(Checkpointing.FULL),
                          _forward_activations(Checkpointing.FULL, 2))  # fmt: skip
    whole = _layers(none) // 4  # one layer's saved tensors, nothing checkpointed
    assert _layers(full) == 4 * LAYER_INPUT
    assert _layers(every2) == 2 * whole + 2 * LAYER_INPUT
    assert whole > LAYER_INPUT
    # transformers' rule: layers 0 and 2 keep only their input, 1 and 3 everything
    assert every2["layers[0:1].layer input (checkpoint)"] == LAYER_INPUT
    assert every2["layers[2:3].layer input (checkpoint)"] == LAYER_INPUT
    assert not any(p.startswith(("layers[1:2].layer input", "layers[3:4].layer input")) for p in every2)
    outside = {p: b for p, b in none.items() if not p.startswith("layers[")}
    assert {p: b for p, b in every2.items() if not p.startswith("layers[")} == outside


def test_which_layers_are_wrapped() -> None:
    # transformers 5.23 _set_gradient_checkpointing: 0-based index % N == 0
    assert checkpointed_layers(5, 2, Framework.HF) == (True, False, True, False, True)
    # torchtitan _apply_layer_sac: 1-based count % N == 0
    assert checkpointed_layers(5, 2, Framework.TORCHTUNE) == (False, True, False, True, False)
    assert checkpointed_layers(3, 1, Framework.HF) == (True,) * 3


def test_every_2_recomputes_half_the_layers() -> None:
    from peakmem.formulas.step_time import recompute_flops_per_token, spec_flops

    sf = spec_flops(spec_from_config(LLAMA4, name="llama4"))
    setups = (TrainingSetup(checkpointing=Checkpointing.FULL, checkpoint_every=n) for n in (1, 2))
    full, every2 = (recompute_flops_per_token(sf, s) for s in setups)
    assert every2 == full / 2


def test_every_1_is_full() -> None:
    assert parse_checkpointing("every-1") == (Checkpointing.FULL, 1)
    assert parse_checkpointing("every-3") == (Checkpointing.FULL, 3)
    assert _forward_activations(Checkpointing.FULL, 1) == _forward_activations(Checkpointing.FULL)
    assert (
        TrainingSetup(checkpointing=Checkpointing.FULL, checkpoint_every=2).checkpointing_spelled == "every-2"
    )
    assert TrainingSetup(checkpointing=Checkpointing.FULL).checkpointing_spelled == "full"


@pytest.mark.parametrize("bad", ["every-0", "every-x", "every-", "every--2", "every-2.5", "sometimes"])
def test_bad_every_is_one_line_input_error(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InputError, match="checkpointing"):
        parse_checkpointing(bad)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA4))
    assert main(["train", str(config), "--checkpointing", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert "checkpointing" in err and bad in err and "\n" not in err


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(("precision", "batch", "seq"), [("mixed-bf16", 4, 128), ("fp32", 2, 128)])
def test_every_2_train_kernels_cpu_agrees_with_measure(precision: str, batch: int, seq: int,
                                                        tmp_path: Path) -> None:  # fmt: skip
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from peakmem.measure import measure_training
    from peakmem.simulate import simulate_training

    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA4))
    flags = {"precision": precision, "checkpointing": "every-2", "batch": batch, "seq": seq}
    estimate = peakmem.train(str(config), kernels="cpu", **flags)
    assert estimate["setup"]["checkpoint_every"] == 2
    setup = TrainingSetup(precision=precision, checkpointing=Checkpointing.FULL, checkpoint_every=2,  # type: ignore[arg-type]
                          micro_batch=batch, seq_len=seq, kernel_policy=KernelPolicy.CPU,
                          optimizer_impl=estimate["setup"]["optimizer_impl"])  # fmt: skip
    # the policy moves the peak at this shape: every-2 lies strictly between none and full
    none, full = (peakmem.train(str(config), kernels="cpu", **{**flags, "checkpointing": ck})
                  for ck in ("none", "full"))  # fmt: skip
    assert full["peak_allocated_bytes"] < estimate["peak_allocated_bytes"] < none["peak_allocated_bytes"]
    measured = measure_training(LLAMA4, setup, device="cpu", steps=2).peak_allocated_bytes
    error = estimate["peak_allocated_bytes"] / measured - 1
    assert abs(error) <= TOLERANCE, f"every-2 {precision}: train --kernels cpu {error:+.2%} of measure"
    # simulate (fake tensors, the measured run's model) unwraps the same layers
    simulated = simulate_training(LLAMA4, setup, kernels="cpu", steps=2).peak_allocated_bytes
    assert abs(simulated / measured - 1) <= TOLERANCE, (
        f"every-2 {precision}: simulate {simulated} vs {measured}"
    )


def test_the_web_api_takes_every_n_as_the_cli() -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    import contextlib
    import io
    import json

    from fastapi.testclient import TestClient

    from peakmem.cli import main
    from peakmem.web import app as web

    with TestClient(web.create_app()) as client:
        got = client.post("/api/train", json={"model": "llama-3.2-1b", "checkpointing": "every-2"}).json()
        bad = client.post("/api/train", json={"model": "llama-3.2-1b", "checkpointing": "every-x"})
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["train", "llama-3.2-1b", "--checkpointing", "every-2", "--json"])
    cli = json.loads(buf.getvalue())
    assert got["peak_allocated_bytes"] == cli["peak_allocated_bytes"]
    assert bad.status_code == 422 and "checkpointing" in bad.text


# --- op-level selective activation checkpointing (torchtitan selective_ac_option = "op") -------------------
def test_op_keeps_the_input_and_every_other_matmul_output() -> None:
    """Tiny llama, fp32, CPU: per layer the input (T x h x 4) and the outputs of the 1st, 3rd, 5th and 7th
    matmuls - q (T x a*d), v (T x g*d), gate (T x I), down (T x h) - hand-derived from the config."""
    tokens = BATCH * SEQ
    h, inter = LLAMA4["hidden_size"], LLAMA4["intermediate_size"]
    d = h // LLAMA4["num_attention_heads"]
    q, v = tokens * h * 4, tokens * LLAMA4["num_key_value_heads"] * d * 4
    per_layer = tokens * h * 4 + q + v + tokens * inter * 4 + tokens * h * 4
    setup = TrainingSetup(precision="fp32", checkpointing=Checkpointing.OP, micro_batch=BATCH,  # type: ignore[arg-type]
                          seq_len=SEQ, kernel_policy=KernelPolicy.CPU)  # fmt: skip
    est = estimate_training(spec_from_config(LLAMA4, name="llama4"), setup)
    forward = next(p for p in est.phases if p.phase is Phase.FORWARD)
    acts = {i.path: i.bytes for i in forward.items if i.category is Category.ACTIVATIONS}
    assert _layers(acts) == 4 * per_layer
    assert {p.split("].", 1)[1] for p in acts if p.startswith("layers[")} == {
        "layer input (checkpoint)", "q_proj output (op SAC: saved mm)", "v_proj output (op SAC: saved mm)",
        "gate_proj output (op SAC: saved mm)", "down_proj output (op SAC: saved mm)",
    }  # fmt: skip


def test_op_counts_bias_free_matmuls_only() -> None:
    from peakmem.formulas.activations import op_saved_linears

    llama = spec_from_config(LLAMA4, name="llama4").groups[0].layer
    assert op_saved_linears(llama) == (
        "self_attn.q_proj",
        "self_attn.v_proj",
        "mlp.gate_proj",
        "mlp.down_proj",
    )
    # Qwen2's biased q/k/v run addmm (not in the save list, not counted): o, gate, up, down count
    qwen2 = spec_from_config(FAMILIES["qwen2"], name="qwen2").groups[0].layer
    assert op_saved_linears(qwen2) == ("self_attn.o_proj", "mlp.up_proj")
    gpt2 = spec_from_config(FAMILIES["gpt2"], name="gpt2").groups[0].layer
    assert op_saved_linears(gpt2) == ()


def test_op_recomputes_the_matmuls_it_does_not_keep() -> None:
    from peakmem.formulas.step_time import recompute_flops_per_token, spec_flops

    h, inter, layers = LLAMA4["hidden_size"], LLAMA4["intermediate_size"], LLAMA4["num_hidden_layers"]
    kv = LLAMA4["num_key_value_heads"] * h // LLAMA4["num_attention_heads"]
    recomputed = layers * (kv * h + h * h + inter * h)  # k, o, up: the 2nd, 4th and 6th matmuls
    sf = spec_flops(spec_from_config(LLAMA4, name="llama4"))
    for policy in (KernelPolicy.CPU, KernelPolicy.CUDA):
        setup = TrainingSetup(checkpointing=Checkpointing.OP, seq_len=SEQ, kernel_policy=policy)
        # CPU's SDPA kernel is not in the save list: its attention is recomputed; CUDA's is kept
        attention = sf.attention_flops_per_token(SEQ, sf.kernel(setup)) if policy is KernelPolicy.CPU else 0.0
        assert recompute_flops_per_token(sf, setup) == 2.0 * recomputed + attention


def test_op_is_parsed_and_unknown_lists_it() -> None:
    assert parse_checkpointing("op") == (Checkpointing.OP, 1)
    with pytest.raises(InputError, match="none, selective, op, full, every-N"):
        parse_checkpointing("ops")


def test_op_rejects_what_it_does_not_model() -> None:
    with pytest.raises(InputError, match="checkpointing='op'"):
        peakmem.train("llama-3.2-1b", checkpointing="op", method="lora")


OP_CASES = [("llama", "mixed-bf16", 4, 128), ("llama", "amp-bf16", 2, 128), ("qwen2", "fp32", 2, 128)]


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(("family", "precision", "batch", "seq"), OP_CASES)
def test_op_train_kernels_cpu_agrees_with_measure(family: str, precision: str, batch: int, seq: int,
                                                  tmp_path: Path) -> None:  # fmt: skip
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from peakmem.measure import measure_training
    from peakmem.simulate import simulate_training

    cfg = {**FAMILIES[family], "num_hidden_layers": 4}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    flags = {"precision": precision, "checkpointing": "op", "batch": batch, "seq": seq}
    estimate = peakmem.train(str(config), kernels="cpu", **flags)
    setup = TrainingSetup(precision=precision, checkpointing=Checkpointing.OP, micro_batch=batch,  # type: ignore[arg-type]
                          seq_len=seq, kernel_policy=KernelPolicy.CPU,
                          optimizer_impl=estimate["setup"]["optimizer_impl"])  # fmt: skip
    measured = measure_training(cfg, setup, device="cpu", steps=2)
    error = estimate["peak_allocated_bytes"] / measured.peak_allocated_bytes - 1
    assert abs(error) <= TOLERANCE, f"op {family} {precision}: train --kernels cpu {error:+.2%} of measure"
    forward = next(p.bytes for p in measured.phases if p.phase is Phase.FORWARD)
    assert abs(estimate["phases"]["forward"] / forward - 1) <= TOLERANCE  # what the layers keep
    simulated = simulate_training(cfg, setup, kernels="cpu", steps=2).peak_allocated_bytes
    assert abs(simulated / measured.peak_allocated_bytes - 1) <= TOLERANCE, (
        f"op {family} {precision}: simulate {simulated} vs {measured.peak_allocated_bytes}"
    )
