"""A checkpoint's own weight format: ``config.json`` ``quantization_config`` -> the format peakmem prices.

Read (the keys each method writes; the format each maps onto is parsed by
:func:`peakmem.weight_formats.parse_weight_format` and priced by :mod:`peakmem.formulas.weights`):

* ``quant_method: "mxfp4"`` (gpt-oss, https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json:
  ``modules_to_not_convert`` = self_attn, mlp.router, embed_tokens, lm_head; transformers
  ``quantizers/quantizer_mxfp4.py``): ``mxfp4`` on the MoE experts.
* ``quant_method: "fp8"`` with ``weight_block_size`` (DeepSeek-V3/R1,
  https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: ``fmt: "e4m3"``,
  ``weight_block_size: [128, 128]``; transformers ``quantizers/quantizer_finegrained_fp8.py``, vLLM
  ``quantization/fp8.py`` ``Fp8Config.from_config``): ``fp8-block``; without it, vLLM's per-tensor
  ``fp8``.
* ``quant_method: "gptq"`` (transformers ``src/transformers/utils/quantization_config.py``
  ``GPTQConfig``, huggingface/transformers commit 000e2231: ``bits`` required, ``group_size`` default
  128, ``desc_act`` False, ``sym`` True, ``checkpoint_format`` ``"gptq"``; gptqmodel also writes
  ``gptq_v2``): ``gptq-<bits>bit-g<group>``. ``desc_act`` and ``sym`` change no stored bytes
  (auto-gptq's QuantLinear keeps ``g_idx`` and ``qzeros`` either way); any other
  ``checkpoint_format`` (marlin, bitblas, ...) repacks the tensors and is not modelled.
* ``quant_method: "awq"`` (same file, ``AwqConfig``: ``bits`` 4, ``group_size`` 128, ``version``
  ``AWQLinearVersion.GEMM``, lower-cased; AutoAWQ ``WQLinear_GEMM``): ``awq-4bit-g<group>``;
  ``version`` gemv / exllama / ipex (and AutoAWQ's marlin) pack differently and are not modelled.
* ``quant_method: "bitsandbytes"`` (same file, ``BitsAndBytesConfig``: ``load_in_4bit`` with
  ``bnb_4bit_quant_type`` default ``"fp4"`` and ``bnb_4bit_use_double_quant`` default False, or
  ``load_in_8bit``; ``llm_int8_skip_modules``): ``nf4`` / ``fp4`` (``-dq`` with double quant) or
  ``int8``.
* ``quant_method: "compressed-tensors"`` (llm-compressor checkpoints; compressed-tensors
  ``src/compressed_tensors/quantization/quant_args.py`` ``QuantizationArgs``: ``num_bits`` default 8,
  ``type`` int / float, ``strategy`` tensor / channel / group / block / tensor_group, ``group_size``,
  ``block_structure`` [rows, cols]; ``config_groups`` each with ``weights``; ``ignore``; ``format``):
  ``src/compressed_tensors/config/base.py`` ``CompressionFormat``, vllm-project/compressed-tensors):
  float 8-bit tensor / channel / block -> ``fp8`` / ``fp8-channel`` / ``fp8-block[-RxC]``
  (``float-quantized``); float 4-bit tensor_group 16 -> ``nvfp4`` (``nvfp4-pack-quantized``); int
  8-bit channel -> ``w8a8`` (``int-quantized``); int 4-bit group N -> ``awq-4bit-g<N>``
  (``pack-quantized``: int32-packed values and 16-bit scales per group, as AutoAWQ's layout; a
  symmetric checkpoint stores no zero points, 1/128 of the packed bytes at group 128, which the
  awq price keeps). Groups that disagree, or any other combination, are not modelled.
* ``quant_method: "modelopt"`` (NVIDIA ModelOpt; vLLM ``docs/features/quantization/modelopt.md``:
  ``quant_algo`` ``FP8`` per-tensor, ``FP8_PER_CHANNEL_PER_TOKEN`` per-channel, ``NVFP4``;
  ``exclude_modules``): ``fp8`` / ``fp8-channel`` / ``nvfp4``; also read from a nested
  ``quantization`` object (the ``hf_quant_config.json`` layout).
* ``quant_method: "fbgemm_fp8"`` (transformers ``FbgemmFp8Config``; vLLM
  ``quantization/fbgemm_fp8.py`` ``FBGEMMFp8Config``, ``create_per_channel_scale_param``: e4m3 weight
  + one fp32 scale per output row): ``fp8-channel``.
* ``quant_method: "torchao"`` (transformers ``TorchAoConfig.to_dict``): ``quant_type`` either a name with
  ``quant_type_kwargs`` (``"int4_weight_only"``, ``{"group_size": 128}``; 4.47 / 4.53
  ``utils/quantization_config.py``) or, for torchao >= 0.10 configs, ``{"default": {"_type":
  "Int4WeightOnlyConfig", "_data": {...}}}`` (torchao ``core/config.py`` ``config_to_dict``; other keys
  name per-module configs, not read): int4 weight-only -> ``torchao-int4wo-g<group>`` (default 128),
  int8 weight-only -> ``torchao-int8wo``, float8 dynamic activation / float8 weight ->
  ``torchao-float8dq-row`` when a granularity is ``PerRow``, else ``-tensor`` (torchao's default
  granularity is per tensor).

The modules a config keeps unquantized (``modules_to_not_convert``, ``ignore``, ``exclude_modules``,
``llm_int8_skip_modules``) are named in what was read; each format's own rule of which tensors stay
16-bit (:mod:`peakmem.formulas.weights`) prices them. Any other method, or values that map onto no
format (named with the field), is not modelled: the answer says so among its assumptions
(:meth:`peakmem.inference.InferenceSetup.weights_assumption`) and prices the weights as ``--weights``
says (bf16 by default), never silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from peakmem.errors import ConfigError
from peakmem.weight_formats import (
    AWQ_BITS,
    FP8_BLOCK_SHAPE,
    GPTQ_BITS,
    GROUP_SIZES,
    NVFP4_BLOCK,
    TORCHAO_INT4_DEFAULT_GROUP,
    TORCHAO_INT4_GROUP_SIZES,
    CheckpointWeights,
)

QUANT_KEY = "quantization_config"
FP8_FORMATS = ("e4m3",)  # DeepSeek's fmt; e5m2 weights are not what the fp8 kernels load
# transformers GPTQConfig / AwqConfig defaults (utils/quantization_config.py); GPTQConfig has no
# default bits (a gptq config without them is not modelled), AwqConfig's is 4.
AWQ_DEFAULT_BITS = 4
GPTQ_DEFAULT_GROUP = 128
GPTQ_CHECKPOINT_FORMATS = ("gptq", "gptq_v2")  # gptqmodel's layouts with auto-gptq's tensors
AWQ_VERSIONS = ("gemm",)  # AutoAWQ WQLinear_GEMM: the layout formulas.weights.awq_linear_bytes prices
BNB_4BIT_DEFAULT_TYPE = "fp4"  # transformers BitsAndBytesConfig bnb_4bit_quant_type default
BNB_4BIT_TYPES = ("nf4", "fp4")
# compressed-tensors CompressionFormat values that store each scheme (config/base.py).
CT_FLOAT_FORMATS = ("float-quantized", "naive-quantized")
CT_INT8_FORMATS = ("int-quantized", "naive-quantized")
CT_PACKED_FORMATS = ("pack-quantized",)
CT_NVFP4_FORMATS = ("nvfp4-pack-quantized",)
CT_NUM_BITS_DEFAULT = 8  # QuantizationArgs.num_bits default
# ModelOpt quant_algo -> format (vLLM docs/features/quantization/modelopt.md).
MODELOPT_ALGOS = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8-channel", "NVFP4": "nvfp4"}
SKIP_KEYS = ("modules_to_not_convert", "ignore", "exclude_modules", "llm_int8_skip_modules")
SKIP_SHOWN = 4  # module names shown in the answer before "+N more"

Reader = Callable[[Mapping[str, Any]], tuple[str, str]]  # qc -> (format or "", what was read)


def checkpoint_weights(config: Mapping[str, Any]) -> CheckpointWeights | None:
    """The stored weight format ``config``'s quantization_config names; None when it has none."""
    qc = config.get(QUANT_KEY)
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        raise ConfigError(f"config.json: {QUANT_KEY}={qc!r}: must be an object")
    method = qc.get("quant_method")
    reader = READERS.get(method) if isinstance(method, str) else None
    if reader is None:
        return CheckpointWeights(weights="", read=f"quant_method {method!r}")
    weights, read = reader(qc)
    said = f"quant_method {method!r}" + (f", {read}" if read else "")
    return CheckpointWeights(weights=weights, read=said + _skipped(qc))


