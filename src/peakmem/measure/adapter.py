"""LoRA for ``peakmem measure``: wrap the model with peft as a LoRA fine-tune does.

``apply_adapter(model, setup)`` is meant to be called by :mod:`peakmem.measure.runner` right after the
model is moved to its device and dtype (``model.to(device, dtype)``), for ``setup.method == lora``:
``peft.get_peft_model`` freezes the base (``requires_grad=False``) and adds the adapters
(``autocast_adapter_dtype=True`` makes 16-bit adapters fp32, as peft does by default; ``adapter_dtype
= "base"`` keeps the model's dtype). The trainers already train only what requires grad, so the base
gets no gradient, master copy or optimizer state. Needs peft (the ``torch`` extra).
"""

from __future__ import annotations

from typing import Any

from peakmem.adapters import ALL_LINEAR, lora_of
from peakmem.errors import InputError
from peakmem.formulas.lora import PEFT_DEFAULT_TARGETS
from peakmem.training import Method, TrainingSetup


def peft_config(setup: TrainingSetup, model_type: str | None = None, *, seq_cls: bool = False) -> Any:
    """The ``peft.LoraConfig`` for ``setup.lora`` (peakmem's defaults: r=8 on all linears). ``seq_cls``:
    ``task_type="SEQ_CLS"``, so peft keeps a trainable copy of the classifier (modules_to_save)."""
    import peft

    lora = lora_of(setup)
    targets: Any
    if lora.targets == (ALL_LINEAR,):
        targets = ALL_LINEAR
    elif lora.targets:
        targets = list(lora.targets)
    else:
        targets = list(PEFT_DEFAULT_TARGETS.get(model_type or "", ())) or None
    alpha: Any = int(lora.alpha) if float(lora.alpha).is_integer() else lora.alpha  # peft types it int
    return peft.LoraConfig(
        r=lora.rank, lora_alpha=alpha, target_modules=targets,
        target_parameters=list(lora.target_parameters) or None, lora_dropout=lora.dropout,
        use_dora=lora.dora, lora_bias=lora.lora_bias, modules_to_save=list(lora.modules_to_save) or None,
        task_type="SEQ_CLS" if seq_cls else None,
    )  # fmt: skip


def apply_adapter(model: Any, setup: TrainingSetup) -> Any:
    """``model`` wrapped by ``peft.get_peft_model`` for LoRA; unchanged for full fine-tuning."""
    if setup.method is Method.FULL:
        return model
    if setup.method is Method.QLORA:
        raise InputError(
            "method='qlora': not measurable here (bitsandbytes 4-bit training needs CUDA kernels)"
        )
    import peft

    lora = lora_of(setup)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    seq_cls = type(model).__name__.endswith("ForSequenceClassification")
    config = peft_config(setup, model_type, seq_cls=seq_cls)
    return peft.get_peft_model(model, config, autocast_adapter_dtype=lora.adapter_dtype == "fp32")
