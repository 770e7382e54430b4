"""TRL's fused log-prob head: per-token log-probabilities without the B x L x vocab logits.

TRL 1.16's DPO, GRPO and RLOO trainers call ``model(..., labels=labels, fused_lm_head=True)``
(``trl/trainer/utils.py`` ``add_fused_lm_head``), which runs the backbone and then
``ChunkedLogProbFunction`` (``trl/kernels/chunked_logprob.py``) on the scored positions:

* forward: the head input ``hidden`` (``[N, H]``, a copy: ``hidden_states[mask]`` on Triton devices,
  where only the positions with a label are scored; ``hidden_states[:, :-1].reshape(-1, H)`` of all
  positions elsewhere) and the ``int64`` targets are saved with two fp32 ``[N]`` vectors (``log_z`` and
  the entropy, or ``log_z`` twice); seven fp32 ``[N]`` running statistics and one projection tile
  ``mm_buf`` of ``[min(N, TOKEN_CHUNK_SIZE), CHUNK_SIZE]`` in the compute dtype live while it runs;
* backward: fp32 accumulators for the head input's gradient (``[N, H]``) and, when the head trains,
  the head weight's (``[V, H]``), the tile buffer again, and at the end their casts to the inputs'
  dtypes next to the fp32 accumulators.

On devices without Triton (the CPU) each tile is folded with torch ops: a few fp32 ``[n, cols]``
temporaries per tile (:data:`CPU_FORWARD_TILES`, :data:`CPU_BACKWARD_TILES`, read off
``_forward_tile`` / ``_backward_tile`` and measured with ``peakmem.measure``'s tracker).

TRL 1.16's ``DistillationTrainer`` scores the student against its teacher the same way
(``trl/kernels/chunked_divergence.py`` ``ChunkedDivergenceFunction``, :func:`divergence_head`): both
backbones' last hidden states (``[B, L, H]`` each, alive while the loss runs), their completion
positions copied flat (``[N, H_s]``, ``[N, H_t]``, saved for backward with three fp32 ``[N]`` vectors),
nine fp32 ``[N]`` running statistics and **two** fp32 tiles of ``[min(N, TOKEN_CHUNK_SIZE),
VOCAB_CHUNK_SIZE]`` (the student's and the teacher's projections); backward: the tiles again and fp32
accumulators for the student's hidden (``[N, H_s]``) and head weight (``[V, H_s]``) gradients.
"""

from __future__ import annotations

from dataclasses import replace

from peakmem.breakdown import Category, MemoryItem
from peakmem.model import ModelSpec

from .activations import Shapes
from .loss import HeadActivations

SRC = "trl 1.16 kernels/chunked_logprob.py ChunkedLogProbFunction (fused_lm_head=True)"
TOKEN_CHUNK_SIZE = 4096  # trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE: tokens per projection tile
CHUNK_SIZE = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE: vocabulary columns per tile buffer
RUNNING_VECTORS = 7  # running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit
FP32, INT64 = 4, 8
# fp32 [n, cols] tensors alive at once in the torch fallbacks, read off the code and counted by the tracker
# (tiny llama, fp32, CPU): forward ``_forward_tile``: z = y * inv_t, z - new_m then exp, e * z (3);
# backward ``_backward_tile``: y, z, log_p, p, zeros_like(z), is_target.float() and its difference with p (7)
CPU_FORWARD_TILES = 3
CPU_BACKWARD_TILES = 7
SRC_DIV = "trl 1.16 kernels/chunked_divergence.py ChunkedDivergenceFunction (DistillationTrainer)"
DIV_TILES = 2  # s_buf and t_buf: the student's and the teacher's projection tiles
DIV_RUNNING_VECTORS = 9  # s_max, t_max, s_sum, s_x_sum, t_sum, t/s_weighted_gap, jsd, kl_student
DIV_SAVED_VECTORS = 3  # s_log_z, t_log_z, aux
# fp32 [n, cols] temporaries of the torch fallbacks at their largest (tiny llama, CPU, measured with the
# tracker): forward ``_stats_tile`` 6 (zs, zt, gap, the exps and their products), 7 with the JSD pass
# (``_jsd_tile``'s logaddexp); backward ``_backward_tile`` 9 for a KL (beta 0 or 1), 10 for the JSD
CPU_DIV_FORWARD_TILES = 6
CPU_DIV_FORWARD_TILES_JSD = 7
CPU_DIV_BACKWARD_TILES = 9
CPU_DIV_BACKWARD_TILES_JSD = 10


def scored_positions(sh: Shapes, scored: int | None, *, triton: bool) -> int:
    """N: the positions the head projects. Triton scores the ``scored`` completion tokens per sequence;
    the torch fallback every position but the last."""
    if triton and scored is not None:
        return sh.batch * min(scored, sh.seq - 1)
    return sh.batch * (sh.seq - 1)


