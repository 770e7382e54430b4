"""The head and the loss: final norm, LM head, logits, the fp32 upcast and cross-entropy.

For a 128k vocabulary the logits are often the largest tensors of a step. transformers'
``ForCausalLMLoss`` (loss/loss_utils.py) does ``logits = logits.float()`` and calls
``nn.functional.cross_entropy``, whose ``log_softmax`` saves its fp32 output (T x V x 4) for
backward. In forward, at the loss, the compute-dtype logits, their fp32 copy and the log-softmax
output are alive together. In backward, ``nll_loss_backward`` writes a T x V fp32 gradient and
``_log_softmax_backward_data`` another, both alive while the saved log-softmax output is (3 x T x V
x 4 at once). torchtune's ``TransformerDecoder`` also returns ``output(h).float()``. Earlier transformers
releases (``--transformers``: :mod:`peakmem.transformers_versions`) also copied the shifted logits
(:func:`transformers_head`).

Classification heads (BERT + ``ForSequenceClassification``) read the first token (the pooler's
dense layer saves a contiguous B x h copy, measured) and produce tiny logits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from peakmem.breakdown import Category, MemoryItem
from peakmem.model import ModelSpec
from peakmem.transformers_versions import TransformersRelease, release_facts

from .activations import Shapes, norm_saved
from .activations.norms import rmsnorm_backward_temporaries

SRC_CE = "transformers loss/loss_utils.py ForCausalLMLoss: logits.float(); cross_entropy saves log_softmax"
# An LM head that soft-caps the logits (``ModelSpec.final_logit_softcap``): ``tanh(logits / cap) * cap``
# saves tanh's T x V output in the compute dtype.
SRC_SOFTCAP = "modeling_gemma2.py: logits = tanh(logits / cap) * cap"
SRC_HEAD_CAST = "torch autocast: 16-bit copy of the head weight saved by the Linear"
SRC_HEAD = "lm_head (Linear) saves its input; final norm saves input + stats"


@dataclass(kw_only=True, slots=True)  # per estimate: not frozen, read-only by convention (see Shapes)
class HeadActivations:
    saved: tuple[MemoryItem, ...]  # kept from forward until the head's backward
    forward_transient: int  # extra at the loss in forward (logits and their fp32 copy)
    backward_transient: int  # extra at the start of backward (CE gradients)
    logits_grad: int  # the gradient of the logits in compute dtype (lm_head backward input)
    # beyond the saved tensors, the most alive while the head runs inside the model, before it returns
    # (a quantized head's dequantized weight: formulas/quant_head.py); 0: nothing beyond the layers'
    in_model: int = 0


SRC_FINAL_NORM_BACKWARD = (
    "modeling_llama.py LlamaRMSNorm on hidden_states.to(float32): its backward right after the head's holds "
    "mul x3, div, pow (fp32 T x h), beside every layer's saved tensors; measured, "
    "tiny Llama (hidden 256, vocab 256) on the CPU, transformers 5.23: 5.2 MB at 2 x 512 tokens"
)


def final_norm_backward(spec: ModelSpec, sh: Shapes, head: HeadActivations, hidden_split: int = 1) -> int:
    """Beyond the saved tensors, what the final RMSNorm's backward holds right after the head's: its fp32
    temporaries (:func:`.activations.norms.rmsnorm_backward_temporaries`, ``/ hidden_split`` under sequence
    parallelism), less what the head saved beside the norm's own tensors (freed by the head's backward).
    Unlike a block's second norm (norms.py ``pre_mlp_norm_stage``) no residual branch keeps the incoming
    gradient: the measured peak holds the five fp32 tensors only. The peak where the vocabulary is small
    next to the hidden size, or where the loss never makes the logits' gradient (a fused loss); 0 for other
    norms, fused or compiled ones and models without a final norm."""
    tmp = rmsnorm_backward_temporaries(spec, sh, spec.hidden_size) if spec.final_norm else 0
    if not tmp:
        return 0
    freed = sum([i.bytes for i in head.saved if i.key != "head.final_norm"])
    return max(0, -(-tmp // hidden_split) - freed)


def _act(path: str, nbytes: int, source: str, key: str) -> MemoryItem:
    return MemoryItem(path, Category.ACTIVATIONS, nbytes, source, key)  # by position: the hot path


def head_activations(spec: ModelSpec, sh: Shapes, head_weight_numel: int) -> HeadActivations:
    t, h, c = sh.tokens, spec.head_in_features, sh.c
    if spec.task == "sequence-classification":
        items = (_act("pooler + classifier inputs", 2 * sh.batch * h * c, SRC_HEAD, "head.pooler_inputs"),)
        return HeadActivations(saved=items, forward_transient=0, backward_transient=0, logits_grad=0)
    if spec.task == "token-value":  # a PPO critic: score = Linear(H, num_labels) on every position
        return value_head_activations(spec, sh)
    v = spec.vocab_size
    logits = t * v
    items_l = []
    if spec.final_norm:  # post-LN encoders have none
        final_norm = norm_saved(spec, sh, spec.hidden_size)
        items_l.append(_act("final norm (input + stats)", final_norm, SRC_HEAD, "head.final_norm"))
    lm_in = t * h * c
    items_l.append(_act("lm_head input", lm_in, SRC_HEAD, "head.lm_head_input"))
    if sh.plan.autocast:
        items_l.append(_act("autocast lm_head weight cast", head_weight_numel * c, SRC_HEAD_CAST,
                            "head.weight_cast"))  # fmt: skip
    if spec.final_logit_softcap is not None:
        items_l.append(_act("final logit softcap tanh output", logits * c, SRC_SOFTCAP, "head.softcap"))
    items_l.append(_act("loss.log_softmax output (fp32)", logits * 4, SRC_CE, "loss.log_softmax"))
    upcast = logits * 4 if c < 4 else 0
    return HeadActivations(
        saved=tuple(items_l),
        forward_transient=logits * c + upcast,
        backward_transient=2 * logits * 4,
        logits_grad=logits * c,
    )


SRC_VALUE_HEAD = (
    "transformers modeling_layers.py GenericForTokenClassification (num_labels 1, classifier_dropout 0 as "
    "verl b178a3cd fsdp_workers.py sets it): score(hidden_states); the value loss is over [B, R] values"
)


def value_head_activations(spec: ModelSpec, sh: Shapes) -> HeadActivations:
    """A critic's value head: the final norm and the ``score`` Linear save their inputs; its ``[T,
    num_labels]`` output and that output's gradient are the only head temporaries (no vocabulary)."""
    t, h, c = sh.tokens, spec.head_in_features, sh.c
    items = (
        _act(
            "final norm (input + stats)", norm_saved(spec, sh, spec.hidden_size), SRC_HEAD, "head.final_norm"
        ),
        _act("value head (score) input", t * h * c, SRC_VALUE_HEAD, "head.score_input"),
    )
    out = t * max(spec.num_labels, 1) * c
    return HeadActivations(saved=items, forward_transient=out, backward_transient=0, logits_grad=out)


