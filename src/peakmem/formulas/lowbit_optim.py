"""Optimizers and step tricks that save memory: 8-bit / paged / 4-bit states, GaLore, optimizer-in-backward,
a CPU-offloaded optimizer, chunked or fused cross-entropy, activation offloading.

Every function takes the **trainable** tensors as ``(Tensor, occurrences)`` pairs (``spec.tensors()`` for
full fine-tuning, :func:`peakmem.formulas.lora.adapter_tensors` for LoRA), because the rules below are
per tensor (a small tensor keeps 32-bit states).

* bitsandbytes 8-bit Adam/AdamW (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization",
  arXiv 2110.02861; bitsandbytes 0.50.2 ``optim/optimizer.py`` ``Optimizer2State.init_state``): a tensor
  with fewer than ``min_8bit_size`` = 4096 elements keeps fp32 ``state1``/``state2``; a larger one keeps
  uint8 ``state1``/``state2`` plus fp32 ``absmax1``/``absmax2``, one per 256-element block
  (``blocksize = 256``); the quantile maps ``qmap1``/``qmap2`` (``dynamic``/``udynamic``, 256 fp32 each)
  are shared by all tensors (``self.name2qmap``). Lion8bit (``Optimizer1State``) keeps one state.
  The update is one in-place kernel (``optimizer_update_8bit_blockwise``): no step temporaries.
* paged variants (``is_paged=True``, ``get_state_buffer``): state buffers of tensors with at least 1e5
  elements are CUDA unified memory (``F.get_paged``, ``cudaMallocManaged``): the driver pages them to CPU
  RAM under pressure, and PyTorch's allocator never sees them (not in ``max_memory_allocated``); smaller
  tensors' states and every ``absmax`` stay ordinary device tensors. Their rows are marked
  ``unified_memory``: the estimator counts them on the device (nvidia-smi) but not in torch's allocated or
  reserved. ``PagedAdamW`` (32-bit, ``optim_bits=32``) keeps fp32 ``state1`` / ``state2`` whatever the
  parameter's dtype (``Optimizer2State.init_state``), updated in place by ``optimizer_update_32bit``.
* torchao's 4-bit / 8-bit / fp8 AdamW (``AdamW4bit``, ``AdamW8bit``, ``AdamWFp8``): the states' bytes per
  tensor are in :mod:`peakmem.formulas.torchao_optim` (torchao 0.18.0 ``optim/``).
* GaLore (Zhao et al. 2024, arXiv 2403.03507, Alg. 1; galore-torch ``GaLoreProjector``, ``proj_type="std"``):
  for each projected m x n matrix, the projection (r x min(m, n)) and Adam states of the projected
  gradient (max(m, n) x r each); other tensors keep full Adam states. Every ``update_proj_gap`` steps a
  thin SVD of the fp32 gradient (m x n, plus U, S, Vh).
* optimizer in backward (torchtune ``optimizer_in_bwd``, ``register_post_accumulate_grad_hook``): each
  parameter is stepped and its gradient freed as soon as it is accumulated: at most one tensor's
  gradient (and one step's temporaries) alive, no optimizer phase.
* CPU-offloaded optimizer (torchao ``CPUOffloadOptimizer``; DeepSpeed ZeRO-Offload, Ren et al. 2021): the
  states (and fp32 masters) live in CPU RAM; gradients are copied to pinned CPU buffers as they appear
  (``offload_gradients=True`` frees the device copy).
* chunked cross-entropy (torchtune ``CEWithChunkedOutputLoss``, 8 chunks): the logits are produced in
  chunks and each chunk is upcast and reduced separately: the fp32 upcast and the gradients exist per
  chunk; the fp32 log-softmax outputs of all chunks are still saved. Fused linear cross-entropy (Liger
  ``LigerFusedLinearCrossEntropyLoss``; Wijmans et al. 2024 "Cut Your Losses", arXiv 2411.09009): logits
  never materialized beyond one chunk; nothing of size vocab is saved. The whole cross-entropy compiled by
  Inductor (torchtitan's compiled loss, a transformers model compiled with ``labels=``): the 16-bit logits
  and two fp32 values per row kept, no fp32 copy, the gradient written in the logits' dtype
  (:func:`compiled_ce`).
* activation offloading (torchtune ``training/_activation_offloading.py`` ``OffloadActivations``): saved
  tensors of at least 1024 bytes move to pinned CPU memory in forward and come back one layer ahead in
  backward: about two layers' worth stay on the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from peakmem.breakdown import Category, MemoryItem, PerParamRow
from peakmem.model import ModelSpec, Tensor

from . import torchao_optim as ao
from .model_states import precision_plan
from .profiles import head_chunk
from .torchao_optim import QuantStates

# bitsandbytes 0.50.2 optim/optimizer.py
BNB_MIN_8BIT_SIZE = 4096  # Optimizer2State(min_8bit_size=4096)
BNB_BLOCKSIZE = 256  # init_state: blocksize = 256
BNB_QMAP_ENTRIES = 256  # functional.create_dynamic_map(): 256 fp32 values, "dynamic" and "udynamic"
BNB_PAGED_MIN_NUMEL = 100_000  # get_state_buffer: paged only when p.numel() >= 1e5
# galore-torch defaults (README): rank 128, update_proj_gap 200, scale 0.25
GALORE_DEFAULT_RANK = 128
# torchtune CEWithChunkedOutputLoss(num_output_chunks=8)
CE_CHUNKS = 8
# torchtune OffloadActivations(min_offload_size=1024)
FP32 = 4

SRC_BNB = (
    "bitsandbytes 0.50.2 optim/optimizer.py Optimizer2State.init_state (min_8bit_size 4096, blocksize 256)"
)
SRC_BNB_PAGED = (
    "bitsandbytes optim/optimizer.py get_state_buffer: is_paged and p.numel() >= 1e5 -> F.get_paged "
    "(cudaMallocManaged), else torch.zeros_like; Optimizer2State.init_state, optim_bits 32: fp32 state1, "
    "state2"
)
SRC_GALORE = "galore-torch GaLoreProjector (std): ortho r x min(m,n); Adam on the max(m,n) x r projection"


def bnb_8bit_states(
    tensors: Iterable[tuple[Tensor, int]],
    *,
    n_states: int = 2,
    min_8bit_size: int = BNB_MIN_8BIT_SIZE,
    paged: bool = False,
) -> QuantStates:
    """bitsandbytes 8-bit optimizer states (``n_states`` = 2 for Adam/AdamW, 1 for Lion/momentum)."""
    quantized = scales = fp32 = pq = pf = pageable = 0
    for numel, count in ao.items(tensors):
        if numel < min_8bit_size:
            fp32 += count * n_states * numel * FP32
            pf += count * numel
            if paged and numel >= BNB_PAGED_MIN_NUMEL:
                pageable += count * n_states * numel * FP32
            continue
        blocks = math.ceil(numel / BNB_BLOCKSIZE)
        quantized += count * n_states * numel
        scales += count * n_states * blocks * FP32
        pq += count * numel
        if paged and numel >= BNB_PAGED_MIN_NUMEL:
            pageable += count * n_states * numel
    maps = n_states * BNB_QMAP_ENTRIES * FP32 if pq else 0
    return QuantStates(quantized=quantized, scales=scales, maps=maps, fp32=fp32, params_quantized=pq,
                       params_fp32=pf, pageable=pageable)  # fmt: skip


def _state_row(
    tensor: str, dtype: str, nbytes: int, n: int, source: str, unified: bool = False
) -> PerParamRow:
    return PerParamRow(tensor=tensor, dtype=dtype, bytes_per_param=nbytes / n if n else 0.0, bytes=nbytes,
                       params=n, category=Category.OPTIMIZER_STATES, source=source,
                       unified_memory=unified)  # fmt: skip


def quant_state_rows(
    label: str, qs: QuantStates, params: int, source: str, bits: str = "uint8", small: str = "fp32"
) -> tuple[PerParamRow, ...]:
    """Rows of the bytes/param table for block-quantized states (``bits``: the codes' dtype; ``small``:
    the dtype of the full states of the tensors left unquantized); a paged optimizer's codes of large
    tensors (``qs.pageable``) in a row of their own, in CUDA unified memory."""

    def row(tensor: str, dtype: str, nbytes: int, n: int, unified: bool = False) -> PerParamRow:
        return _state_row(tensor, dtype, nbytes, n, source, unified)

    rows = [
        row(f"{label} states ({bits})", bits, qs.quantized - qs.pageable, qs.params_quantized),
        row(
            f"{label} states ({bits}, paged: CUDA unified memory)",
            bits,
            qs.pageable,
            qs.params_quantized,
            unified=True,
        ),
        row(f"{label} block scales (fp32)", "fp32", qs.scales + qs.maps, qs.params_quantized),
    ]
    if qs.fp32:
        rows.append(row(f"{label} states of small tensors ({small})", small, qs.fp32, qs.params_fp32))
    del params
    return tuple(r for r in rows if r.bytes)


def paged_adamw_rows(tensors: Iterable[tuple[Tensor, int]]) -> tuple[PerParamRow, ...]:
    """bitsandbytes ``PagedAdamW`` (32-bit): fp32 exp_avg and exp_avg_sq per tensor; those of tensors with
    at least 1e5 elements in CUDA unified memory (``get_state_buffer``), the rest ordinary device tensors."""
    paged = small = n_paged = n_small = 0
    for numel, count in ao.items(tensors):
        if numel >= BNB_PAGED_MIN_NUMEL:
            paged, n_paged = paged + count * 2 * numel * FP32, n_paged + count * numel
        else:
            small, n_small = small + count * 2 * numel * FP32, n_small + count * numel
    rows = (
        _state_row("paged AdamW m, v (fp32, paged: CUDA unified memory)", "fp32", paged, n_paged,
                   SRC_BNB_PAGED, unified=True),
        _state_row("paged AdamW m, v of tensors < 1e5 elements (fp32)", "fp32", small, n_small,
                   SRC_BNB_PAGED),
    )  # fmt: skip
    return tuple(r for r in rows if r.bytes)


# --- GaLore --------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class GaloreStates:
    projections: int
    low_rank_states: int
    full_states: int  # tensors not projected (1-D, embeddings, head)
    svd_temporary: int  # the largest projected tensor's SVD (every update_proj_gap steps)


def galore_states(
    tensors: Iterable[tuple[Tensor, int]],
    *,
    rank: int = GALORE_DEFAULT_RANK,
    state_bytes: int = FP32,
    proj_bytes: int = FP32,
    projected_components: tuple[str, ...] = ("attention", "mlp", "shared_experts"),
) -> GaloreStates:
    """GaLore-AdamW: projected matrices of the attention/MLP blocks (galore-torch README's
    ``target_modules_list = ["attn", "mlp"]``); everything else plain AdamW."""
    proj = low = full = svd = 0
    for t, n in tensors:
        count = t.copies * n
        if len(t.shape) == 2 and t.component in projected_components and t.kind == "linear_weight":
            m, k = t.shape
            r = min(rank, m, k)
            proj += count * r * min(m, k) * proj_bytes
            low += count * 2 * r * max(m, k) * state_bytes
            small = min(m, k)
            svd = max(svd, (m * k + small * (m + k) + small) * FP32)
        else:
            full += count * 2 * math.prod(t.shape) * state_bytes
    return GaloreStates(projections=proj, low_rank_states=low, full_states=full, svd_temporary=svd)


__all__ = [
    "GaloreStates",
    "QuantStates",
    "bnb_8bit_states",
    "galore_states",
    "quant_state_rows",
]


# --- the estimator's view ------------------------------------------------------------------------------
# OptimizerName values handled here (peakmem.training.OptimizerName spells them for the CLI).
ADAMW_8BIT = "adamw-8bit"  # bitsandbytes.optim.AdamW8bit
PAGED_ADAMW_8BIT = "paged-adamw-8bit"  # bitsandbytes.optim.PagedAdamW8bit
PAGED_ADAMW = "paged-adamw"  # bitsandbytes.optim.PagedAdamW (PagedAdamW32bit)
LION_8BIT = "lion-8bit"  # bitsandbytes.optim.Lion8bit
ADAMW_4BIT = "adamw-4bit"  # torchao.optim.AdamW4bit
ADAMW_8BIT_TORCHAO = "adamw-8bit-torchao"  # torchao.optim.AdamW8bit
ADAMW_FP8 = "adamw-fp8"  # torchao.optim.AdamWFp8
# torchao's formats and labels (peakmem.formulas.torchao_optim)
TORCHAO = {
    ADAMW_4BIT: (ao.AO_4BIT, "AdamW 4-bit"),
    ADAMW_8BIT_TORCHAO: (ao.AO_8BIT, "AdamW 8-bit (torchao)"),
    ADAMW_FP8: (ao.AO_FP8, "AdamW fp8"),
}
GALORE_ADAMW = "galore-adamw"  # galore_torch.GaLoreAdamW
NAMES = frozenset({ADAMW_8BIT, PAGED_ADAMW_8BIT, PAGED_ADAMW, LION_8BIT, GALORE_ADAMW, *TORCHAO})


def handles(setup: Any) -> bool:
    return str(getattr(setup.optimizer, "value", setup.optimizer)) in NAMES


def optimizer_rows(spec: ModelSpec, setup: Any) -> tuple[PerParamRow, ...]:
    """Rows of the bytes/param table for the optimizers of this module, over ``spec``'s tensors (the
    trainable ones: pass the adapters' spec for LoRA)."""
    name = str(getattr(setup.optimizer, "value", setup.optimizer))
    tensors = list(spec.tensors())
    params = sum(t.numel * n for t, n in tensors)
    if name in (ADAMW_8BIT, PAGED_ADAMW_8BIT, LION_8BIT):
        n_states = 1 if name == LION_8BIT else 2
        qs = bnb_8bit_states(tensors, n_states=n_states, paged=name == PAGED_ADAMW_8BIT)
        label = {ADAMW_8BIT: "AdamW 8-bit", PAGED_ADAMW_8BIT: "paged AdamW 8-bit", LION_8BIT: "Lion 8-bit"}[
            name
        ]
        return quant_state_rows(label, qs, params, SRC_BNB)
    if name == PAGED_ADAMW:
        return paged_adamw_rows(tensors)
    if name in TORCHAO:
        fmt, label = TORCHAO[name]
        small = precision_plan(setup.precision).state
        qs = ao.ao_states(tensors, fmt, state_bytes=small.bits // 8)
        return quant_state_rows(label, qs, params, fmt.source, bits=fmt.name, small=small.name)
    g = galore_states(tensors)

    def row(tensor: str, nbytes: int) -> PerParamRow:
        return PerParamRow(tensor=tensor, dtype="fp32", bytes_per_param=nbytes / params if params else 0.0,
                           bytes=nbytes, params=params, category=Category.OPTIMIZER_STATES,
                           source=SRC_GALORE)  # fmt: skip

    rows = (row("GaLore projections (r x min(m, n))", g.projections),
            row("GaLore Adam m, v of the projected gradients", g.low_rank_states),
            row("AdamW m, v of the unprojected tensors", g.full_states))  # fmt: skip
    return tuple(r for r in rows if r.bytes)


def step_temporaries(spec: ModelSpec, setup: Any) -> tuple[MemoryItem, ...]:
    """bitsandbytes' blockwise kernels and torchao's compiled low-bit step update in place (none); GaLore's
    projection refresh (every update_proj_gap steps) runs a thin SVD of the largest projected gradient."""
    name = str(getattr(setup.optimizer, "value", setup.optimizer))
    if name != GALORE_ADAMW:
        return ()
    g = galore_states(list(spec.tensors()))
    item = MemoryItem(
        path="optimizer.galore SVD of the largest gradient (fp32)", category=Category.TEMPORARIES,
        bytes=g.svd_temporary, source=SRC_GALORE, key="optimizer.galore_svd",
    )  # fmt: skip
    return (item,)


# --- step tricks as the estimator applies them ------------------------------------------------------------
# ``setup.loss`` values (peakmem.training.LossImpl): standard | chunked | chunked-compiled | fused | half |
# compiled.
SRC_CHUNKED = "torchtune CEWithChunkedOutputLoss: output(h) in 8 chunks; each chunk .float() + cross_entropy"
SRC_CHUNKED_COMPILED = (
    "torchtune compile_loss (inductor): the chunked CE kernel saves its 16-bit input chunk and the fp32 "
    "row max and logsumexp; the upcast is fused into the reductions, so no fp32 copy of a chunk is ever "
    "allocated (measured with Inductor on torch 2.13: forward allocates the row statistics only, backward "
    "the chunk's 16-bit gradient; tests/test_compile_torch.py)"
)
SRC_FUSED = "Liger FusedLinearCrossEntropy / cut-cross-entropy: logits only ever exist one chunk at a time"


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


def adapt_head_loss(spec: ModelSpec, head: Any, sh: Any, setup: Any) -> Any:
    """The head's saved tensors and temporaries under a chunked or fused cross-entropy (``setup.loss``).
    ``head`` is :class:`peakmem.formulas.loss.HeadActivations`; unchanged for the standard loss."""

    kind = _value(getattr(setup, "loss", "standard"))
    if kind == "standard" or spec.task != "causal-lm":
        return head
    if kind == "divergence":
        from peakmem.formulas.logprob_head import divergence_head

        return divergence_head(spec, head, sh, scored=setup.scored_tokens or sh.seq,
                               teacher_hidden=setup.teacher_hidden or spec.head_in_features,
                               jsd=setup.divergence_jsd, head_trains=_value(setup.method) == "full",
                               triton=_value(setup.kernel_policy) == "cuda")  # fmt: skip
    if kind in ("logits-logprob", "logits-logprob-entropy"):
        from peakmem.formulas.logprob_head import logits_logprob_head

        return logits_logprob_head(spec, head, sh, scored=setup.scored_tokens or sh.seq - 1,
                                   entropy=kind == "logits-logprob-entropy")  # fmt: skip
    if kind in ("logprob", "logprob-entropy"):
        from peakmem.formulas.logprob_head import logprob_head

        return logprob_head(spec, head, sh, scored=getattr(setup, "scored_tokens", None),
                            head_trains=_value(setup.method) == "full", entropy=kind == "logprob-entropy",
                            triton=_value(setup.kernel_policy) == "cuda")  # fmt: skip
    t, v, c = sh.tokens, spec.vocab_size, sh.c
    chunk = math.ceil(t / CE_CHUNKS) * v
    keep = [i for i in head.saved if i.key != "loss.log_softmax"]
    if kind == "half":
        chunk_rows = min(t, sh.batch * head_chunk(setup))
        # Lit-GPT's chunked_cross_entropy (the profiles with an lm_head chunk) reshapes the shifted slice
        # ``logits[..., :-1, :]``: a copy only with more than one row (one row's slice is contiguous)
        copy = sh.batch > 1 or not sh.profile.lm_head_chunk
        return half_ce(
            head, keep, t * v, c, autocast=sh.plan.autocast, chunk=chunk_rows * v, shifted_copy=copy
        )
    if kind == "compiled" and sh.profile.logits_fp32_in_model:
        # torchtune: the compiled loss (training/_compile.py compile_loss@1814feb) reads the model's fp32
        # logits, made eagerly from the 16-bit ones (both alive at that copy); it keeps them and writes
        # their fp32 gradient, which ``.float()``'s backward casts to 16 bits
        return replace(compiled_ce(head, keep, t, v, FP32), forward_transient=t * v * c)
    if kind == "compiled":
        return compiled_ce(head, keep, t, v, c)
    if kind == "chunked":
        saved = [*keep, MemoryItem(path="loss.log_softmax outputs of all chunks (fp32)", bytes=t * v * FP32,
                                   category=Category.ACTIVATIONS, source=SRC_CHUNKED,
                                   key="loss.chunked_log_softmax")]  # fmt: skip
        # forward: every chunk's 16-bit logits (the model returns the list) + one chunk's fp32 upcast;
        # backward: a chunk's two fp32 CE gradients and its 16-bit cast
        return replace(head, saved=tuple(saved), forward_transient=t * v * c + chunk * FP32,
                       backward_transient=2 * chunk * FP32 + chunk * c, logits_grad=chunk * c)  # fmt: skip
    if kind == "chunked-compiled":
        # inductor fuses upcast, log-softmax and NLL: it saves the 16-bit chunk and its logsumexp, and its
        # backward writes the chunk's gradient (softmax - one-hot) directly in the 16-bit dtype
        saved = [*keep, MemoryItem(path="loss: 16-bit logits chunks + fp32 row max, logsumexp (compiled CE)",
                                   bytes=compiled_ce_saved(t, v, c), category=Category.ACTIVATIONS,
                                   source=SRC_CHUNKED_COMPILED, key="loss.compiled_chunks")]  # fmt: skip
        return replace(head, saved=tuple(saved), forward_transient=0,
                       backward_transient=chunk * c, logits_grad=chunk * c)  # fmt: skip
    # fused: the head's matmul and the CE run chunk by chunk inside one op; the gradient of the head input
    # is computed in forward and kept (T x h); the head input itself is saved by the op
    saved = [i for i in keep if i.key != "head.lm_head_input"]
    saved.append(MemoryItem(path="fused CE: head input + its gradient (computed in forward)",
                            bytes=2 * t * spec.hidden_size * c, category=Category.ACTIVATIONS,
                            source=SRC_FUSED, key="loss.fused_ce"))  # fmt: skip
    return replace(head, saved=tuple(saved), forward_transient=2 * chunk * FP32, backward_transient=0,
                   logits_grad=0)  # fmt: skip


SRC_HALF_CE = (
    "torch nn.functional.cross_entropy on 16-bit logits: log_softmax saves its output in their dtype and "
    "nll_loss / _log_softmax_backward_data write 16-bit gradients (transformers 4.2x GPT2LMHeadModel: "
    "shift_logits = lm_logits[..., :-1, :].contiguous(), no .float())"
)


def half_ce(
    head: Any,
    keep: list[MemoryItem],
    logits: int,
    c: int,
    *,
    autocast: bool,
    chunk: int = 0,
    shifted_copy: bool = True,
) -> Any:
    """``loss='half'``: cross-entropy on the model's 16-bit logits (``logits`` elements of ``c`` bytes), no
    fp32 upcast. In forward the logits and their contiguous shifted copy are alive at the loss, log_softmax
    saves its 16-bit output; backward writes two 16-bit gradients. Under autocast, cross_entropy runs in
    fp32 anyway (autocast's fp32 op list), and fp32 logits have nothing to upcast: the standard loss.

    ``chunk`` (elements of one chunk, :attr:`Profile.lm_head_chunk`; 0: none): the head and the loss run
    chunk by chunk (Lit-GPT lora.py ``GPT.forward`` with ``lm_head_chunk_size``, utils.py
    ``chunked_cross_entropy``): every chunk's logits and log_softmax output are kept, one chunk's shifted
    copy at a time in forward; the loop holds the logits list through backward, which writes one chunk's
    two gradients at a time.

    Unchunked (``chunk`` 0): in forward the logits, their shifted copy (none when ``shifted_copy`` is False:
    a view) and the log-softmax output; backward holds two logits-sized gradients next to the saved output
    (Lit-GPT's full.py: the kept logits, the chunk gradients' concatenation, then the slice's zero-padded
    gradient, each logits-sized, with the log-softmax outputs freed chunk by chunk: the same 3 x)."""

    if autocast or c >= FP32:
        return head
    out = MemoryItem(path="loss.log_softmax output (16-bit, no upcast)", bytes=logits * c,
                     category=Category.ACTIVATIONS, source=SRC_HALF_CE, key="loss.log_softmax")  # fmt: skip
    if chunk:
        return replace(head, saved=(*keep, out), forward_transient=(logits + chunk) * c,
                       backward_transient=(logits + 2 * chunk) * c, logits_grad=chunk * c)  # fmt: skip
    copies = 2 if shifted_copy else 1
    return replace(head, saved=(*keep, out), forward_transient=copies * logits * c,
                   backward_transient=2 * logits * c, logits_grad=logits * c)  # fmt: skip


# --- the cross-entropy under torch.compile (``loss='compiled'``; each chunk of ``'chunked-compiled'``) -----
# What Inductor keeps of ``cross_entropy(logits.float(), labels)`` (torch 2.13, TORCH_LOGS=output_code, CPU):
# the forward is one kernel (``cpp_fused__log_softmax__to_copy_nll_loss_forward_view_0``) that reads the
# 16-bit logits and writes, per row, the fp32 ``amax`` and ``log`` (of the sum of exp(x - amax)) and the
# loss; the partitioner (torch/_functorch/partitioners.py ``min_cut_rematerialization_partition``) saves
# the logits themselves (``primals_1``), the labels, ``amax`` and ``log``: no fp32 T x V tensor exists.
# The pointwise upcast, shift and exp are recomputed in backward from the saved logits; the reductions are
# saved because ``should_ban_recomputation`` never recomputes an op whose output is 4x smaller than its
# inputs ("saving the output of the reduction is very cheap/small"): graph-level rules, the same on CUDA.
# The backward is one kernel (``cpp_fused__log_softmax__log_softmax_backward_data__to_copy_..._
# nll_loss_backward_...``) that writes the T x V gradient in the logits' dtype (with a T x 1 fp32 scratch,
# 1 / (V x c / 4) of it, not counted).
COMPILED_CE_ROW_STATS = 2  # fp32 per row, saved for backward: amax and log-sum-exp
SRC_COMPILED_CE = (
    "torch.compile (Inductor) of cross_entropy(logits.float(), labels): one fused kernel each way; saves the "
    "logits + fp32 row max and log-sum-exp, writes the logits' gradient in their dtype (torch 2.13 generated "
    "code; torchtitan@e7c0cae components/loss.py build_cross_entropy_loss: torch.compile(loss_fn))"
)


def compiled_ce_saved(rows: int, vocab: int, c: int) -> int:
    """Bytes a compiled cross-entropy keeps for backward over ``rows`` x ``vocab`` logits of ``c`` bytes:
    the logits and :data:`COMPILED_CE_ROW_STATS` fp32 statistics per row."""
    return rows * vocab * c + COMPILED_CE_ROW_STATS * rows * FP32


def compiled_ce(head: Any, keep: list[MemoryItem], rows: int, vocab: int, c: int) -> Any:
    """``loss='compiled'``: the standard loss (``cross_entropy(logits.float(), labels)``) compiled by
    Inductor, as torchtitan runs it when compile is on (torchtitan@bbb1b616e, 2025-04-02, to today:
    ``build_cross_entropy_loss`` wraps it in ``torch.compile``; torchtitan@e8977b007, 2024-12-18, had turned
    it off, "compiling loss function causes CUDA errors", so 9dec370 runs it eagerly; from 08b8b244f,
    2025-08, ``compile.components`` = ["model", "loss"] by default) and as ``torch.compile(model)`` of a
    transformers causal LM called with ``labels=`` runs it (``ForCausalLMLoss`` traced into the model's
    graph, no break: transformers 5.23, torch 2.13).

    Inductor fuses the upcast, the log-softmax and the NLL (see :data:`SRC_COMPILED_CE`): the forward
    keeps the ``c``-byte logits (alive anyway at the loss; now until backward) and two fp32 values per
    row, and allocates nothing of size vocab; the backward writes the logits' gradient in their dtype in
    one kernel, next to the saved logits, which go when it returns. Eager's fp32 copy, log-softmax output
    and two fp32 gradients never exist: per logit, ``c`` bytes at the loss in forward and ``2 x c`` at the
    start of backward, where eager holds 10 and 12 for 16-bit logits (8 and 12 for fp32 ones).

    On CUDA the saved set is the partitioner's and the same (not measured on a GPU here); the kernels are
    Triton reductions over the vocabulary, split into a ``rows x splits`` fp32 partial only when there are
    fewer than 2 x SMs rows (torch 2.13 torch/_inductor/choices.py ``reduction_split_factor``: "don't
    split if there are enough outputs"), which a training batch never is; ``online_softmax``
    (torch/_inductor/config.py) changes how amax and the sum are computed, not what is saved."""

    saved = MemoryItem(path="loss: logits kept by the compiled CE + fp32 row max and log-sum-exp",
                       bytes=compiled_ce_saved(rows, vocab, c), category=Category.ACTIVATIONS,
                       source=SRC_COMPILED_CE, key="loss.compiled_ce")  # fmt: skip
    return replace(head, saved=(*keep, saved), forward_transient=0, backward_transient=0,
                   logits_grad=rows * vocab * c)  # fmt: skip


def offload_layer(la: Any, setup: Any) -> Any:
    """Activation offloading (``setup.activation_offload``): a layer's saved tensors live in CPU RAM
    between its forward and its backward; during its backward they are back on the device, next to the
    next layer's prefetched ones (torchtune ``use_streams=True``). ``la`` is a LayerActivations."""

    if not getattr(setup, "activation_offload", False):
        return la
    on_gpu = la.saved_bytes
    return replace(la, saved=(), backward_transient=la.backward_transient + 2 * on_gpu,
                   forward_transient=la.forward_transient + on_gpu)  # fmt: skip


def in_backward(setup: Any) -> bool:
    return bool(getattr(setup, "optimizer_in_backward", False))


def assumptions(setup: Any) -> tuple[str, ...]:
    out = []
    name = _value(setup.optimizer)
    if name in (ADAMW_8BIT, PAGED_ADAMW_8BIT, LION_8BIT):
        out.append(
            "bitsandbytes 8-bit states: uint8 + fp32 absmax per 256 elements; tensors < 4096 "
            "elements keep fp32 states (min_8bit_size); in-place update kernel, no step temporaries"
        )
    if name == PAGED_ADAMW:
        out.append("bitsandbytes PagedAdamW: fp32 m, v whatever the parameters' dtype; in-place update "
                   "kernel, no step temporaries")  # fmt: skip
    if name in (PAGED_ADAMW_8BIT, PAGED_ADAMW):
        out.append(
            "paged optimizer: states of tensors >= 1e5 elements are CUDA unified memory: on the device "
            "(nvidia-smi) until the driver pages them to CPU RAM, but not in torch's allocated or reserved "
            "(extra['paged_optimizer_bytes'])"
        )
    if name in TORCHAO:
        fmt = TORCHAO[name][0]
        maps = f" + a {fmt.qmap_entries}-entry fp32 map" if fmt.qmap_entries else ""
        out.append(
            f"torchao {TORCHAO[name][1]}: {fmt.name} codes + fp32 scale per {fmt.block}{maps}, per state and "
            f"tensor; tensors < {ao.AO_MIN_QUANT_SIZE} elements or not a multiple of {fmt.block} keep full "
            "states in the parameter's dtype (adam.py _new_buffer: zeros_like(p))"
        )
    if name == GALORE_ADAMW:
        out.append(f"GaLore rank {GALORE_DEFAULT_RANK} on attention/MLP matrices; others plain AdamW")
    loss = _value(getattr(setup, "loss", "standard"))
    if loss.startswith("chunked"):
        out.append(f"loss {loss}: {CE_CHUNKS} chunks")
    elif loss == "compiled":
        out.append(
            "loss compiled (torch.compile of cross_entropy(logits.float(), labels)): the logits and two fp32 "
            "values per row kept for backward, no fp32 copy; the logits' gradient written in their dtype"
        )
    elif loss == "fused":
        out.append("fused linear cross-entropy")
    elif loss == "standard" and getattr(setup, "compiled", False) and not getattr(setup, "liger", False):
        out.append(
            "loss standard under torch.compile: the cross-entropy runs eagerly (torchtitan 2024-12 did); "
            "HF Trainer (accelerate's TorchDynamoPlugin compiles the whole model, ForCausalLMLoss included) "
            "and torchtitan since 2025-04 compile it too: --loss compiled"
        )
    elif loss.startswith("logprob"):
        out.append("loss: TRL's fused log-prob head over the completion (trl/kernels/chunked_logprob.py)")
    if in_backward(setup):
        out.append(
            "optimizer in backward: each parameter stepped in its post-accumulate-grad hook and its "
            "gradient freed; at most one layer's gradients alive"
        )
    if getattr(setup, "activation_offload", False):
        out.append(
            "activation offloading: saved tensors in pinned CPU RAM (extra['cpu_activation_bytes']); "
            "two layers' worth on the device during backward"
        )
    return tuple(out)


def step_tricks(la: Any, layer_grads: int, setup: Any, step_bytes: int = 0) -> tuple[Any, int]:
    """One layer under activation offloading and optimizer-in-backward: (its activations as the device
    sees them, the gradient bytes it leaves behind in backward). ``step_bytes``: under
    optimizer-in-backward, one tensor's optimizer-step temporaries
    (:func:`peakmem.formulas.sharding.one_tensor_step_bytes`),
    alive in backward next to the layer's gradients."""

    la = offload_layer(la, setup)
    if in_backward(setup):  # each parameter stepped and its grad freed in backward: one layer's at most
        return replace(la, backward_transient=la.backward_transient + layer_grads + step_bytes), 0
    return la, layer_grads
