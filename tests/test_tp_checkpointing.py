"""PyTorch tensor parallelism under full activation checkpointing (torchtitan ``apply_tp`` + ``FullAC``):
the formula terms of :mod:`peakmem.formulas.model_parallel` derived by hand on a tiny layer.

The parity with real execution is tests/test_parallel_oracle_torch.py (``test_full_ac_*``); these pin
each term's arithmetic."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from peakmem.formulas.activations import LayerActivations, checkpointed
from peakmem.formulas.model_parallel import dtensor_recompute_tail, dtensor_rowwise_copy, tp_layer_activations
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import Checkpointing

TP4 = Parallelism(gpus=4, tp=4)
TP4_SP = Parallelism(gpus=4, tp=4, sequence_parallel=True)
# T = 64 tokens, h = 32, fp32 (c = r = 4): a T x h tensor is 8192 bytes, its sequence shard 2048
WHOLE, SHARD = 64 * 32 * 4, 64 * 32 * 4 // 4


def _layer() -> LayerActivations:
    """A layer (before the TP split) with round numbers: 40,000 bytes saved, of which the layer input
    (8192) and the two Linears' inputs; interior = MLP interior 24,576 + the Linears' input 8192."""
    from peakmem.breakdown import Category, MemoryItem

    def saved(key: str, nbytes: int) -> MemoryItem:
        return MemoryItem(path=key, category=Category.ACTIVATIONS, bytes=nbytes, source="hand", key=key)

    return LayerActivations(
        saved=(saved("norms", 2 * WHOLE), saved("input.attn", WHOLE), saved("input.mlp", WHOLE),
               saved("mlp.interior", 15_808)),
        core=1024, layer_input=WHOLE, forward_transient=400, backward_transient=16_000,
        interior=24_576 + WHOLE, input_saved=WHOLE, mask_arg=0, backward_freed=4000, backward_grads=800,
        backward_stages=((16_000, 4000, 800), (-2000, 12_000, 400)),
    )  # fmt: skip


def test_tp_layer_keeps_what_full_checkpointing_reads() -> None:
    """Under SP the interior's MLP part splits by tp (24,576 / 4) and the Linears' whole input stays
    (8192); the layer input the first norm saves is the sequence shard (8192 / 4); the backward split
    divides by tp. Without SP the layer input is replicated (whole)."""
    la = tp_layer_activations(_layer(), TP4_SP, 0, linear_input=WHOLE)
    assert la.interior == 24_576 // 4 + WHOLE == 14_336
    assert la.input_saved == SHARD == 2048
    assert (la.backward_freed, la.backward_grads) == (1000, 200)
    assert la.backward_stages == ((4000, 1000, 200), (-500, 3000, 100))
    assert tp_layer_activations(_layer(), TP4, 0, linear_input=WHOLE).input_saved == WHOLE
    # full checkpointing then recomputes the layer's saved tensors less its kept input: the split norms
    # (16,384 / 4), the gathered Linears' inputs (2 x 8192 whole) and the MLP interior (15,808 / 4)
    full = checkpointed(la, Checkpointing.FULL)
    assert full.recompute == 4096 + 2 * WHOLE + 3952 - 2048 == 22_384
    assert full.forward_transient == 14_336


def test_sp_reduce_scatter_copies_the_whole_partial_sum() -> None:
    """RowwiseParallel's collective output (the shard under SP, whole without), and under SP the
    chunk-and-cat copy of the whole partial sum reduce_scatter_single makes for scatter dim 1."""
    assert dtensor_rowwise_copy(TP4_SP, SHARD, WHOLE) == 2048 + 8192
    assert dtensor_rowwise_copy(TP4, WHOLE, WHOLE) == WHOLE
    assert dtensor_rowwise_copy(Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD), WHOLE, WHOLE) == 0


def test_recompute_tail_under_sp() -> None:
    """At the end of the recomputation (SP): the incoming gradient shard (2048), its all-gathered copy
    (8192), the down projection's partial sum (8192), the reduce-scatter's copy (8192) and output (2048):
    28,672 above the recomputed tensors, nothing freed, no weight gradient yet. It replaces a smaller
    gradient stage (4000 net) and leaves a larger one alone."""
    la = checkpointed(tp_layer_activations(_layer(), TP4_SP, 0, linear_input=WHOLE), Checkpointing.FULL)
    tail = dtensor_recompute_tail(la, TP4_SP, SHARD, WHOLE, SHARD)
    assert (tail.backward_transient, tail.backward_freed, tail.backward_grads) == (28_672, 0, 0)
    # what the recomputed forward holds through its MLP (here SP's norm-output shard) comes on top
    assert dtensor_recompute_tail(la, TP4_SP, SHARD, WHOLE, SHARD, SHARD).backward_transient == 30_720
    bigger = replace(la, backward_transient=30_000)
    assert dtensor_recompute_tail(bigger, TP4_SP, SHARD, WHOLE, SHARD) is bigger
    # without SP: the replicated incoming gradient (8192), the partial sum and the all-reduce's output
    plain = checkpointed(tp_layer_activations(_layer(), TP4, 0, linear_input=WHOLE), Checkpointing.FULL)
    assert dtensor_recompute_tail(plain, TP4, WHOLE, WHOLE, WHOLE).backward_transient == 3 * WHOLE
    # nothing recomputed (no checkpointing) or no TP: unchanged
    none = tp_layer_activations(_layer(), TP4_SP, 0, linear_input=WHOLE)
    assert dtensor_recompute_tail(none, TP4_SP, SHARD, WHOLE, SHARD) is none


def test_fsdp2_layer_units_in_backward_by_position() -> None:
    """FSDP2 (peakmem.formulas.fsdp2.in_layer) with a unit of 100 bytes gathered and a reduce-scatter
    input of 150: a middle layer's backward holds its parameters, the next unit's prefetched all-gather
    and the previous unit's kept reduce-scatter input (350); the first layer backward reaches has no
    earlier input (200); the last one (the first layer) prefetches nothing (250); a single layer holds
    its parameters only (100). backward_groups splits the ends off a 4-layer group (forward order)."""
    from peakmem.formulas.fsdp2 import in_layer
    from peakmem.formulas.timeline import GroupCost
    from peakmem.step_fsdp import backward_groups, layer_extra

    par = Parallelism(gpus=4, fsdp=FsdpMode.FULL_SHARD)
    _, _, (_, _, mid, first, _, last) = in_layer(100, 400, 150, par)
    assert (mid, first, last) == (350, 200, 250)
    rs = SimpleNamespace(
        layer_backward_extra=mid, layer_backward_first_extra=first, layer_backward_last_extra=last
    )
    assert [layer_extra(rs, done, 4) for done in range(4)] == [200, 350, 350, 250]  # type: ignore[arg-type]
    assert layer_extra(rs, 0, 1) == 100  # type: ignore[arg-type]
    group = GroupCost(count=4, saved=10, grads=0, backward_transient=1000)
    split = backward_groups((group,), rs)  # type: ignore[arg-type]
    assert [(g.count, g.backward_transient) for g in split] == [(1, 1250), (2, 1350), (1, 1200)]


def test_full_ac_forward_of_an_eager_gated_mlp() -> None:
    """A fully checkpointed layer's forward with transformers' eager gated MLP: the attention core 1000,
    the MLP's 4 tensors 3000 each, its input x 8192 (interior 20,192). Under SP (a row-parallel copy of
    2048 + 8192, the residual shard and the norm output's shard 2 x 2048 held): at the product x, act,
    up and the product (gate freed) = 4096 + 8192 + 9000 = 21,288; at the down projection's output x, the
    product, the whole partial sum 8192 and the copy = 33,720, of which the estimator adds the copy
    itself: 23,480. On one GPU (no copy, the residual 8192 held): max(25,384, 27,576)."""
    from peakmem.breakdown import Category, MemoryItem
    from peakmem.formulas.activations.layer import full_ac_forward

    gated = MemoryItem(path="mlp", category=Category.ACTIVATIONS, bytes=12_000, key="mlp.interior", tensors=4)
    la = LayerActivations(
        saved=(gated,),
        core=1000,
        layer_input=WHOLE,
        forward_transient=0,
        backward_transient=0,
        interior=20_192,
    )
    assert full_ac_forward(la, WHOLE, SHARD + WHOLE, 2 * SHARD) == 33_720 - 10_240 == 23_480
    assert full_ac_forward(la, WHOLE, 0, WHOLE) == 27_576
    full = checkpointed(la, Checkpointing.FULL, eager_mlp=True, out=WHOLE, copy=0, held=WHOLE)
    assert full.forward_transient == 27_576
    plain = replace(la, saved=(replace(gated, tensors=2),))  # not the unfused gated item: the interior
    assert full_ac_forward(plain, WHOLE, 0, WHOLE) == 20_192
