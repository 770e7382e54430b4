"""The fine-tuning adapters of a training setup: peft's ``LoraConfig`` and bitsandbytes' quantized base
(``BitsAndBytesConfig``) as far as memory goes, validated like every input; plain data, no formulas.

LoRA (peft 0.21.2, peft/tuners/lora/config.py ``LoraConfig``): ``r`` (default 8), ``lora_alpha``
(default 8), ``target_modules`` (``"all-linear"``: peft/utils/constants.py
``INCLUDE_LINEAR_LAYERS_SHORTHAND``; ``None``: peft's default for the model type, resolved by
:mod:`peakmem.formulas.lora`), ``target_parameters``, ``lora_dropout``, ``use_dora``, ``lora_bias``,
``modules_to_save``; the adapter dtype is ``get_peft_model(..., autocast_adapter_dtype=True)`` (fp32) or
the base's. The quantized base (Dettmers et al. 2023, "QLoRA", arXiv 2305.14314; bitsandbytes 0.50.2):
nf4 / fp4 with an optional double quantization, or LLM.int8; its storage and temporaries are
:mod:`peakmem.formulas.qlora`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from peakmem.errors import InputError, require
from peakmem.validate import MAX_SHOWN_VALUE, MAX_WIDTH, check_int, check_real
from peakmem.weight_formats import Scheme, WeightFormat

ALL_LINEAR = "all-linear"  # peft/utils/constants.py INCLUDE_LINEAR_LAYERS_SHORTHAND
DEFAULT_RANK = 8  # peft LoraConfig.r
DEFAULT_ALPHA = 8  # peft LoraConfig.lora_alpha
ADAPTER_DTYPES = ("fp32", "bf16", "fp16", "base")

QUANTS = ("nf4", "fp4", "int8")
# bitsandbytes functional.quantize_4bit accepts blocksize in {4096, 2048, 1024, 512, 256, 128, 64, 32}
# (functional.py); transformers' BitsAndBytesConfig uses the default 64.
BNB_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_BLOCKSIZE = 64
FLOAT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# who prepared the quantized model for training (QuantConfig.kbit_prep; formulas/kbit_prep.py):
# nothing; peft's prepare_model_for_kbit_training (every non-quantized 16-bit weight upcast to fp32);
# TRL's SFTTrainer under bf16 (0.7.5-0.25: that, then peft_module_casting_to_bf16: norms fp32,
# embeddings and the head back to bf16; which a release applies: peakmem.trl_versions); axolotl's
# loader (that upcast, then every module named *norm* and the embeddings / head back to the float dtype)
KBIT_PREPS = ("none", "peft", "trl", "axolotl")


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """peft's ``LoraConfig`` as far as memory goes. ``targets=()`` means peft's default for the
    model type (``target_modules=None``)."""

    rank: int = DEFAULT_RANK
    alpha: float = DEFAULT_ALPHA
    targets: tuple[str, ...] = (ALL_LINEAR,)
    target_parameters: tuple[str, ...] = ()
    dropout: float = 0.0
    dora: bool = False
    adapter_dtype: str = "fp32"  # "base": the base model's dtype (autocast_adapter_dtype=False)
    lora_bias: bool = False
    modules_to_save: tuple[str, ...] = ()
    # MoE experts (and routers) are per-expert nn.Linear modules that target names and all-linear match
    # one by one (transformers before 5.0: peakmem.transformers_versions; formulas/lora/targets.py);
    # False: transformers 5's fused 3-D parameters, reached through target_parameters. Not in the repr:
    # the derived block-cost families are keyed by it (formulas/activations/shapes.py derived_family),
    # and their blocks are measured under the installed transformers 5
    expert_linears: bool = field(default=False, repr=False)
    # Lit-GPT's LoRAQKVLinear (set by the litgpt profile: formulas/profiles.py fused_qkv_lora): q_proj,
    # k_proj and v_proj name the q / k / v slices of a fused attention Linear where the model has one
    # (Falcon's query_key_value, Phi-3's qkv_proj: formulas/lora/targets.py qkv_slices)
    qkv_slices: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        check_int("lora_rank", self.rank, maximum=MAX_WIDTH, what="(wider than any layer)")
        check_real("lora_alpha", self.alpha)
        require(self.alpha > 0, "lora_alpha", self.alpha, "must be positive")
        check_real("lora_dropout", self.dropout, minimum=0.0, maximum=1.0, closed_max=False)
        require(self.adapter_dtype in ADAPTER_DTYPES, "adapter_dtype", self.adapter_dtype,
                f"choose one of {', '.join(ADAPTER_DTYPES)}")  # fmt: skip
        if any(not key.strip() for key in self.targets):  # one pass: the joined list only for the error
            raise InputError(f"lora_targets={','.join(self.targets)[:MAX_SHOWN_VALUE]!r}: empty module name")
        if ALL_LINEAR in self.targets and len(self.targets) > 1:
            raise InputError(
                f"lora_targets={','.join(self.targets)!r}: all-linear cannot be combined with names"
            )
        if self.target_parameters and self.dora:
            raise InputError("dora=True: peft's LoRA on target_parameters does not support DoRA")
        if self.target_parameters and self.dropout:
            raise InputError(
                f"lora_dropout={self.dropout!r}: peft's LoRA on target_parameters needs dropout 0"
            )

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def parse_targets(text: str) -> tuple[str, ...]:
    """``"q_proj,v_proj"`` -> ``("q_proj", "v_proj")``; ``"all-linear"``; ``"default"`` -> ``()``."""
    key = text.strip()
    if key.lower() == ALL_LINEAR:
        return (ALL_LINEAR,)
    if key.lower() in ("", "default"):
        return ()
    names = tuple(k.strip() for k in key.split(","))
    if any(not n for n in names):
        raise InputError(f"lora_targets={text!r}: empty module name")
    return names


EXPERTS = "experts"  # --lora-target-parameters experts: every layer's 3-D expert parameters


def parse_parameters(text: str) -> tuple[str, ...]:
    """``"22.mlp.experts.gate_up_proj,22.mlp.experts.down_proj"`` -> the two names (peft matches a
    parameter whose full name equals a name or ends with ``"." + name``; a leading ``N.`` / ``layers.N.``
    names layer N only); ``"experts"`` -> every layer's fused expert parameters (:data:`EXPERTS`)."""
    names = tuple(k.strip() for k in text.split(","))
    if any(not n for n in names):
        raise InputError(f"lora_target_parameters={text!r}: empty parameter name")
    if EXPERTS in names and len(names) > 1:
        raise InputError(f"lora_target_parameters={text!r}: experts cannot be combined with names")
    return names