# --- framework losses (peakmem.formulas.profiles) ---------------------------------------------------------
# Liger (linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py
# ``fused_linear_cross_entropy_forward``): the LM head and the CE run chunk by chunk over the tokens, with
# ``inc_factor = cdiv(V, H)``, ``chunk_size = min(next_power_of_2(cdiv(BT, inc_factor)), BT)`` (transient
# logits bounded by about BT x H); each chunk's logits (input dtype) are overwritten by their gradient in
# place; ``grad_input`` (BT x H, input dtype) and, when the head's weight trains, ``grad_weight`` (V x H,
# weight dtype) are computed in forward and saved (``ctx.save_for_backward(grad_input, grad_weight,
# grad_bias)``); the head's input is not saved.
SRC_LIGER_FLCE = (
    "Liger ops/fused_linear_cross_entropy.py: chunked logits, grads computed in forward and saved"
)
# unsloth (unslothai/unsloth unsloth/kernels/cross_entropy_loss.py ``Fast_CrossEntropyLoss``): the Triton
# kernel reads the 16-bit logits, saves them with the fp32 logsumexp, and its backward writes dlogits into
# the logits' storage in place; no fp32 copy, no log-softmax output.
SRC_IN_PLACE_CE = (
    "unsloth kernels/cross_entropy_loss.py Fast_CrossEntropyLoss: 16-bit logits + fp32 logsumexp"
)


def liger_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Rows of one Liger fused-linear-CE chunk (see SRC_LIGER_FLCE)."""
    inc = -(-vocab // hidden)
    rows = -(-tokens // inc)
    return min(1 << (rows - 1).bit_length(), tokens)


def liger_fused_linear_ce(
    spec: ModelSpec, head: HeadActivations, sh: Shapes, *, head_trains: bool
) -> HeadActivations:
    """The head under Liger's fused linear cross-entropy (``TrainingSetup.liger``)."""
    t, h, v, c = sh.tokens, spec.head_in_features, spec.vocab_size, sh.c
    drop = {"loss.log_softmax", "head.lm_head_input", "head.softcap"}
    items = [i for i in head.saved if i.key not in drop]
    items.append(_act("fused CE: grad of the head input (computed in forward)", t * h * c, SRC_LIGER_FLCE,
                      "loss.liger_grad_input"))  # fmt: skip
    if head_trains:
        w = sh.plan.weight.bits // 8
        items.append(_act("fused CE: lm_head weight grad (computed in forward)", v * h * w, SRC_LIGER_FLCE,
                          "loss.liger_grad_weight"))  # fmt: skip
    chunk = liger_chunk_rows(t, v, h) * v * c
    return HeadActivations(saved=tuple(items), forward_transient=chunk + t * 4, backward_transient=0,
                           logits_grad=0)  # fmt: skip


