"""Training accuracy report: peakmem's analytic estimate vs published measurements.

Reads ``shared/validation/published-measurements.json`` and, for each training point the engine
covers, prints what peakmem predicts for the *same quantity* the source measured (nvidia-smi used
memory = reserved + CUDA context; torch "active"/"allocated" = allocated bytes) and the relative
error. Points that need features not built yet print "not covered yet" with the reason.
Nothing here is tuned per point: the mapping below only translates each point's documented setup
into a :class:`~peakmem.training.TrainingSetup`.

Run: ``.venv/bin/python benchmarks/accuracy.py [path/to/published-measurements.json]``
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peakmem.catalog import get_model
from peakmem.estimate import estimate_training
from peakmem.formulas.overhead import Overheads
from peakmem.hf import spec_from_config
from peakmem.training import (
    AttentionKernel,
    Checkpointing,
    Framework,
    OptimizerImpl,
    OptimizerName,
    Precision,
    TrainingSetup,
)
from peakmem.units import GiB, MiB

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published-measurements.json"
GOAL = 0.10  # the target: bert-large and plain torchtune full fine-tune points within 10%

MODELS = {"bert-large": "bert-large-uncased", "llama 3.2 3b": "llama-3.2-3b"}
# GPU -> the CUDA-context row of peakmem.formulas.overhead.CONTEXT_SIZES the source implies
CONTEXTS = {"V100": "v100-cuda11-eager-loading"}


@dataclass(frozen=True)
class Mapped:
    setup: TrainingSetup
    catalog_name: str
    overheads: Overheads
    quantity: str  # "device_total" | "allocated"


def _model(point: dict[str, Any]) -> str | None:
    text = point["model"].lower()
    for key, name in MODELS.items():
        if key in text:
            return name
    return None


# Techniques named in a point's notes/optimizer that the engine does not model yet. Sources whose
# rows are "cumulative over previous rows" (torchtune's README table) carry them down the rows.
UNSUPPORTED = {
    "torch.compile": "torch.compile (fused kernels change what is saved)",
    "compile on": "torch.compile (fused kernels change what is saved)",
    "chunked cross-entropy": "chunked cross-entropy",
    "optimizer_in_bwd=true": "optimizer-in-backward",
    "optimizer step fused into backward": "optimizer-in-backward",
    "activation offloading": "activation offloading",
    "8-bit": "8-bit optimizer states",
    "8bit": "8-bit optimizer states",
}
# Those techniques are modelled by peakmem.formulas.lora / lowbit_optim / activations (compile) and
# reported, with these same points, by benchmarks/accuracy_finetune.py.
FINETUNE_REPORT = "benchmarks/accuracy_finetune.py"


def _features(point: dict[str, Any], carried: set[str]) -> set[str]:
    text = f"{point.get('notes') or ''} {point.get('optimizer') or ''}".lower()
    found = {reason for key, reason in UNSUPPORTED.items() if key in text}
    if "no compile" in text:
        found.discard(UNSUPPORTED["compile on"])
    return found | carried if "cumulative over previous rows" in text else found


def _not_covered(point: dict[str, Any], features: set[str]) -> str | None:
    """Why a point needs a feature peakmem's training engine does not have yet (None: covered)."""
    method = (point.get("method") or "").lower()
    if "load only" in method or point.get("phase") != "training":
        return "model load only (no training step)"
    if "lora" in method:
        return f"{point['method']} adapters: see {FINETUNE_REPORT}"
    if features:
        return "; ".join(sorted(features)) + f" (see {FINETUNE_REPORT})"
    if point.get("seq_len") is None:
        return "sequence length not given by the source"
    if _model(point) is None:
        return "model not in the catalog"
    return None


def _torch_before_2(point: dict[str, Any]) -> bool:
    """Runs dated 2022 or earlier used torch < 2.0, whose zero_grad() kept zeroed grads alive."""
    return bool(re.search(r"\b20(1\d|2[0-2])\b", point.get("framework") or ""))


