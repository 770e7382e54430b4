"""LoRA target resolution, trainable counts and adapter activations on tiny specs, derived by hand."""

from __future__ import annotations

import pytest

from peakmem.adapters import LoraConfig, parse_targets
from peakmem.errors import InputError
from peakmem.formulas import lora as L
from peakmem.hf import spec_from_config

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
GPT2 = {"model_type": "gpt2", "vocab_size": 100, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32}
BERT = {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "vocab_size": 100,
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
        "max_position_embeddings": 32, "num_labels": 3}  # fmt: skip
QWEN3_MOE = {
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
}  # fmt: skip


def spec(cfg: dict[str, object], name: str = "tiny") -> object:
    return spec_from_config(cfg, name=name)


# q 64->64, k/v 64->32, o 64->64, gate/up 64->96, down 96->64: sum of (in + out) per layer
LLAMA_IN_OUT = (64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 96) + (96 + 64)


def test_all_linear_llama_excludes_the_head() -> None:
    s = spec(LLAMA)
    mods = L.resolve_targets(s, LoraConfig(rank=4))
    assert {m.leaf for m in mods} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert L.trainable_params(s, LoraConfig(rank=4)) == 2 * 4 * LLAMA_IN_OUT


def test_names_are_suffix_matched_and_rank_scales() -> None:
    s = spec(LLAMA)
    qv = LoraConfig(rank=8, targets=("q_proj", "v_proj"))
    assert L.trainable_params(s, qv) == 2 * 8 * ((64 + 64) + (64 + 32))
    dotted = LoraConfig(rank=8, targets=("self_attn.q_proj", "self_attn.v_proj"))
    assert L.trainable_params(s, dotted) == L.trainable_params(s, qv)
    assert L.layer_trainable_params(s, qv, 0) == 8 * ((64 + 64) + (64 + 32))


def test_peft_default_targets_and_dora_magnitude() -> None:
    s = spec(LLAMA)
    default = LoraConfig(rank=2, targets=())
    assert L.trainable_params(s, default) == 2 * 2 * ((64 + 64) + (64 + 32))
    dora = LoraConfig(rank=2, targets=("q_proj",), dora=True)
    assert L.trainable_params(s, dora) == 2 * (2 * 128 + 64)  # + magnitude (out features)


def test_gpt2_conv1d_in_out() -> None:
    s = spec(GPT2)
    mods = {m.path: m for m in L.resolve_targets(s, LoraConfig(rank=1, targets=("c_attn", "mlp.c_fc")))}
    assert (mods["attn.c_attn"].in_features, mods["attn.c_attn"].out_features) == (64, 192)
    assert (mods["mlp.c_fc"].in_features, mods["mlp.c_fc"].out_features) == (64, 256)
    # all-linear: c_attn, attn.c_proj, c_fc, mlp.c_proj; the tied head is the output layer
    per_layer = (64 + 192) + (64 + 64) + (64 + 256) + (256 + 64)
    assert L.trainable_params(s, LoraConfig(rank=1)) == 2 * per_layer


def test_bert_sequence_classification_saves_the_classifier() -> None:
    s = spec(BERT)
    counts = L.trainable_params(s, LoraConfig(rank=2, targets=("query", "value")))
    classifier = 3 * 64 + 3  # modules_to_save copy of classifier (weight + bias)
    assert counts == 2 * 2 * 2 * (64 + 64) + classifier
    assert L.saved_copy_params(s, LoraConfig(rank=2, targets=("query",))) == classifier
    # all-linear adapts the pooler dense too (not the classifier: SEQ_CLS excludes it)
    per_layer = 4 * (64 + 64) + (64 + 96) + (96 + 64)
    assert L.trainable_params(s, LoraConfig(rank=1)) == 2 * per_layer + (64 + 64) + classifier


def test_moe_all_linear_follows_peft_conversion() -> None:
    s = spec(QWEN3_MOE)
    got = L.trainable_params(s, LoraConfig(rank=2))
    attn = (64 + 64) + 2 * (64 + 32) + (64 + 64)
    router = 64 + 4  # gate.weight (E x h) as a 2-D target parameter
    gate_up = 2 * 2 * 4 * (64 + 64)  # rank 2r (fused gate+up), E experts, (h + 2I)
    down = 2 * 4 * (32 + 64)
    assert got == 2 * (2 * attn + 2 * router + gate_up + down)


