"""peft's ``prepare_model_for_kbit_training`` on a real bitsandbytes nf4 base (CPU): the dtypes
peakmem.formulas.kbit_prep says it leaves. The unquantized weights become fp32; an fp32 norm weight
times a bf16 input is fp32, the 4-bit Linears reading it return their input's dtype, so the norm,
q_proj, gate/down_proj and layer outputs are fp32 while o_proj (reading the attention's bf16 output)
and the logits stay bf16, under the Trainer's bf16 autocast. Without the preparation everything stays
bf16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from peakmem import dtypes  # noqa: E402
from peakmem.adapters import QuantConfig  # noqa: E402
from peakmem.formulas import kbit_prep  # noqa: E402
from tiny_models import LLAMA  # noqa: E402

pytestmark = pytest.mark.torch


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


def _output_dtypes(folder: Path, prepare: bool) -> dict[str, Any]:
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=bnb, dtype=torch.bfloat16, device_map="cpu"
    )
    if prepare:
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    layer = model.model.layers[1]
    seen: dict[str, Any] = {"embed weight": model.model.embed_tokens.weight.dtype}
    for name, module in (("norm", layer.input_layernorm), ("q_proj", layer.self_attn.q_proj),
                         ("o_proj", layer.self_attn.o_proj), ("gate_proj", layer.mlp.gate_proj),
                         ("down_proj", layer.mlp.down_proj), ("layer", layer)):  # fmt: skip
        module.register_forward_hook(lambda _m, _i, out, name=name: seen.__setitem__(name, _first(out).dtype))
    # the HF Trainer's bf16=True: autocast (CPU's lists put SDPA and linear in bf16, as CUDA's do)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        seen["logits"] = model(torch.ones(1, 8, dtype=torch.long)).logits.dtype
    return seen


def test_prepared_nf4_base_runs_its_norms_and_residual_stream_in_fp32(tmp_path: Path) -> None:
    # bitsandbytes 0.50.2's CPU 4-bit packing wants output widths in multiples of 32 (functional.py
    # block_n): hidden 256, intermediate 704
    shape = {**LLAMA, "hidden_size": 256, "intermediate_size": 704}
    config = transformers.AutoConfig.for_model(**{k: v for k, v in shape.items() if k != "architectures"})
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    fp32, bf16 = torch.float32, torch.bfloat16
    assert _output_dtypes(tmp_path, prepare=True) == {
        "embed weight": fp32, "norm": fp32, "q_proj": fp32, "o_proj": bf16, "gate_proj": fp32,
        "down_proj": fp32, "layer": fp32, "logits": bf16,
    }  # fmt: skip
    assert set(_output_dtypes(tmp_path, prepare=False).values()) == {bf16}
    # what the formula says for the same two bases
    assert kbit_prep.residual_dtype(QuantConfig(kbit_prep="peft"), dtypes.BF16) is dtypes.FP32
    assert kbit_prep.residual_dtype(QuantConfig(), dtypes.FP32) is dtypes.BF16
