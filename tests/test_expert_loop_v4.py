"""transformers 4.x's per-expert MoE loop (formulas/activations/expert_loop.py): hand-derived bytes on a tiny
Mixtral spec. The CPU parity against transformers 4.48.1 is benchmarks/moe_loop_4x.py (its docstring's
tables): CI runs transformers 5.x only."""

from __future__ import annotations

from dataclasses import replace

from peakmem.adapters import LoraConfig
from peakmem.formulas import activations as act
from peakmem.formulas import moe_loop
from peakmem.formulas.activations import expert_loop as X
from peakmem.hf import spec_from_config
from peakmem.training import KernelPolicy, Method, Precision, TrainingSetup

H, W, E, K, SEQ = 64, 32, 4, 2, 15  # hidden, expert width, experts, top-k, tokens (batch 1)
MIXTRAL = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 128, "hidden_size": H,
    "intermediate_size": W, "num_local_experts": E, "num_experts_per_tok": K, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
SPEC = spec_from_config(MIXTRAL, name="tiny-mixtral")
LAYER = SPEC.groups[0].layer
S = SEQ * K  # routed rows
N = 8  # one expert's rows, balanced: ceil(15 * 2 / 4)


def _setup(version: str = "4.48.1", precision: Precision = Precision.BF16, **kw: object) -> TrainingSetup:
    return TrainingSetup(precision=precision, micro_batch=1, seq_len=SEQ, transformers=version,
                         kernel_policy=KernelPolicy.CPU, **kw)  # type: ignore[arg-type]  # fmt: skip


def _items(setup: TrainingSetup) -> dict[str, int]:
    items, _ = act.mlp_terms(SPEC, LAYER, act.shapes(SPEC, setup))
    return {i.key: i.bytes for i in items}


def test_release_decides_the_loop() -> None:
    assert act.shapes(SPEC, _setup()).expert_loop
    assert not act.shapes(SPEC, _setup("5.23.0")).expert_loop


def test_saved_items_by_hand() -> None:
    """bf16: nonzero's [n, 2] int64 (16 B a row), the bf16 weight slices, the weighted outputs (index_add_'s
    source) and the down outputs (the mul's), the routed rows; no grouped_mm permutations."""
    got = _items(_setup())
    assert got["moe.loop_indices"] == S * 16
    assert got["moe.loop_weights"] == S * 2
    assert got["moe.weighted_outputs"] == S * H * 2
    assert got["moe.expert_outputs"] == S * H * 2
    assert got["moe.routed_inputs"] == S * H * 2
    assert got["mlp.interior"] == 4 * S * W * 2
    assert "moe.dispatch" not in got and "moe.loop_indices" not in _items(_setup("5.23.0"))


def test_autocast_promotes_the_weighted_outputs() -> None:
    """amp-bf16: fp32 hidden states, so fp32 weight slices and weighted outputs (bf16 expert output times
    fp32 weights), and w1 / w3 each save their own bf16 cast of the routed rows."""
    got = _items(_setup(precision=Precision.AMP_BF16))
    assert got["moe.loop_weights"] == S * 4
    assert got["moe.weighted_outputs"] == S * H * 4
    assert got["moe.expert_outputs"] == S * H * 2
    assert got["moe.routed_inputs"] == 2 * S * H * 2


def test_one_expert_at_a_time_by_hand() -> None:
    sh = act.shapes(SPEC, _setup())
    assert X.expert_rows(LAYER.mlp, SEQ) == N
    # final T x h, one-hot T x k x E int64, weights T x k, logits T x E; the rows, act, w3 out and product
    interior = (
        SEQ * H * 2,
        SEQ * K * E * 8,
        SEQ * K * 2,
        SEQ * E * 2,
        N * H * 2,
        N * W * 2,
        N * W * 2,
        N * W * 2,
    )
    assert X.loop_interior(SPEC, LAYER, sh, 2) == interior
    # incoming T x h, 3 n x I gradients, the weights' T x k gradient; freed: product, output, weighted output
    temporaries, freed = SEQ * H * 2 + 3 * N * W * 2 + SEQ * K * 2, N * W * 2 + N * H * 4
    assert X.loop_backward(SPEC, LAYER, sh, 2, 100) == (temporaries + 100 - freed, freed, 100)
    tail = SEQ * H * 2 + sum(interior[:4]) + 50 - (N * H * 2 + N * 2) - 7
    assert X.loop_tail(SPEC, LAYER.mlp, sh, 2, not_saved=50, later=7) == tail


def test_recomputation_ends_at_the_last_expert() -> None:
    """Under full checkpointing the backward moment is the incoming gradient plus the tail; a LoRA that
    leaves the experts frozen makes the norm output, the rows and the product temporaries there."""
    setup = _setup(method=Method.LORA, lora=LoraConfig(rank=2, targets=("q_proj", "v_proj")))
    sh = act.shapes(SPEC, setup)
    la = act.layer_activations(SPEC, LAYER, sh)
    la = replace(la, saved=tuple(i for i in la.saved if i.key not in ("input.mlp", "moe.routed_inputs")),
                 backward_transient=0, backward_freed=0, backward_grads=0)  # fmt: skip
    la = replace(
        la, saved=tuple(replace(i, bytes=3 * S * W * 2) if i.key == "mlp.interior" else i for i in la.saved)
    )
    not_saved = SEQ * H * 2 + N * H * 2 + N * W * 2
    tail = X.loop_tail(SPEC, LAYER.mlp, sh, 2, not_saved=not_saved, later=0)
    out = moe_loop.expert_loop_layer(la, SPEC, LAYER, sh, setup, trainable=False, recomputed=True)
    assert (out.backward_transient, out.backward_freed) == (SEQ * H * 2 + tail, 0)
    fwd = moe_loop.expert_loop_layer(
        replace(la, forward_transient=0), SPEC, LAYER, sh, setup, trainable=False
    )
    assert fwd.forward_transient == tail


def test_deepseek_v3_weights_in_fp32_and_v2_is_not_this_loop() -> None:
    """DeepSeek-V3's 4.x loop (``final_hidden_states = zeros_like(hidden_states, dtype=topk_weights.dtype)``,
    fp32 sigmoid router): the weight slices, the weighted outputs and the accumulator are fp32 in a bf16 run,
    nothing cast to bf16; DeepSeek-V2 sorts its rows (argsort, cat): the grouped_mm formulas stay."""
    from tiny_models import FAMILY_CONFIGS

    v3 = spec_from_config(FAMILY_CONFIGS["deepseek_v3"], name="tiny-v3")
    layer = next(g.layer for g in v3.groups if g.layer.mlp.is_moe)
    mlp, sh = layer.mlp, act.shapes(v3, _setup())
    s = SEQ * mlp.experts_per_token
    got = {i.key: i.bytes for i in act.mlp_terms(v3, layer, sh)[0]}
    assert (got["moe.loop_weights"], got["moe.weighted_outputs"]) == (s * 4, s * v3.hidden_size * 4)
    final, mask, cast = X.loop_interior(v3, layer, sh, 2)[:3]
    one_hot = SEQ * mlp.experts_per_token * mlp.num_experts * 8
    assert (final, mask, cast) == (SEQ * v3.hidden_size * 4, one_hot, 0)
    v2 = spec_from_config(FAMILY_CONFIGS["deepseek_v2"], name="tiny-v2")
    assert not act.shapes(v2, _setup()).expert_loop
