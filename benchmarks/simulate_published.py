"""``simulate`` against published GPU measurements (``shared/validation/published-measurements.json``).

The points ``simulate`` can reproduce: Hugging Face docs "Model training anatomy" (2022),
bert-large-uncased + sequence classification (2 labels) on a V100, HF Trainer, seq 512, eager
attention, ``adamw_hf`` (transformers' own AdamW: one parameter at a time -> ``for-loop``), fp32 or
fp16 AMP, with and without gradient checkpointing. They read nvidia-smi "used" after training, so
the comparison is with ``device_total_bytes`` using the V100 context they measured (1343 MiB).

    .venv/bin/python benchmarks/simulate_published.py [--validation PATH]

Known differences (not tuned away): the 2022 Trainer called ``model.zero_grad()`` with torch 1.10's
default ``set_to_none=False``, so the gradients (4 B/param) stay allocated through the next
forward, which peakmem's trainer frees; transformers v4.16's BERT code, not 5.23's, ran.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MiB = 2**20
POINTS = ("HF-A01", "HF-A02", "HF-A03", "HF-A04", "HF-A05")


def main(argv: list[str] | None = None) -> int:
    from _validation import VALIDATION_FILE, present_or_skip
    from peakmem import catalog
    from peakmem.formulas.overhead import Overheads
    from peakmem.simulate import simulate_training
    from peakmem.training import AttentionKernel, Checkpointing, OptimizerImpl, Precision, TrainingSetup

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", default=str(VALIDATION_FILE))
    args = ap.parse_args(argv)
    path = present_or_skip(Path(args.validation), "simulate_published.py")
    data = json.loads(path.read_text())
    runs = data if isinstance(data, list) else next(v for v in data.values() if isinstance(v, list))
    config = dict(catalog.get_model("bert-large-uncased-cls2").config)
    ov = Overheads.for_context("v100-cuda11-eager-loading")
    print("| id | setup | measured MiB | simulated device total MiB | diff |")
    print("|---|---|---:|---:|---:|")
    for run in runs:
        if run["id"] not in POINTS:
            continue
        fp16 = "fp16" in run["precision"]
        setup = TrainingSetup(
            precision=Precision.AMP_FP16 if fp16 else Precision.FP32,
            micro_batch=run["micro_batch_size"], grad_accum=run["grad_accum"], seq_len=run["seq_len"],
            checkpointing=Checkpointing.FULL if run["gradient_checkpointing"] else Checkpointing.NONE,
            attention=AttentionKernel.EAGER, optimizer_impl=OptimizerImpl.FOR_LOOP,
        )  # fmt: skip
        est = simulate_training(config, setup, overheads=ov, model_name="bert-large-uncased-cls2")
        measured = run["value_gib"] * 1024
        sim = est.device_total_bytes / MiB
        what = (f"{setup.precision.value} b{setup.micro_batch}x{setup.grad_accum} "
                f"ckpt={setup.checkpointing.value}")  # fmt: skip
        diff = sim / measured - 1
        print(f"| {run['id']} | {what} | {measured:.0f} | {sim:.0f} | {diff:+.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
