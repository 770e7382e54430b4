"""Saved activations per layer, hand-derived on tiny configs.

Every per-layer total below was also measured on CPU with ``torch.autograd.graph.saved_tensors_hooks``
(unique storages saved by autograd) on transformers 5.23 / torch 2.13 with the same shapes; the
measured numbers equal the hand-derived ones.
"""

from __future__ import annotations

from typing import Any

import pytest

from peakmem.breakdown import MemoryItem
from peakmem.formulas import activations as act
from peakmem.formulas.loss import head_activations
from peakmem.hf import spec_from_config
from peakmem.model import ModelSpec
from peakmem.training import AttentionKernel, Checkpointing, Framework, KernelPolicy, Precision, TrainingSetup

B, S = 2, 32
T = B * S  # 64 tokens

GPT2: dict[str, Any] = {
    "model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128,
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
}  # fmt: skip
LLAMA: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}  # fmt: skip


def _layer(config: dict[str, Any], **kw: Any) -> tuple[ModelSpec, act.LayerActivations]:
    spec = spec_from_config(dict(config))
    setup = TrainingSetup(micro_batch=B, seq_len=S, **kw)
    return spec, act.layer_activations(spec, spec.first_layer, act.shapes(spec, setup))


def test_gpt2_fp32_eager_layer() -> None:
    _, la = _layer(
        GPT2, precision=Precision.FP32, attention=AttentionKernel.EAGER, kernel_policy=KernelPolicy.CPU
    )
    h, a, inner = 64, 4, 256
    norms = 2 * (T * h * 4 + 2 * T * 4)  # ln_1, ln_2: input + mean/rstd
    linear_inputs = 3 * T * h * 4  # c_attn, c_proj, c_fc inputs
    qkv = 3 * T * h * 4  # q, k, v (contiguous copies for bmm)
    softmax = B * a * S * S * 4
    gelu_new = 5 * T * inner * 4  # fc out, tanh, 1 + tanh, 0.5 x, act out
    assert la.saved_bytes == norms + linear_inputs + qkv + softmax + gelu_new == 492_544


def test_llama_bf16_eager_layer() -> None:
    _, la = _layer(
        LLAMA, precision=Precision.BF16, attention=AttentionKernel.EAGER, kernel_policy=KernelPolicy.CPU
    )
    h, a, d, inner = 64, 4, 16, 128
    norms = 2 * (T * h * (4 + 2) + T * 4)  # x.float() (4 B), y in bf16 (2 B), rstd (fp32)
    linear_inputs = 3 * T * h * 2  # q/k/v input, o_proj input, gate/up input
    qkv = 3 * T * a * d * 2  # k, v repeated to all 4 heads by repeat_kv
    softmax = B * a * S * S * (4 + 2)  # softmax(dtype=float32) and its cast back to bf16
    mlp = 4 * T * inner * 2  # gate, silu(gate), up, product
    assert la.saved_bytes == norms + linear_inputs + qkv + softmax + mlp == 213_504


def test_llama_eager_one_kv_head_at_batch_1_keeps_it_as_a_view() -> None:
    """MQA (one kv head): repeat_kv's expand + reshape is a view, and at micro-batch 1 matmul folds it
    without a copy, so the saved k and v are one head each (real CPU step: tests/test_parity's grid,
    qwen2 b1 x 128); at batch 2 matmul's reshape copies all heads, and autocast's casts copy them too."""
    mqa = {**LLAMA, "num_key_value_heads": 1}
    a, d = 4, 16

    def qkv(batch: int, precision: Precision) -> int:
        spec = spec_from_config(dict(mqa))
        setup = TrainingSetup(micro_batch=batch, seq_len=S, precision=precision,
                              attention=AttentionKernel.EAGER, kernel_policy=KernelPolicy.CPU)  # fmt: skip
        la = act.layer_activations(spec, spec.first_layer, act.shapes(spec, setup))
        return sum(i.bytes for i in la.saved if i.key == "attn.qkv")

    assert qkv(1, Precision.BF16) == S * (a * d + 2 * d) * 2
    assert qkv(2, Precision.BF16) == 2 * S * 3 * a * d * 2
    assert qkv(1, Precision.AMP_BF16) == S * 3 * a * d * 2


def test_llama_bf16_sdpa_layer_keeps_kv_heads() -> None:
    _, la = _layer(
        LLAMA, precision=Precision.BF16, attention=AttentionKernel.SDPA, kernel_policy=KernelPolicy.CPU
    )
    h, a, g, d, inner = 64, 4, 2, 16, 128
    norms = 2 * (T * h * 6 + T * 4)
    linear_inputs = 3 * T * h * 2  # o_proj's input is the SDPA output itself
    qkv = T * (a + 2 * g) * d * 2  # enable_gqa: k, v keep 2 heads
    lse = B * a * S * 4
    mlp = 4 * T * inner * 2
    assert la.saved_bytes == norms + linear_inputs + qkv + lse + mlp == 157_184


