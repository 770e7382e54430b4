"""Pipeline parallelism under full activation checkpointing, by hand: what torch's Schedule1F1B holds at
each instant (peakmem.step_pipeline), FSDP2's first-micro-batch unshards under PP
(peakmem.step_fsdp.pp_first_forward) and the in-place gradient accumulation at a layer's backward peak
(peakmem.formulas.timeline.in_place_credit). The oracle parity is tests/test_parallel_oracle_torch.py
``test_full_ac_on_the_tiny_grid``. Pure Python, well under a second."""

from __future__ import annotations

import pytest

from peakmem.formulas import model_parallel as mp
from peakmem.formulas import sharding
from peakmem.formulas.technique import technique
from peakmem.formulas.timeline import GroupCost, backward_peak, in_place_credit
from peakmem.hf import spec_from_config
from peakmem.parallel import FsdpMode, Parallelism, PipelineSchedule
from peakmem.ranks import estimate_ranks
from peakmem.step_fsdp import pp_first_forward
from peakmem.step_pipeline import SRC_P2P, SRC_TORCH_PP, stage_pipeline
from peakmem.training import Checkpointing, KernelPolicy, OptimizerImpl, Precision, TrainingSetup

# one micro-batch's boundary activation, the last stage's logits, the last output projection's output
H, L, P = 1_000, 7_000, 1_500

# The parallel oracle's tiny Llama (peakmem.measure.parallel.TINY_LLAMA), without importing torch.
TINY = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 128,
    "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
SETUP = TrainingSetup(
    precision=Precision.FP32, micro_batch=2, seq_len=64, grad_accum=2, kernel_policy=KernelPolicy.CPU,
    optimizer_impl=OptimizerImpl.FOREACH, checkpointing=Checkpointing.FULL,
)  # fmt: skip


def test_pp2_two_microbatches_by_hand() -> None:
    """pp2, 2 micro-batches. First stage: 2 warm-up forwards (F0 F1 B0 B1), one gradient receive buffer
    per micro-batch (2H); the second forward holds the first's output (H) and ends with its own (H) next
    to the last output projection's (P);
    its first backward both outputs, its second one; nothing sent back to it holds an input gradient.
    Last stage: F0 B0 F1 B1, one activation receive buffer per micro-batch (2H), the running one's the
    first layer's saved input; F1 runs after B0 sent its input gradient (H, held by the schedule's
    bwd_sends) and while B0's logits are still the schedule's ``output`` (L, in a layer's forward
    only); B1 holds its logits (L) and B0's input gradient (H)."""
    par = Parallelism(gpus=2, pp=2)
    first = stage_pipeline(par, 0, 2, H, L, mp.in_flight_microbatches(par, 0, 2), P)
    assert (first.recv, first.forward, first.forward_layer, first.stage_output) == (2 * H, 3 * H, 0, H + P)
    assert (first.backward, first.second_backward, first.first_forward) == (4 * H, 3 * H, 2 * H)
    last = stage_pipeline(par, 1, 2, H, L, mp.in_flight_microbatches(par, 1, 2), P)
    assert (last.recv, last.forward, last.forward_layer, last.stage_output) == (2 * H, 2 * H, L, 0)
    assert (last.backward, last.first_forward) == (2 * H + L, H)
    assert first.source == last.source == SRC_TORCH_PP


def test_pp4_middle_stage_in_the_steady_state_by_hand() -> None:
    """pp4, stage 1, 8 micro-batches: 3 in flight (pp - stage), 16 receive buffers (8 per direction);
    the 3 in-flight inputs are receive buffers (-3H); a steady-state forward holds the 2 earlier outputs
    and the previous input gradient, a backward the 3 outputs and that gradient."""
    par = Parallelism(gpus=4, pp=4)
    pipe = stage_pipeline(par, 1, 8, H, L, mp.in_flight_microbatches(par, 1, 8), P)
    assert (pipe.recv, pipe.forward, pipe.backward) == (16 * H, 16 * H - 3 * H + 2 * H + H, 16 * H + H)


def test_megatron_and_single_stage_by_hand() -> None:
    """Under DeepSpeed a middle stage allocates a tensor per receive (Megatron's p2p): the received
    activation and the sent output gradient in forward, nothing kept; one stage holds nothing."""
    deepspeed = stage_pipeline(Parallelism(gpus=3, pp=3, zero_stage=1), 1, 4, H, L, 3.0, P)
    assert (deepspeed.recv, deepspeed.forward, deepspeed.backward, deepspeed.source) == (0, 2 * H, 0, SRC_P2P)
    assert stage_pipeline(Parallelism(), 0, 4, H, L, 1.0, P).forward == 0


