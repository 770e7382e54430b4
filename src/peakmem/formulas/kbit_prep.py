"""peft's ``prepare_model_for_kbit_training`` and TRL's casting after it: the dtypes of a quantized base's
non-quantized weights, and what they do to the activations.

Sources (read at these releases):

* peft 0.13.0 and 0.21.2 ``peft/utils/other.py`` ``prepare_model_for_kbit_training``: freezes every
  parameter, then casts every fp16/bf16 parameter that is not a ``Params4bit`` to fp32
  (``param.data = param.data.to(torch.float32)``): embeddings, norms, the head, biases, routers (int8
  weights are int8, 4-bit ones uint8: untouched); with ``use_gradient_checkpointing`` it enables input
  grads and ``gradient_checkpointing_enable``.
* TRL 0.13.0 ``trl/trainer/sft_trainer.py`` ``SFTTrainer.__init__``: a 4-bit (not sharded: FSDP / ZeRO-3
  "sharded QLoRA" skips both) or 8-bit model with a ``peft_config`` gets ``prepare_model_for_kbit_training``,
  then ``get_peft_model`` (fp32 adapters), then under ``args.bf16`` ``peft_module_casting_to_bf16``
  (``trl/trainer/utils.py``): modules named ``*norm*`` (and LayerNorms) to fp32, ``lm_head`` /
  ``embed_tokens`` / ``wte`` / ``wpe`` back to bf16. TRL 1.16's SFTTrainer no longer calls either (only
  its experimental ORPO / CPO trainers do); which releases of which trainer do: peakmem.trl_versions
  (``--trl``).

Activations (transformers 4.48 / 5.23 ``LlamaRMSNorm.forward``:
``self.weight * hidden_states.to(input_dtype)``;
bitsandbytes 0.43.3 / 0.50.2 ``nn.Linear4bit.forward``: ``x.to(compute_dtype)`` in, ``out.to(inp_dtype)``
out): an fp32 norm weight times a 16-bit input is fp32 (``mul`` is on no autocast list), so each norm's
output is fp32, the quantized Linears reading it return fp32, and the first residual add with them
makes the residual stream fp32 for every later layer, with or without autocast. Measured on the CPU
(torch 2.13, transformers 5.23, peft 0.21.2, bitsandbytes 0.50.2, bf16 autocast;
tests/test_kbit_prep_torch.py): norm, ``q_proj``, ``gate_proj``, ``down_proj`` and layer outputs fp32;
``o_proj`` (reading the attention's 16-bit output) and the logits bf16.
"""

from __future__ import annotations

from peakmem import dtypes
from peakmem.adapters import QuantConfig
from peakmem.dtypes import DType
from peakmem.model import Tensor

SRC_KBIT_PREP = (
    "peft 0.13/0.21.2 utils/other.py prepare_model_for_kbit_training: non-quantized fp16/bf16 parameters "
    "cast to fp32; TRL 0.13 trainer/utils.py peft_module_casting_to_bf16 (bf16): norms fp32, "
    "embeddings and lm_head back to bf16"
)
# TRL 0.13 peft_module_casting_to_bf16: these module names go back to bf16 after the fp32 upcast
TRL_BF16_COMPONENTS = ("embeddings", "positions", "head")


def prepared(quant: QuantConfig | None) -> bool:
    """Did peft's ``prepare_model_for_kbit_training`` run on the quantized base?"""
    return quant is not None and quant.kbit_prep != "none"


def unquantized_dtype(t: Tensor, quant: QuantConfig) -> str:
    """The dtype a non-quantized base tensor is kept in: the float dtype it was loaded in, fp32 after
    ``prepare_model_for_kbit_training``, and back to the float dtype for the embeddings and the head
    after TRL's ``peft_module_casting_to_bf16`` (:data:`SRC_KBIT_PREP`)."""
    if quant.kbit_prep == "none":
        return quant.float_dtype
    if quant.kbit_prep == "trl" and t.component in TRL_BF16_COMPONENTS:
        return quant.float_dtype
    return "fp32"


def head_dtype(quant: QuantConfig | None, loaded: DType) -> DType:
    """The head weight's dtype when the head is not quantized (``loaded``: without preparation)."""
    if quant is None or quant.kbit_prep != "peft":
        return loaded
    return dtypes.FP32


def residual_dtype(quant: QuantConfig | None, planned: DType) -> DType:
    """The residual stream's dtype over a quantized base: fp32 once the prepared fp32 norms feed the
    quantized Linears (module docstring), else the float dtype its embeddings and norms were loaded in
    (autocast casts no 16-bit weight up: the precision's fp32 residual needs fp32 weights); ``planned``
    without a quantized base."""
    if quant is None:
        return planned
    return dtypes.FP32 if prepared(quant) else dtypes.parse_dtype(quant.float_dtype)


__all__ = ["SRC_KBIT_PREP", "head_dtype", "prepared", "residual_dtype", "unquantized_dtype"]