def test_amp_adds_input_casts_and_weight_casts() -> None:
    spec, la = _layer(LLAMA, precision=Precision.AMP_BF16, attention=AttentionKernel.SDPA,
                      kernel_policy=KernelPolicy.CPU)  # fmt: skip
    h, a, g, d, inner = 64, 4, 2, 16, 128
    norms = 2 * (T * h * (4 + 4) + T * 4)  # fp32 residual: x and y both fp32
    linear_inputs = (3 + 1 + 2) * T * h * 2  # q, k, v each cast their input; o_proj; gate, up each
    qkv = T * (a + 2 * g) * d * 2
    lse = B * a * S * 4
    mlp = 4 * T * inner * 2
    weights = sum(t.numel for t in spec.first_layer.tensors if t.kind == "linear_weight") * 2
    assert la.saved_bytes == norms + linear_inputs + qkv + lse + mlp + weights


def test_cuda_dropout_mask_is_one_byte_cpu_is_input_dtype() -> None:
    cfg = {**GPT2, "resid_pdrop": 0.1, "attn_pdrop": 0.1}
    _, cpu = _layer(
        cfg, precision=Precision.FP32, attention=AttentionKernel.EAGER, kernel_policy=KernelPolicy.CPU
    )
    _, cuda = _layer(
        cfg, precision=Precision.FP32, attention=AttentionKernel.EAGER, kernel_policy=KernelPolicy.CUDA
    )
    scores, hidden = B * 4 * S * S, T * 64
    # dropout output (4 B) + mask on the probs; two residual-dropout masks
    assert cpu.saved_bytes == 492_544 + scores * (4 + 4) + 2 * hidden * 4
    assert cuda.saved_bytes == 492_544 + scores * (4 + 1) + 2 * hidden * 1


def test_cpu_sdpa_with_dropout_falls_back_to_math_in_fp32() -> None:
    cfg = {**GPT2, "attn_pdrop": 0.1}
    spec = spec_from_config(cfg)
    policy = KernelPolicy.CPU
    setup = TrainingSetup(precision=Precision.BF16, attention=AttentionKernel.SDPA, kernel_policy=policy,
                          micro_batch=B, seq_len=S)  # fmt: skip
    sh = act.shapes(spec, setup)
    assert sh.kernel is AttentionKernel.EAGER and sh.math_fallback
    la = act.layer_activations(spec, spec.first_layer, sh)
    scores = B * 4 * S * S
    norms = 2 * (T * 64 * 2 + 2 * T * 2)  # CPU layer_norm keeps bf16 mean/rstd
    attention = 3 * T * 64 * 4 + 3 * scores * 4  # fp32 q, k, v; softmax, dropout output, mask in fp32
    assert la.saved_bytes == norms + 3 * T * 64 * 2 + attention + 5 * T * 256 * 2


def test_full_checkpointing_keeps_layer_input() -> None:
    _, la = _layer(LLAMA, precision=Precision.BF16)
    full = act.checkpointed(la, Checkpointing.FULL)
    assert full.saved_bytes == T * 64 * 2
    assert full.recompute == la.saved_bytes


def test_full_checkpointing_recomputes_the_kept_input_once() -> None:
    """The first norm saves the layer input itself when it does not copy it (LayerNorm; RMSNorm on an
    fp32 residual stream, where ``x.to(float32)`` is a no-op): the recomputation does not save it again
    (measured: qwen2 amp-bf16 sdpa ckpt-full, recomputed activations 1,777,664 B)."""
    _, la = _layer(LLAMA, precision=Precision.FP32)
    assert la.input_saved == T * 64 * 4
    assert act.checkpointed(la, Checkpointing.FULL).recompute == la.saved_bytes - T * 64 * 4
    _, la = _layer(GPT2, precision=Precision.BF16)  # LayerNorm saves its bf16 input
    assert la.input_saved == T * 64 * 2
    _, la = _layer(LLAMA, precision=Precision.BF16)  # x.to(float32) is a new fp32 tensor
    assert la.input_saved == 0


def test_full_checkpointing_keeps_the_eager_causal_mask_through_backward() -> None:
    """Eager attention gets a materialised B x 1 x s x s mask in the model dtype (SDPA: none); the
    checkpointed layers keep it as an argument, a temporary next to every layer's backward."""
    for precision, nbytes in ((Precision.BF16, 2), (Precision.AMP_BF16, 4)):
        _, la = _layer(LLAMA, precision=precision, attention=AttentionKernel.EAGER)
        assert la.mask_arg == B * S * S * nbytes
        full = act.checkpointed(la, Checkpointing.FULL)
        assert full.backward_transient == la.backward_transient + B * S * S * nbytes
        assert act.checkpointed(la, Checkpointing.NONE).backward_transient == la.backward_transient
    _, la = _layer(LLAMA, precision=Precision.BF16, attention=AttentionKernel.SDPA)
    assert la.mask_arg == 0


def test_mlp_backward_stage_one_incoming_gradient() -> None:
    """Llama bf16, MLP half of a layer's backward (measured with the tracker): the down projection's
    input gradient and the two gradients of the gated product (3 x T x I) next to one T x h incoming
    gradient (the residual's is the same tensor); the product (T x I) is already freed. On the CPU, where
    it was measured: CUDA's flash backward pads its scratch to 128 rows, which at 32 tokens makes the
    attention half the larger (test_flash_backward_scratch)."""
    _, la = _layer(
        LLAMA, precision=Precision.BF16, attention=AttentionKernel.SDPA, kernel_policy=KernelPolicy.CPU
    )
    n = T * 128 * 2
    assert la.backward_freed == n
    assert la.backward_transient - la.backward_grads + la.backward_freed == 3 * n + T * 64 * 2


