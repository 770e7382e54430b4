"""What autograd keeps for backward, per transformer layer, as transformers' model code saves it.

Every term below is a tensor that a backward node holds (``ctx.save_for_backward`` / the saved
variables of ATen's derivatives.yaml), counted once per storage. The list was derived from the
code of transformers 5.23 (``modeling_gpt2.py``, ``modeling_llama.py``, ``modeling_bert.py``,
``integrations/sdpa_attention.py``, ``activations.py``) and PyTorch 2.13 (derivatives.yaml,
``aten/src/ATen/native/Dropout.cpp``, ``autocast_mode.cpp``) and checked tensor by tensor on tiny
models with ``torch.autograd.graph.saved_tensors_hooks`` on CPU. Per layer (T = batch x seq tokens,
h hidden, a heads, g kv heads, d head dim, I MLP width, c compute bytes, r residual bytes):

* norms (2 pre-norms; Gemma 2/3 add 2 post-norms; Falcon-7B has one; Qwen3/OLMo-2 q/k norms and
  MLA latent norms on top): LayerNorm saves its input (r) and mean/rstd (T each; fp32 on CUDA, input dtype on
  CPU); RMSNorm (``LlamaRMSNorm``: ``x.to(float32)``, ``pow``, ``rsqrt``, ``y.to(dtype)``,
  ``weight * y``) saves the fp32 upcast x (4), y in the input dtype and rstd (T x 4).
* projection inputs: the norm output once (c) - or, under autocast, one 16-bit cast per Linear
  that reads it (autocast caches casts of leaf weights only, so q/k/v each cast their input), plus
  the 16-bit cast of every weight (the autocast weight cache, freed layer by layer in backward).
* attention: q, k, v (eager repeats k, v to a heads with ``repeat_kv``; SDPA with ``enable_gqa``
  and flash keep g heads); eager adds the softmax output (fp32 when ``softmax(dtype=float32)`` or
  under CUDA autocast, plus its cast back to c), dropout output and mask when p > 0; SDPA/flash add
  the output and the logsumexp (a x s x fp32). The attention output feeds o_proj (c). A fused
  qkv projection with RoPE keeps its whole output alive through the v view next to the rotated
  q, k; MLA keeps kv_b_proj's output the same way.
* MoE (transformers' default grouped_mm experts, ``integrations/moe.py``): the router's fp32 scores
  and int64 top-k indices (DeepSeek: its fp32 Linear's input and weight copies; in-place top-k
  renormalisation: a clone and the sum), the dispatch's int64 permutations and sorted routing
  weights, top-k x T gathered expert inputs and scaled outputs, each expert's MLP interior over the
  routed rows; Qwen2-MoE's gated shared expert keeps its output and the sigmoid gate.
* MLP: fused ``F.gelu``/``F.silu`` save their input; the python ``gelu_new`` formula saves x,
  tanh(.), 1 + tanh(.) and 0.5 x; gated MLPs keep gate, act(gate), up and their product.
* dropout: CUDA's fused ``native_dropout`` saves a bool mask (1 B/elem); CPU's ``_dropout_impl``
  saves a noise tensor of the input dtype.

Checkpointing: ``full`` keeps only each layer's input (``torch.utils.checkpoint``) and rebuilds one
layer's activations during backward; ``selective`` (Korthikanti et al. 2022, arXiv 2205.05198
§4.2) drops the attention core (scores, softmax, dropout) and recomputes it in backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from peakmem.breakdown import Category, MemoryItem
from peakmem.derived import block_key_costs, costs_for, family_key
from peakmem.model import Attention, Layer, Mlp, ModelSpec
from peakmem.training import AttentionKernel, Checkpointing, Framework, KernelPolicy, TrainingSetup

from .model_states import PrecisionPlan, precision_plan
from .profiles import PROFILES, Profile

# Activations whose backward needs only their output (aten relu saves ``result``), which the next
# Linear saves anyway: one tensor instead of input + output.
OUTPUT_SAVING_ACTIVATIONS = frozenset({"relu"})

# Activations whose transformers module is a python formula that keeps several intermediates
# (transformers/activations.py): name -> tensors of size T x I saved besides the output.
PYTHON_ACTIVATIONS = {"gelu_new": 4, "gelu_fast": 4}
# CUDA autocast runs ``pow`` in fp32 (autocast_mode.cpp fp32 op list): gelu_new then saves
# x (fp32 cast), tanh (fp32), 1 + tanh (fp32) and 0.5 x (16-bit).
PYTHON_ACTIVATION_AUTOCAST_BYTES = {"gelu_new": (4, 4, 4, 2), "gelu_fast": (4, 4, 4, 2)}

# Activations whose autograd Function computes its gradient in python: the most T x I tensors alive at
# once in that backward, net of the down projection's input freed just before (``mlp_terms``' unit: a
# fused F.gelu's g and its result, 2, count 1). modeling_bloom.py ``bloom_gelu_back`` (via
# ``GeLUFunction.backward``): at ``(1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)`` the
# incoming g, tanh_out, ``0.5 * x``, ``1 - tanh_out**2``, ``0.79788456 + ...`` and their product are alive:
# 6, net 5 (traced op by op; the simulator's peak on tiny BLOOM holds these six).
CUSTOM_BACKWARD_ALIVE = {"bloom_gelu": 5}

SRC_WEIGHT_CAST = "torch autocast cached_cast: 16-bit weight copies saved by each Linear"
MLP_COMPONENTS = ("mlp", "experts", "shared_experts", "router")
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
SRC_LINEAR = "aten linear/addmm saves its input (and the 16-bit weight cast under autocast)"
SRC_EAGER = "transformers eager_attention_forward: softmax output saved by softmax and matmul"
SRC_SDPA = "torch SDPA flash/efficient: saves q, k, v, output, logsumexp (+ philox seed/offset)"
SRC_MATH = "torch _scaled_dot_product_attention_math: materialises scores; CPU upcasts 16-bit to fp32"
SRC_MLP = "transformers activations.py / LlamaMLP: act(gate(x)) * up(x)"
SRC_DROPOUT = "aten/src/ATen/native/Dropout.cpp: CUDA native_dropout bool mask; CPU input-dtype noise"


@dataclass(kw_only=True, slots=True)
class Shapes:
    """The sizes a layer formula needs: tokens, sequence, batch and the dtype plan.

    Built once per estimate, so slotted and not frozen (a frozen ``__init__`` costs 2.5x: see
    :class:`peakmem.breakdown.MemoryItem`): read-only by convention, like every per-estimate value."""

    batch: int
    seq: int
    plan: PrecisionPlan
    policy: KernelPolicy
    kernel: AttentionKernel  # the kernel that really runs (after CPU dropout fallback)
    math_fallback: bool = False  # SDPA requested, math kernel runs (CPU with attention dropout)
    kernel_note: str = ""  # why the kernel differs from the one requested
    profile: Profile = PROFILES[Framework.HF]
    compiled: bool = False  # torch.compile per layer (see compiled_* below)
    fused_kernels: bool = False  # Liger / unsloth Triton kernels for RMSNorm and SwiGLU
    family: str = ""  # derived specs: the setup family their measured block costs are looked up in
    # derived, set once (the formulas read them a dozen times per layer)
    tokens: int = field(init=False)  # batch x seq
    c: int = field(init=False)  # compute bytes per element
    r: int = field(init=False)  # residual-stream bytes per element

    def __post_init__(self) -> None:
        self.tokens = self.batch * self.seq
        self.c = self.plan.compute.bits // 8
        self.r = self.plan.residual.bits // 8


@dataclass(kw_only=True, slots=True)
class LayerActivations:
    """One layer's saved tensors and the largest extra tensors alive while it runs (per estimate:
    slotted, not frozen, read-only by convention; derive changed ones with ``dataclasses.replace``)."""

    saved: tuple[MemoryItem, ...]
    core: int  # bytes of the attention core (what selective checkpointing drops)
    layer_input: int  # what full checkpointing keeps per layer
    forward_transient: int  # beyond ``saved``, the largest momentary extra in forward
    backward_transient: int  # the largest gradient temporaries (incl. its weight grads) in its backward
    recompute: int = 0  # activations rebuilt during its backward (checkpointing)
    interior: int = 0  # the larger of the attention core and the MLP interior (alive mid-layer)
    # how ``backward_transient`` (net) splits at that peak: saved bytes of this layer already freed,
    # and weight gradients written (temporaries = net - grads + freed)
    backward_freed: int = 0
    backward_grads: int = 0
    # of ``saved``: the layer's input itself (the same storage), which full checkpointing keeps anyway
    input_saved: int = 0
    # the materialised attention mask every layer receives (full checkpointing keeps it for backward)
    mask_arg: int = 0
    # the two backward stages ``backward_*`` is the larger of, each (net, freed, grads): the MLP half's
    # and the attention core's (LoRA re-weighs them: formulas/lora.py adapt_layer); () where not built so
    backward_stages: tuple[tuple[int, int, int], ...] = ()

    @property
    def saved_bytes(self) -> int:
        return sum(i.bytes for i in self.saved)


MATH = "SDPA's math kernel"

# --- which SDPA kernel CUDA runs (simulate/kernels.py applies this same rule to the real call's tensors) ---
# torch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp ``select_sdp_backend`` (sm80+, torch 2.13
# default priority flash > memory-efficient > math): flash needs 16-bit inputs, no ``attn_mask``, equal
# q/k/v head sizes of at most 256, and the same heads for q and k/v unless ``enable_gqa``
# (``check_batch_size_and_num_heads_dense<true>``); memory-efficient takes fp32 and masks but no grouped
# heads (``check_batch_size_and_num_heads_dense<false>``); math runs the rest - e.g. Falcon-7B's
# multi-query call (1 k/v head against all query heads, no ``enable_gqa``, an explicit mask) or fp32
# grouped-query attention.
FLASH_MAX_HEAD_DIM = 256  # sdp_utils.cpp check_head_dim_size_flash: head_dim <= 256


def cuda_sdpa_backend(
    *,
    half: bool,
    q_heads: int,
    kv_heads: int,
    enable_gqa: bool,
    mask: bool,
    qk_head_dim: int,
    v_head_dim: int,
) -> str:
    """The SDPA kernel CUDA runs for one call: "flash", "efficient" or "math" (see above).

    ``half``: q/k/v are fp16/bf16; ``kv_heads``: the heads of the k/v the call receives;
    ``mask``: an explicit ``attn_mask`` is passed."""
    grouped = q_heads != kv_heads
    if grouped and not (enable_gqa and q_heads % kv_heads == 0):
        return "math"
    if half and not mask and qk_head_dim == v_head_dim <= FLASH_MAX_HEAD_DIM:
        return "flash"
    if not grouped:
        return "efficient"
    return "math"


def sliding_mask(att: Attention, seq: int) -> bool:
    """Whether a sliding-window layer hands SDPA an explicit mask at ``seq`` tokens: transformers skips
    the mask for ``is_causal`` only while the keys are fewer than the window (masking_utils.py
    ``_ignore_causal_mask_sdpa``: ``local_attention_size is not None and kv_length >=
    local_attention_size`` keeps it). Gemma 3's sliding layers at 2,048 tokens (window 512) run the
    memory-efficient kernel in simulate's trace, its global layers flash."""
    return att.sliding_window is not None and seq >= att.sliding_window


