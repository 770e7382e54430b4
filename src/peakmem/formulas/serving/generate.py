"""transformers ``generate`` (engine ``hf``).

The DynamicCache grows by ``torch.cat`` every step (``cache_utils.py`` ``DynamicLayer.update``).
Peak is at prefill (the whole prompt's layer transients) or at the last decode step (full cache +
one layer's K or V being copied + logits): ``self.keys = torch.cat(...)`` frees the old K before the
V is copied (transformers 5.23 ``DynamicLayer.update``), so one tensor is alive twice. What the caching
allocator keeps reserved while the cache grows (segments the growing K and V outgrow) comes from a
replay of the whole generate through the allocator model (:mod:`peakmem.formulas.serving.cache_growth`).
``cache_implementation="static"`` (StaticCache, cache_utils.py ``StaticLayer``): each layer's K and V are
``torch.zeros`` of ``max_cache_len`` (generate passes ``max_length``, prompt + new tokens) at the layer's
first update, in prefill, then written in place (``index_copy_``): the whole cache is there from prefill
on and nothing is copied while it fills.
transformers before 4.36 (``engine_version``; the Cache classes came in v4.36.0) kept ``past_key_values`` as
a tuple of per-layer ``(K, V)``: each attention ``torch.cat``'d the old K and V into new tensors and
returned them in a new tuple (v4.35 models/llama/modeling_llama.py ``LlamaAttention.forward``), while
``greedy_search``/``sample`` kept the previous step's tuple in ``model_kwargs`` until
``_update_model_kwargs_for_generation`` after the forward (v4.35 generation/utils.py): at a decode step's
last layer the whole previous cache is alive beside the new one.
``generate`` sets ``logits_to_keep=1``
(``generation/utils.py``), so prefill computes logits for the last position only, then copies them
to fp32 (``next_token_logits ... dtype=torch.float32``). Before v4.45 (``TRANSFORMERS_LOGITS_TO_KEEP``)
the prefill forward computed every prompt position's logits and their fp32 copy (both alive at
``logits.float()``); those fp32 logits then stay referenced by ``outputs`` until the first decode step's
forward returns (not modelled there: the last decode step, with the whole cache, is larger but for the
shortest generations).
From v4.50 ``from_pretrained(device_map=...)`` first warms the caching allocator with one block that can
outgrow the weights (a tied head counted twice, bitsandbytes' Linears at half their 16-bit size): the
load phase, and a floor under what stays reserved (:mod:`peakmem.formulas.serving.hf_load`).
transformers 4.30-4.37 (Llama) and 4.35-4.38 (Mistral) keep RoPE cos/sin buffers of every position up to
``max_position_embeddings`` in each attention layer, resident with the weights
(:mod:`peakmem.formulas.rope_buffers`).
"""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas.allocator import NO_ROUNDUP
from peakmem.formulas.overhead import CUBLAS_WORKSPACE_BYTES
from peakmem.formulas.quant_kernels import kernel_buffer_items, kernel_notes, matmul_temporary_bytes
from peakmem.formulas.rope_buffers import rope_buffer_bytes, rope_buffer_release
from peakmem.formulas.serving.cache_growth import growth_run, replayed_reserved
from peakmem.formulas.serving.context import (
    CUDA_CONTEXT_BYTES,
    CUDA_CONTEXT_SOURCE,
    EngineMemory,
    ServingContext,
    cache_bytes,
    largest_layer_kv,
    state_items,
    weights_item,
)
from peakmem.formulas.serving.forward import layer_transient_bytes
from peakmem.formulas.serving.hf_load import warmup
from peakmem.formulas.serving.speculative import draft_cache_bytes, draft_notes, draft_weights_item
from peakmem.formulas.weights import WeightRow
from peakmem.inference import TRANSFORMERS_CACHE_CLASSES, TRANSFORMERS_LOGITS_TO_KEEP, CacheImplementation

# generate(): bf16 logits of the kept position, their fp32 copy, and the fp32 scores the logits
# processors / softmax produce (generation/utils.py _sample).
GENERATE_LOGIT_COPIES_FP32 = 2
# generate() makes its first new token from the prefill forward; each further token is one decode forward
# over the growing cache (generation/utils.py _sample): with one new token the cache never grows
MIN_NEW_TOKENS_TO_DECODE = 2