def test_selective_checkpointing_drops_attention_core() -> None:
    _, la = _layer(LLAMA, precision=Precision.BF16, attention=AttentionKernel.EAGER)
    sel = act.checkpointed(la, Checkpointing.SELECTIVE)
    core = B * 4 * S * S * (4 + 2)
    assert la.saved_bytes - sel.saved_bytes == core == sel.recompute


def test_head_logits_and_loss() -> None:
    spec = spec_from_config(dict(LLAMA))
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=B, seq_len=S)
    head = head_activations(spec, act.shapes(spec, setup), 1000 * 64)
    v = 1000
    saved = (T * 64 * 6 + T * 4) + T * 64 * 2 + T * v * 4  # final norm, lm_head input, log_softmax (fp32)
    assert sum(i.bytes for i in head.saved) == saved
    assert head.forward_transient == T * v * (2 + 4)  # bf16 logits + logits.float()
    assert head.backward_transient == 2 * T * v * 4  # nll_loss_backward + _log_softmax_backward_data


@pytest.mark.parametrize("kernel", [AttentionKernel.SDPA, AttentionKernel.FLASH])
def test_cuda_flash_like_kernels_save_lse_not_scores(kernel: AttentionKernel) -> None:
    _, la = _layer(LLAMA, precision=Precision.BF16, attention=kernel)
    assert la.core == B * 4 * S * 4  # logsumexp only


QWEN3: dict[str, Any] = {**LLAMA, "model_type": "qwen3", "head_dim": 16}
PHI3: dict[str, Any] = {
    "model_type": "phi3", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 256,
    "pad_token_id": 0,
}  # fmt: skip
FALCON: dict[str, Any] = {
    "model_type": "falcon", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
    "vocab_size": 1000, "new_decoder_architecture": False, "multi_query": True, "parallel_attn": True,
    "bias": False,
}  # fmt: skip


def test_qk_norm_adds_two_rmsnorms_over_q_and_k() -> None:
    _, base = _layer(LLAMA, precision=Precision.BF16, kernel_policy=KernelPolicy.CPU)
    _, qwen = _layer(QWEN3, precision=Precision.BF16, kernel_policy=KernelPolicy.CPU)
    width = (4 + 2) * 16  # q (4 heads) and k (2 heads) x head_dim 16, normalised per head
    # x.float() (4 B) and the bf16 y kept by weight * y (2 B) per element; one fp32 rstd per head and
    # token (Qwen3RMSNorm over head_dim: rsqrt of a [B, heads, S, 1] mean), 6 heads x T
    assert qwen.saved_bytes - base.saved_bytes == T * width * (4 + 2) + T * (4 + 2) * 4


def test_fused_qkv_with_rope_keeps_fused_output_and_rotated_copies() -> None:
    """Phi-3 (one qkv_proj), fp32 SDPA on CPU: 148,480 B per layer, as measured."""
    _, la = _layer(PHI3, precision=Precision.FP32, kernel_policy=KernelPolicy.CPU)
    h, a, g, d, inner = 64, 4, 2, 16, 128
    norms = 2 * (T * h * 8 + T * 4)
    inputs = 2 * T * h * 4  # qkv_proj input, gate_up input
    fused = T * (a + 2 * g) * d * 4  # kept whole by the v view
    rotated = T * (a + g) * d * 4
    out = 2 * T * a * d * 4  # SDPA output and o_proj's contiguous copy
    lse = B * a * S * 4
    mlp = 4 * T * inner * 4
    assert la.saved_bytes == norms + inputs + fused + rotated + out + lse + mlp


def test_parallel_block_with_one_norm_saves_its_output_once() -> None:
    """Falcon-7B layout, bf16 eager on CPU: one LayerNorm read by attention and MLP; softmax in bf16."""
    _, la = _layer(
        FALCON, precision=Precision.BF16, attention=AttentionKernel.EAGER, kernel_policy=KernelPolicy.CPU
    )
    h, a, d = 64, 4, 16
    norm = T * h * 2 + 2 * T * 2  # CPU layer_norm: bf16 mean/rstd
    shared_input = T * h * 2
    qkv = 3 * T * a * d * 2  # k, v (1 kv head) expanded to 4 heads
    softmax = B * a * S * S * 2
    o_in = T * h * 2
    mlp = 2 * T * 4 * h * 2  # fc output (gelu input) and gelu output
    assert la.saved_bytes == norm + shared_input + qkv + softmax + o_in + mlp


MIXTRAL: dict[str, Any] = {
    "model_type": "mixtral", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
    "vocab_size": 1000, "max_position_embeddings": 256,
}  # fmt: skip


