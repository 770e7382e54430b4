"""A tiny GQA Llama trained for real on the CPU against peakmem's formulas: does transformers' SDPA path
repeat k/v to every head (``repeat_kv``) under the installed release, with and without a padding mask?

(table: see below, filled in after the run)

Run it with the project's venv (5.x) or a transformers 4.x venv beside it, e.g. ``PYTHONPATH=src
/tmp/tf4-venv/bin/python benchmarks/sdpa_repeat_kv.py --pad``. Not a test; nothing imports it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_loop_4x import _shim_4x

LAYERS, HIDDEN, HEADS, KV_HEADS, INTER, VOCAB, BATCH = 2, 256, 8, 2, 512, 256, 2
PAD_FRACTION = 4  # --pad: the batch's last row is padded over its last 1/PAD_FRACTION of positions


def _pad_batches() -> None:
    """Make peakmem.measure's batches carry an attention mask whose last row ends in padding (labels -100
    there), as a collator padding to the batch's longest sample gives."""
    import torch

    from peakmem.measure import runner

    make = runner.make_batch

    def padded(model: Any, setup: Any, dev: Any, gen: Any) -> dict[str, Any]:
        batch = make(model, setup, dev, gen)
        mask = torch.ones_like(batch["input_ids"])
        mask[-1, -(setup.seq_len // PAD_FRACTION) :] = 0
        labels = batch["input_ids"].masked_fill(mask == 0, -100)
        return {**batch, "attention_mask": mask, "labels": labels}

    runner.make_batch = padded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--pad", action="store_true", help="padded batches (--padded-lengths varying)")
    args = ap.parse_args(argv)
    _shim_4x()
    import transformers

    from peakmem.adapters import LoraConfig
    from peakmem.estimate import estimate_training
    from peakmem.hf import spec_from_config
    from peakmem.measure import measure_training
    from peakmem.measure.parity import FAMILIES
    from peakmem.training import (
        Checkpointing,
        KernelPolicy,
        Method,
        PaddedLengths,
        Precision,
        TrainingSetup,
    )

    if args.pad:
        _pad_batches()
    config = {
        **FAMILIES["llama"], "num_hidden_layers": LAYERS, "hidden_size": HIDDEN, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "intermediate_size": INTER, "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
    }  # fmt: skip
    version = transformers.__version__
    lengths = PaddedLengths.VARYING if args.pad else PaddedLengths.FIXED
    print(f"transformers {version}: tiny Llama {HEADS} heads / {KV_HEADS} kv, batch {BATCH}, {lengths.value}")
    print("| method | checkpointing | seq | measured peak B | formulas B | error |")
    print("|---|---|---:|---:|---:|---:|")
    lora = LoraConfig(rank=16, alpha=16, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    for method in (Method.LORA, Method.FULL):
        for ckpt in (Checkpointing.NONE, Checkpointing.FULL):
            for seq in args.seq:
                extra: dict[str, Any] = {"lora": lora} if method is Method.LORA else {}
                setup = TrainingSetup(
                    kernel_policy=KernelPolicy.CPU, precision=Precision.BF16, micro_batch=BATCH, seq_len=seq,
                    checkpointing=ckpt, transformers=version, method=method, padded_lengths=lengths, **extra,
                )  # fmt: skip
                got = measure_training(config, setup).peak_allocated_bytes
                est = estimate_training(spec_from_config(config), setup).peak_allocated_bytes
                print(f"| {method.value} | {ckpt.value} | {seq} | {got:,} | {est:,} | {est / got - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
