"""What a training loop that keeps its last micro-batch's output leaves alive into the next micro-batch.

Lit-GPT's fine-tuning loop (lit_gpt finetune/lora.py@8641822b and full.py, 2023; litgpt/finetune/lora.py
@5895df1 and @00af8b0, 2024) runs, per micro-batch::

    logits = model(input_ids, lm_head_chunk_size=128)
    logits[-1] = logits[-1][..., :-1, :]
    loss = chunked_cross_entropy(logits, targets[..., 1:])
    fabric.backward(loss / gradient_accumulation_iters)

and never deletes ``logits`` or ``loss``. Both names outlive the backward: through ``optimizer.step()``
(when the micro-batch ends an accumulation window) and into the next micro-batch, until they are
rebound. ``logits = model(...)`` rebinds the list only once the next forward has returned, so the
previous micro-batch's 16-bit logits (the chunk list, :attr:`Profile.lm_head_chunk`) coexist with the
whole next forward, the new logits included; ``loss = ...`` rebinds after the next loss is computed.
After backward autograd has freed every saved variable, so all that stays of the graph is its nodes
(held through ``loss`` and the logits' ``grad_fn``) and what they hold outside ``save_for_backward``:
bitsandbytes 0.39-0.43.1's ``MatMul4Bit.forward`` stores its input as ``ctx.tensors = (A, B)``
(:mod:`peakmem.bnb_versions`), a plain attribute that lives as long as the node; so does LLM.int8's
``MatMul8bitLt`` (``ctx.tensors = (CAt, subA, A)``). So the previous micro-batch's quantized-Linear
inputs stay allocated until the next ``loss`` is assigned (benchmarks/bnb_ctx_lifetime.py).

Measured on CPU (tests/test_loop_held_torch.py: a tiny Llama, bitsandbytes 0.50.2's Linear4bit with
MatMul4Bit patched to keep A as 0.42.0 does, peft LoRA on q and v, the loop above against one that
deletes ``logits`` and ``loss``): the optimizer step holds exactly the logits + those inputs (+ the 2-byte
loss), the next forward's peak, at its loss, the inputs only (the old logits were dropped by then).

HF Trainer's ``training_step`` (transformers 5.23 trainer.py) returns ``loss.detach()`` and its outputs
are locals of ``compute_loss``; torchtune's recipes ``del logits`` before backward (8a98fbaa3) and keep
only the loss nodes; unsloth runs HF's Trainer: none of them keeps a micro-batch into the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.adapters import quant_of
from peakmem.breakdown import Category, MemoryItem, PhasePeak
from peakmem.model import ModelSpec
from peakmem.training import Checkpointing, TrainingSetup

from .activations import Shapes
from .activations.structure import layer_structure
from .lora.deltas import base_keeps_input, first_layer_input_frozen
from .profiles import PROFILES

SRC_LOOP = (
    "Lit-GPT finetune/lora.py@8641822b, litgpt/finetune/lora.py@5895df1: ``logits = model(...)``, "
    "``loss = chunked_cross_entropy(...)``, ``fabric.backward(...)``; neither name is deleted, both are "
    "rebound by the next micro-batch (logits once its forward returns, loss once its loss is computed)"
)
SRC_CTX = (
    "bitsandbytes 0.39-0.43.1 autograd/_functions.py MatMul4Bit.forward ``ctx.tensors = (A, B)`` "
    "(MatMul8bitLt: ``(CAt, subA, A)``): a ctx attribute, alive while the graph node is (bnb_versions.py)"
)

DROPS_NOTE = "the loop drops the model output (logits) before loss.backward(), as HF Trainer and torchtune do"
LOOP_NOTE = (
    "the loop keeps each micro-batch's logits and loss until the next micro-batch rebinds them (Lit-GPT): "
    "its logits through the optimizer step and the next forward, and its graph's nodes (bitsandbytes "
    "< 0.43.2: the 4-bit Linear inputs in ctx.tensors) until the next loss"
)


@dataclass(frozen=True, kw_only=True)
class LoopHeld:
    """What one micro-batch leaves alive after its backward, held by the loop's names."""

    logits: int = 0  # its logits (``logits``; freed when the next forward returns)
    inputs: int = 0  # its quantized Linears' inputs held by their ctx (freed when the next loss is bound)


NOTHING = LoopHeld()