def test_moe_routes_top_k_copies_of_each_token() -> None:
    """Mixtral, fp32 SDPA on CPU: the experts see top-k x T rows (measured: 2-layer total within 0.5%)."""
    _, la = _layer(MIXTRAL, precision=Precision.FP32, kernel_policy=KernelPolicy.CPU)
    h, a, g, d, inner, k, e = 64, 4, 2, 16, 128, 2, 4
    norms = 2 * (T * h * 8 + T * 4)
    inputs = 3 * T * h * 4  # q/k/v input, o_proj input (= SDPA output), router/experts input
    qkv = T * (a + 2 * g) * d * 4
    lse = B * a * S * 4
    # MixtralTopKRouter: fp32 softmax output, int64 top-k indices, and the in-place renormalisation's
    # clone of the top-k weights (fp32) and their sum (the logits themselves are not kept)
    router = T * e * 4 + T * k * 8 + T * k * 4 + T * 4
    # grouped_mm dispatch: perm, perm // k, inv_perm (int64), fp32 routing weights sorted, int32 offsets
    dispatch = 3 * k * T * 8 + k * T * 4 + e * 4
    routed = 2 * k * T * h * 4  # gathered expert inputs and the expert outputs scaled by routing weights
    experts = 4 * k * T * inner * 4  # gate, act, up, product over the routed rows
    assert la.saved_bytes == norms + inputs + qkv + lse + router + dispatch + routed + experts


def _moe_item(la: act.LayerActivations, key: str) -> int:
    return sum(i.bytes for i in la.saved if i.key == key)


DEEPSEEK_V2: dict[str, Any] = {
    "model_type": "deepseek_v2", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
    "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "q_lora_rank": None,
    "first_k_dense_replace": 0, "vocab_size": 128, "max_position_embeddings": 256,
}  # fmt: skip


def test_deepseek_router_keeps_fp32_copies_of_its_input_and_weight() -> None:
    """DeepseekV2TopkRouter: F.linear(x.type(float32), weight.type(float32)) under mixed-bf16 saves both
    fp32 copies (measured under fake tensors: mlp.gate _to_copy [T, 64] and [4, 64] fp32)."""
    _, la = _layer(DEEPSEEK_V2)
    h, e, k = 64, 4, 2
    assert _moe_item(la, "moe.router_fp32") == T * h * 4 + e * h * 4
    assert _moe_item(la, "moe.router") == T * e * 4 and _moe_item(la, "moe.router_indices") == T * k * 8
    assert _moe_item(la, "moe.router_norm") == 0  # V2's router never renormalises
    # its routing weights stay fp32: sample_weights[perm] is S x 4 B
    assert _moe_item(la, "moe.dispatch_weights") == k * T * 4 + e * 4
    # fp32 training: .type(float32) returns the tensors themselves, nothing new
    _, la32 = _layer(DEEPSEEK_V2, precision=Precision.FP32)
    assert _moe_item(la32, "moe.router_fp32") == 0
    # group_limited_greedy: masked_fill keeps a bool T x E mask
    _, lag = _layer({**DEEPSEEK_V2, "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1})
    assert _moe_item(lag, "moe.router_group_mask") == T * e


def test_qwen2_moe_gated_shared_expert_keeps_its_output_and_gate() -> None:
    """Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x)) * shared_expert(x) saves both factors;
    Qwen2MoeTopKRouter casts the top-k weights to the logits' dtype (bf16: S x 2 B sorted weights)."""
    cfg = {"model_type": "qwen2_moe", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 96, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "vocab_size": 128,
           "max_position_embeddings": 256}  # fmt: skip
    _, la = _layer(cfg)
    h, k, e = 64, 2, 4
    assert _moe_item(la, "mlp.shared_gate") == T * h * 2 + T * 2
    assert _moe_item(la, "moe.dispatch_weights") == k * T * 2 + e * 4
    assert _moe_item(la, "moe.router_norm") == 0  # norm_topk_prob defaults to False
    _, lan = _layer({**cfg, "norm_topk_prob": True})
    assert _moe_item(lan, "moe.router_norm") == T * k * 4 + T * 4


def test_moe_backward_crosses_the_fp32_weighted_expert_output() -> None:
    """grouped_mm experts: proj_out * fp32 routing weights is fp32, so backward holds three S x H fp32
    gradients at once (sum's contiguous copy, index backward's zeros and index_put: measured under fake
    tensors), above the incoming T x H gradient; Mixtral (no shared experts)."""
    spec, la = _layer(MIXTRAL)
    h, k = 64, 2
    sh = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S))
    assert act.moe_weighting_backward(spec, spec.first_layer.mlp, sh) == k * T * h * (3 * 4 + 2)
    assert la.backward_transient == k * T * h * (3 * 4 + 2) + T * h * 2


def test_gemma2_softcaps_scores_and_logits_and_runs_eager() -> None:
    cfg = {**LLAMA, "model_type": "gemma2", "head_dim": 16}
    spec = spec_from_config(cfg)
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=B, seq_len=S, attention=AttentionKernel.SDPA)
    sh = act.shapes(spec, setup)
    assert sh.kernel is AttentionKernel.EAGER and not sh.math_fallback  # _supports_sdpa = False
    la = act.layer_activations(spec, spec.first_layer, sh)
    assert any(i.key == "attn.softcap" and i.bytes == B * 4 * S * S * 2 for i in la.saved)
    norms = la.saved[0]  # pre/post attention and feed-forward norms: 4 RMSNorms, fp32 normalised x
    assert norms.key == "norms" and norms.bytes == 4 * (T * 64 * (4 + 4) + T * 4)
    head = head_activations(spec, sh, 1000 * 64)
    assert any(i.key == "head.softcap" and i.bytes == T * 1000 * 2 for i in head.saved)


