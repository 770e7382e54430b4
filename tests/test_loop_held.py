"""peakmem.formulas.loop_held: what Lit-GPT's loop keeps of a micro-batch into the next, hand-derived.

Tiny Llama (tests/tiny_models.py: h 64, 4 heads of 16, 2 kv heads, MLP 176, 2 layers, vocab 1000), batch 2 x
seq 8 (T = 16), pure bf16 (c = 2 B), QLoRA on q and v. Each layer's 4-bit Linear inputs: the first norm's
output T h c = 2048 (none in layer 0: nothing before it requires grad), the attention output (o_proj's
input) 2048, the second norm's output 2048, the product before down_proj T I c = 5632: 9728 + 11776 =
21,504 B with bitsandbytes 0.41.1, none from 0.43.2 on; the logits T V c = 32,000 B either way.
Falcon-7B's layout (one norm feeding attention and MLP, tests/tiny_models.py falcon: h 64, MLP 256, 3
layers, vocab 128, T = 16): the shared norm output once, 2048, from the second layer on; the attention
output 2048 and the MLP's fc output (the GELU product before dense_4h_to_h) T 256 c = 8192 in every layer:
3 x 10240 + 2 x 2048 = 34,816 B. (In the first layer of such a parallel block the unadapted MLP branch needs
no grad, so bitsandbytes keeps no input there; counted, as formulas/lora/deltas.py counts it in backward.)
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import peakmem
from peakmem.adapters import LoraConfig, QuantConfig
from peakmem.formulas import activations as act
from peakmem.formulas import loop_held as held
from peakmem.formulas import lora as L
from peakmem.formulas import profiles
from peakmem.hf import spec_from_config
from peakmem.training import Framework, Method, Precision, TrainingSetup
from tiny_models import FAMILY_CONFIGS, LLAMA

T, C = 16, 2


def _held(
    config: dict[str, object], framework: Framework, bnb: str, targets: tuple[str, ...]
) -> held.LoopHeld:
    spec = L.split_first_layer(spec_from_config(config))
    lora = LoraConfig(rank=8, alpha=16, dropout=0.05, targets=targets, adapter_dtype="base")
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=8, method=Method.QLORA, lora=lora,
                          quant=QuantConfig(quant="nf4"), framework=framework, bitsandbytes=bnb)  # fmt: skip
    return held.loop_held(spec, setup, act.shapes(spec, setup))


def test_litgpt_keeps_logits_and_old_bnb_inputs() -> None:
    qv = ("q_proj", "v_proj")
    assert _held(LLAMA, Framework.LITGPT, "0.41.1", qv) == held.LoopHeld(logits=T * 1000 * C, inputs=21504)
    assert _held(LLAMA, Framework.LITGPT, "0.43.2", qv) == held.LoopHeld(logits=T * 1000 * C, inputs=0)
    assert _held(LLAMA, Framework.HF, "0.41.1", qv) == held.NOTHING


def test_one_norm_feeding_both_halves_counts_once() -> None:
    falcon = _held(FAMILY_CONFIGS["falcon"], Framework.LITGPT, "0.41.1", ("query_key_value",))
    assert falcon.inputs == 3 * (2048 + 8192) + 2 * 2048


def test_forward_peak_at_the_loss_or_in_the_model() -> None:
    kept = held.LoopHeld(logits=100, inputs=10)
    tmp, items = held.forward_peak(kept, at_loss=150, in_model=40)  # the loss: old logits already dropped
    assert (tmp, [(i.key, i.bytes) for i in items]) == (150, [("loop.kept_inputs", 10)])
    tmp, items = held.forward_peak(kept, at_loss=120, in_model=40)  # the model's end: both logits alive
    assert (tmp, [i.bytes for i in items]) == (40, [10, 100])
    assert held.forward_peak(held.NOTHING, at_loss=120, in_model=140) == (140, ())
    assert [i.bytes for i in held.optimizer_items(kept)] == [10, 100]


@pytest.mark.parametrize("bnb", ["0.41.1", "0.43.2"])
def test_the_step_and_the_next_forward_hold_them(
    tiny_llama: str, bnb: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimate with Lit-GPT's loop against the same profile without it: the optimizer step holds the
    logits and (0.41.1) the inputs, the quantized lm_head's too (the final norm's output T h c = 2048:
    Lightning's BitsandbytesPrecision quantizes the head, formulas/qlora.py); the forward's peak at least
    the inputs."""
    opts = dict(method="qlora", framework="litgpt", precision="bf16", batch=2, seq=8,
                lora_targets="q_proj,v_proj", bitsandbytes=bnb, grad_accum=2)  # fmt: skip
    on = peakmem.train(tiny_llama, **opts).to_dict()["phases"]
    lit = profiles.PROFILES[Framework.LITGPT]
    monkeypatch.setitem(profiles.PROFILES, Framework.LITGPT, replace(lit, loop_keeps_output=False))
    off = peakmem.train(tiny_llama, **opts).to_dict()["phases"]
    inputs = 21504 + T * 64 * C if bnb == "0.41.1" else 0
    assert on["optimizer"] - off["optimizer"] == inputs + T * 1000 * C
    assert on["forward"] - off["forward"] >= inputs
    assert on["backward"] == off["backward"]


