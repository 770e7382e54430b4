"""Lit-GPT's ``generate/base.py`` (engine ``litgpt``): a KV cache preallocated for the whole request, every
prompt position's logits, and Lightning Fabric's bitsandbytes quantization of every Linear, the head included.

Read at the commits the published rows ran (Lit-GPT@8641822b and @982abcbc, both pinning
lightning@71aed751 in requirements.txt; bitsandbytes 0.41.1, 18e827d6) and at litgpt's 2025-26 releases:

* The cache: ``main`` sets ``model.max_seq_length = prompt + max_new_tokens`` and ``set_kv_cache(batch_size)``
  under ``fabric.init_tensor()`` (the precision's dtype: Fabric's ``Strategy.tensor_init_context`` enters
  ``precision.init_context()``, ``_DtypeContextManager(dtype)`` for ``BitsandbytesPrecision``). Each block's
  ``KVCache`` is two ``torch.zeros`` of ``(batch, heads, max_seq_length, head_size)`` (lit_gpt/model.py
  ``build_kv_cache``): ``heads = 1 if n_query_groups == 1 else n_head`` in Lit-GPT 2023 and litgpt before
  0.5.5 (a grouped-query model caches its keys and values expanded to every query head), ``n_query_groups``
  from litgpt 0.5.5 (fabf765b "Drop interleave placement in QKV matrix (#1013)"). ``set_kv_cache`` also
  builds ``mask_cache``, a bool ``max_seq_length x max_seq_length`` tril, and ``max_seq_length`` rebuilds the
  RoPE ``cos`` / ``sin`` (``max_seq_length x rope_n_elem`` each, the default dtype).
* The head: ``GPT.forward`` returns ``self.lm_head(x)`` over every position it is given (no
  ``logits_to_keep``); ``generate`` then takes ``logits[0, -1] / temperature``, the top-k mask and the
  softmax (the compute dtype, no fp32 copy).
* Quantization (``--quantize bnb.nf4|bnb.nf4-dq|bnb.fp4|bnb.fp4-dq|bnb.int8``): ``BitsandbytesPrecision(
  quantize[4:], dtype)`` with no ``ignore_modules`` (also litgpt/generate/base.py at litgpt HEAD 2685705),
  so every ``torch.nn.Linear``, ``lm_head`` included, is a bitsandbytes Linear (:data:`qlora.SRC_FABRIC_BNB`,
  ``QuantConfig.quantize_head``); 4-bit weights are quantized from ``weight.to(torch.half)`` (``QuantState``
  dtype fp16: ``QuantConfig.state_dtype``); int8 needs ``dtype=torch.float16`` (the plugin raises
  otherwise: the compute dtype is fp16, formulas/serving/context.py).
* The load (inside ``max_memory_allocated`` since the process started):
  ``fabric.init_module(empty_init=True)`` builds the model on the GPU, each Linear quantizing its empty
  weight as it is made; then ``load_checkpoint``
  (``model.load_state_dict(lazy_load(path))``) runs the plugin's ``_quantize_on_load_hook`` per Linear, in
  module order (``lm_head`` is registered before ``transformer``): the CPU tensor copied to the GPU as fp16
  (``weight.contiguous().to(device="cuda", dtype=torch.half)``; the dtype conversion runs on the CPU, ATen
  ``copy_`` across devices), quantized next to the layer's current quantized weight, which is freed when
  the new one replaces it. 4-bit: ``quantize_4bit`` writes the packed weight and its absmax; int8:
  ``bnb.functional.double_quant(B)`` writes ``CB`` and ``CBt`` (int8, out x in each) and two fp32 scale
  vectors before ``del CBt``. So the load holds every quantized weight plus, for the largest Linear, its
  fp16 copy and the new quantized outputs (:func:`load_transient_bytes`). Building the model costs no
  more: each Linear's 16-bit weight, its fp16 copy and the outputs exist only while the Linears after it do
  not (the head is built first, alone).
* Prefill (``T`` > 1 rows) in 4-bit: ``matmul_4bit`` takes ``MatMul4Bit``: ``F.dequantize_4bit(B,
  state).to(A.dtype)``: an fp16 weight and its bf16 copy alive together
  (:func:`peakmem.formulas.qlora.dequantized_weight_bytes`), the head's the largest; decode at batch 1 runs
  ``gemv_4bit`` (no dequantization; bitsandbytes 0.41.1 autograd/_functions.py ``matmul_4bit``). int8
  (bitsandbytes 0.41.1 ``MatMul8bitLt.forward`` / ``Linear8bitLt.forward``): each layer's first forward
  transforms ``state.CB`` into ``state.CxB`` (col_ampere / col_turing) and only then deletes ``CB``: one
  layer's int8 weight twice (:func:`first_forward_bytes`), less than the load's transient.

Not modelled: the col_ampere / col_turing padding of ``CxB`` (rows and columns to 32), the outlier
columns ``MatMul8bitLt`` keeps per layer (``state.subB``, data-dependent), Lit-GPT's FSDP / multi-device
generate and its ``gptq.int4`` path, and MoE routers (an ``nn.Linear`` in litgpt's ``LLaMAMoE``, kept
16-bit here).
"""

