"""The backward walk: closed form per group equals the layer-by-layer walk; phase peaks of a step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peakmem.breakdown import Category, Phase
from peakmem.estimate import estimate_training
from peakmem.formulas.timeline import GroupCost, backward_peak
from peakmem.hf import spec_from_config
from peakmem.training import Checkpointing, KernelPolicy, Precision, TrainingSetup
from tiny_models import LLAMA


def brute_force(groups: tuple[GroupCost, ...], base: int, head: int, start: int, start_grads: int,
                tail: int, tail_grads: int) -> int:  # fmt: skip
    """Walk every layer: its activations and the grads so far, plus its transient."""
    layers = [g for g in groups for _ in range(g.count)]
    act = sum(g.saved for g in layers) + base
    best = act + head + start
    grads = start_grads
    for g in layers:
        best = max(best, act + grads + g.backward_transient + g.recompute)
        act -= g.saved
        grads += g.grads
    return max(best, act + grads + tail + tail_grads)


group = st.builds(
    GroupCost, count=st.integers(1, 40), saved=st.integers(0, 10**6), grads=st.integers(0, 10**6),
    backward_transient=st.integers(0, 10**6), recompute=st.integers(0, 10**5),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(group, min_size=1, max_size=4),
    nums=st.lists(st.integers(0, 10**6), min_size=6, max_size=6),
)
def test_closed_form_equals_layer_walk(groups: list[GroupCost], nums: list[int]) -> None:
    base, head, start, start_grads, tail, tail_grads = nums
    got = backward_peak(
        tuple(groups), base_saved=base, head_saved=head, start_extra=start, start_grads=start_grads,
        tail_extra=tail, tail_grads=tail_grads, grads_resident=False,
    )  # fmt: skip
    assert got.bytes == brute_force(tuple(groups), base, head, start, start_grads, tail, tail_grads)


def test_hand_example() -> None:
    """3 layers, 100 B saved and 10 B of grads each, 5 B transient: the start (CE) is the peak.

    start: 300 + 7 (ids) + 50 (head) + 60 (CE grads) = 417; first layer: 307 + 4 (head grads) + 5 = 316.
    """
    g = GroupCost(count=3, saved=100, grads=10, backward_transient=5)
    bp = backward_peak((g,), base_saved=7, head_saved=50, start_extra=60, start_grads=4, tail_extra=0,
                       tail_grads=0, grads_resident=False)  # fmt: skip
    assert (bp.bytes, bp.layers_done) == (417, 0)
    # when gradients outgrow activations the peak moves to the last layer: 10 + 3 x 200 + 4 - 200 ... walk:
    g = GroupCost(count=3, saved=10, grads=200, backward_transient=5)
    bp = backward_peak((g,), base_saved=0, head_saved=0, start_extra=0, start_grads=4, tail_extra=0,
                       tail_grads=0, grads_resident=False)  # fmt: skip
    # after 2 layers: activations 10 left, grads 4 + 400, transient 5 -> 419; the end: 604
    assert (bp.bytes, bp.layers_done) == (604, 3)


def test_phases_and_steady_state() -> None:
    """Measured by peakmem.measure (tracker, CPU, helper note 18:10): llama fp32 sdpa b2 s64 AdamW
    foreach: forward 5,096,876 / backward 5,606,812 / optimizer 4,409,748 bytes (step 2)."""
    spec = spec_from_config(dict(LLAMA))
    setup = TrainingSetup(precision=Precision.FP32, micro_batch=2, seq_len=64, kernel_policy=KernelPolicy.CPU)
    est = estimate_training(spec, setup)
    phases = {p.phase: p.bytes for p in est.phases}
    assert est.peak_phase is Phase.BACKWARD
    # optimizer: w + g + m + v + foreach sqrt = 5 x 4 B x 220,480 params + 64 B buffers (+84 B step in the
    # measurement, a CPU scalar per tensor that the CUDA policy does not keep on the device)
    assert phases[Phase.OPTIMIZER] == 5 * 4 * 220_480 + 64
    assert abs(phases[Phase.BACKWARD] / 5_606_812 - 1) < 0.01
    assert abs(phases[Phase.FORWARD] / 5_096_876 - 1) < 0.01
    assert est.extra["step1_peak_allocated_bytes"] < est.peak_allocated_bytes


def test_grad_accumulation_keeps_grads_in_forward() -> None:
    spec = spec_from_config(dict(LLAMA))
    one = estimate_training(spec, TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=64))
    acc = estimate_training(
        spec, TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=64, grad_accum=4)
    )
    fwd_one, fwd_acc = ({p.phase: p.bytes for p in e.phases}[Phase.FORWARD] for e in (one, acc))
    assert fwd_acc - fwd_one == 2 * spec.params  # bf16 gradients alive during later micro-batches


def test_phase_bytes_equal_their_items() -> None:
    """Each phase's bytes are the sum of its items, wherever in backward the peak falls."""
    for cfg in (LLAMA, {**LLAMA, "vocab_size": 64}):
        spec = spec_from_config(dict(cfg))
        for seq in (64, 512):
            est = estimate_training(spec, TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=seq))
            for p in est.phases:
                assert p.bytes == sum(i.bytes for i in p.items)
            assert est.peak_allocated_bytes == sum(i.bytes for i in est.items)