def sdpa_mask(spec: ModelSpec, att: Attention, seq: int) -> bool:
    """Whether ``att``'s SDPA call at ``seq`` tokens passes an explicit ``attn_mask``: always for a model
    whose mask is materialised (``ModelSpec.sdpa_mask``: Falcon), else where :func:`sliding_mask` holds."""
    return spec.sdpa_mask or sliding_mask(att, seq)


def sdpa_call_heads(
    spec: ModelSpec, profile: Profile, att: Attention | None = None, seq: int = 0
) -> tuple[int, bool]:
    """The k/v heads ``spec``'s SDPA call (of ``att``, the first layer's by default; at ``seq`` tokens,
    which decides a sliding window's mask) hands the kernel, and whether it passes ``enable_gqa``
    (``ModelSpec.sdpa_kv``): transformers' shared ``sdpa_attention_forward`` passes the k/v heads with
    ``enable_gqa=True`` when ``use_gqa_in_sdpa`` holds (integrations/sdpa_attention.py: no mask, equal
    k/v head sizes <= 256), else ``repeat_kv`` copies to all heads; torchtune's attention expands them
    (``Profile.sdpa_repeats_kv``)."""
    att = att or spec.first_layer.attention
    a, g = att.num_heads, att.num_kv_heads
    if spec.sdpa_kv == "broadcast":
        return g, False
    if spec.sdpa_kv == "repeated" or profile.sdpa_repeats_kv:
        return a, False
    if not sdpa_mask(spec, att, seq) and att.head_dim == att.v_head_dim <= FLASH_MAX_HEAD_DIM:
        return g, g < a
    return a, False


def sdpa_call_backend(spec: ModelSpec, setup: TrainingSetup, att: Attention | None = None) -> str:
    """:func:`cuda_sdpa_backend` for the SDPA call ``spec``'s attention (``att``, the first layer's by
    default) makes under ``setup``."""
    att = att or spec.first_layer.attention
    half = precision_plan(setup.precision).compute.bits < 32
    return _call_backend(spec, att, PROFILES[setup.framework], half=half, seq=setup.seq_len)[0]


def _call_backend(
    spec: ModelSpec, att: Attention, profile: Profile, *, half: bool, seq: int
) -> tuple[str, int]:
    """:func:`cuda_sdpa_backend` for ``att``'s SDPA call at ``seq`` tokens, and the k/v heads it hands
    the kernel (:func:`sdpa_call_heads`)."""
    kv, gqa = sdpa_call_heads(spec, profile, att, seq)
    backend = cuda_sdpa_backend(
        half=half, q_heads=att.num_heads, kv_heads=kv, enable_gqa=gqa, mask=sdpa_mask(spec, att, seq),
        qk_head_dim=att.head_dim, v_head_dim=att.v_head_dim,
    )  # fmt: skip
    return backend, kv


def kernel_choice(spec: ModelSpec, setup: TrainingSetup) -> tuple[AttentionKernel, str]:
    """The kernel that really runs, and why when it is not the one asked for ("" otherwise).

    On CPU, SDPA falls back to its math kernel (scores materialised as in eager; 16-bit inputs
    upcast to fp32) with attention dropout or unequal q/k and v head sizes (MLA) - measured; and
    transformers refuses SDPA for some models (``_supports_sdpa = False``: ``spec.attention_kernels``
    lacks "sdpa"), which then run eager."""
    att = spec.first_layer.attention
    cpu = setup.kernel_policy is KernelPolicy.CPU
    if cpu and setup.attention is AttentionKernel.FLASH:
        return AttentionKernel.SDPA, "flash-attn 2 is CUDA-only; CPU runs SDPA's flash kernel"
    if setup.attention is AttentionKernel.EAGER:
        return AttentionKernel.EAGER, ""
    if "sdpa" not in spec.attention_kernels:
        return AttentionKernel.EAGER, f"transformers runs {spec.model_type} eager (no SDPA support)"
    if cpu and spec.attention_dropout > 0:
        return AttentionKernel.EAGER, f"{MATH} on CPU with attention dropout {spec.attention_dropout}"
    if cpu and att.head_dim != att.v_head_dim:
        return AttentionKernel.EAGER, f"{MATH} on CPU: q/k head size {att.head_dim} != v {att.v_head_dim}"
    if not cpu and setup.attention is AttentionKernel.SDPA and sdpa_call_backend(spec, setup) == "math":
        kv, gqa = sdpa_call_heads(spec, PROFILES[setup.framework], seq=setup.seq_len)
        return AttentionKernel.EAGER, (
            f"{MATH} on CUDA: {att.num_heads} query heads, {kv} k/v heads"
            + (" with enable_gqa" if gqa else " without enable_gqa" if kv < att.num_heads else "")
            + (", an explicit mask" if sdpa_mask(spec, att, setup.seq_len) else "")
            + f", {precision_plan(setup.precision).compute.name} inputs (sdp_utils.cpp select_sdp_backend)"
        )
    return setup.attention, ""


def effective_kernel(spec: ModelSpec, setup: TrainingSetup) -> AttentionKernel:
    return kernel_choice(spec, setup)[0]