def generate_memory(
    c: ServingContext, rows: tuple[WeightRow, ...], replay_divisions: int | None = NO_ROUNDUP
) -> EngineMemory:
    """transformers ``generate`` on one rank (module docstring). ``replay_divisions``: the allocator's
    ``roundup_power2_divisions`` for the replay of the cache's growth; None: no replay (expandable
    segments merge what they free)."""
    s, b = c.setup, c.setup.batch
    weights = weights_item(c, rows)
    chunk = min(c.prompt, s.prefill_chunk) if s.prefill_chunk else c.prompt
    vocab = -(-c.spec.vocab_size // s.tp)
    every_position = s.version < TRANSFORMERS_LOGITS_TO_KEEP  # no num_logits_to_keep: all, and their fp32
    kept = chunk if s.keep_all_logits or every_position else 1
    upcast = b * chunk * vocab * 4 if every_position else 0  # logits.float(), alive with the 16-bit ones
    logits = b * kept * vocab * c.act_bytes + upcast + b * vocab * 4 * GENERATE_LOGIT_COPIES_FP32
    prefill_layer = layer_transient_bytes(c.spec, b * chunk, c.act_bytes, s.tp)
    static = s.cache_implementation is CacheImplementation.STATIC
    kv_prompt = cache_bytes(c, c.context if static else c.prompt, b)
    dequant = matmul_temporary_bytes(c.spec, s, b * chunk, c.act_bytes, prefill=True)
    kernel_buffers = kernel_buffer_items(c.spec, s)  # GPTQ kernels' workspaces, from load on
    assistant = _assistant_items(c, c.prompt, "prompt tokens")
    buffers = _rope_buffer_items(c)
    prefill = [
        weights,
        *buffers,
        *kernel_buffers,
        *assistant,
        MemoryItem(
            path=f"kv cache ({c.context} tokens x {b}, static)"
            if static
            else f"kv cache ({c.prompt} prompt tokens x {b})",
            category=Category.KV_CACHE,
            bytes=kv_prompt,
            source="formulas/kv_cache.py",
        ),
        *state_items(c, b),
        MemoryItem(
            path=f"prefill layer temporaries ({b} x {chunk} tokens)",
            category=Category.ACTIVATIONS,
            bytes=max(prefill_layer, logits),
            source="formulas/serving/forward.py layer_transient_bytes",
        ),
    ]
    if dequant:
        prefill.append(
            MemoryItem(
                path="quantized matmul temporaries (one linear)",
                category=Category.TEMPORARIES,
                bytes=dequant,
                source="formulas/quant_kernels.py matmul_temporary_bytes",
            )
        )
    kv_full = cache_bytes(c, c.context, b)
    legacy = s.version < TRANSFORMERS_CACHE_CLASSES
    if c.context - c.prompt < MIN_NEW_TOKENS_TO_DECODE:  # the prefill forward makes the only new token
        grow = 0
    elif legacy:
        grow = cache_bytes(c, c.context - 1, b)
    else:
        grow = largest_layer_kv(c, c.context - 1, b) // 2
    assistant_full = _assistant_items(c, c.context, "tokens")
    decode_dequant = matmul_temporary_bytes(c.spec, s, b, c.act_bytes, prefill=False)
    decode = [
        weights,
        *buffers,
        *kernel_buffers,
        *assistant_full,
        MemoryItem(
            path=f"kv cache ({c.context} tokens x {b})",
            category=Category.KV_CACHE,
            bytes=kv_full,
            source="formulas/kv_cache.py",
        ),
        *state_items(c, b),
        *(
            []
            if static
            else [
                MemoryItem(
                    path="previous step's cache (transformers < 4.36 tuple cache)"
                    if legacy
                    else "cache growth (torch.cat copies one layer's K or V)",
                    category=Category.TEMPORARIES,
                    bytes=grow,
                    source="transformers v4.35 modeling_llama.py / generation/utils.py"
                    if legacy
                    else "transformers cache_utils.py DynamicLayer.update",
                )
            ]
        ),
        MemoryItem(
            path="decode logits (bf16 + fp32 copies)",
            category=Category.TEMPORARIES,
            bytes=b * vocab * (c.act_bytes + 4 * GENERATE_LOGIT_COPIES_FP32)
            + layer_transient_bytes(c.spec, b, c.act_bytes, s.tp),
            source="transformers generation/utils.py _sample",
        ),
    ]
    if decode_dequant:
        decode.append(
            MemoryItem(
                path=f"quantized matmul temporaries (one linear, {b} rows)",
                category=Category.TEMPORARIES,
                bytes=decode_dequant,
                source="formulas/quant_kernels.py matmul_temporary_bytes",
            )
        )
    overhead = [
        MemoryItem(
            path="CUDA context",
            category=Category.OVERHEAD,
            bytes=CUDA_CONTEXT_BYTES,
            source=CUDA_CONTEXT_SOURCE,
        ),
        MemoryItem(
            path="cuBLAS workspace",
            category=Category.OVERHEAD,
            bytes=CUBLAS_WORKSPACE_BYTES,
            source="formulas/overhead.py CUBLAS_WORKSPACE_BYTES",
        ),
    ]
    state = sum(i.bytes for i in state_items(c, b))
    load, load_notes = warmup(c.spec, s, weights)
    extra: dict[str, object] = {
        "steady_state_bytes": weights.bytes
        + kv_full
        + state
        + sum(i.bytes for i in (*assistant_full, *buffers))
    }
    resident = weights.bytes + sum(i.bytes for i in (*buffers, *kernel_buffers))
    run = growth_run(c, replay_divisions, resident) if replay_divisions is not None else None
    return EngineMemory(
        prefill=prefill,
        decode=decode,
        overhead=overhead,
        extra=extra,
        notes=draft_notes(c) + kernel_notes(s) + load_notes,
        load=load or None,
        replayed_reserved=replayed_reserved(run) if run is not None else 0,
    )


def _rope_buffer_items(c: ServingContext) -> list[MemoryItem]:
    """The release's per-layer RoPE cos/sin buffers (formulas/rope_buffers.py); [] if none."""
    version = c.setup.version
    n = rope_buffer_bytes(c.spec, version, c.context, c.act_bytes)
    row = rope_buffer_release(c.spec.model_type, version)
    if not n or row is None:
        return []
    return [
        MemoryItem(
            path="RoPE cos/sin buffers (every layer)", category=Category.BUFFERS, bytes=n, source=row.source
        )
    ]


def _assistant_items(c: ServingContext, tokens: int, what: str) -> list[MemoryItem]:
    """Assisted generation (formulas/serving/speculative.py): the assistant's weights and its own
    DynamicCache of ``tokens`` tokens (batch 1); none without a draft."""
    draft_w = draft_weights_item(c)
    if draft_w is None:
        return []
    kv = MemoryItem(
        path=f"draft kv cache ({tokens} {what}, the assistant's DynamicCache)",
        category=Category.KV_CACHE,
        bytes=draft_cache_bytes(c, tokens, c.setup.batch),
        source="formulas/serving/speculative.py",
    )
    return [draft_w, kv]