from __future__ import annotations

import math
from dataclasses import replace

from peakmem.adapters import QuantConfig
from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas.kv_cache import layer_kv_bytes
from peakmem.formulas.overhead import CUBLAS_WORKSPACE_BYTES
from peakmem.formulas.profiles import SRC_LITGPT_UNTIED, litgpt_spec
from peakmem.formulas.qlora import FP16, FP32, base_rows, dequantized_weight_bytes, is_quantized
from peakmem.formulas.quant_kernels import int8_matmul_bytes
from peakmem.formulas.serving.context import (
    CUDA_CONTEXT_BYTES,
    CUDA_CONTEXT_SOURCE,
    EngineMemory,
    ServingContext,
    weights_item,
)
from peakmem.formulas.serving.forward import layer_transient_bytes
from peakmem.formulas.weights import WeightRow, bnb_4bit_bytes, weight_rows
from peakmem.inference import litgpt_release
from peakmem.model import Attention, ModelSpec
from peakmem.releases import Release
from peakmem.weight_formats import Scheme

SRC_GENERATE = "Lit-GPT generate/base.py@982abcbc, lit_gpt/model.py (KVCache, set_kv_cache)"
SRC_FABRIC = "lightning@71aed751 fabric/plugins/precision/bitsandbytes.py (_quantize_on_load_hook)"
# litgpt 0.5.5 (fabf765b, 2024-12-26, #1013) caches n_query_groups heads; before, n_head unless MQA
LITGPT_GROUPED_CACHE: Release = (0, 5, 5)
# generate(): logits[0, -1] / temperature, the top-k torch.where and the softmax, one vocab row each
SAMPLER_VOCAB_ROWS = 3
MASK_BYTES = 1  # mask_cache: torch.bool
# bitsandbytes 0.41.1 double_quant: CB and CBt (int8 each) alive until ``del CBt``; fp32 row and column scales
INT8_DOUBLE_QUANT_COPIES = 2


def litgpt_quant(c: ServingContext) -> QuantConfig | None:
    """The bitsandbytes base Fabric's plugin makes of ``c``'s weights (None: a float format)."""
    fmt = c.setup.weight_format
    if fmt.scheme not in (Scheme.BNB_4BIT, Scheme.BNB_INT8):
        return None
    quant = QuantConfig(quant=fmt.name.removesuffix("-dq"), double_quant=fmt.double_quant,
                        float_dtype=c.compute_dtype, quantize_head=True, state_dtype="fp16",
                        expert_linears=True)  # fmt: skip
    return replace(quant, blocksize=fmt.group_size) if fmt.scheme is Scheme.BNB_4BIT else quant


def litgpt_rows(c: ServingContext) -> tuple[WeightRow, ...]:
    """The weights as Lit-GPT holds them: its own head (untied), every Linear quantized, the head too
    (:func:`qlora.base_rows`)."""
    quant, spec = litgpt_quant(c), litgpt_spec(c.spec)
    return weight_rows(spec, c.setup.weight_format) if quant is None else base_rows(spec, quant)


