"""How weights are stored: the formats people name (``bf16``, ``nf4-dq``, ``gptq-4bit-g128``, ``mxfp4``,
``fp8-block``, a GGUF type) and what a checkpoint's ``quantization_config`` says of its own.

The inference setup (:mod:`peakmem.inference`) and the training side's quantized bases read them; the bytes
each format stores are :mod:`peakmem.formulas.weights`'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from peakmem.choice import Choice
from peakmem.errors import InputError, require


class Scheme(Choice):
    FLOAT = "float"  # every tensor in one float dtype
    FP8 = "fp8"  # llm-compressor / vLLM fp8: linear weights e4m3 + fp32 scales
    BNB_INT8 = "bnb-int8"  # bitsandbytes LLM.int8 (Linear8bitLt)
    W8A8 = "w8a8"  # int8 weights with per-channel scales (SmoothQuant, compressed-tensors)
    BNB_4BIT = "bnb-4bit"  # bitsandbytes NF4/FP4 (Linear4bit)
    GPTQ = "gptq"
    AWQ = "awq"
    GGUF = "gguf"
    MXFP4 = "mxfp4"  # OCP MX FP4 (gpt-oss): E2M1 values 2 per byte + one E8M0 scale per 32, experts only
    NVFP4 = "nvfp4"  # NVIDIA ModelOpt NVFP4: E2M1 2 per byte + E4M3 scale per 16 + fp32 global scales
    FP8_BLOCK = "fp8-block"  # DeepSeek-V3 / Qwen3-FP8: e4m3 weights + fp32 scale per 128 x 128 block
    # torchao (quantize_ / transformers TorchAoConfig / the pytorch/* Hub checkpoints): nn.Linear weights only
    TORCHAO_INT4 = "torchao-int4"  # int4_weight_only: tinygemm packed int4 + bf16 scale and zero per group
    TORCHAO_INT8 = "torchao-int8"  # int8_weight_only: int8 + a scale (and zero point) per output row
    TORCHAO_FP8 = "torchao-fp8"  # float8_dynamic_activation_float8_weight: e4m3 + fp32 scale per row/tensor


TORCHAO_SCHEMES = (Scheme.TORCHAO_INT4, Scheme.TORCHAO_INT8, Scheme.TORCHAO_FP8)

# GGUF file types people download (llama.cpp `llama-quantize` names; src/llama-quant.cpp).
GGUF_FILE_TYPES = (
    "f32", "f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q5_k_s", "q5_0", "q5_1", "q4_k_m", "q4_k_s",
    "q4_0", "q4_1", "q3_k_l", "q3_k_m", "q3_k_s", "q2_k", "q2_k_s", "iq4_xs", "iq4_nl", "iq3_m",
    "iq3_s", "iq3_xs", "iq3_xxs", "iq2_m", "iq2_s", "iq2_xs", "iq2_xxs", "iq1_m", "iq1_s",
    "tq1_0", "tq2_0",
)  # fmt: skip

FLOAT_BITS = {"fp32": 32, "fp16": 16, "bf16": 16}
GPTQ_BITS = (2, 3, 4, 8)
AWQ_BITS = (4,)
# OCP Microscaling spec v1.0 (MX formats, table 1): MXFP4 = 32 E2M1 elements sharing one E8M0 scale;
# vLLM model_executor/layers/quantization/mxfp4.py Mxfp4MoEMethod.create_weights: mxfp4_block = 32.
MXFP4_BLOCK = 32
# NVIDIA ModelOpt NVFP4: 16 E2M1 elements share one E4M3 scale (hf_quant_config group_size 16; vLLM
# quantization/modelopt.py ModelOptNvFp4Config, input_size // group_size scales per row).
NVFP4_BLOCK = 16
# DeepSeek-V3 config.json quantization_config.weight_block_size = [128, 128] (also Qwen3-*-FP8).
FP8_BLOCK_SHAPE = (128, 128)
_FP8_BLOCK_RE = re.compile(r"^fp8-block(?:-(\d{1,5})x(\d{1,5}))?$")
# auto-gptq / gptqmodel and AutoAWQ default group size (quantize_config.group_size = 128).
DEFAULT_GROUP_SIZE = 128
GROUP_SIZES = (-1, 32, 64, 128, 256, 1024)  # -1: one group per column ("per channel")
# torchao Int4WeightOnlyConfig(group_size=...): the tinygemm kernel takes 32, 64, 128 or 256, default 128
# (torchao v0.9.0 quantization/quant_api.py Int4WeightOnlyConfig: "choices are [256, 128, 64, 32]",
# ``group_size: int = 128``; transformers 4.47.1 TorchAoConfig passes its kwargs through).
TORCHAO_INT4_GROUP_SIZES = (32, 64, 128, 256)
TORCHAO_INT4_DEFAULT_GROUP = 128
_TORCHAO_INT4_RE = re.compile(r"^(?:torchao-)?int4(?:wo|_weight_only|-weight-only)(?:-g(\d{1,4}))?$")

WEIGHT_FORMAT_HELP = (
    "fp32, fp16, bf16, fp8, fp8-channel, fp8-block[-<R>x<C>], mxfp4, nvfp4, int8 (bitsandbytes LLM.int8), "
    "w8a8, nf4, nf4-dq, fp4, fp4-dq, gptq-<2|3|4|8>bit[-g<32|64|128|-1>], awq-4bit[-g<N>], "
    "torchao-int4wo[-g<32|64|128|256>], torchao-int8wo, torchao-float8dq[-row|-tensor], "
    "or a GGUF type (q4_k_m, q8_0, iq4_xs, ...)"
)


@dataclass(frozen=True, kw_only=True)
class WeightFormat:
    """How weights are stored: ``parse_weight_format`` builds one from a name people type."""

    name: str  # canonical spelling, e.g. "gptq-4bit-g128", "q4_k_m"
    scheme: Scheme
    bits: int = 16  # bits of a quantized weight element (0 for GGUF mixes: see formulas.weights)
    group_size: int = 0  # GPTQ/AWQ group; -1 per channel; bnb 4-bit blocksize
    double_quant: bool = False  # bitsandbytes bnb_4bit_use_double_quant
    per_channel: bool = False  # fp8: one scale per output channel instead of per tensor
    float_dtype: str = "bf16"  # dtype of unquantized tensors (embeddings, norms, head)
    gguf_type: str = ""  # GGUF file type, e.g. "q4_k_m"
    block: tuple[int, int] = (0, 0)  # fp8-block: (rows, columns) of [out, in] sharing one fp32 scale

    @property
    def is_quantized(self) -> bool:
        return self.scheme is not Scheme.FLOAT


_GPTQ_RE = re.compile(r"^(gptq|awq)(?:-(?:int)?(\d+)(?:bit|b)?)?(?:-g(-?\d+))?$")


def parse_weight_format(text: str) -> WeightFormat:
    """``bf16``, ``nf4-dq``, ``gptq-4bit-g128``, ``awq``, ``q4_k_m``, ``gguf-q4_k_m``, ... (any case)."""
    key = text.strip().lower().replace("_dq", "-dq")
    if key in FLOAT_BITS:
        return WeightFormat(name=key, scheme=Scheme.FLOAT, bits=FLOAT_BITS[key], float_dtype=key)
    if key in ("fp8", "fp8-tensor", "fp8-e4m3"):
        return WeightFormat(name="fp8", scheme=Scheme.FP8, bits=8)
    if key in ("fp8-channel", "fp8-dynamic"):
        return WeightFormat(name="fp8-channel", scheme=Scheme.FP8, bits=8, per_channel=True)
    if key in ("mxfp4", "mx-fp4"):
        return WeightFormat(name="mxfp4", scheme=Scheme.MXFP4, bits=4, group_size=MXFP4_BLOCK)
    if key in ("nvfp4", "nv-fp4", "modelopt-nvfp4"):
        return WeightFormat(name="nvfp4", scheme=Scheme.NVFP4, bits=4, group_size=NVFP4_BLOCK)
    block = _FP8_BLOCK_RE.match(key)
    if block:
        rows, cols = (int(block.group(1)), int(block.group(2))) if block.group(1) else FP8_BLOCK_SHAPE
        require(rows >= 1 and cols >= 1, "weights", text, "block sides must be at least 1")
        name = "fp8-block" if (rows, cols) == FP8_BLOCK_SHAPE else f"fp8-block-{rows}x{cols}"
        return WeightFormat(name=name, scheme=Scheme.FP8_BLOCK, bits=8, block=(rows, cols))
    torchao = _torchao_format(key, text)
    if torchao is not None:
        return torchao
    if key in ("int8", "llm.int8", "bnb-int8", "bnb-8bit", "8bit"):
        return WeightFormat(name="int8", scheme=Scheme.BNB_INT8, bits=8)
    if key in ("w8a8", "int8-w8a8", "w8a8-int8"):
        return WeightFormat(name="w8a8", scheme=Scheme.W8A8, bits=8, per_channel=True)
    if key in ("nf4", "fp4", "nf4-dq", "fp4-dq", "bnb-nf4", "bnb-fp4", "4bit"):
        base = "nf4" if key in ("4bit", "bnb-nf4") else key.removeprefix("bnb-")
        dq = base.endswith("-dq")
        # transformers BitsAndBytesConfig: bnb_4bit_quant_type, blocksize 64 (bitsandbytes default).
        return WeightFormat(name=base, scheme=Scheme.BNB_4BIT, bits=4, group_size=64, double_quant=dq)
    match = _GPTQ_RE.match(key)
    if match:
        method, bits_text, group_text = match.groups()
        scheme = Scheme.GPTQ if method == "gptq" else Scheme.AWQ
        bits = int(bits_text) if bits_text else 4
        group = int(group_text) if group_text else DEFAULT_GROUP_SIZE
        allowed = GPTQ_BITS if scheme is Scheme.GPTQ else AWQ_BITS
        require(bits in allowed, "weights", text, f"{method} supports {allowed} bits")
        require(group in GROUP_SIZES, "weights", text, f"group size must be one of {GROUP_SIZES}")
        require(scheme is Scheme.GPTQ or group > 0, "weights", text, "AWQ needs a positive group size")
        # auto-gptq / AutoAWQ checkpoints keep unquantized tensors (embeddings, head, norms) in fp16
        return WeightFormat(
            name=f"{method}-{bits}bit-g{group}",
            scheme=scheme,
            bits=bits,
            group_size=group,
            float_dtype="fp16",
        )
    gguf = key.removeprefix("gguf-").removeprefix("gguf:")
    if gguf in GGUF_FILE_TYPES:
        if gguf in FLOAT_BITS:
            return WeightFormat(
                name=f"gguf-{gguf}", scheme=Scheme.GGUF, bits=FLOAT_BITS[gguf], gguf_type=gguf
            )
        return WeightFormat(name=gguf, scheme=Scheme.GGUF, bits=0, gguf_type=gguf)
    raise InputError(f"weights={text!r}: unknown format; choose {WEIGHT_FORMAT_HELP}")


def _torchao_format(key: str, text: str) -> WeightFormat | None:
    """torchao's weight-only int4 / int8 and float8 dynamic-quant formats, or None for another name."""
    int4 = _TORCHAO_INT4_RE.match(key)
    if int4:
        group = int(int4.group(1)) if int4.group(1) else TORCHAO_INT4_DEFAULT_GROUP
        require(group in TORCHAO_INT4_GROUP_SIZES, "weights", text,
                f"torchao int4 group size must be one of {TORCHAO_INT4_GROUP_SIZES}")  # fmt: skip
        name = f"torchao-int4wo-g{group}"
        return WeightFormat(name=name, scheme=Scheme.TORCHAO_INT4, bits=4, group_size=group)
    if key in ("torchao-int8wo", "int8wo", "int8_weight_only", "torchao-int8-weight-only"):
        return WeightFormat(name="torchao-int8wo", scheme=Scheme.TORCHAO_INT8, bits=8, per_channel=True)
    if key in ("torchao-float8dq", "float8dq", "torchao-float8dq-row", "float8dq-row", "torchao-fp8-rowwise"):
        return WeightFormat(name="torchao-float8dq-row", scheme=Scheme.TORCHAO_FP8, bits=8, per_channel=True)
    if key in ("torchao-float8dq-tensor", "float8dq-tensor", "torchao-fp8-tensorwise"):
        return WeightFormat(name="torchao-float8dq-tensor", scheme=Scheme.TORCHAO_FP8, bits=8)
    return None


@dataclass(frozen=True, kw_only=True)
class CheckpointWeights:
    """What a checkpoint's ``config.json`` ``quantization_config`` says of its stored weights
    (:func:`peakmem.hf.quant.checkpoint_weights` reads it): the format peakmem prices, "" when the
    method is not modelled, and what was read (for the answer's assumptions)."""

    weights: str  # a parse_weight_format name ("mxfp4", "fp8-block"), or "" (not modelled)
    read: str  # e.g. "quant_method 'fp8', weight_block_size [128, 128]"

    def __post_init__(self) -> None:
        require(isinstance(self.read, str), "checkpoint.read", self.read, "must be text")
        if self.weights:
            parse_weight_format(self.weights)
