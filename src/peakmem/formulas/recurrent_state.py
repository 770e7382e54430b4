"""Recurrent state of SSM and linear-attention blocks at inference: constant per sequence.

A Mamba / Mamba-2 mixer (Jamba, Falcon-H1, Granite 4.0-H, Bamba, Nemotron-H, ...), a gated
delta-net (Qwen3-Next, Qwen3.5) or a short convolution (LFM2) keeps no per-token KV cache. It keeps,
per sequence and whatever the context, the last ``conv_kernel`` inputs of its causal convolution
(``conv_states``) and the recurrent state of its scan (``recurrent_states``: the SSM state
``heads x head_dim x d_state``, or the delta-rule state ``v_heads x k_head_dim x v_head_dim``).
transformers allocates both lazily from the first prefill's tensors (``cache_utils.py``
``LinearAttentionLayer.lazy_initialization``): the conv state in the model's dtype, the scan's state
as its kernel returns it, fp32 (``torch_chunk_gated_delta_rule``, Mamba-2 ``torch_forward``; the
fla / mamba-ssm kernels return fp32 final states too). The element counts come from that cache,
measured once per derived spec (:class:`~peakmem.model.DerivedBlock` ``state_elements`` /
``state_fp32_elements``); here they become bytes for ``batch`` sequences.

Tensor parallelism splits the state by heads (vLLM ``MambaMixer2`` shards conv and SSM state per
rank): ceiling division, the most loaded rank.
"""

from __future__ import annotations

from peakmem.model import ModelSpec

FP32_BYTES = 4


def state_bytes_per_sequence(spec: ModelSpec, *, act_bytes: int, tp: int = 1) -> int:
    """Bytes one sequence's recurrent state takes over all layers on one tensor-parallel rank:
    ``state_elements`` at ``act_bytes`` (the compute dtype) plus ``state_fp32_elements`` at 4 bytes."""
    total = 0
    for g in spec.groups:
        info = g.layer.derived
        if info is None:
            continue
        per_layer = (
            -(-info.state_elements // tp) * act_bytes + -(-info.state_fp32_elements // tp) * FP32_BYTES
        )
        total += g.count * per_layer
    return total


def recurrent_state_bytes(spec: ModelSpec, *, batch: int, act_bytes: int, tp: int = 1) -> int:
    """The recurrent state of ``batch`` sequences (independent of their length)."""
    return batch * state_bytes_per_sequence(spec, act_bytes=act_bytes, tp=tp)