def _skipped(qc: Mapping[str, Any]) -> str:
    """The modules the config keeps unquantized, as the answer names them."""
    parts = []
    for key in SKIP_KEYS:
        names = qc.get(key)
        if isinstance(names, list) and names:
            shown = ", ".join(str(n) for n in names[:SKIP_SHOWN])
            more = f" +{len(names) - SKIP_SHOWN} more" if len(names) > SKIP_SHOWN else ""
            parts.append(f"; {key} [{shown}{more}]")
    return "".join(parts)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mxfp4(qc: Mapping[str, Any]) -> tuple[str, str]:
    return "mxfp4", ""


def _fp8(qc: Mapping[str, Any]) -> tuple[str, str]:
    fmt = qc.get("fmt", "e4m3")
    block = qc.get("weight_block_size")
    read = f"fmt {fmt!r}, weight_block_size {block!r}"
    if fmt not in FP8_FORMATS:
        return "", read
    if block is None:
        return "fp8", read
    if not isinstance(block, list) or len(block) != 2 or not all(_is_int(b) and b >= 1 for b in block):
        raise ConfigError(f"config.json: {QUANT_KEY}.weight_block_size={block!r}: two positive integers")
    return _fp8_block(block[0], block[1]), read


def _fp8_block(rows: int, cols: int) -> str:
    return "fp8-block" if (rows, cols) == FP8_BLOCK_SHAPE else f"fp8-block-{rows}x{cols}"