def test_held_temporary_counts_at_every_layer_and_the_tail_not_the_start() -> None:
    """``held`` (a tied embedding's LM-head gradient) is alive from the head's backward to the end."""
    g = GroupCost(count=3, saved=100, grads=10, backward_transient=5)
    kw = dict(base_saved=7, head_saved=50, start_extra=60, start_grads=4, tail_extra=0, tail_grads=0,
              grads_resident=False)  # fmt: skip
    assert backward_peak((g,), **kw, held=0).bytes == 417  # the start (see test_hand_example)
    bp = backward_peak((g,), **kw, held=200)
    # first layer: 307 + 4 + 5 + 200 = 516 > 417
    assert (bp.bytes, bp.layers_done, bp.held) == (516, 0, 200)
    tail = backward_peak((GroupCost(count=1, saved=0, grads=0, backward_transient=0),),
                         base_saved=0, head_saved=0, start_extra=0, start_grads=0, tail_extra=30,
                         tail_grads=20, grads_resident=False, held=200)  # fmt: skip
    assert (tail.bytes, tail.grads_in_flight) == (250, 20)


def test_tied_embedding_gradient_is_a_temporary_until_the_embedding_backward() -> None:
    """Tied head (measured, torch 2.13 CPU, fp32 and bf16): the head's gradient of the shared weight
    waits in the autograd input buffer (a temporary) and becomes ``.grad`` only summed with the
    embedding's, at the end of backward; mid-backward the gradients exclude it.

    Llama-like, vocab 256, bf16, full checkpointing, b1 s64: the peak is in the first layer's MLP
    backward after the top layer: gradients = top layer 46,208 x 2 + final norm 64 x 2 + the running
    layer's down projection 64 x 176 x 2; the tied 256 x 64 x 2 B is a temporary."""
    spec = spec_from_config({**LLAMA, "tie_word_embeddings": True, "vocab_size": 256})
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=1, seq_len=64,
                          checkpointing=Checkpointing.FULL, kernel_policy=KernelPolicy.CPU)  # fmt: skip
    est = estimate_training(spec, setup)
    assert est.extra["backward_peak_layers_done"] == 1
    bwd = next(p for p in est.phases if p.phase is Phase.BACKWARD)
    by_cat = {c: sum(i.bytes for i in bwd.items if i.category is c) for c in Category}
    assert by_cat[Category.GRADIENTS] == 46_208 * 2 + 64 * 2 + 64 * 176 * 2
    held = [i for i in bwd.items if i.key == "backward.tied_hold"]
    assert [(i.category, i.bytes) for i in held] == [(Category.TEMPORARIES, 256 * 64 * 2)]
