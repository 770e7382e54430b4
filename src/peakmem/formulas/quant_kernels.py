"""Device memory of quantized linears' kernels in transformers ``generate``, beyond the packed weights:
the GPTQ backends' persistent workspaces and the dequantized temporaries of a forward (issue 27 part 4).

What each backend allocates, read from the versions the optimum GPTQ benchmark ran (transformers
4.32-4.35 loading through optimum's ``GPTQQuantizer.post_init_model``, which calls auto-gptq's
``autogptq_post_init``; optimum@v1.14.0 ``optimum/gptq/quantizer.py``):

* **exllama** (v1; AutoGPTQ@v0.4.2 ``auto_gptq/modeling/_utils.py`` ``autogptq_post_init``): one ``temp_dq``
  buffer per device, ``torch.zeros((1, max_dq_buffer_size), float16)`` with ``max_dq_buffer_size`` the
  largest ``qweight.numel() * 8`` over the exllama linears (a 4-bit layer's in x out), and one
  ``temp_state`` ``torch.zeros((max_input_len, max_inner_outer_dim), float16)``: (1, 1) without act-order.
  Both stay for the model's life (``model.device_to_buffers``). A forward of at least
  ``matmul_recons_thd`` = 8 rows dequantizes the layer into ``temp_dq`` and calls cuBLAS
  (``autogptq_cuda/exllama/cuda_func/q4_matmul.cu`` ``q4_matmul_recons_cuda``): no further memory.
* **exllamav2** (AutoGPTQ@v0.5.1 ``_utils.py`` ``autogptq_post_init`` and ``nn_modules/qlinear/
  qlinear_exllamav2.py``): one scratch per device, ``ExLlamaV2DeviceTensors.prepare``:
  ``torch.empty((scratch_bytes // 2,), half)``, ``scratch_bytes`` the largest ``scratch_space_fixed()``
  = ``temp_dq_size() + temp_fwd_size(2048, 8)`` = ``(in x out x 2 + 128) + (out x 2048 x 8 x 4 + 128)``
  over the layers: the MLP's gate/up projection (the widest ``out``) sets it. Only its first
  ``temp_dq_size`` bytes are used (``get_scratch_slice``): ``gemm_half_q_half`` reconstructs into it for
  more than ``MAX_Q_GEMM_ROWS`` = 50 rows (``autogptq_extension/exllamav2/cuda/q_gemm.cu``, ``config.h``).
  ``ext_make_q_matrix`` allocates ``q_perm`` and ``q_invperm`` (int16, ``qweight.shape[0] x 8`` = in
  each) for every layer whose ``g_idx`` is not all zero, which is every grouped checkpoint, act-order
  or not (``g_idx[i] = i // group_size``); the C++ ``QMatrix`` only keeps pointers (its
  ``make_sequential`` buffer is freed at load).
* **cuda-old** (auto-gptq's ``qlinear_cuda_old``, taken without exllama and without act-order;
  AutoGPTQ@v0.4.2 ``nn_modules/qlinear/qlinear_cuda_old.py`` ``QuantLinear.forward``): below
  ``kernel_switch_threshold`` = 128 rows a CUDA kernel (an fp32 output, a layer output's size);
  from 128 rows the weight is dequantized with torch ops, each a new tensor: the int32 shift of the
  expanded ``qweight`` (4 B per weight) and its int8 copy (``.to(int8)``; int16 for 8 bits) live
  together, later the int8 weight, ``weight - zeros`` and the fp16 ``scales * (...)``: the peak is
  ``max(4 + b, 2 b + 2)`` bytes per weight (``b`` the int width) plus the unpacked ``zeros``; the 3-bit
  path keeps int32 throughout (10 B per weight, see :func:`cuda_old_dequant_bytes`).
* **bitsandbytes 4-bit** (bitsandbytes@0.41.1, 18e827d ``bitsandbytes/autograd/_functions.py``
  ``matmul_4bit``; the same test through 0.48.0): ``gemv_4bit`` only when the input is ONE row
  (``A.numel() == A.shape[-1]``: batch 1, one token); otherwise ``MatMul4Bit.forward`` runs
  ``F.dequantize_4bit(B, state)`` into a new weight in the compute dtype, so decode at batch 2 or
  more dequantizes too. Double quantization adds the fp32 absmax it dequantizes first
  (``functional.py`` ``dequantize_4bit``: ``absmax = dequantize_blockwise(...)``). bitsandbytes 0.50.0
  (c5d481b, ``backends/cuda/ops.py`` ``gemm_4bit``) runs a fused kernel up to
  ``_GEMM_4BIT_CUSTOM_FLOOR_M`` = 4 rows, the dequantize + ``F.linear`` fallback beyond 1,536 rows, and
  chooses by GPU architecture and shape in between: peakmem has no bitsandbytes version, so it
  counts the dequantized weight from 2 rows (the release the published runs used; the higher of the
  two for 2-4 rows).
* **AWQ with exllamav2** (transformers 4.47.1 ``AwqConfig(version="exllama")``: ``exllama_config``
  defaults to ``{"version": 2, "max_input_len": 2048, "max_batch_size": 8}``, utils/quantization_config.py;
  integrations/awq.py ``post_init_awq_exllama_modules`` -> AutoAWQ 0.2.7 ``awq/modules/linear/
  exllamav2.py`` ``exllamav2_post_init``): the same per-device scratch, ``ScratchSpace(max over the layers
  of temp_dq_size() + temp_fwd_size(2048, 8))`` = ``(in x out x 2 + 128) + (out x 2048 x 8 x 4 + 128)``,
  ``out`` unpadded; ``make_q_matrix`` gets no ``q_perm`` / ``q_invperm`` (``none_tensor``). The load's
  repacking (``unpack_reorder_pack``) is transient and before generate.
* AWQ (other kernels) and LLM.int8 keep the prefill terms peakmem had (one dequantized weight; int8
  input and int32 output of ``int8_linear_matmul``).

Not modelled: act-order (``desc_act=True``) GPTQ checkpoints (exllama's ``temp_state`` of
2048 x max(in, out) fp16 and its ``cuda_x_map`` of 4 B per input row outside torch); Marlin, whose
repacked weights drop ``qzeros`` and ``g_idx`` (AutoGPTQ@v0.7.1 ``qlinear_marlin.py``: a per-layer
``workspace`` of out / 128 x 16 int32); a GPTQ model with no kernel named keeps the generic prefill term
(one weight dequantized in the compute dtype).
"""

