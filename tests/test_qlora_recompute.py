"""QLoRA under full checkpointing (formulas/lora/deltas.py recompute_stop, _down_input_gradients):
what is alive when the recomputation stops at the adapted down projection, by hand on a tiny Llama
(hidden 64, intermediate 128, batch 2 x seq 16: T = 32 tokens)."""

from __future__ import annotations

import pytest

from peakmem.adapters import LoraConfig, QuantConfig
from peakmem.estimate import estimate_training
from peakmem.formulas.activations import shapes
from peakmem.formulas.lora.deltas import _down_input_gradients, recompute_stop
from peakmem.formulas.lora.targets import resolve_targets
from peakmem.hf import spec_from_config
from peakmem.training import Checkpointing, Method, Precision, TrainingSetup

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
T, H, W = 32, 64, 128  # tokens, hidden, intermediate width


def _stop(prep: str, precision: Precision, dropout: float = 0.05) -> int:
    lora = LoraConfig(rank=4, dropout=dropout)  # all-linear, fp32 adapters (peft's default)
    setup = TrainingSetup(method=Method.QLORA, precision=precision, micro_batch=2, seq_len=16, lora=lora,
                          checkpointing=Checkpointing.FULL, quant=QuantConfig(kbit_prep=prep))  # fmt: skip
    spec = spec_from_config(LLAMA, name="t")
    sh = shapes(spec, setup)
    down = [m for m in resolve_targets(spec, lora) if m.leaf == "down_proj" and m.group == 0]
    return recompute_stop(spec, spec.groups[0].layer, down, lora, sh)


@pytest.mark.parametrize(("prep", "precision", "expected"), [
    # bf16 everywhere, the dropout output saved as lora_A's input: the product, the base output, the
    # scaled lora_B gradient, the MLP input, the layer output's gradient and the residual (the second norm
    # saved an fp32 copy, not it)
    ("none", Precision.AMP_BF16, T * W * 2 + T * H * (2 + 2) + 3 * T * H * 2),
    # fp32 norms: an fp32 interior whose dropout output autocast casts for lora_A (both alive), fp32 base
    # output, bf16 scaled gradient; the fp32 residual is the second norm's saved input
    ("peft", Precision.AMP_BF16, T * W * (4 + 4) + T * H * (4 + 2) + 2 * T * H * 4),
    # no autocast: peft's bnb wrapper casts the bf16 product to the fp32 adapters (the copy the dropout
    # read stays alive), the scaled gradient in the adapters' fp32
    ("none", Precision.BF16, T * W * (2 + 4) + T * H * (2 + 4) + 3 * T * H * 2),
    # an fp32 interior already in the adapters' dtype: nothing cast
    ("peft", Precision.BF16, T * W * 4 + T * H * (4 + 4) + 2 * T * H * 4),
])  # fmt: skip
def test_alive_when_the_recomputation_stops(prep: str, precision: Precision, expected: int) -> None:
    assert _stop(prep, precision) == expected


def test_no_dropout_no_uncast_copy() -> None:
    """lora_dropout 0: peft's Identity hands lora_A the tensor it casts itself (autocast's cast is saved)."""
    assert _stop("peft", Precision.AMP_BF16, dropout=0.0) == T * W * 4 + T * H * (4 + 2) + 2 * T * H * 4


def test_no_dropout_bf16_product_saved_by_lora_a() -> None:
    """lora_dropout 0, the unprepared base under autocast: peft's bnb wrapper casts nothing and autocast
    passes the bf16 product through, so lora_A saved the product itself (counted with the layer's saved
    tensors): the base output, the scaled gradient, the MLP input, the layer output's gradient, the
    residual."""
    assert _stop("none", Precision.AMP_BF16, dropout=0.0) == T * H * (2 + 2) + 3 * T * H * 2


def _layer_items(prep: str, dropout: float) -> dict[str, int]:
    lora = LoraConfig(rank=4, dropout=dropout)
    setup = TrainingSetup(method=Method.QLORA, precision=Precision.AMP_BF16, micro_batch=2, seq_len=16,
                          lora=lora, quant=QuantConfig(kbit_prep=prep))  # fmt: skip
    items = estimate_training(spec_from_config(LLAMA, name="t"), setup).items
    return {i.key: i.bytes for i in items if i.path.startswith("layers[0:1].") and i.key}


