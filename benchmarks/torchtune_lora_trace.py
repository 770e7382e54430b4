"""torchtune@ff594c231's LoRA recipe replayed through peakmem's caching-allocator model (the tutorial points).

benchmarks/published_scale.json's ``torchtune-tutorial-lora-llama2-7b-*`` points (torchtune's LoRA tutorial,
2024-04-15: ``max_memory_reserved`` of ``recipes/lora_finetune_single_device.py``) read ~1.3 GB above
peakmem. This script runs that release's own model code and the recipe's loop body at full size on the
meta device (no memory, no compute), records every storage it allocates and frees, in order, and replays
them through :class:`peakmem.formulas.caching_allocator.CachingAllocatorModel`:

* the model build (``with set_default_dtype(bf16), device: lora_llama2_7b(...)``; the checkpoint loads
  in place from CPU tensors): the template layer that ``_get_clones`` deep-copies, and one RoPE cache per
  layer; the tutorial prints 13.96 GB allocated, 13.98 GB reserved after model init;
* each micro-batch as the loop runs it: ``logits = model(tokens)``; ``logits[..., :-1, :].contiguous()``;
  ``.transpose(1, 2)``; ``CrossEntropyLoss``; ``loss.backward()`` with ``logits`` still bound; AdamW
  (foreach) and ``zero_grad(set_to_none=True)`` every ``--accum`` micro-batches;
* SDPA as CUDA runs it for bf16, causal, no mask, head_dim 128 (the flash kernel: output and fp32
  logsumexp; the meta device would take the math path and build fp32 scores).

Sequence lengths: ``--seqs 512,512,...`` or ``--dist uniform:LO:HI:N`` / ``lognorm:MU:SIGMA:N`` (each sample's
length drawn, the batch padded to its longest, capped at the dataset's 512). The dataset itself
(alpaca-cleaned) is not read here, so a distribution is an assumption, echoed in the output.

Setup (torchtune 0.1.x imports omegaconf, sentencepiece and a torchao of its time; the model code needs
none of them, so they are stubbed)::

    git -C <torchtune clone> archive ff594c231 torchtune | tar -x -C /tmp/tt
    PYTHONPATH=src:/tmp/tt .venv/bin/python benchmarks/torchtune_lora_trace.py --dist lognorm:5.1:0.55:120

About 1-2 s per micro-batch on one core.
"""

from __future__ import annotations

import argparse
import random
import sys
import types
import weakref
from typing import Any

GB = 1e9
MAX_SEQ = 512  # torchtune@ff594c231 datasets/_alpaca.py alpaca_cleaned_dataset(max_seq_len=512)


def _stub_imports() -> None:
    """Modules torchtune@ff594c231's package imports but its model code does not use."""
    for name in ("omegaconf", "sentencepiece", "datasets", "pkg_resources"):
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
    sys.modules["omegaconf"].DictConfig = dict  # type: ignore[attr-defined]
    sys.modules["omegaconf"].OmegaConf = object  # type: ignore[attr-defined]
    sys.modules["sentencepiece"].SentencePieceProcessor = object  # type: ignore[attr-defined]
    sys.modules["datasets"].load_dataset = None  # type: ignore[attr-defined]
    import packaging.version

    sys.modules["pkg_resources"].packaging = packaging  # type: ignore[attr-defined]
    nf4 = types.ModuleType("torchao.dtypes.nf4tensor")
    for attr in ("NF4Tensor", "linear_nf4", "to_nf4"):
        setattr(nf4, attr, object)
    nf4.implements = lambda *a, **k: lambda f: f  # type: ignore[attr-defined]
    sys.modules["torchao.dtypes.nf4tensor"] = nf4
    quant = types.ModuleType("torchao.quantization.quant_api")
    for attr in (
        "apply_weight_only_int8_quant",
        "Int4WeightOnlyGPTQQuantizer",
        "Int4WeightOnlyQuantizer",
        "Quantizer",
    ):
        setattr(quant, attr, object)
    sys.modules["torchao.quantization.quant_api"] = quant


