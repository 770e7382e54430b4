"""Automatic prefix caching: a prompt prefix shared by every request, stored once in the KV pool.

vLLM (vllm/v1/core/kv_cache_utils.py ``hash_block_tokens``, vllm/v1/core/block_pool.py, vLLM 0.11;
``enable_prefix_caching`` on by default in V1) hashes each *full* block of ``block_size`` tokens
with the hash of the block before it; a request whose first blocks hash alike reuses them (their
reference count goes up, no new block). So ``prefix // block_size`` full blocks of a shared prefix
are held once; each request holds its own blocks for the rest of its sequence (the prefix's partial
block included: a partial block is never shared). SGLang's radix cache (page size 1) shares every
prefix token. Recurrent state (SSM / linear attention) is per request and is not shared here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PrefixShare:
    """How a shared prefix splits one sequence's KV: ``shared_tokens`` stored once (whole blocks),
    the rest per request."""

    prefix_tokens: int
    shared_tokens: int  # the prefix's full blocks, in tokens


def shared_prefix(prefix_tokens: int, block_size: int) -> PrefixShare:
    """The tokens of a ``prefix_tokens`` prefix that prefix caching stores once: its full blocks."""
    return PrefixShare(prefix_tokens=prefix_tokens, shared_tokens=prefix_tokens // block_size * block_size)


def concurrent_with_share(pool_bytes: int, *, per_sequence: int, shared_bytes: int) -> int:
    """Requests that fit a pool of ``pool_bytes`` when each needs ``per_sequence`` bytes of which
    ``shared_bytes`` (the prefix's shared blocks) are held once for all: 0 when not even one fits."""
    if pool_bytes < per_sequence:
        return 0
    # every request has at least one token of its own (InferenceSetup: prefix_tokens < context)
    return (pool_bytes - shared_bytes) // (per_sequence - shared_bytes)
