"""Inference memory: weights + KV cache + runtime memory, per engine, and what fits on a GPU.

Engines, as people run them:

* ``hf`` (transformers ``generate``): the DynamicCache grows by ``torch.cat`` every step
  (``cache_utils.py`` ``DynamicLayer.update``). Peak is at prefill (the whole prompt's layer
  transients) or at the last decode step (full cache + one layer's cache being copied + logits).
  ``generate`` sets ``logits_to_keep=1`` (``generation/utils.py``), so prefill computes logits for
  the last position only, then copies them to fp32 (``next_token_logits ... dtype=torch.float32``).
* ``vllm``: preallocates ``gpu_memory_utilization x GPU`` minus weights, the profiled activation
  peak (one chunk of ``max_num_batched_tokens``) and non-torch memory, as a paged KV pool
  (``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``); reports how many sequences
  of ``context`` tokens fit in it.
* ``sglang``: the same with ``mem_fraction_static`` (its default chosen by GPU size:
  ``inference.sglang_mem_fraction_static``) and one-token pages; that fraction holds weights and pool.

What a request needs (weights, activations / the profiled peak, sampler buffers, the KV cache of
``batch`` sequences of ``context`` tokens, context and allocator overheads) does not depend on the GPU:
:func:`estimate_inference` reports it. Whether it fits one GPU is :func:`serving_fit`'s answer: for
vLLM/SGLang, whether the pool the engine carves out of that GPU holds the request.
* ``llamacpp``: the KV cache of ``n_ctx`` tokens and a compute buffer are allocated at load
  (``llama-context.cpp``); ``-ngl`` layers (and their KV) live on the GPU, the rest and the token
  embeddings in CPU RAM (``llama-model.cpp``: the input layer is always on the CPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from peakmem.breakdown import Band, Category, Estimate, MemoryItem, PerParamRow, Phase, PhasePeak, Verdict
from peakmem.errors import InputError
from peakmem.formulas import band as _band
from peakmem.formulas.allocator import reserved_bytes, tensor_rounding
from peakmem.formulas.kv_cache import (
    cache_kind,
    interleaved_windows,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_elements_per_token_layer,
    layer_kv_bytes,
    round_to_block,
)
from peakmem.formulas.overhead import CONTEXT_SIZES, CUBLAS_WORKSPACE_BYTES, Overheads
from peakmem.formulas.overhead import DEFAULT_CONTEXT as DEFAULT_CONTEXT_SIZE
from peakmem.formulas.recurrent_state import recurrent_state_bytes, state_bytes_per_sequence
from peakmem.formulas.weights import WeightRow, largest_quantized_linear, per_layer_weight_bytes, weight_rows
from peakmem.inference import KV_BITS, Engine, InferenceSetup, KvDtype, Scheme
from peakmem.model import ModelSpec
from peakmem.units import fmt_bytes

# CUDA context (formulas/overhead.py, the training side's table: 512 MiB with CUDA 12 lazy loading).
CUDA_CONTEXT_BYTES = CONTEXT_SIZES[DEFAULT_CONTEXT_SIZE].bytes
_DEFAULT_OVERHEADS = Overheads()
CUDA_CONTEXT_SOURCE = "formulas/overhead.py " + DEFAULT_CONTEXT_SIZE
# vLLM V1 EngineArgs defaults: max_num_batched_tokens 8192 (chunked prefill), max_num_seqs 256.
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_MAX_NUM_SEQS = 256
# llama.cpp llama_context: n_ctx padded to a multiple of 256 (GGML_PAD(n_ctx, 256)).
LLAMACPP_CTX_PAD = 256
# Default context when neither the user nor the engine fixes one: llama.cpp common.h n_ctx = 4096;
# transformers has no limit, so we use the same. vLLM/SGLang default max_model_len = the model's.
DEFAULT_CONTEXT = 4096
# generate(): bf16 logits of the kept position, their fp32 copy, and the fp32 scores the logits
# processors / softmax produce (generation/utils.py _sample).
GENERATE_LOGIT_COPIES_FP32 = 2


@dataclass(frozen=True, kw_only=True)
class _Ctx:
    """Resolved inputs shared by the engine models."""

    spec: ModelSpec
    setup: InferenceSetup
    context: int
    prompt: int
    act_bytes: int  # bytes per activation element (compute dtype)
    kv_bits: Fraction
    kv_name: str
    latent: bool
    assumptions: tuple[str, ...]


def _compute_dtype(setup: InferenceSetup) -> tuple[str, int]:
    fmt = setup.weight_format
    if fmt.scheme is Scheme.FLOAT:
        return fmt.float_dtype, 4 if fmt.float_dtype == "fp32" else 2
    if fmt.scheme in (Scheme.GPTQ, Scheme.AWQ, Scheme.GGUF):
        return "fp16", 2  # AutoAWQ / auto-gptq run in fp16; llama.cpp CUDA kernels use f16/f32
    return "bf16", 2


def _resolve(spec: ModelSpec, setup: InferenceSetup) -> _Ctx:
    notes: list[str] = []
    limit = spec.max_position_embeddings
    if setup.context is not None:
        context = setup.context
    elif setup.engine in (Engine.VLLM, Engine.SGLANG):
        context = limit
        notes.append(f"context = the model's limit {limit} (max_model_len default)")
    else:
        context = min(limit, DEFAULT_CONTEXT)
        notes.append(f"context = {context} tokens (default)")
    if context > limit:
        msg = f"context={context}: beyond the model's limit max_position_embeddings={limit}"
        if setup.strict:
            raise InputError(msg)
        notes.append(f"warning: {msg}; quality degrades unless RoPE scaling extends it")
    prompt = setup.prompt if setup.prompt is not None else context
    prompt = min(prompt, context)
    dtype_name, act_bytes = _compute_dtype(setup)
    kv = setup.kv_cache
    if kv is KvDtype.AUTO:
        kv = KvDtype.FP16 if setup.engine is Engine.LLAMACPP else KvDtype(dtype_name)
    latent = setup.mla_cache != "expanded"
    kind = cache_kind(spec, latent=latent)
    if kind != "standard":
        if setup.mla_cache == "auto" and setup.engine is Engine.HF:
            notes.append(
                "MLA cache: transformers 5.x caches the latent (modeling_deepseek_v3.py updates the cache "
                "with kv_nope, k_rot); transformers 4.x cached expanded K/V: mla_cache='expanded'"
            )
        notes.append(f"MLA cache kind: {kind}")
    if any(g.layer.attention.sliding_window for g in spec.groups) and setup.engine is not Engine.LLAMACPP:
        notes.append("sliding-window layers keep at most their window of tokens")
    if setup.kv_cache in (KvDtype.INT8, KvDtype.INT4) and setup.engine is Engine.HF:
        notes.append(
            "quantized KV cache: the residual_length (128) newest tokens of QuantizedCache stay 16-bit"
        )
    heads = spec.first_layer.attention.num_heads
    if heads % setup.tp:
        raise InputError(f"tp={setup.tp}: must divide num_attention_heads={heads}")
    return _Ctx(
        spec=spec,
        setup=setup,
        context=context,
        prompt=prompt,
        act_bytes=act_bytes,
        kv_bits=KV_BITS[kv],
        kv_name=kv.value,
        latent=latent,
        assumptions=tuple(notes),
    )


# --- pieces ---------------------------------------------------------------------------------------
def _shard(nbytes: int, tp: int) -> int:
    return -(-nbytes // tp)


def sharded_weight_bytes(rows: tuple[WeightRow, ...], tp: int) -> int:
    """Weights on one tensor-parallel rank: linears, embeddings, head and experts split ``tp`` ways
    (Megatron-style column/row parallel, vocab-parallel embedding); norms and routers replicated."""
    total = 0
    for r in rows:
        replicated = r.component in ("norms", "router") or "norm" in r.name
        total += r.bytes if replicated or tp == 1 else _shard(r.bytes, tp)
    return total


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


def _per_param(spec: ModelSpec, rows: tuple[WeightRow, ...]) -> tuple[PerParamRow, ...]:
    by_storage: dict[str, tuple[int, int]] = {}
    for r in rows:
        p, b = by_storage.get(r.storage, (0, 0))
        by_storage[r.storage] = (p + r.params, b + r.bytes)
    return tuple(
        PerParamRow(
            tensor="weights",
            dtype=storage,
            bytes_per_param=b / p if p else 0.0,
            bytes=b,
            params=p,
            category=Category.PARAMETERS,
            source="formulas/weights.py",
        )
        for storage, (p, b) in sorted(by_storage.items(), key=lambda kv: -kv[1][1])
    )


def _phase(phase: Phase, items: list[MemoryItem]) -> PhasePeak:
    return PhasePeak(phase=phase, bytes=sum(i.bytes for i in items), items=tuple(items))


def _kv(c: _Ctx, tokens: int, batch: int, block: int = 1) -> int:
    return kv_cache_bytes(
        c.spec, tokens=tokens, batch=batch, bits=c.kv_bits, latent=c.latent, tp=c.setup.tp, block_size=block
    )


def _largest_layer_kv(c: _Ctx, tokens: int, batch: int) -> int:
    return max(
        layer_kv_bytes(
            g.layer.attention, tokens=tokens, batch=batch, bits=c.kv_bits, latent=c.latent, tp=c.setup.tp
        )
        for g in c.spec.groups
    )


def _state_items(c: _Ctx, batch: int) -> list[MemoryItem]:
    """The recurrent state of SSM / linear-attention blocks for ``batch`` sequences, as its own item
    (none for models without such blocks): constant per sequence, whatever the context."""
    nbytes = recurrent_state_bytes(c.spec, batch=batch, act_bytes=c.act_bytes, tp=c.setup.tp)
    if not nbytes:
        return []
    return [
        MemoryItem(
            path=f"recurrent state (SSM / linear attention, {batch} sequences)",
            category=Category.KV_CACHE,
            bytes=nbytes,
            source="formulas/recurrent_state.py; transformers cache_utils.py LinearAttentionLayer",
        )
    ]


# --- engines --------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Result:
    prefill: list[MemoryItem]
    decode: list[MemoryItem]
    overhead: list[MemoryItem]  # above allocated: CUDA context, engine reserve
    extra: dict[str, object]
    notes: tuple[str, ...] = ()


def _weights_item(c: _Ctx, rows: tuple[WeightRow, ...]) -> MemoryItem:
    fmt = c.setup.weight_format
    return MemoryItem(
        path=f"weights ({fmt.name})",
        category=Category.PARAMETERS,
        bytes=sharded_weight_bytes(rows, c.setup.tp),
        source="formulas/weights.py",
    )


def dequant_temporary_bytes(c: _Ctx, tokens: int) -> int:
    """transformers' quantized linears for a multi-token input: bitsandbytes ``matmul_4bit``
    dequantizes the weight to the compute dtype (bitsandbytes/autograd/_functions.py, the gemv
    kernel only for one token); AutoAWQ GEMM (``WQLinear_GEMM``, >= 1024 tokens) and exllama v2
    (GPTQ) reconstruct it too. LLM.int8 (``int8_linear_matmul``) keeps the int8 input and an int32
    output instead. One linear at a time: the largest."""
    fmt = c.setup.weight_format
    in_f, out_f = largest_quantized_linear(c.spec, fmt)
    if tokens <= 1 or not in_f:
        return 0
    out_f = -(-out_f // c.setup.tp)
    if fmt.scheme is Scheme.BNB_INT8:
        return tokens * (in_f + out_f * 4)
    if fmt.scheme in (Scheme.BNB_4BIT, Scheme.GPTQ, Scheme.AWQ):
        return in_f * out_f * c.act_bytes
    return 0


def _hf(c: _Ctx, rows: tuple[WeightRow, ...]) -> _Result:
    s, b = c.setup, c.setup.batch
    weights = _weights_item(c, rows)
    chunk = min(c.prompt, s.prefill_chunk) if s.prefill_chunk else c.prompt
    vocab = -(-c.spec.vocab_size // s.tp)
    kept = chunk if s.keep_all_logits else 1
    logits = b * kept * vocab * c.act_bytes + b * vocab * 4 * GENERATE_LOGIT_COPIES_FP32
    prefill_layer = layer_transient_bytes(c.spec, b * chunk, c.act_bytes, s.tp)
    kv_prompt = _kv(c, c.prompt, b)
    dequant = dequant_temporary_bytes(c, b * chunk)
    prefill = [
        weights,
        MemoryItem(
            path=f"kv cache ({c.prompt} prompt tokens x {b})",
            category=Category.KV_CACHE,
            bytes=kv_prompt,
            source="formulas/kv_cache.py",
        ),
        *_state_items(c, b),
        MemoryItem(
            path=f"prefill layer temporaries ({b} x {chunk} tokens)",
            category=Category.ACTIVATIONS,
            bytes=max(prefill_layer, logits),
            source="formulas/serving.py layer_transient_bytes",
        ),
    ]
    if dequant:
        prefill.append(
            MemoryItem(
                path="quantized matmul temporaries (one linear)",
                category=Category.TEMPORARIES,
                bytes=dequant,
                source="formulas/serving.py dequant_temporary_bytes",
            )
        )
    kv_full = _kv(c, c.context, b)
    grow = _largest_layer_kv(c, c.context - 1, b) if c.context > c.prompt else 0
    decode = [
        weights,
        MemoryItem(
            path=f"kv cache ({c.context} tokens x {b})",
            category=Category.KV_CACHE,
            bytes=kv_full,
            source="formulas/kv_cache.py",
        ),
        *_state_items(c, b),
        MemoryItem(
            path="cache growth (torch.cat copies one layer)",
            category=Category.TEMPORARIES,
            bytes=grow,
            source="transformers cache_utils.py DynamicLayer.update",
        ),
        MemoryItem(
            path="decode logits (bf16 + fp32 copies)",
            category=Category.TEMPORARIES,
            bytes=b * vocab * (c.act_bytes + 4 * GENERATE_LOGIT_COPIES_FP32)
            + layer_transient_bytes(c.spec, b, c.act_bytes, s.tp),
            source="transformers generation/utils.py _sample",
        ),
    ]
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
    state = sum(i.bytes for i in _state_items(c, b))
    extra: dict[str, object] = {"steady_state_bytes": weights.bytes + kv_full + state}
    return _Result(prefill=prefill, decode=decode, overhead=overhead, extra=extra)


def _paged(c: _Ctx, rows: tuple[WeightRow, ...]) -> _Result:
    """vLLM / SGLang: a preallocated paged pool; without a GPU size, the cache the batch needs."""
    s, b = c.setup, c.setup.batch
    block = s.effective_block_size
    weights = _weights_item(c, rows)
    chunk = s.prefill_chunk or VLLM_MAX_NUM_BATCHED_TOKENS
    vocab = -(-c.spec.vocab_size // s.tp)
    act = layer_transient_bytes(c.spec, chunk, c.act_bytes, s.tp, fused=True)
    # profile_run's sampler warm-up: fp32 logits and probabilities for max_num_seqs sequences
    sampler = VLLM_MAX_NUM_SEQS * vocab * 4 * 2
    activations = max(act, sampler)
    # vLLM's hybrid KV-cache manager keeps each sequence's SSM / linear-attention state in the same
    # pool (vllm/v1/core/kv_cache_utils.py MambaSpec): a sequence needs its KV and its state
    state_per_seq = state_bytes_per_sequence(c.spec, act_bytes=c.act_bytes, tp=s.tp)
    per_seq = _kv(c, c.context, 1, block) + state_per_seq
    needed = per_seq * b
    notes: list[str] = []
    extra: dict[str, object] = {
        "kv_bytes_per_sequence": per_seq,
        "kv_needed_bytes": needed,
        "prefill_chunk_tokens": chunk,
    }
    if s.gpu_bytes is not None:
        # What the engine preallocates on that GPU; the request's own bytes (below) do not depend on it.
        budget = int(s.gpu_bytes * s.memory_fraction(s.gpu_bytes))
        if s.engine is Engine.SGLANG:
            # SGLang: mem_fraction_static x GPU holds weights + KV pool only; activations and CUDA
            # graphs use the rest (python/sglang/srt/model_executor/model_runner.py profile_max_num_token).
            pool = budget - weights.bytes
        else:
            # vLLM: requested memory minus non-KV memory (weights, profiled activation peak, non-torch)
            pool = budget - weights.bytes - activations - CUDA_CONTEXT_BYTES
        pool = max(pool, 0)
        concurrent = pool // per_seq if per_seq else 0
        extra.update(
            kv_pool_bytes=pool,
            kv_pool_blocks=pool // max(1, _kv(c, block, 1, block)),
            max_concurrent_sequences=concurrent,
            memory_budget_bytes=budget,
            memory_fraction=s.memory_fraction(s.gpu_bytes),
        )
        if pool < per_seq:
            notes.append(
                f"does not start: the KV pool ({pool} B) cannot hold one {c.context}-token sequence "
                f"({per_seq} B); lower context (max_model_len) or raise gpu_memory_utilization"
            )
        elif concurrent > VLLM_MAX_NUM_SEQS and s.engine is Engine.VLLM:
            notes.append(
                f"the KV pool holds {concurrent} sequences; vLLM runs at most max_num_seqs="
                f"{VLLM_MAX_NUM_SEQS} at once unless raised"
            )
        elif concurrent < b:
            notes.append(f"only {concurrent} sequences of {c.context} tokens fit; the rest wait in the queue")
    notes.append(
        f"{s.engine.value} preallocates a KV pool of gpu_memory_utilization x GPU less the rest; the KV "
        "cache shown is what the batch needs (it fits when the pool holds it: serving_fit)"
    )
    kv_item = MemoryItem(
        path=f"kv cache ({c.context} tokens x {b}, {block}-token blocks)",
        category=Category.KV_CACHE,
        bytes=needed - state_per_seq * b,
        source="formulas/kv_cache.py",
    )
    state_items = _state_items(c, b)
    act_item = MemoryItem(
        path=f"activations ({chunk}-token prefill chunk)",
        category=Category.ACTIVATIONS,
        bytes=activations,
        source="formulas/serving.py layer_transient_bytes",
    )
    decode_tmp = MemoryItem(
        path="decode temporaries",
        category=Category.TEMPORARIES,
        bytes=layer_transient_bytes(c.spec, b, c.act_bytes, s.tp, fused=True) + b * vocab * 8,
        source="formulas/serving.py",
    )
    overhead = [
        MemoryItem(
            path="CUDA context + non-torch",
            category=Category.OVERHEAD,
            bytes=CUDA_CONTEXT_BYTES,
            source=CUDA_CONTEXT_SOURCE,
        )
    ]
    extra["steady_state_bytes"] = weights.bytes + needed
    notes.append("CUDA graph capture memory (typically a few hundred MiB) is not modelled")
    return _Result(
        prefill=[weights, kv_item, *state_items, act_item],
        decode=[weights, kv_item, *state_items, decode_tmp],
        overhead=overhead,
        extra=extra,
        notes=tuple(notes),
    )


def _llamacpp(c: _Ctx, rows: tuple[WeightRow, ...]) -> _Result:
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
    # llama.cpp's recurrent memory (llama-memory-recurrent.cpp): one conv + SSM state per sequence,
    # allocated at load beside the KV cache (all layers counted on the GPU)
    items = [weights, kv_item, *_state_items(c, b), comp]
    return _Result(prefill=items, decode=list(items), overhead=overhead, extra=extra, notes=notes)


# --- public API -----------------------------------------------------------------------------------
def estimate_inference(
    spec: ModelSpec, setup: InferenceSetup, *, overheads: Overheads | None = None
) -> Estimate:
    """Memory of one GPU (one tensor-parallel rank) serving ``spec`` as ``setup`` describes.
    ``overheads``: the allocator's fragmentation, expandable segments and a calibrated profile (the
    CUDA context of a serving job stays :data:`CUDA_CONTEXT_BYTES`)."""
    ov = overheads or _DEFAULT_OVERHEADS
    c = _resolve(spec, setup)
    rows = weight_rows(spec, setup.weight_format)
    if setup.engine is Engine.HF:
        r = _hf(c, rows)
    elif setup.engine is Engine.LLAMACPP:
        r = _llamacpp(c, rows)
    else:
        r = _paged(c, rows)
    prefill, decode = _phase(Phase.PREFILL, r.prefill), _phase(Phase.DECODE, r.decode)
    peak = prefill if prefill.bytes >= decode.bytes else decode
    overhead = sum(i.bytes for i in r.overhead)
    # Caching allocator (formulas/allocator.py): weights and a preallocated cache are resident;
    # activations, temporaries and transformers' growing cache (re-allocated by torch.cat every
    # step) churn and carry the fragmentation slack.
    churn_categories = {Category.ACTIVATIONS, Category.TEMPORARIES}
    if setup.engine is Engine.HF:
        churn_categories.add(Category.KV_CACHE)
    churn = sum(i.bytes for i in peak.items if i.category in churn_categories)
    resident = peak.bytes - churn
    reserved = reserved_bytes(
        resident=resident,
        resident_rounding=tensor_rounding(
            tuple(i.bytes for i in peak.items if i.category not in churn_categories)
        ),
        churn=churn,
        fragmentation=ov.fraction,
        expandable=ov.expandable_segments,
    )
    device_total = reserved + overhead
    kind = cache_kind(spec, latent=c.latent)
    extra: dict[str, object] = {
        "engine": setup.engine.value,
        "kv_bytes_per_token": kv_bytes_per_token(spec, bits=c.kv_bits, latent=c.latent, tp=setup.tp),
        "recurrent_state_bytes_per_sequence": state_bytes_per_sequence(
            spec, act_bytes=c.act_bytes, tp=setup.tp
        ),
        "kv_cache_kind": kind,
        "kv_cache_dtype": c.kv_name,
        "context": c.context,
        "prompt": c.prompt,
        "tp": setup.tp,
        "per_rank": setup.tp > 1,
        "weight_bytes": sum(rw.bytes for rw in rows),
        **r.extra,
    }
    assumptions = (
        *c.assumptions,
        *r.notes,
        f"weights: {setup.weight_format.name}; KV cache {c.kv_name}; SDPA/flash attention (no score matrix)",
    )
    state_seq = state_bytes_per_sequence(spec, act_bytes=c.act_bytes, tp=setup.tp)
    if state_seq:
        assumptions += (
            f"recurrent state (SSM / linear-attention blocks): {fmt_bytes(state_seq)} per sequence x "
            f"{setup.batch} = {fmt_bytes(state_seq * setup.batch)}, whatever the context, counted with the "
            "KV cache (its own item); conv state in the compute dtype, scan state in fp32 as transformers "
            "keeps it",
        )
    if setup.tp > 1:
        assumptions += (
            f"tensor parallel {setup.tp}: linears, embeddings and KV heads split per rank; norms "
            "replicated; NCCL buffers not modelled",
        )
    return Estimate(
        band=_serving_band(setup, peak, reserved, device_total, churn, ov, extra),
        method="analytic",
        job="infer",
        model_name=spec.name,
        params=spec.params,
        trainable_params=0,
        per_param=_per_param(spec, rows),
        items=peak.items,
        phases=(prefill, decode),
        peak_phase=peak.phase,
        peak_allocated_bytes=peak.bytes,
        peak_reserved_bytes=reserved,
        device_total_bytes=device_total,
        assumptions=assumptions,
        setup=setup.echo(),
        extra=extra,
    )


POOLED_ENGINES = (Engine.VLLM, Engine.SGLANG)


def _serving_band(
    setup: InferenceSetup, peak: PhasePeak, reserved: int, device_total: int, churn: int, ov: Overheads,
    extra: dict[str, object],
) -> Band:  # fmt: skip
    """The band of a serving estimate (formulas/band.py): the formulas' residual, HF generate's decode
    transients, fragmentation of the churn, the CUDA context, NCCL for tensor parallelism, CUDA graphs
    for the engines that capture them."""
    terms = [
        _band.residual_term(peak.bytes),
        _band.context_term(CUDA_CONTEXT_BYTES, assumed=True, profile=ov.profile),
        _band.fragmentation_term(
            churn=churn, fragmentation=ov.fraction, profile=ov.profile, expandable=ov.expandable_segments
        ),
    ]
    steady = extra.get("steady_state_bytes")
    if setup.engine is Engine.HF and isinstance(steady, int):
        terms.append(_band.transients_term(max(0, peak.bytes - steady)))
    if setup.tp > 1:
        terms.append(_band.nccl_term(communicators=1, likely_bytes=0))
    if setup.engine in POOLED_ENGINES:
        terms.append(_band.cuda_graphs_term())
    return _band.build_band(allocated=peak.bytes, reserved=reserved, device_total=device_total,
                            terms=tuple(terms))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ServingFit:
    """Whether a serving job fits one GPU (one tensor-parallel rank) of ``capacity_bytes``.

    ``needed_bytes`` is what the request needs (weights, activations / profiled peak, sampler
    buffers, KV cache of ``batch`` sequences of ``context`` tokens, context and allocator overheads):
    the estimate's device total, the same on every GPU. Engines that preallocate a KV pool (vLLM,
    SGLang) fit when the pool they carve out of ``gpu_memory_utilization x GPU`` holds the request
    (``max_concurrent >= batch``) and the request fits the GPU; the others when ``needed_bytes`` fits.
    """

    needed_bytes: int
    capacity_bytes: int
    fits: bool
    headroom_bytes: int  # pooled engines: the smaller of the pool's spare and the GPU's
    max_concurrent: int | None  # pooled engines: sequences of ``context`` tokens the pool holds
    pool_bytes: int | None  # pooled engines: the KV pool on that GPU
    budget_bytes: int | None  # pooled engines: the engine's fraction x GPU (what nvidia-smi shows)
    fraction: float | None  # pooled engines: gpu_memory_utilization / mem_fraction_static used
    kv_needed_bytes: int | None  # pooled engines: the KV cache of the request (batch x context)
    batch: int
    context: int
    engine: str
    estimate: Estimate

    def verdict(self, gpu: str) -> ServingVerdict:
        band = self.estimate.band
        high = band.device_total.high if band is not None else None
        return ServingVerdict(gpu=gpu, capacity_bytes=self.capacity_bytes, needed_bytes=self.needed_bytes,
                              high_bytes=high, serving=self)  # fmt: skip

    def json(self) -> dict[str, object]:
        return {
            "needed_bytes": self.needed_bytes, "capacity_bytes": self.capacity_bytes, "fits": self.fits,
            "headroom_bytes": self.headroom_bytes, "max_concurrent": self.max_concurrent,
            "kv_pool_bytes": self.pool_bytes, "memory_budget_bytes": self.budget_bytes,
            "kv_needed_bytes": self.kv_needed_bytes, "memory_fraction": self.fraction,
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ServingVerdict(Verdict):
    """A :class:`Verdict` whose answer is :func:`serving_fit`'s (a pooled engine's pool, not bytes alone)."""

    serving: ServingFit

    @property
    def fits(self) -> bool:
        return self.serving.fits

    @property
    def headroom_bytes(self) -> int:
        return self.serving.headroom_bytes


def serving_fit(
    spec: ModelSpec, setup: InferenceSetup, capacity_bytes: int, *, overheads: Overheads | None = None
) -> ServingFit:
    """The one verdict of serving ``setup`` on a GPU of ``capacity_bytes`` (``infer`` and ``fit --infer``)."""
    if setup.gpu_bytes != capacity_bytes:
        setup = _with(setup, gpu_bytes=capacity_bytes)
    est = estimate_inference(spec, setup, overheads=overheads)
    needed = est.device_total_bytes
    context = _int(est, "context")
    fits, headroom = needed <= capacity_bytes, capacity_bytes - needed
    pool: int | None = None
    conc: int | None = None
    budget: int | None = None
    kv_needed: int | None = None
    fraction: float | None = None
    if setup.engine in POOLED_ENGINES:
        fraction = setup.memory_fraction(capacity_bytes)
        pool, conc = _int(est, "kv_pool_bytes"), _int(est, "max_concurrent_sequences")
        budget, kv_needed = _int(est, "memory_budget_bytes"), _int(est, "kv_needed_bytes")
        fits = fits and conc >= setup.batch
        headroom = min(headroom, pool - kv_needed)
    return ServingFit(
        needed_bytes=needed, capacity_bytes=capacity_bytes, fits=fits, headroom_bytes=headroom,
        max_concurrent=conc, pool_bytes=pool, budget_bytes=budget, kv_needed_bytes=kv_needed,
        fraction=fraction,
        batch=setup.batch, context=context, engine=setup.engine.value, estimate=est,
    )  # fmt: skip


def _int(est: Estimate, key: str) -> int:
    value = est.extra[key]
    assert isinstance(value, int), key
    return value


def _fits(spec: ModelSpec, setup: InferenceSetup, gpu_bytes: int) -> bool:
    return serving_fit(spec, setup, gpu_bytes).fits


def _with(setup: InferenceSetup, **changes: object) -> InferenceSetup:
    fields = {f: getattr(setup, f) for f in setup.__dataclass_fields__}
    fields.update(changes)
    return InferenceSetup(**fields)


def max_concurrent(spec: ModelSpec, setup: InferenceSetup, gpu_bytes: int) -> int:
    """Most sequences of ``setup.context`` tokens that run at once on a GPU of ``gpu_bytes``
    (per rank with tensor parallelism); 0 when not even one fits."""
    base = _with(setup, gpu_bytes=gpu_bytes, batch=1)
    if setup.engine in (Engine.VLLM, Engine.SGLANG):
        conc = estimate_inference(spec, base).extra.get("max_concurrent_sequences", 0)
        return conc if isinstance(conc, int) else 0
    return _largest(lambda n: _fits(spec, _with(base, batch=n), gpu_bytes), 1, 1 << 20)


def max_context(spec: ModelSpec, setup: InferenceSetup, gpu_bytes: int) -> int:
    """Longest context (prompt + generated, up to the model's limit) for ``setup.batch`` sequences
    that fits on a GPU of ``gpu_bytes``; 0 when not even one token fits."""
    limit = spec.max_position_embeddings
    base = _with(setup, gpu_bytes=gpu_bytes, prompt=None, strict=False)
    return _largest(lambda n: _fits(spec, _with(base, context=n), gpu_bytes), 1, limit)


def _largest(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest n in [lo, hi] with ok(n) true, assuming ok is monotone decreasing; 0 if none."""
    if not ok(lo):
        return 0
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
