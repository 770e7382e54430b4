"""Autocast's weight cache under checkpointing: the 16-bit casts held until the autocast context exits.

torch ``aten/src/ATen/autocast_mode.cpp`` ``cached_cast``: a cast is cached only when the argument is an
fp32 leaf that requires grad (``arg.requires_grad() && arg.is_leaf() && !arg.is_view()``), and the cache is
cleared when the outermost autocast context exits (after the loss). Without checkpointing each cast is
also saved by its Linear (counted per layer: formulas/activations/layer.py); under full checkpointing
nothing saves them, but the cache still holds all of them at the loss. A frozen base (LoRA / QLoRA) is
never cached: its casts are made per call and freed (a bitsandbytes base is not cast at all: its
``MatMul4Bit`` dequantizes); only the trainable adapters' fp32 weights are.
"""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem
from peakmem.training import Checkpointing, TrainingSetup

from . import model_parallel as mp
from .memo import Memo
from .model_states import precision_plan, spec_facts
from .technique import Technique

SRC_WEIGHT_CACHE = (
    "torch autocast cached_cast: fp32 leaf weights that require grad, cached per autocast region"
)


def weight_cache(
    tech: Technique, setup: TrainingSetup, groups: tuple[tuple[int, int], ...], tp: int, memo: Memo
) -> list[MemoryItem]:
    """The cache over ``groups`` ((group index, layers) of the checkpointed runs) on one of ``tp`` ranks."""
    plan = precision_plan(setup.precision)
    if not plan.autocast or setup.checkpointing not in (Checkpointing.FULL, Checkpointing.OP):
        return []
    if tech.adapter:  # only the trainable fp32 adapters (their gradients' bytes per layer / grad size)
        if tech.weight.bits < 32:
            return []
        per_layer = tuple(b // (tech.grad.bits // 8) for b in tech.layer_grads)
    else:
        per_layer = spec_facts(tech.spec, memo).linear_params
    numel = mp.cdiv(sum(count * per_layer[i] for i, count in groups), tp)
    if numel == 0:
        return []
    return [MemoryItem(path="autocast weight cache (16-bit casts, until autocast exits)",
                       category=Category.TEMPORARIES, bytes=numel * (plan.compute.bits // 8),
                       source=SRC_WEIGHT_CACHE, key="autocast.weight_cache")]  # fmt: skip


__all__ = ["SRC_WEIGHT_CACHE", "weight_cache"]
