"""Defaults that the framework a setup implies decides, in one table, each with its source.

An option left at ``auto`` takes the first row whose condition holds for the setup asked; the
answer names the row it took (``Default.assumption``), so a reader sees which default decided
the bytes and why. The tables: the optimizer step's implementation (``optimizer_impl``: whether the
step allocates a temporary per parameter, torch's foreach AdamW, or none, a fused kernel), when the
loop reduces gradients under accumulation (``grad_sync``) and the dtype FSDP reduces them in
(``fsdp_reduce_dtype``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peakmem.accelerate_versions import ACCELERATE_RELEASES
from peakmem.accelerate_versions import release_facts as accelerate_release
from peakmem.training import (
    LITGPT_FRAMEWORKS,
    Framework,
    GradSync,
    OptimizerImpl,
    OptimizerName,
    Precision,
    ReduceDtype,
    TrainingSetup,
)
from peakmem.transformers_versions import release_facts as transformers_release

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


_HF_TRAINER_FUSED = Default(
    option="optimizer_impl", value=OptimizerImpl.FUSED.value,
    who="the HF Trainer's default optim on torch >= 2.8 is adamw_torch_fused",
    source="transformers 5.23 training_args.py TrainingArguments.optim "
    "(is_torch_greater_or_equal_than_2_8 -> 'adamw_torch_fused')",
    applies=lambda opt, prec, fw: opt in _ADAM and fw in (Framework.HF, Framework.UNSLOTH),
)  # fmt: skip
OPTIMIZER_STEP: tuple[Default, ...] = (
    Default(
        option="optimizer_impl", value=OptimizerImpl.FUSED.value,
        who="fp32 master weights are kept by DeepSpeed, Megatron-Core and apex, which step them with a "
        "fused multi-tensor Adam",
        source="deepspeed/runtime/engine.py _configure_basic_optimizer -> FusedAdam; "
        "megatron/core/optimizer/__init__.py (Transformer Engine / apex FusedAdam)",
        applies=lambda opt, prec, fw: opt in _ADAM and prec in _MASTER,
    ),
    _HF_TRAINER_FUSED,
    Default(
        option="optimizer_impl", value=OptimizerImpl.FOREACH.value,
        who="torch.optim with neither foreach nor fused given runs foreach on CUDA tensors",
        source="torch/optim/optimizer.py _default_to_fused_or_foreach",
        applies=lambda opt, prec, fw: True,
    ),
)  # fmt: skip


def _first(table: tuple[Default, ...], optimizer: OptimizerName, precision: Precision,
           framework: Framework) -> Default:  # fmt: skip
    """The first row of ``table`` whose condition holds (every table ends with a row that always does)."""
    return next(d for d in table if d.applies(optimizer, precision, framework))


# The HF Trainer's row before transformers 4.54 (peakmem.transformers_versions): its default optim is
# adamw_torch, torch.optim.AdamW built with neither foreach nor fused, so torch's foreach step runs.
_OLD_HF_TRAINER_ADAMW = Default(
    option="optimizer_impl", value=OptimizerImpl.FOREACH.value,
    who="the HF Trainer's default optim before transformers 4.54 is adamw_torch: torch.optim.AdamW "
    "with neither foreach nor fused, foreach on CUDA tensors",
    source="transformers 4.48.1 / 4.53.0 training_args.py default_optim = 'adamw_torch'; 4.48.1 trainer.py "
    "get_optimizer_cls_and_kwargs l. 1316-1322 (fused=True only for adamw_torch_fused); "
    "torch/optim/optimizer.py _default_to_fused_or_foreach",
    applies=lambda opt, prec, fw: True,
)  # fmt: skip


def optimizer_step(
    optimizer: OptimizerName, precision: Precision, framework: Framework, *, transformers: str | None = None
) -> Default:
    """The row of :data:`OPTIMIZER_STEP` that decides ``optimizer_impl=auto`` for this setup;
    ``transformers``: the release under the HF Trainer (None: the current one), whose default optim is
    fused from 4.54 only."""
    row = _first(OPTIMIZER_STEP, optimizer, precision, framework)
    if (
        row is _HF_TRAINER_FUSED
        and transformers is not None
        and not transformers_release(transformers).trainer_fused_adamw
    ):
        return _OLD_HF_TRAINER_ADAMW
    return row


# When the training loop reduces the gradients under gradient accumulation. Read at: transformers 5.23
# trainer.py ``Trainer._inner_training_loop`` (every micro-batch but the step's last runs under
# ``accelerator.no_sync(model)`` unless ``sync_each_batch`` or DeepSpeed); accelerate 1.16 accelerator.py
# ``Accelerator.no_sync`` (FSDP2: ``model.set_requires_gradient_sync(False)``; FSDP1: ``model.no_sync()``)
# and ``Accelerator.accumulate`` (enters it unless ``sync_gradients`` or ``sync_each_batch``),
# utils/dataclasses.py ``GradientAccumulationPlugin.sync_each_batch`` (default False); torchtune
# bd2a0fc recipes/full_finetune_distributed.py and lora_finetune_distributed.py ``train``
# (``current_loss.backward()`` every micro-batch, no no_sync); torchtitan b5bcd76 torchtitan/trainer.py
# ``train_step`` (``forward_backward_step`` per accumulation step, no ``set_requires_gradient_sync``).
_HF_TRAINER_NO_SYNC = Default(
    option="grad_sync", value=GradSync.LAST.value,
    who="the HF Trainer runs every micro-batch but the last under accelerate's no_sync "
    "(sync_each_batch=False): FSDP keeps the unsharded gradients until the last one",
    source="transformers 5.23 trainer.py _inner_training_loop; accelerate 1.16 accelerator.py no_sync "
    "(FSDP2 set_requires_gradient_sync(False), FSDP1 no_sync), GradientAccumulationPlugin",
    applies=lambda opt, prec, fw: True,
)  # fmt: skip
GRAD_SYNC: tuple[Default, ...] = (
    Default(
        option="grad_sync", value=GradSync.EACH.value,
        who="torchtune's recipes reduce-scatter in every micro-batch's backward (no no_sync), as torchtitan",
        source="torchtune recipes/full_finetune_distributed.py train: current_loss.backward() per "
        "micro-batch; torchtitan trainer.py train_step",
        applies=lambda opt, prec, fw: fw is Framework.TORCHTUNE,
    ),
    Default(
        option="grad_sync", value=GradSync.LAST.value,
        who="Lit-GPT's finetune scripts run every micro-batch but the step's last under Fabric's "
        "no_backward_sync (FSDP1 no_sync: unsharded gradients until the last one)",
        source="Lit-GPT@8641822b finetune/lora.py train (litgpt@5895df1 litgpt/finetune/lora.py fit alike): "
        "with fabric.no_backward_sync(model, "
        "enabled=is_accumulating)",
        applies=lambda opt, prec, fw: fw in LITGPT_FRAMEWORKS,
    ),
    _HF_TRAINER_NO_SYNC,
)  # fmt: skip

# The HF Trainer's row under FSDP2 with accelerate before 1.11 (peakmem.accelerate_versions): its no_sync is
# ``getattr(model, "no_sync", nullcontext)``, which an FSDP2 module lacks, so every micro-batch reduces.
_OLD_ACCELERATE_FSDP2 = Default(
    option="grad_sync", value=GradSync.EACH.value,
    who="the HF Trainer's no_sync is a no-op on an FSDP2 model before accelerate 1.11: every micro-batch "
    "reduce-scatters, FSDP keeps gradient shards only",
    source=f"transformers 4.55.0 trainer.py _inner_training_loop; {ACCELERATE_RELEASES[-1].source}",
    applies=lambda opt, prec, fw: True,
)  # fmt: skip


def grad_sync(setup: TrainingSetup, *, fsdp2: bool = False) -> Default:
    """The row of :data:`GRAD_SYNC` that decides ``grad_sync=auto`` for this setup; ``fsdp2``: the model is
    sharded by FSDP2, whose sync the HF Trainer's row skips only from accelerate 1.11 on."""
    row = _first(GRAD_SYNC, setup.optimizer, setup.precision, setup.framework)
    if row is _HF_TRAINER_NO_SYNC and fsdp2 and not accelerate_release(setup.accelerate).fsdp2_no_sync:
        return _OLD_ACCELERATE_FSDP2
    return row