def test_no_dropout_bf16_inputs_saved_once() -> None:
    """The unprepared base under autocast, lora_dropout 0: q / k / v's lora_A save the one bf16 norm
    output, gate / up's the other, o_proj's the SDPA output, down_proj's the product: no adapter copy
    (each would be a T x in bf16 cast with peft's fp32 norms, or with dropout)."""
    items = _layer_items("none", 0.0)
    assert "lora.adapter_inputs" not in items
    assert (items["input.attn"], items["input.mlp"]) == (T * H * 2, T * H * 2)
    assert items["mlp.interior"] == 4 * T * W * 2  # gate, act(gate), up and the product, bf16
    with_dropout = _layer_items("none", 0.05)
    # dropout output (bf16: the input's own dtype) and its 1-byte mask (CUDA) per adapted module's input
    ins = 3 * H + H + 2 * H + W
    assert with_dropout["lora.adapter_inputs"] == T * ins * (2 + 1)
    assert "input.attn" not in with_dropout


@pytest.mark.parametrize(("prep", "precision", "expected"), [
    ("none", Precision.AMP_BF16, 2 + 2),  # under autocast peft's bnb wrapper casts nothing: both bf16
    ("peft", Precision.AMP_BF16, 4 + 4),  # fp32 interior
    ("none", Precision.BF16, 2 + 4),  # without autocast lora_A reads the fp32 cast
])  # fmt: skip
def test_down_input_gradients_follow_the_input_dtype(prep: str, precision: Precision, expected: int) -> None:
    lora = LoraConfig(rank=4, dropout=0.05)
    setup = TrainingSetup(method=Method.QLORA, precision=precision, micro_batch=2, seq_len=16, lora=lora,
                          quant=QuantConfig(kbit_prep=prep))  # fmt: skip
    spec = spec_from_config(LLAMA, name="t")
    sh = shapes(spec, setup)
    assert _down_input_gradients(spec.groups[0].layer, sh, setup.quant, 4) == expected


def test_prepared_base_without_autocast_runs_fp32_attention() -> None:
    """Behind fp32 norms without autocast SDPA gets fp32 q / k / v: with 4 query and 2 k/v heads
    (``enable_gqa``) CUDA has no fp32 kernel but the math one, which saves the fp32 scores' softmax:
    batch 2 x 4 heads x 16 x 16 x 4 bytes a layer (kernels.py cuda_sdpa_backend)."""
    setup = TrainingSetup(method=Method.QLORA, precision=Precision.BF16, micro_batch=2, seq_len=16,
                          lora=LoraConfig(rank=4), quant=QuantConfig(kbit_prep="peft"))  # fmt: skip
    spec = spec_from_config(LLAMA, name="t")
    sh = shapes(spec, setup)
    assert (sh.c, sh.kernel.value) == (4, "eager")
    items = estimate_training(spec, setup).items
    softmax = [i.bytes for i in items if i.key == "attn.softmax" and i.path.startswith("layers[0:1].")]
    assert softmax == [2 * 4 * 16 * 16 * 4]


@pytest.mark.parametrize(("seq", "dropout", "expected"), [
    # T = 32 < H: the base's matmul state (its input gradient and the dequantized weight, lora_A's
    # input gradient, the product freed by lora_A's backward) tops the three-gradient sum by W - T x I
    (16, 0.0, 512 * 64 * 2 - 32 * 512 * 2),
    (128, 0.0, 0),  # T = 256 > H: the out-of-place sum (T x I) outweighs the weight (I x H)
    (16, 0.05, 512 * 64 * 2),  # dropout: lora_A's path gradient is fresh, summed in place: W on top
    (128, 0.05, 512 * 64 * 2),
])  # fmt: skip
def test_dequantized_down_weight_not_at_the_summed_gradient(
    monkeypatch: pytest.MonkeyPatch, seq: int, dropout: float, expected: int
) -> None:
    """What the dequantized 4-bit weight (I x H bf16) adds to an MLP-bound layer's backward (I = 512):
    bitsandbytes frees it inside MatMul4Bit.backward, before autograd sums the adapted down projection's
    two input gradients (deltas.SRC_DEQUANT_RELIEF)."""
    import peakmem.formulas.lora.deltas as deltas
    from peakmem.formulas import activations as act
    from peakmem.formulas.qlora import DequantTemporaries

    config = {**LLAMA, "intermediate_size": 512}
    setup = TrainingSetup(method=Method.QLORA, precision=Precision.AMP_BF16, micro_batch=2, seq_len=seq,
                          lora=LoraConfig(rank=4, dropout=dropout), checkpointing=Checkpointing.FULL,
                          quant=QuantConfig())  # fmt: skip
    spec = spec_from_config(config, name="t")
    sh = shapes(spec, setup)
    g = len(spec.groups) - 1

    def backward() -> int:
        la = act.layer_activations(spec, spec.groups[g].layer, sh)
        return deltas.adapt_layer(spec, g, la, sh, setup).backward_transient

    with_weight = backward()
    monkeypatch.setattr(
        deltas, "dequant_temporaries", lambda *a, **k: DequantTemporaries(forward=0, backward=0)
    )
    assert with_weight - backward() == expected
