"""auto-gptq ``qlinear_cuda_old``'s torch dequantization, run on the CPU under peakmem's storage tracker,
against :func:`peakmem.formulas.quant_kernels.cuda_old_dequant_bytes`.

The ops below are ``QuantLinear.forward``'s branch for 128 rows or more, as AutoGPTQ@v0.4.2
(ef442d9) ``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`` writes them (auto-gptq is not installed
here; its CUDA kernels are not needed for this branch, which is plain torch). The tracker counts every
storage they create; the peak above the packed tensors is what the formula must give, exactly.
"""

from __future__ import annotations

from typing import Any

import pytest

from peakmem.breakdown import Phase
from peakmem.formulas.quant_kernels import cuda_old_dequant_bytes

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _wf(bits: int) -> Any:
    """QuantLinear.__init__'s ``wf`` shift table."""
    if bits == 3:
        return torch.tensor(
            [[0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0], [0, 1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31],
             [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0]], dtype=torch.int32,
        ).reshape(1, 3, 12)  # fmt: skip
    return torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)


def _dequant(qweight: Any, qzeros: Any, scales: Any, wf: Any, bits: int, group_size: int) -> Any:
    """The v0.4.2 forward's dequantization (its variable names; the matmul after it left out)."""
    if bits in (2, 4, 8):
        zeros = torch.bitwise_right_shift(
            torch.unsqueeze(qzeros, 2).expand(-1, -1, 32 // bits), wf.unsqueeze(0)
        ).to(torch.int16 if bits == 8 else torch.int8)
        torch.bitwise_and(zeros, (2**bits) - 1, out=zeros)
        zeros = zeros + 1
        zeros = zeros.reshape(-1, 1, zeros.shape[1] * zeros.shape[2])
        scales = scales.reshape(-1, 1, scales.shape[-1])
        weight = torch.bitwise_right_shift(
            torch.unsqueeze(qweight, 1).expand(-1, 32 // bits, -1), wf.unsqueeze(-1)
        ).to(torch.int16 if bits == 8 else torch.int8)
        torch.bitwise_and(weight, (2**bits) - 1, out=weight)
        weight = weight.reshape(-1, group_size, weight.shape[2])
    else:  # 3 bits
        zeros = qzeros.reshape(qzeros.shape[0], qzeros.shape[1] // 3, 3, 1).expand(-1, -1, -1, 12)
        zeros = zeros >> wf.unsqueeze(0)
        zeros[:, :, 0, 10] = (zeros[:, :, 0, 10] & 0x3) | ((zeros[:, :, 1, 0] << 2) & 0x4)
        zeros[:, :, 1, 11] = (zeros[:, :, 1, 11] & 0x1) | ((zeros[:, :, 2, 0] << 1) & 0x6)
        zeros = zeros & 0x7
        zeros = torch.cat([zeros[:, :, 0, :11], zeros[:, :, 1, 1:12], zeros[:, :, 2, 1:11]], dim=2)
        zeros = zeros + 1
        zeros = zeros.reshape(-1, 1, zeros.shape[1] * zeros.shape[2])
        scales = scales.reshape(-1, 1, scales.shape[-1])
        weight = qweight.reshape(qweight.shape[0] // 3, 3, 1, qweight.shape[1]).expand(-1, -1, 12, -1)
        weight = (weight >> wf.unsqueeze(-1)) & 0x7
        weight[:, 0, 10] = (weight[:, 0, 10] & 0x3) | ((weight[:, 1, 0] << 2) & 0x4)
        weight[:, 1, 11] = (weight[:, 1, 11] & 0x1) | ((weight[:, 2, 0] << 1) & 0x6)
        weight = weight & 0x7
        weight = torch.cat([weight[:, 0, :11], weight[:, 1, 1:12], weight[:, 2, 1:11]], dim=1)
        weight = weight.reshape(-1, group_size, weight.shape[2])
    weight = scales * (weight - zeros)
    return weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])


@pytest.mark.parametrize(
    ("bits", "in_f", "out_f", "group"),
    [(4, 256, 384, 64), (8, 128, 256, 32), (2, 256, 128, 128), (3, 256, 96, 64)],
)
def test_cuda_old_dequant_peak_matches_the_tracker(bits: int, in_f: int, out_f: int, group: int) -> None:
    from peakmem.measure.tracker import LiveStorageTracker

    groups = in_f // group
    gen = torch.Generator().manual_seed(0)
    int32 = {"dtype": torch.int32, "generator": gen}
    qweight = torch.randint(-(2**31), 2**31 - 1, (in_f // 32 * bits, out_f), **int32)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (groups, out_f // 32 * bits), **int32)
    scales = torch.rand(groups, out_f, generator=gen).half()
    wf = _wf(bits)
    tracker = LiveStorageTracker()
    for t in (qweight, qzeros, scales, wf):
        tracker.sid_of(t, op="packed")
    with torch.no_grad(), tracker:
        tracker.set_phase(Phase.FORWARD, step=1)
        weight = _dequant(qweight, qzeros, scales, wf, bits, group)
    assert weight.shape == (in_f, out_f) and weight.dtype == torch.float16
    packed = sum(t.numel() * t.element_size() for t in (qweight, qzeros, scales, wf))
    peak = max(s.bytes for s in tracker.ledger.peaks() if s.phase is Phase.FORWARD)
    assert peak - packed == cuda_old_dequant_bytes(in_f, out_f, bits, group)
