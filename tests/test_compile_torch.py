"""torch.compile's saved activations, re-measured: one tiny Llama layer compiled with Inductor on the CPU.

The layer (benchmarks/compile_activations.py: torchtune-style and transformers-style, pure bf16) runs its
forward eagerly and under ``torch.compile``; the bytes alive after the forward, less its output (the CPU
allocator's events, net), are what it keeps for backward. peakmem's formula
(:func:`peakmem.formulas.activations.layer_activations` with ``TrainingSetup.compiled``) must match them
within 1 % (the CPU allocator's 64-byte alignment; measured exact on torch 2.13), and the compiled graph
must keep the layer's input itself (``input_saved``), which the eager layer does not. About 20-40 s per
compiled case on a loaded 2-core machine.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

TOLERANCE = 0.01


def _bench() -> Any:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_activations.py"
    spec = importlib.util.spec_from_file_location("_compile_activations", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_compile_activations"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("style", ["torchtune", "hf"])
def test_compiled_layer_matches_the_formula(style: str) -> None:
    ca = _bench()
    d = ca.Dims(hidden=128, heads=4, kv_heads=2, inter=352, batch=1, seq=32)
    for mode in ("eager", "inductor"):
        measured = ca.measure(d, style, mode, torch.bfloat16)
        predicted, kept_input = ca.formula(d, style, mode != "eager", torch.bfloat16)
        assert abs(predicted / measured - 1) <= TOLERANCE, (style, mode, measured, predicted)
        torch.manual_seed(0)
        layer = ca.Layer(d, style).to(torch.bfloat16)
        x = torch.randn(d.batch, d.seq, d.hidden, dtype=torch.bfloat16, requires_grad=True)
        fn = layer
        if mode == "inductor":
            torch._dynamo.reset()
            fn = torch.compile(layer, backend="inductor", dynamic=False)
        saved = ca.saved_shapes(fn, x)
        input_kept = any(dtype == "layer input" for _, dtype, _ in saved)
        assert input_kept == (kept_input > 0), (style, mode, saved)