# --- behaviours are ModelSpec fields, items are found by key ---------------------------------------------
def test_formulas_read_spec_fields_not_the_model_type() -> None:
    """hf.py sets the behaviour fields per family; the formulas read only the fields (so a spec whose
    fields say "standard" is computed as standard whatever its model_type)."""
    from dataclasses import replace

    setup = TrainingSetup(precision=Precision.BF16, micro_batch=B, seq_len=S, attention=AttentionKernel.EAGER,
                          kernel_policy=KernelPolicy.CPU)  # fmt: skip
    llama = spec_from_config(dict(LLAMA))
    scores = B * 4 * S * S

    def softmax(spec: ModelSpec) -> int:
        la = act.layer_activations(spec, spec.first_layer, act.shapes(spec, setup))
        return next(i.bytes for i in la.saved if i.key == "attn.softmax")

    assert softmax(llama) == scores * 4  # softmax(dtype=float32)
    assert softmax(replace(llama, attn_softmax_fp32=False)) == scores * 2  # in the bf16 scores' dtype
    gemma2 = spec_from_config({**LLAMA, "model_type": "gemma2", "head_dim": 16})
    plain = replace(gemma2, attn_logit_softcap=None, final_logit_softcap=None)
    la = act.layer_activations(plain, plain.first_layer, act.shapes(plain, setup))
    assert not any(i.key == "attn.softcap" for i in la.saved)
    head = head_activations(plain, act.shapes(plain, setup), 1000 * 64)
    assert not any(i.key == "head.softcap" for i in head.saved)


@pytest.mark.parametrize("config", [GPT2, LLAMA, {**LLAMA, "model_type": "gemma2", "head_dim": 16}],
                         ids=["gpt2", "llama", "gemma2"])  # fmt: skip
@pytest.mark.parametrize("attention", list(AttentionKernel))
def test_every_activation_item_has_a_stable_key(config: dict[str, Any], attention: AttentionKernel) -> None:
    spec = spec_from_config(dict(config))
    setup = TrainingSetup(precision=Precision.AMP_BF16, micro_batch=B, seq_len=S, attention=attention)
    sh = act.shapes(spec, setup)
    la = act.layer_activations(spec, spec.first_layer, sh)
    head = head_activations(spec, sh, 1000 * 64)
    for items in (la.saved, act.embedding_items(spec, sh), head.saved):
        keys = [i.key for i in items]
        assert all(keys) and len(set(keys)) == len(keys), keys
    selective = act.checkpointed(la, Checkpointing.SELECTIVE)
    assert not {i.key for i in selective.saved} & act.CORE_KEYS
    assert [i.key for i in act.checkpointed(la, Checkpointing.FULL).saved] == ["checkpoint.layer_input"]


def test_cuda_sdpa_backend_rule() -> None:
    """torch sdp_utils.cpp select_sdp_backend, as the simulator applies it to real calls' tensors."""
    rule = act.cuda_sdpa_backend
    base = {"half": True, "q_heads": 8, "kv_heads": 8, "enable_gqa": False, "mask": False,
            "qk_head_dim": 64, "v_head_dim": 64}  # fmt: skip
    assert rule(**base) == "flash"
    assert rule(**{**base, "kv_heads": 2, "enable_gqa": True}) == "flash"  # GQA native in flash
    assert rule(**{**base, "mask": True}) == "efficient"
    assert rule(**{**base, "half": False}) == "efficient"
    assert rule(**{**base, "half": False, "kv_heads": 2, "enable_gqa": True}) == "math"  # no GQA in efficient
    assert rule(**{**base, "kv_heads": 1}) == "math"  # Falcon-7B: 1 k/v head, no enable_gqa
    assert rule(**{**base, "qk_head_dim": 512, "v_head_dim": 512}) == "efficient"


def test_falcon_multi_query_sdpa_runs_the_math_kernel_on_cuda() -> None:
    """modeling_falcon.py FalconAttention.forward calls SDPA with 1 k/v head against 4 q heads, no
    enable_gqa, and the causal mask FalconModel materialises: CUDA runs the math kernel, which keeps
    16-bit q, k, v in fp32 (attention.cpp ``_scaled_dot_product_attention_math``): it saves q scaled
    (4 heads), k and v broadcast to 4 heads by matmul (copies at batch 2), the fp32 softmax; the output
    is cast back to bf16 and copied into dense's input layout."""
    spec = spec_from_config(dict(FALCON))
    assert (spec.sdpa_kv, spec.sdpa_mask) == ("broadcast", True)
    setup = TrainingSetup(micro_batch=B, seq_len=S)  # mixed-bf16, SDPA, CUDA policy
    kernel, why = act.kernel_choice(spec, setup)
    assert kernel is AttentionKernel.EAGER and why.startswith(act.MATH) and "without enable_gqa" in why
    sh = act.shapes(spec, setup)
    la = act.layer_activations(spec, spec.first_layer, sh)
    by_key = {i.key: i.bytes for i in la.saved}
    h, a = 64, 4
    scores = B * a * S * S
    assert by_key["attn.qkv"] == 3 * T * h * 4  # fp32 q, k, v at 4 heads
    assert by_key["attn.softmax"] == scores * 4
    assert by_key["attn.output"] == T * h * 2
    assert "attn.logsumexp" not in by_key
    # backward: _safe_softmax's dS is written while dP is alive, both fp32 scores
    assert act.attention_terms(spec, spec.first_layer, sh)[3] == 2 * scores * 4
    # the same call in fp32 or with the new decoder architecture's k/v copies is not the math kernel
    new_arch = spec_from_config({**FALCON, "new_decoder_architecture": True, "num_kv_heads": 2})
    assert new_arch.sdpa_kv == "repeated" and act.sdpa_call_backend(new_arch, setup) == "efficient"
    llama = spec_from_config(dict(LLAMA))  # shared sdpa_attention_forward: enable_gqa, no mask
    assert act.sdpa_call_backend(llama, setup) == "flash"
    fp32 = TrainingSetup(micro_batch=B, seq_len=S, precision=Precision.FP32)
    assert act.sdpa_call_backend(llama, fp32) == "math"  # fp32 GQA: efficient has no grouped heads


