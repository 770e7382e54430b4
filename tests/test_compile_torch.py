"""torch.compile's saved activations, re-measured: one tiny Llama layer compiled with Inductor on the CPU.

The layer (benchmarks/compile_activations.py: torchtune-style and transformers-style in pure bf16, and
transformers-style under CPU autocast over fp32) runs its forward eagerly and under ``torch.compile``; the
bytes alive after the forward, less its output (the CPU allocator's events, net), are what it keeps for
backward. peakmem's formula (:func:`peakmem.formulas.activations.layer_activations` with
``TrainingSetup.compiled``) must match them within 1 % (the CPU allocator's 64-byte alignment; measured
exact on torch 2.13), and the compiled graph must keep the layer's input itself (``input_saved``), which
the eager layer does not. About 20-40 s per compiled case on a loaded 2-core machine.
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


@pytest.mark.parametrize(("style", "precision"), [("torchtune", "bf16"), ("hf", "bf16"), ("hf", "amp-bf16")])
def test_compiled_layer_matches_the_formula(style: str, precision: str) -> None:
    ca = _bench()
    d = ca.Dims(hidden=128, heads=4, kv_heads=2, inter=352, batch=1, seq=32)
    for mode in ("eager", "inductor"):
        measured = ca.measure(d, style, mode, precision)
        predicted, kept_input = ca.formula(d, style, mode != "eager", precision)
        assert abs(predicted / measured - 1) <= TOLERANCE, (style, precision, mode, measured, predicted)
        fn, x, layer = ca.build(d, style, mode, precision)
        saved = ca.saved_shapes(fn, x, layer)
        input_kept = any(dtype == "layer input" for _, dtype, _ in saved)
        assert input_kept == (kept_input > 0), (style, precision, mode, saved)
