"""Multi-LoRA serving: peakmem's LoRA slots (formulas/serving/lora_slots.py) against published engine logs.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/lora_slots.py``.

Reads benchmarks/lora_slot_logs.json, whose cases were split into a fitting set and a held-out set before any
estimate was computed (the rule and date are in the file; no constant of the slot term is fitted). For each
case it prints the log's figure, peakmem's, the error, and the LoRA slots' share of peakmem's figure (how much
of the figure the slot term is: a figure of the whole weights checks the slots only that far), fitting set
first:

* ``weights_v0``: vLLM V0's "Loading model weights took X GB" (GiB in fact), logged by
  vllm/worker/model_runner.py ``load_model`` before it builds the LoRA manager (up to 0.7): ``weight_bytes``
  alone;
* ``weights_and_slots``: a figure measured around the model and its LoRA manager: V1's "Model loading took
  X GiB" (vllm/v1/worker/gpu_model_runner.py ``load_model`` runs ``load_lora_model`` inside its
  ``DeviceMemoryProfiler``) and V0's "model weights take X GiB" from vLLM PR #14469 (0.8.0), which moved the
  LoRA manager inside the profiler: ``weight_bytes + lora_slot_bytes``;
* ``lora_delta``: the same server's figure with LoRA minus without: ``lora_slot_bytes``;
* ``kv_pool``: vLLM's "Available KV cache memory" with LoRA on the case's GPU and gpu_memory_utilization:
  ``extra["kv_pool_bytes"]`` (the stacks taken out of the pool, lora_slots.py);
* ``adapter_elements``: TensorRT-LLM's "Max LoRA size is N", the values of one adapter of max_lora_rank
  (peftCacheManager.cpp): ``lora_slot_elements_per_adapter``, the slot term's own count (printed in
  millions of values, not GiB).

Exits 0; the goal (issue 31) is |error| <= 10 %, reported honestly, not enforced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _logs import fit_first, within_lines
from peakmem.catalog import get_gpu, get_model
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.lora_slots import lora_slot_elements_per_adapter
from peakmem.hf import spec_from_config
from peakmem.inference import InferenceSetup
from peakmem.units import GiB, MiB

LOGS = Path(__file__).resolve().parent / "lora_slot_logs.json"
GB = 10**9


def logged_bytes(case: dict[str, Any]) -> int:
    """The log's figure: bytes, or values for ``adapter_elements``."""
    if "elements" in case:
        return int(case["elements"])
    if "gib" in case:
        return int(case["gib"] * GiB)
    return int(case["mib"] * MiB) if "mib" in case else int(case["gb"] * GB)


def _setup(case: dict[str, Any]) -> InferenceSetup:
    gpu = get_gpu(case["gpu"]).usable_bytes if case.get("gpu") else None
    if case.get("gpu_total_gib"):  # the total the log states (torch.cuda.mem_get_info)
        gpu = int(case["gpu_total_gib"] * GiB)
    return InferenceSetup(
        engine=case["engine"], engine_version=case["version"], tp=case.get("tp") or 1,
        context=case.get("max_model_len") or 4096, batch=1, gpu_bytes=gpu,
        gpu_memory_utilization=case.get("gpu_memory_utilization"),
        max_loras=case.get("max_loras"), max_lora_rank=case.get("max_lora_rank"),
    )  # fmt: skip


def predicted(case: dict[str, Any]) -> tuple[int, int, str]:
    """peakmem's figure for the case, the LoRA slots' bytes in it, and what it is made of."""
    name = str(case["model"])
    spec = spec_from_config(case.get("config") or get_model(name).config, name=name)
    if case["what"] == "adapter_elements":
        n = lora_slot_elements_per_adapter(spec, rank=case["max_lora_rank"], tp=case.get("tp") or 1)
        return n, n, "values of one adapter"
    est = estimate_inference(spec, _setup(case))
    weights = sum(i.bytes for i in est.items if i.path.startswith("weights"))  # one rank's
    slots = int(est.extra.get("lora_slot_bytes", 0))  # type: ignore[call-overload]
    what = case["what"]
    if what == "weights_v0":
        return weights, 0, "weights (V0 logs them before the LoRA manager)"
    if what == "weights_and_slots":
        return weights + slots, slots, "weights + LoRA slots"
    if what == "lora_delta":
        return slots, slots, "LoRA slots"
    pool = est.extra["kv_pool_bytes"]
    assert isinstance(pool, int)
    return pool, slots, "KV pool (slots taken out)"


def main() -> int:
    cases = json.loads(LOGS.read_text())["cases"]
    print("| set | case | model | engine | slots | what | log | peakmem | error | slots / figure |")
    print("|---|---|---|---|---|---|---:|---:|---:|---:|")
    errors = []
    for case in fit_first(cases, lambda c: int(c["id"][1:])):
        log = logged_bytes(case)
        got, slots, how = predicted(case)
        err = got / log - 1
        errors.append((case["set"], err))
        engine = f"{case['engine']} {case['version']} tp{case.get('tp') or 1}"
        lora = f"{case.get('max_loras') or '-'} x r{case.get('max_lora_rank') or '-'}"
        unit, scale = ("M values", 1e6) if case["what"] == "adapter_elements" else ("GiB", GiB)
        share = f"{100 * err:+.1f}% | {100 * slots / got:.1f}%"
        figures = f"{log / scale:.4f} {unit} | {got / scale:.4f} {unit} | {share}"
        row = f"| {case['set']} | {case['id']} | {case['model']} | {engine} | {lora} | {case['what']} ({how})"
        print(f"{row} | {figures} |")
    print("\n".join(within_lines(errors)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
