"""What attention saves: q, k, v (eager repeats k, v to a heads with ``repeat_kv``; SDPA with
``enable_gqa`` and flash keep g heads); eager adds the softmax output (fp32 when
``softmax(dtype=float32)`` or under CUDA autocast, plus its cast back to c), dropout output and mask
when p > 0; SDPA/flash add the output and the logsumexp (a x s x fp32). The attention output feeds
o_proj (c). A fused qkv projection with RoPE keeps its whole output alive through the v view next to the
rotated q, k; MLA keeps kv_b_proj's output the same way. Sources: transformers
``integrations/sdpa_attention.py`` and ``eager_attention_forward``; torch SDPA's kernels.
"""

from __future__ import annotations

from peakmem.breakdown import MemoryItem
from peakmem.model import DECODER_TASKS, Attention, Layer, ModelSpec
from peakmem.training import AttentionKernel, KernelPolicy

from .fused import compiled_output_copy
from .kernels import (
    EFFICIENT_LSE_ROUND,
    FLASH_BWD_SEQ_ROUND,
    FLASH_MAX_HEAD_DIM,
    MATH,
    call_backend,
    flash_bwd_head_rounded,
    sdpa_broadcasts_kv,
    sdpa_call_heads,
    sliding_mask,
)
from .norms import SRC_NORM, norm_saved
from .shapes import SRC_DROPOUT, Shapes, dropout_mask_bytes, item, sized
from .structure import compiled_block, layer_structure

SRC_EAGER = "transformers eager_attention_forward: softmax output saved by softmax and matmul"
SRC_SDPA = "torch SDPA flash/efficient: saves q, k, v, output, logsumexp (+ philox seed/offset)"
SRC_CLAMP = (
    "transformers 4.30.0-4.48.1 modeling_opt.py OPTAttention: torch.max saves its input (maximum's backward)"
)
SRC_MATH = "torch _scaled_dot_product_attention_math: materialises scores; CPU upcasts 16-bit to fp32"