def layer_linear_inputs(spec: ModelSpec, group: int, sh: Shapes, setup: TrainingSetup) -> int:
    """Bytes of one layer's quantized-Linear inputs that require grad, each tensor once: the attention's
    input (the first norm's output; none in a first layer nothing before requires grad:
    :func:`first_layer_input_frozen`), o_proj's input (the attention output), the MLP's input (the second
    norm's output; the same tensor as the attention's when one norm feeds both, Falcon-7B / phi-2) and
    the down projection's input (the product before it). The bytes :func:`..lora.deltas.adapt_layer`
    keeps for them. MoE experts are not counted (no Lit-GPT measurement to check them against)."""
    layer = spec.groups[group].layer
    t, h, c = sh.tokens, spec.hidden_size, sh.c
    att = layer.attention
    n_norms = layer_structure(layer, sh.memo)[0]
    # a derived spec does not record parallel_residual (simulate/derive/from_model.py): its one norm reads the
    # block input for both halves (transformers' PhiDecoderLayer: ``input_layernorm`` only)
    shared = (layer.parallel_residual or layer.derived is not None) and n_norms == 1
    att_in = 0 if first_layer_input_frozen(spec, group, setup, sh.memo) else t * h * c
    mlp_in = 0 if shared else t * h * c
    down_in = 0 if layer.mlp.is_moe else t * layer.mlp.intermediate_size * c
    return att_in + t * att.num_heads * att.v_head_dim * c + mlp_in + down_in


def loop_held(spec: ModelSpec, setup: TrainingSetup, sh: Shapes) -> LoopHeld:
    """What a micro-batch of ``setup`` leaves alive into the next (:data:`NOTHING` unless the framework's
    loop keeps its output, :attr:`Profile.loop_keeps_output`): its 16-bit logits, all positions, and, where
    the quantized base keeps its Linears' inputs (:func:`base_keeps_input`), those of every layer.
    Without checkpointing only: a checkpointed layer's quantized Linears run under no_grad in forward."""
    if not PROFILES[setup.framework].loop_keeps_output:
        return NOTHING
    logits = sh.tokens * spec.vocab_size * sh.c
    inputs = 0
    if base_keeps_input(setup) and setup.checkpointing is Checkpointing.NONE:
        inputs = sum(g.count * layer_linear_inputs(spec, i, sh, setup) for i, g in enumerate(spec.groups))
        quant = quant_of(setup)
        if quant is not None and quant.quantize_head:  # a quantized lm_head keeps the final norm's output
            inputs += sh.tokens * spec.head_in_features * sh.c
    return LoopHeld(logits=logits, inputs=inputs)


def _item(whose: str, what: str, nbytes: int, source: str, key: str) -> MemoryItem:
    return MemoryItem(path=f"{whose} micro-batch kept by the loop: {what}", category=Category.ACTIVATIONS,
                      bytes=nbytes, source=source, key=key)  # fmt: skip


def _items(held: LoopHeld, whose: str, logits: bool) -> tuple[MemoryItem, ...]:
    out = []
    if held.inputs:
        out.append(_item(whose, "its quantized Linears' inputs (ctx.tensors)", held.inputs, SRC_CTX,
                         "loop.kept_inputs"))  # fmt: skip
    if logits and held.logits:
        out.append(_item(whose, "its 16-bit logits", held.logits, SRC_LOOP, "loop.kept_logits"))
    return tuple(out)


def forward_peak(held: LoopHeld, *, at_loss: int, in_model: int) -> tuple[int, tuple[MemoryItem, ...]]:
    """(the forward temporaries at the peak, the previous micro-batch's items alive then). ``at_loss``:
    beyond the saved tensors, the most alive while the loss runs (the previous logits are gone, its
    Linear inputs not); ``in_model``: the most alive while the model runs, up to its return (both kept).
    Without anything held: ``max(at_loss, in_model)`` and no item, as before."""
    in_model = max(0, in_model)
    if held.logits and in_model + held.logits > at_loss:
        return in_model, _items(held, "previous", logits=True)
    return max(at_loss, in_model), _items(held, "previous", logits=False)


def optimizer_items(held: LoopHeld) -> tuple[MemoryItem, ...]:
    """At ``optimizer.step()``: the micro-batch just back-propagated, logits and Linear inputs."""
    return _items(held, "this", logits=True)


def at_step(step: PhasePeak, held: LoopHeld) -> PhasePeak:
    """The optimizer phase with :func:`optimizer_items` alive next to it."""
    kept = optimizer_items(held)
    if not kept:
        return step
    return PhasePeak(
        phase=step.phase, bytes=step.bytes + sum(i.bytes for i in kept), items=(*step.items, *kept)
    )


__all__ = [
    "DROPS_NOTE",
    "LOOP_NOTE",
    "NOTHING",
    "LoopHeld",
    "at_step",
    "forward_peak",
    "layer_linear_inputs",
    "loop_held",
    "optimizer_items",
]
