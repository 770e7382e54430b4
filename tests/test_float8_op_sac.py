"""Float8 training under op-level selective activation checkpointing (``--precision float8-* --checkpointing
op``, issue 27: torchtitan's default): torchao's float8 Linears reach the policy as ``aten.mm`` on
``Float8TrainingTensor`` operands (peakmem.formulas.activations.op_sac module doc), so a layer keeps what a
16-bit layer keeps, and its casts run again in the recomputation.

Hand-derived on the tiny Llama (tests/tiny_models.py LLAMA: hidden 64, 2 KV heads of 16, intermediate
176, 2 layers; all 7 Linears per layer converted) and held against ``peakmem measure``, which runs
torchtitan's policy (peakmem.measure.op_sac) on torchao 0.18's Float8Linear on this CPU, within the 3 %
per phase of tests/test_float8_training.py (measured, tensorwise: the tiny Llama forward +1.89 %, backward
-0.02 %; Qwen2 -0.35 % / -0.03 %; GPT-NeoX -0.10 % / +0.51 %; optimizer 0.0 %). A biased float8 Linear
counts as ``mm`` where a 16-bit one runs ``addmm`` (not counted), so Qwen2's q, k, v count under float8.
"""

from __future__ import annotations

import pytest

from peakmem.breakdown import Phase
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.hf import spec_from_config
from peakmem.parallel import Parallelism
from peakmem.ranks import estimate_ranks
from peakmem.training import Checkpointing, KernelPolicy, Precision, TrainingSetup
from test_float8_training import BATCH, SEQ, SMALL_VOCAB, TOLERANCE, _estimate, _saved
from tiny_models import FAMILY_CONFIGS, LLAMA

T = BATCH * SEQ
H, KV, I = 64, 2 * 16, 176  # noqa: E741  hidden, k/v width (2 heads x head_dim 64/4), intermediate
C = 2  # bf16 compute and residual bytes (float8 recipes keep the weights and activations 16-bit)
LAYERS = 2


def _layers(saved: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in saved.items() if k.startswith("layers[")}


def test_float8_op_sac_keeps_the_layer_input_and_every_other_mm_hand_derived() -> None:
    """Forward order of the bias-free Linears: q, k, v, o, gate, up, down; the counter keeps the 1st, 3rd,
    ...: q (T x H), v (T x KV), gate (T x I), down (T x H), each C bytes, beside the layer input (T x H)."""
    saved = _layers(_saved(_estimate(Precision.FLOAT8_TENSORWISE, checkpointing=Checkpointing.OP)))
    per_layer = {
        "layer input (checkpoint)": T * H * C,
        "q_proj output (op SAC: saved mm)": T * H * C,
        "v_proj output (op SAC: saved mm)": T * KV * C,
        "gate_proj output (op SAC: saved mm)": T * I * C,
        "down_proj output (op SAC: saved mm)": T * H * C,
    }
    assert saved == {f"layers[0:{LAYERS}].{k}": LAYERS * v for k, v in per_layer.items()}
    assert sum(saved.values()) == LAYERS * T * C * (H + H + KV + I + H) == 819_200


def test_float8_biased_linears_count_as_mm_hand_derived() -> None:
    """Qwen2 (tests/tiny_models.py: hidden 64, 2 KV heads of 16, intermediate 96, 3 layers) has biased q, k,
    v. In 16 bits they run ``addmm`` (neither counted nor kept): the counter sees o, gate, up, down and
    keeps o and up. A float8 Linear runs ``mm`` and adds its bias after, so all 7 count: q, v, gate, down
    are kept, as for Llama."""
    qwen2 = FAMILY_CONFIGS["qwen2"]
    i, layers = 96, 3
    common = {"layer input (checkpoint)": T * H * C}
    bf16 = {
        **common,
        "o_proj output (op SAC: saved mm)": T * H * C,
        "up_proj output (op SAC: saved mm)": T * i * C,
    }
    f8 = {
        **common,
        "q_proj output (op SAC: saved mm)": T * H * C,
        "v_proj output (op SAC: saved mm)": T * KV * C,
        "gate_proj output (op SAC: saved mm)": T * i * C,
        "down_proj output (op SAC: saved mm)": T * H * C,
    }
    for precision, per_layer in ((Precision.MIXED_BF16, bf16), (Precision.FLOAT8_TENSORWISE, f8)):
        saved = _layers(_saved(_estimate(precision, qwen2, checkpointing=Checkpointing.OP)))
        assert saved == {f"layers[0:{layers}].{k}": layers * v for k, v in per_layer.items()}, precision


