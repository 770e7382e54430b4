"""What a torch.compile'd cross-entropy allocates, measured on this CPU, next to peakmem's loss='compiled'.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/compiled_loss.py [--quick] [--hf]``.

1. ``cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))`` (torchtitan@e7c0cae
   ``torchtitan/components/loss.py`` ``cross_entropy_loss``), eager and under ``torch.compile`` (Inductor,
   its default partitioner), on ``1 x T x V`` logits in bf16 and fp32: the bytes the forward allocates
   (peak, and net: what stays for backward; the logits are the caller's and not counted), the tensors it
   saves (``saved_tensors_hooks``: the logits themselves show as "logits"), and the backward's peak
   allocation. Next to them :func:`peakmem.formulas.lowbit_optim.compiled_ce` (compiled) and the standard
   head (eager: :func:`peakmem.formulas.loss.head_activations`). The CPU allocator's ``[memory]`` events
   (profile_memory) count every allocation, 64-byte aligned.
2. ``--hf``: ``torch.compile(model)`` of a tiny transformers ``LlamaForCausalLM`` (bf16) called with
   ``labels=`` (the loss computed inside forward by ``ForCausalLMLoss``): how many graphs dynamo makes and
   its graph breaks (``torch._dynamo.explain``), the tensors with a vocabulary dimension saved for backward,
   and the forward / backward allocation, eager vs compiled.

Inductor's generated code (``TORCH_LOGS=output_code``) names the buffers: the forward kernel
``cpp_fused__log_softmax__to_copy_nll_loss_forward_view_0`` writes ``amax`` and ``log`` (T x 1 fp32) and
the loss; the backward kernel writes one T x V buffer in the logits' dtype and a T x 1 fp32 scratch.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class CeBytes:
    """One cross-entropy's allocations (bytes), the caller's logits not counted."""

    forward_peak: int
    forward_net: int  # alive after the forward: what it keeps for backward (and the loss)
    saved: tuple[tuple[tuple[int, ...], str, int], ...]  # (shape, dtype or "logits", bytes) per storage
    backward_peak: int  # the backward's own allocations at their peak (the saved tensors not counted)


def allocated(fn: Any) -> tuple[int, int, Any]:
    """(peak, net) bytes of the CPU allocator's events while ``fn()`` runs, and its result."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    cur = peak = 0
    for _, n in events:
        cur += n
        peak = max(peak, cur)
    return peak, cur, out


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan@e7c0cae torchtitan/components/loss.py ``cross_entropy_loss``."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def measure_ce(tokens: int, vocab: int, dtype: str, compiled: bool) -> CeBytes:
    """The cross-entropy over ``1 x tokens x vocab`` logits of ``dtype`` (bf16 | fp32), eager or compiled."""
    torch.manual_seed(0)
    fn: Any = cross_entropy_loss
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(cross_entropy_loss, dynamic=False)
    labels = torch.randint(0, vocab, (1, tokens))
    logits = torch.randn(1, tokens, vocab, dtype=DTYPES[dtype], requires_grad=True)
    fn(logits, labels).backward()  # compile (and first-call caches) outside the measured window
    logits.grad = None
    ptr = logits.untyped_storage().data_ptr()
    seen: dict[int, tuple[tuple[int, ...], str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        name = "logits" if s.data_ptr() == ptr else str(t.dtype).removeprefix("torch.")
        seen[s.data_ptr()] = (tuple(t.shape), name, s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fwd_peak, fwd_net, loss = allocated(lambda: fn(logits, labels))
    bwd_peak, _, _ = allocated(lambda: loss.backward())
    saved = tuple(seen.values())
    return CeBytes(forward_peak=fwd_peak, forward_net=fwd_net, saved=saved, backward_peak=bwd_peak)


def formula(tokens: int, vocab: int, dtype: str, compiled: bool) -> tuple[int, int, int]:
    """peakmem's (saved by the loss beyond the logits, forward peak at the loss beyond the logits, backward
    peak beyond the saved tensors) for the same cross-entropy."""
    from peakmem.formulas.loss import HeadActivations
    from peakmem.formulas.lowbit_optim import compiled_ce

    c = 2 if dtype == "bf16" else 4
    logits = tokens * vocab * c
    if compiled:
        empty = HeadActivations(saved=(), forward_transient=0, backward_transient=0, logits_grad=0)
        head = compiled_ce(empty, [], tokens, vocab, c)
        saved = sum(i.bytes for i in head.saved) - logits  # the logits are the caller's
        return saved, saved + head.forward_transient, max(head.backward_transient, head.logits_grad)
    # the standard head (formulas/loss.py head_activations): the fp32 log-softmax output saved; at the loss
    # the logits and (16-bit logits) their fp32 copy; backward: two fp32 T x V gradients
    log_softmax = tokens * vocab * 4
    upcast = tokens * vocab * 4 if c < 4 else 0
    return log_softmax, log_softmax + upcast, 2 * tokens * vocab * 4


def hf_llama(vocab: int, tokens: int, compiled: bool) -> dict[str, Any]:
    """A tiny bf16 transformers Llama called with ``labels=``: dynamo's graphs and breaks (compiled), the
    saved tensors with a vocabulary dimension, forward peak / net and backward peak (bytes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * tokens,
                      tie_word_embeddings=False, attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (1, tokens))
    fn: Any = model
    out: dict[str, Any] = {}
    if compiled:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(input_ids=ids, labels=ids)
        out.update(graphs=explained.graph_count, breaks=explained.graph_break_count,
                   reasons=[str(b.reason) for b in explained.break_reasons])  # fmt: skip
        torch._dynamo.reset()
        fn = torch.compile(model)

    def forward() -> torch.Tensor:
        return fn(input_ids=ids, labels=ids).loss  # the output (and its logits) dropped, as a loop does

    forward().backward()
    model.zero_grad(set_to_none=True)
    saved: list[tuple[tuple[int, ...], str]] = []
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:  # activations with a vocabulary dimension, once per storage
        s = t.untyped_storage()
        if vocab in t.shape and s.data_ptr() not in params:
            params.add(s.data_ptr())
            saved.append((tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fwd_peak, fwd_net, loss = allocated(forward)
    bwd_peak, _, _ = allocated(lambda: loss.backward())
    out.update(saved=saved, forward_peak=fwd_peak, forward_net=fwd_net, backward_peak=bwd_peak,
               step_peak=max(fwd_peak, fwd_net + bwd_peak))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one shape")
    ap.add_argument("--hf", action="store_true", help="also the tiny transformers Llama, eager vs compiled")
    args = ap.parse_args(argv)
    shapes = [(512, 8000)] if args.quick else [(512, 8000), (1024, 32000), (2048, 4096)]
    print("cross_entropy(logits.float(), labels), bytes per logit (T x V); the logits themselves not counted")
    print(f"{'T x V':>12} {'dtype':5} {'mode':8} {'fwd peak':>9} {'kept':>7} {'bwd peak':>9} | "
          f"{'peakmem kept':>12} {'fwd':>6} {'bwd':>6} | saved")  # fmt: skip
    for t, v in shapes:
        for dtype in DTYPES:
            for compiled in (False, True):
                m = measure_ce(t, v, dtype, compiled)
                saved, fwd, bwd = formula(t, v, dtype, compiled)
                n = t * v
                mode = "compiled" if compiled else "eager"
                print(f"{t:5} x {v:<5} {dtype:5} {mode:8} {m.forward_peak / n:9.4f} {m.forward_net / n:7.4f} "
                      f"{m.backward_peak / n:9.4f} | {saved / n:12.4f} {fwd / n:6.2f} {bwd / n:6.2f} | "
                      f"{list(m.saved)}", flush=True)  # fmt: skip
    if args.hf:
        t, v = 256, 16000
        print(f"\ntransformers LlamaForCausalLM (2 layers, h 64, bf16), 1 x {t} tokens, vocab {v}, labels=; "
              "bytes per logit")  # fmt: skip
        for compiled in (False, True):
            r = hf_llama(v, t, compiled)
            n = t * v
            print(f"{'compiled' if compiled else 'eager':8} graphs {r.get('graphs', '-')} breaks "
                  f"{r.get('breaks', '-')} fwd peak {r['forward_peak'] / n:.3f} "
                  f"kept {r['forward_net'] / n:.3f} "
                  f"bwd peak {r['backward_peak'] / n:.3f} step peak {r['step_peak'] / n:.3f} "
                  f"({r['step_peak']:,} B) saved {r['saved']}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