def in_place_ce(spec: ModelSpec, head: HeadActivations, sh: Shapes) -> HeadActivations:
    """The head under a CE kernel that keeps the 16-bit logits and overwrites them with their gradient
    (unsloth ``Fast_CrossEntropyLoss``)."""
    t, v, c = sh.tokens, spec.vocab_size, sh.c
    items = [i for i in head.saved if i.key != "loss.log_softmax"]
    items.append(_act("loss: 16-bit logits + fp32 logsumexp (in-place CE kernel)", t * v * c + t * 4,
                      SRC_IN_PLACE_CE, "loss.in_place_ce"))  # fmt: skip
    return HeadActivations(saved=tuple(items), forward_transient=t * 4, backward_transient=0,
                           logits_grad=t * v * c)  # fmt: skip


def transformers_head(spec: ModelSpec, head: HeadActivations, sh: Shapes,
                      release: TransformersRelease) -> HeadActivations:  # fmt: skip
    """The standard loss as a transformers release runs it (:mod:`peakmem.transformers_versions`): the
    forward's extra at the loss when it copies the shifted logits (``logits[..., :-1, :].contiguous()``, B x
    (S-1) x V). Upcast in the loss (4.46-4.48 ``ForCausalLMLoss``): the 16-bit logits, their fp32 copy and
    the shifted fp32 copy at once; in the model (4.31-4.45: ``logits = logits.float()`` frees the 16-bit
    ones): the fp32 logits and the shifted copy; none (before 4.31): the shifted copy in the logits' dtype,
    with no autocast the cross-entropy in it too (:func:`peakmem.formulas.lowbit_optim.half_ce`), under
    autocast ``log_softmax`` casting the copy to fp32 first. Backward is unchanged: the slice's
    zero-filled gradient comes after ``log_softmax``'s saved output is freed (module docstring).

    A micro-batch of one copies nothing: the slice ``[:, :S-1, :]`` of a contiguous 1 x S x V tensor is
    contiguous (a size-1 dimension's stride does not count), so ``.contiguous()`` returns it. Measured:
    transformers 4.46.3, tiny Qwen2 (vocab 152064) on the CPU, batch 1, seq 144: forward at the loss holds
    the bf16 logits, their fp32 upcast and log_softmax's output, no [143, 152064] copy
    (benchmarks/msswift_cpu_run.py, brief h-msrun)."""
    if not release.shifted_logits_copy:
        return head
    logits, shifted, c = sh.tokens * spec.vocab_size, sh.batch * (sh.seq - 1) * spec.vocab_size, sh.c
    copies = sh.batch > 1
    copied = shifted if copies else 0
    upcast = logits * 4 if c < 4 else 0
    if release.upcast == "none":
        if not sh.plan.autocast and c < 4:
            from .lowbit_optim import half_ce

            keep = [i for i in head.saved if i.key != "loss.log_softmax"]
            half: HeadActivations = half_ce(head, keep, logits, c, autocast=False, shifted_copy=copies)
            return half
        fwd = logits * c + copied * c + (shifted * 4 if c < 4 else 0)
    elif release.upcast == "model":
        fwd = max(logits * c + upcast, logits * 4 + copied * 4)
    else:
        fwd = logits * c + upcast + copied * 4
    return replace(head, forward_transient=fwd)


def framework_head(spec: ModelSpec, head: HeadActivations, sh: Shapes, setup: Any) -> HeadActivations:
    """The head as the framework's loss keeps it, when the setup asks for the standard loss: Liger's fused
    linear CE, unsloth's in-place CE, transformers' loss at ``setup.transformers``
    (:func:`transformers_head`), else ``head`` unchanged. An explicit ``TrainingSetup.loss`` wins."""
    if spec.task != "causal-lm":
        return head
    if setup.liger:
        return liger_fused_linear_ce(spec, head, sh, head_trains=setup.method.value == "full")
    if sh.profile.in_place_ce:
        return in_place_ce(spec, head, sh)
    if sh.profile.name == "hf":
        return transformers_head(spec, head, sh, release_facts(setup.transformers))
    return head