def _lengths(args: argparse.Namespace) -> list[int]:
    if not args.dist:
        return [int(s) for s in args.seqs.split(",")]
    kind, p1, p2, n = args.dist.split(":")
    rng = random.Random(0)

    def one() -> int:
        if kind == "uniform":
            return rng.randint(int(p1), int(p2))
        return max(8, int(rng.lognormvariate(float(p1), float(p2))))

    return [min(MAX_SEQ, max(one() for _ in range(args.batch))) for _ in range(int(n))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="the tutorial's 'all layers' (attention, MLP, output)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--accum", type=int, default=64)
    ap.add_argument("--seqs", default="512,512,512")
    ap.add_argument("--dist", default=None)
    args = ap.parse_args()
    _stub_imports()
    import torch
    import torchtune.modules.attention as tt_attention
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torchtune import modules, utils
    from torchtune.models.llama2._component_builders import lora_llama2
    from torchtune.modules.peft.peft_utils import get_adapter_params, set_trainable_params

    from peakmem.formulas.caching_allocator import CachingAllocatorModel

    def flash(
        q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False
    ) -> Any:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal)[0]

    tt_attention.nn.functional.scaled_dot_product_attention = flash

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.alloc = CachingAllocatorModel()
            self.keys: dict[int, int] = {}
            self.live = self.peak_live = self.peak_res = self.sids = 0

        def _free(self, key: int, sid: int, n: int) -> None:
            self.keys.pop(key, None)
            self.alloc.free(sid)
            self.live -= n

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "meta":
                    st = t.untyped_storage()
                    if id(st) in self.keys:
                        continue
                    self.sids += 1
                    n, sid = st.nbytes(), self.sids
                    self.keys[id(st)] = sid
                    if n:
                        self.alloc.malloc(sid, n)
                        self.live += n
                    weakref.finalize(st, self._free, id(st), sid, n).atexit = False
                    self.peak_live = max(self.peak_live, self.live)
                    self.peak_res = max(self.peak_res, self.alloc.reserved)
            return out

    rec = Recorder()
    attn = ["q_proj", "k_proj", "v_proj", "output_proj"] if args.all else ["q_proj", "v_proj"]
    with rec, utils.set_default_dtype(torch.bfloat16), torch.device("meta"):
        # torchtune@ff594c231 models/llama2/_model_builders.py lora_llama2_7b (attention LoRA dropout 0.05)
        model = lora_llama2(
            attn, apply_lora_to_mlp=args.all, apply_lora_to_output=args.all, vocab_size=32_000, num_layers=32,
            num_heads=32, num_kv_heads=32, embed_dim=4096, max_seq_len=4096, lora_rank=args.rank,
            lora_alpha=2 * args.rank, lora_dropout=0.05,
        )  # fmt: skip
    print(f"model init: allocated peak {rec.peak_live / GB:.3f} GB, reserved {rec.peak_res / GB:.3f} GB")
    set_trainable_params(model, get_adapter_params(model))
    utils.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerDecoderLayer})
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    seqs = _lengths(args)
    print(f"lengths: {args.dist or 'fixed'} (mean {sum(seqs) / len(seqs):.0f}, max {max(seqs)})")
    with rec:
        for idx, s in enumerate(seqs):
            tokens = torch.zeros(args.batch, s, dtype=torch.long, device="meta")
            labels = torch.zeros(args.batch, s, dtype=torch.long, device="meta")
            logits = model(tokens)
            logits = logits[..., :-1, :].contiguous()
            labels = labels[..., 1:].contiguous()
            logits = logits.transpose(1, 2)
            loss = loss_fn(logits, labels) / args.accum
            loss.backward()
            if (idx + 1) % args.accum == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
            if (idx + 1) % 20 == 0 or idx + 1 == len(seqs):
                print(f"micro-batch {idx + 1}: allocated peak {rec.peak_live / GB:.3f} GB, "
                      f"reserved {rec.peak_res / GB:.3f} GB", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