def shapes(spec: ModelSpec, setup: TrainingSetup) -> Shapes:
    kernel, why = kernel_choice(spec, setup)
    plan = precision_plan(setup.precision)
    fallback = why.startswith(MATH) and plan.compute.bits < 32
    family = ""
    if spec.derived_from:
        family = derived_family(setup)
    return Shapes(
        batch=setup.micro_batch, seq=setup.seq_len, plan=plan, policy=setup.kernel_policy,
        kernel=kernel, math_fallback=fallback, kernel_note=why,
        profile=PROFILES[setup.framework], compiled=setup.compiled,
        fused_kernels=setup.liger or PROFILES[setup.framework].fused_kernels, family=family,
    )  # fmt: skip


def derived_family(setup: TrainingSetup) -> str:
    """The setup family a derived spec's block costs are measured in: the precision, the kernel
    transformers is asked for (its own fallbacks then run inside the measured model), the kernel
    policy and the method, with the adapter's settings for LoRA/QLoRA."""
    adapter, objects = "", None
    if setup.method.value != "full":
        from peakmem.formulas.lora import lora_of  # lora imports this module: at call time

        lora = lora_of(setup)
        adapter = repr((lora, setup.quant)) if setup.method.value == "qlora" else repr(lora)
        objects = (lora, setup.quant)
    # flash-attn is CUDA-only: a fake-tensor run measures it as SDPA's flash kernel, which allocates
    # the same (simulate/runner.py build_meta_model), so the two share one measurement
    kernel = "sdpa" if setup.attention is AttentionKernel.FLASH else setup.attention.value
    return family_key(precision=setup.precision.value, kernel=kernel,
                      policy=setup.kernel_policy.value, method=setup.method.value, adapter=adapter,
                      objects=objects)  # fmt: skip


def _item(path: str, nbytes: int, source: str, key: str, tensors: int = 1) -> MemoryItem:
    """``tensors``: how many equal tensors ``nbytes`` is (``MemoryItem.tensors``)."""
    return MemoryItem(path, Category.ACTIVATIONS, nbytes, source, key, tensors)  # by position: the hot path


def _sized(path: str, sizes: tuple[int, ...], source: str, key: str) -> MemoryItem:
    """An item of unequal tensors, ``sizes`` in the order they are made (``MemoryItem.sizes``)."""
    return MemoryItem(path, Category.ACTIVATIONS, sum(sizes), source, key, len(sizes), sizes)


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
# under CPU autocast (amp-bf16, one case) exact as well.
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
    return sum(_fused_rmsnorm_pieces(sh, width))


def _fused_rmsnorm_pieces(sh: Shapes, width: int, rows: int = 1) -> tuple[int, int]:
    return sh.tokens * width * sh.r, sh.tokens * rows * 4


def fused_swiglu_item(sh: Shapes, numel: int) -> MemoryItem:
    """A gated MLP's interior under torch.compile or a fused SwiGLU: gate, up and their product (the
    down projection's input); act(gate) is recomputed in backward. unsloth's LoRA MLP keeps gate and up
    only (``Profile.fused_mlp_saves`` = 2)."""
    if sh.compiled or not sh.profile.fused_kernels:
        src = SRC_COMPILED if sh.compiled else SRC_FUSED_KERNELS
        return _item("mlp.gate, up, product (act recomputed)", 3 * numel * sh.c, src, "mlp.interior", 3)
    n = sh.profile.fused_mlp_saves
    return _item(f"mlp.gate, up (product recomputed) [{n} saved]", n * numel * sh.c, SRC_FUSED_KERNELS,
                 "mlp.interior", n)  # fmt: skip


def compiled_layer_input(sh: Shapes, numel: int) -> MemoryItem:
    """Under torch.compile the layer keeps its own input (residual dtype): measured (``input_saved``)."""
    return _item(
        "layer input (kept by the compiled graph)", numel * sh.r, SRC_COMPILED, "compiled.layer_input"
    )


def compiled_output_copy(sh: Shapes, numel: int) -> MemoryItem:
    """Under torch.compile the attention output and o_proj's input are two buffers (measured)."""
    return _item("attn.output copy (o_proj input, compiled)", numel * sh.c, SRC_COMPILED, "attn.output_copy")


def dropout_mask_bytes(numel: int, elem_bytes: int, policy: KernelPolicy) -> int:
    """Bytes a training-mode dropout saves for backward (see SRC_DROPOUT)."""
    return numel if policy is KernelPolicy.CUDA else numel * elem_bytes


def norm_saved(spec: ModelSpec, sh: Shapes, width: int) -> int:
    """Bytes one norm saves for ``tokens x width`` inputs (its output is counted by its readers)."""
    return sum(norm_pieces(spec, sh, width))


def norm_pieces(spec: ModelSpec, sh: Shapes, width: int, rows: int = 1) -> tuple[int, ...]:
    """The tensors one norm saves for ``tokens x width`` inputs, in the order it makes them; ``rows``
    statistics per token (a per-head q/k norm: one per head)."""
    t = sh.tokens
    if spec.norm == "rmsnorm" and (sh.compiled or sh.fused_kernels):
        return _fused_rmsnorm_pieces(sh, width, rows)
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
    (modeling_gemma.py ``GemmaRMSNorm.forward``: ``output * (1.0 + self.weight.float())``). A frozen
    norm (LoRA) does not keep it (aten ``mul`` saves ``self`` only when ``other`` requires grad). 0 for
    LayerNorm and for a fused / compiled RMSNorm (it saves its input and rstd whatever the weight)."""
    if spec.norm != "rmsnorm" or sh.compiled or sh.fused_kernels:
        return 0
    fp32_normed = sh.profile.rmsnorm_normed_fp32 or spec.rmsnorm_normed_fp32
    return sh.tokens * width * (4 if sh.plan.autocast or fp32_normed else sh.c)


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
    return RMSNORM_BACKWARD_FP32 * t * h * 4 + t * h * sh.r


def qk_norm_item(spec: ModelSpec, layer: Layer, sh: Shapes) -> MemoryItem:
    """What a q/k norm pair saves. An RMSNorm keeps one fp32 rstd per token and norm: per head
    (Qwen3, Gemma 3: over head_dim) ``heads`` of them for q and ``kv_heads`` for k; a full-width pair
    (modeling_olmo2.py ``q_norm``/``k_norm`` over all heads) one each. A LayerNorm pair is counted as
    one norm over both widths (its statistics are a few kB)."""
    att = layer.attention
    path = "attn.q_norm, k_norm (input + stats)"
    if spec.norm != "rmsnorm":
        return _item(path, norm_saved(spec, sh, qk_norm_width(layer)), SRC_NORM, "attn.qk_norm", 2)
    q, k = att.num_heads * att.head_dim, att.num_kv_heads * att.head_dim
    per_head = att.qk_norm == "per_head"
    q_rows, k_rows = (att.num_heads, att.num_kv_heads) if per_head else (1, 1)
    pieces = norm_pieces(spec, sh, q, q_rows) + norm_pieces(spec, sh, k, k_rows)
    return _sized(path, pieces, SRC_NORM, "attn.qk_norm")


def qk_norm_width(layer: Layer) -> int:
    """Features per token a q/k norm pair normalises: all q and k heads (per-head or full width)."""
    att = layer.attention
    return (att.num_heads + att.num_kv_heads) * att.head_dim


def block_norm_count(layer: Layer) -> int:
    """Norms applied to the hidden state in one block (:func:`_block_norms`, memoised)."""
    return _layer_structure(layer)[0]


def input_saved_by_layer(spec: ModelSpec, sh: Shapes) -> int:
    """Bytes of a layer's saved tensors that are its input tensor itself, not a copy: a pre-norm
    block's first norm saves its input (aten ``native_layer_norm``; ``LlamaRMSNorm``'s
    ``x.to(float32)`` is a no-op on an fp32 residual stream, a new tensor on a 16-bit one); a
    post-norm encoder's q/k/v Linears save it unless autocast casts it (modeling_bert.py)."""
    t, h = sh.tokens, spec.hidden_size
    if spec.post_norm:
        return 0 if sh.plan.autocast else t * h * sh.c
    if spec.norm == "rmsnorm" and (sh.compiled or sh.fused_kernels):
        return t * h * sh.r  # the fused / compiled norm keeps its input itself
    if (spec.norm == "rmsnorm" or spec.layernorm_fp32) and sh.r != 4:
        return 0  # the norm saves an fp32 copy of a 16-bit residual, not the residual itself
    return t * h * sh.r