def _gptq(qc: Mapping[str, Any]) -> tuple[str, str]:
    bits, group = qc.get("bits"), qc.get("group_size", GPTQ_DEFAULT_GROUP)
    ckf = qc.get("checkpoint_format")
    read = f"bits {bits!r}, group_size {group!r}, desc_act {qc.get('desc_act')!r}, sym {qc.get('sym')!r}"
    if ckf is not None:
        read += f", checkpoint_format {ckf!r}"
    if not (_is_int(bits) and bits in GPTQ_BITS) or not (_is_int(group) and group in GROUP_SIZES):
        return "", read
    if ckf is not None and ckf not in GPTQ_CHECKPOINT_FORMATS:
        return "", read
    return f"gptq-{bits}bit-g{group}", read


def _awq(qc: Mapping[str, Any]) -> tuple[str, str]:
    bits, group = qc.get("bits", AWQ_DEFAULT_BITS), qc.get("group_size", GPTQ_DEFAULT_GROUP)
    version = qc.get("version", "gemm")
    read = f"bits {bits!r}, group_size {group!r}, version {version!r}"
    ok = _is_int(bits) and bits in AWQ_BITS and _is_int(group) and group in GROUP_SIZES and group > 0
    if not ok or not isinstance(version, str) or version.lower() not in AWQ_VERSIONS:
        return "", read
    return f"awq-{bits}bit-g{group}", read


def _bitsandbytes(qc: Mapping[str, Any]) -> tuple[str, str]:
    if qc.get("load_in_4bit") is True:
        kind = qc.get("bnb_4bit_quant_type", BNB_4BIT_DEFAULT_TYPE)
        dq = qc.get("bnb_4bit_use_double_quant", False) is True
        read = f"load_in_4bit, bnb_4bit_quant_type {kind!r}, bnb_4bit_use_double_quant {dq}"
        if kind not in BNB_4BIT_TYPES:
            return "", read
        return f"{kind}-dq" if dq else str(kind), read
    if qc.get("load_in_8bit") is True:
        return "int8", "load_in_8bit"
    return "", "neither load_in_4bit nor load_in_8bit"