def logprob_head(
    spec: ModelSpec,
    head: HeadActivations,
    sh: Shapes,
    *,
    scored: int | None,
    head_trains: bool,
    entropy: bool,
    triton: bool,
) -> HeadActivations:
    """``head`` (the standard head's saved tensors) under TRL's fused log-prob head."""
    n, h, v, c = scored_positions(sh, scored, triton=triton), spec.head_in_features, spec.vocab_size, sh.c
    drop = {"loss.log_softmax", "head.lm_head_input", "head.softcap"}
    saved = [i for i in head.saved if i.key not in drop]
    vectors = (2 if entropy else 1) * n * FP32
    saved.append(
        MemoryItem(
            path="log-prob head: its input [N, H], targets, log_z (and entropy)",
            category=Category.ACTIVATIONS,
            bytes=n * h * sh.r + n * INT64 + vectors,
            source=SRC,
            key="loss.logprob_head",
        )
    )
    rows = min(n, TOKEN_CHUNK_SIZE)
    tile = rows * CHUNK_SIZE * c
    cols = min(v, CHUNK_SIZE)
    fwd_fold = 0 if triton else CPU_FORWARD_TILES * rows * cols * FP32
    bwd_fold = 0 if triton else CPU_BACKWARD_TILES * rows * cols * FP32
    grads = n * h * (FP32 + sh.r)
    if head_trains:
        w = sh.plan.weight.bits // 8
        grads += v * h * (FP32 + w)
    forward = tile + RUNNING_VECTORS * n * FP32 + fwd_fold + n * FP32
    return replace(
        head,
        saved=tuple(saved),
        forward_transient=forward,
        backward_transient=tile + bwd_fold + grads,
        logits_grad=0,
    )


def no_grad_head_bytes(spec: ModelSpec, tokens: int, scored: int, act_bytes: int, *, triton: bool) -> int:
    """The head of a reference or old-policy forward under ``torch.no_grad()``: the head input copy,
    targets, the running statistics and one tile (``tokens`` positions, ``scored`` of them scored)."""
    n = scored if triton else tokens
    rows = min(n, TOKEN_CHUNK_SIZE)
    fold = 0 if triton else CPU_FORWARD_TILES * rows * min(spec.vocab_size, CHUNK_SIZE) * FP32
    return (
        n * (spec.head_in_features * act_bytes + INT64 + (RUNNING_VECTORS + 1) * FP32)
        + rows * CHUNK_SIZE * act_bytes
        + fold
    )


def divergence_head(
    spec: ModelSpec,
    head: HeadActivations,
    sh: Shapes,
    *,
    scored: int,
    teacher_hidden: int,
    jsd: bool,
    head_trains: bool,
    triton: bool,
) -> HeadActivations:
    """``head`` under TRL's chunked divergence head: the student's last ``scored`` positions of each
    sequence against a teacher of hidden width ``teacher_hidden`` (the same vocabulary)."""
    n, h, v, r = sh.batch * min(scored, sh.seq - 1), spec.head_in_features, spec.vocab_size, sh.r
    drop = {"loss.log_softmax", "head.lm_head_input", "head.softcap"}
    saved = [i for i in head.saved if i.key not in drop]
    saved.append(
        MemoryItem(
            path="divergence head: student and teacher hidden [N, H] copies, log_z x 2, aux",
            category=Category.ACTIVATIONS,
            bytes=n * (h + teacher_hidden) * r + DIV_SAVED_VECTORS * n * FP32,
            source=SRC_DIV,
            key="loss.divergence_head",
        )
    )
    rows, cols = min(n, TOKEN_CHUNK_SIZE), min(v, CHUNK_SIZE)
    tiles = DIV_TILES * rows * CHUNK_SIZE * FP32
    fwd = CPU_DIV_FORWARD_TILES_JSD if jsd else CPU_DIV_FORWARD_TILES
    bwd = CPU_DIV_BACKWARD_TILES_JSD if jsd else CPU_DIV_BACKWARD_TILES
    fwd_fold, bwd_fold = (0, 0) if triton else (fwd * rows * cols * FP32, bwd * rows * cols * FP32)
    # both backbones' outputs [B, L, H] stay alive in the trainer's _compute_loss while the loss runs
    outputs = sh.batch * sh.seq * (h + teacher_hidden) * r
    cast = 0 if r == FP32 else r  # the fp32 accumulators' casts to the inputs' dtype (a no-op in fp32)
    grads = n * h * (FP32 + cast)
    if head_trains:
        w = sh.plan.weight.bits // 8
        grads += v * h * (FP32 + (0 if w == FP32 else w))
    return replace(
        head,
        saved=tuple(saved),
        forward_transient=outputs + tiles + DIV_RUNNING_VECTORS * n * FP32 + fwd_fold,
        backward_transient=tiles + bwd_fold + grads,
        logits_grad=0,
    )


