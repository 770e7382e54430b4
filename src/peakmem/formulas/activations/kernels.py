"""Which attention kernel really runs, on CPU and on CUDA (SDPA's flash / memory-efficient / math
choice), and the kernels' own padding of what they allocate. simulate/kernels.py applies the same rule
to the tensors of a real call."""

from __future__ import annotations

from peakmem.adapters import quant_of
from peakmem.dtypes import DType
from peakmem.model import Attention, ModelSpec
from peakmem.training import AttentionKernel, KernelPolicy, TrainingSetup

from ..kbit_prep import compute_dtype
from ..model_states import precision_plan
from ..profiles import Profile, profile_of

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


def sdpa_mask(spec: ModelSpec, att: Attention, seq: int, profile: Profile) -> bool:
    """Whether ``att``'s SDPA call at ``seq`` tokens passes an explicit ``attn_mask``: never from a
    framework's own attention (``Profile.own_attention``: ``is_causal``); always for a model whose mask is
    materialised (``ModelSpec.sdpa_mask``: Falcon) and for a batch with padding
    (``Profile.padding_mask``), else where :func:`sliding_mask` holds."""
    if profile.own_attention:
        return False
    return spec.sdpa_mask or profile.padding_mask or sliding_mask(att, seq)


def sdpa_broadcasts_kv(spec: ModelSpec, profile: Profile, att: Attention) -> bool:
    """Whether the SDPA call hands one k/v head for many q heads without ``enable_gqa`` (the math kernel
    then broadcasts it): transformers' Falcon (``ModelSpec.sdpa_kv`` "broadcast"), and Lit-GPT's 2023
    attention with one kv head (lit_gpt/model.py@8641822b l. 208: ``if n_query_groups != 1`` expand; the
    2024 code expands it too: ``Profile.mqa_rope_expands_k``)."""
    if profile.own_attention:
        return att.num_kv_heads == 1 < att.num_heads and not profile.mqa_rope_expands_k
    return spec.sdpa_kv == "broadcast"


def sdpa_call_heads(
    spec: ModelSpec, profile: Profile, att: Attention | None = None, seq: int = 0
) -> tuple[int, bool]:
    """The k/v heads ``spec``'s SDPA call (of ``att``, the first layer's by default; at ``seq`` tokens,
    which decides a sliding window's mask) hands the kernel, and whether it passes ``enable_gqa``
    (``ModelSpec.sdpa_kv``): transformers' shared ``sdpa_attention_forward`` passes the k/v heads with
    ``enable_gqa=True`` when ``use_gqa_in_sdpa`` holds (integrations/sdpa_attention.py: no mask, equal
    k/v head sizes <= 256), else ``repeat_kv`` copies to all heads, and before 4.54.0 it always copies
    (``Profile.sdpa_call_repeats_kv``); a padded batch passes a mask (``Profile.padding_mask``); torchtune's
    and Lit-GPT's attention expand them (``Profile.sdpa_repeats_kv``; one k/v head:
    :func:`sdpa_broadcasts_kv`)."""
    att = att or spec.first_layer.attention
    a, g = att.num_heads, att.num_kv_heads
    if sdpa_broadcasts_kv(spec, profile, att):
        return g, False
    if spec.sdpa_kv == "repeated" or profile.sdpa_repeats_kv or profile.sdpa_call_repeats_kv:
        return a, False
    masked = sdpa_mask(spec, att, seq, profile)
    if not masked and att.head_dim == att.v_head_dim <= FLASH_MAX_HEAD_DIM:
        return g, g < a
    return a, False


def sdpa_call_backend(spec: ModelSpec, setup: TrainingSetup, att: Attention | None = None) -> str:
    """:func:`cuda_sdpa_backend` for the SDPA call ``spec``'s attention (``att``, the first layer's by
    default) makes under ``setup``."""
    att = att or spec.first_layer.attention
    half = activation_compute(setup).bits < 32
    return call_backend(spec, att, profile_of(setup), half=half, seq=setup.seq_len)[0]


def activation_compute(setup: TrainingSetup) -> DType:
    """The dtype the attention's inputs are in: the precision's compute dtype, or fp32 behind a prepared
    quantized base's fp32 norms without autocast (:func:`peakmem.formulas.kbit_prep.compute_dtype`)."""
    plan = precision_plan(setup.precision)
    return compute_dtype(quant_of(setup), plan.compute, plan.autocast)


def call_backend(
    spec: ModelSpec, att: Attention, profile: Profile, *, half: bool, seq: int
) -> tuple[str, int]:
    """:func:`cuda_sdpa_backend` for ``att``'s SDPA call at ``seq`` tokens, and the k/v heads it hands
    the kernel (:func:`sdpa_call_heads`)."""
    kv, gqa = sdpa_call_heads(spec, profile, att, seq)
    backend = cuda_sdpa_backend(
        half=half, q_heads=att.num_heads, kv_heads=kv, enable_gqa=gqa,
        mask=sdpa_mask(spec, att, seq, profile),
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
        profile = profile_of(setup)
        kv, gqa = sdpa_call_heads(spec, profile, seq=setup.seq_len)
        return AttentionKernel.EAGER, (
            f"{MATH} on CUDA: {att.num_heads} query heads, {kv} k/v heads"
            + (" with enable_gqa" if gqa else " without enable_gqa" if kv < att.num_heads else "")
            + (", an explicit mask" if sdpa_mask(spec, att, setup.seq_len, profile) else "")
            + f", {activation_compute(setup).name} inputs (sdp_utils.cpp select_sdp_backend)"
        )
    return setup.attention, ""


def effective_kernel(spec: ModelSpec, setup: TrainingSetup) -> AttentionKernel:
    return kernel_choice(spec, setup)[0]


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
