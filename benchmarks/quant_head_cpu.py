"""CPU check: a Lit-GPT-like quantized lm_head (bnb 0.50.2 Linear4bit quantized from fp16 as Lightning does,
MatMul4Bit run as bitsandbytes 0.42.0's forward/backward), chunked head of 128 positions, under peakmem's
storage tracker; compare the head's forward and backward increments with formulas/quant_head.py.

Run: PYTHONPATH=src python benchmarks/quant_head_cpu.py (V 32000, H 256, batch 2 x 256, chunks of 128).
Measured (torch 2.13 CPU, bitsandbytes 0.50.2): forward 49,152,000 B above the input and the nf4 weight,
the formula's exactly; backward 98,435,072 B against 98,304,000 (+0.13 %: the first chunk's input gradient,
131,072 B, alive at the second chunk's matmul, not counted)."""

import gc
import warnings

import bitsandbytes.functional as F
import torch

from peakmem.breakdown import Phase
from peakmem.measure.tracker import LiveStorageTracker

warnings.simplefilter("ignore")


class MatMul4Bit042(torch.autograd.Function):  # bitsandbytes 0.42.0 autograd/_functions.py
    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, quant_state=None):
        output = torch.nn.functional.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype).t(), bias)
        ctx.state = quant_state
        ctx.tensors = (A, B)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        _, B = ctx.tensors
        grad_A = torch.matmul(grad_output, F.dequantize_4bit(B, ctx.state).to(grad_output.dtype).t())
        return grad_A, None, None, None, None


V, H, B, T, CH = 32000, 256, 2, 256, 128
torch.manual_seed(0)
w = torch.randn(V, H, dtype=torch.bfloat16)
# Lightning _Linear4bit.quantize: quantize_4bit(weight.to(torch.half))
packed, state = F.quantize_4bit(w.to(torch.half), blocksize=64, quant_type="nf4", compress_statistics=False)
del w
assert state.dtype == torch.float16
x = torch.randn(B, T, H, dtype=torch.bfloat16, requires_grad=True)
tr = LiveStorageTracker(device_type="cpu")
gc.collect()
gc.disable()
with tr:
    tr.set_phase(Phase.LOAD, 1)
    tr.set_phase(Phase.FORWARD, 1)
    logits = [MatMul4Bit042.apply(xi, packed.t(), None, None, state) for xi in x.split(CH, dim=1)]
    tr.set_phase(Phase.OPTIMIZER, 1)  # (a placeholder phase: the upstream gradients, as the CE would write)
    grads = [torch.ones_like(t) for t in logits]
    tr.set_phase(Phase.BACKWARD, 1)
    torch.autograd.backward(logits, grads)
gc.enable()
peaks = {(s.phase, s.step): s.bytes for s in tr.ledger.peaks()}
print(peaks)
c = 2
W = V * H * c
rows = B * CH
out = rows * V * c
grad_in = rows * H * c
fwd_expected = (B * T * V * c - out) + max(2 * W, W + out)
held = packed.numel() + x.numel() * c  # the nf4 weight and the head input, there before
print(
    "forward: measured above the input and weight", peaks[(Phase.FORWARD, 1)] - held, "formula", fwd_expected
)
# backward at a chunk's matmul: the kept logits and every chunk's upstream gradient, + the two weights
bwd_expected = 2 * B * T * V * c + max(2 * W, W + grad_in)
print("backward: measured above", peaks[(Phase.BACKWARD, 1)] - held, "formula", bwd_expected)
