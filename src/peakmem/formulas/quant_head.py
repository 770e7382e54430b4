"""A quantized LM head: the head's matmul dequantizes the whole vocab x hidden weight in forward and again
in backward.

Lit-GPT's QLoRA (litgpt/finetune/lora.py@5895df1, Lit-GPT finetune/lora.py@8641822b) builds its model under
Lightning Fabric's ``BitsandbytesPrecision``, which makes every ``torch.nn.Linear`` a bitsandbytes 4-bit
Linear, the ``lm_head`` included (:mod:`peakmem.formulas.qlora`, ``QuantConfig.quantize_head``). Its GPT
(litgpt/lora.py ``GPT.forward``) runs the head chunk by chunk, ``[self.lm_head(x_i) for x_i in
x.split(lm_head_chunk_size, dim=1)]`` (128 positions per sequence), and each chunk's ``MatMul4Bit``
(bitsandbytes 0.42.0 autograd/_functions.py) dequantizes the whole weight:

* forward, per chunk: ``F.dequantize_4bit(B, state)`` (the state's dtype: fp16 under Lightning) and its
  ``.to(A.dtype)`` copy alive together, then the cast weight next to the chunk's logits being written;
  the chunks before it are alive (the model returns the list), the loss's tensors (the log-softmax
  outputs) not yet, and the previous micro-batch's logits still are (Lit-GPT's loop rebinds ``logits``
  once the model returns: :mod:`peakmem.formulas.loop_held`);
* backward, per chunk: ``grad_output @ F.dequantize_4bit(B, state).to(grad_output.dtype).t()``: the same
  two weights, then the cast next to the chunk's input gradient (chunk x hidden), while the kept logits and
  the chunk's logits gradient are alive.

The head's input (the final norm's output, views of it per chunk) is what ``MatMul4Bit`` keeps in
``ctx.tensors`` before bitsandbytes 0.43.2; peakmem counts it among the head's saved tensors already.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from peakmem.adapters import quant_of
from peakmem.model import ModelSpec

from .activations import Shapes
from .loss import HeadActivations
from .profiles import head_chunk
from .qlora import dequantized_weight_bytes

# what the loss makes after the model returned (saved items' keys): not alive while the head runs
LOSS_KEY_PREFIX = "loss."


def head_rows(sh: Shapes, setup: Any) -> int:
    """Rows one head matmul projects: one chunk of every sequence (:func:`head_chunk`), or all tokens."""
    chunk = head_chunk(setup)
    return min(sh.tokens, sh.batch * chunk) if chunk else sh.tokens


def quantized_head(spec: ModelSpec, head: HeadActivations, sh: Shapes, setup: Any) -> HeadActivations:
    """``head`` (after the loss's adaptation) with a quantized LM head's matmuls (module docstring); ``head``
    itself unless the setup's quantized base includes the head (``QuantConfig.quantize_head``)."""
    quant = quant_of(setup)
    if quant is None or not quant.quantize_head or not quant.is_4bit or spec.task != "causal-lm":
        return head
    numel, c = spec.vocab_size * spec.head_in_features, sh.c
    rows = head_rows(sh, setup)
    dequant, cast = dequantized_weight_bytes(numel, quant, c), numel * c
    out, grad_in = rows * spec.vocab_size * c, rows * spec.head_in_features * c
    earlier = sh.tokens * spec.vocab_size * c - out  # the chunks the model made before the last
    not_yet = sum(i.bytes for i in head.saved if i.key.startswith(LOSS_KEY_PREFIX))
    in_model = earlier + max(dequant, cast + out) - not_yet
    # at a chunk's matmul backward: the loss's backward temporaries (the kept logits, a chunk's two CE
    # gradients) less the first CE gradient, freed once the logits' gradient (``logits_grad``, the matmul's
    # input) is written, plus the dequantized weights
    at_backward = head.backward_transient - head.logits_grad + max(dequant, cast + grad_in)
    return replace(
        head,
        in_model=max(head.in_model, in_model),
        backward_transient=max(head.backward_transient, at_backward),
    )


__all__ = ["LOSS_KEY_PREFIX", "head_rows", "quantized_head"]
