"""Defaults that the framework a setup implies decides, in one table, each with its source.

An option left at ``auto`` takes the first row whose condition holds for the setup asked; the
answer names the row it took (``Default.assumption``), so a reader sees which default decided
the bytes and why. Today: the optimizer step's implementation (``optimizer_impl``), which decides
whether the step allocates a temporary per parameter (torch's foreach AdamW: an fp32
``exp_avg_sq_sqrt`` of every parameter) or none (a fused kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peakmem.training import Framework, OptimizerImpl, OptimizerName, Precision

_ADAM = (OptimizerName.ADAMW, OptimizerName.ADAM)
_MASTER = (Precision.MIXED_BF16, Precision.MIXED_FP16)


@dataclass(frozen=True, kw_only=True)
class Default:
    """``value`` for ``option`` when ``applies(optimizer, precision, framework)``; ``who`` runs it so."""

    option: str
    value: str
    who: str
    source: str
    applies: Callable[[OptimizerName, Precision, Framework], bool]

    @property
    def assumption(self) -> str:
        return f"{self.option.replace('_', '-')} {self.value} (default: {self.who}; {self.source})"


OPTIMIZER_STEP: tuple[Default, ...] = (
    Default(
        option="optimizer_impl", value=OptimizerImpl.FUSED.value,
        who="fp32 master weights are kept by DeepSpeed, Megatron-Core and apex, which step them with a "
        "fused multi-tensor Adam",
        source="deepspeed/runtime/engine.py _configure_basic_optimizer -> FusedAdam; "
        "megatron/core/optimizer/__init__.py (Transformer Engine / apex FusedAdam)",
        applies=lambda opt, prec, fw: opt in _ADAM and prec in _MASTER,
    ),
    Default(
        option="optimizer_impl", value=OptimizerImpl.FUSED.value,
        who="the HF Trainer's default optim on torch >= 2.8 is adamw_torch_fused",
        source="transformers 5.23 training_args.py TrainingArguments.optim "
        "(is_torch_greater_or_equal_than_2_8 -> 'adamw_torch_fused')",
        applies=lambda opt, prec, fw: opt in _ADAM and fw in (Framework.HF, Framework.UNSLOTH),
    ),
    Default(
        option="optimizer_impl", value=OptimizerImpl.FOREACH.value,
        who="torch.optim with neither foreach nor fused given runs foreach on CUDA tensors",
        source="torch/optim/optimizer.py _default_to_fused_or_foreach",
        applies=lambda opt, prec, fw: True,
    ),
)  # fmt: skip


def optimizer_step(optimizer: OptimizerName, precision: Precision, framework: Framework) -> Default:
    """The row of :data:`OPTIMIZER_STEP` that decides ``optimizer_impl=auto`` for this setup."""
    return next(d for d in OPTIMIZER_STEP if d.applies(optimizer, precision, framework))
