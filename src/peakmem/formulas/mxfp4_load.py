"""transformers' dequantization of an MXFP4 checkpoint at load, for training (gpt-oss).

A gpt-oss checkpoint stores each layer's MoE experts as OCP MXFP4 (``gate_up_proj_blocks`` uint8
``[E, 2I, H/32, 16]`` and ``gate_up_proj_scales`` uint8 ``[E, 2I, H/32]``, the same for ``down_proj``:
:func:`peakmem.formulas.weights.mxfp4_bytes`). Training loads it with ``Mxfp4Config(dequantize=True)``
(MXFP4 kernels have no backward), and transformers converts each projection to bf16 on the GPU as soon as
its blocks and scales are loaded (``integrations/mxfp4.py`` ``convert_moe_packed_tensors``: the blocks are
moved to CUDA first when they are on the CPU). One conversion of ``n`` block bytes (``n`` = E x rows x
in/32 x 16, two E2M1 values per byte) allocates, ``rows_per_chunk`` = 32768 x 1024 rows being more than
any gpt-oss projection has (one chunk):

* ``scales.to(torch.int32) - 127``: an int32 copy of the scales (``n / 16`` rows x 4 B), next to the
  uint8 scales the module still holds;
* ``out = torch.empty(rows, 32, dtype=bf16)``: the result, 2 values x 2 B per block byte (4 n);
* the nibble indices, one per block byte: transformers 4.55.0-5.0.x ``idx_lo = (blk & 0x0F).to(torch.long)``
  and ``idx_hi = (blk >> 4).to(torch.long)``, both made before ``sub[:, 0::2] = lut[idx_lo]`` (8 n each, alive
  together); 5.1.0 on ``.to(torch.int)`` and ``del idx_lo`` before ``idx_hi`` is made (4 n, one at a time);
* ``lut[idx]``: the gathered bf16 values (2 n) while the indices are alive;
* then ``out.transpose(1, 2).contiguous()`` (inside the function from 4.56.0; in the caller,
  ``integrations/mxfp4.py`` ``dequantize``, at 4.55.0): a second 4 n while the blocks are still attached.

Read in the released wheels 4.55.0, 4.56.0, 4.57.1, 5.0.0 (int64, together), 5.1.0, 5.2.0, 5.3.0, 5.6.0,
5.8.0, 5.10.0 and the installed 5.23.0 (int32, one at a time): :mod:`peakmem.transformers_versions`
``mxfp4_index_bytes`` / ``mxfp4_indices_together``. The load's peak is the conversion of the largest
projection with every other weight already loaded (the order the shards are read in does not say which
comes last: the bound).
"""

from __future__ import annotations

import math

from peakmem.weight_formats import MXFP4_BLOCK

MXFP4_VALUES_PER_BYTE = 2  # two E2M1 values in one uint8 of *_blocks
MXFP4_BLOCK_BYTES = 16  # *_blocks' last dimension: 32 values per E8M0 scale
INT32 = 4  # scales.to(torch.int32)
BF16 = 2  # convert_moe_packed_tensors(dtype=torch.bfloat16)


def block_bytes(rows: int, in_features: int) -> int:
    """``*_blocks`` bytes of a ``[rows, in_features]`` expert matrix (all experts' rows): 16 per 32 values,
    a partial last block taking a whole one (:func:`peakmem.formulas.weights.mxfp4_bytes` adds the scales)."""
    return rows * math.ceil(in_features / MXFP4_BLOCK) * MXFP4_BLOCK_BYTES


def scales_bytes(block_bytes: int) -> int:
    """The uint8 scales the module holds and their int32 working copy: one per 16 block bytes."""
    rows = block_bytes // MXFP4_BLOCK_BYTES
    return rows * (1 + INT32)


def dequant_peak(block_bytes: int, *, index_bytes: int, together: bool) -> int:
    """The most alive while one projection of ``block_bytes`` MXFP4 block bytes is converted to bf16: its
    blocks and scales, the bf16 result, the nibble indices (both at once or one at a time) and a gathered
    half, or later the result and its transposed copy (module docstring)."""
    out = block_bytes * MXFP4_VALUES_PER_BYTE * BF16
    inputs = block_bytes + scales_bytes(block_bytes)
    indices = block_bytes * index_bytes * (2 if together else 1)
    gathered = block_bytes * BF16
    return inputs + max(out + indices + gathered, 2 * out)


def bf16_bytes(block_bytes: int) -> int:
    """The converted projection's bf16 bytes (what the model keeps of it)."""
    return block_bytes * MXFP4_VALUES_PER_BYTE * BF16


__all__ = ["bf16_bytes", "block_bytes", "dequant_peak", "scales_bytes"]
