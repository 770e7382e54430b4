"""CPU check of formulas/serving/litgpt.py: a tiny Lit-GPT (lit_gpt/model.py@982abcbc: lm_head registered
before the transformer, fused qkv, LLaMAMLP, a KVCache preallocated for prompt + new tokens, grouped-query
K/V expanded to every head) loaded and run as generate/base.py does under Lightning's BitsandbytesPrecision,
under peakmem's storage tracker; each phase's peak against ``peakmem.infer(..., engine="litgpt")``.

What runs as on the GPU, and what is replicated (bitsandbytes 0.50.2 on the CPU):
* 4-bit: the real ``F.quantize_4bit`` of ``weight.to(torch.half)`` (Lightning
  ``_Linear4bit._quantize_weight``) and, for more than one row, bitsandbytes 0.41.1's ``MatMul4Bit.forward``:
  ``F.linear(A, F.dequantize_4bit(B, state).to(A.dtype))``; one row takes ``gemv_4bit`` on CUDA, a kernel that
  writes only its output: replicated by an output tensor of that shape (the CPU backend dequantizes instead).
* int8: bitsandbytes 0.41.1's CUDA ``double_quant`` writes ``CB`` / ``CBt`` (int8) and fp32 row / column
  scales; the first forward's ``F.transform(CB, col_ampere)`` writes ``CxB`` before ``CB`` is deleted; the
  igemmlt path quantizes the input (``CA``, ``CAt``, fp32 scales), an int32 ``out32`` and the fp16 output:
  replicated with ``torch.empty`` of those shapes and dtypes (no int8 CUDA kernels on the CPU).
* The checkpoint (a bf16 state dict) is made before the tracker starts: on the GPU it stays in CPU RAM.

Run: PYTHONPATH=src python benchmarks/litgpt_generate_cpu.py
Measured (torch 2.13 CPU, bitsandbytes 0.50.2; vocab 4096, hidden 256, 2 layers, 4 heads x 64, 2 groups,
MLP 512, prompt 5 + 8 new tokens), measured vs formula: nf4 load 6,040,900 vs 6,041,088 B (+0.00 %), prefill
7,613,026 vs 7,644,009 (+0.41 %), decode 3,441,606 vs 3,422,057 (-0.57 %); int8 load 8,572,416 vs 8,572,416
(0.00 %, the peak), prefill 5,600,694 vs 5,588,137 (-0.22 %), decode 4,448,518 vs 4,428,713 (-0.45 %). The
int8 rows check which tensors are alive together (the kernels' outputs replicated), not bitsandbytes' kernels.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import warnings
from pathlib import Path

import bitsandbytes.functional as F
import torch

import peakmem
from peakmem.breakdown import Phase
from peakmem.measure.tracker import LiveStorageTracker

warnings.simplefilter("ignore")

V, C, L, NH, HS, G, INTER, PROMPT, NEW = 4096, 256, 2, 4, 64, 2, 512, 5, 8
CTX = PROMPT + NEW


class QLinear:
    """A Linear as Fabric's plugin leaves it: 4-bit (packed + QuantState of fp16) or int8 (CB + SCB)."""

    def __init__(self, out_f: int, in_f: int, mode: str, dtype: torch.dtype) -> None:
        self.out_f, self.in_f, self.mode = out_f, in_f, mode
        # init_module(empty_init=True) on the device: nn.Linear's weight in the precision's dtype, quantized
        self.quantize(torch.empty(out_f, in_f, dtype=dtype))
        self.cxb: torch.Tensor | None = None

    def quantize(self, weight: torch.Tensor) -> None:
        w = weight.contiguous().to(dtype=torch.half)
        if self.mode == "int8":  # bitsandbytes 0.41.1 double_quant's outputs
            cb = torch.empty(self.out_f, self.in_f, dtype=torch.int8)
            cbt = torch.empty(self.out_f, self.in_f, dtype=torch.int8)
            scb = torch.empty(self.out_f, dtype=torch.float32)
            scbt = torch.empty(self.in_f, dtype=torch.float32)
            del cbt, scbt, w
            self.cb, self.scb = cb, scb
            return
        self.packed, self.state = F.quantize_4bit(w, blocksize=64, quant_type=self.mode)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.mode == "int8":
            if self.cxb is None:  # first forward: CxB (col_ampere) written while CB is alive, then CB deleted
                self.cxb = torch.empty_like(self.cb)
            a = x.reshape(rows, -1).to(torch.float16)
            ca, cat = torch.empty_like(a, dtype=torch.int8), torch.empty_like(a, dtype=torch.int8)
            sca, scat = torch.empty(rows, dtype=torch.float32), torch.empty(self.in_f, dtype=torch.float32)
            out32 = torch.empty(rows, self.out_f, dtype=torch.int32)
            out = torch.zeros(rows, self.out_f, dtype=torch.float16)
            del ca, cat, sca, scat, out32, a
            self.cb = self.cxb  # Linear8bitLt.forward: del state.CB; weight.data = state.CxB
            return out.view(*x.shape[:-1], self.out_f).to(x.dtype)
        if rows == 1:  # gemv_4bit: the output only
            return torch.zeros(*x.shape[:-1], self.out_f, dtype=x.dtype)
        return torch.nn.functional.linear(x, F.dequantize_4bit(self.packed, self.state).to(x.dtype))


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * w


