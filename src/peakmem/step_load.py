"""The load phase of a torchtune QLoRA job: its base weights quantized by torchao's ``to_nf4`` on the GPU.

torchtune's QLoRA (``--framework torchtune --method qlora``) keeps the base as torchao ``NF4Tensor`` and runs
``to_nf4`` at the model's build and again in ``load_state_dict`` (:mod:`peakmem.formulas.nf4_load`). Before
torchao 0.2.0 one ``to_nf4`` holds 68 B per element of the weight (a (numel, 16) difference and its abs):
Llama-2-7B's 4096 x 11008 MLP weights, 3.07 GB, above a step of batch 2 x 512. The recipe never calls
``empty_cache``, so the segments the load cut stay reserved through training (torchtune@0914d5cfb
docs/source/tutorials/qlora_finetune.rst: 9.13 GB reserved after model init, 9.29 GB in training).

The phase: every parameter and buffer as stored (the optimizer, its states and the gradients come after
``_setup_model``) plus the largest quantized weight's 16-bit copy and ``to_nf4`` tensors; its reserved bytes
from the build and load replayed through the caching-allocator model, which the step's own requests then
reuse (the estimate's reserved is the larger of the two). One GPU only: torchtune's distributed QLoRA loads
sharded NF4 weights through FSDP (not modelled).
"""

from __future__ import annotations

import math

from peakmem.adapters import lora_of
from peakmem.breakdown import Category, MemoryItem, Phase, PhasePeak
from peakmem.formulas import nf4_load
from peakmem.formulas.lora.params import adapter_tensors
from peakmem.formulas.qlora import is_quantized
from peakmem.model import ModelSpec, Tensor
from peakmem.parallel import Parallelism
from peakmem.step_parts import Static
from peakmem.torchao_versions import release_facts
from peakmem.training import Framework, Method, TrainingSetup

LOADED = (Category.PARAMETERS, Category.BUFFERS)  # what exists when the model is loaded


def applies(setup: TrainingSetup, par: Parallelism, single: bool) -> bool:
    """torchtune's single-device QLoRA (its quantized base is torchao NF4)."""
    return (
        setup.method is Method.QLORA and setup.framework is Framework.TORCHTUNE
        and single and par.is_single_gpu and (setup.quant is None or setup.quant.is_4bit)
    )  # fmt: skip


def _module_order(spec: ModelSpec) -> list[Tensor]:
    first = [t for t in spec.outer if t.component in ("embeddings", "positions")]
    last = [t for t in spec.outer if t.component not in ("embeddings", "positions")]
    return first + [t for layer in spec.layers() for t in layer.tensors] + last


def load_tensors(spec: ModelSpec, elem_bytes: int) -> tuple[nf4_load.LoadTensor, ...]:
    """The base tensors in module order, each copy on its own: quantized Linear weights by elements."""
    out = []
    for t in _module_order(spec):
        numel = math.prod(t.shape)
        if is_quantized(spec, t):
            out += [nf4_load.LoadTensor(quantized=numel)] * t.copies
        else:
            out += [nf4_load.LoadTensor(nbytes=numel * elem_bytes)] * t.copies
    return tuple(out)


def load_phase(st: Static, setup: TrainingSetup, par: Parallelism) -> tuple[PhasePeak, int] | None:
    """The load phase and its reserved bytes, or None where :func:`applies` says no."""
    if not applies(setup, par, st.single):
        return None
    spec = st.tech.spec
    elem = st.tech.weight.nbytes(1)  # torchtune builds its base and adapters in the run's dtype (bf16)
    release = release_facts(setup.torchao)
    tensors = load_tensors(spec, elem)
    largest = max((t.quantized for t in tensors), default=0)
    if not largest:
        return None
    adapters = tuple(
        math.prod(t.shape) * elem
        for t, n in adapter_tensors(spec, lora_of(setup))
        for _ in range(n * t.copies)
    )
    reserved, _ = nf4_load.replay_load(tensors, adapters, elem, release.nf4_chunk)
    items = [i for i in st.resident_items if i.category in LOADED]
    items.append(MemoryItem(
        path=f"to_nf4 of the largest base weight at load ({largest:,} elements, torchao {setup.torchao})",
        category=Category.TEMPORARIES, bytes=nf4_load.quantize_peak(largest, elem, release.nf4_chunk),
        source=f"{nf4_load.SRC_TORCHTUNE_LOAD}; {release.source}", key="load.to_nf4",
    ))  # fmt: skip
    return PhasePeak(phase=Phase.LOAD, bytes=sum(i.bytes for i in items), items=tuple(items)), reserved


__all__ = ["applies", "load_phase", "load_tensors"]
