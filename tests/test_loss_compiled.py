"""``loss='compiled'``: the standard cross-entropy under torch.compile (torchtitan's compiled loss, a
transformers model compiled with ``labels=``): hand-derived bytes on a tiny spec, the same bytes measured
with Inductor on this CPU (benchmarks/compiled_loss.py), and the inputs it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from _bench import load_benchmark
from peakmem.breakdown import Phase
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas.loss import HeadActivations
from peakmem.formulas.lowbit_optim import compiled_ce
from peakmem.hf import spec_from_config
from peakmem.measure.parity import FAMILIES
from peakmem.training import KernelPolicy, LossImpl, TrainingSetup

LLAMA = {**FAMILIES["llama"], "num_hidden_layers": 2}  # vocab 512, hidden 128
BATCH, SEQ, VOCAB, HIDDEN = 2, 64, 512, 128
T = BATCH * SEQ
TV = T * VOCAB
EMPTY = HeadActivations(saved=(), forward_transient=0, backward_transient=0, logits_grad=0)


def _phases(precision: str, loss: LossImpl) -> dict[Phase, Any]:
    setup = TrainingSetup(precision=precision, micro_batch=BATCH, seq_len=SEQ, loss=loss,  # type: ignore[arg-type]
                          kernel_policy=KernelPolicy.CPU)  # fmt: skip
    est = estimate_training(spec_from_config(LLAMA, name="llama2"), setup)
    return {p.phase: p for p in est.phases}


@pytest.mark.parametrize("c", [2, 4])
def test_the_formula_by_hand(c: int) -> None:
    # Inductor keeps the logits (c bytes each) and two fp32 values per row (amax, log-sum-exp); nothing at
    # the loss in forward beyond them; the backward writes one gradient in the logits' dtype
    got = compiled_ce(EMPTY, [], T, VOCAB, c)
    assert [i.bytes for i in got.saved] == [T * VOCAB * c + 2 * T * 4]
    assert (got.forward_transient, got.backward_transient, got.logits_grad) == (0, 0, T * VOCAB * c)


def test_the_loss_instants_of_a_bf16_step_by_hand() -> None:
    standard, compiled = _phases("bf16", LossImpl.STANDARD), _phases("bf16", LossImpl.COMPILED)
    items = {i.key: i.bytes for i in compiled[Phase.FORWARD].items}
    assert items["loss.compiled_ce"] == 2 * TV + 2 * T * 4 and "loss.log_softmax" not in items
    # forward, at the loss: eager holds the fp32 log-softmax output (saved, 4 B per logit), the 16-bit
    # logits and their fp32 copy (2 + 4); compiled the 16-bit logits and the row statistics only
    drop = 10 * TV - (2 * TV + 2 * T * 4)
    assert standard[Phase.FORWARD].bytes - compiled[Phase.FORWARD].bytes == drop
    # backward, at its start: eager's saved log-softmax output and two fp32 gradients (4 + 8), which
    # outweigh its 16-bit logits gradient + the head's weight gradients; compiled the saved logits and row
    # statistics, the 16-bit logits gradient and then the LM head's (V x h) and final norm's (h) bf16
    # weight gradients
    head_grads = VOCAB * HIDDEN * 2 + HIDDEN * 2
    drop = 12 * TV - (2 * TV + 2 * T * 4 + 2 * TV + head_grads)
    assert standard[Phase.BACKWARD].bytes - compiled[Phase.BACKWARD].bytes == drop


def test_it_lowers_a_headline_peak_and_names_itself() -> None:
    import peakmem

    flags = {"precision": "bf16", "batch": 4, "seq": 2048}
    standard = peakmem.train("llama-3.2-1b", **flags)
    compiled = peakmem.train("llama-3.2-1b", loss="compiled", **flags)
    # 8192 tokens x 128256 vocab: eager's 12 bytes per logit at the start of backward against compiled's 4
    # (and the head's weight gradients); the backward still peaks, more than 7 GiB lower
    assert standard["peak_allocated_bytes"] - compiled["peak_allocated_bytes"] > 7 * 2**30
    assert any(a.startswith("loss compiled") for a in compiled["assumptions"])


def test_bad_input_is_one_line() -> None:
    import peakmem

    with pytest.raises(InputError, match=r"^loss='compiled' with objective='dpo': ") as e:
        peakmem.train("llama-3.2-1b", loss="compiled", objective="dpo")
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="loss='compile'"):
        LossImpl.parse("compile", "loss")
    with pytest.raises(InputError, match="loss='compiled'"):
        TrainingSetup(loss=LossImpl.COMPILED).check_oracle_runs("measure")


# benchmarks/compiled_loss.py on this CPU (torch 2.13): the forward allocates the row statistics and the
# loss only; the backward the logits' gradient and a T x 1 fp32 scratch (not in the formula). The CPU
# allocator rounds each block to 64 bytes and the scalars (loss, token count, gradient seed) are a few of
# them: so the measured bytes sit within the scratch + 1 KiB above the formula, never below it.
SLACK = 1024


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_inductor_allocates_what_the_formula_says(dtype: str) -> None:
    pytest.importorskip("torch")
    bench = load_benchmark("compiled_loss")
    t, v = 256, 4000
    measured = bench.measure_ce(t, v, dtype, compiled=True)
    kept, forward, backward = bench.formula(t, v, dtype, compiled=True)
    assert kept <= measured.forward_net <= kept + SLACK, (measured, kept)
    assert forward <= measured.forward_peak <= forward + SLACK, (measured, forward)
    assert backward <= measured.backward_peak <= backward + t * 4 + SLACK, (measured, backward)
    # it keeps the logits themselves (no copy) and no other tensor of size vocab
    c = 2 if dtype == "bf16" else 4
    assert [s for s in measured.saved if s[2] >= t * v] == [((1, t, v), "logits", t * v * c)]


def test_torchtune_keeps_the_fp32_logits_its_model_returns() -> None:
    """torchtune's TransformerDecoder returns ``self.output(h).float()`` eagerly (modules/transformer.py
    @1814feb) and compile=True compiles only the loss over them (training/_compile.py compile_loss): the
    compiled loss keeps 4-byte logits, and the 16-bit ones are alive next to their fp32 copy in forward."""
    setup = TrainingSetup(precision="bf16", micro_batch=BATCH, seq_len=SEQ, loss=LossImpl.COMPILED,  # type: ignore[arg-type]
                          kernel_policy=KernelPolicy.CPU, framework="torchtune")  # type: ignore[arg-type]  # fmt: skip
    est = estimate_training(spec_from_config(LLAMA, name="llama2"), setup)
    forward = next(p for p in est.phases if p.phase is Phase.FORWARD)
    items = {i.key: i.bytes for i in forward.items}
    assert items["loss.compiled_ce"] == 4 * TV + 2 * T * 4