def _map(point: dict[str, Any]) -> Mapped:
    precision_text = point["precision"].lower()
    if "fp16 amp" in precision_text:
        precision = Precision.AMP_FP16
    elif "bf16" in precision_text:
        precision = Precision.BF16
    else:
        precision = Precision.FP32
    opt = point["optimizer"].lower()
    if "adafactor" in opt:
        optimizer, impl = OptimizerName.ADAFACTOR, OptimizerImpl.FOR_LOOP
    elif "adamw_hf" in opt:
        # transformers' own AdamW (optim="adamw_hf" in 2022): a python loop over parameters
        optimizer, impl = OptimizerName.ADAMW, OptimizerImpl.FOR_LOOP
    else:
        optimizer, impl = OptimizerName.ADAMW, OptimizerImpl.FOREACH  # torch.optim.AdamW default on CUDA
    framework = Framework.TORCHTUNE if "torchtune" in point["source"].lower() else Framework.HF
    attention = AttentionKernel.EAGER if "eager" in (point.get("attention") or "") else AttentionKernel.SDPA
    setup = TrainingSetup(
        precision=precision, optimizer=optimizer, optimizer_impl=impl, micro_batch=point["micro_batch_size"],
        seq_len=point["seq_len"], grad_accum=point.get("grad_accum") or 1,
        checkpointing=Checkpointing.FULL if point.get("gradient_checkpointing") else Checkpointing.NONE,
        attention=attention, framework=framework, grads_set_to_none=not _torch_before_2(point),
    )  # fmt: skip
    context = next((key for gpu, key in CONTEXTS.items() if gpu in point["gpu"]), None)
    overheads = Overheads.for_context(context) if context else Overheads()
    quantity = "device_total" if "nvidia-smi" in point["measured_quantity"].lower() else "allocated"
    name = _model(point)
    assert name is not None
    return Mapped(setup=setup, catalog_name=name, overheads=overheads, quantity=quantity)


def _measured_bytes(point: dict[str, Any]) -> int:
    unit = {"MiB": MiB, "GiB": GiB}[point["unit"]]
    return int(point["value"] * unit)


def run(path: Path) -> list[tuple[str, float | None, str]]:
    points = json.loads(path.read_text())
    rows: list[tuple[str, float | None, str]] = []
    print(f"{'id':10} {'quantity':13} {'measured':>10} {'predicted':>10} {'error':>7}  setup / reason")
    carried: set[str] = set()
    for point in points:
        if "inference" in (point.get("method") or "").lower() and point.get("phase") == "inference":
            continue
        features = carried = _features(point, carried)
        reason = _not_covered(point, features)
        if reason is not None:
            print(f"{point['id']:10} {'':13} {'':>10} {'':>10} {'':>7}  not covered here: {reason}")
            rows.append((point["id"], None, reason))
            continue
        mapped = _map(point)
        spec = spec_from_config(get_model(mapped.catalog_name).config)
        est = estimate_training(spec, mapped.setup, overheads=mapped.overheads)
        predicted = est.device_total_bytes if mapped.quantity == "device_total" else est.peak_allocated_bytes
        measured = _measured_bytes(point)
        err = predicted / measured - 1
        s = mapped.setup
        what = (
            f"{s.precision.value} {s.optimizer.value}/{s.optimizer_impl.value} b{s.micro_batch}x{s.seq_len} "
            f"ga{s.grad_accum} ckpt={s.checkpointing.value} {s.attention.value} {s.framework.value}"
            f"{'' if s.grads_set_to_none else ' grads kept'}; "
            f"peak in {est.peak_phase.value}"
        )
        label = (
            "nvidia-smi"
            if mapped.quantity == "device_total"
            else ("active" if "active" in point["measured_quantity"].lower() else "allocated")
        )
        print(
            f"{point['id']:10} {label:13} {measured / GiB:9.2f}G {predicted / GiB:9.2f}G {err:+7.1%}  {what}"
        )
        rows.append((point["id"], err, what))
    covered = [e for _, e, _ in rows if e is not None]
    if covered:
        within = sum(abs(e) <= GOAL for e in covered)
        worst = max(abs(e) for e in covered)
        print(
            f"\ncovered {len(covered)} of {len(rows)} training points; {within} within {GOAL:.0%}; "
            f"worst {worst:.1%}"
        )
    return rows


if __name__ == "__main__":
    from _validation import present_or_skip

    run(present_or_skip(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH, "accuracy.py"))
