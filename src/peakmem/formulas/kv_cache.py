"""KV-cache size: what each attention layer keeps per token, per sequence.

Per token and layer a standard attention layer caches ``num_kv_heads * (head_dim + v_head_dim)``
elements (K and V): MHA has ``num_kv_heads == num_heads``, GQA fewer, MQA one (Ainslie et al.
2023, GQA, sec. 2). Multi-head latent attention (DeepSeek-V2 paper, sec. 2.1.2, eq. 9-10) caches
the compressed latent ``c_KV`` (``kv_lora_rank`` elements) plus the shared RoPE key
(``qk_rope_head_dim``), when the engine keeps the latent; an engine that caches the expanded keys
and values keeps ``num_heads * (qk_nope + qk_rope + v_head_dim)`` elements instead.

Sliding-window layers (Mistral-7B v0.1, the local layers of Gemma 2/3) cache at most
``sliding_window`` tokens. Paged caches allocate whole blocks: tokens round up to ``block_size``
per sequence (vLLM PagedAttention, Kwon et al. 2023, sec. 4.2).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

from peakmem.model import Attention, ModelSpec

CacheKind = Literal["standard", "latent", "expanded"]


def cache_kind(spec: ModelSpec, *, latent: bool) -> CacheKind:
    """``latent``/``expanded`` for MLA models (as the engine caches them), else ``standard``."""
    if not any(layer.attention.is_mla for layer in spec.layers()):
        return "standard"
    return "latent" if latent else "expanded"


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads one tensor-parallel rank holds: heads split evenly; with more ranks than KV heads
    each rank keeps a replica of one (vLLM ``ModelConfig.get_num_kv_heads``:
    ``max(1, total_num_kv_heads // tensor_parallel_size)``)."""
    return max(1, -(-num_kv_heads // tp))


def kv_elements_per_token_layer(att: Attention, *, latent: bool, tp: int = 1) -> int:
    """Cached elements for one token in one layer on one tensor-parallel rank."""
    if att.is_mla:
        if latent:
            # vLLM MLACommonImpl / SGLang / llama.cpp: one 576-wide "head" for DeepSeek-V3, replicated
            # on every TP rank (the latent is shared by all heads). llama.cpp keeps no V cache for MLA
            # since ggml-org/llama.cpp PR #19067 ("V-less cache", 2026-01); older builds also stored
            # a kv_lora_rank-wide V.
            return att.kv_lora_rank + att.qk_rope_head_dim
        heads = -(-att.num_heads // tp)
        return heads * (att.head_dim + att.v_head_dim)
    return kv_heads_per_rank(att.num_kv_heads, tp) * (att.head_dim + att.v_head_dim)


def cached_tokens(att: Attention, tokens: int, *, windows: bool = True) -> int:
    """Tokens a layer keeps: all of them, or at most its sliding window (when the engine caps it)."""
    if att.sliding_window is None or not windows:
        return tokens
    return min(tokens, att.sliding_window)


def interleaved_windows(spec: ModelSpec) -> bool:
    """True when sliding-window layers alternate with full-attention ones (Gemma 2/3, Cohere2)."""
    windows = {layer.attention.sliding_window is None for layer in spec.layers()}
    return len(windows) == 2


def round_to_block(tokens: int, block_size: int) -> int:
    """Tokens a paged cache allocates for one sequence: whole blocks."""
    return -(-tokens // block_size) * block_size


def _nbytes(elements: int, bits: Fraction) -> int:
    return int(-(-(elements * bits) // 8))


def kv_bytes_per_token(spec: ModelSpec, *, bits: Fraction, latent: bool, tp: int = 1) -> int:
    """Bytes one token adds to the cache over all layers (ignoring sliding windows), one rank. Layers
    whose window is 0 tokens (a derived spec's SSM / linear-attention blocks) cache no token."""
    elements = sum(
        kv_elements_per_token_layer(layer.attention, latent=latent, tp=tp)
        for layer in spec.layers()
        if layer.attention.caches_tokens
    )
    return _nbytes(elements, bits)


def kv_cache_bytes(
    spec: ModelSpec,
    *,
    tokens: int,
    batch: int,
    bits: Fraction,
    latent: bool,
    tp: int = 1,
    block_size: int = 1,
    windows: bool = True,
) -> int:
    """Bytes of the cache for ``batch`` sequences of ``tokens`` tokens each, on one rank.

    Each layer keeps ``cached_tokens`` (window-capped unless ``windows=False``) rounded up to whole
    blocks per sequence.
    """
    return sum(
        g.count
        * layer_kv_bytes(
            g.layer.attention,
            tokens=tokens,
            batch=batch,
            bits=bits,
            latent=latent,
            tp=tp,
            block_size=block_size,
            windows=windows,
        )
        for g in spec.groups
    )


def layer_kv_bytes(
    att: Attention,
    *,
    tokens: int,
    batch: int,
    bits: Fraction,
    latent: bool,
    tp: int = 1,
    block_size: int = 1,
    windows: bool = True,
) -> int:
    """One layer's cache for ``batch`` sequences of ``tokens`` tokens (window-capped, whole blocks)."""
    kept = round_to_block(cached_tokens(att, tokens, windows=windows), block_size)
    return _nbytes(kv_elements_per_token_layer(att, latent=latent, tp=tp) * kept, bits) * batch