OLMO2: dict[str, Any] = {
    "model_type": "olmo2", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 1000, "max_position_embeddings": 256,
}  # fmt: skip


def test_olmo2_norms_save_fp32_normed_and_q_k_norms_each_their_rstd() -> None:
    """Olmo2RMSNorm (modeling_olmo2.py): ``(self.weight * hidden_states).to(input_dtype)``: the weight
    multiplies the fp32 normalised x, so each norm saves x.float() and y in fp32 and its rstd; q_norm
    and k_norm are two norms over the whole q (4 x 16) and k (2 x 16) widths. Mixed-bf16."""
    spec = spec_from_config(dict(OLMO2))
    assert spec.rmsnorm_normed_fp32
    setup = TrainingSetup(micro_batch=B, seq_len=S)
    la = act.layer_activations(spec, spec.first_layer, act.shapes(spec, setup))
    by_key = {i.key: i.bytes for i in la.saved}
    h = 64
    assert by_key["norms"] == 2 * (T * h * (4 + 4) + T * 4)  # post-attention and post-feedforward norms
    assert by_key["attn.qk_norm"] == T * (64 + 32) * (4 + 4) + 2 * T * 4
    # LoRA: the frozen norm weights keep no normalised y (only x.float() and rstd)
    from peakmem.formulas.lora import adapt_layer

    lora = TrainingSetup(micro_batch=B, seq_len=S, method="lora")  # type: ignore[arg-type]
    sh = act.shapes(spec, lora)
    adapted = adapt_layer(spec, 0, act.layer_activations(spec, spec.first_layer, sh), sh, lora)
    by_key = {i.key: i.bytes for i in adapted.saved}
    assert by_key["attn.qk_norm"] == T * (64 + 32) * 4 + 2 * T * 4


GEMMA2: dict[str, Any] = {
    "model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "vocab_size": 128,
    "max_position_embeddings": 128,
}  # fmt: skip


def test_block_ending_with_a_norm_starts_its_backward_in_it() -> None:
    """Gemma 2's post_feedforward_layernorm ends the block: its backward runs first, with every saved
    tensor alive, the bf16 incoming gradient and 5 fp32 T x h temporaries (pow, 2 mul of PowBackward;
    MeanBackward's div; the x-side mul), its fp32 weight-side y freed by then. Llama's block ends with
    the MLP's down projection: no such stage."""
    spec, la = _layer(GEMMA2, precision=Precision.MIXED_BF16)
    h = 64
    sh = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S, precision=Precision.MIXED_BF16))
    assert act.post_mlp_norm_backward(spec, spec.first_layer, sh) == 5 * T * h * 4 + T * h * 2
    assert la.backward_transient == 5 * T * h * 4 + T * h * 2 - T * h * 4
    assert la.backward_freed == T * h * 4
    llama, _ = _layer(LLAMA, precision=Precision.MIXED_BF16)
    assert act.post_mlp_norm_backward(llama, llama.first_layer, act.shapes(llama, TrainingSetup())) == 0


def test_gemma2_eager_builds_a_full_and_a_sliding_mask() -> None:
    # Gemma2Model.forward: causal_mask_mapping has "full_attention" and "sliding_attention", each
    # B x 1 x S x S in bf16 for eager attention (layers alternate sliding and full)
    _, la = _layer(GEMMA2, precision=Precision.MIXED_BF16)
    assert la.mask_arg == 2 * B * S * S * 2
    _, la_l = _layer(LLAMA, precision=Precision.MIXED_BF16, attention=AttentionKernel.EAGER)
    assert la_l.mask_arg == B * S * S * 2