from __future__ import annotations

import math

from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas.weights import (
    BF16_BYTES,
    FP16_BYTES,
    FP32_BYTES,
    INT32_BITS,
    tensor_storage,
    tinygemm_padded,
)
from peakmem.inference import GptqKernel, InferenceSetup
from peakmem.model import ModelSpec
from peakmem.weight_formats import Scheme, WeightFormat

INT16_BYTES = 2  # q_perm / q_invperm (torch.short); cuda-old's 8-bit unpacked weight (torch.int16)
INT32_BYTES = 4  # cuda-old's shifted qweight (torch.int32)

# exllama (v1): AutoGPTQ@v0.4.2 auto_gptq/modeling/_utils.py autogptq_post_init
EXLLAMA_BITS = 4  # qlinear_exllama / qlinear_exllamav2 take 4-bit weights only
EXLLAMA_DQ_ELEMENTS_PER_QWEIGHT = 8  # max_dq_buffer_size = qweight.numel() * 8
# without act-order: max_input_len = 1 and max_inner_outer_dim = 1, a (1, 1) fp16 temp_state
EXLLAMA_TEMP_STATE_ELEMENTS = 1
# exllamav2: AutoGPTQ@v0.5.1 nn_modules/qlinear/qlinear_exllamav2.py QuantLinear.scratch_space_fixed
EXLLAMAV2_SCRATCH_INPUT_LEN = 2048  # max_input_len default
EXLLAMAV2_SCRATCH_BATCH = 8  # max_batch_size default
EXLLAMAV2_FWD_BYTES = 4  # temp_fwd_size: outfeatures x max_input_len x max_batch_size x 4
EXLLAMAV2_PAD = 128  # + 128 on each of temp_dq_size and temp_fwd_size
EXLLAMAV2_OUT_ALIGN = 32  # QuantLinear.padding = -outfeatures % 32
EXLLAMAV2_PERMS = 2  # q_perm and q_invperm, int16, in elements each (ext_make_q_matrix)
AWQ_EXLLAMAV2_OUT_ALIGN = 1  # AutoAWQ 0.2.7 WQLinear_ExllamaV2.temp_dq_size: in x out x 2 + 128, unpadded
# cuda-old: AutoGPTQ@v0.4.2 nn_modules/qlinear/qlinear_cuda_old.py
CUDA_OLD_KERNEL_SWITCH_THRESHOLD = 128  # QuantLinear(kernel_switch_threshold=128)
CUDA_OLD_3BIT_BYTES_PER_WEIGHT = 10  # 3-bit path: int32 weight + int32 (weight - zeros) + fp16 product
# bitsandbytes 0.41.1 matmul_4bit: gemv_4bit only for an input of one row
BNB_GEMV_ROWS = 1
# torchao float8 dynamic activation quantization of an input row (v0.12.0 quant_primitives.py
# _quantize_affine_float8): its fp32 copy, the row scale expanded to the input's shape (repeat_interleave;
# 0.14 on broadcast it: 13 B), the scaled and the clamped fp32 tensors, and the e4m3 result alive together.
TORCHAO_FP8_ACT_BYTES = 4 + 4 + 4 + 4 + 1


