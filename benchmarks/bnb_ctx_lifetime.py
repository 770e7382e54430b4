"""What bitsandbytes < 0.43.2 keeps after backward in a Lit-GPT loop (brief h-litgpt24; CPU, no bitsandbytes).

bitsandbytes 0.42.0 (Lit-GPT's pin: pyproject.toml@5895df1 ``bitsandbytes==0.42.0``) ``MatMul4Bit.forward``
stores its input as a plain ctx attribute, ``ctx.tensors = (A, B)``, not through ``save_for_backward``.
autograd frees saved variables after backward, but a ctx attribute lives as long as the graph node, and the
node lives as long as an output that reaches it. Lit-GPT's loop (litgpt/finetune/lora.py@5895df1,
``logits = model(input_ids, lm_head_chunk_size=128)``) keeps ``logits`` until the NEXT iteration's
``model(...)`` returns, so every 4-bit Linear input of iteration n stays allocated through the forward of
iteration n + 1. This script shows the lifetime with a Function that stores its input the same way.
peakmem's timeline models it (Profile.loop_keeps_output, formulas/loop_held.py), checked on the CPU with
bitsandbytes' own Linear4bit in tests/test_loop_held_torch.py.
"""

from __future__ import annotations

import gc
import weakref

import torch


class KeepInput(torch.autograd.Function):
    """As bitsandbytes 0.42.0 bitsandbytes/autograd/_functions.py MatMul4Bit: ``ctx.tensors = (A, B)``."""

    @staticmethod
    def forward(ctx, a, w):  # type: ignore[no-untyped-def,override]
        ctx.tensors = (a, w)
        return a @ w.t()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        _, w = ctx.tensors
        return grad @ w, None


def lifetimes() -> tuple[bool, bool]:
    """(input alive after backward while the output is held, alive after the output is dropped)."""
    w = torch.randn(8, 8)
    adapter = torch.randn(8, 8, requires_grad=True)
    h = (torch.randn(4, 8) @ adapter) * 2  # requires grad, as the input after the first LoRA layer
    ref = weakref.ref(h)
    out = KeepInput.apply(h, w)
    del h
    out.sum().backward()
    gc.collect()
    held = ref() is not None
    del out
    gc.collect()
    return held, ref() is not None


def main() -> int:
    held, after = lifetimes()
    print(
        f"input alive after backward while the output is held: {held}; after the output is dropped: {after}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