def _ct_weights(args: Mapping[str, Any], fmt: Any) -> str:
    """One compressed-tensors ``weights`` QuantizationArgs -> a format name, "" when none fits."""
    bits, kind = args.get("num_bits", CT_NUM_BITS_DEFAULT), args.get("type", "int")
    strategy, group = args.get("strategy"), args.get("group_size")
    if strategy is None:  # QuantizationArgs.validate_model_after infers it from group_size
        strategy = "tensor" if group is None else "channel" if group == -1 else "group"
    block = args.get("block_structure")
    if kind == "float" and bits == 8 and fmt in (None, *CT_FLOAT_FORMATS):
        if strategy == "tensor":
            return "fp8"
        if strategy == "channel":
            return "fp8-channel"
        if strategy == "block" and isinstance(block, list) and len(block) == 2:
            rows, cols = block
            if _is_int(rows) and _is_int(cols) and rows >= 1 and cols >= 1:
                return _fp8_block(rows, cols)
        return ""
    if kind == "float" and bits == 4 and strategy == "tensor_group" and group == NVFP4_BLOCK:
        return "nvfp4" if fmt in (None, *CT_NVFP4_FORMATS) else ""
    if kind == "int" and bits == 8 and strategy == "channel" and fmt in (None, *CT_INT8_FORMATS):
        return "w8a8"
    if kind == "int" and bits == 4 and strategy == "group" and fmt in (None, *CT_PACKED_FORMATS):
        return f"awq-4bit-g{group}" if _is_int(group) and group in GROUP_SIZES and group > 0 else ""
    return ""


def _compressed_tensors(qc: Mapping[str, Any]) -> tuple[str, str]:
    fmt, groups = qc.get("format"), qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return "", f"format {fmt!r}, config_groups {groups!r}"
    names, shown = set(), []
    for key, group in groups.items():
        args = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(args, Mapping):
            return "", f"format {fmt!r}, config_groups.{key}.weights {args!r}"
        names.add(_ct_weights(args, fmt))
        fields = ("num_bits", "type", "strategy", "group_size", "block_structure")
        shown.append(f"{key}.weights " + ", ".join(f"{f} {args[f]!r}" for f in fields if f in args))
    read = f"format {fmt!r}, " + "; ".join(shown)
    return (names.pop() if len(names) == 1 else ""), read


def _modelopt(qc: Mapping[str, Any]) -> tuple[str, str]:
    nested = qc.get("quantization")
    algo = qc.get("quant_algo", nested.get("quant_algo") if isinstance(nested, Mapping) else None)
    read = f"quant_algo {algo!r}"
    return (MODELOPT_ALGOS.get(algo, "") if isinstance(algo, str) else ""), read


def _fbgemm_fp8(qc: Mapping[str, Any]) -> tuple[str, str]:
    return "fp8-channel", ""


# torchao config names (the string API and AOBaseConfig class names) -> peakmem's torchao format
TORCHAO_TYPES = {
    "int4_weight_only": "int4", "Int4WeightOnlyConfig": "int4",
    "int8_weight_only": "int8", "Int8WeightOnlyConfig": "int8",
    "float8_dynamic_activation_float8_weight": "fp8", "Float8DynamicActivationFloat8WeightConfig": "fp8",
}  # fmt: skip
TORCHAO_DEFAULT_KEY = "default"  # TorchAoConfig.to_dict: {"default": config_to_dict(quant_type)}


def _torchao(qc: Mapping[str, Any]) -> tuple[str, str]:
    quant_type = qc.get("quant_type")
    if isinstance(quant_type, Mapping):
        entry = quant_type.get(TORCHAO_DEFAULT_KEY)
        name = entry.get("_type") if isinstance(entry, Mapping) else None
        data = entry.get("_data") if isinstance(entry, Mapping) else None
    else:
        name, data = quant_type, qc.get("quant_type_kwargs")
    data = data if isinstance(data, Mapping) else {}
    read = f"quant_type {name!r}"
    kind = TORCHAO_TYPES.get(name) if isinstance(name, str) else None
    if kind == "int4":
        group = data.get("group_size", TORCHAO_INT4_DEFAULT_GROUP)
        read += f", group_size {group!r}"
        ok = _is_int(group) and group in TORCHAO_INT4_GROUP_SIZES
        return (f"torchao-int4wo-g{group}" if ok else ""), read
    if kind == "int8":
        return "torchao-int8wo", read
    if kind == "fp8":
        granularity = data.get("granularity")
        parts = granularity if isinstance(granularity, list) else [granularity]
        names = [g.get("_type") if isinstance(g, Mapping) else g for g in parts]
        read += f", granularity {names!r}"
        rows = "PerRow" in names
        return ("torchao-float8dq-row" if rows else "torchao-float8dq-tensor"), read
    return "", read


READERS: dict[str, Reader] = {
    "mxfp4": _mxfp4, "fp8": _fp8, "gptq": _gptq, "awq": _awq, "bitsandbytes": _bitsandbytes,
    "compressed-tensors": _compressed_tensors, "modelopt": _modelopt, "fbgemm_fp8": _fbgemm_fp8,
    "torchao": _torchao,
}  # fmt: skip
