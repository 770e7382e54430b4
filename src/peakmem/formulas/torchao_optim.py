"""torchao's low-bit AdamW optimizer states: ``AdamW4bit``, ``AdamW8bit``, ``AdamWFp8`` (torchao 0.18.0).

Read in torchao 0.18.0 ``torchao/optim/``:

* ``adam.py`` ``_AdamBase._new_buffer``: a parameter with at least 4096 elements *and* a multiple of the
  optimizer's ``block_size`` gets its ``exp_avg`` / ``exp_avg_sq`` as a quantized tensor subclass; any other
  gets ``torch.zeros_like(p)``: full states **in the parameter's own dtype** (bf16 parameters: bf16
  states), not fp32. ``step`` is one ``torch.compile``-d ``single_param_adam`` per parameter, writing the
  states in place (``dst.copy_(src)`` requantizes into the same buffers).
* ``AdamW4bit`` (``block_size=128``; Li et al. 2023, arXiv 2309.01507), ``subclass_4bit.py``
  ``OptimState4bit.zeros``: ``codes`` uint8 of numel / 2 (two 4-bit codes a byte), ``scale`` fp32 of
  numel / block_size, ``qmap`` a 16-entry fp32 tensor, made per state and per parameter.
* ``AdamW8bit`` (``block_size=256``), ``subclass_8bit.py`` ``OptimState8bit.zeros``: ``codes`` uint8 of
  numel, ``scale`` fp32 of numel / block_size, ``qmap`` a 256-entry fp32 tensor (``get_qmap_signed`` /
  ``get_qmap_unsigned``), made per state and per parameter (bitsandbytes shares its maps; torchao does not).
* ``AdamWFp8`` (``block_size=256``), ``subclass_fp8.py`` ``OptimStateFp8.zeros``: ``codes``
  ``float8_e4m3fn`` of numel, ``scale`` fp32 of numel / block_size; no map.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from peakmem.model import Tensor

AO_MIN_QUANT_SIZE = 4096  # adam.py _new_buffer: local_p.numel() >= 4096
FP32 = 4


@dataclass(frozen=True, kw_only=True)
class AoFormat:
    """One torchao state subclass: bytes of its codes per element (as a fraction), its block and map."""

    name: str
    codes_per_byte: int  # elements packed into one byte of ``codes``
    block: int  # the optimizer's default block_size
    qmap_entries: int  # fp32 entries of the per-state lookup table (0: none)
    source: str


_SRC = "torchao 0.18.0 optim/"
AO_4BIT = AoFormat(
    name="4-bit",
    codes_per_byte=2,
    block=128,
    qmap_entries=16,
    source=_SRC + "subclass_4bit.py OptimState4bit.zeros: codes numel/2 uint8, scale numel/128 fp32, "
    "qmap 16 fp32 (adam.py AdamW4bit block_size=128)",
)
AO_8BIT = AoFormat(
    name="uint8",
    codes_per_byte=1,
    block=256,
    qmap_entries=256,
    source=_SRC + "subclass_8bit.py OptimState8bit.zeros: codes numel uint8, scale numel/256 fp32, "
    "qmap 256 fp32 (adam.py AdamW8bit block_size=256)",
)
AO_FP8 = AoFormat(
    name="fp8",
    codes_per_byte=1,
    block=256,
    qmap_entries=0,
    source=_SRC + "subclass_fp8.py OptimStateFp8.zeros: codes numel float8_e4m3fn, scale numel/256 fp32 "
    "(adam.py AdamWFp8 block_size=256)",
)


@dataclass(frozen=True, kw_only=True)
class QuantStates:
    """Bytes of block-quantized optimizer states, split by part."""

    quantized: int  # uint8 (or packed 4-bit) state values
    scales: int  # fp32 absmax / scale per block
    maps: int  # quantile maps
    fp32: int  # full states of the tensors too small (or unaligned) to quantize (in their own dtype)
    params_quantized: int
    params_fp32: int
    pageable: int = 0  # paged variants: the part of the above that is unified memory

    @property
    def total(self) -> int:
        return self.quantized + self.scales + self.maps + self.fp32


def items(tensors: Iterable[tuple[Tensor, int]]) -> list[tuple[int, int]]:
    """(elements of one tensor, how many such tensors): experts kept as copies are separate tensors."""
    return [(math.prod(t.shape), t.copies * n) for t, n in tensors]


def ao_states(
    tensors: Iterable[tuple[Tensor, int]], fmt: AoFormat, *, n_states: int = 2, state_bytes: int = FP32
) -> QuantStates:
    """torchao low-bit AdamW states of ``fmt`` (see the module docstring). ``state_bytes``: bytes per
    element of the parameter the optimizer steps (``zeros_like(p)`` for the tensors left unquantized):
    4 for fp32 parameters or fp32 masters, 2 for pure bf16."""
    quantized = scales = maps = full = pq = pf = 0
    for numel, count in items(tensors):
        if numel >= AO_MIN_QUANT_SIZE and numel % fmt.block == 0:
            quantized += count * n_states * (numel // fmt.codes_per_byte)
            scales += count * n_states * (numel // fmt.block) * FP32
            maps += count * n_states * fmt.qmap_entries * FP32
            pq += count * numel
        else:
            full += count * n_states * numel * state_bytes
            pf += count * numel
    return QuantStates(quantized=quantized, scales=scales, maps=maps, fp32=full, params_quantized=pq,
                       params_fp32=pf)  # fmt: skip


__all__ = [
    "AO_4BIT",
    "AO_8BIT",
    "AO_FP8",
    "AO_MIN_QUANT_SIZE",
    "AoFormat",
    "QuantStates",
    "ao_states",
    "items",
]