def run(mode: str) -> dict[Phase, int]:
    dtype = torch.float16 if mode == "int8" else torch.bfloat16
    torch.manual_seed(0)
    names = ["lm_head"] + [f"h.{i}.{n}" for i in range(L) for n in ("attn", "proj", "fc_1", "fc_2", "mproj")]
    shapes = {"lm_head": (V, C)}
    for i in range(L):
        shapes |= {f"h.{i}.attn": ((NH + 2 * G) * HS, C), f"h.{i}.proj": (C, NH * HS),
                   f"h.{i}.fc_1": (INTER, C), f"h.{i}.fc_2": (INTER, C),
                   f"h.{i}.mproj": (C, INTER)}  # fmt: skip
    ckpt = {n: torch.randn(*shapes[n], dtype=torch.bfloat16) * 0.02 for n in names}  # CPU RAM on a GPU host
    tr = LiveStorageTracker(device_type="cpu")
    gc.collect()
    gc.disable()
    with tr:
        tr.set_phase(Phase.LOAD, 0)
        lin = {n: QLinear(*shapes[n], mode, dtype) for n in names}  # lm_head first (registered first)
        wte = torch.zeros(V, C, dtype=dtype)  # (load_state_dict copies into it: no new storage)
        norms = [torch.ones(C, dtype=dtype) for _ in range(2 * L + 1)]
        for n in names:  # load_state_dict: _quantize_on_load_hook per Linear, module order
            lin[n].quantize(ckpt[n])
        tr.set_phase(Phase.PREFILL, 1)
        # max_seq_length = CTX: RoPE cos/sin; set_kv_cache: K/V zeros (expanded to NH heads) + the bool mask
        cos, sin = torch.ones(CTX, HS, dtype=dtype), torch.zeros(CTX, HS, dtype=dtype)
        cache = [tuple(torch.zeros(1, NH, CTX, HS, dtype=dtype) for _ in "kv") for _ in range(L)]
        mask_cache = torch.tril(torch.ones(CTX, CTX, dtype=torch.bool)).unsqueeze(0).unsqueeze(0)
        idx = torch.zeros(CTX, dtype=torch.int64)
        input_pos = torch.arange(0, PROMPT)
        for step in range(NEW):
            if step == 1:
                tr.set_phase(Phase.DECODE, 1)
            x_ids = idx.index_select(0, input_pos).view(1, -1)
            T = x_ids.size(1)
            c, s_ = cos.index_select(0, input_pos), sin.index_select(0, input_pos)
            mask = mask_cache.index_select(2, input_pos)
            x = torch.nn.functional.embedding(x_ids, wte)
            for i in range(L):
                n1 = rms(x, norms[2 * i])
                qkv = lin[f"h.{i}.attn"](n1).view(1, T, G, NH // G + 2, HS).permute(0, 2, 3, 1, 4)
                q, k, v = qkv.split((NH // G, 1, 1), dim=2)
                k, v = k.expand(1, G, NH // G, T, HS), v.expand(1, G, NH // G, T, HS)
                q, k, v = (t.reshape(1, -1, T, HS) for t in (q, k, v))
                q, k = q * c + q * s_, k * c + k * s_  # apply_rope's new tensors (values irrelevant)
                kc = cache[i][0].index_copy_(2, input_pos, k)
                vc = cache[i][1].index_copy_(2, input_pos, v)
                y = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
                h = lin[f"h.{i}.proj"](y.transpose(1, 2).reshape(1, T, C))
                x = x + h
                n2 = rms(x, norms[2 * i + 1])
                m = torch.nn.functional.silu(lin[f"h.{i}.fc_1"](n2)) * lin[f"h.{i}.fc_2"](n2)
                x = x + lin[f"h.{i}.mproj"](m)
            logits = lin["lm_head"](rms(x, norms[-1]))  # every position's logits
            last = logits[0, -1] / 0.8
            v_top, _ = torch.topk(last, 200)
            last = torch.where(last < v_top[[-1]], -float("Inf"), last)
            probs = torch.softmax(last.float(), dim=-1).to(dtype)
            nxt = torch.argmax(probs.nan_to_num(), dim=-1, keepdim=True)  # multinomial's one index
            input_pos = input_pos[-1:] + 1
            idx = idx.index_copy(0, input_pos, nxt)
            del logits, last, probs, x
    gc.enable()
    return {s.phase: s.bytes for s in tr.ledger.peaks()}


def estimate(mode: str) -> dict[Phase, int]:
    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=C, intermediate_size=INTER,
               num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=G, head_dim=HS, vocab_size=V,
               max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
               torch_dtype="bfloat16")  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(cfg))
        weights = {"nf4": "nf4", "fp4": "fp4", "int8": "int8"}[mode]
        r = peakmem.infer(str(path), weights=weights, engine="litgpt", prompt=PROMPT, context=CTX,
                          engine_version="0.0").to_dict()  # fmt: skip
    return {Phase(k): v for k, v in r["phases"].items()}


def main() -> None:
    modes = sys.argv[1:] or ["nf4", "int8"]
    print("| weights | phase | measured B | formula B | error |\n|---|---|---:|---:|---:|")
    for mode in modes:
        got, want = run(mode), estimate(mode)
        for phase in (Phase.LOAD, Phase.PREFILL, Phase.DECODE):
            g, w = got.get(phase, 0), want.get(phase, 0)
            print(f"| {mode} | {phase.value} | {g:,} | {w:,} | {(w - g) / g * 100:+.2f} % |")


if __name__ == "__main__":
    main()
