"""QLoRA's quantized base: storage as bitsandbytes keeps it, and the dequantized temporaries of a step.

Storage (Dettmers et al. 2023, "QLoRA", arXiv 2305.14314 §3; bitsandbytes 0.50.2): transformers'
``BitsAndBytesConfig(load_in_4bit=True)`` replaces every ``nn.Linear`` / ``Conv1D`` except the output
embedding, tied weights and the last module (transformers/quantizers/base.py
``get_keys_to_not_convert``) by ``bnb.nn.Linear4bit``; embeddings, norms, biases, MoE routers
(``*TopKRouter``: a bare parameter in transformers 5.23) and fused 3-D experts stay 16-bit. The
per-tensor bytes come from :func:`peakmem.formulas.weights.tensor_storage` (packed 4-bit values, fp32
absmax per 64-block, the 16-entry code; with double quantization uint8 absmax plus fp32 absmax per 256
blocks, the 256-entry code and an offset). LLM.int8 (``load_in_8bit``, Dettmers et al. 2022) keeps int8
weights plus one fp32 scale per output row (``SCB``).

Temporaries (bitsandbytes/autograd/_functions.py, backends/cuda/ops.py):

* 4-bit, forward: ``gemm_4bit`` with more than 1536 rows (any training batch) falls back to
  ``dequantize_4bit`` + ``F.linear``: the layer's weight dequantized to the compute dtype (out x in),
  plus with double quantization the fp32 absmax (one per 64-block) rebuilt first. ``MatMul4Bit`` saves
  only the packed weight (``ctx.tensors = (None, B)``), never the input; before bitsandbytes 0.43.2 it
  kept the input too (``(A, B)``: :mod:`peakmem.bnb_versions`, counted in formulas/lora/deltas.py).
* 4-bit, backward: ``grad_A = grad_output @ dequantize_4bit(B)``: the same dequantized weight again.
* 8-bit (``MatMul8bitLt``): forward quantizes the input (``int8_vectorwise_quant(A.to(fp16))``: an
  fp16 copy when A is not fp16, int8 values and fp32 row scales) and **saves A** for backward
  (``ctx.tensors = (CAt, subA, A)``); backward dequantizes the weight
  (``CB.to(dtype).mul_(SCB / 127)``: out x in in the compute dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from peakmem.adapters import FLOAT_BYTES, QuantConfig
from peakmem.formulas.weights import WeightRow, tensor_storage
from peakmem.model import ModelSpec, Tensor

FP32 = 4
FP16 = 2


def is_quantized(spec: ModelSpec, t: Tensor) -> bool:
    """Does transformers' bitsandbytes integration replace this tensor's module?"""
    if t.kind != "linear_weight" or t.component in ("head", "router"):
        return False
    return not (spec.tie_word_embeddings and t.component == "embeddings")


def base_rows(spec: ModelSpec, quant: QuantConfig) -> tuple[WeightRow, ...]:
    """Storage of every base tensor (over its occurrences): quantized Linears, the rest 16-bit.

    Reuses :func:`peakmem.formulas.weights.tensor_storage`; the one difference: MoE routers stay
    16-bit (transformers 5.23 ``*TopKRouter`` is not an ``nn.Linear``, so bitsandbytes skips it).
    """
    fmt = quant.weight_format
    fb = FLOAT_BYTES[quant.float_dtype]
    out = []
    for t, n in spec.tensors():
        if t.component == "router":
            nbytes, label = t.numel * fb, quant.float_dtype
        else:
            nbytes, label = tensor_storage(t, fmt, tied=spec.tie_word_embeddings)
        out.append(WeightRow(name=t.name, component=t.component, params=t.numel * n, bytes=nbytes * n,
                             storage=label, kind=t.kind))  # fmt: skip
    return tuple(out)


def base_bytes(spec: ModelSpec, quant: QuantConfig) -> int:
    return sum(r.bytes for r in base_rows(spec, quant))


def quantized_params(spec: ModelSpec) -> int:
    return sum(t.numel * n for t, n in spec.tensors() if is_quantized(spec, t))


def _in_out(t: Tensor) -> tuple[int, int]:
    return math.prod(t.shape[1:]), t.shape[0]


def largest_quantized(spec: ModelSpec) -> int:
    """Elements of the largest quantized weight (the dequantized temporary is this big)."""
    return max((math.prod(t.shape) for t, _ in spec.tensors() if is_quantized(spec, t)), default=0)


@dataclass(frozen=True, kw_only=True)
class DequantTemporaries:
    forward: int  # bytes alive while one quantized Linear runs in forward
    backward: int  # while one runs in backward (beyond the activation gradients)


def dequant_temporaries(
    spec: ModelSpec, quant: QuantConfig, *, tokens: int, compute_bytes: int
) -> DequantTemporaries:
    """The largest per-layer temporaries of the quantized matmuls (see the module docstring)."""
    numel = largest_quantized(spec)
    w = numel * compute_bytes
    if quant.is_4bit:
        absmax = math.ceil(numel / quant.blocksize) * FP32 if quant.double_quant else 0
        return DequantTemporaries(forward=w + absmax, backward=w + absmax)
    width = max((_in_out(t)[0] for t, _ in spec.tensors() if is_quantized(spec, t)), default=0)
    fp16_copy = tokens * width * FP16 if compute_bytes != FP16 else 0
    fwd = fp16_copy + tokens * width + tokens * FP32  # A.to(fp16), CA int8, SCA fp32
    return DequantTemporaries(forward=fwd, backward=w)


__all__ = [
    "DequantTemporaries",
    "base_bytes",
    "base_rows",
    "dequant_temporaries",
    "is_quantized",
    "largest_quantized",
    "quantized_params",
]
