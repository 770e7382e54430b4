"""What a TRL release does to a LoRA / QLoRA model before training, one row per change, per trainer.

``--trl VERSION`` names the release a job ran; :func:`peft_preparation` gives what its trainer does to the
model peakmem counts: who prepared a quantized base (``QuantConfig.kbit_prep``: peakmem.formulas.kbit_prep)
and the adapters' dtype (``LoraConfig.adapter_dtype``). Without ``--trl`` peakmem counts what its options
say (``--kbit-prep none``, peft's fp32 adapters): a QLoRA job need not run under TRL (a plain HF Trainer,
axolotl and LLaMA-Factory build the peft model themselves and hand TRL a ``PeftModel``), so the current
release is not the default. Read in huggingface/trl's tags (``git show TAG:path``):

* SFTTrainer. v0.4.2 (2023-06-07) .. v0.7.4 ``trl/trainer/sft_trainer.py``: a 4-bit or 8-bit model gets
  peft's ``prepare_model_for_int8_training`` (``prepare_model_for_kbit_training`` in v0.7.4), then
  ``get_peft_model``. v0.7.5 (2023-12-22) adds, under ``args.bf16`` on a 4-bit model,
  ``peft_module_casting_to_bf16`` (``trl/trainer/utils.py``), which then also took every peft
  ``BaseTunerLayer`` (the LoRA adapters) to bf16. v0.8.0 skips both for a "sharded QLoRA" 4-bit model
  (``Params4bit`` data on the cpu: FSDP / ZeRO-3; ``{"cpu", "meta"}`` from v0.12). From v0.9.3 (99f2c94b,
  2024-05-15, "don't cast the trainable lora layers to half precision"; the first tag after v0.8.6) the
  cast keeps the adapters (fp32 from ``get_peft_model``), and a sharded 4-bit model gets
  ``get_peft_model(..., autocast_adapter_dtype=False)`` (e4ed7a3a, "do not upcast adapters when using
  FSDP+QLoRA"): adapters in the base layer's dtype, the ``bnb_4bit_quant_storage`` float dtype (peft
  0.13.2 tuners_utils.py ``_move_adapter_to_device_of_base_layer`` l. 790-823: ``.to(device,
  dtype=weight.dtype)`` where the base weight is floating, as a bf16-stored ``Params4bit`` is). The same
  sequence moved to ``SFTTrainer._prepare_peft_model`` (v0.20, v0.21) and ``trl/models/utils.py``
  ``prepare_peft_model`` (v0.22.0 .. v0.25.1). v0.26.0 (2025-12-09) drops both: ``get_peft_model``, then
  "When using QLoRA, the PEFT adapter weights are converted to bf16": every trainable parameter of a 4-bit
  or 8-bit model to bf16, whatever ``args.bf16`` and the base's dtype (an fp16 base gets bf16 adapters).
  v1.7.0 (bf6a7b51, "Fix ZeRO-3 + PEFT mixed-dtype error for core trainers") adds, for a non-quantized model
  under ZeRO-3, ``get_peft_model(..., autocast_adapter_dtype=False)``: LoRA adapters in the model's dtype.
* DPOTrainer (``trl/trainer/dpo_trainer.py``): prepares a 4-bit / 8-bit model in v0.5.0 .. v0.28 (v0.5.0
  ``prepare_model_for_int8_training``); casts under bf16 from v0.8.0 (the adapters with it until v0.8.6),
  with no sharded check (v0.13.0, v0.25.1, v0.28.0 read); v0.29.0 converts the trainable parameters to bf16
  as SFTTrainer 0.26 does; the ZeRO-3 LoRA rule from v1.7.0.
* GRPOTrainer (``trl/trainer/grpo_trainer.py``, from v0.14.0): ``get_peft_model`` only until v0.21 (no
  preparation); ``prepare_peft_model`` in v0.22.0 .. v0.25.1; the bf16 conversion from v0.26.0; the ZeRO-3
  LoRA rule from v1.7.0.
* RLOOTrainer (``trl/trainer/rloo_trainer.py``): before v0.22 a different trainer without ``peft_config``
  (v0.21.0 read); ``prepare_peft_model`` in v0.22.0 .. v0.26.x; the bf16 conversion from v0.27.0; the
  ZeRO-3 LoRA rule from v1.7.0.

Not read here, so ``--trl`` leaves them as the options say: KTO, ORPO and CPO/SimPO (their trainers
prepare and cast through v0.29 and later, in ``trl/experimental`` from v0.26; KTO changed again in 1.x),
the distillation trainer and verl's PPO. peft 0.3.0's ``prepare_model_for_int8_training`` (utils/other.py
l. 35-70, what TRL 0.4.x called) already cast every fp16 / bf16 parameter to fp32, as ``kbit_prep="peft"``
counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.releases import Release, ReleaseTable

# The newest release read (trl 1.16.0 is the installed wheel; the 1.x rows hold from v1.7.0 on).
TRL_CURRENT = "1.16.0"

# TrainingArguments(bf16=True): peakmem's precisions whose compute is bf16 (the HF Trainer's autocast, or
# the 16-bit weights and their fp32 masters); float8 training runs on mixed-bf16 states
BF16_PRECISIONS = frozenset({"amp-bf16", "mixed-bf16", "bf16", "float8-tensorwise", "float8-rowwise",
                             "float8-rowwise-gw-hp", "float8-mxfp8"})  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TrlRelease:
    """What a trainer of the releases from ``since`` on (until the previous row's) does to a peft model."""

    since: Release
    prepares: bool  # prepare_model_for_kbit_training on a 4-bit / 8-bit base
    skips_sharded: bool  # ... not on a sharded 4-bit base (FSDP / ZeRO-3: Params4bit on cpu / meta)
    casts_back: bool  # under args.bf16, a 4-bit base: peft_module_casting_to_bf16 (norms fp32, head bf16)
    casts_adapters: bool  # that cast takes the LoRA layers (BaseTunerLayer) to bf16 too
    sharded_adapters_base: bool  # a sharded 4-bit base: get_peft_model(autocast_adapter_dtype=False)
    adapters_bf16: bool  # every trainable parameter of a 4-bit / 8-bit model to bf16 after get_peft_model
    zero3_lora_base: bool  # a non-quantized model under ZeRO-3: get_peft_model(autocast_adapter_dtype=False)
    source: str


def _row(since: Release, source: str, **facts: bool) -> TrlRelease:
    """A row whose unnamed facts are False."""
    names = ("prepares", "skips_sharded", "casts_back", "casts_adapters", "sharded_adapters_base",
             "adapters_bf16", "zero3_lora_base")  # fmt: skip
    return TrlRelease(since=since, source=source, **{n: facts.get(n, False) for n in names})


_ZERO3 = "bf6a7b51 (first in v1.7.0) {f}: autocast_adapter_dtype=False for a non-quantized model under ZeRO-3"
_BF16 = "{tag} {f}: after get_peft_model every trainable parameter of a 4-/8-bit model .to(torch.bfloat16)"
_PREP_PEFT = (
    "{tag} trl/models/utils.py prepare_peft_model: prepare_model_for_kbit_training unless a sharded 4-bit "
    "base (Params4bit on cpu / meta); get_peft_model (autocast_adapter_dtype=False when sharded); under "
    "args.bf16 on an unsharded 4-bit base peft_module_casting_to_bf16 (norms fp32, lm_head / embed_tokens / "
    "wte / wpe bf16)"
)
_SFT_0_9 = dict(prepares=True, skips_sharded=True, casts_back=True, sharded_adapters_base=True)

# Newest first, per trainer: the first row whose ``since`` is at most the version asked is in force.
SFT_RELEASES: tuple[TrlRelease, ...] = (
    _row((1, 7, 0), _ZERO3.format(f="trl/trainer/sft_trainer.py"), adapters_bf16=True, zero3_lora_base=True),
    _row((0, 26, 0), _BF16.format(tag="v0.26.0", f="trl/trainer/sft_trainer.py"), adapters_bf16=True),
    _row((0, 9, 0), "v0.9.3 (99f2c94b, e4ed7a3a) .. v0.21 trl/trainer/sft_trainer.py; " + _PREP_PEFT.format(
        tag="v0.22.0 .. v0.25.1"), **_SFT_0_9),
    _row((0, 8, 0), "v0.8.0 .. v0.8.6 trl/trainer/sft_trainer.py: is_sharded_qlora skips preparation and "
         "cast; trl/trainer/utils.py peft_module_casting_to_bf16 casts BaseTunerLayer to bf16",
         prepares=True, skips_sharded=True, casts_back=True, casts_adapters=True),
    _row((0, 7, 5), "v0.7.5 trl/trainer/sft_trainer.py: prepare_model_for_kbit_training, get_peft_model, "
         "under args.bf16 on a 4-bit model peft_module_casting_to_bf16 (BaseTunerLayer to bf16 too)",
         prepares=True, casts_back=True, casts_adapters=True),
    _row((0, 4, 2), "v0.4.2 .. v0.7.4 trl/trainer/sft_trainer.py: prepare_model_for_int8_training / "
         "prepare_model_for_kbit_training on a 4-bit or 8-bit model, then get_peft_model", prepares=True),
    _row((0, 0, 0), "before v0.4.2: no SFTTrainer (v0.4.1 has no trl/trainer/sft_trainer.py)"),
)  # fmt: skip
DPO_RELEASES: tuple[TrlRelease, ...] = (
    _row((1, 7, 0), _ZERO3.format(f="trl/trainer/dpo_trainer.py"), adapters_bf16=True, zero3_lora_base=True),
    _row((0, 29, 0), _BF16.format(tag="v0.29.0", f="trl/trainer/dpo_trainer.py"), adapters_bf16=True),
    _row((0, 9, 0), "v0.9.3 .. v0.28.0 trl/trainer/dpo_trainer.py: prepare_model_for_kbit_training on a "
         "4-bit / 8-bit model (no sharded check), get_peft_model, under args.bf16 on a 4-bit model "
         "peft_module_casting_to_bf16", prepares=True, casts_back=True),
    _row((0, 8, 0), "v0.8.0 .. v0.8.6 trl/trainer/dpo_trainer.py: prepare, get_peft_model, under bf16 "
         "peft_module_casting_to_bf16 (BaseTunerLayer to bf16 too)", prepares=True, casts_back=True,
         casts_adapters=True),
    _row((0, 0, 0), "v0.5.0 .. v0.7.11 trl/trainer/dpo_trainer.py: prepare_model_for_int8_training / "
         "prepare_model_for_kbit_training on a 4-bit or 8-bit model, then get_peft_model", prepares=True),
)  # fmt: skip
GRPO_RELEASES: tuple[TrlRelease, ...] = (
    _row((1, 7, 0), _ZERO3.format(f="trl/trainer/grpo_trainer.py"), adapters_bf16=True, zero3_lora_base=True),
    _row((0, 26, 0), _BF16.format(tag="v0.26.0", f="trl/trainer/grpo_trainer.py"), adapters_bf16=True),
    _row((0, 22, 0), _PREP_PEFT.format(tag="v0.22.0 .. v0.25.1 grpo_trainer.py ->"), **_SFT_0_9),
    _row((0, 0, 0), "v0.14.0 .. v0.21.0 trl/trainer/grpo_trainer.py: get_peft_model only (no preparation)"),
)  # fmt: skip
RLOO_RELEASES: tuple[TrlRelease, ...] = (
    _row((1, 7, 0), _ZERO3.format(f="trl/trainer/rloo_trainer.py"), adapters_bf16=True, zero3_lora_base=True),
    _row((0, 27, 0), _BF16.format(tag="v0.27.0", f="trl/trainer/rloo_trainer.py"), adapters_bf16=True),
    _row((0, 22, 0), _PREP_PEFT.format(tag="v0.22.0 .. v0.26.2 rloo_trainer.py ->"), **_SFT_0_9),
    _row((0, 0, 0), "before v0.22.0 trl/trainer/rloo_trainer.py: no peft_config (v0.21.0 read)"),
)  # fmt: skip

# --objective -> the trainer whose rows hold (the objectives read: module docstring)
TRAINER_ROWS: dict[str, tuple[TrlRelease, ...]] = {
    "sft": SFT_RELEASES, "dpo": DPO_RELEASES, "grpo": GRPO_RELEASES, "rloo": RLOO_RELEASES,
}  # fmt: skip

# TRL's TrainingArguments subclasses (trl/trainer/<name>_config.py) -> the objective whose trainer takes them
TRL_CONFIGS = {"SFTConfig": "sft", "DPOConfig": "dpo", "GRPOConfig": "grpo", "RLOOConfig": "rloo"}


def trl_objective(args_type: type) -> str | None:
    """The objective of the TRL trainer whose config class ``args_type`` is (a class of the ``trl``
    package: its name where :data:`TRL_CONFIGS` has none, e.g. ``KTOConfig``); None for another
    TrainingArguments class."""
    for cls in args_type.__mro__:
        if cls.__module__.split(".")[0] == "trl":
            return TRL_CONFIGS.get(cls.__name__, cls.__name__)
    return None


# ``trl=`` as users type it (peakmem.releases: a leading v, dev / post / rc and +local tags); the SFTTrainer's
# rows are the table's (the other trainers' rows share its parse)
TABLE = ReleaseTable(field="trl", example="0.13.0", current=TRL_CURRENT, rows=SFT_RELEASES)
parse_trl_version = TABLE.parse
release_facts = TABLE.facts


@dataclass(frozen=True, kw_only=True)
class PeftPreparation:
    """What the release's trainer leaves: ``kbit_prep`` (a quantized base; None for a 16-bit one) and
    ``adapter_dtype`` (None: peft's default, fp32), and the line saying why."""

    kbit_prep: str | None
    adapter_dtype: str | None
    line: str


def facts_for(version: str, objective: str) -> TrlRelease | None:
    """The row in force for ``objective``'s trainer at ``version`` (None: a trainer not read here)."""
    parsed = parse_trl_version(version)
    rows = TRAINER_ROWS.get(objective)
    return None if rows is None else next(r for r in rows if r.since <= parsed)


def peft_preparation(
    version: str, *, objective: str, method: str, precision: str, quant: str, sharded: bool, zero3: bool,
    float_dtype: str = "bf16",
) -> PeftPreparation | None:  # fmt: skip
    """What TRL ``version``'s trainer for ``objective`` does to a ``method`` (lora / qlora) model under
    ``precision`` (bf16 or not: ``args.bf16``), a ``quant`` base (nf4 / fp4: 4-bit; int8), ``sharded``
    (FSDP or ZeRO-3: TRL's "sharded QLoRA"), ``zero3``; ``float_dtype``: the base's float (quant storage)
    dtype. None for a full fine-tune; an InputError for a malformed version."""
    row = facts_for(version, objective)
    if method == "full":
        return None
    if row is None:
        return PeftPreparation(kbit_prep=None, adapter_dtype=None, line=(
            f"trl={version}: the {objective} trainer's peft preparation is not read "
            "(peakmem.trl_versions): --kbit-prep and --adapter-dtype as given"))  # fmt: skip
    head = f"TRL {version} {objective} trainer"
    if method != "qlora":
        if zero3 and row.zero3_lora_base:
            return PeftPreparation(kbit_prep=None, adapter_dtype="base", line=(
                f"{head}: LoRA under ZeRO-3, adapters in the model's dtype ({row.source})"))  # fmt: skip
        return PeftPreparation(kbit_prep=None, adapter_dtype=None, line=f"{head}: peft's fp32 adapters")
    if row.adapters_bf16:
        return PeftPreparation(kbit_prep="none", adapter_dtype="bf16", line=(
            f"{head}: no kbit preparation, adapters bf16 ({row.source})"))  # fmt: skip
    four_bit = quant != "int8"
    skipped = four_bit and sharded and row.skips_sharded  # TRL's is_sharded_qlora looks at Params4bit only
    prepared = row.prepares and not skipped
    cast = prepared and row.casts_back and four_bit and precision in BF16_PRECISIONS
    prep = "trl" if cast else "peft" if prepared else "none"
    adapters = None  # peft's get_peft_model default: fp32 (autocast_adapter_dtype=True)
    if cast and row.casts_adapters:
        adapters = "bf16"
    elif skipped and row.sharded_adapters_base:
        adapters = float_dtype  # the base layer's dtype: bnb_4bit_quant_storage, the float dtype
    shown = adapters or "fp32"
    return PeftPreparation(kbit_prep=prep, adapter_dtype=adapters, line=(
        f"{head}: kbit_prep {prep}, adapters {shown}"
        + (" (a sharded 4-bit base: FSDP / ZeRO-3)" if skipped else "") + f" ({row.source})"))  # fmt: skip


__all__ = [
    "BF16_PRECISIONS",
    "DPO_RELEASES",
    "GRPO_RELEASES",
    "RLOO_RELEASES",
    "SFT_RELEASES",
    "TRAINER_ROWS",
    "TRL_CONFIGS",
    "TRL_CURRENT",
    "PeftPreparation",
    "TrlRelease",
    "facts_for",
    "parse_trl_version",
    "peft_preparation",
    "release_facts",
    "trl_objective",
]
