"""A derived model's QLoRA blocks under bitsandbytes < 0.43.2: the 4-bit stand-ins keep their inputs
(simulate/fakeify.py ``_Dequant4bitMatmul`` with ``keep``), as ``MatMul4Bit`` does with ``ctx.tensors =
(A, B)`` (peakmem.bnb_versions), in a family of their own (formulas/activations/shapes.py
``QUANT_KEEPS_INPUT``).

Hand-derived on a tiny Phi block (one LayerNorm feeding attention and MLP), LoRA with dropout on every
Linear (so no adapter keeps a base Linear's input itself), T = 2 x 16 tokens, bf16 (c = 2 B): a middle
block keeps the norm's output read by q/k/v and fc1 (T h c, one tensor), dense's input (T h c) and fc2's
input (T I c) beyond what it keeps under the current release.
"""

from __future__ import annotations

import pytest

from peakmem.adapters import LoraConfig, QuantConfig
from peakmem.formulas.activations.shapes import QUANT_KEEPS_INPUT, derived_family
from peakmem.model import FIRST_BLOCK, LAST_BLOCK
from peakmem.training import Method, Precision, TrainingSetup

TARGETS = ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2")
B, S = 2, 16


def _setup(bnb: str) -> TrainingSetup:
    lora = LoraConfig(rank=4, alpha=8, dropout=0.05, targets=TARGETS, adapter_dtype="base")
    return TrainingSetup(precision=Precision.BF16, micro_batch=B, seq_len=S, method=Method.QLORA, lora=lora,
                         quant=QuantConfig(quant="nf4"), bitsandbytes=bnb)  # fmt: skip


def test_the_old_release_is_a_family_of_its_own() -> None:
    old, new = derived_family(_setup("0.42.0")), derived_family(_setup("0.43.2"))
    assert old == new + QUANT_KEEPS_INPUT and QUANT_KEEPS_INPUT not in new


@pytest.mark.torch
def test_the_4bit_stand_ins_keep_their_inputs_before_0_43_2() -> None:
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    from peakmem.simulate.derive import step, tiny_config

    phi = dict(tiny_config("phi"), num_hidden_layers=2, resid_pdrop=0.0, hidden_act="gelu_pytorch_tanh")
    saved = {bnb: step.measure_one(phi, _setup(bnb), cut="none") for bnb in ("0.42.0", "0.43.2")}
    key = next(k for k in saved["0.42.0"] if not k.endswith((FIRST_BLOCK, LAST_BLOCK)))  # the second block
    t, h, inter = B * S, phi["hidden_size"], phi["intermediate_size"]
    assert saved["0.42.0"][key].saved - saved["0.43.2"][key].saved == t * (h + h + inter) * 2
