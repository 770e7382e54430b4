"""transformers' caching-allocator warm-up at ``from_pretrained(..., device_map=...)`` for engine ``hf``:
the load phase it makes (the block's size by release: :mod:`peakmem.formulas.hf_warmup`).

Where the block is larger than the weights that land in it, the rest stays reserved, and allocated while
the block exists: the load is the process's peak when nothing after it needs more. The free memory that
caps the block is the GPU's (``gpu_bytes``) less the CUDA context, where the GPU is known. Not modelled
here: tensor parallel and other parallel layouts (each GPU's share); a model loaded without
``device_map`` and moved with ``.to("cuda")`` has no warm-up. Training loads: peakmem.step_load.
"""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas import hf_warmup
from peakmem.formulas.serving.context import CUDA_CONTEXT_BYTES
from peakmem.inference import InferenceSetup
from peakmem.model import ModelSpec


def warmup_block_bytes(spec: ModelSpec, setup: InferenceSetup) -> int:
    """Bytes of the warm-up block on the one GPU, 0 where the release, the format or the layout makes
    none, or where it is the weights' own size (v5.0 on)."""
    if setup.tp > 1 or setup.layout.parallel:
        return 0
    free = None if setup.gpu_bytes is None else max(0, setup.gpu_bytes - CUDA_CONTEXT_BYTES)
    return hf_warmup.block_bytes(spec, setup.version, setup.weight_format, free)


def warmup(
    spec: ModelSpec, setup: InferenceSetup, weights: MemoryItem
) -> tuple[list[MemoryItem], tuple[str, ...]]:
    """The load phase's items and the assumption, where the warm-up block outgrows the weights: one
    allocation at that moment, shown as the weights that will fill it and the rest, allocator slack from
    then on. Nothing where the weights fill it."""
    block = warmup_block_bytes(spec, setup)
    if block <= weights.bytes:
        return [], ()
    rest = MemoryItem(
        path=f"caching_allocator_warmup block beyond the weights (transformers {setup.engine_version}; "
        "cached, free from the load on)",
        category=Category.OVERHEAD,
        bytes=block - weights.bytes,
        source=hf_warmup.SRC,
    )
    why = (
        "bitsandbytes' meta Linears at their 16-bit size, halved"
        if setup.weight_format.is_quantized
        else "the tied LM head counted beside its embedding"
    )
    note = (
        f"transformers {setup.engine_version} from_pretrained(device_map=...) warms the caching allocator "
        f"with one {block / 2**30:.2f} GiB block before the weights load ({why}); its free part stays "
        "reserved until later requests reuse it (a model moved with .to('cuda') has no warm-up)"
    )
    return [weights, rest], (note,)
