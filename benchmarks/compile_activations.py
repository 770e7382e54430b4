"""What torch.compile keeps for backward in one Llama decoder layer, measured on this CPU.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/compile_activations.py [--quick]``.

Builds one decoder layer from plain torch modules in two styles - ``torchtune`` (mirrors
torchtune/modules/rms_norm.py ``RMSNorm``, position_embeddings.py ``RotaryPositionalEmbeddings``,
attention.py ``MultiHeadAttention`` with k/v expanded to all heads, feed_forward.py ``FeedForward``,
transformer.py ``TransformerSelfAttentionLayer``) and ``hf`` (mirrors transformers' modeling_llama.py
``LlamaRMSNorm``, ``apply_rotary_pos_emb``, SDPA with ``enable_gqa``, ``LlamaMLP``) - runs its forward
in pure bf16 eagerly and under ``torch.compile`` (backend inductor, the default partitioner,
``min_cut_rematerialization_partition``), and counts the bytes that stay alive after the forward
(the CPU allocator's ``[memory]`` events, net, less the layer's output): what the layer saves for
backward. torchtune compiles each layer on its own (torchtune/training/_compile.py
``compile_model``: ``m.compile(backend=backend)`` per ``TransformerSelfAttentionLayer``), as here.

Prints bytes per token per layer, eager and compiled, for several widths and sequence lengths, and
the formula of ``peakmem.formulas.activations.compiled_layer_saved`` next to them.

Style ``gpt2`` is transformers' own ``GPT2Block`` (pre-LayerNorm, fused ``c_attn``, ``gelu_new`` MLP,
SDPA) in training mode with residual dropout 0.1 (``resid_pdrop``; attention dropout 0: with it the CPU
runs SDPA's math kernel, which a CUDA run of the flash kernel does not): the compiled LayerNorm block.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    inter: int
    batch: int
    seq: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class TTRMSNorm(nn.Module):
    """torchtune/modules/rms_norm.py RMSNorm (torchtune 0.4, 2024-11)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_fp32 = x.float()
        x_normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x_normed * self.scale).type_as(x)


class HFRMSNorm(nn.Module):
    """transformers modeling_llama.py LlamaRMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


def tt_rope(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """torchtune RotaryPositionalEmbeddings.forward: x [b, s, n_h, d], cache [s, d/2, 2] (fp32)."""
    s = x.size(1)
    xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
    rc = cache[:s].view(-1, xshaped.size(1), 1, xshaped.size(3), 2)
    x_out = torch.stack(
        [
            xshaped[..., 0] * rc[..., 0] - xshaped[..., 1] * rc[..., 1],
            xshaped[..., 1] * rc[..., 0] + xshaped[..., 0] * rc[..., 1],
        ],
        -1,
    )
    return x_out.flatten(3).type_as(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class Layer(nn.Module):
    def __init__(self, d: Dims, style: str) -> None:
        super().__init__()
        self.d, self.style = d, style
        norm = TTRMSNorm if style == "torchtune" else HFRMSNorm
        hd = d.head_dim
        self.n1, self.n2 = norm(d.hidden), norm(d.hidden)
        self.q = nn.Linear(d.hidden, d.heads * hd, bias=False)
        self.k = nn.Linear(d.hidden, d.kv_heads * hd, bias=False)
        self.v = nn.Linear(d.hidden, d.kv_heads * hd, bias=False)
        self.o = nn.Linear(d.heads * hd, d.hidden, bias=False)
        self.w1 = nn.Linear(d.hidden, d.inter, bias=False)
        self.w3 = nn.Linear(d.hidden, d.inter, bias=False)
        self.w2 = nn.Linear(d.inter, d.hidden, bias=False)
        theta = 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(d.seq).float(), theta)
        self.register_buffer("tt_cache", torch.stack([freqs.cos(), freqs.sin()], -1), persistent=False)
        emb = torch.cat((freqs, freqs), -1)
        self.register_buffer("cos", emb.cos()[None], persistent=False)
        self.register_buffer("sin", emb.sin()[None], persistent=False)

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        d = self.d
        b, s, _ = x.shape
        hd = d.head_dim
        q = self.q(x).view(b, s, -1, hd)
        k = self.k(x).view(b, s, -1, hd)
        v = self.v(x).view(b, s, -1, hd)
        if self.style == "torchtune":
            q = tt_rope(q, self.tt_cache).transpose(1, 2)
            k = tt_rope(k, self.tt_cache).transpose(1, 2)
            v = v.transpose(1, 2)
            rep = d.heads // d.kv_heads
            if rep > 1:  # torchtune attention.py: expand k, v to all heads before SDPA
                k = k.unsqueeze(2).expand(b, d.kv_heads, rep, s, hd).flatten(1, 2)
                v = v.unsqueeze(2).expand(b, d.kv_heads, rep, s, hd).flatten(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            cos, sin = self.cos[:, None, :s].to(x.dtype), self.sin[:, None, :s].to(x.dtype)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(out.transpose(1, 2).contiguous().view(b, s, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn(self.n1(x)) + x
        return h + self._mlp(self.n2(h))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _live_after(fn: Any, x: torch.Tensor) -> tuple[int, int]:
    """(bytes alive after ``fn(x)`` less its output, output bytes): the allocator's net events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(x)
    net = sum(
        e.nbytes()
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")
    )
    out_bytes = out.untyped_storage().nbytes()
    out.float().sum().backward()  # the saved tensors are usable: the backward runs
    return net - out_bytes, out_bytes