def skips_grad_sync(setup: TrainingSetup, *, fsdp2: bool = False) -> bool:
    """Whether the loop runs its micro-batches but the last without gradient sync: ``grad_sync``
    ``last-micro-batch`` (asked, or the framework's under ``auto``) with more than one micro-batch;
    ``fsdp2`` as :func:`grad_sync`."""
    if setup.grad_accum == 1:
        return False
    sync = setup.grad_sync
    if sync is GradSync.AUTO:
        sync = GradSync(grad_sync(setup, fsdp2=fsdp2).value)
    return sync is GradSync.LAST


# The dtype FSDP reduce-scatters in (and FSDP2 accumulates unsharded gradients in under no_sync / PP).
# Read at: accelerate 1.16 state.py ``AcceleratorState.__init__`` (``fsdp_plugin.set_mixed_precision(
# mixed_precision)`` whenever mixed precision is on) and utils/dataclasses.py
# ``FullyShardedDataParallelPlugin.set_mixed_precision`` (``dtype_args = {"param_dtype": dtype,
# "reduce_dtype": dtype}``, FSDP1's ``MixedPrecision`` and FSDP2's ``MixedPrecisionPolicy`` alike, unless
# the user gives a ``mixed_precision_policy``); torchtune bd2a0fc torchtune/training/_distributed.py
# ``shard_model`` (``fsdp_kwargs``: reshard_after_forward and mesh, no ``mp_policy``: torch 2.13
# _fsdp_param.py ``init_dtype_attrs`` reduces in the gradients' dtype); torchtitan 238fa995
# torchtitan/config/job_config.py (b5bcd76 config/configs.py) ``mixed_precision_reduce: Literal["float32"]
# = "float32"``: no Framework row (torchtitan's model code is not one), its setups say fp32 (--from
# torchtitan, benchmarks/published_scale.py).
REDUCE_DTYPE: tuple[Default, ...] = (
    Default(
        option="fsdp_reduce_dtype", value=ReduceDtype.PARAM.value,
        who="accelerate (HF Trainer) sets FSDP's MixedPrecision(Policy)(param_dtype=dtype, "
        "reduce_dtype=dtype): the gradients are reduced, and kept under no_sync, in the 16-bit param dtype",
        source="accelerate 1.16 utils/dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision, "
        "called by state.py AcceleratorState.__init__",
        applies=lambda opt, prec, fw: fw in (Framework.HF, Framework.UNSLOTH),
    ),
    Default(
        option="fsdp_reduce_dtype", value=ReduceDtype.PARAM.value,
        who="Lightning Fabric's FSDP precision under bf16-true sets MixedPrecision(param_dtype=reduce_dtype="
        "buffer_dtype=bf16): the gradients are reduced in the 16-bit param dtype",
        source="Lightning 2.1 fabric/plugins/precision/fsdp.py FSDPPrecision.mixed_precision_config "
        "(Lit-GPT@8641822b finetune/lora.py: FSDPStrategy with Fabric precision)",
        applies=lambda opt, prec, fw: fw in LITGPT_FRAMEWORKS,
    ),
    Default(
        option="fsdp_reduce_dtype", value=ReduceDtype.PARAM.value,
        who="torchtune's fully_shard has no MixedPrecisionPolicy: FSDP2 reduces in the gradients' dtype",
        source="torchtune training/_distributed.py shard_model (fsdp_kwargs without mp_policy); torch "
        "_fsdp_param.py init_dtype_attrs",
        applies=lambda opt, prec, fw: True,
    ),
)  # fmt: skip


def fsdp_reduce(setup: TrainingSetup) -> Default:
    """The row of :data:`REDUCE_DTYPE` that decides ``fsdp_reduce_dtype=auto`` for this setup."""
    return _first(REDUCE_DTYPE, setup.optimizer, setup.precision, setup.framework)


def reduce_dtype(setup: TrainingSetup) -> ReduceDtype:
    """FSDP's reduce dtype for this setup, never ``auto``: the one asked, or the framework's."""
    if setup.fsdp_reduce_dtype is ReduceDtype.AUTO:
        return ReduceDtype(fsdp_reduce(setup).value)
    return setup.fsdp_reduce_dtype
