"""torchao's ``to_nf4`` as a sequence of requests, and a torchtune QLoRA model's build and load replayed.

torchtune's QLoRA runs ``to_nf4`` on every quantized base weight twice on the GPU (torchtune@0914d5cfb):

* at the model's build (recipes/lora_finetune_single_device.py ``_setup_model``: the model is instantiated
  under ``with utils.set_default_dtype(self._dtype), self._device``): modules/peft/lora.py
  ``LoRALinear._create_weight_and_bias`` makes a 16-bit ``nn.Linear`` and keeps ``to_nf4(linear.weight)``,
  the 16-bit weight freed after it; then the adapters ``lora_a`` (r x in) and ``lora_b`` (out x r);
* in ``model.load_state_dict`` of the checkpoint (on CPU): utils/_register_nf4_dispatch_ops.py
  ``inplace_copy`` runs ``to_nf4(src.to(dest.device))`` and points the parameter at the new codes, the old
  ones and the 16-bit copy freed after it.

One ``to_nf4`` of a 16-bit weight of ``n`` elements (``e`` bytes each; block 64, scalers per 256 blocks),
torchao dtypes/nf4tensor.py ``NF4Tensor.from_tensor`` (0.1 and 0.2.0 alike but for the chunking,
:mod:`peakmem.torchao_versions`): ``double_quantize_scalers`` (a block ``abs`` of ``n x e``; int8 scalers
kept, and ``quantization_factor``, a ``[:, 0]`` view that keeps its whole ``n / 64`` quotient), then
``convert_to_norm_float_weight``: another block ``abs``, the scaled copy (``n x e``, to the end), and
``quantize_tensor_nearest``: ``(value - nf4).abs()``, a ``(k, 16)`` difference and its ``abs`` alive
together, then ``min``'s values and int64 indices, for ``k = n`` (0.1) or per chunk of ``k = 1024**2``
into a ``uint8`` buffer of ``n`` (0.2.0 on); the packed codes ``n / 2`` (0.1 through int64 shifts).

Measured on CPU (torch 2.13, a dispatch mode counting each output storage until its weakref finalizer):
the 0.1 wheel's code peaks at 68.08 B per element with the bf16 source (2 source + 2 scaled + 32 + 32
difference and abs + 0.08 scalers), whatever the size (131,072 to 4,194,304 elements); 0.2.0's, and the
installed 0.18.0's, at 5.08 B per element + 64 B per chunk element (21.08 B at 4 chunks, 37.08 at 2); what
``to_nf4`` keeps is 0.547 B per element in 0.1 and 0.2.0 (0.516 in 0.18.0). This module's requests give
the same peaks (tests/test_torchao_versions.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .step_sequence import AllocatorRun, Held

NF4_LUT = 16  # quantize_tensor_nearest compares each element with the 16 NF4 values
NF4_BLOCK = 64  # to_nf4(block_size=64)
INT64 = 8  # min(dim=-1).indices
SRC_TO_NF4 = (
    "torchao dtypes/nf4tensor.py NF4Tensor.from_tensor / convert_to_norm_float_weight / "
    "quantize_tensor_nearest (0.1: the whole weight; 0.2.0 on: chunks of 1024**2 elements)"
)
SRC_TORCHTUNE_LOAD = (
    "torchtune@0914d5cfb modules/peft/lora.py LoRALinear._create_weight_and_bias (to_nf4 at the build, "
    "on the GPU) and utils/_register_nf4_dispatch_ops.py inplace_copy (to_nf4(src.to(device)) in "
    "load_state_dict)"
)


@dataclass(frozen=True, slots=True)
class Request:
    """Allocate ``nbytes`` under ``name``; ``nbytes == 0``: free what ``name`` holds."""

    name: str
    nbytes: int = 0


def _nearest(k: int, e: int, into: str) -> tuple[Request, ...]:
    """``quantize_tensor_nearest`` of ``k`` elements: the (k, 16) difference and its abs, then min."""
    ops = [Request("diff", NF4_LUT * k * e), Request("abs", NF4_LUT * k * e), Request("diff"),
           Request("min", k * e), Request("idx", k * INT64), Request("min"), Request("abs")]  # fmt: skip
    if into:  # 0.2.0: .to(torch.uint8), copied into the buffer's slice
        ops += [Request(into, k), Request("idx"), Request(into)]
    return tuple(ops)


def to_nf4_requests(numel: int, elem_bytes: int, chunk: int | None) -> tuple[Request, ...]:
    """One ``to_nf4`` of a 16-bit weight (see the module doc); it keeps ``codes``, ``qscalers``, ``qfactor``.
    Chunks of equal size repeat the same requests (freed before the next), so one full chunk and the
    last partial one stand for them all."""
    n, e, nb = numel, elem_bytes, numel // NF4_BLOCK
    ops = [Request("absmax", n * e), Request("scaler_tmp", nb * INT64), Request("absmax"),
           Request("scaler_tmp"), Request("qscalers", nb), Request("qfactor", nb * e),
           Request("absmax", n * e), Request("scalers", nb * e), Request("absmax"),
           Request("scaled", n * e)]  # fmt: skip
    if chunk is None:  # 0.1: the whole weight, then ``q[::2] << 4 | q[1::2]`` on the int64 indices
        ops += _nearest(n, e, "")
        ops += [Request("shift", n // 2 * INT64), Request("packed", n // 2 * INT64), Request("shift"),
                Request("codes", n // 2), Request("packed"), Request("idx")]  # fmt: skip
    else:
        ops.append(Request("buffer", n))
        full, rest = divmod(n, chunk)
        for k in (chunk,) * min(full, 1) + ((rest,) if rest else ()):
            ops += _nearest(k, e, "chunk")
        ops += [Request("shift", n // 2), Request("codes", n // 2), Request("shift"), Request("buffer")]
    ops += [Request("scaled"), Request("scalers")]
    return tuple(ops)


def peak_bytes(requests: tuple[Request, ...], start: int = 0) -> int:
    """The most alive at once over ``requests`` (``start`` alive before them)."""
    live, held, peak = start, {}, start
    for r in requests:
        if r.nbytes:
            held[r.name] = r.nbytes
            live += r.nbytes
            peak = max(peak, live)
        else:
            live -= held.pop(r.name)
    return peak


def quantize_peak(numel: int, elem_bytes: int, chunk: int | None) -> int:
    """Bytes alive at the peak of quantizing one weight: its 16-bit source and ``to_nf4``'s tensors."""
    source = numel * elem_bytes
    return peak_bytes(to_nf4_requests(numel, elem_bytes, chunk), source)


