"""A bitsandbytes base loaded by transformers' ``from_pretrained`` and prepared for QLoRA by peft, replayed
through the caching-allocator model: the load's allocated peak and the segments it leaves reserved.

What runs, in order, on the one GPU that holds the model (the HF Trainer / TRL / axolotl / unsloth path):

1. transformers 4.51-4.57's ``caching_allocator_warmup``: one block, allocated and dropped before any weight
   (its size: :mod:`peakmem.formulas.hf_warmup`); the weights then take slices of it.
2. The weights in module order. A quantized Linear: bitsandbytes ``Params4bit.to(cuda)`` -> ``_quantize``
   copies the 16-bit weight to the GPU (``w = self.data.contiguous().to(device)``), ``quantize_4bit``
   writes the packed values and the absmax (nested with double quantization), and the 16-bit copy is
   dropped (bitsandbytes 0.43.3 / 0.45 ``nn/modules.py``; ``Int8Params.cuda`` alike: int8 values and
   SCB). transformers 4.4x-4.57 hands each weight over this way when it quantizes as it loads
   (``quantizers/quantizer_bnb_4bit.py`` ``create_quantized_param``: ``Params4bit(new_value, ...).to(
   target_device)``; 5.23 ``integrations/bitsandbytes.py`` ``Bnb4bitQuantize.convert``: ``Params4bit(value,
   ...).to(value.device)`` on a tensor already on the GPU, the same copy; whether 5.x's loader materializes
   several at once was not read: one at a time here); a checkpoint saved quantized loads
   its packed values directly (no 16-bit copy: not told apart here, the copy of one weight at a time).
   Every other tensor in the float dtype.
3. peft ``prepare_model_for_kbit_training`` (kbit_prep peft / trl / axolotl): each 16-bit parameter that
   is not a ``Params4bit``, in ``named_parameters`` order, gets ``param.data = param.data.to(
   torch.float32)``: the fp32 copy is made while the 16-bit one is alive, then that is dropped.
4. ``get_peft_model``: the adapters.
5. TRL's ``peft_module_casting_to_bf16`` (kbit_prep trl) and axolotl's ``_convert_embedding_modules_dtype``
   (kbit_prep axolotl) put some of those back in 16-bit (:mod:`peakmem.formulas.kbit_prep`): a 16-bit copy
   beside the fp32 one, then the fp32 one dropped.

The allocated peak is step 3 at the LM head (every quantized weight, the embeddings already fp32, the head
in 16-bit and in fp32 at once), or with TRL's cast back step 5 at the embedding (its bf16 copy beside the
fp32 embedding and head, the adapters made). A 151,936 x 5,120 vocabulary (Qwen3-14B) puts 5.8 GiB of fp32
embeddings and head beside the 4-bit layers there. The reserved peak is the replay's: the warm-up block's
rest stays cached beside the new fp32 segments (what the step then reuses). With ``capacity`` (the bytes
the process may reserve) the model frees cached whole segments when a new one would not fit, as the CUDA
allocator does when ``cudaMalloc`` fails (:mod:`peakmem.formulas.caching_allocator`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count

from peakmem.formulas.caching_allocator import CachingAllocatorModel

SRC = (
    "bitsandbytes 0.43.3 nn/modules.py Params4bit._quantize; transformers 4.51-4.57 quantizer_bnb_4bit.py "
    "create_quantized_param; peft 0.13/0.21.2 utils/other.py prepare_model_for_kbit_training"
)


@dataclass(frozen=True, kw_only=True)
class BaseTensor:
    """One base tensor as the load allocates it (bytes; 0: that step does not touch it)."""

    loaded: int  # as it stays after the load: the quantized storage, or the float dtype's bytes
    staging: int = 0  # the 16-bit copy bitsandbytes quantizes from, dropped after
    upcast: int = 0  # fp32 bytes after prepare_model_for_kbit_training
    back: int = 0  # 16-bit bytes after the cast back (TRL / axolotl)


@dataclass(frozen=True, kw_only=True)
class LoadReplay:
    peak_live: int  # most requested bytes alive at once (max_memory_allocated, before rounding)
    end_live: int  # alive when the load is done
    peak_reserved: int  # max_memory_reserved over the load


def replay_load(
    tensors: tuple[BaseTensor, ...], adapters: tuple[int, ...], block: int, *, capacity: int | None = None
) -> LoadReplay:
    """The five steps of the module docstring over ``tensors`` (module order) and the adapters' bytes."""
    model = CachingAllocatorModel(capacity=capacity)
    key = count()
    peak = peak_reserved = 0

    def malloc(nbytes: int) -> int:
        nonlocal peak, peak_reserved
        k = next(key)
        if nbytes:
            model.malloc(k, nbytes)
            peak = max(peak, model.requested)
            peak_reserved = max(peak_reserved, model.reserved)
        return k

    if block:
        model.free(malloc(block))
    held = []
    for t in tensors:
        staging = malloc(t.staging)
        held.append(malloc(t.loaded))
        model.free(staging)
    for i, t in enumerate(tensors):
        if t.upcast:
            k = malloc(t.upcast)
            model.free(held[i])
            held[i] = k
    for nbytes in adapters:
        malloc(nbytes)
    for i, t in enumerate(tensors):
        if t.back:
            k = malloc(t.back)
            model.free(held[i])
            held[i] = k
    return LoadReplay(peak_live=peak, end_live=model.requested, peak_reserved=peak_reserved)


__all__ = ["SRC", "BaseTensor", "LoadReplay", "replay_load"]