@pytest.mark.parametrize("precision", [Precision.FLOAT8_TENSORWISE, Precision.FLOAT8_ROWWISE_GW_HP])
def test_float8_op_sac_saves_what_bf16_saves_and_recomputes_the_casts(precision: Precision) -> None:
    """The same saved tensors as mixed-bf16 under op SAC; the recomputation's and the backward's casts put
    float8's backward above mixed-bf16's (the 128-token vocabulary: with 1000 the logits are the peak)."""
    f8 = _estimate(precision, SMALL_VOCAB, checkpointing=Checkpointing.OP)
    bf16 = _estimate(Precision.MIXED_BF16, SMALL_VOCAB, checkpointing=Checkpointing.OP)
    assert _layers(_saved(f8)) == _layers(_saved(bf16))
    f8_bw, bf16_bw = (next(p.bytes for p in e.phases if p.phase is Phase.BACKWARD) for e in (f8, bf16))
    assert f8_bw > bf16_bw


def test_float8_op_sac_with_tensor_parallelism_is_op_sacs_one_line_error() -> None:
    setup = TrainingSetup(precision=Precision.FLOAT8_TENSORWISE, seq_len=64, checkpointing=Checkpointing.OP)
    with pytest.raises(InputError, match=r"checkpointing='op'.*tensor-parallel") as info:
        estimate_ranks(spec_from_config(LLAMA, name="tiny-llama"), setup, Parallelism(gpus=2, tp=2))
    assert "\n" not in str(info.value)


@pytest.mark.torch
@pytest.mark.slow
def test_float8_op_sac_agrees_with_measure_per_phase() -> None:
    """Qwen2 (biased q/k/v, 128-token vocabulary), 2 layers to keep it short: forward -0.35 %, backward
    -0.03 % (rowwise -0.35 / -0.13 %, rowwise-gw-hp -0.35 / -2.09 %). With 3 layers, before biased float8
    Linears were counted as ``mm``: -8.8 % / -4.8 %, now -0.27 % / -0.03 %. Not run here: the tiny Llama
    +1.89 % / -0.02 %; GPT-NeoX (fused biased qkv) -0.10 % / +0.51 %, was -26.5 % / -15.2 %."""
    pytest.importorskip("torchao")
    pytest.importorskip("transformers")
    from peakmem.measure import measure_training

    cfg = {**FAMILY_CONFIGS["qwen2"], "num_hidden_layers": 2}
    setup = TrainingSetup(precision=Precision.FLOAT8_TENSORWISE, micro_batch=BATCH, seq_len=SEQ,
                          kernel_policy=KernelPolicy.CPU, checkpointing=Checkpointing.OP)  # fmt: skip
    measured = measure_training(cfg, setup, device="cpu", steps=2)
    assert any("Linears converted" in a for a in measured.assumptions)  # torchao's Float8Linear ran
    est = estimate_training(spec_from_config(cfg, name="tiny-qwen2"), setup)
    got = {p.phase: p.bytes for p in est.phases}
    for phase in measured.phases:
        if phase.phase in got:
            assert abs(got[phase.phase] / phase.bytes - 1) <= TOLERANCE, phase.phase.value
    assert abs(est.peak_allocated_bytes / measured.peak_allocated_bytes - 1) <= TOLERANCE