@dataclass(frozen=True, slots=True)
class LoadTensor:
    """A base tensor in module order: ``nbytes`` as stored, or (``quantized`` > 0) an NF4 weight of that
    many elements, built and loaded through ``to_nf4``."""

    nbytes: int = 0
    quantized: int = 0


@lru_cache(maxsize=32)
def replay_load(
    tensors: tuple[LoadTensor, ...], adapters: tuple[int, ...], elem_bytes: int, chunk: int | None
) -> tuple[int, int]:
    """(reserved, allocated) peaks of the build and the load (see the module doc) through the caching
    allocator model: the build in module order (each quantized weight's 16-bit ``nn.Linear`` weight, its
    ``to_nf4``, the 16-bit weight freed; the others as stored), the adapters, then ``load_state_dict``
    (each quantized weight's 16-bit copy, its ``to_nf4``, the old codes and the copy freed)."""
    run = AllocatorRun()
    codes: list[list[Held]] = []

    def quantize(numel: int) -> list[Held]:
        held: dict[str, list[Held]] = {}
        source = run.alloc((numel * elem_bytes,))
        for r in to_nf4_requests(numel, elem_bytes, chunk):
            if r.nbytes:
                held[r.name] = run.alloc((r.nbytes,))
            else:
                run.free(held.pop(r.name))
        run.free(source)
        return [k for keys in held.values() for k in keys]

    for t in tensors:
        if t.quantized:
            codes.append(quantize(t.quantized))
        else:
            run.alloc((t.nbytes,))
    run.alloc(adapters)
    quantized = [t.quantized for t in tensors if t.quantized]
    for i, numel in enumerate(quantized):
        new = quantize(numel)
        run.free(codes[i])
        codes[i] = new
    return run.reserved, run.peak_allocated


__all__ = [
    "SRC_TORCHTUNE_LOAD",
    "SRC_TO_NF4",
    "LoadTensor",
    "Request",
    "peak_bytes",
    "quantize_peak",
    "replay_load",
    "to_nf4_requests",
]
