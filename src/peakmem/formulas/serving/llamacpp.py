"""llama.cpp (engine ``llamacpp``).

The KV cache of ``n_ctx`` tokens and a compute buffer are allocated at load (``llama-context.cpp``);
``-ngl`` layers (and their KV) live on the GPU, the rest and the token embeddings in CPU RAM
(``llama-model.cpp``: the input layer is always on the CPU).
"""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas.kv_cache import interleaved_windows, layer_kv_bytes, round_to_block
from peakmem.formulas.serving.context import (
    CUDA_CONTEXT_BYTES,
    CUDA_CONTEXT_SOURCE,
    EngineMemory,
    ServingContext,
    state_items,
)
from peakmem.formulas.weights import WeightRow, per_layer_weight_bytes

# llama.cpp llama_context: n_ctx padded to a multiple of 256 (GGML_PAD(n_ctx, 256)).
LLAMACPP_CTX_PAD = 256


def llamacpp_memory(c: ServingContext, rows: tuple[WeightRow, ...]) -> EngineMemory:
    s, b = c.setup, c.setup.batch
    n = c.spec.num_layers
    ngl = n + 1 if s.n_gpu_layers is None else min(s.n_gpu_layers, n + 1)
    gpu_layers = min(ngl, n)
    output_on_gpu = ngl > n  # llama.cpp: -ngl n_layer+1 also offloads the output layer
    outer_names = {t.name: t.component for t in c.spec.outer}
    # llama-model.cpp: -ngl N offloads the last N repeating layers (i_gpu_start = n_layer - N)
    layer_sizes = per_layer_weight_bytes(c.spec, s.weight_format)
    layers_bytes = sum(layer_sizes)
    gpu_layer_bytes = sum(layer_sizes[n - gpu_layers :])
    embd = sum(r.bytes for r in rows if outer_names.get(r.name) == "embeddings")
    head = sum(r.bytes for r in rows if r.name in outer_names and outer_names[r.name] != "embeddings")
    if c.spec.tie_word_embeddings and output_on_gpu:
        head += embd  # tied output: the GPU needs its own copy of the matrix
    gpu_w = gpu_layer_bytes + (head if output_on_gpu else 0)
    cpu_w = embd + layers_bytes - gpu_layer_bytes + (0 if output_on_gpu else head)
    n_ctx = round_to_block(c.context * b, LLAMACPP_CTX_PAD)
    # llama.cpp caps the cache at the window only for interleaved local/global models (the iSWA
    # cache, llama-kv-cache-iswa.cpp: Gemma 2/3, Cohere2); uniform-window models (Mistral-7B v0.1,
    # converted as arch "llama") keep all n_ctx tokens.
    windows = interleaved_windows(c.spec)
    kv_layers = [
        layer_kv_bytes(
            layer.attention, tokens=n_ctx, batch=1, bits=c.kv_bits, latent=c.latent, windows=windows
        )
        for layer in c.spec.layers()
    ]
    kv_all = sum(kv_layers)
    kv_gpu = sum(kv_layers[n - gpu_layers :])
    ub = min(s.n_ubatch, c.prompt * b)
    # CUDA compute buffer sized by graph reservation for one ubatch with every position output:
    # fp32 logits [n_vocab, n_ubatch] plus the normed hidden state feeding the head (flash attention on).
    compute = (
        ub * 4 * (c.spec.vocab_size + c.spec.hidden_size)
        if output_on_gpu
        else ub * 4 * c.spec.hidden_size * 4
    )
    weights = MemoryItem(
        path=f"weights ({s.weight_format.name}, {gpu_layers}/{n} layers on GPU)",
        category=Category.PARAMETERS,
        bytes=gpu_w,
        source="formulas/weights.py gguf_rows",
    )
    kv_item = MemoryItem(
        path=f"kv cache (n_ctx {n_ctx}, {gpu_layers} layers)",
        category=Category.KV_CACHE,
        bytes=kv_gpu,
        source="formulas/kv_cache.py; llama-kv-cache.cpp",
    )
    comp = MemoryItem(
        path=f"compute buffer (n_ubatch {ub})",
        category=Category.ACTIVATIONS,
        bytes=compute,
        source="llama-context.cpp graph_reserve",
    )
    overhead = [
        MemoryItem(
            path="CUDA context",
            category=Category.OVERHEAD,
            bytes=CUDA_CONTEXT_BYTES,
            source=CUDA_CONTEXT_SOURCE,
        )
    ]
    cpu = cpu_w + kv_all - kv_gpu
    extra: dict[str, object] = {
        "gpu_layers": gpu_layers,
        "output_on_gpu": output_on_gpu,
        "cpu_ram_bytes": cpu,
        "cpu_weight_bytes": cpu_w,
        "cpu_kv_cache_bytes": kv_all - kv_gpu,
        "n_ctx": n_ctx,
        "steady_state_bytes": gpu_w + kv_gpu,
    }
    notes = (
        "llama.cpp keeps the token embeddings in CPU RAM and allocates KV and compute buffers at load",
        f"sliding windows {'cap' if windows else 'do not cap'} the llama.cpp KV cache (iSWA cache only for "
        "interleaved local/global layers)",
        "flash attention assumed (no n_ctx x n_ubatch score matrix in the compute buffer)",
    )
    # llama.cpp's recurrent memory (llama-memory-recurrent.cpp): one conv (d_conv - 1 inputs) + SSM
    # state per sequence, both fp32 (formulas/recurrent_state.py engine_state), allocated at load beside
    # the KV cache (all layers counted on the GPU)
    items = [weights, kv_item, *state_items(c, b), comp]
    return EngineMemory(prefill=items, decode=list(items), overhead=overhead, extra=extra, notes=notes)
