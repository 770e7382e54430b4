"""Weight storage per format: packed values, scales, zero points, and what stays unquantized.

Which tensors each tool quantizes (the rule modelled; each row of :func:`weight_rows` says it):

* bitsandbytes via transformers (``integrations/bitsandbytes.py`` ``replace_with_bnb_linear``):
  every ``nn.Linear`` except the output embedding / tied weights (``quantizers/base.py``
  ``get_keys_to_not_convert``), so the LM head, embeddings, norms and biases stay 16-bit; fused
  MoE expert parameters (3-D ``nn.Parameter``, not ``nn.Linear``, in transformers 5) stay 16-bit:
  transformers 5.23.0 ``replace_with_bnb_linear`` converts only ``isinstance(module, Conv1D) or
  type(module) is nn.Linear``, and ``models/mixtral/modeling_mixtral.py`` ``MixtralExperts`` holds
  ``gate_up_proj`` ``(E, 2I, H)`` and ``down_proj`` ``(E, H, I)`` as ``nn.Parameter``
  (:func:`bnb_kept_expert_params` counts them for the answer's warning).
* GPTQ (auto-gptq / gptqmodel) and AWQ (AutoAWQ): the linears inside the decoder layers
  (attention, MLP, experts, shared experts); the router, embeddings, head and norms stay fp16.
* fp8 / w8a8 (llm-compressor ``compressed-tensors`` checkpoints as vLLM loads them): decoder-layer
  linears (routers stay 16-bit, ``ignore=["lm_head"]``), weights 8-bit plus fp32 scales.
* mxfp4 (gpt-oss; transformers ``integrations/mxfp4.py`` ``Mxfp4GptOssExperts`` and vLLM
  ``model_executor/layers/quantization/mxfp4.py`` ``Mxfp4Config.get_quant_method``): the MoE experts
  only (``FusedMoE`` gets ``Mxfp4MoEMethod``; every ``LinearBase`` falls back to
  ``UnquantizedLinearMethod``); attention, router, embeddings and head stay bf16, as the checkpoint's
  ``modules_to_not_convert`` lists them; the expert biases stay bf16 (``w13_bias`` / ``w2_bias``).
* nvfp4 (NVIDIA ModelOpt checkpoints, vLLM ``quantization/modelopt.py`` ``ModelOptNvFp4LinearMethod``):
  the decoder-layer linears and experts (``exclude_modules`` lists ``lm_head``; the router is built
  unquantized), so embeddings, head, router and norms stay bf16.
* fp8-block (DeepSeek-V3/R1, Qwen3-FP8; transformers ``integrations/finegrained_fp8.py``
  ``FP8Linear``, vLLM ``quantization/fp8.py`` ``Fp8LinearMethod`` with ``weight_block_size``): the
  decoder-layer linears and experts; ``lm_head``, embeddings, the router and norms stay bf16.
* GGUF (llama.cpp ``src/llama-quant.cpp`` ``llama_tensor_get_type``): 2-D weights take the file
  type's base type with per-tensor bumps (output Q6_K, attn_v / ffn_down more bits in some
  layers); 1-D tensors (norms, biases) and the MoE router (``ffn_gate_inp``) stay F32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from peakmem.errors import InputError
from peakmem.model import ModelSpec, Tensor, TensorKind
from peakmem.weight_formats import MXFP4_BLOCK, NVFP4_BLOCK, TORCHAO_SCHEMES, Scheme, WeightFormat

FLOAT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
FP32_BYTES = 4
FP16_BYTES = 2
INT32_BITS = 32

# bitsandbytes functional.quantize_4bit (0.50.2): blocksize 64; absmax fp32 per block; `code` the
# 16-entry NF4/FP4 table (fp32) kept per QuantState. compress_statistics (double quant): absmax
# quantized to uint8 by quantize_blockwise(blocksize=256) -> state2.absmax fp32 per 256 blocks, the
# 256-entry dynamic map (fp32) per state, and a scalar fp32 offset.
BNB_4BIT_CODE_ENTRIES = 16
BNB_DQ_BLOCKSIZE = 256
BNB_DQ_CODE_ENTRIES = 256
E8M0_BYTES = 1  # MXFP4 scale: one uint8 biased exponent (OCP MX spec v1.0, E8M0)
E4M3_BYTES = 1  # NVFP4 block scale: float8_e4m3fn
# ModelOpt NVFP4 per-tensor fp32 scalars kept per linear: weight_scale_2 and input_scale (vLLM modelopt.py).
NVFP4_TENSOR_SCALES = 2
# torchao int4 weight-only, tinygemm layout: the weight is padded to in_features a multiple of 1024 and
# out_features a multiple of 8 before packing (torchao v0.9.0 dtypes/uintx/tensor_core_tiled_layout.py
# TensorCoreTiledLayout.pre_process; 0.18.0 Int4TilePackedTo4dTensor.from_hp, ntile_size 8); the packed
# weight holds two int4 per byte (aten _convert_weight_to_int4pack: int32 [N / 8, K / (16 x
# inner_k_tiles), 32, inner_k_tiles / 2]) and ``scale_and_zero`` is [K / group, N, 2] in bf16
# (torchao quantization/utils.py pack_tinygemm_scales_and_zeros).
TINYGEMM_IN_MULTIPLE = 1024
TINYGEMM_OUT_MULTIPLE = 8
TINYGEMM_SCALE_AND_ZERO = 2  # a scale and a zero per (group, output row)
BF16_BYTES = 2
# torchao int8 weight-only, per row: v0.9.0 quant_api.py _int8_weight_only_transform keeps the scale in the
# weight's dtype (2 B) and an int64 zero point (zero_point_dtype=torch.int64): 10 B a row; 0.18.0's Int8Tensor
# keeps an fp32 scale and an int8 zero point (5 B, measured on the CPU). The larger is counted.
TORCHAO_INT8_ROW_BYTES = 10


@dataclass(frozen=True, kw_only=True)
class WeightRow:
    """Storage of one parameter tensor over all its occurrences (layers x copies)."""

    name: str
    component: str
    params: int
    bytes: int
    storage: str  # e.g. "nf4 + fp32 absmax/64", "bf16", "Q6_K"
    kind: TensorKind = "other"  # the tensor's kind (peakmem.model.Tensor.kind)


# --- per-linear packing ------------------------------------------------------------------------
def gptq_linear_bytes(in_features: int, out_features: int, bits: int, group_size: int) -> int:
    """auto-gptq / gptqmodel QuantLinear buffers (transformers' GPTQ integration loads these):
    qweight int32 [in*bits/32, out], qzeros int32 [ceil(in/group), out*bits/32],
    scales fp16 [ceil(in/group), out], g_idx int32 [in]. Group -1: one group of ``in``."""
    group = in_features if group_size == -1 else group_size
    groups = math.ceil(in_features / group)
    qweight = (in_features // INT32_BITS * bits) * out_features * 4
    qzeros = groups * (out_features // INT32_BITS * bits) * 4
    scales = groups * out_features * FP16_BYTES
    g_idx = in_features * 4
    return qweight + qzeros + scales + g_idx


def awq_linear_bytes(in_features: int, out_features: int, bits: int, group_size: int) -> int:
    """AutoAWQ WQLinear_GEMM buffers: qweight int32 [in, out/(32/bits)],
    qzeros int32 [in/group, out/(32/bits)], scales fp16 [in/group, out]."""
    pack = INT32_BITS // bits
    groups = in_features // group_size
    return (
        in_features * (out_features // pack) * 4
        + groups * (out_features // pack) * 4
        + groups * out_features * 2
    )


def bnb_4bit_bytes(numel: int, *, blocksize: int = 64, double_quant: bool = False) -> int:
    """bitsandbytes Linear4bit: packed uint8 (2 per byte) + QuantState (see constants above)."""
    blocks = math.ceil(numel / blocksize)
    packed = (numel + 1) // 2
    code = BNB_4BIT_CODE_ENTRIES * FP32_BYTES
    if not double_quant:
        return packed + blocks * FP32_BYTES + code
    nested_absmax = math.ceil(blocks / BNB_DQ_BLOCKSIZE) * FP32_BYTES
    return packed + blocks + nested_absmax + BNB_DQ_CODE_ENTRIES * FP32_BYTES + FP32_BYTES + code


def bnb_int8_bytes(in_features: int, out_features: int) -> int:
    """bitsandbytes Linear8bitLt (LLM.int8, Dettmers et al. 2022): Int8Params int8 [out, in]
    plus SCB, one fp32 absmax per output row (functional.int8_vectorwise_quant)."""
    return in_features * out_features + out_features * FP32_BYTES


def fp8_linear_bytes(in_features: int, out_features: int, *, per_channel: bool) -> int:
    """e4m3 weight [out, in] + fp32 weight_scale: one per tensor, or one per output channel."""
    return in_features * out_features + (out_features if per_channel else 1) * FP32_BYTES


def tinygemm_padded(features: int, multiple: int = TINYGEMM_IN_MULTIPLE) -> int:
    """``features`` rounded up as tinygemm pads them (inputs to 1024 by default, outputs to 8)."""
    return -(-features // multiple) * multiple


def torchao_int4_linear_bytes(in_features: int, out_features: int, group_size: int) -> int:
    """torchao ``int4_weight_only`` (tinygemm): the padded weight's packed int4 values and its bf16
    ``scale_and_zero`` (see TINYGEMM_*)."""
    k, n = tinygemm_padded(in_features), tinygemm_padded(out_features, TINYGEMM_OUT_MULTIPLE)
    return k * n // 2 + (k // group_size) * n * TINYGEMM_SCALE_AND_ZERO * BF16_BYTES


def torchao_int8_linear_bytes(in_features: int, out_features: int) -> int:
    """torchao ``int8_weight_only``: int8 [out, in] and a scale and zero point per output row."""
    return in_features * out_features + out_features * TORCHAO_INT8_ROW_BYTES


def mxfp4_bytes(rows: int, in_features: int) -> int:
    """OCP MXFP4, as the gpt-oss checkpoint stores an expert matrix: ``*_blocks`` uint8
    ``[rows, in/32, 16]`` (two E2M1 values per byte) and ``*_scales`` uint8 ``[rows, in/32]`` (one E8M0
    exponent per 32 values); vLLM's ``Mxfp4MoEMethod.create_weights`` allocates the same ``w13_weight``
    ``[E, 2I, H/2]`` and ``w13_weight_scale`` ``[E, 2I, H/32]``. A partial last block takes a whole one."""
    blocks = math.ceil(in_features / MXFP4_BLOCK)
    return rows * blocks * (MXFP4_BLOCK // 2 + E8M0_BYTES)


def nvfp4_linear_bytes(in_features: int, out_features: int) -> int:
    """NVIDIA ModelOpt NVFP4 linear as vLLM's ``ModelOptNvFp4LinearMethod.create_weights`` allocates it:
    ``weight`` uint8 ``[out, in/2]`` (two E2M1 per byte), ``weight_scale`` float8_e4m3fn ``[out, in/16]``,
    and two fp32 per-tensor scalars, ``weight_scale_2`` (the global weight scale) and ``input_scale``."""
    packed = out_features * in_features // 2
    scales = out_features * (in_features // NVFP4_BLOCK) * E4M3_BYTES
    return packed + scales + NVFP4_TENSOR_SCALES * FP32_BYTES


def fp8_block_linear_bytes(in_features: int, out_features: int, block: tuple[int, int]) -> int:
    """Block-wise fp8 (DeepSeek-V3 ``weight_block_size``): e4m3 ``weight`` ``[out, in]`` plus fp32
    ``weight_scale_inv`` ``[ceil(out/rows), ceil(in/cols)]`` (transformers ``FP8Linear``; vLLM
    ``Fp8LinearMethod.create_weights`` with ``block_quant``: ``(out + rows - 1) // rows`` likewise)."""
    rows, cols = block
    return (
        out_features * in_features
        + math.ceil(out_features / rows) * math.ceil(in_features / cols) * FP32_BYTES
    )


# --- GGUF ----------------------------------------------------------------------------------------
# ggml-common.h: (bytes per block, elements per block) of each ggml type; QK_K = 256.
GGML_TYPES: dict[str, tuple[int, int]] = {
    "F32": (4, 1), "F16": (2, 1), "BF16": (2, 1),
    "Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32), "Q5_1": (24, 32), "Q8_0": (34, 32),
    "Q2_K": (84, 256), "Q3_K": (110, 256), "Q4_K": (144, 256), "Q5_K": (176, 256), "Q6_K": (210, 256),
    "IQ1_S": (50, 256), "IQ1_M": (56, 256), "IQ2_XXS": (66, 256), "IQ2_XS": (74, 256),
    "IQ2_S": (82, 256), "IQ3_XXS": (98, 256), "IQ3_S": (110, 256), "IQ4_NL": (18, 32),
    "IQ4_XS": (136, 256), "TQ1_0": (54, 256), "TQ2_0": (66, 256),
}  # fmt: skip
# llama-quant.cpp llama_model_quantize_impl: the default type of each file type.
GGUF_BASE_TYPE: dict[str, str] = {
    "f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q6_k": "Q6_K",
    "q5_k_m": "Q5_K", "q5_k_s": "Q5_K", "q5_0": "Q5_0", "q5_1": "Q5_1", "q4_k_m": "Q4_K",
    "q4_k_s": "Q4_K", "q4_0": "Q4_0", "q4_1": "Q4_1", "q3_k_l": "Q3_K", "q3_k_m": "Q3_K",
    "q3_k_s": "Q3_K", "q2_k": "Q2_K", "q2_k_s": "Q2_K", "iq4_xs": "IQ4_XS", "iq4_nl": "IQ4_NL",
    "iq3_m": "IQ3_S", "iq3_s": "IQ3_S", "iq3_xs": "IQ3_S", "iq3_xxs": "IQ3_XXS", "iq2_m": "IQ2_S",
    "iq2_s": "IQ2_XS", "iq2_xs": "IQ2_XS", "iq2_xxs": "IQ2_XXS", "iq1_m": "IQ1_M", "iq1_s": "IQ1_S",
    "tq1_0": "TQ1_0", "tq2_0": "TQ2_0",
}  # fmt: skip
# llama-quant.cpp tensor_type_fallback: a row length not divisible by the block size.
_GGUF_FALLBACK = {
    "Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL", "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL",
    "IQ2_S": "IQ4_NL", "IQ3_XXS": "IQ4_NL", "IQ3_S": "IQ4_NL", "IQ1_S": "IQ4_NL", "IQ1_M": "IQ4_NL",
    "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
}  # fmt: skip
_IQ_LOW = ("iq2_xxs", "iq2_xs", "iq1_s", "iq2_s", "iq2_m", "iq1_m")
# convert_hf_to_gguf / llama.cpp tensor names for transformers module names.
_GGUF_CATEGORY = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "qkv_proj": "attn_qkv", "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
    "gate_up_proj": "ffn_up", "w1": "ffn_gate", "w3": "ffn_up", "w2": "ffn_down",
}  # fmt: skip


def gguf_tensor_bytes(ggml_type: str, shape: tuple[int, ...]) -> int:
    """ggml_row_size(type, ne0) x rows: rows of ``ne0 = shape[-1]`` elements in whole blocks."""
    size, block = GGML_TYPES[ggml_type]
    rows = math.prod(shape[:-1])
    return rows * (shape[-1] // block) * size


_QKV_BUMP = {"q3_k_m": "Q4_K", "q3_k_l": "Q4_K", "iq3_m": "Q4_K", "q4_k_m": "Q5_K", "q5_k_m": "Q6_K"}


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp: the first and last eighth of layers and every third layer in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def gguf_type_for(
    ftype: str, category: str, *, i_layer: int, n_layers: int, n_gqa: int, n_expert: int, ne0: int, tied: bool
) -> str:
    """The ggml type llama-quantize picks for one 2-D tensor (llama_tensor_get_type_impl, no imatrix).

    ``category``: output, token_embd, attn_q/k/v/output/qkv, ffn_gate/up/down, other.
    """
    base = GGUF_BASE_TYPE[ftype]
    if base in ("F32", "F16", "BF16"):
        return base
    new = base
    if category == "output" or (tied and category == "token_embd"):
        if ne0 % GGML_TYPES[base][1] != 0:
            new = "Q8_0"
        elif ftype in (*_IQ_LOW, "iq3_xxs"):
            new = "Q5_K"
        elif new != "Q8_0":
            new = "Q6_K"
    elif category == "token_embd":
        if ftype in ("iq2_xxs", "iq2_xs", "iq1_s", "iq1_m"):
            new = "Q2_K"
        elif ftype in ("iq2_s", "iq2_m", "iq3_xxs"):
            new = "IQ3_S"
        elif ftype in ("tq1_0", "tq2_0"):
            new = "Q4_K"
    elif ftype in _IQ_LOW:
        if category == "attn_v":
            new = (
                "Q4_K"
                if (n_gqa >= 4 or n_expert >= 4)
                else ("IQ3_S" if ftype in ("iq2_s", "iq2_m") else "Q2_K")
            )
        elif n_expert == 8 and category == "attn_k":
            new = "Q4_K"
        elif category == "ffn_down" and i_layer < n_layers // 8:
            new = "IQ3_S" if ftype in ("iq2_s", "iq2_m") else "Q2_K"
        elif category == "attn_output":
            if n_expert == 8:
                new = "Q5_K"
            elif ftype in ("iq1_s", "iq1_m"):
                new = "IQ2_XXS"
            elif ftype in ("iq2_s", "iq2_m"):
                new = "IQ3_S"
    elif category == "attn_v":
        new = _attn_v_type(ftype, new, i_layer=i_layer, n_layers=n_layers, n_gqa=n_gqa)
        if n_expert == 8:
            new = "Q8_0"
    elif category == "attn_k":
        if n_expert == 8:
            new = "Q8_0"
        elif ftype == "iq3_xs":
            new = "IQ3_XXS"
        elif ftype == "iq3_xxs":
            new = "IQ2_S"
    elif category == "attn_q":
        if ftype == "iq3_xs":
            new = "IQ3_XXS"
        elif ftype == "iq3_xxs":
            new = "IQ2_S"
    elif category == "ffn_down":
        new = _ffn_down_type(ftype, new, i_layer=i_layer, n_layers=n_layers, n_expert=n_expert)
    elif category == "attn_output":
        new = _attn_output_type(ftype, new, n_expert=n_expert)
    elif category == "attn_qkv":
        new = _QKV_BUMP.get(ftype, new)
    elif (
        category in ("ffn_gate", "ffn_up")
        and ftype == "iq3_xs"
        and n_layers // 8 <= i_layer < 7 * n_layers // 8
    ):
        new = "IQ3_XXS"
    # tensor_type_fallback: rows must hold whole blocks
    while ne0 % GGML_TYPES[new][1] != 0:
        new = _GGUF_FALLBACK.get(new, "F16")
    return new


def _attn_v_type(ftype: str, new: str, *, i_layer: int, n_layers: int, n_gqa: int) -> str:
    if ftype == "q2_k":
        return "Q4_K" if n_gqa >= 4 else "Q3_K"
    if ftype == "q2_k_s" and n_gqa >= 4:
        return "Q4_K"
    if ftype == "iq3_xxs":
        return "Q4_K" if n_gqa >= 4 else "IQ3_S"
    if ftype in ("iq3_xs", "iq3_s") and n_gqa >= 4:
        return "Q4_K"
    if ftype == "iq3_m":
        return "Q4_K"
    if ftype == "q3_k_m":
        return "Q5_K" if i_layer < 2 else "Q4_K"
    if ftype == "q3_k_l":
        return "Q5_K"
    if ftype in ("iq4_nl", "iq4_xs") and n_gqa >= 4:
        return "Q5_K"
    if ftype in ("q4_k_m", "q5_k_m") and use_more_bits(i_layer, n_layers):
        return "Q6_K"
    if ftype == "q4_k_s" and i_layer < 4:
        return "Q5_K"
    return new


def _ffn_down_type(ftype: str, new: str, *, i_layer: int, n_layers: int, n_expert: int) -> str:
    eighth = i_layer < n_layers // 8
    if ftype == "q2_k":
        return "Q3_K"
    if ftype == "q2_k_s":
        return "Q4_K" if eighth else new
    if ftype == "iq3_xxs":
        return "Q4_K" if eighth else "Q3_K"
    if ftype == "q3_k_m":
        return "Q5_K" if i_layer < n_layers // 16 else "Q4_K"
    if ftype == "iq3_m" and (eighth or (n_expert == 8 and use_more_bits(i_layer, n_layers))):
        return "Q4_K"
    if ftype == "q3_k_l":
        return "Q5_K"
    if ftype == "q4_k_m":
        return "Q6_K" if use_more_bits(i_layer, n_layers) else new
    if eighth and ftype in ("iq4_nl", "iq4_xs"):
        return "Q5_K"
    if ftype == "q5_k_m" and use_more_bits(i_layer, n_layers):
        return "Q6_K"
    if ftype == "q4_k_s" and eighth:
        return "Q5_K"
    return new


def _attn_output_type(ftype: str, new: str, *, n_expert: int) -> str:
    if n_expert == 8:
        bumped = (
            "q2_k",
            "iq3_xs",
            "iq3_xxs",
            "q3_k_s",
            "q3_k_m",
            "iq4_nl",
            "q4_k_s",
            "q4_k_m",
            "iq3_s",
            "iq3_m",
            "iq4_xs",
        )
        return "Q5_K" if ftype in bumped else new
    return {"q2_k": "Q3_K", "iq3_xxs": "IQ3_S", "q3_k_m": "Q4_K", "q3_k_l": "Q5_K", "iq3_m": "Q4_K"}.get(
        ftype, new
    )


# --- which tensors are quantized ----------------------------------------------------------------
_LAYER_LINEAR = ("attention", "mlp", "experts", "shared_experts")


def _linear_view(t: Tensor) -> tuple[int, int, int]:
    """(copies, in_features, out_features) of a linear-like weight stored ``[..., out, in]``: fused
    3-D expert parameters (transformers 5 ``gate_up_proj`` ``(E, 2I, H)``) count E copies."""
    return t.copies * math.prod(t.shape[:-2]), t.shape[-1], t.shape[-2]


def _float_bytes(fmt: WeightFormat) -> int:
    return FLOAT_BYTES[fmt.float_dtype]


def bnb_linear_storage(t: Tensor, fmt: WeightFormat) -> tuple[int, str]:
    """Bytes of one occurrence of the linear weight ``t`` (all its copies) as a bitsandbytes Linear4bit or
    Linear8bitLt of ``fmt`` stores it, and a storage label (``fmt``: BNB_4BIT or BNB_INT8)."""
    copies, in_f, out_f = _linear_view(t)
    if fmt.scheme is Scheme.BNB_INT8:
        return copies * bnb_int8_bytes(in_f, out_f), "int8 + fp32 SCB/row"
    qt = fmt.name.removesuffix("-dq")
    total = copies * bnb_4bit_bytes(
        t.numel // copies, blocksize=fmt.group_size, double_quant=fmt.double_quant
    )
    label = f"{qt} + uint8 absmax/64 (double quant)" if fmt.double_quant else f"{qt} + fp32 absmax/64"
    return total, label


def bnb_linear_data_bytes(t: Tensor, fmt: WeightFormat) -> int:
    """Of :func:`bnb_linear_storage`, the weight ``Parameter``'s own data: the packed 4-bit values (two per
    byte, whatever ``bnb_4bit_quant_storage`` holds them in) or the int8 values; the rest is the
    quantization state kept beside it (``QuantState``, ``SCB``)."""
    copies, in_f, out_f = _linear_view(t)
    if fmt.scheme is Scheme.BNB_INT8:
        return copies * in_f * out_f
    return copies * ((in_f * out_f + 1) // 2)


def tensor_storage(t: Tensor, fmt: WeightFormat, *, tied: bool) -> tuple[int, str]:
    """Bytes of one occurrence of ``t`` (all its copies) and a storage label. Not for GGUF."""
    fb = _float_bytes(fmt)
    keep = (t.numel * fb, fmt.float_dtype)
    weight_like = t.kind in ("linear_weight", "expert_weight") and len(t.shape) >= 2
    if fmt.scheme is Scheme.FLOAT or not weight_like:
        return keep
    copies, in_f, out_f = _linear_view(t)
    if fmt.scheme in (Scheme.BNB_4BIT, Scheme.BNB_INT8):
        if t.component == "head" or t.kind == "expert_weight" or (tied and t.component == "embeddings"):
            return keep
        return bnb_linear_storage(t, fmt)
    if fmt.scheme is Scheme.MXFP4:
        if t.kind != "expert_weight":
            return keep
        return copies * mxfp4_bytes(
            out_f, in_f
        ), "mxfp4 e2m1 + e8m0 scale/32 (MoE experts, as gpt-oss ships them)"
    if t.component not in _LAYER_LINEAR:
        return keep
    rows = out_f
    if fmt.scheme in TORCHAO_SCHEMES:
        # torchao's quantize_ (transformers' TorchAoHfQuantizer calls it per module) converts nn.Linear
        # modules only (quant_api.py _is_linear): fused 3-D expert parameters stay in the float dtype, and
        # transformers leaves the LM head out (4.47.1 quantizers/quantizer_torchao.py
        # _process_model_before_weight_loading: get_keys_to_not_convert)
        return _torchao_storage(t, fmt, copies, in_f, rows) if t.kind == "linear_weight" else keep
    if fmt.scheme is Scheme.NVFP4:
        return copies * nvfp4_linear_bytes(in_f, rows), "nvfp4 e2m1 + e4m3 scale/16 + 2 fp32 scales/tensor"
    if fmt.scheme is Scheme.FP8_BLOCK:
        r, k = fmt.block
        return copies * fp8_block_linear_bytes(in_f, rows, fmt.block), f"fp8 e4m3 + fp32 scale/{r}x{k} block"
    if fmt.scheme is Scheme.GPTQ:
        return copies * gptq_linear_bytes(
            in_f, rows, fmt.bits, fmt.group_size
        ), f"gptq int{fmt.bits} + fp16 scales"
    if fmt.scheme is Scheme.AWQ:
        return copies * awq_linear_bytes(
            in_f, rows, fmt.bits, fmt.group_size
        ), f"awq int{fmt.bits} + fp16 scales"
    if fmt.scheme is Scheme.FP8:
        label = "fp8 e4m3 + fp32 scale/" + ("channel" if fmt.per_channel else "tensor")
        return copies * fp8_linear_bytes(in_f, rows, per_channel=fmt.per_channel), label
    if fmt.scheme is Scheme.W8A8:
        return copies * fp8_linear_bytes(in_f, rows, per_channel=True), "int8 + fp32 scale/channel"
    raise InputError(f"weights={fmt.name!r}: not a tensor format")  # GGUF goes through gguf_rows


def _torchao_storage(t: Tensor, fmt: WeightFormat, copies: int, in_f: int, out_f: int) -> tuple[int, str]:
    if fmt.scheme is Scheme.TORCHAO_INT4:
        label = f"torchao int4 (tinygemm) + bf16 scale/zero per {fmt.group_size}"
        return copies * torchao_int4_linear_bytes(in_f, out_f, fmt.group_size), label
    if fmt.scheme is Scheme.TORCHAO_INT8:
        return copies * torchao_int8_linear_bytes(in_f, out_f), "torchao int8 + scale/row"
    label = "torchao float8 e4m3 + fp32 scale/" + ("row" if fmt.per_channel else "tensor")
    return copies * fp8_linear_bytes(in_f, out_f, per_channel=fmt.per_channel), label


def check_format(spec: ModelSpec, fmt: WeightFormat) -> None:
    """Raise InputError when the architecture cannot use the format (packing divisibility; MXFP4
    without MoE experts, which is the only part the gpt-oss format quantizes)."""
    if fmt.scheme is Scheme.MXFP4 and not any(t.kind == "expert_weight" for t, _ in spec.tensors()):
        raise InputError(
            f"weights={fmt.name!r}: {spec.name} has no MoE experts; MXFP4 checkpoints (gpt-oss) quantize "
            "only the experts (vLLM Mxfp4Config keeps every other linear unquantized)"
        )
    for t, _ in spec.tensors():
        if t.kind not in ("linear_weight", "expert_weight") or t.component not in _LAYER_LINEAR:
            continue
        _, in_f, out_f = _linear_view(t)
        if fmt.scheme is Scheme.NVFP4 and in_f % NVFP4_BLOCK:
            raise InputError(
                f"weights={fmt.name!r}: {t.name} has in_features={in_f}, not a multiple of {NVFP4_BLOCK} "
                "(vLLM ModelOptNvFp4LinearMethod refuses it)"
            )
        if fmt.scheme in (Scheme.GPTQ, Scheme.AWQ):
            # GPTQ packs rows of 32 inputs (qweight [in*bits/32, out]); AWQ needs whole groups.
            need_in = fmt.group_size if fmt.scheme is Scheme.AWQ else INT32_BITS
            if in_f % need_in:
                raise InputError(
                    f"weights={fmt.name!r}: {t.name} has in_features={in_f}, not a multiple of "
                    f"{need_in} that {fmt.scheme.value} packing needs"
                )
            per_int32 = INT32_BITS // math.gcd(INT32_BITS, fmt.bits)
            if out_f % per_int32:
                raise InputError(
                    f"weights={fmt.name!r}: {t.name} has out_features={out_f}; "
                    f"{fmt.bits}-bit zero points pack {per_int32} per int32"
                )


def _gguf_category(t: Tensor) -> str:
    if t.component == "head":
        return "output"
    if t.component == "embeddings":
        return "token_embd"
    leaf = t.name.removesuffix(".weight").rsplit(".", 1)[-1]  # fused experts: "mlp.experts.down_proj"
    return _GGUF_CATEGORY.get(leaf, "other")


def _gguf_tensor(spec: ModelSpec, fmt: WeightFormat, t: Tensor, i_layer: int) -> tuple[str, int]:
    """(ggml type, bytes) of one occurrence of ``t`` in layer ``i_layer`` of a GGUF file."""
    if len(t.shape) < 2 or t.kind in ("norm", "linear_bias") or t.component == "router":
        return "F32", t.numel * 4
    att = spec.first_layer.attention
    ggml = gguf_type_for(
        fmt.gguf_type, _gguf_category(t), i_layer=i_layer, n_layers=spec.num_layers,
        n_gqa=att.num_heads // att.num_kv_heads, n_expert=max(g.layer.mlp.num_experts for g in spec.groups),
        ne0=t.shape[-1], tied=spec.tie_word_embeddings,
    )  # fmt: skip
    return ggml, t.copies * gguf_tensor_bytes(ggml, t.shape)


def gguf_rows(spec: ModelSpec, fmt: WeightFormat) -> tuple[WeightRow, ...]:
    """Per-tensor GGUF storage, layer by layer (the type can change with the layer index)."""
    rows: dict[str, tuple[Tensor, int, int, set[str]]] = {}

    def add(t: Tensor, i_layer: int) -> None:
        ggml, nbytes = _gguf_tensor(spec, fmt, t, i_layer)
        first, params, total, types = rows.get(t.name, (t, 0, 0, set()))
        rows[t.name] = (first, params + t.numel, total + nbytes, types | {ggml})

    for t in spec.outer:
        add(t, 0)
    for i, layer in enumerate(spec.layers()):
        for t in layer.tensors:
            add(t, i)
    return tuple(
        WeightRow(name=name, component=t.component, params=params, bytes=total,
                  storage="/".join(sorted(types)), kind=t.kind)
        for name, (t, params, total, types) in rows.items()
    )  # fmt: skip


def per_layer_weight_bytes(spec: ModelSpec, fmt: WeightFormat) -> tuple[int, ...]:
    """Bytes of each decoder layer in order (GGUF types can differ layer by layer)."""
    if fmt.scheme is Scheme.GGUF:
        return tuple(
            sum(_gguf_tensor(spec, fmt, t, i)[1] for t in layer.tensors)
            for i, layer in enumerate(spec.layers())
        )
    out: list[int] = []
    for g in spec.groups:
        size = sum(tensor_storage(t, fmt, tied=spec.tie_word_embeddings)[0] for t in g.layer.tensors)
        out.extend([size] * g.count)
    return tuple(out)


def weight_rows(spec: ModelSpec, fmt: WeightFormat) -> tuple[WeightRow, ...]:
    """Storage of every parameter tensor (over its occurrences) in ``fmt``."""
    if fmt.scheme is Scheme.GGUF:
        return gguf_rows(spec, fmt)
    check_format(spec, fmt)
    out = []
    for t, n in spec.tensors():
        nbytes, label = tensor_storage(t, fmt, tied=spec.tie_word_embeddings)
        out.append(WeightRow(name=t.name, component=t.component, params=t.numel * n, bytes=nbytes * n,
                             storage=label, kind=t.kind))  # fmt: skip
    return tuple(out)


def largest_quantized_linear(spec: ModelSpec, fmt: WeightFormat) -> tuple[int, int]:
    """(in_features, out_features) of the largest linear (one copy) that ``fmt`` quantizes; (0, 0)
    when nothing is quantized. Kernels that dequantize a whole weight for large inputs (bitsandbytes
    ``matmul_4bit`` beyond one token, AutoAWQ GEMM and exllama for long inputs) hold one such copy."""
    best = (0, 0)
    if fmt.scheme in (Scheme.FLOAT, Scheme.GGUF):
        return best
    for t, _ in spec.tensors():
        if t.kind not in ("linear_weight", "expert_weight") or len(t.shape) < 2:
            continue
        _, stored = tensor_storage(t, fmt, tied=spec.tie_word_embeddings)
        if stored == fmt.float_dtype:
            continue
        _, in_f, out_f = _linear_view(t)
        if in_f * out_f > best[0] * best[1]:
            best = (in_f, out_f)
    return best


def bnb_kept_expert_params(rows: Sequence[WeightRow], fmt: WeightFormat) -> int:
    """Expert parameters that ``fmt`` (bitsandbytes 4-bit or int8) leaves in 16-bit: the rows of the
    experts stored in the float dtype (fused 3-D parameters and their biases; see the module docstring),
    0 when no fused expert weight is among them or ``fmt`` is not bitsandbytes."""
    if fmt.scheme not in (Scheme.BNB_4BIT, Scheme.BNB_INT8):
        return 0
    kept = [r for r in rows if r.component == "experts" and r.storage == fmt.float_dtype]
    return sum(r.params for r in kept) if any(r.kind == "expert_weight" for r in kept) else 0


def weight_bytes(spec: ModelSpec, fmt: WeightFormat) -> int:
    return sum(r.bytes for r in weight_rows(spec, fmt))