def cached_heads(att: Attention, release: Release) -> int:
    """Key / value heads Lit-GPT's KVCache holds for one layer (module docstring)."""
    if att.num_kv_heads == 1 or release >= LITGPT_GROUPED_CACHE:
        return att.num_kv_heads
    return att.num_heads


def litgpt_cache_bytes(c: ServingContext, tokens: int, batch: int) -> int:
    """Lit-GPT's KV cache of ``batch`` sequences of ``tokens`` tokens (:func:`cached_heads` per layer)."""
    release = litgpt_release(c.setup)
    total = 0
    for g in c.spec.groups:
        att = replace(g.layer.attention, num_kv_heads=cached_heads(g.layer.attention, release))
        total += g.count * layer_kv_bytes(att, tokens=tokens, batch=batch, bits=c.kv_bits, latent=False)
    return total


def buffer_bytes(spec: ModelSpec, context: int, act_bytes: int) -> int:
    """``mask_cache`` (bool, context x context) and RoPE ``cos`` + ``sin`` (context x head_dim each)."""
    head_dim = spec.first_layer.attention.head_dim
    return context * context * MASK_BYTES + 2 * context * head_dim * act_bytes


def _largest(spec: ModelSpec, quant: QuantConfig) -> tuple[int, int]:
    """(out, in) features of the largest Linear the plugin quantizes (the head included)."""
    best = (0, 0)
    for t, _ in spec.tensors():
        if is_quantized(spec, t, quant) and len(t.shape) >= 2:
            dims = (t.shape[-2], t.shape[-1])
            best = max(best, dims, key=math.prod)
    return best


def load_transient_bytes(spec: ModelSpec, quant: QuantConfig) -> int:
    """Beyond the resident quantized weights, while ``_quantize_on_load_hook`` requantizes the largest
    Linear: its fp16 copy and what quantization writes (4-bit: the packed weight and absmax as stored;
    int8: ``CB`` and ``CBt`` plus the fp32 row and column scales)."""
    out_f, in_f = _largest(spec, quant)
    numel = out_f * in_f
    if not numel:
        return 0
    if quant.is_4bit:
        written = bnb_4bit_bytes(numel, blocksize=quant.blocksize, double_quant=quant.double_quant)
    else:
        written = INT8_DOUBLE_QUANT_COPIES * numel + FP32 * (out_f + in_f)
    return numel * FP16 + written


def first_forward_bytes(spec: ModelSpec, quant: QuantConfig, rows: int, act_bytes: int) -> int:
    """A quantized Linear's temporaries in one forward of ``rows`` rows, the largest Linear's: 4-bit beyond
    one row the dequantized weight (fp16 and its compute-dtype copy); one row ``gemv_4bit``, none; int8 the
    first forward's ``CxB`` beside ``CB`` (one int8 weight) and the matmul's int8 input and int32 output
    (:func:`peakmem.formulas.quant_kernels.int8_matmul_bytes`)."""
    out_f, in_f = _largest(spec, quant)
    numel = out_f * in_f
    if not quant.is_4bit:
        return numel + int8_matmul_bytes(rows, in_f, out_f)
    return dequantized_weight_bytes(numel, quant, act_bytes) if rows > 1 else 0