def quantized_linears(spec: ModelSpec, fmt: WeightFormat) -> tuple[tuple[int, int, int], ...]:
    """(in_features, out_features, occurrences) of each linear weight that ``fmt`` quantizes (the
    ones :func:`peakmem.formulas.weights.tensor_storage` stores outside the float dtype)."""
    out = []
    for t, n in spec.tensors():
        if t.kind not in ("linear_weight", "expert_weight") or len(t.shape) < 2:
            continue
        _, stored = tensor_storage(t, fmt, tied=spec.tie_word_embeddings)
        if stored == fmt.float_dtype:
            continue
        copies = t.copies * math.prod(t.shape[:-2])  # fused 3-D experts count E copies
        out.append((t.shape[-1], t.shape[-2], copies * n))
    return tuple(out)


def _largest(linears: tuple[tuple[int, int, int], ...], tp: int) -> tuple[int, int]:
    best = (0, 0)
    for in_f, out_f, _ in linears:
        o = -(-out_f // tp)
        if in_f * o > best[0] * best[1]:
            best = (in_f, o)
    return best


# --- persistent workspaces ---------------------------------------------------------------------
def exllama_temp_dq_bytes(linears: tuple[tuple[int, int, int], ...], bits: int = EXLLAMA_BITS) -> int:
    """exllama's ``temp_dq``: fp16 x the largest ``qweight.numel() * 8`` (``qweight`` is int32
    ``[in * bits / 32, out]``), plus the act-order-free (1, 1) fp16 ``temp_state``."""
    largest = max((in_f // INT32_BITS * bits * out_f for in_f, out_f, _ in linears), default=0)
    if not largest:
        return 0
    return (largest * EXLLAMA_DQ_ELEMENTS_PER_QWEIGHT + EXLLAMA_TEMP_STATE_ELEMENTS) * FP16_BYTES


def exllamav2_scratch_bytes(
    linears: tuple[tuple[int, int, int], ...], out_align: int = EXLLAMAV2_OUT_ALIGN
) -> int:
    """exllamav2's per-device scratch: the largest ``temp_dq_size() + temp_fwd_size(2048, 8)``, held
    as ``scratch_bytes // 2`` fp16 elements (``out_align``: auto-gptq pads ``out`` to 32, AutoAWQ's
    ``WQLinear_ExllamaV2`` does not: 1)."""
    best = 0
    for in_f, out_f, _ in linears:
        out_p = out_f + (-out_f % out_align)
        dq = in_f * out_p * FP16_BYTES + EXLLAMAV2_PAD
        fwd = (
            out_p * EXLLAMAV2_SCRATCH_INPUT_LEN * EXLLAMAV2_SCRATCH_BATCH * EXLLAMAV2_FWD_BYTES
            + EXLLAMAV2_PAD
        )
        best = max(best, dq + fwd)
    return best // FP16_BYTES * FP16_BYTES


def exllamav2_perm_bytes(linears: tuple[tuple[int, int, int], ...], bits: int, group_size: int) -> int:
    """``q_perm`` + ``q_invperm`` (int16, ``qweight.shape[0] * 8`` each) of every layer whose ``g_idx``
    (``i // group_size``) is not all zero: all but one-group (``group_size`` -1 or >= in) layers."""
    total = 0
    for in_f, _, n in linears:
        if group_size == -1 or group_size >= in_f:
            continue
        rows = in_f // INT32_BITS * bits * 8
        total += n * EXLLAMAV2_PERMS * rows * INT16_BYTES
    return total


def kernel_buffer_items(spec: ModelSpec, setup: InferenceSetup) -> list[MemoryItem]:
    """The persistent workspaces of ``setup.gptq_kernel`` (allocated at load, alive in every phase)."""
    fmt, kernel = setup.weight_format, setup.gptq_kernel
    if fmt.scheme not in (Scheme.GPTQ, Scheme.AWQ) or kernel is None:
        return []
    linears = tuple((i, -(-o // setup.tp), n) for i, o, n in quantized_linears(spec, fmt))
    if fmt.scheme is Scheme.AWQ:  # exllamav2 only (InferenceSetup checks it)
        return [
            MemoryItem(
                path="AutoAWQ exllamav2 scratch (temp_dq + temp_fwd of 2048 x 8 tokens, largest layer)",
                category=Category.BUFFERS,
                bytes=exllamav2_scratch_bytes(linears, out_align=AWQ_EXLLAMAV2_OUT_ALIGN),
                source="formulas/quant_kernels.py exllamav2_scratch_bytes (AutoAWQ 0.2.7 exllamav2_post_init "
                "via transformers 4.47.1 AwqConfig(version='exllama'))",
            )
        ]
    if kernel is GptqKernel.EXLLAMA:
        return [
            MemoryItem(
                path="exllama temp_dq + temp_state (largest layer, fp16)",
                category=Category.BUFFERS,
                bytes=exllama_temp_dq_bytes(linears, fmt.bits),
                source="formulas/quant_kernels.py exllama_temp_dq_bytes (AutoGPTQ v0.4.2 autogptq_post_init)",
            )
        ]
    if kernel is GptqKernel.EXLLAMAV2:
        return [
            MemoryItem(
                path="exllamav2 scratch (temp_dq + temp_fwd of 2048 x 8 tokens, largest layer)",
                category=Category.BUFFERS,
                bytes=exllamav2_scratch_bytes(linears),
                source="formulas/quant_kernels.py exllamav2_scratch_bytes (AutoGPTQ v0.5.1 "
                "ExLlamaV2DeviceTensors)",
            ),
            MemoryItem(
                path="exllamav2 q_perm + q_invperm (int16 per input row, every layer)",
                category=Category.BUFFERS,
                bytes=exllamav2_perm_bytes(linears, fmt.bits, fmt.group_size),
                source="formulas/quant_kernels.py exllamav2_perm_bytes (AutoGPTQ v0.5.1 ext_make_q_matrix)",
            ),
        ]
    return []


# --- temporaries of one forward ----------------------------------------------------------------
def cuda_old_dequant_bytes(in_f: int, out_f: int, bits: int, group_size: int) -> int:
    """Peak of auto-gptq ``qlinear_cuda_old``'s torch dequantization of one ``in x out`` layer
    (``N = in x out`` weights, ``G`` groups): 2/4/8 bits, ``b`` = 1 (int8) or 2 (int16, 8 bits) bytes:
    the int32 shift result (4 N) beside its ``.to(int8)`` copy (b N), then the weight, ``weight - zeros``
    and the fp16 product (b N + b N + 2 N), with the unpacked ``zeros`` (b G out) alive throughout.
    3 bits: int32 tensors throughout (``(weight >> wf) & 7`` then ``torch.cat``), peak at the fp16
    product: weight 4 N + ``weight - zeros`` 4 N + product 2 N, with int32 ``zeros`` (4 G out)."""
    n = in_f * out_f
    groups = -(-in_f // (in_f if group_size == -1 else group_size))
    if bits == 3:
        return CUDA_OLD_3BIT_BYTES_PER_WEIGHT * n + INT32_BYTES * groups * out_f
    b = INT16_BYTES if bits == 8 else 1
    return max(INT32_BYTES + b, 2 * b + FP16_BYTES) * n + b * groups * out_f


def int8_matmul_bytes(rows: int, in_f: int, out_f: int) -> int:
    """LLM.int8's matmul of ``rows`` rows beyond the weight: the int8 input and the int32 output (its fp32
    row scales and the fp16 output are small beside them, not counted)."""
    return rows * (in_f + out_f * INT32_BYTES)


def matmul_temporary_bytes(
    spec: ModelSpec, setup: InferenceSetup, rows: int, act_bytes: int, *, prefill: bool
) -> int:
    """Temporaries of the quantized linears in one forward of ``rows`` input rows (batch x tokens):
    one layer at a time, the largest. Prefill and decode differ only for the kernels whose source
    says so (bitsandbytes 4-bit, the GPTQ kernels); AWQ and LLM.int8 keep their prefill terms."""
    in_f, out_f = _largest(quantized_linears(spec, setup.weight_format), setup.tp)
    if not in_f:
        return 0
    return linear_temporary_bytes(in_f, out_f, setup, rows, act_bytes, prefill=prefill)


def linear_temporary_bytes(
    in_f: int, out_f: int, setup: InferenceSetup, rows: int, act_bytes: int, *, prefill: bool
) -> int:
    """The temporaries of one quantized ``in_f`` x ``out_f`` linear over ``rows`` input rows (module
    docstring; 0 for a float format)."""
    fmt, kernel = setup.weight_format, setup.gptq_kernel
    if fmt.scheme is Scheme.BNB_4BIT:
        if rows <= BNB_GEMV_ROWS:
            return 0
        absmax = -(-in_f * out_f // fmt.group_size) * FP32_BYTES if fmt.double_quant else 0
        return in_f * out_f * act_bytes + absmax
    if fmt.scheme in (Scheme.GPTQ, Scheme.AWQ) and kernel is not None:
        if kernel is GptqKernel.CUDA_OLD and rows >= CUDA_OLD_KERNEL_SWITCH_THRESHOLD:
            return cuda_old_dequant_bytes(in_f, out_f, fmt.bits, fmt.group_size)
        return 0  # exllama / exllamav2 reconstruct into their persistent temp_dq
    if fmt.scheme is Scheme.TORCHAO_INT8:  # the int8 weight cast to the input's dtype for torch.mm, each call
        return in_f * out_f * act_bytes
    if fmt.scheme is Scheme.TORCHAO_INT4:  # the input padded to a multiple of 1024 columns (a copy)
        return rows * tinygemm_padded(in_f) * BF16_BYTES
    if fmt.scheme is Scheme.TORCHAO_FP8:
        return rows * in_f * TORCHAO_FP8_ACT_BYTES
    if not prefill or rows <= 1:
        return 0
    if fmt.scheme is Scheme.BNB_INT8:
        return int8_matmul_bytes(rows, in_f, out_f)
    if fmt.scheme in (Scheme.GPTQ, Scheme.AWQ):
        return in_f * out_f * act_bytes
    return 0


TORCHAO_NOTES = {
    Scheme.TORCHAO_INT4: "torchao int4 weight-only (tinygemm _weight_int4pack_mm): no dequantized weight; "
    "each linear copies its input padded to a multiple of 1024 columns (tensor_core_tiled_layout.py)",
    Scheme.TORCHAO_INT8: "torchao int8 weight-only: each linear casts its int8 weight to the input's dtype "
    "for torch.mm, decode included (v0.9 plain_layout.py _linear_fp_act_int8_weight_impl; 0.18 Int8Tensor "
    "alike)",
    Scheme.TORCHAO_FP8: "torchao float8 dynamic quantization: each linear quantizes its input per row to "
    "e4m3 (fp32 temporaries of the input's size) for torch._scaled_mm",
}


def kernel_notes(setup: InferenceSetup) -> tuple[str, ...]:
    """The answer's assumptions about the quantized kernels (none for other formats)."""
    fmt, kernel = setup.weight_format, setup.gptq_kernel
    if fmt.scheme is Scheme.BNB_4BIT:
        return (
            "bitsandbytes 4-bit: one layer's weight dequantized per forward of 2 or more rows (matmul_4bit "
            "through 0.48; 0.50's fused gemm_4bit keeps up to 4 rows without it)",
        )
    if fmt.scheme is Scheme.AWQ and kernel is not None:
        return (
            "AWQ with transformers' exllama version (AwqConfig exllama_config default: v2, max_input_len "
            "2048, max_batch_size 8): AutoAWQ's exllamav2 scratch for the model's life, prefill "
            "reconstructs into it (formulas/quant_kernels.py)",
        )
    if fmt.scheme in TORCHAO_NOTES:
        return (TORCHAO_NOTES[fmt.scheme],)
    if fmt.scheme is not Scheme.GPTQ:
        return ()
    if kernel is None:
        return (
            "GPTQ kernel not named (--gptq-kernel exllama|exllamav2|cuda-old): prefill holds one layer "
            "dequantized to fp16, no kernel workspace",
        )
    return (
        f"GPTQ kernel {kernel.value} as auto-gptq 0.4-0.5 allocates it (formulas/quant_kernels.py); "
        "desc_act=False checkpoint",
    )


__all__ = [
    "cuda_old_dequant_bytes", "exllama_temp_dq_bytes", "exllamav2_perm_bytes", "exllamav2_scratch_bytes",
    "int8_matmul_bytes", "kernel_buffer_items", "kernel_notes", "matmul_temporary_bytes", "quantized_linears",
]  # fmt: skip
