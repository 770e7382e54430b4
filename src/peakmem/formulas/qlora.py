"""QLoRA's quantized base: storage as bitsandbytes keeps it, and the dequantized temporaries of a step.

Storage (Dettmers et al. 2023, "QLoRA", arXiv 2305.14314 §3; bitsandbytes 0.50.2): transformers'
``BitsAndBytesConfig(load_in_4bit=True)`` replaces every ``nn.Linear`` / ``Conv1D`` except the output
embedding, tied weights and the last module (transformers/quantizers/base.py
``get_keys_to_not_convert``) by ``bnb.nn.Linear4bit``; embeddings, norms, biases, MoE routers
(``*TopKRouter``: a bare parameter in transformers 5.23) and fused 3-D experts stay 16-bit; before
transformers 5.0 the experts are one ``nn.Linear`` per expert and projection, quantized like the rest
(``QuantConfig.expert_linears``, :mod:`peakmem.transformers_versions`; the 4.x routers, an ``nn.Linear`` in
Mixtral, are left 16-bit here: E x H elements a layer). The
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

Lightning Fabric's ``BitsandbytesPrecision`` (Lit-GPT's ``--quantize bnb.*``; lightning/fabric/plugins/
precision/bitsandbytes.py, the same at Lightning@71aed75 (Lit-GPT@8641822b's pin), 2.3.0.dev20240328
(438f29f, litgpt@5895df1's) and master): ``module_init_context`` replaces the ``torch.nn.Linear`` class by
its ``_NF4Linear`` / ``_Linear8bitLt`` while the model is built, and ``convert_module`` / ``_convert_layers``
replace every Linear left unless its name starts with one of ``ignore_modules``, which Lit-GPT never passes
(finetune/lora.py: ``BitsandbytesPrecision(quantize[4:], dtype)``): Lit-GPT's ``lm_head`` (``LoRALinear``
wrapping a ``torch.nn.Linear``, litgpt/lora.py) is a 4-bit Linear too (``QuantConfig.quantize_head``), the
embedding (``nn.Embedding``) stays 16-bit. ``_Linear4bit.quantize`` quantizes
``weight.contiguous().to(dtype=torch.half)``, so every ``QuantState.dtype`` is fp16
(``QuantConfig.state_dtype``): with bf16 compute, ``dequantize_4bit`` writes an fp16 weight and
``.to(A.dtype)`` a bf16 copy of it, both alive at once (:func:`dequantized_weight_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from peakmem.adapters import FLOAT_BYTES, QuantConfig
from peakmem.formulas.kbit_prep import unquantized_dtype
from peakmem.formulas.weights import WeightRow, bnb_linear_data_bytes, bnb_linear_storage, tensor_storage
from peakmem.model import Layer, ModelSpec, Tensor

FP32 = 4
FP16 = 2
SRC_FABRIC_BNB = (
    "Lightning fabric/plugins/precision/bitsandbytes.py (@71aed75, 2.3.0.dev20240328 @438f29f, master): "
    "BitsandbytesPrecision replaces every torch.nn.Linear, lm_head included (no ignore_modules from "
    "Lit-GPT), and _Linear4bit.quantize quantizes weight.to(torch.half): QuantState.dtype fp16"
)


def is_quantized(spec: ModelSpec, t: Tensor, quant: QuantConfig | None = None) -> bool:
    """Does the bitsandbytes integration replace this tensor's module? transformers' skips the head
    (``get_keys_to_not_convert``); Lightning Fabric's ``BitsandbytesPrecision`` replaces it too
    (``quant.quantize_head``: :data:`SRC_FABRIC_BNB`)."""
    if t.kind == "expert_weight":
        return quant is not None and quant.expert_linears
    if t.kind != "linear_weight" or t.component == "router":
        return False
    if t.component == "head":
        return quant is not None and quant.quantize_head
    return not (spec.tie_word_embeddings and t.component == "embeddings")


SRC_QUANT_NO_CAST = (
    "bitsandbytes autograd/_functions.py MatMul4Bit.forward (0.43.3: F.linear on "
    "dequantize_4bit(B).to(A.dtype); 0.50.2: gemm_4bit) saves the quantized B, never a 16-bit weight; aten "
    "autocast_mode.h cached_cast returns a tensor already in the target dtype as it is: autocast casts only "
    "the float Linears not in the compute dtype"
)


def autocast_cast_params(spec: ModelSpec, layer: Layer, quant: QuantConfig, compute: str) -> int:
    """Parameters of ``layer``'s Linear weights that torch autocast casts to ``compute`` (a dtype name) over a
    quantized base: a bitsandbytes Linear runs its own autograd Function on the quantized weight (its
    dequantized copy is a temporary: :func:`dequant_temporaries`), and a float Linear already in the compute
    dtype needs no cast; what remains are the float Linears kept in another dtype (fp32 after
    ``prepare_model_for_kbit_training``: :func:`peakmem.formulas.kbit_prep.unquantized_dtype`).
    :data:`SRC_QUANT_NO_CAST`."""
    return sum(
        t.numel for t in layer.tensors
        if t.kind in ("linear_weight", "expert_weight") and not is_quantized(spec, t, quant)
        and unquantized_dtype(t, quant) != compute
    )  # fmt: skip


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
        elif t.kind == "expert_weight" and is_quantized(spec, t, quant):
            nbytes, label = bnb_linear_storage(expert_linears(t), fmt)
        elif t.component == "head" and is_quantized(spec, t, quant):
            nbytes, label = bnb_linear_storage(t, fmt)
        else:
            nbytes, label = tensor_storage(t, fmt, tied=spec.tie_word_embeddings)
        if label == quant.float_dtype and quant.kbit_prep != "none":  # kept in float: prepared (kbit_prep.py)
            label = unquantized_dtype(t, quant)
            nbytes = t.numel * FLOAT_BYTES[label]
        out.append(WeightRow(name=t.name, component=t.component, params=t.numel * n, bytes=nbytes * n,
                             storage=label, kind=t.kind))  # fmt: skip
    return tuple(out)


def base_bytes(spec: ModelSpec, quant: QuantConfig) -> int:
    return sum(r.bytes for r in base_rows(spec, quant))


def root_bytes(spec: ModelSpec, quant: QuantConfig) -> int:
    """The frozen base outside the layers (embeddings, final norm, head) as :func:`base_rows` stores it:
    all in the float dtype (fp32 where prepared: :func:`peakmem.formulas.kbit_prep.unquantized_dtype`),
    but a quantized head (``quant.quantize_head``)."""
    return sum(
        bnb_linear_storage(t, quant.weight_format)[0]
        if is_quantized(spec, t, quant)
        else t.numel * FLOAT_BYTES[unquantized_dtype(t, quant)]
        for t in spec.outer
    )


def quant_state_bytes(spec: ModelSpec, quant: QuantConfig) -> int:
    """Bytes of the quantization states of the layers' quantized weights (4-bit: absmax, with double
    quantization the nested absmax, codes and offset; int8: ``SCB``): what of :func:`base_rows` is not the
    weight ``Parameter``'s own data (packed 4-bit values, int8 values). bitsandbytes keeps them beside it
    (bitsandbytes 0.43.3 nn/modules.py: ``Params4bit.quant_state``, set on the module too by ``_quantize``
    (``module.quant_state``) for ``fix_4bit_weight_quant_state_from_module``: "the quant state got lost when
    the parameter got converted. This happens for example for fsdp"; ``Int8Params.SCB``), so an engine that
    flattens and shards parameters (FSDP) shards the data only (:mod:`.bnb_fsdp`)."""
    fmt, outer = quant.weight_format, {t.name for t in spec.outer}
    total = 0
    for t, n in spec.tensors():
        if t.name in outer or not is_quantized(spec, t, quant):
            continue
        w = expert_linears(t) if t.kind == "expert_weight" else t  # transformers 4.x: a Linear4bit each
        total += (bnb_linear_storage(w, fmt)[0] - bnb_linear_data_bytes(w, fmt)) * n
    return total


def quantized_params(spec: ModelSpec, quant: QuantConfig | None = None) -> int:
    return sum(t.numel * n for t, n in spec.tensors() if is_quantized(spec, t, quant))


def expert_linears(t: Tensor) -> Tensor:
    """A fused expert parameter as the per-expert Linears of transformers 4.x: ``(E, k x rows, cols)`` ->
    ``(E, k, rows, cols)``, k = 2 for ``gate_up_proj`` (``w1`` and ``w3``, each its own Linear4bit with its
    own quantization state), else 1."""
    k = 2 if t.name.endswith("gate_up_proj") else 1
    return replace(t, shape=(*t.shape[:-2], k, t.shape[-2] // k, t.shape[-1]))


def _in_out(t: Tensor) -> tuple[int, int]:
    """(in, out) features of one Linear of ``t``: a fused expert ``gate_up_proj`` (E, 2I, H) was two
    Linears per expert (``w1`` / ``w3``, ``gate_proj`` / ``up_proj``: I x H each) before transformers 5.0."""
    if t.kind == "expert_weight":
        return t.shape[-1], expert_linears(t).shape[-2]
    return math.prod(t.shape[1:]), t.shape[0]


def largest_quantized(spec: ModelSpec, quant: QuantConfig | None = None) -> int:
    """Elements of the largest quantized Linear (the dequantized temporary is this big)."""
    return max((math.prod(_in_out(t)) for t, _ in spec.tensors() if is_quantized(spec, t, quant)), default=0)


def dequantized_weight_bytes(numel: int, quant: QuantConfig, compute_bytes: int) -> int:
    """The most alive while a 4-bit matmul dequantizes a weight of ``numel`` elements (bitsandbytes
    0.39-0.50 autograd/_functions.py ``MatMul4Bit``: ``F.dequantize_4bit(B, state).to(A.dtype)``, backward
    alike with ``grad_output.dtype``): ``dequantize_4bit`` writes the state's dtype (``QuantState.dtype``,
    the dtype the weight was quantized from: ``quant.state_dtype``); when that is not the compute dtype
    (``quant.float_dtype``), the ``.to`` copy is made while the first is alive: both at once (None: one
    weight in the compute dtype, ``compute_bytes`` per element). Plus, with
    double quantization, the fp32 absmax rebuilt first (one per block)."""
    state = quant.state_dtype
    cast = numel * FLOAT_BYTES[state] if state is not None and state != quant.float_dtype else 0
    w = numel * compute_bytes + cast
    absmax = math.ceil(numel / quant.blocksize) * FP32 if quant.double_quant else 0
    return w + absmax


@dataclass(frozen=True, kw_only=True)
class DequantTemporaries:
    forward: int  # bytes alive while one quantized Linear runs in forward
    backward: int  # while one runs in backward (beyond the activation gradients)


def dequant_temporaries(
    spec: ModelSpec, quant: QuantConfig, *, tokens: int, compute_bytes: int
) -> DequantTemporaries:
    """The largest per-layer temporaries of the quantized matmuls (see the module docstring)."""
    numel = largest_quantized(spec, quant)
    w = numel * compute_bytes
    if quant.is_4bit:
        tmp = dequantized_weight_bytes(numel, quant, compute_bytes)
        return DequantTemporaries(forward=tmp, backward=tmp)
    width = max((_in_out(t)[0] for t, _ in spec.tensors() if is_quantized(spec, t, quant)), default=0)
    fp16_copy = tokens * width * FP16 if compute_bytes != FP16 else 0
    fwd = fp16_copy + tokens * width + tokens * FP32  # A.to(fp16), CA int8, SCA fp32
    return DequantTemporaries(forward=fwd, backward=w)


__all__ = [
    "DequantTemporaries",
    "base_bytes",
    "base_rows",
    "dequant_temporaries",
    "dequantized_weight_bytes",
    "expert_linears",
    "is_quantized",
    "largest_quantized",
    "quantized_params",
    "root_bytes",
]
