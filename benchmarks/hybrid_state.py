"""Hybrid models' recurrent state in vLLM's pages: peakmem (formulas/recurrent_state.py) against published
logs.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/hybrid_state.py``.

Reads benchmarks/hybrid_state_logs.json (its cases split into a fitting and a held-out set before this
script computed any of them). Per case, fitting set first, it prints the logged figure, peakmem's figure
before branch h-hybrid and after it, and the errors:

* ``block``: vLLM's attention block for the hybrid model ("Setting attention block size to N tokens", or
  inferred from the pool lines) against ``vllm_hybrid_block_size`` of ``peakmem infer --engine vllm``.
  Before: peakmem kept vLLM's default 16-token block (no hybrid page rule);
* ``mamba_page`` (cases that log "Padding mamba page size by P%"): one stateful layer's state per sequence
  on one rank, N x attention token bytes / (1 + P / 100) (P rounded to 0.01 %, so within about 0.005 %),
  against ``vllm_mamba_page_bytes``. Before: transformers' cache (conv_kernel conv inputs in the model's
  dtype, the scan state in fp32: ``engine_state(..., Engine.HF)``), which peakmem counted for vLLM.

Exits 0; the goal (issue 31) is |error| <= 10 %, reported honestly, not enforced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _logs import fit_first, unseen_lines, within_lines
from peakmem.formulas.recurrent_state import engine_state
from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.context import attention_token_bytes, resolve_context
from peakmem.inference import Engine, InferenceSetup
from peakmem.resolve import resolve_model

LOGS = Path(__file__).resolve().parent / "hybrid_state_logs.json"
BEFORE_BLOCK = 16  # vLLM's default block size, what peakmem used for hybrid models before h-hybrid


def _setup(case: dict[str, Any]) -> InferenceSetup:
    flags = case["flags"]
    return InferenceSetup(engine="vllm", tp=flags.get("tp", 1), context=flags.get("max_model_len"), batch=1)


def rows(case: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    """(figure, logged, before, after) of one case."""
    spec = resolve_model(case["model"])
    setup = _setup(case)
    extra = estimate_inference(spec, setup).extra
    out = [
        ("block (tokens)", float(case["block"]), float(BEFORE_BLOCK), float(extra["vllm_hybrid_block_size"]))
    ]  # type: ignore[arg-type]
    if case.get("padding_pct") is not None:
        c = resolve_context(spec, setup)
        token = attention_token_bytes(c)
        logged = case["block"] * token / (1 + case["padding_pct"] / 100)
        before = engine_state(
            spec, Engine.HF, act_bytes=c.act_bytes, tp=setup.layout.attention_tp
        ).largest_layer
        out.append(("mamba page (B)", logged, float(before), float(extra["vllm_mamba_page_bytes"])))  # type: ignore[arg-type]
    return out


def main() -> None:
    data = json.loads(LOGS.read_text())
    print("| set | case | model | tp | figure | log | before | error | after | error |")
    errors_before: list[tuple[str, str, float]] = []
    errors_after: list[tuple[str, str, float]] = []
    examined = [c["id"] for c in data["cases"] if c.get("examined")]
    for case in fit_first(data["cases"], lambda c: c["id"]):
        for figure, logged, before, after in rows(case):
            eb, ea = before / logged - 1, after / logged - 1
            flag = " (E)" if case.get("examined") else ""
            print(f"| {case['set']} | {case['id']}{flag} | {case['model']} | "
                  f"{case['flags'].get('tp', 1)} | {figure} | {logged:,.0f} | {before:,.0f} | {eb:+.1%} | "
                  f"{after:,.0f} | {ea:+.1%} |")  # fmt: skip
            errors_before.append((case["set"], case["id"], eb))
            errors_after.append((case["set"], case["id"], ea))
    for label, errors in (("before", errors_before), ("after", errors_after)):
        lines = within_lines((s, e) for s, _, e in errors)
        print(f"{label}: " + "; ".join(lines))
        for line in unseen_lines(errors, examined):
            print(f"{label}: {line}")
    for case in data.get("not_compared", []):
        spec = resolve_model(case["model"])
        extra = estimate_inference(spec, _setup(case)).extra
        print(f"not compared ({case['id']}: no repository): log block {case['block']} / padding "
              f"{case['padding_pct']}%; peakmem after {extra['vllm_hybrid_block_size']} / "
              f"{extra['vllm_mamba_page_padding_pct']}%")  # fmt: skip


if __name__ == "__main__":
    main()
