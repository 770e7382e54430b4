"""The training step as a timeline: forward, backward, optimizer; the peak of each phase.

Steady state (step >= 2) is reported, because it holds the optimizer states during forward and
backward; step 1 creates the states inside ``optimizer.step()`` (torch/optim/adam.py
``_init_group``) and so peaks no higher in the optimizer phase. ``zero_grad()`` sets gradients to
``None`` (torch >= 2.0 default ``set_to_none=True``), so the first micro-batch's forward runs
without gradients; with gradient accumulation the later micro-batches run with all gradients
alive, and their backward adds each new gradient into ``.grad`` (a temporary per parameter).

Backward walks the layers from the last to the first: each layer's saved activations are freed
when its backward finishes while its weight gradients appear. With a group of ``n`` identical
layers the memory after ``j`` of them is linear in ``j``, so the maximum over a group is at its
first or last layer: a closed form per group, no loop over layers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class GroupCost:
    """One group of identical layers as the timeline sees it (bytes are per layer). Built per
    estimate: slotted, not frozen, read-only by convention (see ``activations.Shapes``)."""

    count: int
    saved: int  # activations kept from forward until this layer's backward
    grads: int  # weight gradients this layer produces
    backward_transient: int  # gradient temporaries, its weight gradients included, in its backward
    recompute: int = 0  # activations rebuilt for its backward (checkpointing)
    forward_transient: int = 0  # beyond its saved tensors, the most alive at once in its forward
    freed: int = 0  # of backward_transient (net): its saved bytes already freed at that instant
    grads_in_flight: int = 0  # of backward_transient: its weight gradients already written
    # of backward_transient: weight-gradient bytes gone when gradients already exist (in_place_credit)
    resident_credit: int = 0
    # the transients' tensors at their sizes where known (LayerActivations.forward_sizes, recompute_sizes,
    # and the backward peak's temporaries followed by its weight gradients not in flight); used by the
    # allocator replay (step_parts.py) only where they add up to their sums
    forward_sizes: tuple[int, ...] = ()
    recompute_sizes: tuple[int, ...] = ()
    backward_sizes: tuple[int, ...] = ()
    # bytes each layer leaves alive from its backward to the end of backward, beyond its weight gradients
    # (FSDP1's frozen units under reentrant checkpointing: peakmem.formulas.fsdp1_frozen_inputs)
    kept: int = 0


def in_place_credit(freed: int, grads: int, alive: int) -> int:
    """What a layer's backward peak holds less once its parameters' ``.grad`` exist (gradient
    accumulation's later micro-batches, ``zero_grad(set_to_none=False)``): ``AccumulateGrad`` adds each
    new weight gradient into ``.grad`` in place and frees it (torch/csrc/autograd/functions/
    accumulate_grad.h ``accumulateGrad``: ``variable_grad += new_grad`` without grad mode), and the engine
    runs an ``AccumulateGrad`` as soon as it is ready (its sequence number is the largest, engine.cpp
    ``ReadyQueue``). So of the ``grads`` written by the instant of a backward peak (``freed`` of the
    layer's saved bytes already freed), only the last one is alive, and only at its
    own matmul's backward, where the output projection's input (``freed``) is not freed yet and one
    ``tokens x width`` gradient (its input's) is out instead of ``alive`` of them: that instant exceeds
    the peak net of the gradients by ``grads - (alive - 1) x freed`` when positive. Measured with the
    parallel oracle (the tiny Llama under full checkpointing, the second micro-batch's backward: the
    down projection's weight gradient, 176,128 B, counted at the SwiGLU product's backward read +3.0% on
    a one-layer pipeline stage)."""
    return min(grads, max(0, alive - 1) * freed)


@dataclass(kw_only=True, slots=True)  # per estimate: not frozen, read-only by convention
class BackwardPeak:
    bytes: int  # above the persistent states
    layers_done: int  # layers whose backward had finished at the peak (0: at the loss)
    activations_left: int
    grads_so_far: int
    transient: int
    recompute: int = 0
    at_start: bool = False  # at the loss/head backward, before any layer (head tensors still saved)
    freed: int = 0  # the current layer's saved bytes already freed (``transient`` is net of them)
    grads_in_flight: int = 0  # the current layer's weight gradients (inside ``transient``)
    held: int = 0  # a temporary held from the head's backward to the embedding's (not in ``transient``)
    kept: int = 0  # what the layers done left alive (GroupCost.kept), net of the running layer's transient


def backward_peak(
    groups_top_down: tuple[GroupCost, ...],
    *,
    base_saved: int,
    head_saved: int,
    start_extra: int,
    start_grads: int,
    tail_extra: int,
    tail_grads: int,
    grads_resident: bool,
    held: int = 0,
    kept_in_transient: int = 0,
) -> BackwardPeak:
    """The maximum memory during backward above weights/master/states (and resident grads).

    ``base_saved``: saved tensors freed only at the very end (token ids, embedding norm/dropout,
    rotary cos/sin); ``head_saved``: the head's saved tensors, freed once the head's backward ran;
    ``start_extra``: the loss/head backward temporaries; ``start_grads``: head and final-norm
    gradients; ``tail_*``: the embedding backward at the end. ``grads_resident``: gradients
    already exist (accumulation micro-batch >= 2), so each new gradient is a temporary of its
    layer and nothing grows. ``held``: a temporary alive from the head's backward to the end, at
    every layer and at the tail: a tied embedding's gradient from the LM head, which the autograd
    engine keeps in the embedding's ``InputBuffer`` until the embedding's own contribution arrives
    (torch/csrc/autograd/input_buffer.cpp ``accumulate``; measured: the sum is a new tensor).
    ``kept_in_transient``: of the bytes the layers done keep (``GroupCost.kept``), those a running layer's
    ``backward_transient`` already counts (its incoming gradient), once any layer is done.
    """
    act = sum(g.count * g.saved for g in groups_top_down) + base_saved
    best = BackwardPeak(
        bytes=act + head_saved + start_extra, layers_done=0, activations_left=act + head_saved,
        grads_so_far=0, transient=start_extra, at_start=True,
    )  # fmt: skip
    grads = 0 if grads_resident else start_grads
    done = kept = 0
    for g in groups_top_down:
        for j in (0, g.count - 1):
            left = act - j * g.saved
            so_far = grads + (0 if grads_resident else j * g.grads)
            transient = g.backward_transient - (g.resident_credit if grads_resident else 0)
            kept_now = kept + j * g.kept
            kept_now -= min(kept_now, kept_in_transient) if done + j else 0
            total = left + so_far + transient + g.recompute + held + kept_now
            if total > best.bytes:
                best = BackwardPeak(
                    bytes=total, layers_done=done + j, activations_left=left, grads_so_far=so_far,
                    transient=transient, recompute=g.recompute, freed=g.freed,
                    grads_in_flight=g.grads_in_flight, held=held, kept=kept_now,
                )  # fmt: skip
        act -= g.count * g.saved
        grads += 0 if grads_resident else g.count * g.grads
        kept += g.count * g.kept
        done += g.count
    total = act + grads + tail_extra + tail_grads + held + kept
    if total > best.bytes:
        best = BackwardPeak(
            bytes=total, layers_done=done, activations_left=act, grads_so_far=grads,
            transient=tail_extra + tail_grads, held=held, grads_in_flight=tail_grads, kept=kept,
        )  # fmt: skip
    return best
