"""A dispatch mode (peakmem's storage tracker, FakeTensorMode) makes the autograd engine sum gradient
contributions out of place (ATen ``isTensorSubclassLike``); the derived block costs and ``peakmem measure``
rely on that never reaching a Llama's backward peak: benchmarks/dispatch_bias.py, on a tiny Llama."""

from __future__ import annotations

import pytest

from _bench import load_benchmark
from peakmem.training import Method, Precision, TrainingSetup
from tiny_models import LLAMA

pytestmark = pytest.mark.torch


def test_mode_adds_out_of_place_but_not_at_the_peak() -> None:
    """LoRA: the base Linear and lora_A read one input, as q, k, v read the normed one (benchmarks run full
    fine-tuning too; one case keeps the test fast)."""
    pytest.importorskip("torch")
    bench = load_benchmark("dispatch_bias")
    setup = TrainingSetup(method=Method.LORA, precision=Precision.BF16, micro_batch=2, seq_len=32)
    plain = bench.profiled_step(LLAMA, setup, "plain")
    tracker = bench.profiled_step(LLAMA, setup, "tracker")
    hidden, layers = LLAMA["hidden_size"], LLAMA["num_hidden_layers"]
    assert isinstance(hidden, int) and isinstance(layers, int)
    th = setup.micro_batch * setup.seq_len * hidden * 2  # one T x H bf16 gradient
    # the mode's out-of-place sums: at least the residual stream's two per layer (norm + residual add)
    assert tracker.backward_allocated - plain.backward_allocated >= 2 * layers * th
    assert tracker.backward_peak == plain.backward_peak
    assert tracker.layers_peak == plain.layers_peak