# --- verl's actor: the full logits, then per-row log-probs (and the entropy) ------------------------------
# verl (volcengine/verl b178a3cd) ``workers/actor/dp_actor.py`` ``_forward_micro_batch`` with padding kept
# (``use_remove_padding`` off) and no fused kernels: ``logits = output.logits`` ([B, L, V], the lm_head's
# output), ``logits.div_(temperature)`` in place, ``logits[:, -R - 1 : -1, :]`` (a view), then
# ``utils/torch_functional.py`` ``logprobs_from_logits``, whose torch path (``logprobs_from_logits_v2``,
# without flash-attn's Triton cross-entropy) gathers the labels' logits and subtracts a ``logsumexp`` taken
# one row at a time (fp32), or takes one ``log_softmax`` per row (16-bit logits); ``entropy_from_logits``
# is ``logsumexp(z) - sum(softmax(z) * z)`` over the whole [B, R, V] view.
SRC_VERL = (
    "verl b178a3cd workers/actor/dp_actor.py _forward_micro_batch; utils/torch_functional.py "
    "logprobs_from_logits_v2 / entropy_from_logits"
)
# [B, R, V] tensors alive at the log-prob's backward (measured with the tracker on the tiny Llama, fp32,
# peakmem.measure.ppo): the per-row logsumexp gradients stacked, the gather's ``new_zeros`` and its
# ``scatter_add`` result
VERL_BACKWARD_TILES = 3
# the entropy's backward adds the softmax and product gradients over the same view (two more, read off
# ``softmax_backward_data`` and ``mul``'s backward, and counted by the tracker with entropy on)
VERL_ENTROPY_BACKWARD_TILES = 2


def logits_logprob_head(
    spec: ModelSpec, head: HeadActivations, sh: Shapes, *, scored: int, entropy: bool
) -> HeadActivations:
    """``head`` under verl's logits-then-log-prob loss over the last ``scored`` positions of each sequence.

    Saved: the logits ``[B, L, V]`` themselves (every row's ``logsumexp`` saves a view of them; for 16-bit
    logits the rows' ``log_softmax`` outputs ``[B, R, V]`` instead), and with the entropy the ``softmax``
    output ``[B, R, V]`` (and the logits, which its ``logsumexp`` saves). Forward: 16-bit logits are a
    temporary; the entropy's ``softmax(z) * z`` product is one more ``[B, R, V]``. Backward: three ``[B, R,
    V]`` gradients at the log-prob (two more with the entropy) beside the saved logits, or, once these are
    freed, the logits' gradient ``[B, L, V]`` (``slice_backward``) and its copy by the temperature's
    division next to each other (the larger when the response is short)."""
    b, seq, v, c = sh.batch, sh.seq, spec.vocab_size, sh.c
    r = min(scored, seq - 1)
    logits, rows = b * seq * v * c, b * r * v
    keep = [i for i in head.saved if i.key not in {"loss.log_softmax", "head.softcap"}]
    fp32 = c == FP32
    saved = logits if fp32 or entropy else rows * c
    saved += rows * c if entropy else 0
    keep.append(
        MemoryItem(
            path="verl log-prob: the logits [B, L, V]" + (" and softmax [B, R, V]" if entropy else "")
            if fp32 or entropy
            else "verl log-prob: each row's log_softmax [B, R, V]",
            category=Category.ACTIVATIONS,
            bytes=saved,
            source=SRC_VERL,
            key="loss.verl_logits",
        )
    )
    forward = (0 if fp32 or entropy else logits) + (rows * c if entropy else 0)
    tiles = VERL_BACKWARD_TILES + (VERL_ENTROPY_BACKWARD_TILES if entropy else 0)
    return replace(
        head,
        saved=tuple(keep),
        forward_transient=forward,
        # the log-prob's [B, R, V] gradients next to the saved logits; or, once those are freed, the logits'
        # gradient [B, L, V] (slice_backward) and its division by the temperature (div's backward) together
        backward_transient=max(tiles * rows * c, 2 * logits - saved),
        # the logits' gradient [B, L, V] is written once the rows' logsumexp nodes have run and freed the
        # saved logits: it takes their place (no more than the saved bytes are alive for it)
        logits_grad=max(0, logits - saved),
    )


def logits_no_grad_bytes(
    spec: ModelSpec, sequences: int, seq: int, scored: int, act: int, *, entropy: bool
) -> int:
    """A no-grad log-prob pass as verl's ``compute_log_prob`` runs it (:func:`logits_logprob_head`'s
    math under ``torch.no_grad()``): the final hidden states beside the logits they project to, then the
    logits with the entropy's ``softmax`` and ``softmax(z) * z`` (two ``[B, R, V]``)."""
    logits = sequences * seq * spec.vocab_size * act
    rows = sequences * min(scored, seq - 1) * spec.vocab_size * act
    hidden = sequences * seq * spec.head_in_features * act
    return logits + max(hidden, 2 * rows if entropy else 0)