def saved_shapes(fn: Any, x: torch.Tensor, layer: nn.Module) -> list[tuple[tuple[int, ...], str, int]]:
    """The tensors ``fn(x)`` saves for backward (shape, dtype, bytes), one per storage, ``layer``'s
    parameters and buffers left out; its input shows as "layer input"."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    params |= {b.untyped_storage().data_ptr() for b in layer.buffers()}
    seen: dict[int, tuple[tuple[int, ...], str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr == x.untyped_storage().data_ptr():
            seen[ptr] = ((-1,), "layer input", t.untyped_storage().nbytes())
        elif ptr not in params:
            seen[ptr] = (tuple(t.shape), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return list(seen.values())


PRECISIONS = ("bf16", "fp32", "amp-bf16")  # peakmem's names: pure bf16, fp32, CPU autocast over fp32


GPT2_RESID_DROPOUT = 0.1


def gpt2_config(d: Dims) -> dict[str, Any]:
    """A transformers GPT-2 config.json of the block's dimensions (MHA, MLP 4 x hidden: ``d.inter``)."""
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": d.hidden, "n_head": d.heads,
        "n_inner": d.inter, "n_layer": 1, "vocab_size": 1024, "n_positions": 4096,
        "activation_function": "gelu_new", "resid_pdrop": GPT2_RESID_DROPOUT, "attn_pdrop": 0.0,
        "embd_pdrop": 0.0, "tie_word_embeddings": False,
    }  # fmt: skip


