"""torch.distributed.pipelining (torchtitan's pipeline) in a stage's step timeline
(:mod:`peakmem.estimate`): what the schedule and its ``PipelineStage`` hold beyond the stage's layers'
saved tensors, at each instant of ``Schedule1F1B``.

Read in torch 2.13 ``torch/distributed/pipelining/schedules.py`` ``Schedule1F1B._step_microbatches``
and ``stage.py`` (``forward_one_chunk``, ``backward_one_chunk``, ``get_bwd_send_ops``) and
``_backward.py`` ``stage_backward``. Stage ``s`` of ``pp`` runs ``w = min(pp - s, m)`` warm-up forwards
of its ``m`` micro-batches, then alternates one backward and one forward, then cools down:

* the receive buffers (:func:`peakmem.formulas.model_parallel.torch_pipeline_buffers`) live through the
  step; a received activation is the stage input its first layer saves, so the in-flight micro-batches'
  inputs are counted there, once;
* ``fwd_cache`` keeps each micro-batch's stage output from its forward until its backward pops it, and
  the popped output stays referenced (``stage_output``) while that backward runs: at a backward, ``k``
  outputs for ``k`` micro-batches in flight (the running one included); in a forward, the earlier
  ``k - 1`` and, at its end, the running one's;
* ``backward_one_chunk`` keeps the stage's input gradient in ``bwd_cache``; ``get_bwd_send_ops`` pops
  it into the send op the schedule's ``bwd_sends`` list holds until the next backward has run and its
  own send ops replace the list: from the second backward of a step on (and in every forward after
  a backward), a non-first stage holds the previous micro-batch's input gradient;
* the schedule's ``output`` (what ``forward_one_chunk`` returned) is reassigned only when the next
  forward returns: on the last stage, whose output is popped and detached at its backward, the
  previous micro-batch's logits stay alive through the next forward's layers (the loss runs after the
  reassignment, so not at the loss).

Found with the parallel oracle (peakmem.measure.parallel) under full activation checkpointing, where a
layer's interior, not the saved activations, makes the peaks (tests/test_pp_checkpointing.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.formulas import model_parallel as mp
from peakmem.parallel import Parallelism, PipelineSchedule

SRC_TORCH_PP = (
    "torch/distributed/pipelining stage.py: per-micro-batch receive buffers, fwd_cache outputs; schedules.py "
    "Schedule1F1B: the previous micro-batch's input gradient (bwd_sends) and last-stage logits (output)"
)
SRC_P2P = "Megatron p2p_communication: the received activation / sent output gradient of the stage"


@dataclass(frozen=True, kw_only=True)
class StagePipeline:
    """What a stage holds for its pipeline schedule beyond its layers' saved tensors, in bytes, at each
    instant the estimate walks (all 0 without pipeline parallelism)."""

    recv: int = 0  # torch's receive buffers, alive through the whole step (optimizer step included)
    forward: int = 0  # at the forward peak, ``in_flight`` micro-batches (the running one included)
    forward_layer: int = 0  # more while a layer's forward runs (last stage: the previous logits)
    stage_output: int = 0  # the running micro-batch's stage output at the end of its forward
    backward: int = 0  # at the backward peak, ``in_flight`` micro-batches
    second_backward: int = 0  # an all-warm-up stage's second backward (one micro-batch fewer)
    first_forward: int = 0  # the step's first forward: one micro-batch, nothing sent back yet
    path: str = "pipeline send/receive buffers"
    source: str = SRC_P2P


def stage_pipeline(
    par: Parallelism,
    stage: int,
    microbatches: int,
    hidden: int,
    logits: int,
    in_flight: float,
    projection: int,
) -> StagePipeline:
    """Stage ``stage``'s pipeline bytes: ``hidden`` one micro-batch's boundary activation (and its
    gradient), ``logits`` the last stage's output (the TP-local logits, compute dtype), ``in_flight``
    :func:`peakmem.formulas.model_parallel.in_flight_microbatches`, ``projection`` the last layer's
    output projection's output (``T x h``, a whole partial sum under TP), alive next to the residual sum
    that makes a non-last stage's output (transformers' ``hidden_states = residual + hidden_states``;
    without it the no-checkpointing pp2 first stage's forward read -1.1%, tp2 x pp2's -1.9%).

    torch.distributed.pipelining where no DeepSpeed engine runs (torchtitan); interleaved schedules keep
    the receive buffers and an output per micro-batch in flight. Under DeepSpeed, Megatron's per-receive
    tensors: the received activation and the sent output gradient in forward."""
    first, last = stage == 0, stage == par.pp - 1
    if par.pp == 1 or par.zero_stage:
        p2p = hidden * ((0 if first else 1) + (0 if last else 1))
        return StagePipeline(forward=p2p, first_forward=p2p)
    recv = mp.torch_pipeline_buffers(par, stage, microbatches, hidden)
    k = int(in_flight)

    def inputs(n: int) -> int:  # the in-flight micro-batches' inputs are receive buffers
        return 0 if first else n * hidden

    out = logits if last else hidden
    path = "pipeline receive buffers, held stage outputs and input gradients"
    if par.pp_schedule is not PipelineSchedule.ONE_F_ONE_B:
        held = recv - inputs(k) + k * out
        return StagePipeline(recv=recv, forward=held - (k * out if last else 0), backward=held,
                             first_forward=recv - inputs(1), path=path, source=SRC_TORCH_PP)  # fmt: skip
    steady = microbatches > k  # a forward after a backward: the 1F1B steady state exists
    prev_grad = hidden if not first and microbatches > 1 else 0
    return StagePipeline(
        recv=recv,
        forward=recv - inputs(k) + (0 if last else (k - 1) * hidden) + (prev_grad if steady else 0),
        forward_layer=logits if last and steady else 0,
        stage_output=0 if last else hidden + projection,
        backward=recv - inputs(k) + k * out + (prev_grad if steady else 0),
        second_backward=recv - inputs(k - 1) + (k - 1) * out + prev_grad,
        first_forward=recv - inputs(1),
        path=path,
        source=SRC_TORCH_PP,
    )


__all__ = ["SRC_P2P", "SRC_TORCH_PP", "StagePipeline", "stage_pipeline"]
