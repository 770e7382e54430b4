"""The head and the loss: final norm, LM head, logits, the fp32 upcast and cross-entropy.

For a 128k vocabulary the logits are often the largest tensors of a step. transformers'
``ForCausalLMLoss`` (loss/loss_utils.py) does ``logits = logits.float()`` and calls
``nn.functional.cross_entropy``, whose ``log_softmax`` saves its fp32 output (T x V x 4) for
backward. In forward, at the loss, the compute-dtype logits, their fp32 copy and the log-softmax
output are alive together. In backward, ``nll_loss_backward`` writes a T x V fp32 gradient and
``_log_softmax_backward_data`` another, both alive while the saved log-softmax output is (3 x T x V
x 4 at once). torchtune's ``TransformerDecoder`` also returns ``output(h).float()``.

Classification heads (BERT + ``ForSequenceClassification``) read the first token (the pooler's
dense layer saves a contiguous B x h copy, measured) and produce tiny logits.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.breakdown import Category, MemoryItem
from peakmem.model import ModelSpec

from .activations import Shapes, norm_saved

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


def _act(path: str, nbytes: int, source: str, key: str) -> MemoryItem:
    return MemoryItem(path, Category.ACTIVATIONS, nbytes, source, key)  # by position: the hot path


def head_activations(spec: ModelSpec, sh: Shapes, head_weight_numel: int) -> HeadActivations:
    t, h, c = sh.tokens, spec.head_in_features, sh.c
    if spec.task == "sequence-classification":
        items = (_act("pooler + classifier inputs", 2 * sh.batch * h * c, SRC_HEAD, "head.pooler_inputs"),)
        return HeadActivations(saved=items, forward_transient=0, backward_transient=0, logits_grad=0)
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