def test_a_loop_that_runs_its_longest_batch_first_holds_nothing_at_it(tmp_path: Path) -> None:
    """Lit-GPT 2023 (longest sample first, each batch padded to its own length), the tiny Llama with 4
    layers, batch 2 x seq 64 (T = 128): at the --seq batch's forward nothing of an earlier micro-batch is
    alive; at fixed lengths the previous --seq micro-batch's 4-bit Linear inputs are, at the loss (its
    logits already dropped): layer 0 T(h + h + I)c = 77,824, layers 1-3 T(3h + I)c = 94,208 each, the
    quantized head's input T h c = 16,384: 376,832 B. The optimizer step holds its own micro-batch's in both.
    The band's loop_order term spans the difference of the peaks (the fixed forward over the backward)."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**LLAMA, "num_hidden_layers": 4}))
    opts = dict(method="qlora", framework="litgpt-2023", precision="bf16", batch=2, seq=64,
                lora_targets="q_proj,v_proj", bitsandbytes="0.41.1", grad_accum=2)  # fmt: skip
    fixed = peakmem.train(str(cfg), **opts).to_dict()
    first = peakmem.train(str(cfg), padded_lengths="varying", **opts).to_dict()
    inputs = 77824 + 3 * 94208 + 128 * 64 * C
    assert fixed["phases"]["forward"] - first["phases"]["forward"] == inputs == 376832
    assert (first["phases"]["backward"], first["phases"]["optimizer"]) == (
        fixed["phases"]["backward"], fixed["phases"]["optimizer"])  # fmt: skip
    assert (fixed["peak_phase"], first["peak_phase"]) == ("forward", "backward")
    (term,) = [t for t in first["band"]["terms"] if t["name"] == "loop_order"]
    high = fixed["phases"]["forward"] - first["phases"]["backward"]
    assert (term["low_bytes"], term["high_bytes"]) == (0, high)
    assert "loop_order" not in {t["name"] for t in fixed["band"]["terms"]}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("llama") / "config.json"
    path.write_text(json.dumps(LLAMA))
    return str(path)


def test_a_derived_layer_with_one_norm_counts_its_output_once() -> None:
    """phi-2's shipped derived spec (transformers' PhiDecoderLayer: one input_layernorm read by q/k/v and
    fc1; a derived spec records no parallel_residual): per later layer T h c for the norm's output, T h c for
    dense's input and T I c for fc2's (h 2560, I 10240), not a second norm output."""
    from peakmem.resolve import resolve_model

    spec = L.split_first_layer(resolve_model("phi-2"))
    lora = LoraConfig(rank=8, alpha=16, dropout=0.05, targets=("q_proj", "v_proj"), adapter_dtype="base")
    setup = TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=8, method=Method.QLORA, lora=lora,
                          quant=QuantConfig(quant="nf4"), framework=Framework.LITGPT,
                          bitsandbytes="0.42.0")  # fmt: skip
    assert spec.groups[1].layer.derived is not None
    assert held.layer_linear_inputs(spec, 1, act.shapes(spec, setup), setup) == T * (2560 + 2560 + 10240) * C