def test_param_wrapper_saves_the_merged_weight_and_the_cast_factors() -> None:
    """peft ParamWrapper on the fused experts (E=4, gate_up_proj (4, 64, 64), rank 2r = 4): the merged
    W + BA in the parameter's dtype (bf16), which grouped_mm saves, and the two factors cast to bf16 for
    _LoraFactorsProxy's baddbmm (fp32 adapters); a 2-D router weight (E=1): the merged weight only."""
    experts = L.AdaptedModule(path="mlp.experts.gate_up_proj", kind="param", in_features=64, out_features=64,
                              experts=4, group=0, component="experts", rank_factor=2)  # fmt: skip
    cfg = LoraConfig(rank=2)
    merged, factors = 4 * 64 * 64 * 2, (2 * 4 * 2) * (64 + 64) * 2
    assert L.param_wrapper_saved(experts, cfg, 2, 4) == merged + factors
    assert L.param_wrapper_saved(experts, cfg, 2, 2) == merged  # same dtype: the factors are views
    assert L.adapter_saved_per_module(experts, cfg, tokens=99, x_bytes=2, a_bytes=4, cuda=True) == (
        0,
        merged + factors,
    )  # nothing per token
    router = L.AdaptedModule(path="mlp.gate.weight", kind="param", in_features=64, out_features=4, experts=1,
                             group=0, component="router")  # fmt: skip
    assert L.param_wrapper_saved(router, cfg, 2, 4) == 64 * 4 * 2
    assert L.param_wrapper_saved(router, cfg, 2, 4, merged_saved=False) == 0  # DeepSeek: its fp32 copy


def test_frozen_moe_pieces_drop_what_only_weight_gradients_needed() -> None:
    """Qwen3-MoE, mixed-bf16: with the experts and router adapted (peft's conversion of all-linear) the
    grouped_mm inputs stay saved and the router keeps the norm output; with q_proj only, the frozen
    experts keep neither the gathered rows (S x h) nor the down input (S x I), and the MLP input goes."""
    from peakmem.formulas.activations import layer_activations, shapes
    from peakmem.training import Method, TrainingSetup

    s = spec(QWEN3_MOE)
    g = next(i for i, grp in enumerate(s.groups) if grp.layer.mlp.is_moe)
    t, h, inner, k = 2 * 32, 64, 32, 2

    def saved(lora: LoraConfig) -> dict[str, int]:
        setup = TrainingSetup(micro_batch=2, seq_len=32, method=Method.LORA, lora=lora)
        sh = shapes(s, setup)
        la = layer_activations(s, s.groups[g].layer, sh)
        return {i.key: i.bytes for i in L.adapt_layer(s, g, la, sh, setup).saved}

    full = saved(LoraConfig())
    assert full["moe.routed_inputs"] == k * t * h * 2 and full["input.mlp"] == t * h * 2
    assert full["mlp.interior"] == 4 * k * t * inner * 2
    q_only = saved(LoraConfig(targets=("q_proj",)))
    assert "moe.routed_inputs" not in q_only and "input.mlp" not in q_only
    assert q_only["mlp.interior"] == 3 * k * t * inner * 2  # gate_up output, act(gate), up; not the product


def test_moe_fused_needs_both_halves() -> None:
    with pytest.raises(InputError, match="up_proj"):
        L.resolve_targets(spec(QWEN3_MOE), LoraConfig(targets=("gate_proj",)))


@pytest.mark.parametrize("rank", [0, -1])
def test_rank_must_be_positive(rank: int) -> None:
    with pytest.raises(InputError, match=f"lora_rank={rank}"):
        LoraConfig(rank=rank)


def test_unknown_target_names_existing_modules() -> None:
    with pytest.raises(InputError) as err:
        L.resolve_targets(spec(GPT2), LoraConfig(targets=("q_proj", "v_proj")))
    msg = str(err.value)
    assert "q_proj" in msg and "c_attn" in msg and "c_fc" in msg and "\n" not in msg


def test_experts_need_target_parameters() -> None:
    cfg = {**QWEN3_MOE, "model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"],
           "shared_expert_intermediate_size": 48}  # fmt: skip
    with pytest.raises(InputError, match="target_parameters"):
        L.resolve_targets(spec(cfg), LoraConfig(targets=("experts",)))


def test_bad_options() -> None:
    with pytest.raises(InputError, match="lora_dropout"):
        LoraConfig(dropout=1.5)
    with pytest.raises(InputError, match="adapter_dtype"):
        LoraConfig(adapter_dtype="int8")
    with pytest.raises(InputError, match="all-linear"):
        LoraConfig(targets=("all-linear", "q_proj"))
    assert parse_targets("q_proj, v_proj") == ("q_proj", "v_proj")
    assert parse_targets("ALL-LINEAR") == ("all-linear",)


