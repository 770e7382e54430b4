"""A checkpoint's own weight format: ``config.json`` ``quantization_config`` -> the format peakmem prices.

Read (the keys each method writes):

* ``quant_method: "mxfp4"`` (gpt-oss, https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json:
  ``modules_to_not_convert`` = self_attn, mlp.router, embed_tokens, lm_head; transformers
  ``quantizers/quantizer_mxfp4.py``): ``mxfp4`` on the MoE experts.
* ``quant_method: "fp8"`` with ``weight_block_size`` (DeepSeek-V3/R1,
  https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: ``fmt: "e4m3"``,
  ``weight_block_size: [128, 128]``; transformers ``quantizers/quantizer_finegrained_fp8.py``, vLLM
  ``quantization/fp8.py`` ``Fp8Config.from_config``): ``fp8-block``; without it, vLLM's per-tensor
  ``fp8``.

Any other method (gptq, awq, bitsandbytes, compressed-tensors, modelopt, ...) is not read here: the
answer names it among its assumptions (:meth:`peakmem.inference.InferenceSetup.weights_assumption`)
and prices the weights as ``--weights`` says (bf16 by default), never silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakmem.errors import ConfigError
from peakmem.inference import FP8_BLOCK_SHAPE, CheckpointWeights

QUANT_KEY = "quantization_config"
FP8_FORMATS = ("e4m3",)  # DeepSeek's fmt; e5m2 weights are not what the fp8 kernels load


def checkpoint_weights(config: Mapping[str, Any]) -> CheckpointWeights | None:
    """The stored weight format ``config``'s quantization_config names; None when it has none."""
    qc = config.get(QUANT_KEY)
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise ConfigError(f"config.json: {QUANT_KEY}={qc!r}: must be an object")
    method = qc.get("quant_method")
    if method == "mxfp4":
        return CheckpointWeights(weights="mxfp4", read="quant_method 'mxfp4'")
    if method == "fp8":
        fmt = qc.get("fmt", "e4m3")
        block = qc.get("weight_block_size")
        read = f"quant_method 'fp8', fmt {fmt!r}, weight_block_size {block!r}"
        if fmt not in FP8_FORMATS:
            return CheckpointWeights(weights="", read=read)
        if block is None:
            return CheckpointWeights(weights="fp8", read=read)
        if (
            not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)
        ):  # fmt: skip
            raise ConfigError(f"config.json: {QUANT_KEY}.weight_block_size={block!r}: two positive integers")
        rows, cols = block
        name = "fp8-block" if (rows, cols) == FP8_BLOCK_SHAPE else f"fp8-block-{rows}x{cols}"
        return CheckpointWeights(weights=name, read=read)
    return CheckpointWeights(weights="", read=f"quant_method {method!r}")
