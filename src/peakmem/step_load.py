"""The load phase of a job whose weights are converted on the GPU as they load, where that can be the peak:
a torchtune QLoRA base quantized by torchao's ``to_nf4``, an MXFP4 checkpoint (gpt-oss) dequantized to
bf16 by transformers for training (:mod:`peakmem.formulas.mxfp4_load`), a bitsandbytes base
(:mod:`peakmem.formulas.qlora_load`), and a ZeRO-3 model built outside ``zero.Init``, whole on each GPU
until DeepSpeed partitions it.

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

from peakmem.adapters import FLOAT_BYTES, LoraConfig, QuantConfig, lora_of, quant_of
from peakmem.breakdown import Category, MemoryItem, Phase, PhasePeak
from peakmem.formulas import hf_warmup, mxfp4_load, nf4_load, qlora_load
from peakmem.formulas.block_rounding import with_roundup
from peakmem.formulas.kbit_prep import prepared, unquantized_dtype
from peakmem.formulas.lora.params import adapter_tensors
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.qlora import expert_linears, is_quantized
from peakmem.formulas.weights import bnb_linear_storage
from peakmem.model import ModelSpec, Tensor
from peakmem.parallel import Parallelism
from peakmem.step_parts import Static
from peakmem.torchao_versions import release_facts
from peakmem.training import Framework, Method, TrainingSetup
from peakmem.transformers_versions import parse_transformers_version
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


def adapter_requests(spec: ModelSpec, lora: LoraConfig, elem: int) -> tuple[int, ...]:
    """Bytes of each adapter tensor ``get_peft_model`` allocates, one request per tensor (``elem`` bytes an
    element)."""
    pairs = adapter_tensors(spec, lora)
    return tuple(math.prod(t.shape) * elem for t, n in pairs for _ in range(n * t.copies))


# transformers' from_pretrained loads the bitsandbytes base for these front ends (unsloth wraps it)
FROM_PRETRAINED = (Framework.HF, Framework.UNSLOTH)


def bnb_applies(setup: TrainingSetup, par: Parallelism, single: bool) -> bool:
    """A bitsandbytes QLoRA base that ``from_pretrained`` loads whole on one GPU
    (:mod:`peakmem.formulas.qlora_load`). FSDP / ZeRO-3 load sharded: not modelled."""
    return (
        setup.method is Method.QLORA and setup.framework in FROM_PRETRAINED and single and par.is_single_gpu
    )


def bnb_base_tensors(spec: ModelSpec, quant: QuantConfig) -> tuple[qlora_load.BaseTensor, ...]:
    """The base's tensors in module order as the load allocates them (formulas/qlora_load.py): each
    bitsandbytes Linear (an MoE expert's one by one) with its 16-bit staging copy, the rest in the float
    dtype, upcast to fp32 and cast back as ``quant.kbit_prep`` says (formulas/kbit_prep.py)."""
    fmt, fb = quant.weight_format, FLOAT_BYTES[quant.float_dtype]
    out: list[qlora_load.BaseTensor] = []
    for t in _module_order(spec):
        numel = t.numel
        if t.component == "head" and spec.tie_word_embeddings:
            continue  # the embedding's own storage
        if t.component != "router" and is_quantized(spec, t, quant):
            w = expert_linears(t) if t.kind == "expert_weight" else t
            linears = math.prod(w.shape[:-2]) * w.copies  # one Params4bit / Int8Params each
            stored = bnb_linear_storage(w, fmt)[0]
            out += [qlora_load.BaseTensor(loaded=stored // linears, staging=numel * fb // linears)] * linears
            continue
        cast = prepared(quant) and fb < FLOAT_BYTES["fp32"]  # peft casts fp16 / bf16 parameters only
        final = unquantized_dtype(t, quant)
        out.append(qlora_load.BaseTensor(
            loaded=numel * fb, upcast=numel * FLOAT_BYTES["fp32"] if cast else 0,
            back=numel * FLOAT_BYTES[final] if cast and final != "fp32" else 0,
        ))  # fmt: skip
    return tuple(out)


def bnb_load_phase(st: Static, setup: TrainingSetup, ov: Overheads) -> tuple[PhasePeak, int]:
    """The load of a bitsandbytes base (formulas/qlora_load.py): the resident weights and what the load
    holds beyond them at its peak; its reserved bytes, the warm-up block's and the upcasts' segments,
    replayed under the GPU's capacity where one GPU size is named."""
    spec, quant, lora = st.tech.spec, quant_of(setup), lora_of(setup)
    assert quant is not None
    free = None if ov.device_bytes is None else max(0, ov.device_bytes - ov.context_bytes)
    # the block is sized by the GPU's free memory (capped at it less 1.2 GiB): modelled where one is named
    release = parse_transformers_version(setup.transformers)
    block = 0 if free is None else hf_warmup.block_bytes(spec, release, quant.weight_format, free)
    # "base" adapters: the float dtype
    adapter_elem = FLOAT_BYTES.get(lora.adapter_dtype, FLOAT_BYTES[quant.float_dtype])
    adapters = adapter_requests(spec, lora, adapter_elem)
    replayed = qlora_load.replay_load(bnb_base_tensors(spec, quant), adapters, block, capacity=free)
    items = [i for i in st.resident_items if i.category in LOADED]
    held = replayed.peak_live - replayed.end_live
    if held > 0:
        what = (
            "the caching_allocator_warmup block, allocated before the weights" if block >= replayed.peak_live
            else "the fp32 upcast beside a 16-bit weight" if prepared(quant) else "a 16-bit staging copy"
        )  # fmt: skip
        items.append(MemoryItem(
            path=f"bitsandbytes base load ({what}; transformers {setup.transformers})",
            category=Category.TEMPORARIES, bytes=held, source=f"formulas/qlora_load.py; {qlora_load.SRC}",
            key="load.bnb",
        ))  # fmt: skip
    if block:
        items.append(MemoryItem(
            path=f"caching_allocator_warmup block: {block:,} B, its rest cached from the load on (reserved)",
            category=Category.OVERHEAD, bytes=0, source=hf_warmup.SRC, key="load.warmup",
        ))  # fmt: skip
    reserved = replayed.peak_reserved
    if free is not None and replayed.peak_live <= free:
        # cudaMalloc cannot reserve beyond the device: where the replay's segments outgrow it (after freeing
        # the cache, as the allocator does) the real layout packs tighter, or the load raises OOM
        reserved = min(reserved, free)
    return PhasePeak(phase=Phase.LOAD, bytes=sum(i.bytes for i in items), items=tuple(items)), reserved


SRC_ZERO3_MODULE = (
    "deepspeed runtime/engine.py _configure_distributed_model: module.half() / .bfloat16(), then "
    "module.to(device) unless the parameters carry ds_id (built under zero.Init)"
)


def zero3_module_applies(setup: TrainingSetup, par: Parallelism) -> bool:
    """ZeRO-3 over a model built outside ``deepspeed.zero.Init``: ``deepspeed.initialize`` casts it to
    16-bit and moves the whole module to each GPU before the optimizer partitions it (a bitsandbytes
    base is not cast: not modelled)."""
    return par.zero_stage == 3 and not par.zero_init and setup.method is not Method.QLORA


def zero3_module_load_phase(st: Static) -> tuple[PhasePeak, int]:
    """The whole 16-bit module and its buffers on the GPU; partitioning then frees each parameter
    after copying its 1/N partition out, so this is the load's peak. Its segments stay cached."""
    tech = st.tech
    dtype = tech.base_dtype if tech.adapter else tech.weight
    items = [i for i in st.resident_items if i.category is Category.BUFFERS]
    items.append(MemoryItem(
        path="the whole 16-bit model on the GPU before ZeRO-3 partitions it (built outside zero.Init)",
        category=Category.PARAMETERS, bytes=dtype.nbytes(st.sp.numel),
        source=SRC_ZERO3_MODULE, key="load.zero3_module",
    ))  # fmt: skip
    loaded = sum(i.bytes for i in items)
    return PhasePeak(phase=Phase.LOAD, bytes=loaded, items=tuple(items)), loaded


def load_phase(
    st: Static, setup: TrainingSetup, par: Parallelism, ov: Overheads
) -> tuple[PhasePeak, int] | None:
    """The load phase and its reserved bytes, or None where none of :func:`applies`,
    :func:`mxfp4_applies` and :func:`bnb_applies` says so; ``ov.alloc_roundup_divisions``
    (roundup_power2_divisions) adds its blocks to both (formulas/block_rounding.py)."""
    got = _load_phase(st, setup, par, ov)
    divisions = ov.alloc_roundup_divisions
    if got is None or divisions <= 1:
        return got
    phase, reserved = got
    rounded = with_roundup(phase, st.tech.spec, divisions)
    return rounded, reserved + rounded.bytes - phase.bytes


def _load_phase(
    st: Static, setup: TrainingSetup, par: Parallelism, ov: Overheads
) -> tuple[PhasePeak, int] | None:
    if zero3_module_applies(setup, par):
        return zero3_module_load_phase(st)
    if mxfp4_applies(setup, par, st.single):
        return mxfp4_load_phase(st, setup)
    if bnb_applies(setup, par, st.single):
        return bnb_load_phase(st, setup, ov)
    if not applies(setup, par, st.single):
        return None
    spec = st.tech.spec
    elem = st.tech.weight.nbytes(1)  # torchtune builds its base and adapters in the run's dtype (bf16)
    release = release_facts(setup.torchao)
    tensors = load_tensors(spec, elem)
    largest = max((t.quantized for t in tensors), default=0)
    if not largest:
        return None
    adapters = adapter_requests(spec, lora_of(setup), elem)
    reserved, _ = nf4_load.replay_load(tensors, adapters, elem, release.nf4_chunk)
    items = [i for i in st.resident_items if i.category in LOADED]
    items.append(MemoryItem(
        path=f"to_nf4 of the largest base weight at load ({largest:,} elements, torchao {setup.torchao})",
        category=Category.TEMPORARIES, bytes=nf4_load.quantize_peak(largest, elem, release.nf4_chunk),
        source=f"{nf4_load.SRC_TORCHTUNE_LOAD}; {release.source}", key="load.to_nf4",
    ))  # fmt: skip
    return PhasePeak(phase=Phase.LOAD, bytes=sum(i.bytes for i in items), items=tuple(items)), reserved


__all__ = [
    "adapter_requests", "applies", "bnb_applies", "bnb_base_tensors", "bnb_load_phase", "load_phase",
    "load_tensors", "mxfp4_applies", "mxfp4_load_phase",
]  # fmt: skip
