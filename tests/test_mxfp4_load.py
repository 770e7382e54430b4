"""transformers' MXFP4 dequantization at load (peakmem.formulas.mxfp4_load, peakmem.step_load): one
conversion's peak measured on the CPU and by hand, and the load phase of a gpt-oss training estimate."""

from __future__ import annotations

import math

import pytest

from peakmem.formulas import mxfp4_load


def test_dequant_peak_by_hand() -> None:
    n = 16 * 1000  # block bytes: 1000 rows of 16
    inputs = n + 1000 * (1 + 4)  # blocks, uint8 scales, their int32 copy
    # transformers 4.55-5.0: int64 idx_lo and idx_hi together, a bf16 gather, the bf16 result (4 B per byte)
    assert mxfp4_load.dequant_peak(n, index_bytes=8, together=True) == inputs + 4 * n + 16 * n + 2 * n
    # 5.1 on: one int32 index at a time
    assert mxfp4_load.dequant_peak(n, index_bytes=4, together=False) == inputs + 4 * n + 4 * n + 2 * n
    assert mxfp4_load.block_bytes(5760, 2880) == 5760 * 90 * 16  # gpt-oss-20b gate_up rows x in/32 x 16


def _convert_4_55(blocks, scales):  # type: ignore[no-untyped-def]
    """transformers 4.55.0 integrations/mxfp4.py convert_moe_packed_tensors l. 98-136 (one chunk), on the CPU,
    with the caller's transpose (``dequantize`` l. 327)."""
    import torch

    scales = scales.to(torch.int32) - 127
    lut = torch.tensor([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.bfloat16)  # fmt: skip
    *prefix, g, b = blocks.shape
    rows = math.prod(prefix) * g
    blocks, scales = blocks.reshape(rows, b), scales.reshape(rows, 1)
    out = torch.empty(rows, b * 2, dtype=torch.bfloat16)
    idx_lo = (blocks & 0x0F).to(torch.long)
    idx_hi = (blocks >> 4).to(torch.long)
    out[:, 0::2] = lut[idx_lo]
    out[:, 1::2] = lut[idx_hi]
    torch.ldexp(out, scales, out=out)
    del idx_lo, idx_hi
    out = out.reshape(*prefix, g, b * 2).view(*prefix, g * b * 2)
    return out.transpose(1, 2).contiguous()


@pytest.mark.torch
@pytest.mark.parametrize("release", ["4.55.0", "installed"])
def test_one_conversion_measured_on_the_cpu(release: str) -> None:
    """The most alive while transformers converts one projection (E x rows x 8 blocks), under peakmem's
    storage tracker, equals the formula within the 16-value lookup table (32 B)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from peakmem.measure.tracker import LiveStorageTracker
    from peakmem.transformers_versions import TRANSFORMERS_CURRENT, release_facts

    convert = _convert_4_55 if release == "4.55.0" else convert_moe_packed_tensors
    facts = release_facts("4.55.0" if release == "4.55.0" else TRANSFORMERS_CURRENT)
    tracker = LiveStorageTracker()
    with torch.no_grad(), tracker:
        blocks = torch.randint(0, 256, (4, 256, 8, 16), dtype=torch.uint8)
        scales = torch.randint(120, 134, (4, 256, 8), dtype=torch.uint8)
        out = convert(blocks, scales)
    measured = max(s.bytes for s in tracker.ledger.peaks())
    n = blocks.numel()
    formula = mxfp4_load.dequant_peak(
        n, index_bytes=facts.mxfp4_index_bytes, together=facts.mxfp4_indices_together
    )
    assert out.shape == (4, 256, 256) and out.dtype == torch.bfloat16
    assert 0 <= measured - formula <= 64


def test_gpt_oss_training_loads_through_the_conversion() -> None:
    """gpt-oss-20b's catalog config names quant_method mxfp4: a training estimate has a load phase (every
    weight, plus the largest projection's conversion less its bf16 result). Between transformers 4.55 and
    5.23 only the conversion differs: its int64 index pair (16 B per block byte) against one int32 index
    (4 B), 12 B per block byte of gate_up (32 experts x 5,760 rows x 90 blocks x 16 B). A model with no
    MXFP4 checkpoint has no load phase."""
    import peakmem

    n = 32 * 5760 * 90 * 16
    load = {
        release: peakmem.train("gpt-oss-20b", method="lora", seq=512, transformers=release).data["phases"][
            "load"
        ]
        for release in ("4.55.0", "5.23.0")
    }
    assert load["4.55.0"] - load["5.23.0"] == 12 * n
    assert "load" not in peakmem.train("llama-3.1-8b", method="lora", seq=512).data["phases"]
