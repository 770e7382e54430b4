"""transformers' own ``caching_allocator_warmup`` against peakmem's warm-up block
(src/peakmem/formulas/serving/hf_load.py), per release, on tiny meta models: no GPU needed.

Each child runs under another venv's transformers (``--python``, e.g. venvs with torch 2.13 CPU and
transformers 4.53.3 / 4.57.1 / 5.23.0, accelerate and bitsandbytes 0.50.2): it builds a tiny Llama on
the meta device (hidden 64, 2 layers, vocab 1000 or 32, bf16; its head tied or not), lets the release's own
bitsandbytes quantizer rewrite the Linears where asked (``preprocess_model``, as from_pretrained does
before the warm-up), expands ``device_map={"": "cuda:0"}`` over the state dict's keys as
``_load_pretrained_model`` does, and calls the release's ``caching_allocator_warmup`` with
``torch.cuda``'s memory queries answered (80 GiB free, nothing reserved) and ``torch.empty`` recording
what it is asked on the GPU. The parent computes peakmem's block for the same spec and release and
prints both.

Measured 2026-12-07 (torch 2.13 CPU, accelerate 1.16.0, bitsandbytes 0.50.2): all 42 rows (3 releases x
vocab 1000 / 32 x tied / untied x bf16 / nf4 / int8, and 4.53.3 / 4.57.1's tied vocab-1000 rows again on a
device with 1.2 GiB + 100,000 B free, marked *, where the cap binds: 99,998 B bf16, 49,998 B nf4 / int8
either side) equal, block and bytes beyond the weights; the rows
with a block beyond the weights (tf: transformers, pm: peakmem; the rest: none either side, 5.x's blocks
the weights' own quantized size):

    release vocab head   weights   tf block   pm block pm weights  beyond tf  beyond pm
    4.53.3   1000 tied   bf16       404,096    404,096    276,096    128,000    128,000
    4.53.3   1000 tied   nf4        202,048    202,048    171,008     31,040     31,040
    4.53.3     32 tied   bf16       156,288    156,288    152,192      4,096      4,096
    4.53.3     32 tied   nf4         78,144     78,144     47,104     31,040     31,040
    4.53.3     32 untied nf4         78,144     78,144     51,200     26,944     26,944
    4.57.1     32 tied   nf4         76,096     76,096     47,104     28,992     28,992
    4.57.1     32 untied nf4         76,096     76,096     51,200     24,896     24,896

Not a test (it needs the extra venvs); tests/test_hf_load_warmup.py holds the formula's hand-derived values.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
VOCABS = (1000, 32)  # embeddings the largest tensor (a tied head's double count shows) / the Linears the bulk
WEIGHTS = ("bf16", "nf4", "int8")
# a device with 1.2 GiB + 100,000 B free: the v4.52+ cap (free less 1.2 GiB) binds on every tiny block
CAPPED_FREE = int(1.2 * 2**30) + 100_000


def _child(vocab: int, tied: bool, weights: str, free: int = 80 << 30) -> dict[str, Any]:
    import torch
    import transformers
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig
    from transformers import modeling_utils as mu
    from transformers.quantizers import AutoHfQuantizer

    cfg = LlamaConfig(**TINY, vocab_size=vocab, tie_word_embeddings=tied, torch_dtype="bfloat16")
    torch.set_default_dtype(torch.bfloat16)  # from_pretrained's dtype context around init and preprocess
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(cfg)
    quantizer = None
    if weights != "bf16":
        qc = BitsAndBytesConfig(load_in_4bit=weights == "nf4", load_in_8bit=weights == "int8",
                                bnb_4bit_quant_type="nf4")  # fmt: skip
        quantizer = AutoHfQuantizer.from_config(qc, pre_quantized=False)
        try:
            quantizer.preprocess_model(model, device_map={"": "cuda:0"}, keep_in_fp32_modules=[])
        except TypeError:  # 5.x takes the dtype too
            quantizer.preprocess_model(
                model, device_map={"": "cuda:0"}, keep_in_fp32_modules=[], dtype=torch.bfloat16
            )
    torch.set_default_dtype(torch.float32)
    keys = list(model.state_dict().keys())
    if quantizer is not None and hasattr(quantizer, "update_expected_keys"):  # gone in 5.x
        keys = quantizer.update_expected_keys(model, keys, keys)
    expanded = mu.expand_device_map({"": "cuda:0"}, keys)
    asked: list[int] = []
    real_empty = torch.empty

    def empty(*size: Any, **kw: Any) -> Any:
        device = kw.get("device")
        if device is not None and str(device) not in ("cpu", "meta"):
            dtype = kw.get("dtype") or torch.get_default_dtype()
            numel = int(size[0]) if len(size) == 1 and not isinstance(size[0], (tuple, list)) else 0
            asked.append(numel * torch.tensor([], dtype=dtype).element_size())
            kw["device"] = "meta"
        return real_empty(*size, **kw)

    cuda = torch.cuda
    patches = {
        "mem_get_info": lambda *a, **k: (free, 80 << 30),
        "memory_reserved": lambda *a, **k: 0,
        "memory_allocated": lambda *a, **k: 0,
        "current_device": lambda: 0,
    }
    saved = {name: getattr(cuda, name) for name in patches}
    for name, fn in patches.items():
        setattr(cuda, name, fn)
    torch.empty = empty  # type: ignore[assignment]
    try:
        mu.caching_allocator_warmup(model, expanded, quantizer)
    finally:
        torch.empty = real_empty  # type: ignore[assignment]
        for name, fn in saved.items():
            setattr(cuda, name, fn)
    release = transformers.__version__
    row = {"release": release, "vocab": vocab, "tied": tied, "weights": weights, "block": sum(asked)}
    return {**row, "free": free if free != 80 << 30 else None}


def _peakmem_row(row: dict[str, Any]) -> tuple[int, int]:
    from peakmem.formulas.serving.context import CUDA_CONTEXT_BYTES, resolve_context, weights_item
    from peakmem.formulas.serving.hf_load import warmup_block_bytes
    from peakmem.formulas.weights import weight_rows
    from peakmem.hf import spec_from_config
    from peakmem.inference import Engine, InferenceSetup

    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
           "rms_norm_eps": 1e-5, "tie_word_embeddings": row["tied"], "vocab_size": row["vocab"],
           **TINY}  # fmt: skip
    spec = spec_from_config(cfg, name="tiny-llama")
    major, minor = row["release"].split(".")[:2]
    setup = InferenceSetup(engine=Engine.HF, engine_version=f"{major}.{minor}", batch=1, context=32,
                           prompt=16, weights=row["weights"],
                           gpu_bytes=row["free"] + CUDA_CONTEXT_BYTES if row["free"] else None)  # fmt: skip
    weights = weights_item(resolve_context(spec, setup), weight_rows(spec, setup.weight_format))
    return warmup_block_bytes(spec, setup), weights.bytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", default=[], help="a venv's python with its transformers")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        rows = [_child(v, tied, w) for v in VOCABS for tied in (True, False) for w in WEIGHTS]
        if int(rows[0]["release"].split(".")[0]) < 5:  # 5.x: the block is the weights' own size, not modelled
            rows += [_child(VOCABS[0], True, w, free=CAPPED_FREE) for w in WEIGHTS]
        print(json.dumps(rows))
        return 0
    print(f"{'release':8} {'vocab':>5} {'head':6} {'weights':7} {'block (transformers)':>20} "
          f"{'block (peakmem)':>15} {'weights (peakmem)':>17} "
          f"{'beyond (tf)':>11} {'beyond (pm)':>11}")  # fmt: skip
    for python in args.python:
        out = subprocess.run([python, __file__, "--child"], capture_output=True, text=True, check=True)
        for row in json.loads(out.stdout.strip().splitlines()[-1]):
            ours, weights = _peakmem_row(row)
            head = ("tied" if row["tied"] else "untied") + ("*" if row["free"] else "")
            shown = f"{ours:,}" if ours else "-"  # 0: no block modelled (5.x: the weights' own size)
            beyond_tf, beyond_pm = max(0, row["block"] - weights), max(0, ours - weights)
            print(f"{row['release']:8} {row['vocab']:>5} {head:6} {row['weights']:7} {row['block']:>20,} "
                  f"{shown:>15} {weights:>17,} {beyond_tf:>11,} {beyond_pm:>11,}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
