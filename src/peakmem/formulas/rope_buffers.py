"""The RoPE cos/sin buffers older transformers releases keep in every attention layer (engine ``hf``, and
training with ``--framework hf`` at ``--transformers``: peakmem.formulas.model_states.buffer_bytes).

Read in the released wheels (``pip download transformers==V --no-deps``):

* 4.31.0 - 4.37.x ``models/llama/modeling_llama.py`` (4.31.0 l. 100-115, 4.35.0 l. 113-136, 4.36.0 l. 131-146,
  4.37.0 l. 123-146):
  ``LlamaAttention._init_rope`` gives each layer its own ``LlamaRotaryEmbedding``, whose ``__init__`` calls
  ``_set_cos_sin_cache(seq_len=max_position_embeddings, dtype=torch.get_default_dtype())`` and registers
  ``cos_cached`` and ``sin_cached``, each ``[max_position_embeddings, head_dim]`` (``emb = torch.cat((freqs,
  freqs), dim=-1)``), cast to the default dtype: ``from_pretrained(torch_dtype=...)`` sets it to the model's
  dtype while the model is built. They are buffers (``persistent=False``), so they go where the model goes
  (``.to(device)``, ``to_empty``, a device context) and stay for the model's life; ``forward`` rebuilds them
  at ``seq_len`` when a sequence is longer than the cache. 4.30.0 (l. 95-104): the same per-layer buffers
  without the cast (fp32, ``[1, 1, max_position_embeddings, head_dim]``). 4.38.0: none (``forward`` computes
  cos and sin of the ``position_ids`` at hand; ``_cos_cached`` keeps only the last call's).
* 4.35.0 - 4.41.x ``models/mistral/modeling_mistral.py`` ``MistralRotaryEmbedding``
  (4.35.0 l. 90-123, 4.37.0 l. 90-125, 4.38.0 l. 101-124, 4.39.1 l. 93-125, 4.40.0 and 4.41.0 alike): the
  same per-layer buffers in the default dtype (``MistralAttention.__init__``: ``self.rotary_emb =
  MistralRotaryEmbedding(...)``). Mistral-7B's ``max_position_embeddings`` is 32768: 32 layers x 2 x 32768 x
  128 x 2 B = 512 MiB in fp16. 4.42.0 and 4.43.0: none. 4.34.0 (where Mistral came in) was not read.
* the classes copied from it, each layer's ``self.rotary_emb`` with ``cos_cached`` / ``sin_cached`` at
  ``max_position_embeddings`` in the default dtype: ``models/mixtral/modeling_mixtral.py`` 4.36.0 - 4.47.x
  (read 4.36.0, 4.37.0, 4.40.0 - 4.47.0; 4.48.0: none); ``models/qwen2/modeling_qwen2.py`` 4.37.0 (where
  Qwen2 came in) - 4.44.x (read 4.37.0, 4.40.0 - 4.44.0; 4.45.0: one rotary module for the model, no
  cache); ``models/qwen2_moe/modeling_qwen2_moe.py`` 4.40.0 (where it came in) - 4.44.x (4.45.0: none).
  Qwen2.5-7B: 28 layers x 2 x 32768 x 128 x 2 B = 448 MiB in bf16.

Other model types whose code copied these classes (``# Copied from``) are not in the table: not read.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.model import ModelSpec

FP32_BYTES = 4
# cos and sin: two buffers per layer
ROPE_BUFFERS_PER_LAYER = 2


@dataclass(frozen=True, kw_only=True)
class RopeBufferRelease:
    """The transformers releases ``[since, until)`` whose ``model_type`` keeps per-layer cos/sin caches."""

    model_type: str
    since: tuple[int, int]
    until: tuple[int, int]
    fp32: bool  # the buffers stay fp32 (no cast to the default dtype)
    source: str


ROPE_BUFFER_RELEASES: tuple[RopeBufferRelease, ...] = (
    RopeBufferRelease(
        model_type="llama", since=(4, 30), until=(4, 31), fp32=True,
        source="transformers 4.30.0 models/llama/modeling_llama.py l. 95-104 LlamaRotaryEmbedding",
    ),
    RopeBufferRelease(
        model_type="llama", since=(4, 31), until=(4, 38), fp32=False,
        source="transformers 4.31.0-4.37.0 models/llama/modeling_llama.py "
        "LlamaRotaryEmbedding._set_cos_sin_cache",
    ),
    RopeBufferRelease(
        model_type="mistral", since=(4, 35), until=(4, 42), fp32=False,
        source="transformers 4.35.0-4.41.0 models/mistral/modeling_mistral.py MistralRotaryEmbedding",
    ),
    RopeBufferRelease(
        model_type="mixtral", since=(4, 36), until=(4, 48), fp32=False,
        source="transformers 4.36.0-4.47.0 models/mixtral/modeling_mixtral.py MixtralRotaryEmbedding",
    ),
    RopeBufferRelease(
        model_type="qwen2", since=(4, 37), until=(4, 45), fp32=False,
        source="transformers 4.37.0-4.44.0 models/qwen2/modeling_qwen2.py Qwen2RotaryEmbedding",
    ),
    RopeBufferRelease(
        model_type="qwen2_moe", since=(4, 40), until=(4, 45), fp32=False,
        source="transformers 4.40.0-4.44.0 models/qwen2_moe/modeling_qwen2_moe.py Qwen2MoeRotaryEmbedding",
    ),
)  # fmt: skip


def rope_buffer_release(model_type: str, version: tuple[int, ...]) -> RopeBufferRelease | None:
    """The row in force for ``model_type`` at transformers ``version`` (major, minor), or None."""
    for row in ROPE_BUFFER_RELEASES:
        if row.model_type == model_type and row.since <= version < row.until:
            return row
    return None


def rope_buffer_bytes(spec: ModelSpec, version: tuple[int, ...], positions: int, dtype_bytes: int) -> int:
    """Bytes of every attention layer's cos and sin buffers at transformers ``version``: each
    ``[max(max_position_embeddings, positions), head_dim]`` in the model's dtype (``dtype_bytes``) or fp32;
    0 where the release keeps none for the model type (or the model has no RoPE)."""
    row = rope_buffer_release(spec.model_type, version)
    if row is None or spec.position != "rope":
        return 0
    rows = max(spec.max_position_embeddings, positions)  # forward rebuilds the cache for longer sequences
    elem = FP32_BYTES if row.fp32 else dtype_bytes
    return sum(ROPE_BUFFERS_PER_LAYER * rows * layer.attention.head_dim * elem for layer in spec.layers())
