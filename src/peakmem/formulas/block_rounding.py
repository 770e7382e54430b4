"""The caching allocator's block rounding of a training step (formulas/allocator.py ``round_request``):
the 512 B rounding of the long-lived tensors (reserved), and what
``PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:N`` adds to every block at each phase's peak (counted by
``torch.cuda.max_memory_allocated()`` as well as reserved: c10/cuda/CUDACachingAllocator.cpp ``round_size``
sizes the block, and ``allocated_bytes`` counts blocks).

What ``roundup_power2_divisions`` adds at a phase, as one item of the phase:

* items shaped like the parameters (weights, gradients, master weights, optimizer states: a tensor per
  parameter): the item's bytes spread over the spec's tensors in proportion to their elements, each
  rounded (exact for a whole, one-dtype copy of the parameters; FSDP2's per-parameter dim-0 shards are
  such a copy scaled by 1/N; a flat buffer (FSDP1, ZeRO) is one tensor, and a gradient set half written
  in backward is whole tensors, not scaled ones: there the rule is an approximation);
* every other item: its tensors (``MemoryItem.tensors`` / ``sizes``), each rounded.

The training estimate's replay (formulas/step_sequence.py) rounds every request with the same function.
Serving: engines that allocate through PyTorch's caching allocator with nothing sized to the free memory
(transformers generate, LitGPT) take the same item; vLLM and SGLang size their KV cache to what is left, and
llama.cpp does not use PyTorch's allocator: not applied there.
"""

from __future__ import annotations

from collections.abc import Iterable

from peakmem.breakdown import Category, MemoryItem, PhasePeak
from peakmem.model import ModelSpec
from peakmem.training import TrainingSetup

from . import allocator
from .activations import tensor_sizes
from .memo import Memo
from .model_states import precision_plan, spec_facts
from .optimizer import state_dtype

PARAMETER_SHAPED = frozenset(
    {Category.PARAMETERS, Category.GRADIENTS, Category.MASTER_WEIGHTS, Category.OPTIMIZER_STATES}
)
ROUNDUP_NOTE = (
    "PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:{n}: every block above 512 B x {n} rounded up to the "
    "next 1/{n} of its power of two, in allocated and reserved (formulas/block_rounding.py: parameter-shaped "
    "items spread over the model's tensors; flat buffers and sharded engines approximate)"
)
SRC_ROUNDUP = (
    "PYTORCH_CUDA_ALLOC_CONF roundup_power2_divisions: c10/cuda/CUDACachingAllocator.cpp round_size / "
    "roundup_power2_next_division (formulas/allocator.py round_request)"
)


def resident_rounding(spec: ModelSpec, setup: TrainingSetup, n_states: int, memo: Memo) -> int:
    """kMinBlockSize (512 B) rounding of every weight, master copy and state tensor."""
    plan = precision_plan(setup.precision)
    per_elem = [plan.weight.bits // 8] + ([plan.master.bits // 8] if plan.master else [])
    per_elem += [state_dtype(setup).bits // 8] * n_states
    extra = 0
    for numel, n in spec_facts(spec, memo).sizes:
        for size in per_elem:
            b = numel * size
            extra += (allocator.round_request(b) - b) * n
    return extra


def parameter_shaped_extra(nbytes: int, sizes: tuple[tuple[int, int], ...], divisions: int) -> int:
    """What ``divisions`` adds to ``nbytes`` spread over tensors of ``sizes`` ((elements, count) pairs,
    ``SpecFacts.sizes``) in proportion to their elements."""
    params = sum(numel * n for numel, n in sizes)
    if nbytes <= 0 or params <= 0 or divisions <= 1:
        return 0
    extra = 0
    for numel, n in sizes:
        b = numel * nbytes // params
        extra += (allocator.round_request(b, divisions) - allocator.round_request(b)) * n
    return extra


def phase_extra(items: Iterable[MemoryItem], sizes: tuple[tuple[int, int], ...], divisions: int) -> int:
    """What ``divisions`` adds to the blocks of ``items`` (see the module doc)."""
    if divisions <= 1:
        return 0
    shaped, other = 0, []
    for i in items:
        if i.category in PARAMETER_SHAPED:
            shaped += parameter_shaped_extra(i.bytes, sizes, divisions)
        else:
            other.append(i)
    return shaped + allocator.roundup_extra(tensor_sizes(other), divisions)


def with_roundup(phase: PhasePeak, spec: ModelSpec, divisions: int, memo: Memo | None = None) -> PhasePeak:
    """``phase`` with the blocks ``roundup_power2_divisions`` adds as one item (``phase`` itself where it
    adds nothing)."""
    if divisions <= 1:
        return phase
    extra = phase_extra(phase.items, spec_facts(spec, memo).sizes, divisions)
    if extra <= 0:
        return phase
    item = MemoryItem(path=f"caching-allocator block rounding (roundup_power2_divisions:{divisions})",
                      category=Category.TEMPORARIES, bytes=extra, source=SRC_ROUNDUP,
                      key="allocator.roundup")  # fmt: skip
    return PhasePeak(phase=phase.phase, bytes=phase.bytes + extra, items=(*phase.items, item))
