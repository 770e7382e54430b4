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
* axolotl ``src/axolotl/loaders/model.py`` (@372f664c and @c1193823) ``_configure_embedding_dtypes``:
  for ``adapter: lora / qlora`` on one GPU (not FSDP, not ZeRO-3) ``_prepare_model_for_quantization``
  runs peft's ``prepare_model_for_kbit_training``, then (``should_convert``: an adapter, flash attention
  or CCE) ``_convert_embedding_modules_dtype(..., dist_dtype=cfg.torch_dtype)``: ``module.to(torch_dtype)``
  for every module whose name contains ``"norm"`` and for those named by ``loaders/utils.py``
  ``get_linear_embedding_layers`` (``embed_tokens`` / ``lm_head``; ``embed_in`` / ``embed_out`` for
  gpt_neox; ``word_embeddings`` / ``lm_head`` for falcon: peakmem's ``embeddings`` and ``head``
  components; an embedding those names miss, e.g. BLOOM's ``word_embeddings``, would stay fp32: peakmem
  puts every ``embeddings`` / ``head`` tensor back). What else was 16-bit stays fp32: biases of quantized
  Linears, learned positions, a LayerNorm not named *norm* (GPT-2's ``ln_1``), Qwen3.5's Gated DeltaNet
  ``A_log`` / ``dt_bias`` / ``conv1d`` (``--kbit-prep axolotl``). The norms being 16-bit again, the
  residual stream stays 16-bit.

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
    "embeddings and lm_head back to bf16; axolotl@c1193823 loaders/model.py "
    "_convert_embedding_modules_dtype: modules named *norm*, embed_tokens and lm_head back to the torch dtype"
)
# TRL 0.13 peft_module_casting_to_bf16: these module names go back to bf16 after the fp32 upcast
TRL_BF16_COMPONENTS = ("embeddings", "positions", "head")
# axolotl _convert_embedding_modules_dtype: get_linear_embedding_layers' modules back to the torch dtype
AXOLOTL_FLOAT_COMPONENTS = ("embeddings", "head")
# axolotl _convert_embedding_modules_dtype: ``if "norm" in name: module.to(dist_dtype)`` (module names)
AXOLOTL_NORM_NAME = "norm"
# the preparations that leave the norms fp32 (their products make the residual stream fp32)
FP32_NORM_PREPS = ("peft", "trl")


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
    if quant.kbit_prep == "axolotl" and axolotl_cast_back(t):
        return quant.float_dtype
    return "fp32"


def axolotl_cast_back(t: Tensor) -> bool:
    """Does axolotl's ``_convert_embedding_modules_dtype`` put this tensor back in the torch dtype after the
    upcast: a module named *norm* (``t.name``: the parameter's path, whose last part is ``weight`` /
    ``bias``), or an embedding / head module (:data:`SRC_KBIT_PREP`)?"""
    return AXOLOTL_NORM_NAME in t.name or t.component in AXOLOTL_FLOAT_COMPONENTS


def head_dtype(quant: QuantConfig | None, loaded: DType) -> DType:
    """The head weight's dtype when the head is not quantized (``loaded``: without preparation)."""
    if quant is None or quant.kbit_prep != "peft":
        return loaded
    return dtypes.FP32


def residual_dtype(quant: QuantConfig | None, planned: DType) -> DType:
    """The residual stream's dtype over a quantized base: fp32 once the prepared fp32 norms feed the
    quantized Linears (module docstring), else the float dtype its embeddings and norms were loaded in
    (autocast casts no 16-bit weight up: the precision's fp32 residual needs fp32 weights); ``planned``
    without a quantized base. axolotl puts the norms back in the float dtype: no fp32 product (a norm it
    misses, GPT-2's ``ln_1``, would stay fp32 and make the stream fp32: not modelled)."""
    if quant is None:
        return planned
    fp32 = quant.kbit_prep in FP32_NORM_PREPS
    return dtypes.FP32 if fp32 else dtypes.parse_dtype(quant.float_dtype)


def compute_dtype(quant: QuantConfig | None, planned: DType, autocast: bool) -> DType:
    """The dtype the layers compute in over a quantized base: without autocast a bitsandbytes Linear
    returns its input's dtype (``out.to(inp_dtype)``), so behind the prepared fp32 norms (peft's, TRL's)
    q / k / v, the attention, its output projection and the MLP all run in fp32, as the fp32 adapters
    (peft 0.21.2 tuners/lora/bnb.py casts the input to lora_A's dtype without autocast) do; under autocast
    its lower-precision list (SDPA, the adapters' mm) casts them to ``planned`` (module docstring)."""
    if quant is None or autocast or quant.kbit_prep not in FP32_NORM_PREPS:
        return planned
    return dtypes.FP32


__all__ = [
    "SRC_KBIT_PREP", "axolotl_cast_back", "compute_dtype", "head_dtype", "prepared", "residual_dtype",
    "unquantized_dtype",
]  # fmt: skip
