"""Activations of a serving forward: the largest temporaries of one decoder layer for a number of
tokens, as transformers (``generate``) and the fused engines (vLLM, SGLang) compute it."""

from __future__ import annotations

import math

from peakmem.formulas.kv_cache import kv_elements_per_token_layer
from peakmem.model import ModelSpec

# transformers' decoder at the MLP peak of a layer holds four hidden-size tensors: the input
# embeddings (a local of the model's forward), the layer's input (the loop variable), the residual
# and the normed MLP input (measured with peakmem.measure's tracker on a tiny Llama, CPU, torch 2.13).
HF_RESIDUAL_COPIES = 4
# vLLM fuses residual add and RMSNorm in place (fused_add_rms_norm): the hidden state and residual.
FUSED_RESIDUAL_COPIES = 2


def moe_transient_per_token(
    spec: ModelSpec, mlp_width: int, experts: int, top_k: int, act_bytes: int, *, fused: bool
) -> float:
    """Bytes per token of an MoE block's temporaries; ``S = tokens x k`` routed rows.

    transformers 5 ``grouped_mm`` experts (``integrations/moe.py`` ``grouped_mm_experts_forward``,
    the default experts implementation): the gathered input ``[S, H]`` lives throughout; first with
    gate_up ``[S, 2I]`` and the gated ``[S, I]``, at the end with the down output, the weighted
    output and its re-ordered copy (``[S, H]`` each): ``k x max(H + 3I, 4H)``; plus the router's
    logits and fp32 softmax (2 x E x 4 B).
    vLLM ``fused_moe``: intermediate caches ``[T, k, 2I]``, ``[T * k, I]`` and ``[T, k, H]``.
    """
    h = spec.hidden_size
    if fused:
        return top_k * (3 * mlp_width + h) * act_bytes
    return top_k * max(h + 3 * mlp_width, 4 * h) * act_bytes + 2 * experts * 4


def layer_transient_bytes(
    spec: ModelSpec, tokens: int, act_bytes: int, tp: int = 1, *, fused: bool = False
) -> int:
    """Largest forward temporaries of one decoder layer for ``tokens`` tokens (SDPA/flash kernels:
    no ``tokens^2`` scores). Sub-steps, whichever is largest:
    MLP ``down(act(gate(x)) * up(x))``: act, up and their product alive = 3 x tokens x width;
    MoE: :func:`moe_transient_per_token` (plus shared experts as a dense MLP);
    attention: q, k, v and their RoPE'd copies plus the output = 2 (q + k + v) + q;
    RMSNorm upcast: fp32 copy and its square = 2 x 4 bytes x hidden.
    The residual stream adds ``HF_RESIDUAL_COPIES`` (``FUSED_RESIDUAL_COPIES`` for ``fused``
    engines) x tokens x hidden throughout."""
    residual = (FUSED_RESIDUAL_COPIES if fused else HF_RESIDUAL_COPIES) * spec.hidden_size * act_bytes
    best = 0
    for g in spec.groups:
        att, mlp = g.layer.attention, g.layer.mlp
        heads = -(-att.num_heads // tp)
        q = heads * att.head_dim
        kv = kv_elements_per_token_layer(att, latent=False, tp=tp)
        if mlp.is_moe:
            width = -(-mlp.intermediate_size // tp)
            shared = -(-mlp.shared_intermediate_size // tp)
            moe = moe_transient_per_token(
                spec, width, mlp.num_experts, mlp.experts_per_token, act_bytes, fused=fused
            )
            mlp_bytes = max(moe, 3 * shared * act_bytes)
        else:
            width = -(-mlp.intermediate_size // tp)
            mlp_bytes = (3 * width if mlp.gated else 2 * width) * act_bytes
        attn_bytes = (2 * (q + kv) + q) * act_bytes
        norm_bytes = 2 * 4 * spec.hidden_size
        per_token = max(mlp_bytes, attn_bytes, norm_bytes)
        best = max(best, math.ceil(tokens * (per_token + residual)))
    return best