class GPT2Layer(nn.Module):
    """transformers' ``GPT2Block`` with SDPA, returning its hidden states (training mode: dropout on)."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        cfg = GPT2Config(**{k: v for k, v in gpt2_config(d).items() if k != "architectures"})
        cfg._attn_implementation = "sdpa"
        self.block = GPT2Block(cfg, layer_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out  # type: ignore[no-any-return]


def build(d: Dims, style: str, mode: str, precision: str) -> tuple[Any, torch.Tensor, nn.Module]:
    """(the callable forward, its input, the layer) for one case."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    layer = (GPT2Layer(d) if style == "gpt2" else Layer(d, style)).to(dtype).train()
    fn: Any = layer
    if mode != "eager":
        torch._dynamo.reset()
        fn = torch.compile(layer, backend=mode, dynamic=False)
    if precision == "amp-bf16":
        compiled = fn

        def fn(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return compiled(x)  # type: ignore[no-any-return]

    x = torch.randn(d.batch, d.seq, d.hidden, dtype=dtype, requires_grad=True)
    return fn, x, layer


def measure(d: Dims, style: str, mode: str, precision: str = "bf16") -> int:
    """Bytes one layer keeps from forward to backward (its input and output not counted); ``mode`` is
    "eager" or a torch.compile backend ("inductor")."""
    fn, x, layer = build(d, style, mode, precision)
    _live_after(fn, x)  # warm-up: compile, first-call caches
    layer.zero_grad(set_to_none=True)
    saved, _ = _live_after(fn, x)
    return saved


GRID = (
    Dims(hidden=128, heads=2, kv_heads=1, inter=352, batch=1, seq=64),
    Dims(hidden=256, heads=4, kv_heads=2, inter=704, batch=1, seq=64),
    Dims(hidden=256, heads=4, kv_heads=2, inter=704, batch=2, seq=128),
    Dims(hidden=384, heads=6, kv_heads=2, inter=1024, batch=1, seq=128),
    Dims(hidden=512, heads=8, kv_heads=2, inter=1408, batch=1, seq=96),
)


def llama_config(d: Dims) -> dict[str, Any]:
    """A transformers Llama config.json of the layer's dimensions (for peakmem's formulas)."""
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": d.hidden,
        "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads, "intermediate_size": d.inter,
        "num_hidden_layers": 1, "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_dropout": 0.0, "rope_theta": 500000.0,
    }  # fmt: skip


def formula(d: Dims, style: str, compiled: bool, precision: str = "bf16") -> tuple[int, int]:
    """peakmem's (saved bytes of one layer less its input when kept, the kept input's bytes)."""
    from peakmem.formulas import activations as act
    from peakmem.hf import spec_from_config
    from peakmem.training import Framework, KernelPolicy, Precision, TrainingSetup

    spec = spec_from_config(gpt2_config(d) if style == "gpt2" else llama_config(d))
    setup = TrainingSetup(
        precision=Precision(precision), micro_batch=d.batch, seq_len=d.seq,
        framework=Framework("hf" if style == "gpt2" else style),
        compiled=compiled, kernel_policy=KernelPolicy.CPU,
    )  # fmt: skip
    la = act.layer_activations(spec, spec.groups[0].layer, act.shapes(spec, setup))
    return la.saved_bytes - la.input_saved, la.input_saved


def cases(quick: bool, styles: list[str]) -> list[tuple[str, str, Dims]]:
    """(style, precision, dims): every shape in bf16 and fp32, two in amp-bf16 (transformers style)."""
    grid = GRID[:2] if quick else GRID
    out = [(st, p, d) for st in styles for p in (("bf16",) if quick else ("bf16", "fp32")) for d in grid]
    if not quick and "hf" in styles:
        out += [("hf", "amp-bf16", d) for d in GRID[1:3]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="two shapes, bf16 only")
    ap.add_argument("--style", default="torchtune,hf,gpt2")
    ap.add_argument("--show", action="store_true", help="list the saved tensors (eager and compiled)")
    args = ap.parse_args(argv)
    print("bytes per token per layer kept from forward to backward (input and output not counted)")
    print(f"{'style':9} {'precision':9} {'h':>4} {'a/g':>5} {'I':>5} {'b x s':>7} {'mode':8} "
          f"{'measured':>9} {'peakmem':>9} {'error':>7}")  # fmt: skip
    worst = 0.0
    for style, precision, d in cases(args.quick, args.style.split(",")):
        for mode in ("eager", "inductor"):
            measured = measure(d, style, mode, precision)
            predicted, _ = formula(d, style, mode != "eager", precision)
            t = d.batch * d.seq
            err = predicted / measured - 1
            worst = max(worst, abs(err))
            print(f"{style:9} {precision:9} {d.hidden:4} {d.heads:2}/{d.kv_heads:<2} {d.inter:5} "
                  f"{d.batch:2}x{d.seq:<4} {mode:8} {measured / t:9.1f} {predicted / t:9.1f} {err:+7.2%}",
                  flush=True)  # fmt: skip
            if args.show:
                fn, x, layer = build(d, style, mode, precision)
                print("  saved:", saved_shapes(fn, x, layer))
    print(f"worst {worst:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