def causal_mask_bytes(spec: ModelSpec, sh: Shapes) -> int:
    """The 4-D causal mask a decoder builds once per forward and passes to every layer:
    ``create_causal_mask`` (transformers/masking_utils.py) materialises B x 1 x s x s in the model's
    dtype for eager attention; for SDPA it returns None and the kernel runs ``is_causal``."""
    if spec.task != "causal-lm" or sh.kernel is not AttentionKernel.EAGER or sh.kernel_note.startswith(MATH):
        return 0
    # one mask per kind of layer: a model mixing full and sliding-window layers builds both
    # (modeling_gemma2.py Gemma2Model.forward ``causal_mask_mapping``; Qwen2/3 when ``has_sliding_layers``);
    # all-sliding Mistral builds its sliding mask only
    kinds = len({g.layer.attention.sliding_window is None for g in spec.groups})
    return kinds * sh.batch * sh.seq * sh.seq * (sh.plan.weight.bits // 8)


def _linear_inputs(sh: Shapes, numel: int, readers: int) -> int:
    """Inputs saved by ``readers`` Linears that read one fp32-or-compute tensor of ``numel``."""
    if sh.plan.autocast:
        return readers * numel * sh.c  # one 16-bit cast per Linear call
    return numel * sh.c


def _block_norms(layer: Layer) -> int:
    """Norms applied to the hidden state in one block (2 pre-norms; Gemma 2/3 add 2 post-norms;
    Falcon-7B's parallel block has one), counted from the layer's norm weights."""
    n = sum(
        1 for t in layer.tensors
        if t.kind == "norm" and t.name.endswith("weight") and t.module not in QK_NORM_MODULES
    )  # fmt: skip
    return n or 2


def _attention_readers(layer: Layer) -> int:
    """Linears that read the attention input: all attention Linears but the output projection."""
    n = sum(1 for t in layer.tensors if t.component == "attention" and t.kind == "linear_weight")
    return max(1, n - 1)


# the attention's output projection, as each family's transformers code names it (o_proj; GPT-2's
# attn.c_proj; BERT's attention.output.dense, GPT-NeoX/BLOOM/Falcon/Phi's dense; OPT's out_proj)
OUTPUT_PROJECTIONS = frozenset({"o_proj", "c_proj", "dense", "out_proj"})


def _attention_input_params(layer: Layer) -> int:
    """Parameters of the attention's Linears before its core (q, k, v; MLA's down and up projections):
    all the attention's parameters but the output projection's. Their gradients are written after the
    core's backward."""
    return sum(
        t.numel for t in layer.tensors if t.component == "attention" and t.module not in OUTPUT_PROJECTIONS
    )


_STRUCTURE: dict[int, tuple[Layer, int, int, int]] = {}
_STRUCTURE_MAX = 1024


def _layer_structure(layer: Layer) -> tuple[int, int, int]:
    """(:func:`_block_norms`, :func:`_attention_readers`, :func:`_attention_input_params`) of ``layer``,
    memoised by identity (the layer kept alive in the memo): they scan the layer's tensors, and a
    planner asks them thousands of times."""
    hit = _STRUCTURE.get(id(layer))
    if hit is not None and hit[0] is layer:
        return hit[1], hit[2], hit[3]
    found = _block_norms(layer), _attention_readers(layer), _attention_input_params(layer)
    if len(_STRUCTURE) >= _STRUCTURE_MAX:
        _STRUCTURE.clear()
    _STRUCTURE[id(layer)] = (layer, *found)
    return found


def _mlp_readers(layer: Layer) -> int:
    if not layer.mlp.gated or layer.mlp.fused_gate_up:
        return 1
    return 2


def attention_terms(spec: ModelSpec, layer: Layer, sh: Shapes) -> tuple[list[MemoryItem], int, int, int]:
    """Saved attention tensors (q/k/v onwards), the core bytes, forward and backward transients."""
    att = layer.attention
    t, c, b, s = sh.tokens, sh.c, sh.batch, sh.seq
    a, g, d, dv = att.num_heads, att.num_kv_heads, att.head_dim, att.v_head_dim
    items: list[MemoryItem] = []
    scores = b * a * s * s
    window = att.sliding_window
    if window is not None and window < s and sh.kernel is not AttentionKernel.EAGER:
        scores = b * a * s * window
    if att.is_mla:
        items.extend(_mla_latent_terms(spec, att, sh))
    if sh.kernel is AttentionKernel.EAGER:
        return _eager_terms(spec, layer, sh, items, scores)
    # SDPA (flash / memory-efficient) and flash-attn 2: q, k, v (g heads), output, logsumexp.
    fused = _layer_structure(layer)[1] == 1 and not att.is_mla
    sdpa = sh.kernel is AttentionKernel.SDPA and not att.is_mla
    efficient = sdpa and sh.policy is KernelPolicy.CUDA
    efficient = efficient and _call_backend(spec, att, sh.profile, half=sh.c < 4, seq=s)[0] == "efficient"
    # torchtune's expand + flatten, or transformers' ``repeat_kv`` where the call passes a mask, copies
    # k, v to all heads; with one kv head (MQA) it is a view (merging a size-1 dim with a stride-0 one):
    # measured, benchmarks/compile_activations.py
    repeated = sdpa and not fused and sdpa_call_heads(spec, sh.profile, att, s)[0] == a
    if g > 1 and (sh.profile.sdpa_repeats_kv or repeated):
        g = a
    qkv = t * (a * d + g * d + g * dv) * c
    if att.is_mla:
        # v is a view of kv_b_proj's output (k_nope and v of every head), which SDPA keeps whole;
        # q (cat of q_pass, q_rot) and k (k_nope + shared k_rot) are new tensors
        nope = d - att.qk_rope_head_dim
        items.append(_item("attn.q, k (MLA, all heads)", 2 * t * a * d * c, SRC_SDPA, "attn.mla_qk", 2))
        items.append(
            _item(
                "attn.kv_b_proj output (kept by the v view)",
                t * a * (nope + dv) * c,
                SRC_SDPA,
                "attn.mla_kv_b_output",
            )
        )
    elif fused and spec.position == "rope":
        # v is a view of the fused qkv output, which SDPA keeps alive whole; q, k are rotated copies
        items.append(_item("attn.fused qkv output (kept by the v view)", qkv, SRC_SDPA, "attn.fused_qkv"))
        rotated = (t * a * d * c, t * g * d * c)
        items.append(_sized("attn.rotated q, k (saved by SDPA)", rotated, SRC_SDPA, "attn.rotated_qk"))
    else:
        items.append(_sized("attn.q,k,v (saved by SDPA)", (t * a * d * c, t * g * d * c, t * g * dv * c),
                            SRC_SDPA, "attn.qkv"))  # fmt: skip
    items.append(_item("attn.output (= o_proj input)", t * a * dv * c, SRC_SDPA, "attn.sdpa_output"))
    if sh.compiled and spec.norm == "rmsnorm":
        items.append(compiled_output_copy(sh, t * a * dv))
    elif (fused and sh.policy is KernelPolicy.CPU) or spec.rope_concat:
        # measured: with strided (fused) inputs the CPU kernel's output is not in o_proj's layout; nor is
        # it where the rotary embedding's cat made q contiguous per head (``ModelSpec.rope_concat``)
        items.append(
            _item("attn.output contiguous copy (o_proj input)", t * a * dv * c, SRC_SDPA, "attn.output_copy")
        )
    lse = b * a * s * 4
    scratch = flash_backward_scratch(spec, layer, sh)
    if efficient:
        lse = b * a * -(-s // EFFICIENT_LSE_ROUND) * EFFICIENT_LSE_ROUND * 4
        scratch = efficient_backward_scratch(att, sh)
    if sh.kernel is AttentionKernel.SDPA and sliding_mask(att, s):
        # SDPA makes masking_utils' bool mask additive in the inputs' dtype (attention.cpp
        # ``convert_boolean_attn_mask``: zeros_like, masked_fill) at every call, and the kernel saves it:
        # CUDA's memory-efficient one and the CPU's (measured: tiny Gemma 3, window 32, 2 x 256 tokens on
        # CPU, 0.5 MiB a sliding layer; the estimate went from -10.4 % to -0.25 %). Falcon without alibi
        # (``ModelSpec.sdpa_mask``) passes create_causal_mask's bool mask too, and a real CPU step shows it
        # made additive per layer as well (tiny RW Falcon: 0.5 MiB a layer), but with it alone that step
        # goes from -10.9 % to +3.6 % (the o_proj input copy counted on CPU is not there): left out
        items.append(_item("attn.mask made additive (saved by SDPA)", b * s * s * c, SRC_SDPA,
                           "attn.sdpa_bias"))  # fmt: skip
    items.append(_item("attn.logsumexp (fp32)", lse, SRC_SDPA, "attn.logsumexp"))
    # backward: the kernel writes dq, dk, dv while q, k, v, output are still saved, next to its scratch
    bwd = t * (a * d + g * d + g * dv) * c + scratch
    return items, lse, 0, bwd


# FlashAttention-2's backward (aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp ``mha_bwd``)
# pads its fp32 scratch: rows to a multiple of 128 (``seqlen_q_rounded``), the head size to a multiple of 32
# up to 192, else 256 (``head_size_rounded``). simulate/kernels.py ``_flash_bwd_scratch`` allocates the same.
FLASH_BWD_SEQ_ROUND = 128
FLASH_BWD_HEAD_ROUND = 32
FLASH_BWD_HEAD_ROUND_UP_TO = 192  # above it, head_size_rounded is FLASH_MAX_HEAD_DIM


def flash_bwd_head_rounded(head_dim: int) -> int:
    """``mha_bwd``'s ``head_size_rounded`` (flash_api.cpp)."""
    if head_dim > FLASH_BWD_HEAD_ROUND_UP_TO:
        return FLASH_MAX_HEAD_DIM
    return -(-head_dim // FLASH_BWD_HEAD_ROUND) * FLASH_BWD_HEAD_ROUND


# The memory-efficient kernel (simulate/kernels.py allocates the same): its log-sum-exp rows are padded to
# a multiple of 32 (``kAlignLSE``); its backward (mem_eff_attention/kernel_backward.h) allocates ``delta``
# fp32 [B, H, S] and, for 16-bit inputs, an fp32 gradient-of-q accumulator [B, H, S, D]
# (``kNeedsAccumGradQ``).
EFFICIENT_LSE_ROUND = 32


def efficient_backward_scratch(att: Attention, sh: Shapes) -> int:
    """Bytes the memory-efficient kernel's backward allocates for its duration (see above)."""
    rows = sh.batch * att.num_heads * sh.seq
    return rows * 4 + (rows * att.head_dim * 4 if sh.c < 4 else 0)


def flash_backward_scratch(spec: ModelSpec, layer: Layer, sh: Shapes) -> int:
    """Bytes FlashAttention-2's backward allocates for the kernel's duration (``mha_bwd``): ``softmax_d``
    fp32 [B, H, round128(S)], ``dq_accum`` fp32 [B, round128(S), H, :func:`flash_bwd_head_rounded` (D)] and,
    when the call hands fewer k/v heads than q heads (``enable_gqa``), ``dk_expanded`` and ``dv_expanded``
    [B, S, H, D] in the input dtype (summed into dk, dv at the end). On CUDA under SDPA only where
    :func:`cuda_sdpa_backend` picks flash for the call (:func:`sdpa_call_heads`); with the flash-attn
    kernel for 16-bit inputs and equal head sizes up to 256; 0 otherwise (the memory-efficient or math
    kernel, a CPU step, eager attention, MLA)."""
    att = layer.attention
    a, d = att.num_heads, att.head_dim
    if sh.policy is not KernelPolicy.CUDA or att.is_mla:
        return 0
    kv = att.num_kv_heads
    if sh.kernel is AttentionKernel.SDPA:
        backend, kv = _call_backend(spec, att, sh.profile, half=sh.c < 4, seq=sh.seq)
        if backend != "flash":
            return 0
    elif sh.kernel is not AttentionKernel.FLASH or sh.c == 4 or d != att.v_head_dim or d > FLASH_MAX_HEAD_DIM:
        return 0
    rows = -(-sh.seq // FLASH_BWD_SEQ_ROUND) * FLASH_BWD_SEQ_ROUND
    scratch = sh.batch * a * rows * 4 + sh.batch * rows * a * flash_bwd_head_rounded(d) * 4
    if kv != a:
        scratch += 2 * sh.tokens * a * d * sh.c
    return scratch


def _mla_latent_terms(spec: ModelSpec, att: Attention, sh: Shapes) -> list[MemoryItem]:
    """Multi-head latent attention (DeepSeek-V2/V3, modeling_deepseek_v3.py): the q and kv latents
    go through an RMSNorm each and feed q_b_proj / kv_b_proj, which save the normed latents."""
    t, c = sh.tokens, sh.c
    items = [_item("attn.kv latent norm + kv_b_proj input", norm_saved(spec, sh, att.kv_lora_rank)
                   + t * att.kv_lora_rank * c, SRC_NORM, "attn.mla_kv_latent")]  # fmt: skip
    if att.q_lora_rank:
        items.append(_item("attn.q latent norm + q_b_proj input", norm_saved(spec, sh, att.q_lora_rank)
                           + t * att.q_lora_rank * c, SRC_NORM, "attn.mla_q_latent"))  # fmt: skip
    return items


def _eager_terms(
    spec: ModelSpec, layer: Layer, sh: Shapes, items: list[MemoryItem], scores: int
) -> tuple[list[MemoryItem], int, int, int]:
    att = layer.attention
    t, c = sh.tokens, sh.c
    a, d, dv = att.num_heads, att.head_dim, att.v_head_dim
    # SDPA's math fallback on CPU upcasts 16-bit q, k, v and the scores to fp32 (measured).
    inner = 4 if sh.math_fallback else c
    # q, and k, v expanded to all heads (repeat_kv copies; matmul folds to bmm on contiguous copies).
    # With one kv head, repeat_kv's expand + reshape is a view (a stride-0 head dim), and at micro-batch 1
    # matmul folds it into bmm's batch without a copy, so k and v stay one head each (measured: the parity
    # grid's qwen2 MQA case, b1 x 128, fp32 eager: -196,608 B over its 2 layers). Autocast's casts of the
    # view are contiguous copies of every head (measured, amp-bf16), as is SDPA's math fallback's upcast.
    shared = att.num_kv_heads == 1 and sh.batch == 1 and not sh.math_fallback and not sh.plan.autocast
    if spec.sdpa_kv == "broadcast" and sh.kernel_note.startswith(MATH):
        # SDPA's math kernel on one k/v head without enable_gqa (Falcon-7B): the fp32 upcast comes
        # first, then matmul broadcasts the one head - a view at micro-batch 1 (attention.cpp)
        shared = att.num_kv_heads == 1 and sh.batch == 1
    kv = att.num_kv_heads if shared else a
    items.append(
        _item(
            "attn.q,k,v (eager, one kv head shared as views)" if shared and a > 1
            else "attn.q,k,v (eager, kv repeated to all heads)",
            t * (a * d + kv * (d + dv)) * inner,
            SRC_EAGER,
            "attn.qkv",
            3,
        )
    )  # fmt: skip
    # fp32 softmax: ``softmax(..., dtype=float32)`` (Llama family); under CUDA autocast (softmax is
    # on its fp32 list); under any autocast when an fp32 additive mask (the causal mask of decoders)
    # promotes the 16-bit scores. Encoders fed without a padding mask add none.
    promoted = sh.plan.autocast and (sh.policy is KernelPolicy.CUDA or spec.task == "causal-lm")
    softmax_fp32 = spec.attn_softmax_fp32 or promoted or sh.math_fallback
    sm = 4 if softmax_fp32 else inner
    core = scores * sm
    items.append(
        _item(
            f"attn.softmax output ({'fp32' if sm == 4 else sh.plan.compute.name})",
            scores * sm,
            SRC_EAGER,
            "attn.softmax",
        )
    )
    if spec.attn_logit_softcap is not None:
        items.append(
            _item(
                "attn.softcap tanh output",
                scores * inner,
                "modeling_gemma2.py: tanh(scores / cap)",
                "attn.softcap",
            )
        )
        core += scores * inner
    cast_after_dropout = spec.attn_dropout_before_cast and sm != inner
    if spec.attention_dropout > 0:
        # GPT-2/Llama cast the probs back to the compute dtype first (that cast is not saved);
        # BERT drops out the fp32 probs and the next matmul's autocast cast is saved as well
        d_bytes = sm if cast_after_dropout else inner
        mask = dropout_mask_bytes(scores, d_bytes, sh.policy)
        items.append(_item("attn.dropout output", scores * d_bytes, SRC_DROPOUT, "attn.dropout"))
        items.append(_item("attn.dropout mask", mask, SRC_DROPOUT, "attn.dropout_mask"))
        core += scores * d_bytes + mask
    if sm != inner and (cast_after_dropout or spec.attention_dropout == 0):
        items.append(_item("attn.probs cast to compute dtype", scores * inner, SRC_EAGER, "attn.probs"))
        core += scores * inner
    items.append(_item("attn.output (o_proj input)", t * a * dv * c, SRC_EAGER, "attn.output"))
    # forward: QK^T and its scaled / masked copy alive together; backward: each node frees its saved
    # tensors when done, so next to the saved ones one gradient of the scores is alive at a time
    fwd = scores * max(2 * inner, inner + sm)
    bwd = scores * sm
    if sh.kernel_note.startswith(MATH) and sh.policy is KernelPolicy.CUDA:
        # SDPA's math kernel (attention.cpp ``_scaled_dot_product_attention_math``): ``_safe_softmax``'s
        # backward writes dS while the incoming dP (from ``matmul(attn, value)``'s backward) is alive, both
        # scores-sized in the softmax dtype (measured under the simulator's CUDA policy: falcon, b2 x s128)
        bwd = 2 * scores * sm
    return items, core, fwd, bwd


SRC_GROUPED_MM = "transformers integrations/moe.py grouped_mm_experts_forward (the default experts)"
SRC_ROUTER = "transformers Mixtral/Qwen*Moe/DeepseekV{2,3} TopkRouter.forward"


def moe_router_items(spec: ModelSpec, mlp: Mlp, sh: Shapes) -> list[MemoryItem]:
    """What an MoE router's backward keeps (T tokens, E experts, top-k): its scores (softmax, DeepSeek-V3's
    sigmoid: they save their fp32 output; the logits themselves are not kept) and the top-k indices
    (``topk`` / ``gather`` backward, int64). DeepSeek's fp32 router Linear (``F.linear(x.type(float32),
    weight.type(float32))``) saves an fp32 copy of its input and of its weight; an in-place renormalisation
    of the top-k weights (``/=`` their sum: Mixtral, ``norm_topk_prob``) makes autograd clone them and
    keeps the sum; DeepSeek-V2's group_limited_greedy ``masked_fill`` keeps its bool mask."""
    t, h, c = sh.tokens, spec.hidden_size, sh.c
    e, k = mlp.num_experts, mlp.experts_per_token
    items = [
        _item("moe.router scores (fp32)", t * e * 4, SRC_ROUTER + ": softmax/sigmoid saves its output",
              "moe.router"),
        _item("moe.router top-k indices (int64)", t * k * 8, SRC_ROUTER + ": topk/gather saves the indices",
              "moe.router_indices"),
    ]  # fmt: skip
    if mlp.router_fp32 and sh.plan.autocast:
        # the fp32 upcasts are no-ops on autocast's fp32 norm output and weight; autocast casts the input
        # to 16 bits for the Linear (its weight's cast is counted with the autocast weight casts)
        items.append(_item("moe.router input (autocast cast)", t * h * c, SRC_WEIGHT_CAST, "moe.router_fp32"))
    elif mlp.router_fp32 and c != 4:
        weight = 0 if sh.plan.weight.bits == 32 else e * h * 4
        items.append(_item("moe.router fp32 input + weight copies", t * h * 4 + weight,
                           "modeling_deepseek_v3.py DeepseekV3TopkRouter.forward: "
                           "F.linear(hidden_states.type(float32), self.weight.type(float32))",
                           "moe.router_fp32", 2 if weight else 1))  # fmt: skip
    if mlp.router_norm_topk:
        items.append(_item("moe.router top-k weights clone + sum (in-place renormalisation)",
                           t * k * 4 + t * 4, SRC_ROUTER + ": topk_weights /= topk_weights.sum(...): "
                           "autograd saves the original (a clone) and the divisor", "moe.router_norm",
                           2))  # fmt: skip
    if mlp.router_group_mask:
        items.append(_item("moe.router group mask (bool)", t * e,
                           "modeling_deepseek_v2.py DeepseekV2TopkRouter: scores.masked_fill(~score_mask, 0)",
                           "moe.router_group_mask"))  # fmt: skip
    return items


def moe_dispatch_items(mlp: Mlp, sh: Shapes) -> list[MemoryItem]:
    """The grouped_mm experts' bookkeeping (S = tokens x top-k routed rows): ``perm`` from ``torch.sort``,
    ``perm // top_k`` (the gather's index) and ``inv_perm`` (int64, each saved by an ``index`` backward),
    the routing weights sorted by expert (``sample_weights[perm]``, saved by the weighting mul: fp32, or
    the compute dtype where the router casts them) and the int32 ``offsets`` (``cumsum``, saved by the
    grouped_mm)."""
    s = sh.tokens * mlp.experts_per_token
    w = 4 if mlp.routing_weights_fp32 else sh.c
    return [
        _item("moe.dispatch indices (perm, perm // k, inv_perm; int64)", 3 * s * 8, SRC_GROUPED_MM,
              "moe.dispatch", 3),
        _item("moe.routing weights sorted by expert + offsets", s * w + mlp.num_experts * 4, SRC_GROUPED_MM,
              "moe.dispatch_weights", 2),
    ]  # fmt: skip


def routed_width_bytes(spec: ModelSpec, layer: Layer, sh: Shapes) -> int:
    """Bytes of one (routed) tokens x MLP-width tensor: the down projection's input."""
    mlp = layer.mlp
    rows = sh.tokens * (mlp.experts_per_token if mlp.is_moe else 1)
    return rows * mlp.intermediate_size * sh.c


def mlp_terms(spec: ModelSpec, layer: Layer, sh: Shapes) -> tuple[list[MemoryItem], int]:
    """Saved MLP interior (after its input) and the backward transient, per layer."""
    mlp = layer.mlp
    t, c = sh.tokens, sh.c
    items: list[MemoryItem] = []
    routed_tokens = t
    if mlp.is_moe:
        k = mlp.experts_per_token
        items.extend(moe_router_items(spec, mlp, sh))
        items.extend(moe_dispatch_items(mlp, sh))
        items.append(_item("moe.routed token copies (top-k x tokens)", k * t * spec.hidden_size * c,
                           SRC_GROUPED_MM + ": hidden_states[perm // top_k], saved by the up grouped_mm",
                           "moe.routed_inputs"))  # fmt: skip
        items.append(_item("moe.expert outputs (scaled by the routing weights)", k * t * spec.hidden_size * c,
                           SRC_GROUPED_MM + ": proj_out * sample_weights_g saves proj_out",
                           "moe.expert_outputs"))  # fmt: skip
        routed_tokens = k * t
    width = mlp.intermediate_size
    n = routed_tokens * width
    if mlp.gated and (sh.compiled or sh.fused_kernels):
        items.append(fused_swiglu_item(sh, n))
    elif mlp.gated:
        items.append(_item("mlp.gate, act(gate), up, product", 4 * n * c, SRC_MLP, "mlp.interior", 4))
    elif mlp.activation in PYTHON_ACTIVATIONS:
        if sh.plan.autocast and sh.policy is KernelPolicy.CUDA:
            per = sum(PYTHON_ACTIVATION_AUTOCAST_BYTES[mlp.activation]) + c
        else:
            per = (PYTHON_ACTIVATIONS[mlp.activation] + 1) * c
        items.append(
            _item(
                f"mlp.fc output + {mlp.activation} intermediates + act output",
                n * per,
                SRC_MLP,
                "mlp.interior",
                PYTHON_ACTIVATIONS[mlp.activation] + 1,
            )
        )
    elif mlp.activation in OUTPUT_SAVING_ACTIVATIONS:
        items.append(
            _item(f"mlp.{mlp.activation} output (saved by it and by fc2)", n * c, SRC_MLP, "mlp.relu_output")
        )
    else:
        items.append(_item(f"mlp.fc output + {mlp.activation} output", 2 * n * c, SRC_MLP, "mlp.interior", 2))
    if mlp.is_moe and mlp.shared_intermediate_size:
        items.append(
            _item(
                "mlp.shared experts (gated)",
                4 * t * mlp.shared_intermediate_size * c,
                SRC_MLP,
                "mlp.shared_experts",
                4,
            )
        )
    if mlp.is_moe and mlp.shared_gate:
        # Qwen2MoeSparseMoeBlock: F.sigmoid(shared_expert_gate(x)) * shared_expert_output; the mul saves
        # both, the sigmoid its output (the same tensor)
        items.append(_item("mlp.shared expert output + its sigmoid gate", t * (spec.hidden_size + 1) * c,
                           "modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock.forward", "mlp.shared_gate",
                           2))  # fmt: skip
    # backward, net of the down projection's freed input: the gradient of the intermediate; a gated
    # product or a python activation chain has two such gradients alive at once
    alive = 2 if mlp.gated or mlp.activation in PYTHON_ACTIVATIONS else 1
    alive = CUSTOM_BACKWARD_ALIVE.get(mlp.activation, alive)
    return items, alive * n * c


def moe_weighting_backward(spec: ModelSpec, mlp: Mlp, sh: Shapes) -> int:
    """The gradients alive while backward crosses the grouped_mm experts' output (S = tokens x top-k):
    ``weighted_out = proj_out * sample_weights_g`` promotes to the routing weights' dtype (fp32 for
    Mixtral/DeepSeek), so the gradient of ``weighted_out[inv_perm].view(T, k, H).sum(1)`` is S x H in that
    dtype three times at once: the contiguous copy of the expanded sum gradient (``clone``), the ``index``
    backward's zeros and its ``index_put`` (measured under fake tensors); the mul's two gradients and the
    cast back to ``proj_out``'s dtype follow once the first two are freed. Shared experts run their
    backward first (DeepSeek; Qwen2-MoE's gated shared output waits for it instead): a T x H gradient
    waits for the routed branch's."""
    s, h, c = sh.tokens * mlp.experts_per_token, spec.hidden_size, sh.c
    w = 4 if mlp.routing_weights_fp32 else c
    grads = s * h * (3 * w + (c if w != c else 0))
    shared = sh.tokens * h * c if mlp.shared_intermediate_size else 0
    return grads + shared


def layer_activations(
    spec: ModelSpec,
    layer: Layer,
    sh: Shapes,
    grad_bytes: int = 0,
    *,
    mlp_params: int | None = None,
    linear_params: int | None = None,
    layer_params: int | None = None,
) -> LayerActivations:
    """``grad_bytes``: bytes of this layer's weight gradients (written during its backward);
    ``mlp_params``/``linear_params``: precomputed sums over the layer's tensors (or computed here)."""
    if layer.derived is not None:
        return derived_activations(spec, layer, sh, grad_bytes)
    if mlp_params is None:
        mlp_params = sum(t.numel for t in layer.tensors if t.component in MLP_COMPONENTS)
    if linear_params is None:
        linear_params = sum(t.numel for t in layer.tensors if t.kind in ("linear_weight", "expert_weight"))
    h, t, c, r = spec.hidden_size, sh.tokens, sh.c, sh.r
    items: list[MemoryItem] = []
    compiled_block = sh.compiled and spec.norm == "rmsnorm"
    # each norm's saved tensors; compiled: each block norm keeps its fp32 rstd only (see SRC_COMPILED)
    norm_each = (t * 4,) if compiled_block else norm_pieces(spec, sh, h)
    norm_one = sum(norm_each)
    n_norms, att_readers, att_in_params = _layer_structure(layer)
    norms = norm_each * n_norms
    if layer.parallel_residual and n_norms == 2 and spec.norm == "layernorm" and not spec.layernorm_fp32:
        # GPT-NeoX's parallel block (modeling_gpt_neox.py: ``input_layernorm(hidden_states)`` and
        # ``post_attention_layernorm(hidden_states)``), Falcon-40B's ln_attn / ln_mlp: both LayerNorms save
        # the same block input, one storage
        norms = norm_each + norm_each[1:]
    items.append(_sized(f"norms (input + stats) x{n_norms}", norms, SRC_NORM, "norms"))
    att = layer.attention
    if att.qk_norm != "none":  # Qwen3/OLMo-2: RMSNorm over q and k (per head or full width)
        items.append(qk_norm_item(spec, layer, sh))
    att_in = _linear_inputs(sh, t * h, att_readers)
    mlp_in = _linear_inputs(sh, t * h, _mlp_readers(layer))
    if compiled_block:
        # one 16-bit copy of each norm output (autocast's per-Linear casts are one node in the graph),
        # and the layer's input itself, which the compiled graph keeps for the first norm's backward
        att_in = mlp_in = t * h * c
        items.append(compiled_layer_input(sh, t * h))
    if layer.parallel_residual and n_norms == 1 and not sh.plan.autocast:
        # Falcon-7B: attention and MLP read the same norm output: one saved tensor
        items.append(_item("attn+mlp input (one shared norm output)", att_in, SRC_LINEAR, "input.attn_mlp"))
    else:
        casts = sh.plan.autocast and not compiled_block  # one 16-bit cast per Linear that reads it
        items.append(_item("attn input (norm output)", att_in, SRC_LINEAR, "input.attn",
                           att_readers if casts else 1))  # fmt: skip
        items.append(_item("mlp input (norm output)", mlp_in, SRC_LINEAR, "input.mlp",
                           _mlp_readers(layer) if casts else 1))  # fmt: skip
    att_items, core, att_fwd, att_bwd = attention_terms(spec, layer, sh)
    items.extend(att_items)
    mlp_items, mlp_bwd = mlp_terms(spec, layer, sh)
    items.extend(mlp_items)
    if sh.plan.autocast:
        n_casts = sum(t.copies for t in layer.tensors if t.kind in ("linear_weight", "expert_weight"))
        items.append(_item("autocast weight casts (16-bit copies)", linear_params * c,
                           SRC_WEIGHT_CAST, "autocast.weight_casts", max(1, n_casts)))  # fmt: skip
    mask = dropout_mask_bytes(t * h, c, sh.policy) if spec.hidden_dropout > 0 else 0
    if mask:
        items.append(_item("residual dropout masks x2", 2 * mask, SRC_DROPOUT, "dropout.residual_masks", 2))
    saved = tuple([i for i in items if i.bytes])
    mlp_items_bytes = sum([i.bytes for i in mlp_items])
    # Backward runs the MLP half first, then attention; the MLP's saved tensors are freed in between.
    # Next to the saved tensors: the incoming gradient, the largest intermediate gradients, and the
    # weight gradients written so far (the MLP's output projection first: 1/3 of a gated MLP's
    # weights, 1/2 of a plain one). In the MLP half the residual gradient is the incoming one
    # (``AddBackward`` passes the same tensor to both branches: one T x h), and the MLP's output
    # dropout has already run its backward (its mask freed) - measured with the tracker on CPU.
    mlp_saved = mlp_in + mlp_items_bytes + norm_one * n_norms // 2 + mask
    total = layer_params if layer_params is not None else layer.params
    share = mlp_params / total if total else 0.0
    mlp_grads = int(grad_bytes * share) // (3 if layer.mlp.gated else 2)
    # (net bytes above the layer's saved tensors, saved bytes already freed, weight grads written)
    mlp_out_in = routed_width_bytes(spec, layer, sh)  # the output projection's input, freed first
    mlp_stage = (mlp_bwd + t * h * r + mlp_grads - mask, mlp_out_in + mask, mlp_grads)
    # At the attention core's backward: the incoming gradient and o_proj's input gradient (heads x
    # v_head_dim wide: wider than h for Qwen3). The output projection and the residual dropout after it
    # have run their backward (the dropout's mask freed), and so has, in a post-norm block (BERT), the
    # norm after the attention's residual sum (its saved input freed); q, k and v have not: their weight
    # gradients come after the core's. Measured under the simulator (tiny BERT, the top layer's SDPA
    # backward: 76 kB of those three above its peak, 2.6%).
    att_out = t * layer.attention.num_heads * layer.attention.v_head_dim * c
    att_grads = grad_bytes - int(grad_bytes * att_in_params / total) if total else grad_bytes
    att_freed = mlp_saved + mask + (norm_one if spec.post_norm and n_norms == 2 else 0)
    att_stage = (att_bwd + t * h * c + att_out + att_grads - att_freed, att_freed, att_grads)
    stage = max(mlp_stage, att_stage)
    post_norm = post_mlp_norm_backward(spec, layer, sh)
    if post_norm:  # the block's last norm runs its backward first (its weight-side y freed by then)
        y = rmsnorm_weight_side_bytes(spec, sh, h)
        stage = max(stage, (post_norm - y, y, 0))
    if layer.mlp.is_moe:
        stage = max(stage, _moe_stage(spec, layer, sh, grad_bytes, total, mlp_in))
    # forward: the attention's momentary extra (QK^T and its scaled copy) comes before the rest of
    # the layer's saved tensors exist, so only what exceeds them adds to the end-of-forward total
    att_rest = core + mlp_items_bytes + mlp_in + norm_one * n_norms // 2 + mask
    return LayerActivations(
        saved=saved, core=core, layer_input=t * h * r, forward_transient=max(0, att_fwd - att_rest),
        backward_transient=stage[0], backward_freed=stage[1], backward_grads=stage[2],
        interior=max(core, mlp_items_bytes) + t * h * c,
        input_saved=input_saved_by_layer(spec, sh), mask_arg=causal_mask_bytes(spec, sh),
        backward_stages=(mlp_stage, att_stage),
    )  # fmt: skip


def _moe_stage(
    spec: ModelSpec, layer: Layer, sh: Shapes, grad_bytes: int, layer_params: int, mlp_in: int
) -> tuple[int, int, int]:
    """An MoE layer's backward at its routed experts' output (:func:`moe_weighting_backward`): (net bytes
    above the layer's saved tensors, saved bytes already freed, weight gradients written). Where the
    shared experts run after the routed ones in forward (DeepSeek: ``hidden + shared_experts(residuals)``)
    their backward has run: their saved interior is freed and their weight gradients written, and so is
    the MLP input when only they read it (the router reads its own fp32 copy, the experts gather rows)."""
    mlp, t, h = layer.mlp, sh.tokens, spec.hidden_size
    freed = grads = 0
    if mlp.shared_after_routed and mlp.shared_intermediate_size:
        freed = 4 * t * mlp.shared_intermediate_size * sh.c
        if mlp.router_fp32 and sh.c != 4 and not sh.plan.autocast and not mlp.shared_gate:
            freed += mlp_in
        shared = sum(x.numel for x in layer.tensors if x.component == "shared_experts")
        grads = int(grad_bytes * shared / layer_params) if layer_params else 0
    net = moe_weighting_backward(spec, mlp, sh) + t * h * sh.r + grads - freed
    return net, freed, grads


SRC_DERIVED = (
    "measured: the block's saved and transient bytes in a fake-tensor training step of transformers' "
    "model at 3 small shapes, fitted per token, per sequence squared and constant (peakmem.simulate.derive)"
)


def derived_activations(spec: ModelSpec, layer: Layer, sh: Shapes, grad_bytes: int = 0) -> LayerActivations:
    """A derived block's activations: its measured costs (:mod:`peakmem.derived`) at the setup's shape.
    Its backward peak is the measured instant with the most bytes once its weight gradients written by
    then are counted (``grad_bytes``, as many as the method trains, times the share measured written at
    that instant: an MoE block's peak at its experts' output gradients comes before any of its weight
    gradients exist, an attention block's after its MLP's)."""
    assert layer.derived is not None
    cost = block_key_costs(costs_for(spec.derived_from, sh.family), layer.derived.key)
    b, s, t = sh.batch, sh.seq, sh.tokens
    layer_input = t * spec.hidden_size * sh.r
    saved = bwd = fwd = freed = grads = 0
    kept = None
    if cost is not None:
        at = cost.at(b, s, grad_bytes)
        kept = at.output_kept
        saved, fwd, bwd, freed, grads = (at.saved, at.forward_transient, at.backward_transient, at.freed,
                                         at.grads_in_flight)  # fmt: skip
    what = layer.derived.mixer + ("" if layer.derived.ffn == "none" else f" + {layer.derived.ffn} ffn")
    items = (_item(f"{what} block (measured)", saved, SRC_DERIVED, "derived.saved"),) if saved else ()
    # of its saved bytes, its output kept by what follows and alive when its backward starts: under
    # checkpointing its recomputation does not rebuild it (the next block's kept input). What of the output
    # the next block's backward frees before (its Linears' saved input) is in the measured transients, net:
    # the recomputation must rebuild it for them to add up. Measured; costs before it: one layer input
    input_saved = kept if kept is not None else min(saved, layer_input)
    return LayerActivations(
        saved=items, core=0, layer_input=layer_input, forward_transient=fwd,
        backward_transient=bwd, backward_freed=freed, backward_grads=grads,
        interior=saved + fwd, input_saved=input_saved, mask_arg=causal_mask_bytes(spec, sh),
    )  # fmt: skip


def checkpointed(la: LayerActivations, mode: Checkpointing) -> LayerActivations:
    """What stays saved between forward and backward under each checkpointing mode."""
    if mode is Checkpointing.NONE:
        return la
    if mode is Checkpointing.FULL:
        keep = (MemoryItem(path="layer input (checkpoint)", category=Category.ACTIVATIONS,
                           bytes=la.layer_input,
                           source="torch.utils.checkpoint: only the block's inputs are saved",
                           key="checkpoint.layer_input"),)  # fmt: skip
        # forward runs each layer without keeping its tensors: what lives mid-layer is transient;
        # the recomputation saves the layer's tensors again, its (kept) input not twice. Non-reentrant
        # checkpointing keeps each layer's arguments for its recomputation (torch/utils/checkpoint.py
        # ``_checkpoint_without_reentrant_generator``), so the attention mask outlives the forward
        # until the first layer's recomputation: a temporary next to every layer's backward.
        return LayerActivations(
            saved=keep, core=0, layer_input=la.layer_input, forward_transient=la.interior,
            backward_transient=la.backward_transient + la.mask_arg, recompute=la.saved_bytes - la.input_saved,
            interior=la.interior, backward_freed=la.backward_freed, backward_grads=la.backward_grads,
        )  # fmt: skip
    kept = tuple(i for i in la.saved if not _is_core(i))
    return LayerActivations(
        saved=kept, core=0, layer_input=la.layer_input, forward_transient=la.forward_transient,
        backward_transient=la.backward_transient, recompute=la.core,
        backward_freed=la.backward_freed, backward_grads=la.backward_grads,
    )  # fmt: skip


# The attention core's saved tensors (what selective checkpointing drops and recomputes).
CORE_KEYS = frozenset({"attn.softmax", "attn.probs", "attn.dropout", "attn.dropout_mask"})


def _is_core(item: MemoryItem) -> bool:
    return item.key in CORE_KEYS


def embedding_items(spec: ModelSpec, sh: Shapes) -> tuple[MemoryItem, ...]:
    """Before the first layer: token ids (int64, kept by embedding backward), embedding dropout,
    BERT-style embedding LayerNorm, and RoPE cos/sin (B x s x d, shared by all layers)."""
    t, h = sh.tokens, spec.hidden_size
    items = [_item("input_ids (int64)", t * 8, "aten embedding_backward keeps indices", "embed.input_ids")]
    if spec.embedding_norm:
        items.append(
            _item("embeddings.LayerNorm (input + stats)", norm_saved(spec, sh, h), SRC_NORM, "embed.norm")
        )
    if spec.embedding_dropout > 0:
        items.append(
            _item(
                "embeddings.dropout mask",
                dropout_mask_bytes(t * h, sh.r, sh.policy),
                SRC_DROPOUT,
                "embed.dropout_mask",
            )
        )
    if spec.position == "rope":
        d = spec.first_layer.attention.head_dim
        # cos/sin follow position_ids (1 x seq), in the dtype of the hidden states
        items.append(
            _item(
                "rotary cos/sin",
                2 * sh.seq * d * sh.r,
                "transformers RotaryEmbedding: cos, sin",
                "embed.rotary",
            )
        )
    return tuple(i for i in items if i.bytes)


def activation_dtype_note(sh: Shapes) -> str:
    return (
        f"activations in {sh.plan.compute.name}, residual stream in {sh.plan.residual.name}; "
        f"attention kernel {sh.kernel.value} ({sh.policy.value} kernels)"
    )


__all__ = [
    "SRC_COMPILED",
    "LayerActivations",
    "Shapes",
    "checkpointed",
    "effective_kernel",
    "embedding_items",
    "layer_activations",
    "rmsnorm_weight_side_bytes",
    "shapes",
]
