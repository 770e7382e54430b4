"""peft's prepare_model_for_kbit_training and TRL 0.13's casting (formulas/kbit_prep.py), and autocast's
weight cache over a frozen base (formulas/autocast_cache.py), on a tiny Llama, by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from peakmem.adapters import LoraConfig, QuantConfig
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.formulas.activations import shapes
from peakmem.formulas.qlora import base_bytes
from peakmem.hf import spec_from_config
from peakmem.training import Checkpointing, Method, Precision, TrainingSetup

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
EMBED = HEAD = 128 * 64
NORMS = 64 + 2 * 2 * 64  # final norm, input + post-attention norm per layer


def nf4(numel: int) -> int:
    return numel // 2 + numel // 64 * 4 + 64  # packed, fp32 absmax per 64, 16-entry code


QUANTIZED = 2 * sum(nf4(n) for n in (64 * 64, 32 * 64, 32 * 64, 64 * 64, 128 * 64, 128 * 64, 128 * 64))


def _setup(prep: str, precision: Precision = Precision.AMP_BF16) -> TrainingSetup:
    return TrainingSetup(
        method=Method.QLORA, precision=precision, micro_batch=2, seq_len=16, checkpointing=Checkpointing.FULL,
        lora=LoraConfig(rank=4, targets=("q_proj", "v_proj")), quant=QuantConfig(quant="nf4", kbit_prep=prep),
    )  # fmt: skip


def test_prepared_weights_fp32_and_trl_casts_embeddings_back() -> None:
    spec = spec_from_config(LLAMA, name="t")
    assert base_bytes(spec, QuantConfig(kbit_prep="none")) == QUANTIZED + 2 * (EMBED + HEAD + NORMS)
    assert base_bytes(spec, QuantConfig(kbit_prep="peft")) == QUANTIZED + 4 * (EMBED + HEAD + NORMS)
    assert base_bytes(spec, QuantConfig(kbit_prep="trl")) == QUANTIZED + 2 * (EMBED + HEAD) + 4 * NORMS


@pytest.mark.parametrize(("prep", "precision", "residual", "compute"), [
    ("none", Precision.AMP_BF16, 2, 2),  # 16-bit norms and embeddings: autocast casts nothing up
    ("none", Precision.BF16, 2, 2),
    ("trl", Precision.AMP_BF16, 4, 2),  # fp32 norm weight x bf16 hidden -> fp32, Linear4bit returns it
    # without autocast too, and nothing casts the layers' work back: q / k / v, the attention and the
    # adapters run in fp32 (kbit_prep.compute_dtype)
    ("peft", Precision.BF16, 4, 4),
])  # fmt: skip
def test_residual_stream_dtype(prep: str, precision: Precision, residual: int, compute: int) -> None:
    sh = shapes(spec_from_config(LLAMA, name="t"), _setup(prep, precision))
    assert (sh.r, sh.c) == (residual, compute)


def test_checkpointed_layer_inputs_double_when_prepared() -> None:
    """Full checkpointing keeps each layer's input: batch x seq x hidden in the residual dtype."""
    spec = spec_from_config(LLAMA, name="t")

    def kept(prep: str) -> int:
        est = estimate_training(spec, _setup(prep))
        return sum(i.bytes for i in est.items if "layer input (checkpoint)" in i.path)

    assert kept("trl") - kept("none") == 2 * 16 * 64 * (4 - 2) * 2  # tokens x hidden x 2 more bytes x layers


def _layer_items(prep: str, checkpointing: Checkpointing = Checkpointing.NONE) -> dict[str, int]:
    """The first layer's saved tensors by key, QLoRA on the tiny Llama under autocast."""
    spec = spec_from_config(LLAMA, name="t")
    setup = _setup(prep)
    est = estimate_training(spec, TrainingSetup(**{**setup.__dict__, "checkpointing": checkpointing}))
    return {i.path.split("].", 1)[1]: i.bytes for i in est.items if i.path.startswith("layers[0:1].")}


@pytest.mark.parametrize("prep", ["none", "trl"])
def test_quantized_linears_make_no_autocast_weight_casts(prep: str) -> None:
    """bitsandbytes' 4-bit matmul saves its quantized weight, never a 16-bit cast (qlora.SRC_QUANT_NO_CAST):
    every layer Linear is quantized, so the layer lists no autocast weight casts (it listed the 7
    projections' 16-bit copies, 73,728 B a layer, until 2026-12-06)."""
    assert not any("autocast weight casts" in k for k in _layer_items(prep))


def test_the_mlp_interior_follows_the_prepared_norms() -> None:
    """Behind peft's / TRL's fp32 norms the 4-bit gate and up projections return fp32 (Linear4bit's
    ``.to(inp_dtype)``), and so do SiLU and the product: gate, act(gate) and up are saved in 4 bytes, not
    2; the product, the down projection's input, is not saved by the frozen 4-bit down projection."""
    tokens, width = 2 * 16, 128
    none, trl = _layer_items("none"), _layer_items("trl")
    interior = "mlp.gate, act(gate), up, product"
    assert none[interior] == 3 * tokens * width * 2
    assert trl[interior] == 3 * tokens * width * 4


def test_autocast_cache_holds_only_the_adapters() -> None:
    """autocast_mode.cpp caches fp32 leaves that require grad: LoRA A/B of q and v, not the frozen base."""
    from peakmem.formulas.autocast_cache import weight_cache
    from peakmem.formulas.memo import Memo
    from peakmem.formulas.technique import technique

    spec = spec_from_config(LLAMA, name="t")
    setup = _setup("none")
    tech = technique(spec, setup)
    groups = tuple((i, g.count) for i, g in enumerate(tech.spec.groups))
    cache = weight_cache(tech, setup, groups, 1, Memo())
    adapters = 2 * 4 * ((64 + 64) + (64 + 32))  # layers x r x ((in + out) of q, of v)
    assert [i.bytes for i in cache] == [adapters * 2]  # their bf16 casts
    assert estimate_training(spec, setup).trainable_params == adapters


def test_bad_kbit_prep_names_the_field() -> None:
    with pytest.raises(InputError, match="kbit_prep"):
        QuantConfig(kbit_prep="unsloth")
    out = subprocess.run(
        [sys.executable, "-m", "peakmem", "train", "llama-3.1-8b", "--method", "lora", "--kbit-prep", "peft"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
