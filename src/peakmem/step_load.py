"""The load phase of a job whose weights are converted on the GPU as they load, where that can be the peak:
a torchtune QLoRA base quantized by torchao's ``to_nf4``, and an MXFP4 checkpoint (gpt-oss) dequantized to
bf16 by transformers for training (:mod:`peakmem.formulas.mxfp4_load`).

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
from peakmem.formulas import mxfp4_load, nf4_load
from peakmem.formulas.allocator import NO_ROUNDUP
from peakmem.formulas.block_rounding import with_roundup
from peakmem.formulas.lora.params import adapter_tensors
from peakmem.formulas.qlora import is_quantized
from peakmem.model import ModelSpec, Tensor
from peakmem.parallel import Parallelism
from peakmem.step_parts import Static
from peakmem.torchao_versions import release_facts
from peakmem.training import Framework, Method, TrainingSetup
from peakmem.transformers_versions import release_facts as transformers_facts

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


def mxfp4_applies(setup: TrainingSetup, par: Parallelism, single: bool) -> bool:
    """A model loaded from an MXFP4 checkpoint by transformers (``from_pretrained``: the HF Trainer and the
    trainers on it) whole on one GPU. Sharded loads (FSDP's cpu_ram_efficient_loading, ZeRO-3) convert on
    the GPU next to none of the other weights: not modelled."""
    return setup.mxfp4_checkpoint and setup.framework is Framework.HF and single and par.is_single_gpu


def _mxfp4_blocks(spec: ModelSpec) -> int:
    """Block bytes of the largest MXFP4 projection one conversion takes (all of a layer's experts)."""
    sizes = [
        t.copies * mxfp4_load.block_bytes(math.prod(t.shape[:-1]), t.shape[-1])
        for layer in spec.layers() for t in layer.tensors if t.kind == "expert_weight" and len(t.shape) >= 3
    ]  # fmt: skip
    return max(sizes, default=0)


def mxfp4_load_phase(st: Static, setup: TrainingSetup) -> tuple[PhasePeak, int] | None:
    """Every weight loaded (the experts in bf16) while the largest projection is converted (the bound:
    :mod:`peakmem.formulas.mxfp4_load`), and its reserved bytes: the loaded tensors' segments and the
    conversion's, which stay cached for the step."""
    blocks = _mxfp4_blocks(st.tech.spec)
    if not blocks:
        return None
    rel = transformers_facts(setup.transformers)
    peak = mxfp4_load.dequant_peak(
        blocks, index_bytes=rel.mxfp4_index_bytes, together=rel.mxfp4_indices_together
    )
    extra = peak - mxfp4_load.bf16_bytes(blocks)  # its bf16 result is among the loaded weights
    items = [i for i in st.resident_items if i.category in LOADED]
    items.append(MemoryItem(
        path=f"MXFP4 experts dequantized at load ({blocks:,} block bytes, transformers {setup.transformers})",
        category=Category.TEMPORARIES, bytes=extra, source=f"formulas/mxfp4_load.py; {rel.source}",
        key="load.mxfp4",
    ))  # fmt: skip
    loaded = sum(i.bytes for i in items)
    # each of these large requests takes its own segment, rounded to 2 MiB (formulas/allocator.py): within
    # the resident tensors' rounding and a few MiB of the conversion's
    return PhasePeak(phase=Phase.LOAD, bytes=loaded, items=tuple(items)), loaded + st.resident_rounding


def load_phase(
    st: Static, setup: TrainingSetup, par: Parallelism, divisions: int = NO_ROUNDUP
) -> tuple[PhasePeak, int] | None:
    """The load phase and its reserved bytes, or None where neither :func:`applies` nor
    :func:`mxfp4_applies` says so; ``divisions`` (roundup_power2_divisions) adds its blocks to both
    (formulas/block_rounding.py)."""
    got = _load_phase(st, setup, par)
    if got is None or divisions <= 1:
        return got
    phase, reserved = got
    rounded = with_roundup(phase, st.tech.spec, divisions)
    return rounded, reserved + rounded.bytes - phase.bytes


def _load_phase(st: Static, setup: TrainingSetup, par: Parallelism) -> tuple[PhasePeak, int] | None:
    if mxfp4_applies(setup, par, st.single):
        return mxfp4_load_phase(st, setup)
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


__all__ = ["applies", "load_phase", "load_tensors", "mxfp4_applies", "mxfp4_load_phase"]
