"""Fused and compiled kernels (:mod:`peakmem.formulas.profiles`): what torch.compile's partitioner,
Liger's and unsloth's Triton kernels save instead of the eager tensors."""

from __future__ import annotations

from peakmem.breakdown import MemoryItem

from .shapes import Shapes, item

# --- fused and compiled kernels (peakmem.formulas.profiles) -----------------------------------------------
# torch.compile, measured (benchmarks/compile_activations.py, torch 2.13 Inductor, its default training
# partitioner ``min_cut_rematerialization_partition``, one Llama layer compiled on its own as torchtune's
# ``compile_model`` does): the partitioner keeps matmul inputs and outputs and recomputes pointwise chains
# in backward. Per layer, against the eager list above: each block RMSNorm keeps only its rstd (T x fp32);
# the layer's input itself stays alive (the first norm's backward reads it; in eager only its fp32 copy
# is kept); each norm output is kept once in the compute dtype (under autocast one cast, not one per
# Linear); the gated MLP keeps gate, up and their product (act(gate) recomputed); SDPA's
# output and o_proj's input become two buffers. Measured on bf16 and fp32 layers, torchtune-style and
# transformers-style (hidden 128-512, 2-8 heads, 1-2 kv heads, batch x seq 64-256): exact to the byte;
# under CPU autocast (amp-bf16, one case) exact as well. The same holds for transformers' GPT2Block, a
# sequential pre-LayerNorm block (structure.py ``compiled_block``): each LayerNorm keeps its mean and rstd,
# a python activation (gelu_new) its input and output, a dropout its bool mask (10 cases, exact).
SRC_COMPILED = (
    "torch.compile (Inductor min_cut_rematerialization_partition): pointwise ops recomputed in backward; "
    "measured by benchmarks/compile_activations.py"
)
# Liger kernels (linkedin/Liger-Kernel src/liger_kernel/ops/rms_norm.py ``LigerRMSNormFunction``: saves X,
# W, RSTD (fp32); ops/swiglu.py ``LigerSiLUMulFunction``: saves a, b, recomputes silu in backward;
# ops/rope.py ``LigerRopeFunction``: rotates q, k in place, saves cos, sin). unsloth's RMSNorm (unsloth/
# kernels/rms_layernorm.py ``Fast_RMS_Layernorm``: saves X, W, r) is the same; its LoRA MLP (unsloth/kernels/
# fast_lora.py ``LoRA_MLP``: ``ctx.save_for_backward(gateA, gateB, upA, upB, downA, downB, X, e, g)``) keeps
# gate and up only and recomputes their SwiGLU product in backward.
SRC_FUSED_KERNELS = (
    "Liger ops/rms_norm.py, ops/swiglu.py; unsloth kernels/rms_layernorm.py, kernels/fast_lora.py LoRA_MLP: "
    "RMSNorm saves its input + fp32 rstd; SwiGLU recomputes act (unsloth: and the product)"
)


def fused_rmsnorm_saved(sh: Shapes, width: int) -> int:
    """An RMSNorm under torch.compile or a fused kernel: its input (residual dtype) and the fp32 rstd."""
    return sum(fused_rmsnorm_pieces(sh, width))


def fused_rmsnorm_pieces(sh: Shapes, width: int, rows: int = 1) -> tuple[int, int]:
    return sh.tokens * width * sh.r, sh.tokens * rows * 4


def fused_swiglu_item(sh: Shapes, numel: int) -> MemoryItem:
    """A gated MLP's interior under torch.compile or a fused SwiGLU: gate, up and their product (the
    down projection's input); act(gate) is recomputed in backward. unsloth's LoRA MLP keeps gate and up
    only (``Profile.fused_mlp_saves`` = 2)."""
    if sh.compiled or not sh.profile.fused_kernels:
        src = SRC_COMPILED if sh.compiled else SRC_FUSED_KERNELS
        return item("mlp.gate, up, product (act recomputed)", 3 * numel * sh.c, src, "mlp.interior", 3)
    n = sh.profile.fused_mlp_saves
    return item(f"mlp.gate, up (product recomputed) [{n} saved]", n * numel * sh.c, SRC_FUSED_KERNELS,
                 "mlp.interior", n)  # fmt: skip


def compiled_layer_input(sh: Shapes, numel: int) -> MemoryItem:
    """Under torch.compile the layer keeps its own input (residual dtype): measured (``input_saved``)."""
    return item(
        "layer input (kept by the compiled graph)", numel * sh.r, SRC_COMPILED, "compiled.layer_input"
    )


def compiled_output_copy(sh: Shapes, numel: int) -> MemoryItem:
    """Under torch.compile the attention output and o_proj's input are two buffers (measured)."""
    return item("attn.output copy (o_proj input, compiled)", numel * sh.c, SRC_COMPILED, "attn.output_copy")