def test_adapter_saved_tensors() -> None:
    m = L.AdaptedModule(path="q", kind="linear", in_features=64, out_features=32, experts=1, group=0,
                        component="attention")  # fmt: skip
    cfg = LoraConfig(rank=4)
    # fp32 adapter on a bf16 input: x.to(fp32) (T x in x 4) and lora_A's output (T x r x 4)
    assert L.adapter_saved_per_module(m, cfg, tokens=10, x_bytes=2, a_bytes=4, cuda=True) == (
        10 * 64 * 4,
        10 * 4 * 4,
    )
    # same dtype: lora_A keeps x itself (no new storage)
    assert L.adapter_saved_per_module(m, cfg, tokens=10, x_bytes=4, a_bytes=4, cuda=True) == (0, 10 * 4 * 4)
    # dropout: its output and mask (bool on CUDA)
    drop = LoraConfig(rank=4, dropout=0.1)
    assert L.adapter_saved_per_module(m, drop, tokens=10, x_bytes=2, a_bytes=2, cuda=True) == (
        10 * 64 * 2 + 10 * 64,
        10 * 4 * 2,
    )


# --- the estimator (peakmem.estimate) with LoRA -----------------------------------------------------------
def test_setup_rejects_lora_options_on_full_finetuning() -> None:
    from peakmem.adapters import QuantConfig
    from peakmem.training import Method, TrainingSetup

    with pytest.raises(InputError, match="method='full'") as err:
        TrainingSetup(lora=LoraConfig(rank=16))
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="qlora"):
        TrainingSetup(method=Method.LORA, quant=QuantConfig())


def test_lora_estimate_rows() -> None:
    from dataclasses import replace

    from peakmem.estimate import estimate_training
    from peakmem.training import Method, Precision, TrainingSetup

    s = spec(LLAMA)
    lora = LoraConfig(rank=4)
    setup = TrainingSetup(method=Method.LORA, lora=lora, precision=Precision.BF16, seq_len=32)
    est = estimate_training(s, setup)
    assert est.trainable_params == 2 * 4 * LLAMA_IN_OUT
    rows = {r.tensor: r for r in est.per_param}
    assert rows["base weights (frozen)"].bytes == 2 * s.params
    assert rows["gradients (adapters only)"].bytes == 4 * est.trainable_params  # peft's fp32 adapters
    assert est.setup["lora"]["rank"] == 4
    full = estimate_training(s, replace(setup, method=Method.FULL, lora=None))
    assert est.peak_allocated_bytes < full.peak_allocated_bytes


# --- frozen norms: what a norm keeps when its weight does not require grad ------------------------------
GEMMA2 = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "vocab_size": 128,
          "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 128, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16}  # fmt: skip


def _lora_items(cfg: dict[str, object]) -> tuple[dict[str, int], dict[str, int]]:
    """(saved bytes by key of the second layer, of the head) under LoRA, mixed-bf16, 2 x 16 tokens."""
    from peakmem.formulas import activations as act
    from peakmem.formulas import loss
    from peakmem.training import Method, Precision, TrainingSetup

    s = L.split_first_layer(spec(cfg))  # type: ignore[arg-type]
    setup = TrainingSetup(method=Method.LORA, precision=Precision.MIXED_BF16, micro_batch=2, seq_len=16)
    sh = act.shapes(s, setup)
    la = L.adapt_layer(s, 1, act.layer_activations(s, s.groups[1].layer, sh), sh, setup)
    head = L.adapt_head(s, loss.head_activations(s, sh, 0), sh, setup)
    return {i.key: i.bytes for i in la.saved}, {i.key: i.bytes for i in head.saved}


def test_frozen_gemma2_sandwich_norms_keep_input_and_rstd_only() -> None:
    # GemmaRMSNorm: output = _norm(x.float()) * (1.0 + weight.float()): x.float() (fp32) for pow and mul,
    # rsqrt (fp32, one per token); the fp32 normalised x is kept by the weight multiply only for the
    # weight's gradient: not when frozen. Four norms per Gemma-2 block (input, post-attention,
    # pre- and post-feedforward), T = 32 tokens, h = 64.
    t, h = 2 * 16, 64
    layer, head = _lora_items(GEMMA2)
    assert layer["norms"] == 4 * (t * h * 4 + t * 4)
    assert head["head.final_norm"] == t * h * 4 + t * 4


def test_frozen_qwen3_qk_norms_keep_input_and_per_head_rstd() -> None:
    # Qwen3RMSNorm over head_dim on q (4 heads) and k (2 heads): x.float() (fp32) of all 6 x 16 features,
    # one fp32 rstd per head and token; the bf16 y kept by weight * y goes with the frozen weight
    t = 2 * 16
    layer, head = _lora_items(QWEN3)
    assert layer["attn.qk_norm"] == t * 6 * 16 * 4 + t * 6 * 4
    assert layer["norms"] == 2 * (t * 64 * 4 + t * 4)
    assert head["head.final_norm"] == t * 64 * 4 + t * 4
