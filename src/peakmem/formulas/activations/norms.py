"""What a norm saves (2 pre-norms; Gemma 2/3 add 2 post-norms; Falcon-7B has one; Qwen3/OLMo-2 q/k norms
and MLA latent norms on top).

LayerNorm (aten ``native_layer_norm``) saves its input (r) and mean/rstd (T each; fp32 on CUDA, input
dtype on CPU); RMSNorm (``LlamaRMSNorm``: ``x.to(float32)``, ``pow``, ``rsqrt``, ``y.to(dtype)``,
``weight * y``) saves the fp32 upcast x (4), y in the input dtype and rstd (T x 4).
"""

from __future__ import annotations

from peakmem.breakdown import MemoryItem
from peakmem.model import Layer, ModelSpec
from peakmem.training import KernelPolicy

from .fused import fused_rmsnorm_pieces
from .shapes import NormStage, Shapes, item, sized

# Norms inside attention (q/k norms, MLA latent norms): not norms of the block's hidden state.
QK_NORM_MODULES = frozenset(
    {"q_norm", "k_norm", "q_layernorm", "k_layernorm", "q_a_layernorm", "kv_a_layernorm"}
)
SRC_NORM = "aten native_layer_norm saves input, mean, rstd; LlamaRMSNorm saves x.float(), y, rstd"
# The norm over the MLP's output that ends a Gemma 2/3 sandwich block (modeling_gemma2.py
# ``Gemma2DecoderLayer.forward``: ``post_feedforward_layernorm`` then the residual add) and an OLMo 2
# post-norm block (modeling_olmo2.py ``Olmo2DecoderLayer.forward``): the block's backward starts in it.
POST_MLP_NORM_MODULES = frozenset({"post_feedforward_layernorm"})
# fp32 T x h tensors alive at once inside an unfused RMSNorm's backward (``x * rsqrt(x.pow(2).mean(-1))``
# on x.float(), aten derivatives.yaml): at PowBackward, ``grad * 2 * self.pow(1)`` (pow, mul, mul) while
# MeanBackward's ``grad.expand(...) / n`` (div) and the x-side gradient of ``x * rsqrt`` (mul, waiting to
# be summed with the pow branch) are alive. Counted with simulate (tiny Gemma 2/3, full checkpointing:
# ``post_feedforward_layernorm (backward)``: 3 mul + div + pow, each B x S x h fp32).
RMSNORM_BACKWARD_FP32 = 5


def norm_saved(spec: ModelSpec, sh: Shapes, width: int) -> int:
    """Bytes one norm saves for ``tokens x width`` inputs (its output is counted by its readers)."""
    return sum(norm_pieces(spec, sh, width))


def norm_pieces(spec: ModelSpec, sh: Shapes, width: int, rows: int = 1) -> tuple[int, ...]:
    """The tensors one norm saves for ``tokens x width`` inputs, in the order it makes them; ``rows``
    statistics per token (a per-head q/k norm: one per head)."""
    t = sh.tokens
    if spec.norm == "rmsnorm" and (sh.compiled or sh.fused_kernels):
        return fused_rmsnorm_pieces(sh, width, rows)
    if spec.norm == "rmsnorm" and sh.profile.rmsnorm_in_input_dtype:
        # Lit-GPT rmsnorm.py: x * x and x * rsqrt(...) keep the input itself and the rstd, in its dtype
        return t * width * sh.r, t * rows * sh.r, rmsnorm_weight_side_bytes(spec, sh, width)
    if spec.norm == "rmsnorm":
        # x.to(float32) is kept by pow and mul (4 B), then the fp32 rstd; y = (x * rstd).to(input dtype)
        # by weight * y (recorded order in simulate's trace of Qwen3: 16 MiB, 0.125 MiB, 8 MiB for q)
        return t * width * 4, t * rows * 4, rmsnorm_weight_side_bytes(spec, sh, width)
    if spec.layernorm_fp32:  # OlmoLayerNorm: layer_norm saves its fp32 upcast input and fp32 mean/rstd
        return t * width * 4, t * rows * 4, t * rows * 4
    stat_bytes = 4 if sh.policy is KernelPolicy.CUDA or sh.r == 4 else sh.r
    return t * width * sh.r, t * rows * stat_bytes, t * rows * stat_bytes


def rmsnorm_weight_side_bytes(spec: ModelSpec, sh: Shapes, width: int) -> int:
    """Bytes of the normalised x an unfused RMSNorm saves only for its weight's gradient: ``weight * y``
    (modeling_llama.py ``LlamaRMSNorm.forward``) keeps y, in the input dtype (fp32 under autocast's fp32
    residual, else the compute dtype), or fp32 where the norm multiplies before casting back
    (modeling_gemma.py ``GemmaRMSNorm.forward``: ``output * (1.0 + self.weight.float())``; not in a
    framework's own norm that multiplies in the input dtype, :attr:`Profile.rmsnorm_weight_in_input_dtype`).
    A frozen
    norm (LoRA) does not keep it (aten ``mul`` saves ``self`` only when ``other`` requires grad). 0 for
    LayerNorm and for a fused / compiled RMSNorm (it saves its input and rstd whatever the weight)."""
    if spec.norm != "rmsnorm" or sh.compiled or sh.fused_kernels:
        return 0
    fp32_normed = sh.profile.rmsnorm_normed_fp32 or (
        spec.rmsnorm_normed_fp32 and not sh.profile.rmsnorm_weight_in_input_dtype
    )
    return sh.tokens * width * (4 if sh.plan.autocast or fp32_normed else sh.c)