def attention_terms(
    spec: ModelSpec, layer: Layer, sh: Shapes
) -> tuple[list[MemoryItem], int, int, int, tuple[int, ...]]:
    """Saved attention tensors (q/k/v onwards), the core bytes, forward and backward transients, and the
    backward transient's tensors at their sizes (dq, dk, dv and the kernel's scratch; eager: the scores'
    gradients)."""
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
    fused = (layer_structure(layer, sh.memo)[1] == 1 or sh.profile.fused_qkv) and not att.is_mla
    sdpa = sh.kernel is AttentionKernel.SDPA and not att.is_mla
    efficient = sdpa and sh.policy is KernelPolicy.CUDA
    efficient = efficient and call_backend(spec, att, sh.profile, half=sh.c < 4, seq=s)[0] == "efficient"
    # torchtune's expand + flatten, or transformers' ``repeat_kv`` where the call passes a mask, copies
    # k, v to all heads; with one kv head (MQA) it is a view (merging a size-1 dim with a stride-0 one):
    # measured, benchmarks/compile_activations.py
    repeated = sdpa and not fused and sdpa_call_heads(spec, sh.profile, att, s)[0] == a
    if 1 < g < a and (sh.profile.sdpa_repeats_kv or repeated):
        # Lit-GPT model.py l. 208-215: ``k.expand(...)`` then ``reshape`` copies k and v: v is no view
        # of the fused output any more, which is then freed
        g, fused = a, False
    qkv = t * (a * d + g * d + g * dv) * c
    # LitGPT 2024 model.py expands one kv head too (a stride-0 view): RoPE makes k all heads, v stays a view
    # of the fused output, SDPA's dk, dv have all heads
    kg = a if g == 1 < a and fused and sh.profile.mqa_rope_expands_k else g
    if att.is_mla:
        # v is a view of kv_b_proj's output (k_nope and v of every head), which SDPA keeps whole;
        # q (cat of q_pass, q_rot) and k (k_nope + shared k_rot) are new tensors
        nope = d - att.qk_rope_head_dim
        items.append(item("attn.q, k (MLA, all heads)", 2 * t * a * d * c, SRC_SDPA, "attn.mla_qk", 2))
        items.append(
            item(
                "attn.kv_b_proj output (kept by the v view)",
                t * a * (nope + dv) * c,
                SRC_SDPA,
                "attn.mla_kv_b_output",
            )
        )
    elif fused and spec.position == "rope":
        # v is a view of the fused qkv output, which SDPA keeps alive whole; q, k are rotated copies
        items.append(item("attn.fused qkv output (kept by the v view)", qkv, SRC_SDPA, "attn.fused_qkv"))
        rotated = (t * a * d * c, t * kg * d * c)
        items.append(sized("attn.rotated q, k (saved by SDPA)", rotated, SRC_SDPA, "attn.rotated_qk"))
    else:
        items.append(sized("attn.q,k,v (saved by SDPA)", (t * a * d * c, t * g * d * c, t * g * dv * c),
                            SRC_SDPA, "attn.qkv"))  # fmt: skip
    items.append(item("attn.output (= o_proj input)", t * a * dv * c, SRC_SDPA, "attn.sdpa_output"))
    if compiled_block(spec, layer, sh):
        items.append(compiled_output_copy(sh, t * a * dv))
    elif (
        (fused and spec.position == "rope" and sh.policy is KernelPolicy.CPU)
        or spec.rope_concat
        or sh.profile.rope_cat
    ):
        # measured: with strided (fused) inputs the CPU kernel's output is not in o_proj's layout; nor is
        # it where the rotary embedding's cat made q contiguous per head (``ModelSpec.rope_concat``). Not
        # GPT-2's fused c_attn without rotary embedding: its q, k, v views go to the CPU kernel as they are,
        # and its output is (measured: benchmarks/compile_activations.py style gpt2, eager)
        items.append(
            item("attn.output contiguous copy (o_proj input)", t * a * dv * c, SRC_SDPA, "attn.output_copy")
        )
    lse = b * a * s * 4
    scratch = flash_backward_scratch_sizes(spec, layer, sh)
    if efficient:
        lse = b * a * -(-s // EFFICIENT_LSE_ROUND) * EFFICIENT_LSE_ROUND * 4
        scratch = efficient_backward_scratch_sizes(att, sh)
    masked = sliding_mask(att, s) or padding_bool_mask(sh)
    if sh.kernel is AttentionKernel.SDPA and masked:
        # SDPA makes masking_utils' bool mask additive in the inputs' dtype (attention.cpp
        # ``convert_boolean_attn_mask``: zeros_like, masked_fill) at every call, and the kernel saves it:
        # CUDA's memory-efficient one and the CPU's (measured: tiny Gemma 3, window 32, 2 x 256 tokens on
        # CPU, 0.5 MiB a sliding layer; the estimate went from -10.4 % to -0.25 %). Falcon without alibi
        # (``ModelSpec.sdpa_mask``) passes create_causal_mask's bool mask too, and a real CPU step shows it
        # made additive per layer as well (tiny RW Falcon: 0.5 MiB a layer), but with it alone that step
        # goes from -10.9 % to +3.6 % (the o_proj input copy counted on CPU is not there): left out
        # A padded batch's boolean mask (``Profile.padding_mask``) the same (measured: tiny Llama,
        # transformers 5.23, benchmarks/sdpa_repeat_kv.py)
        items.append(item("attn.mask made additive (saved by SDPA)", b * s * s * c, SRC_SDPA,
                           "attn.sdpa_bias"))  # fmt: skip
    items.append(item("attn.logsumexp (fp32)", lse, SRC_SDPA, "attn.logsumexp"))
    # backward: the kernel writes dq, dk, dv while q, k, v, output are still saved, next to its scratch
    grads = (t * a * d * c, t * kg * d * c, t * kg * dv * c)
    bwd_sizes = tuple(x for x in (*grads, *scratch) if x)
    return items, lse, 0, sum(bwd_sizes), bwd_sizes


def padding_bool_mask(sh: Shapes) -> bool:
    """Whether the step's padded batch hands SDPA masking_utils' boolean mask (transformers 4.53.0 on),
    which SDPA makes additive at each call; before 4.53 the mask is additive already, one for all layers
    (``Profile.float_padding_mask``: :func:`peakmem.formulas.activations.layer.causal_mask_bytes`)."""
    return sh.profile.padding_mask and not sh.profile.float_padding_mask


def efficient_backward_scratch(att: Attention, sh: Shapes) -> int:
    """Bytes the memory-efficient kernel's backward allocates for its duration (see above)."""
    return sum(efficient_backward_scratch_sizes(att, sh))


def efficient_backward_scratch_sizes(att: Attention, sh: Shapes) -> tuple[int, ...]:
    """:func:`efficient_backward_scratch` tensor by tensor: its fp32 ``delta`` rows and, for 16-bit
    inputs, its fp32 ``grad_q`` accumulator."""
    rows = sh.batch * att.num_heads * sh.seq
    return (rows * 4, rows * att.head_dim * 4) if sh.c < 4 else (rows * 4,)


def flash_backward_scratch(spec: ModelSpec, layer: Layer, sh: Shapes) -> int:
    """Bytes FlashAttention-2's backward allocates (:func:`flash_backward_scratch_sizes`)."""
    return sum(flash_backward_scratch_sizes(spec, layer, sh))


def flash_backward_scratch_sizes(spec: ModelSpec, layer: Layer, sh: Shapes) -> tuple[int, ...]:
    """The tensors FlashAttention-2's backward allocates for the kernel's duration (``mha_bwd``):
    ``softmax_d`` fp32 [B, H, round128(S)], ``dq_accum`` fp32 [B, round128(S), H,
    :func:`flash_bwd_head_rounded` (D)] and, when the call hands fewer k/v heads than q heads
    (``enable_gqa``), ``dk_expanded`` and ``dv_expanded`` [B, S, H, D] in the input dtype (summed into
    dk, dv at the end). On CUDA under SDPA only where :func:`cuda_sdpa_backend` picks flash for the call
    (:func:`sdpa_call_heads`); with the flash-attn kernel for 16-bit inputs and equal head sizes up to
    256; none otherwise (the memory-efficient or math kernel, a CPU step, eager attention, MLA)."""
    att = layer.attention
    a, d = att.num_heads, att.head_dim
    if sh.policy is not KernelPolicy.CUDA or att.is_mla:
        return ()
    kv = att.num_kv_heads
    if sh.kernel is AttentionKernel.SDPA:
        backend, kv = call_backend(spec, att, sh.profile, half=sh.c < 4, seq=sh.seq)
        if backend != "flash":
            return ()
    elif sh.kernel is not AttentionKernel.FLASH or sh.c == 4 or d != att.v_head_dim or d > FLASH_MAX_HEAD_DIM:
        return ()
    rows = -(-sh.seq // FLASH_BWD_SEQ_ROUND) * FLASH_BWD_SEQ_ROUND
    scratch: tuple[int, ...] = (sh.batch * a * rows * 4, sh.batch * rows * a * flash_bwd_head_rounded(d) * 4)
    if kv != a:  # dk_expanded, dv_expanded
        scratch += (sh.tokens * a * d * sh.c,) * 2
    return scratch


def _mla_latent_terms(spec: ModelSpec, att: Attention, sh: Shapes) -> list[MemoryItem]:
    """Multi-head latent attention (DeepSeek-V2/V3, modeling_deepseek_v3.py): the q and kv latents
    go through an RMSNorm each and feed q_b_proj / kv_b_proj, which save the normed latents."""
    t, c = sh.tokens, sh.c
    items = [item("attn.kv latent norm + kv_b_proj input", norm_saved(spec, sh, att.kv_lora_rank)
                   + t * att.kv_lora_rank * c, SRC_NORM, "attn.mla_kv_latent")]  # fmt: skip
    if att.q_lora_rank:
        items.append(item("attn.q latent norm + q_b_proj input", norm_saved(spec, sh, att.q_lora_rank)
                           + t * att.q_lora_rank * c, SRC_NORM, "attn.mla_q_latent"))  # fmt: skip
    return items


def _eager_terms(
    spec: ModelSpec, layer: Layer, sh: Shapes, items: list[MemoryItem], scores: int
) -> tuple[list[MemoryItem], int, int, int, tuple[int, ...]]:
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
    if sdpa_broadcasts_kv(spec, sh.profile, att) and sh.kernel_note.startswith(MATH):
        # SDPA's math kernel on one k/v head without enable_gqa (Falcon-7B): the fp32 upcast comes
        # first, then matmul broadcasts the one head - a view at micro-batch 1 (attention.cpp)
        shared = att.num_kv_heads == 1 and sh.batch == 1
    kv = att.num_kv_heads if shared else a
    items.append(
        item(
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
    promoted = sh.plan.autocast and (sh.policy is KernelPolicy.CUDA or spec.task in DECODER_TASKS)
    softmax_fp32 = spec.attn_softmax_fp32 or promoted or sh.math_fallback
    sm = 4 if softmax_fp32 else inner
    core = scores * sm
    items.append(
        item(
            f"attn.softmax output ({'fp32' if sm == 4 else sh.plan.compute.name})",
            scores * sm,
            SRC_EAGER,
            "attn.softmax",
        )
    )
    if spec.attn_logit_softcap is not None:
        items.append(
            item(
                "attn.softcap tanh output",
                scores * inner,
                "modeling_gemma2.py: tanh(scores / cap)",
                "attn.softcap",
            )
        )
        core += scores * inner
    if sh.clamped_scores:
        # OPT before transformers 4.49: ``torch.max(scores + mask, finfo.min)`` keeps the masked scores
        # (peakmem.transformers_versions SCORES_CLAMP_MODEL_TYPES)
        items.append(item("attn.masked scores (kept by the torch.max clamp)", scores * inner, SRC_CLAMP,
                          "attn.clamp"))  # fmt: skip
        core += scores * inner
    cast_after_dropout = spec.attn_dropout_before_cast and sm != inner
    if spec.attention_dropout > 0:
        # GPT-2/Llama cast the probs back to the compute dtype first (that cast is not saved);
        # BERT drops out the fp32 probs and the next matmul's autocast cast is saved as well
        d_bytes = sm if cast_after_dropout else inner
        mask = dropout_mask_bytes(scores, d_bytes, sh.policy)
        items.append(item("attn.dropout output", scores * d_bytes, SRC_DROPOUT, "attn.dropout"))
        items.append(item("attn.dropout mask", mask, SRC_DROPOUT, "attn.dropout_mask"))
        core += scores * d_bytes + mask
    if sm != inner and (cast_after_dropout or spec.attention_dropout == 0):
        items.append(item("attn.probs cast to compute dtype", scores * inner, SRC_EAGER, "attn.probs"))
        core += scores * inner
    items.append(item("attn.output (o_proj input)", t * a * dv * c, SRC_EAGER, "attn.output"))
    # forward: QK^T and its scaled / masked copy alive together; backward: each node frees its saved
    # tensors when done, so next to the saved ones one gradient of the scores is alive at a time
    fwd = scores * max(2 * inner, inner + sm)
    grads = 1  # scores-sized gradients in the softmax dtype
    if sh.kernel_note.startswith(MATH) and sh.policy is KernelPolicy.CUDA:
        # SDPA's math kernel (attention.cpp ``_scaled_dot_product_attention_math``): ``_safe_softmax``'s
        # backward writes dS while the incoming dP (from ``matmul(attn, value)``'s backward) is alive, both
        # scores-sized in the softmax dtype (measured under the simulator's CUDA policy: falcon, b2 x s128)
        grads = 2
    return items, core, fwd, grads * scores * sm, (scores * sm,) * grads