def test_flash_backward_scratch() -> None:
    """FlashAttention-2's backward (flash_api.cpp mha_bwd) on CUDA, bf16, 4 q heads over 2 k/v heads of
    16, B = 2, S = 32: softmax_d fp32 [2, 4, 128] (rows padded to 128), dq_accum fp32 [2, 128, 4, 32]
    (head size padded to 32), dk/dv_expanded bf16 [2, 32, 4, 16] each (grouped-query)."""
    spec = spec_from_config(dict(QWEN3))
    sh = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S, precision=Precision.MIXED_BF16))
    expected = 2 * 4 * 128 * 4 + 2 * 128 * 4 * 32 * 4 + 2 * (2 * 32 * 4 * 16 * 2)
    assert act.flash_backward_scratch(spec, spec.first_layer, sh) == expected
    # fp32 runs the memory-efficient kernel, a CPU step its own: no flash scratch
    fp32 = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S, precision=Precision.FP32))
    cpu = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S, kernel_policy=KernelPolicy.CPU))
    assert act.flash_backward_scratch(spec, spec.first_layer, fp32) == 0
    assert act.flash_backward_scratch(spec, spec.first_layer, cpu) == 0
    # torchtune expands k/v to all heads before SDPA: the same flash call, no dk/dv_expanded
    tt = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S, framework=Framework.TORCHTUNE))
    assert act.flash_backward_scratch(spec, spec.first_layer, tt) == 2 * 4 * 128 * 4 + 2 * 128 * 4 * 32 * 4
    # an explicit mask (Falcon's new decoder architecture, k/v repeated) sends bf16 to the
    # memory-efficient kernel (sdp_utils.cpp): no flash scratch
    masked = spec_from_config({**FALCON, "new_decoder_architecture": True, "num_kv_heads": 2})
    msh = act.shapes(masked, TrainingSetup(micro_batch=B, seq_len=S))
    assert act.sdpa_call_backend(masked, TrainingSetup(micro_batch=B, seq_len=S)) == "efficient"
    assert act.flash_backward_scratch(masked, masked.first_layer, msh) == 0


def test_lora_attention_stage_frees_the_mlp_and_o_proj_adapters_first() -> None:
    """All-linear LoRA (rank 8, fp32 adapters) on the Falcon-7B layout, mixed-bf16, b2 x s128 (CUDA math
    kernel): the attention core's backward runs after the MLP half's and dense's, so their adapters'
    fp32 input casts and A outputs are freed by then (measured under the simulator: the peak's layer)."""
    from peakmem.formulas.lora import adapt_layer

    spec = spec_from_config(dict(FALCON))
    setup = TrainingSetup(micro_batch=2, seq_len=128, method="lora")  # type: ignore[arg-type]
    sh = act.shapes(spec, setup)
    la = act.layer_activations(spec, spec.first_layer, sh)
    t, h, i, r = 256, 64, 256, 8
    scores = 2 * 4 * 128 * 128
    mlp_saved = t * h * 2 + 2 * t * i * 2 + (t * h * 2 + 2 * t * 4) // 2  # input, fc + gelu, norm/2
    assert la.backward_stages[1][0] == 2 * scores * 4 + 2 * t * h * 2 - mlp_saved
    down_dropped = t * i * 2  # the frozen dense_4h_to_h never saved its input
    early = (t * h * 4 + t * r * 4) * 2 + (t * i * 4 + t * r * 4)  # dense, dense_h_to_4h; dense_4h_to_h
    adapted = adapt_layer(spec, 0, la, sh, setup)
    assert adapted.backward_transient == la.backward_stages[1][0] + down_dropped - early == 515_072


def test_bloom_gelu_backward_holds_six_intermediates() -> None:
    """modeling_bloom.py ``bloom_gelu_back``: g, tanh_out, 0.5 x, 1 - tanh_out**2, the polynomial and their
    product alive at once (6 T x I in bf16); net of the freed down-projection input (the gelu output): 5."""
    spec = spec_from_config({"model_type": "bloom", "n_layer": 1, "hidden_size": 64, "n_head": 4,
                             "vocab_size": 1000})  # fmt: skip
    assert spec.first_layer.mlp.activation == "bloom_gelu"
    sh = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S))  # mixed-bf16
    _, bwd = act.mlp_terms(spec, spec.first_layer, sh)
    assert bwd == 5 * T * 4 * 64 * 2


def test_olmo_layernorm_saves_its_fp32_upcast() -> None:
    """modeling_olmo.py ``OlmoLayerNorm``: ``F.layer_norm(x.to(float32), ...).to(orig_dtype)`` saves the
    fp32 copy and fp32 mean/rstd (no weight, no bias); the bf16 residual itself is not saved."""
    olmo = {"model_type": "olmo", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 96, "vocab_size": 1000}  # fmt: skip
    spec = spec_from_config(olmo)
    assert spec.layernorm_fp32
    sh = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S))  # mixed-bf16
    la = act.layer_activations(spec, spec.first_layer, sh)
    assert {i.key: i.bytes for i in la.saved}["norms"] == 2 * (T * 64 * 4 + 2 * T * 4)
    assert la.input_saved == 0


def test_rope_cat_makes_sdpa_output_need_a_copy_and_parallel_norms_share_their_input() -> None:
    """Phi-3 / GPT-NeoX: apply_rotary_pos_emb ends in torch.cat, so q is contiguous per head, SDPA's output
    takes q's layout and ``transpose(1, 2).contiguous()`` copies it for o_proj (T x h bf16); GPT-NeoX's
    parallel block feeds one input to both LayerNorms (saved once). Mixed-bf16, CUDA policy."""
    setup = TrainingSetup(micro_batch=B, seq_len=S)
    phi3 = spec_from_config({**LLAMA, "model_type": "phi3", "num_key_value_heads": 4})
    neox_config = {"model_type": "gpt_neox", "num_hidden_layers": 1, "hidden_size": 64,
                   "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 1000}  # fmt: skip
    neox = spec_from_config(neox_config)
    assert phi3.rope_concat and neox.rope_concat
    for spec in (phi3, neox):
        la = act.layer_activations(spec, spec.first_layer, act.shapes(spec, setup))
        assert {i.key: i.bytes for i in la.saved}["attn.output_copy"] == T * 64 * 2
    la = act.layer_activations(neox, neox.first_layer, act.shapes(neox, setup))
    assert {i.key: i.bytes for i in la.saved}["norms"] == T * 64 * 2 + 2 * (2 * T * 4)


GEMMA3: dict[str, Any] = {
    "model_type": "gemma3_text", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 96, "vocab_size": 128,
    "max_position_embeddings": 256, "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"],
}  # fmt: skip


