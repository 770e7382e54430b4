"""``adapter_dtype="base"`` in the fake-tensor steps (simulate/fakeify.py ``adapters_to_base_dtype``).

peft casts a new adapter to its base layer's dtype (``autocast_adapter_dtype=False``) but skips adapters on
the meta device, where the derived blocks and ``peakmem simulate`` build them: they stayed fp32 in a bf16
model, and every adapter input the step saved was an fp32 copy (a phi-2 LoRA under Lit-GPT's bf16-true:
+20 % over the published peak). Hand-derived: in a bf16 model "base" means bf16: the adapters' dtype, and a
block saves exactly what it saves with ``adapter_dtype="bf16"``.
"""

from __future__ import annotations

import pytest

from peakmem.adapters import LoraConfig
from peakmem.training import Method, Precision, TrainingSetup

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

TARGETS = ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2")


def _setup(adapter_dtype: str) -> TrainingSetup:
    lora = LoraConfig(rank=4, alpha=8, dropout=0.05, targets=TARGETS, adapter_dtype=adapter_dtype)
    return TrainingSetup(precision=Precision.BF16, micro_batch=2, seq_len=16, method=Method.LORA, lora=lora)


@pytest.fixture(scope="module")
def phi() -> dict:  # type: ignore[type-arg]
    from peakmem.simulate.derive import tiny_config

    return dict(tiny_config("phi"), num_hidden_layers=2, resid_pdrop=0.0, hidden_act="gelu_pytorch_tanh")


def test_base_adapters_take_the_base_layers_dtype(phi) -> None:  # type: ignore[no-untyped-def]
    from peakmem.simulate.derive.build import build_meta
    from peakmem.simulate.fakeify import prepare_adapters

    dtypes = {}
    for adapter_dtype in ("base", "fp32"):
        model = build_meta(phi).to(dtype=torch.bfloat16)
        setup = _setup(adapter_dtype)
        prepare_adapters(model, setup, setup.lora)
        dtypes[adapter_dtype] = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    assert dtypes == {"base": {torch.bfloat16}, "fp32": {torch.float32}}


def test_a_block_saves_with_base_adapters_what_it_saves_with_bf16_ones(phi) -> None:  # type: ignore[no-untyped-def]
    from peakmem.simulate.derive import step

    saved = {d: min(step.measure_one(phi, _setup(d), cut="none").items())[1].saved for d in ("base", "bf16")}
    assert saved["base"] == saved["bf16"]  # before the cast: the fp32 adapters' inputs, 1.5 to 2 x more
