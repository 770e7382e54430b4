"""Model states and optimizer rows on a hand-built tiny spec (every number derived below)."""

from __future__ import annotations

import pytest

from peakmem.breakdown import Category
from peakmem.formulas.model_states import precision_plan, weight_rows
from peakmem.formulas.optimizer import optimizer_phase_grads, optimizer_rows, step_temporaries
from peakmem.model import Attention, Layer, LayerGroup, Mlp, ModelSpec, Tensor, linear, norm
from peakmem.training import OptimizerImpl, OptimizerName, Precision, TrainingSetup


def tiny_spec() -> ModelSpec:
    """vocab 10, hidden 8, 2 layers: q/k/v/o 8x8, gate/up 16x8, down 8x16, 2 RMSNorms; untied head.

    params: embed 80 + head 80 + final norm 8 = 168 outer;
    per layer 4*64 (attn) + 3*128 (mlp) + 2*8 (norms) = 656; total 168 + 2*656 = 1480.
    """
    layer_tensors = (
        *linear("self_attn.q_proj", 8, 8, False, "attention"),
        *linear("self_attn.k_proj", 8, 8, False, "attention"),
        *linear("self_attn.v_proj", 8, 8, False, "attention"),
        *linear("self_attn.o_proj", 8, 8, False, "attention"),
        *linear("mlp.gate_proj", 8, 16, False, "mlp"),
        *linear("mlp.up_proj", 8, 16, False, "mlp"),
        *linear("mlp.down_proj", 16, 8, False, "mlp"),
        *norm("input_layernorm", 8, False),
        *norm("post_attention_layernorm", 8, False),
    )
    layer = Layer(
        attention=Attention(num_heads=2, num_kv_heads=2, head_dim=4, v_head_dim=4),
        mlp=Mlp(intermediate_size=16, gated=True, activation="silu"),
        tensors=layer_tensors,
    )
    outer = (
        Tensor(name="model.embed_tokens.weight", module="embed_tokens", shape=(10, 8),
               component="embeddings", kind="embedding"),
        *norm("model.norm", 8, False),
        *linear("lm_head", 8, 10, False, "head"),
    )  # fmt: skip
    return ModelSpec(
        name="tiny", model_type="llama", architecture="LlamaForCausalLM", task="causal-lm", vocab_size=10,
        hidden_size=8, max_position_embeddings=64, position="rope", norm="rmsnorm",
        groups=(LayerGroup(count=2, layer=layer),), outer=outer, tie_word_embeddings=False,
    )  # fmt: skip


N = 1480


def test_tiny_param_count() -> None:
    assert tiny_spec().params == N


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        (Precision.FP32, [("weights", "fp32", 4 * N), ("gradients", "fp32", 4 * N)]),
        (Precision.AMP_BF16, [("weights", "fp32", 4 * N), ("gradients", "fp32", 4 * N)]),
        (Precision.MIXED_FP16, [("weights", "fp16", 2 * N), ("gradients", "fp16", 2 * N),
                                ("master weights", "fp32", 4 * N)]),
        (Precision.BF16, [("weights", "bf16", 2 * N), ("gradients", "bf16", 2 * N)]),
    ],
)  # fmt: skip
def test_weight_rows(precision: Precision, expected: list[tuple[str, str, int]]) -> None:
    rows = weight_rows(tiny_spec(), TrainingSetup(precision=precision))
    assert [(r.tensor, r.dtype, r.bytes) for r in rows] == expected


def test_amp_computes_in_16_bit_with_fp32_residual() -> None:
    plan = precision_plan(Precision.AMP_FP16)
    assert (plan.weight.name, plan.compute.name, plan.residual.name, plan.autocast) == (
        "fp32",
        "fp16",
        "fp32",
        True,
    )


