"""axolotl's QLoRA preparation (``--kbit-prep axolotl``, formulas/kbit_prep.py): peft's fp32 upcast, then
every module named *norm* and the embeddings / head back to the float dtype; by hand on tiny specs."""

from __future__ import annotations

from peakmem.adapters import LoraConfig, QuantConfig
from peakmem.formulas.activations import shapes
from peakmem.formulas.kbit_prep import unquantized_dtype
from peakmem.formulas.qlora import base_bytes
from peakmem.hf import spec_from_config
from peakmem.model import Tensor, TensorKind
from peakmem.training import Checkpointing, Method, Precision, TrainingSetup

QWEN2 = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "tie_word_embeddings": False,
}  # fmt: skip
EMBED = HEAD = 128 * 64
NORMS = 64 + 2 * 2 * 64  # final norm, input + post-attention norm per layer
BIASES = 2 * (64 + 32 + 32)  # q, k, v biases per layer: bitsandbytes quantizes the weight only


def nf4(numel: int) -> int:
    return numel // 2 + numel // 64 * 4 + 64  # packed, fp32 absmax per 64, 16-entry code


QUANTIZED = 2 * sum(nf4(n) for n in (64 * 64, 32 * 64, 32 * 64, 64 * 64, 128 * 64, 128 * 64, 128 * 64))


def test_axolotl_keeps_only_the_biases_fp32() -> None:
    spec = spec_from_config(QWEN2, name="t")
    float16 = 2 * (EMBED + HEAD + NORMS)
    assert base_bytes(spec, QuantConfig(kbit_prep="none")) == QUANTIZED + float16 + 2 * BIASES
    assert base_bytes(spec, QuantConfig(kbit_prep="axolotl")) == QUANTIZED + float16 + 4 * BIASES
    assert base_bytes(spec, QuantConfig(kbit_prep="peft")) == QUANTIZED + 2 * float16 + 4 * BIASES


def test_axolotl_residual_stays_16_bit() -> None:
    """Its norms are bf16 again, so no fp32 norm product makes the residual fp32 (peft's does)."""

    def residual(prep: str) -> int:
        setup = TrainingSetup(
            method=Method.QLORA, precision=Precision.AMP_BF16, micro_batch=2, seq_len=16,
            checkpointing=Checkpointing.FULL, lora=LoraConfig(rank=4, targets=("q_proj",)),
            quant=QuantConfig(quant="nf4", kbit_prep=prep),
        )  # fmt: skip
        return shapes(spec_from_config(QWEN2, name="t"), setup).r

    assert (residual("axolotl"), residual("peft")) == (2, 4)


def test_axolotl_name_rule_on_a_gated_deltanet_layer() -> None:
    """Qwen3.5's linear attention (transformers 5.3.0 Qwen3_5GatedDeltaNet): its gated norm is named *norm*
    (back to bf16); ``A_log``, ``dt_bias`` and the depthwise ``conv1d`` are not, so they stay fp32."""
    quant = QuantConfig(kbit_prep="axolotl")

    def dtype(name: str, kind: TensorKind) -> str:
        return unquantized_dtype(Tensor(name=name, module=name.split(".")[-2], shape=(4,),
                                        component="attention", kind=kind), quant)  # fmt: skip

    assert dtype("linear_attn.norm.weight", "norm") == "bf16"
    assert [dtype(f"linear_attn.{n}", "other") for n in ("A_log", "dt_bias", "conv1d.weight")] == ["fp32"] * 3