def test_interleaved_keeps_an_output_per_microbatch_in_flight() -> None:
    par = Parallelism(gpus=2, pp=2, pp_schedule=PipelineSchedule.INTERLEAVED, virtual_stages=2)
    pipe = stage_pipeline(par, 0, 4, H, L, 3.5, P)  # int(3.5) = 3 in flight
    assert (pipe.recv, pipe.forward, pipe.backward) == (4 * H, 4 * H + 3 * H, 4 * H + 3 * H)


@pytest.mark.parametrize(
    ("alive", "freed", "grads", "credit"),
    [
        (2, 100, 60, 60),  # gated MLP, its down projection's gradient no larger than its input: all of it
        (2, 100, 160, 100),  # larger: its own matmul's backward exceeds the product's by 60
        (1, 100, 60, 0),  # one intermediate gradient: the matmul's backward is the peak anyway
        (5, 100, 450, 400),  # bloom_gelu's custom backward holds 5
    ],
)
def test_in_place_credit_by_hand(alive: int, freed: int, grads: int, credit: int) -> None:
    """At the gated product's backward (``alive`` = 2 intermediate gradients, the down projection's input
    ``freed``) the resident peak is max(product instant, down projection's matmul instant): net - grads
    + max(0, grads - (alive - 1) x freed)."""
    assert in_place_credit(freed, grads, alive) == credit


def test_resident_credit_only_when_gradients_exist() -> None:
    """One layer (saved 10, transient 500 of which 100 weight gradients, credit 80): written fresh the
    gradients become .grad (kept, 100 after the layer); accumulated, the credit comes off the layer's
    instant (10 + 500 - 80) and nothing grows."""
    g = (GroupCost(count=1, saved=10, grads=100, backward_transient=500, resident_credit=80),)
    kw = {
        "base_saved": 0,
        "head_saved": 0,
        "start_extra": 0,
        "start_grads": 0,
        "tail_extra": 0,
        "tail_grads": 0,
    }
    assert backward_peak(g, grads_resident=False, **kw).bytes == 10 + 500  # type: ignore[arg-type]
    assert backward_peak(g, grads_resident=True, **kw).bytes == 10 + 500 - 80  # type: ignore[arg-type]


def test_fsdp2_first_forward_unit_by_hand() -> None:
    """pp2 x fsdp2 over the tiny Llama, first stage (one layer): the running unit is that layer's fp32
    parameters unsharded, q 128x128, k and v 64x128, o 128x128, gate and up 344x128, down 128x344, two
    norms of 128: 181,504 x 4 B = 726,016 B (the oracle's ``model.layers.*: empty``); its unshard holds
    two such outputs."""
    spec = spec_from_config(TINY, name="llama")
    par = Parallelism(gpus=4, pp=2, fsdp=FsdpMode.FULL_SHARD)
    sp = mp.stage_params(spec, par, 0)
    rs = sharding.rank_states(technique(spec, SETUP), SETUP, par, sp)
    numel = 2 * 128 * 128 + 2 * 64 * 128 + 3 * 344 * 128 + 2 * 128
    assert numel == 181_504
    assert pp_first_forward(rs, sp) == (4 * numel, 8 * numel)


def test_pp2_stage_p2p_items_in_the_estimate() -> None:
    """The estimate carries step_pipeline's bytes: on the tiny Llama (2 x 64 tokens, hidden 128, fp32:
    H = 65,536 B) the first stage's backward peak is its second backward (every gradient written), with
    2H of receive buffers and the second micro-batch's output (3H); the last stage's forward peak is its
    second forward, with 2H of buffers less its input and the first micro-batch's input gradient (2H)."""
    spec = spec_from_config(TINY, name="llama")
    ranks = estimate_ranks(spec, SETUP, Parallelism(gpus=2, pp=2))
    hidden = 2 * 64 * 128 * 4

    def p2p(role: str, phase: str) -> int:
        est = ranks.role(role).estimate
        peak = next(p for p in est.phases if p.phase.value == phase)
        return sum(i.bytes for i in peak.items if i.key == "pipeline.p2p")

    assert p2p("first stage", "backward") == 3 * hidden
    assert p2p("last stage", "forward") == 2 * hidden