@dataclass(frozen=True, kw_only=True)
class QuantConfig:
    """``BitsAndBytesConfig`` as far as memory goes: ``--quant nf4|fp4|int8 [--double-quant]``."""

    quant: str = "nf4"
    double_quant: bool = False
    blocksize: int = DEFAULT_BLOCKSIZE
    float_dtype: str = "bf16"  # bnb_4bit_compute_dtype / torch_dtype of the unquantized tensors
    # the LM head is a quantized Linear too: Lightning Fabric's BitsandbytesPrecision replaces every
    # torch.nn.Linear (Lit-GPT); transformers' integration keeps it in float_dtype (formulas/qlora.py)
    quantize_head: bool = False
    # the dtype the weights were quantized from (bitsandbytes ``QuantState.dtype``, what
    # ``dequantize_4bit`` returns); None: float_dtype. Lightning quantizes from fp16 (formulas/qlora.py)
    state_dtype: str | None = None
    # MoE experts are per-expert nn.Linear modules, which bitsandbytes replaces like any other Linear
    # (transformers before 5.0: peakmem.transformers_versions); False: fused 3-D parameters kept 16-bit
    expert_linears: bool = False
    # prepare_model_for_kbit_training applied (KBIT_PREPS): fp32 norms (and embeddings / head under
    # "peft"), whose products make the residual stream fp32; "axolotl": norms 16-bit again
    # (formulas/kbit_prep.py)
    kbit_prep: str = "none"

    def __post_init__(self) -> None:
        require(self.kbit_prep in KBIT_PREPS, "kbit_prep", self.kbit_prep,
                f"choose one of {', '.join(KBIT_PREPS)}")  # fmt: skip
        require(self.quant in QUANTS, "quant", self.quant, f"choose one of {', '.join(QUANTS)}")
        require(self.blocksize in BNB_BLOCKSIZES, "quant_blocksize", self.blocksize,
                f"bitsandbytes supports {', '.join(map(str, BNB_BLOCKSIZES))}")  # fmt: skip
        require(self.float_dtype in FLOAT_BYTES, "float_dtype", self.float_dtype,
                f"choose one of {', '.join(FLOAT_BYTES)}")  # fmt: skip
        if self.state_dtype is not None:
            require(self.state_dtype in FLOAT_BYTES, "state_dtype", self.state_dtype,
                    f"choose one of {', '.join(FLOAT_BYTES)}")  # fmt: skip
        if self.double_quant and self.quant == "int8":
            raise InputError(
                "double_quant=True: double quantization applies to 4-bit (nf4/fp4) bases, not int8"
            )

    @property
    def is_4bit(self) -> bool:
        return self.quant != "int8"

    @property
    def weight_format(self) -> WeightFormat:
        if self.quant == "int8":
            return WeightFormat(name="int8", scheme=Scheme.BNB_INT8, bits=8, float_dtype=self.float_dtype)
        name = f"{self.quant}-dq" if self.double_quant else self.quant
        return WeightFormat(name=name, scheme=Scheme.BNB_4BIT, bits=4, group_size=self.blocksize,
                            double_quant=self.double_quant, float_dtype=self.float_dtype)  # fmt: skip

    @property
    def label(self) -> str:
        return f"{self.quant}{' + double quant' if self.double_quant else ''}"


