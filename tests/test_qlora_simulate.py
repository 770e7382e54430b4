"""QLoRA under the simulator as bitsandbytes, peft and TRL run it (simulate/fakeify.py), and the formulas
against it.

The stand-in 4-bit Linear returns its input's dtype and runs outside autocast (bitsandbytes' Linear4bit);
the float weights are loaded in the quantized base's float dtype and prepared as peft's
``prepare_model_for_kbit_training`` and TRL's / axolotl's casts leave them. Under autocast without
checkpointing the formulas agree with it within 3 % for every preparation (measured 2026-12-06: -0.9 ..
+1.5 %; they read +6.4 .. +10.3 % before the formulas dropped the quantized Linears' autocast weight casts
and kept the MLP interior in the prepared norms' fp32). Not yet within 3 %, and not asserted: full
checkpointing (-9.4 .. +6.1 %) and the prepared base without autocast (-19 %: its attention runs in fp32).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from peakmem.adapters import LoraConfig, QuantConfig  # noqa: E402
from peakmem.cli import main  # noqa: E402
from peakmem.estimate import estimate_training  # noqa: E402
from peakmem.hf import spec_from_config  # noqa: E402
from peakmem.simulate import simulate_training  # noqa: E402
from peakmem.training import Checkpointing, Method, Precision, TrainingSetup  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # importing peft takes seconds
LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 256,
    "intermediate_size": 704, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
TOLERANCE = 0.03


def _setup(prep: str) -> TrainingSetup:
    return TrainingSetup(method=Method.QLORA, precision=Precision.AMP_BF16, micro_batch=2, seq_len=256,
                         checkpointing=Checkpointing.NONE, quant=QuantConfig(kbit_prep=prep),
                         lora=LoraConfig(rank=8, dropout=0.05))  # fmt: skip


@pytest.mark.parametrize("prep", ["none", "peft", "trl"])
def test_formulas_agree_with_the_simulated_qlora_step(prep: str) -> None:
    setup = _setup(prep)
    analytic = estimate_training(spec_from_config(LLAMA, name="t"), setup).peak_allocated_bytes
    simulated = simulate_training(LLAMA, setup, lora=setup.lora).peak_allocated_bytes
    assert abs(analytic / simulated - 1) <= TOLERANCE


@pytest.mark.parametrize(
    ("prep", "embed", "norm"),
    [("none", torch.bfloat16, torch.bfloat16), ("peft", torch.float32, torch.float32),
     ("trl", torch.bfloat16, torch.float32), ("axolotl", torch.bfloat16, torch.bfloat16)],
)  # fmt: skip
def test_the_simulated_float_weights_follow_the_preparation(
    prep: str, embed: torch.dtype, norm: torch.dtype
) -> None:
    from peakmem.simulate.fakeify import Fake4bitLinear, prepare_adapters
    from peakmem.simulate.runner import build_meta_model

    setup = _setup(prep)
    model = build_meta_model(LLAMA, setup)
    prepare_adapters(model, setup, setup.lora)
    assert model.model.embed_tokens.weight.dtype == embed
    assert model.model.layers[0].input_layernorm.weight.dtype == norm
    assert isinstance(model.model.layers[0].mlp.gate_proj.base_layer, Fake4bitLinear)
    adapters = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    assert adapters == {torch.float32}


def test_simulate_json_echoes_a_qlora_setup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The simulated setup carries its QuantConfig as a dict, as train's does ('simulate --method qlora
    --json' failed with 'QuantConfig is not JSON serializable' until 2026-12-06)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    common = ["--method", "qlora", "--kbit-prep", "trl", "--batch", "1", "--seq", "16", "--json"]
    assert main(["simulate", str(path), *common]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert main(["train", str(path), *common]) == 0
    analytic = json.loads(capsys.readouterr().out)
    assert simulated["setup"]["quant"] == analytic["setup"]["quant"]
    assert simulated["setup"]["quant"]["kbit_prep"] == "trl"
