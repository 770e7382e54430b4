"""Plain LoRA (peft's ``lora.Linear`` over a 16-bit base) under full checkpointing (formulas/lora/deltas.py
recompute_stop, recompute_backdrop, _recompute_transient): what is alive beyond the recomputed saved
tensors when the down projection's backward begins the layer's recomputation, by hand on a tiny Llama
(hidden 64, intermediate 128, batch 2 x seq 16: T = 32 tokens, rank 4)."""

from __future__ import annotations

import pytest

from peakmem.adapters import LoraConfig
from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas.activations import down_input_bytes, shapes
from peakmem.formulas.lora.deltas import _recompute_transient, recompute_backdrop, recompute_stop
from peakmem.formulas.lora.targets import resolve_targets
from peakmem.hf import spec_from_config
from peakmem.training import Checkpointing, Method, Precision, TrainingSetup

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
T, H, W, R = 32, 64, 128, 4  # tokens, hidden, intermediate width, rank


def _parts(precision: Precision, dropout: float, adapter_dtype: str = "fp32"):  # type: ignore[no-untyped-def]
    lora = LoraConfig(rank=R, dropout=dropout, adapter_dtype=adapter_dtype)  # all-linear
    setup = TrainingSetup(method=Method.LORA, precision=precision, micro_batch=2, seq_len=16, lora=lora,
                          checkpointing=Checkpointing.FULL)  # fmt: skip
    spec = spec_from_config(LLAMA, name="t")
    mods = [m for m in resolve_targets(spec, lora) if m.group == 0]
    return spec, spec.groups[0].layer, mods, lora, shapes(spec, setup)


def _stop(precision: Precision, dropout: float, adapter_dtype: str = "fp32") -> int:
    spec, layer, mods, lora, sh = _parts(precision, dropout, adapter_dtype)
    return recompute_stop(spec, layer, [m for m in mods if m.leaf == "down_proj"], lora, sh)


@pytest.mark.parametrize(("precision", "dropout", "adapter_dtype", "expected"), [
    # autocast, fp32 adapters: the bf16 product, peft's fp32 cast of it and the fp32 dropout output (autocast
    # casts it for lora_A); the bf16 base output, the scaled gradient and the base output's gradient (cast
    # from the fp32 layer output's); the fp32 layer output gradient and MLP input (the fp32 RMSNorm saved
    # the residual)
    (Precision.AMP_BF16, 0.05, "fp32", T * W * (2 + 4 + 4) + T * H * (2 + 2 + 2) + 2 * T * H * 4),
    # no dropout: lora_A reads peft's fp32 cast, which autocast casts: the cast stays alive
    (Precision.AMP_BF16, 0.0, "fp32", T * W * (2 + 4) + T * H * (2 + 2 + 2) + 2 * T * H * 4),
    # no autocast: lora_A saved the fp32 dropout output; the fp32 scaled gradient, the base output's bf16
    # gradient (cast from the sum's fp32 one); the bf16 layer output gradient, MLP input and residual
    (Precision.BF16, 0.05, "fp32", T * W * (2 + 4) + T * H * (2 + 4 + 2) + 3 * T * H * 2),
    # no dropout, no autocast: lora_A saved peft's cast itself
    (Precision.BF16, 0.0, "fp32", T * W * 2 + T * H * (2 + 4 + 2) + 3 * T * H * 2),
    # bf16 adapters: nothing cast; the base output's gradient is the layer output's
    (Precision.BF16, 0.05, "base", T * W * 2 + T * H * (2 + 2) + 3 * T * H * 2),
])  # fmt: skip
def test_alive_when_the_recomputation_stops(
    precision: Precision, dropout: float, adapter_dtype: str, expected: int
) -> None:
    assert _stop(precision, dropout, adapter_dtype) == expected


@pytest.mark.parametrize(("precision", "expected"), [
    # scaled + base output gradients bf16, the layer output's fp32; the MLP input (the residual saved)
    (Precision.AMP_BF16, (T * H * (2 + 2 + 4), T * H * 4)),
    # the scaled gradient fp32, the base output's and the layer output's bf16; the MLP input and residual
    (Precision.BF16, (T * H * (4 + 2 + 2), 2 * T * H * 2)),
])  # fmt: skip
def test_what_the_down_projection_backward_holds(precision: Precision, expected: tuple[int, int]) -> None:
    spec, layer, mods, lora, sh = _parts(precision, 0.05)
    assert recompute_backdrop(spec, layer, [m for m in mods if m.leaf == "down_proj"], lora, sh) == expected


def test_up_proj_recomputes_next_to_the_backdrop() -> None:
    """bf16, fp32 adapters, no dropout: up_proj's adapter forward (bf16 base output, fp32 lora_B output and
    its scaled copy) runs after gate_proj and the activation were recomputed; up_proj's own output and the
    down adapter's saved tensors come later, so they are not alive yet. The MLP saves gate, act and up
    outputs (the frozen down projection dropped the product)."""
    _, _, mods, lora, sh = _parts(Precision.BF16, 0.0)
    mlp = [m for m in mods if m.leaf in ("gate_proj", "up_proj")]
    saved = (MemoryItem(path="mlp", category=Category.ACTIVATIONS, bytes=3 * T * W * 2, source="t",
                        key="mlp.interior"),)  # fmt: skip
    down_saved = T * W * 4 + T * R * 4  # lora_A's fp32 input (peft's cast), its fp32 output
    alive = 10_000
    got = _recompute_transient(saved, [], [], mlp, [], lora, sh, backdrop=(alive, down_saved, T * W * 2))
    assert got == T * W * (2 + 4 + 4) - T * W * 2 - down_saved + alive


GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 128, "n_embd": 64,
        "n_layer": 2, "n_head": 4, "n_positions": 64}  # fmt: skip


@pytest.mark.parametrize(("precision", "expected"), [(Precision.AMP_BF16, 4), (Precision.BF16, 2)])
def test_gelu_new_makes_an_fp32_down_input_under_cuda_autocast(precision: Precision, expected: int) -> None:
    """transformers' gelu_new, 0.5 x (1 + tanh(...)), under CUDA autocast: ``pow`` runs in fp32, so the
    product handed to c_proj is fp32; peft's cast to the fp32 adapters is then no copy. The stop holds the
    fp32 product and the fp32 dropout output (autocast casts it for lora_A), the bf16 base output, scaled
    gradient and base output gradient, the fp32 layer output gradient and ln_2 output (LayerNorm saved
    the residual)."""
    lora = LoraConfig(rank=R, dropout=0.05)
    setup = TrainingSetup(method=Method.LORA, precision=precision, micro_batch=2, seq_len=16, lora=lora,
                          checkpointing=Checkpointing.FULL)  # fmt: skip
    spec = spec_from_config(GPT2, name="g")
    sh = shapes(spec, setup)
    layer = spec.groups[0].layer
    assert down_input_bytes(layer.mlp, sh) == expected
    if precision is Precision.AMP_BF16:
        down = [m for m in resolve_targets(spec, lora) if m.group == 0 and m.in_features == 4 * H]
        stop = recompute_stop(spec, layer, down, lora, sh)
        assert stop == T * 4 * H * (4 + 4) + T * H * (2 + 2 + 2) + 2 * T * H * 4
