"""What runs when a training setup is asked for a model (for :mod:`peakmem.estimate`): eager attention
where transformers has no kernel asked for, no Liger where Liger patches nothing, nothing for
``keep_grads`` to keep under a master-weight step, the framework profile's settings; and the assumption
lines that say so."""

from __future__ import annotations

from dataclasses import replace

from peakmem.adapters import lora_of, quant_of
from peakmem.formulas.model_states import precision_plan
from peakmem.formulas.profiles import liger_applies, profile_setup
from peakmem.model import ModelSpec
from peakmem.training import AttentionKernel, Method, TrainingSetup
from peakmem.transformers_versions import experts_are_linears


def setup_that_runs(spec: ModelSpec, setup: TrainingSetup) -> TrainingSetup:
    """What runs when ``setup`` is asked for ``spec``: eager attention where transformers has no kernel
    asked for, no Liger where Liger patches nothing, a QLoRA base whose MoE experts are quantized where
    the transformers release builds them as Linears (peakmem.transformers_versions) and LoRA targets that
    adapt each of those Linears, the framework profile's settings."""
    fallback = _attention_fallback(spec, setup)
    if fallback is not None:
        setup = fallback
    if setup.liger and not liger_applies(spec.model_type):
        setup = replace(setup, liger=False)  # Liger patches nothing in this model: it runs as is
    # a master-weight step moves each 16-bit gradient onto its fp32 master and frees it
    # (peakmem.measure.trainer.MasterWeightTrainer, DeepSpeed's and Megatron's optimizers): nothing to keep
    if not setup.grads_set_to_none and precision_plan(setup.precision).master is not None:
        setup = replace(setup, grads_set_to_none=True)
    quant = quant_of(setup)
    if (
        quant is not None
        and not quant.expert_linears
        and experts_are_linears(setup.transformers, spec.model_type)
    ):
        setup = replace(setup, quant=replace(quant, expert_linears=True))  # bitsandbytes quantizes them
    lora = lora_of(setup)
    if (
        setup.method is not Method.FULL
        and not lora.expert_linears
        and experts_are_linears(setup.transformers, spec.model_type)
    ):
        setup = replace(setup, lora=replace(lora, expert_linears=True))  # peft adapts each expert's Linear
    return profile_setup(setup)


def _attention_fallback(spec: ModelSpec, setup: TrainingSetup) -> TrainingSetup | None:
    """The setup with eager attention when transformers has no ``setup.attention`` kernel for this
    architecture (BLOOM: eager only; Gemma 2: no SDPA), as its ``_check_and_adjust_attn_implementation``
    picks eager when SDPA is unsupported (modeling_utils.py); None when the kernel exists."""
    if setup.attention.value in spec.attention_kernels:
        return None
    return replace(setup, attention=AttentionKernel.EAGER)


def fallback_note(spec: ModelSpec, asked: TrainingSetup, setup: TrainingSetup) -> tuple[str, ...]:
    """What runs instead of what was asked: an attention kernel the model lacks, Liger on a model type
    Liger does not patch."""
    notes: tuple[str, ...] = ()
    if asked.attention is not setup.attention:
        notes += (
            f"attention {asked.attention.value} is not implemented by transformers for {spec.model_type} "
            f"(kernels: {', '.join(spec.attention_kernels)}); it runs {setup.attention.value}, as estimated",
        )
    if asked.liger and not setup.liger:
        notes += (
            f"Liger kernels: Liger does not patch {spec.model_type} (liger_kernel monkey_patch.py "
            "MODEL_TYPE_TO_APPLY_LIGER_FN): the model runs its own modules, as estimated",
        )
    if not asked.grads_set_to_none and setup.grads_set_to_none:
        notes += (
            f"keep_grads: {asked.precision.value} steps fp32 masters and drops each 16-bit gradient at the "
            "step (master.grad = p.grad.float(); p.grad = None), so zero_grad has none left to keep",
        )
    return notes