@dataclass(frozen=True, kw_only=True)
class LayoutPrep:
    """What a trainer release does to the peft model on each kind of layout, as ``(kbit_prep,
    adapter_dtype)``: one GPU or DDP, FSDP, ZeRO-3. TRL's ``is_sharded_qlora`` skips the k-bit preparation
    on a sharded 4-bit base and its ZeRO-3 LoRA keeps the adapters in the base dtype
    (peakmem.trl_versions), so a layout the planner proposes takes its own row
    (peakmem.planner.search.where_it_acts)."""

    replicated: tuple[str, str]
    fsdp: tuple[str, str]
    zero3: tuple[str, str]


# --- what a setup holds (read duck-typed: ``setup.method``, ``setup.lora``, ``setup.quant``) ---
_DEFAULT_LORA = LoraConfig()  # frozen: one instance for every setup without a config


def measured_lora(lora: LoraConfig) -> LoraConfig:
    """The config a derived model's blocks are measured with: its module adapters only. Its
    ``target_parameters`` (peft ParamWrapper: layer-indexed keys name single layers, and the peft release
    decides their bytes) are added by the formulas (peakmem.formulas.lora.param_wrapper)."""
    if not lora.target_parameters:
        return lora
    if not lora.targets:
        raise InputError(
            f"lora_target_parameters={','.join(lora.target_parameters)!r}: on a derived model name "
            "lora_targets too (its blocks are measured with their module adapters)"
        )
    return dataclasses.replace(lora, target_parameters=())


def lora_of(setup: Any) -> LoraConfig:
    """The setup's LoRA config; peft's defaults (r=8, all-linear here) when none was given."""
    found = getattr(setup, "lora", None)
    return found if isinstance(found, LoraConfig) else _DEFAULT_LORA


def quant_of(setup: Any) -> QuantConfig | None:
    """QLoRA's base format: the setup's, else NF4 with double quantization (Dettmers et al. 2023)."""
    if str(getattr(setup.method, "value", setup.method)) != "qlora":
        return None
    found = getattr(setup, "quant", None)
    return found if isinstance(found, QuantConfig) else QuantConfig(quant="nf4", double_quant=True)


__all__ = [
    "ALL_LINEAR",
    "KBIT_PREPS",
    "LayoutPrep",
    "LoraConfig",
    "QuantConfig",
    "lora_of",
    "parse_targets",
    "quant_of",
]
