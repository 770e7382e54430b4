"""Hand-derived checks of two parity fixes (issue 4): the foreach Adafactor step temporaries and the
LoRA terms that a frozen down projection / full checkpointing add (both measured against CPU runs in
test_lora_parity.py; these pin the formulas without torch).

Tiny Llama (peakmem.measure.parity.FAMILIES): vocab 512, hidden 128, intermediate 344, 2 layers,
4 heads, 2 kv heads (head_dim 32), untied head, no biases. Parameters: embed + head 2 * 512 * 128 =
131072; per layer q, o 128 * 128 each, k, v 128 * 64 each, MLP 3 * 128 * 344, norms 2 * 128 =
181504; final norm 128: 131072 + 2 * 181504 + 128 = 494208.
"""

from __future__ import annotations

from dataclasses import replace

from peakmem.adapters import LoraConfig
from peakmem.formulas import activations as act
from peakmem.formulas import lora as _lora
from peakmem.formulas.optimizer import step_temporaries
from peakmem.hf import spec_from_config
from peakmem.measure.parity import FAMILIES
from peakmem.model import ModelSpec
from peakmem.training import (
    AttentionKernel,
    Checkpointing,
    KernelPolicy,
    Method,
    OptimizerImpl,
    OptimizerName,
    Precision,
    TrainingSetup,
)

LLAMA_PARAMS = 494208


def _adafactor(precision: Precision, impl: OptimizerImpl) -> int:
    spec = spec_from_config(FAMILIES["llama"], name="llama")
    setup = TrainingSetup(precision=precision, optimizer=OptimizerName.ADAFACTOR, optimizer_impl=impl,
                          micro_batch=2, seq_len=64, kernel_policy=KernelPolicy.CPU)  # fmt: skip
    assert spec.params == LLAMA_PARAMS
    return sum(i.bytes for i in step_temporaries(spec, setup))


def test_foreach_adafactor_holds_one_update_per_parameter_in_the_grad_dtype() -> None:
    # _multi_tensor_adafactor: var_estimates over every matrix + the vectors' clones, grad dtype
    assert _adafactor(Precision.FP32, OptimizerImpl.FOREACH) == 4 * LLAMA_PARAMS
    assert _adafactor(Precision.BF16, OptimizerImpl.FOREACH) == 2 * LLAMA_PARAMS
    assert _adafactor(Precision.AMP_BF16, OptimizerImpl.FOREACH) == 4 * LLAMA_PARAMS
    assert _adafactor(Precision.MIXED_BF16, OptimizerImpl.FOREACH) == 4 * LLAMA_PARAMS  # fp32 masters' grads


def test_for_loop_adafactor_counts_the_largest_tensor_only() -> None:
    # transformers Adafactor.step, tensor by tensor: 2 fp32 copies of the largest (512 x 128) tensor
    assert _adafactor(Precision.FP32, OptimizerImpl.FOR_LOOP) == 2 * 4 * 512 * 128


def _gpt2_lora(checkpointing: Checkpointing) -> tuple[ModelSpec, TrainingSetup, act.Shapes]:
    spec = spec_from_config(FAMILIES["gpt2"], name="gpt2")
    setup = TrainingSetup(precision=Precision.FP32, attention=AttentionKernel.SDPA,
                          checkpointing=checkpointing, micro_batch=1, seq_len=128,
                          kernel_policy=KernelPolicy.CPU, method=Method.LORA,
                          lora=LoraConfig(rank=8, targets=("c_attn",)))  # fmt: skip
    return spec, setup, act.shapes(spec, setup)


def test_frozen_down_projection_adds_its_never_saved_input_to_the_backward_transient() -> None:
    spec, setup, sh = _gpt2_lora(Checkpointing.NONE)
    la = act.layer_activations(spec, spec.groups[0].layer, sh, 0)
    adapted = _lora.adapt_layer(spec, 0, la, sh, setup)
    t_x_i = 128 * 512 * 4  # tokens x intermediate, fp32
    assert la.saved_bytes - adapted.saved_bytes >= t_x_i  # c_proj's input is no longer saved...
    assert adapted.backward_transient == la.backward_transient + t_x_i  # ...so nothing of it is freed


def test_full_checkpointing_keeps_the_embedding_output_leaf_and_its_dropout_mask() -> None:
    t_x_h = 128 * 128 * 4  # tokens x hidden, fp32
    ids = {"embed.input_ids": 128 * 8}
    full = {**ids, "embed.dropout_mask": t_x_h, "embed.leaf_output": t_x_h}
    for ckpt, expected in ((Checkpointing.NONE, ids), (Checkpointing.FULL, full)):
        spec, setup, sh = _gpt2_lora(ckpt)
        items = _lora.adapt_embedding_items(spec, act.embedding_items(spec, sh), setup)
        assert {i.key: i.bytes for i in items} == expected
    llama = spec_from_config(FAMILIES["llama"], name="llama")  # the leaf is the first layer's input itself
    setup = replace(_gpt2_lora(Checkpointing.FULL)[1], lora=LoraConfig(rank=8, targets=("q_proj", "v_proj")))
    items = _lora.adapt_embedding_items(llama, act.embedding_items(llama, act.shapes(llama, setup)), setup)
    assert "embed.leaf_output" not in [i.key for i in items]