def rmsnorm_backward_temporaries(spec: ModelSpec, sh: Shapes, width: int) -> int:
    """The fp32 ``tokens x width`` temporaries an unfused RMSNorm's backward holds at once
    (:data:`RMSNORM_BACKWARD_FP32` of them, fp32 whatever the input dtype: the norm computes on
    ``x.to(float32)``); 0 for LayerNorm and a fused / compiled RMSNorm."""
    if spec.norm != "rmsnorm" or sh.compiled or sh.fused_kernels:
        return 0
    return RMSNORM_BACKWARD_FP32 * sh.tokens * width * (sh.r if sh.profile.rmsnorm_in_input_dtype else 4)


def pre_mlp_norm_stage(spec: ModelSpec, sh: Shapes, mlp_in: int, mlp_saved: int, mlp_grads: int) -> NormStage:
    """The backward of a pre-norm block's second RMSNorm (``post_attention_layernorm``, modeling_llama.py
    ``LlamaDecoderLayer.forward``), between the MLP half's backward and the attention half's: next to
    the layer's saved tensors less the MLP's (``mlp_saved``: its interior and dropout mask), the MLP input
    ``mlp_in`` (the norm output) and the norm's weight-side y (all freed by then), its fp32 temporaries
    (:func:`rmsnorm_backward_temporaries`) and the incoming residual gradient (``T x h`` in the residual
    dtype), with all the MLP's weight gradients (``mlp_grads``) written. Measured with the parallel oracle
    (peakmem.measure.parallel, torch 2.13, FSDP2 MixedPrecisionPolicy(param_dtype=bf16)): at the
    backward peak ``backward: mul`` x3, ``div``, ``pow`` (fp32 B x S x h) and the bf16 residual gradient
    (``_to_copy``). Its fp32 temporaries outweigh a 16-bit MLP's gradients where the MLP is narrow or
    split by TP while the norm is not (tp2 x fsdp2 mixed-bf16, full checkpointing: -4.2% without it).
    ``NormStage()`` for other norms and blocks."""
    tmp = rmsnorm_backward_temporaries(spec, sh, spec.hidden_size)
    if not tmp:
        return NormStage()
    t, h = sh.tokens, spec.hidden_size
    return NormStage(
        hidden_temporaries=tmp + t * h * sh.r,
        hidden_freed=mlp_in + rmsnorm_weight_side_bytes(spec, sh, h),
        other_freed=mlp_saved,
        grads=mlp_grads,
        sizes=(t * h * sh.r, *(t * h * 4,) * RMSNORM_BACKWARD_FP32),
    )


def post_mlp_norm_backward(spec: ModelSpec, layer: Layer, sh: Shapes) -> int:
    """Bytes beyond the saved tensors at the start of the backward of a block that ends with an
    unfused RMSNorm of the MLP output (:data:`POST_MLP_NORM_MODULES`): every saved tensor of the block
    is still alive, next to the incoming gradient (residual dtype) and the norm's fp32 backward
    temporaries (:data:`RMSNORM_BACKWARD_FP32`). 0 for other blocks and fused / compiled norms."""
    if spec.norm != "rmsnorm" or sh.compiled or sh.fused_kernels:
        return 0
    if not any(t.kind == "norm" and t.module in POST_MLP_NORM_MODULES for t in layer.tensors):
        return 0
    t, h = sh.tokens, spec.hidden_size
    return rmsnorm_backward_temporaries(spec, sh, h) + t * h * sh.r


def qk_norm_item(spec: ModelSpec, layer: Layer, sh: Shapes) -> MemoryItem:
    """What a q/k norm pair saves. An RMSNorm keeps one fp32 rstd per token and norm: per head
    (Qwen3, Gemma 3: over head_dim) ``heads`` of them for q and ``kv_heads`` for k; a full-width pair
    (modeling_olmo2.py ``q_norm``/``k_norm`` over all heads) one each. A LayerNorm pair is counted as
    one norm over both widths (its statistics are a few kB)."""
    att = layer.attention
    path = "attn.q_norm, k_norm (input + stats)"
    if spec.norm != "rmsnorm":
        return item(path, norm_saved(spec, sh, qk_norm_width(layer)), SRC_NORM, "attn.qk_norm", 2)
    q, k = att.num_heads * att.head_dim, att.num_kv_heads * att.head_dim
    per_head = att.qk_norm == "per_head"
    q_rows, k_rows = (att.num_heads, att.num_kv_heads) if per_head else (1, 1)
    pieces = norm_pieces(spec, sh, q, q_rows) + norm_pieces(spec, sh, k, k_rows)
    return sized(path, pieces, SRC_NORM, "attn.qk_norm")


def qk_norm_width(layer: Layer) -> int:
    """Features per token a q/k norm pair normalises: all q and k heads (per-head or full width)."""
    att = layer.attention
    return (att.num_heads + att.num_kv_heads) * att.head_dim
