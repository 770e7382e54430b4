"""Element types and their storage size.

A :class:`DType` stores ``bits`` per element. Quantized formats whose storage includes
per-block scales (NF4, FP4, int8 with absmax, GPTQ/AWQ groups, GGUF blocks) are described in
:mod:`peakmem.formulas.quant`, which builds on these element sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.errors import InputError


@dataclass(frozen=True, kw_only=True)
class DType:
    name: str
    bits: int
    torch_name: str

    def nbytes(self, numel: int) -> int:
        """Bytes for ``numel`` elements, packed, rounded up to a whole byte."""
        return -(-numel * self.bits // 8)

    @property
    def itemsize(self) -> float:
        return self.bits / 8

    def __str__(self) -> str:
        return self.name


FP32 = DType(name="fp32", bits=32, torch_name="float32")
FP16 = DType(name="fp16", bits=16, torch_name="float16")
BF16 = DType(name="bf16", bits=16, torch_name="bfloat16")
FP8 = DType(name="fp8", bits=8, torch_name="float8_e4m3fn")
INT8 = DType(name="int8", bits=8, torch_name="int8")
UINT8 = DType(name="uint8", bits=8, torch_name="uint8")
INT4 = DType(name="int4", bits=4, torch_name="uint8")
BOOL = DType(name="bool", bits=8, torch_name="bool")
INT64 = DType(name="int64", bits=64, torch_name="int64")
INT32 = DType(name="int32", bits=32, torch_name="int32")

ALL: dict[str, DType] = {d.name: d for d in (FP32, FP16, BF16, FP8, INT8, UINT8, INT4, BOOL, INT64, INT32)}
ALIASES = {"float32": FP32, "float": FP32, "float16": FP16, "half": FP16, "bfloat16": BF16}


def parse_dtype(name: str) -> DType:
    key = name.lower()
    if key in ALL:
        return ALL[key]
    if key in ALIASES:
        return ALIASES[key]
    raise InputError(f"dtype={name!r}: unknown; choose one of {', '.join(ALL)}")