def test_adam_states_follow_state_dtype() -> None:
    spec = tiny_spec()
    rows = optimizer_rows(spec, TrainingSetup(precision=Precision.MIXED_BF16))
    assert [(r.tensor, r.dtype, r.bytes) for r in rows] == [
        ("AdamW m (exp_avg)", "fp32", 4 * N), ("AdamW v (exp_avg_sq)", "fp32", 4 * N)]  # fmt: skip
    rows = optimizer_rows(spec, TrainingSetup(precision=Precision.BF16, optimizer=OptimizerName.ADAM))
    assert [(r.tensor, r.dtype, r.bytes) for r in rows] == [
        ("Adam m (exp_avg)", "bf16", 2 * N), ("Adam v (exp_avg_sq)", "bf16", 2 * N)]  # fmt: skip


def test_seed_table_assembled_from_rows() -> None:
    spec = tiny_spec()
    setup = TrainingSetup(precision=Precision.MIXED_FP16)
    rows = weight_rows(spec, setup) + optimizer_rows(spec, setup)
    assert [r.bytes_per_param for r in rows] == [2, 2, 4, 4, 4]
    assert sum(r.bytes for r in rows) == 16 * N
    assert rows[2].category is Category.MASTER_WEIGHTS


def test_sgd_lion_momentum() -> None:
    spec = tiny_spec()
    assert optimizer_rows(spec, TrainingSetup(precision=Precision.FP32, optimizer=OptimizerName.SGD)) == ()
    (row,) = optimizer_rows(
        spec, TrainingSetup(precision=Precision.FP32, optimizer=OptimizerName.SGD_MOMENTUM)
    )
    assert row.bytes == 4 * N
    (row,) = optimizer_rows(spec, TrainingSetup(precision=Precision.BF16, optimizer=OptimizerName.LION))
    assert (row.dtype, row.bytes) == ("bf16", 2 * N)


def test_adafactor_factored_second_moment() -> None:
    """2-D tensors keep rows + cols, 1-D keep everything; fp32 even for bf16 weights.

    outer: embed 10x8 -> 10 + 8 = 18; final norm 8; lm_head 10x8 -> 18  => 44
    layer: 4 x (8 + 8) + 2 x (16 + 8) + (8 + 16) + 2 x 8 = 64 + 48 + 24 + 16 = 152; x2 = 304
    total 348 elements x 4 B = 1392 B.
    """
    (row,) = optimizer_rows(
        tiny_spec(), TrainingSetup(precision=Precision.BF16, optimizer=OptimizerName.ADAFACTOR)
    )
    assert (row.dtype, row.bytes) == ("fp32", 348 * 4)
    assert row.bytes_per_param == pytest.approx(1392 / N)


def test_step_temporaries_by_implementation() -> None:
    spec = tiny_spec()

    def temps(impl: OptimizerImpl, name: OptimizerName = OptimizerName.ADAMW) -> int:
        setup = TrainingSetup(precision=Precision.FP32, optimizer=name, optimizer_impl=impl)
        return sum(i.bytes for i in step_temporaries(spec, setup))

    assert temps(OptimizerImpl.FOREACH) == 4 * N  # _foreach_sqrt over the whole group
    assert temps(OptimizerImpl.FUSED) == 0
    assert temps(OptimizerImpl.FOR_LOOP) == 2 * 4 * 128  # denom + exp_avg.clone of the largest (16x8)
    assert temps(OptimizerImpl.FOR_LOOP, OptimizerName.SGD) == 0
    assert temps(OptimizerImpl.FOR_LOOP, OptimizerName.ADAFACTOR) == 2 * 4 * 128


def test_mixed_optimizer_reads_fp32_grads() -> None:
    item = optimizer_phase_grads(tiny_spec(), TrainingSetup(precision=Precision.MIXED_BF16))
    assert item.bytes == 4 * N
    item = optimizer_phase_grads(tiny_spec(), TrainingSetup(precision=Precision.BF16))
    assert item.bytes == 2 * N
