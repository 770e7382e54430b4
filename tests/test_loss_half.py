"""``loss='half'``: cross-entropy on the model's 16-bit logits, no fp32 upcast (2022 transformers GPT-2
heads, ColossalAI's GPTLMLoss, custom loops on a ``.half()`` model): hand-derived bytes on a tiny spec,
what torch saves, and the cases where it is the standard loss."""

from __future__ import annotations

import pytest

import peakmem
from peakmem.breakdown import Phase
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.hf import spec_from_config
from peakmem.measure.parity import FAMILIES
from peakmem.training import KernelPolicy, LossImpl, TrainingSetup

LLAMA = {**FAMILIES["llama"], "num_hidden_layers": 2}  # vocab 512
BATCH, SEQ, VOCAB = 2, 64, 512
LOGITS = BATCH * SEQ * VOCAB


def _head(precision: str, loss: LossImpl) -> dict[str, int]:
    setup = TrainingSetup(precision=precision, micro_batch=BATCH, seq_len=SEQ, loss=loss,  # type: ignore[arg-type]
                          kernel_policy=KernelPolicy.CPU)  # fmt: skip
    est = estimate_training(spec_from_config(LLAMA, name="llama2"), setup)
    forward = next(p for p in est.phases if p.phase is Phase.FORWARD)
    return {i.key: i.bytes for i in forward.items}


def test_the_log_softmax_output_stays_16_bit() -> None:
    half, standard = _head("bf16", LossImpl.HALF), _head("bf16", LossImpl.STANDARD)
    assert standard["loss.log_softmax"] == 4 * LOGITS  # transformers' ForCausalLMLoss: logits.float()
    assert half["loss.log_softmax"] == 2 * LOGITS


def test_the_loss_instants_by_hand() -> None:
    from peakmem.formulas.loss import HeadActivations
    from peakmem.formulas.lowbit_optim import half_ce

    head = HeadActivations(saved=(), forward_transient=0, backward_transient=0, logits_grad=0)
    got = half_ce(head, [], LOGITS, 2, autocast=False)
    # forward: the logits and their contiguous shifted copy; backward: nll_loss's and log_softmax's
    # 16-bit gradients; the head's backward reads a 16-bit logits gradient
    assert (got.forward_transient, got.backward_transient, got.logits_grad) == (
        2 * 2 * LOGITS, 2 * 2 * LOGITS, 2 * LOGITS
    )  # fmt: skip
    assert [i.bytes for i in got.saved] == [2 * LOGITS]


@pytest.mark.parametrize("precision", ["amp-bf16", "amp-fp16", "fp32"])
def test_autocast_and_fp32_logits_are_the_standard_loss(precision: str) -> None:
    # autocast runs cross_entropy in fp32 (its fp32 op list); fp32 logits have nothing to upcast
    assert _head(precision, LossImpl.HALF) == _head(precision, LossImpl.STANDARD)


def test_it_lowers_a_pure_bf16_peak_and_oracles_refuse_it() -> None:
    flags = {"precision": "bf16", "batch": 4, "seq": 2048}
    assert (
        peakmem.train("llama-3.2-1b", loss="half", **flags)["peak_allocated_bytes"]
        < peakmem.train("llama-3.2-1b", **flags)["peak_allocated_bytes"]
    )
    with pytest.raises(InputError, match="loss='half'"):
        TrainingSetup(loss=LossImpl.HALF).check_oracle_runs("simulate")


@pytest.mark.torch
def test_torch_saves_the_16_bit_log_softmax() -> None:
    torch = pytest.importorskip("torch")
    logits = torch.randn(8, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    saved: list[torch.dtype] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(8, dtype=torch.long))
    assert torch.bfloat16 in saved and torch.float32 not in saved
    loss.backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
