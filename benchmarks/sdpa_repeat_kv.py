"""A tiny GQA Llama trained for real on the CPU against peakmem's formulas: does transformers' SDPA path
repeat k/v to every head (``repeat_kv``) under the installed release, with and without a padding mask?

Before 4.54.0 ``sdpa_attention_forward`` calls ``repeat_kv`` on every call (4.48.1-4.53.0
integrations/sdpa_attention.py), from 4.54.0 only where the call passes a mask (``use_gqa_in_sdpa``); a batch
with padding passes one (masking_utils' boolean mask, made additive by SDPA at each call, from 4.53.0; one
additive mask in the model's dtype before): peakmem.transformers_versions.sdpa_repeats_kv,
peakmem.formulas.profiles.profile_of. The job: Llama with 2 layers, hidden 256, 8 heads / 2 KV heads, MLP 512,
vocab 256, batch 2, bf16, CPU kernels, LoRA (r16 on q/k/v/o, no dropout) or full, checkpointing none or
full; ``--pad`` gives the batch's last row a padded last quarter (``--padded-lengths varying``).
``peakmem.measure`` (real steps, live-storage tracker) against ``estimate_training``. Error = formulas /
measured - 1 at seq 256 / 1024, before (main 2f95ae1: no repeat for any release, no padding mask) and
after, measured 2026-12-07 (torch 2.13 CPU; transformers 4.48.1 + peft 0.13.2, and 5.23.0):

    release  batches  method  ckpt   before              after               + final norm (lead)
    4.48.1   fixed    lora    none   -8.9 / -10.3 %      -4.5 / -5.1 %       +0.0 / +0.0 %
    4.48.1   fixed    lora    full   -3.2 / -4.3 %       +0.2 / +0.0 %       +0.2 / +0.0 %
    4.48.1   fixed    full    none   -7.8 / -9.9 %       -4.2 / -5.1 %       -1.8 / -1.8 %
    4.48.1   fixed    full    full   -4.1 / -7.0 %       -1.6 / -2.8 %       -1.6 / -2.8 %
    4.48.1   padded   lora    none   -10.3 / -16.1 %     -4.4 / -4.9 %       -0.0 / -0.0 %
    4.48.1   padded   lora    full   -5.5 / -14.2 %      +0.1 / -0.0 %       +0.1 / -0.0 %
    4.48.1   padded   full    none   -8.9 / -15.5 %      -4.2 / -4.8 %       -1.8 / -1.8 %
    4.48.1   padded   full    full   -5.7 / -16.4 %      -1.7 / -2.6 %       -1.7 / -2.6 %
    5.23.0   fixed    lora    none   -6.2 / -7.2 %       (unchanged)         +0.0 / +0.0 %
    5.23.0   fixed    lora    full   +0.2 / +0.0 %       (unchanged)         +0.2 / +0.0 %
    5.23.0   fixed    full    none   -3.2 / -3.7 %       (unchanged)         +0.6 / +1.6 %
    5.23.0   fixed    full    full   -0.0 / -0.0 %       (unchanged)         -0.0 / -0.0 %
    5.23.0   padded   lora    none   -13.0 / -22.7 %     -5.8 / -6.1 %       -0.0 / -0.0 %
    5.23.0   padded   lora    full   -6.5 / -18.4 %      +0.1 / -0.0 %       +0.1 / -0.0 %
    5.23.0   padded   full    none   -9.0 / -19.5 %      -3.0 / -3.2 %       +0.6 / +1.3 %
    5.23.0   padded   full    full   -4.9 / -18.5 %      -0.1 / -0.1 %       -0.1 / -0.1 %

The last column adds the final RMSNorm's backward right after the head's (formulas/loss.py
``final_norm_backward``: five fp32 T x h tensors beside every saved activation, the peak at this vocabulary
of 256), measured again 2026-12-07 by the lead.

At seq 512 the padding's bytes, no checkpointing: 4.48.1 one 2 x 512 x 512 bf16 mask, +1.05 MB (measured
+1.065 MB); 5.23 k/v repeated and the mask made additive per layer, +3.57 MB (measured +3.69 MB). The
middle column's -3..-7 % without checkpointing was not this: it is there with 8 KV heads (no GQA) too, in
the backward peak (measured backward temporaries 5.2 MB against the formulas' 2.1 MB at seq 512): the
final RMSNorm's backward, modelled since (the last column).

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