def _items(spec: ModelSpec, layer_index: int, setup: TrainingSetup) -> dict[str, MemoryItem]:
    la = act.layer_activations(spec, spec.groups[layer_index].layer, act.shapes(spec, setup))
    return {i.key: i for i in la.saved}


def test_a_sliding_layer_past_its_window_hands_sdpa_a_mask_it_keeps_additive() -> None:
    """Gemma 3, mixed-bf16 on CUDA, B = 2, S = 32, window 16: the sliding layer's call gets masking_utils'
    bool mask (S >= window), so k/v are not passed with enable_gqa but repeated (one k/v head: a view),
    CUDA runs the memory-efficient kernel, SDPA saves the mask made additive in bf16 (B x 1 x S x S) and
    the log-sum-exp rows padded to 32. The full layer runs flash with no mask; a window longer than the
    sequence takes no mask either."""
    spec = spec_from_config(dict(GEMMA3))
    assert [g.layer.attention.sliding_window for g in spec.groups] == [16, None]
    setup = TrainingSetup(micro_batch=B, seq_len=S)
    sliding, full = spec.groups[0].layer.attention, spec.groups[1].layer.attention
    assert act.sdpa_call_backend(spec, setup, sliding) == "efficient"
    assert act.sdpa_call_backend(spec, setup, full) == "flash"
    items = _items(spec, 0, setup)
    assert items["attn.sdpa_bias"].bytes == B * S * S * 2
    assert items["attn.qkv"].sizes == (T * 64 * 2, T * 16 * 2, T * 16 * 2)  # k, v: one head (a view)
    assert items["attn.logsumexp"].bytes == B * 4 * 32 * 4
    assert "attn.sdpa_bias" not in _items(spec, 1, setup)
    assert "attn.sdpa_bias" not in _items(spec_from_config({**GEMMA3, "sliding_window": 64}), 0, setup)
    # two k/v heads: repeat_kv copies them to all four, and those copies are what SDPA saves
    two = spec_from_config({**GEMMA3, "num_key_value_heads": 2})
    assert _items(two, 0, setup)["attn.qkv"].sizes == (T * 64 * 2,) * 3
    # the CPU's SDPA also converts the mask and keeps it (its log-sum-exp rows are not padded)
    cpu = TrainingSetup(micro_batch=B, seq_len=S, kernel_policy=KernelPolicy.CPU)
    assert _items(spec, 0, cpu)["attn.sdpa_bias"].bytes == B * S * S * 2


def test_efficient_backward_scratch() -> None:
    """The memory-efficient kernel's backward (mem_eff_attention/kernel_backward.h), as simulate/kernels.py
    allocates it: delta fp32 [B, H, S] and, for 16-bit inputs, the fp32 grad-q accumulator [B, H, S, D]."""
    spec = spec_from_config(dict(GEMMA3))
    att = spec.first_layer.attention
    bf16 = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S))
    fp32 = act.shapes(spec, TrainingSetup(micro_batch=B, seq_len=S, precision=Precision.FP32))
    assert act.efficient_backward_scratch(att, bf16) == B * 4 * S * 4 + B * 4 * S * 16 * 4
    assert act.efficient_backward_scratch(att, fp32) == B * 4 * S * 4
    dq_dk_dv = T * (64 + 16 + 16) * 2
    scratch = B * 4 * S * 4 + B * 4 * S * 16 * 4
    assert act.attention_terms(spec, spec.first_layer, bf16)[3] == dq_dk_dv + scratch


def test_unequal_tensors_reach_the_replay_in_their_sizes() -> None:
    """Qwen3's per-head q/k norms, bf16: q's x.float() (4 B), its rstd (one per head and token), its bf16
    y; then k's. The replay's request sizes are these, not the sum in equal parts; an item whose bytes a
    technique changed afterwards falls back to equal parts (the last holding the remainder)."""
    from dataclasses import replace

    from peakmem.step_parts import pieces

    _, la = _layer(QWEN3, precision=Precision.BF16)
    item = {i.key: i for i in la.saved}["attn.qk_norm"]
    q, k = 4 * 16, 2 * 16
    assert item.sizes == (T * q * 4, T * 4 * 4, T * q * 2, T * k * 4, T * 2 * 4, T * k * 2)
    assert item.bytes == sum(item.sizes) and pieces([item]) == item.sizes
    norms = {i.key: i for i in la.saved}["norms"]
    assert norms.sizes == (T * 64 * 4, T * 4, T * 64 * 2) * 2
    changed = replace(item, bytes=item.bytes - T * q * 2)
    n, b = item.tensors, changed.bytes  # equal parts, the last with the remainder: they add up
    assert pieces([changed]) == (b // n,) * (n - 1) + (b - (n - 1) * (b // n),)
    assert sum(pieces([changed])) == b