def litgpt_memory(c: ServingContext, rows: tuple[WeightRow, ...]) -> EngineMemory:
    s, b, spec = c.setup, c.setup.batch, litgpt_spec(c.spec)
    quant = litgpt_quant(c)
    weights = weights_item(c, rows)
    release = ".".join(map(str, litgpt_release(s)))
    cache = MemoryItem(
        path=f"kv cache ({c.context} tokens x {b}, preallocated)", category=Category.KV_CACHE,
        bytes=litgpt_cache_bytes(c, c.context, b), source=SRC_GENERATE,
    )  # fmt: skip
    buffers = MemoryItem(
        path=f"mask_cache ({c.context}^2 bool) + RoPE cos/sin", category=Category.BUFFERS,
        bytes=buffer_bytes(spec, c.context, c.act_bytes), source=SRC_GENERATE,
    )  # fmt: skip
    vocab, act = spec.vocab_size, c.act_bytes
    logits = b * c.prompt * vocab * act + b * vocab * act * SAMPLER_VOCAB_ROWS
    prefill = [
        weights, cache, buffers,
        MemoryItem(
            path=f"prefill temporaries ({b} x {c.prompt} tokens; every position's logits)",
            category=Category.ACTIVATIONS,
            bytes=max(layer_transient_bytes(spec, b * c.prompt, act), logits),
            source="formulas/serving/forward.py layer_transient_bytes; " + SRC_GENERATE,
        ),
    ]  # fmt: skip
    decode = [
        weights, cache, buffers,
        MemoryItem(
            path="decode logits + sampler", category=Category.TEMPORARIES,
            bytes=b * vocab * act * (1 + SAMPLER_VOCAB_ROWS) + layer_transient_bytes(spec, b, act),
            source=SRC_GENERATE,
        ),
    ]  # fmt: skip
    load: list[MemoryItem] = []
    grouped = "per key/value head" if litgpt_release(s) >= LITGPT_GROUPED_CACHE else "expanded to all heads"
    notes = [
        f"Lit-GPT generate (litgpt {release}; 0.0: the 2023 lit-gpt): KV cache preallocated to prompt + new "
        f"tokens in the compute dtype, {grouped} for grouped-query models; every prompt position's logits",
    ]
    if c.spec.tie_word_embeddings:
        notes.append(SRC_LITGPT_UNTIED)
    if quant is not None:
        pre = first_forward_bytes(spec, quant, b * c.prompt, act)
        dec = first_forward_bytes(spec, quant, b, act) if quant.is_4bit else 0
        what = "dequantized fp16 weight + its copy" if quant.is_4bit else "CxB next to CB (first forward)"
        prefill.append(MemoryItem(path=f"quantized matmul ({what}, largest Linear: the head)",
                                  category=Category.TEMPORARIES, bytes=pre, source=SRC_FABRIC))  # fmt: skip
        if dec:
            path = f"quantized matmul ({b} rows: dequantized weight)"
            decode.append(MemoryItem(path=path, category=Category.TEMPORARIES, bytes=dec, source=SRC_FABRIC))
        transient = load_transient_bytes(spec, quant)
        load = [
            weights,
            MemoryItem(path="checkpoint load: the largest Linear's fp16 copy + its new quantized outputs",
                       category=Category.TEMPORARIES, bytes=transient, source=SRC_FABRIC),
        ]  # fmt: skip
        notes.append(
            f"Lightning Fabric BitsandbytesPrecision: every Linear {quant.label}, lm_head included, "
            "quantized from fp16; the checkpoint load (quantized layer by layer) is a phase of the peak; "
            "int8's outlier columns (state.subB) and CxB padding not modelled"
        )
    overhead = [
        MemoryItem(path="CUDA context", category=Category.OVERHEAD, bytes=CUDA_CONTEXT_BYTES,
                   source=CUDA_CONTEXT_SOURCE),
        MemoryItem(path="cuBLAS workspace", category=Category.OVERHEAD, bytes=CUBLAS_WORKSPACE_BYTES,
                   source="formulas/overhead.py CUBLAS_WORKSPACE_BYTES"),
    ]  # fmt: skip
    extra: dict[str, object] = {"steady_state_bytes": weights.bytes + cache.bytes + buffers.bytes}
    return EngineMemory(prefill=prefill, decode=decode, overhead=overhead, extra=extra, notes=tuple(notes),
                        load=load)  # fmt: skip


__all__ = [
    "LITGPT_GROUPED_CACHE", "cached_heads", "first_forward_bytes", "litgpt_cache_bytes",
    "litgpt_memory", "litgpt_quant", "litgpt_rows", "load_transient_bytes",
]  # fmt: skip
