"""A setup's method, precision and optimizer applied to a model once, before any sharding.

The result describes what exists on one GPU that trains the whole model: the bytes-per-parameter
rows, the frozen base (LoRA/QLoRA: 16-bit or quantized, no gradient, no optimizer state), the
trainable tensors (the whole model, or the adapters) with the dtypes of their weights, gradients and
master copies, their optimizer-state rows and step temporaries, and the gradient bytes each layer
writes in backward. :mod:`.sharding` then partitions exactly these tensors across ranks, and
:mod:`peakmem.estimate` walks one step timeline over them: a technique is never applied twice, and an
engine never invents tensors the technique does not have (a LoRA job keeps adapter-sized gradients,
buckets and states on every layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.adapters import lora_of, quant_of
from peakmem.breakdown import MemoryItem, PerParamRow
from peakmem.dtypes import DType
from peakmem.model import ModelSpec, split_last_block
from peakmem.training import Framework, TrainingSetup

from . import lora as _lora
from . import qlora as _qlora
from .memo import Memo
from .model_states import buffer_bytes, precision_plan, spec_facts, trainable_params, weight_rows
from .optimizer import optimizer_phase_grads, optimizer_rows, step_temporaries
from .profiles import code_spec


@dataclass(frozen=True, kw_only=True)
class Technique:
    """What one GPU holds for ``setup`` applied to ``spec`` (before any engine shards it)."""

    spec: ModelSpec  # as estimated (LoRA: the first layer split off, see lora.split_first_layer)
    tspec: ModelSpec  # the trainable tensors as a spec: ``spec`` itself, or the adapters
    tsetup: TrainingSetup  # the setup the optimizer formulas see (LoRA: full fine-tuning of tspec)
    adapter: bool  # LoRA / QLoRA / DoRA: a frozen base plus adapters
    rows: tuple[PerParamRow, ...]  # the single-GPU bytes-per-parameter table
    params: int  # the base model's parameters
    trainable: int  # parameters that get gradients and optimizer states
    frozen: PerParamRow | None  # the frozen base as stored (None: full fine-tuning)
    base_dtype: DType  # the base's unquantized dtype (its norms, embeddings and head under QLoRA)
    root_numel: int  # base parameters outside the layers (embeddings, final norm, head)
    frozen_root_bytes: int  # of the frozen base, the bytes outside the layers (never quantized)
    weight: DType  # the trainable parameters' dtype
    grad: DType  # their gradients' dtype
    master: DType | None  # fp32 master copies of 16-bit trainable parameters
    state_rows: tuple[PerParamRow, ...]  # optimizer states over every trainable parameter
    step_grads: MemoryItem  # the gradients the optimizer step reads (fp32 copies under mixed-*)
    temporaries: tuple[MemoryItem, ...]  # the step's temporaries over every trainable parameter
    largest_trainable: int  # elements of the largest trainable tensor
    buffers: int  # registered buffers (fp32)
    layer_grads: tuple[int, ...]  # per group of ``spec``: gradient bytes one layer writes in backward
    # of the frozen base in the layers, the bytes that are no parameter's data: bitsandbytes' quantization
    # states (qlora.quant_state_bytes), left whole on every rank by FSDP (bnb_fsdp); 0 for torchtune's
    # torchao NF4Tensor, whose FSDP2 extension (fsdp_pre_all_gather) shards its scales with its codes
    frozen_state_bytes: int = 0


def technique(spec: ModelSpec, setup: TrainingSetup, memo: Memo | None = None) -> Technique:
    """Apply ``setup``'s method, precision and optimizer to ``spec`` (``memo``: an estimator's)."""
    adapter = _lora.is_adapter_method(setup)
    # the framework's model code (Lit-GPT unties a tied head); a derived spec's last block measured on its own
    spec = split_last_block(code_spec(spec, setup))  # (model.LAST_BLOCK)
    if adapter:  # the first layer, and the layers a target_parameters key names, in groups of their own
        spec = _lora.split_target_layers(_lora.split_first_layer(spec), lora_of(setup), memo)
    tspec, tsetup = _lora.optimizer_view(spec, setup, memo)  # the trainable tensors (LoRA: the adapters)
    plan = precision_plan(setup.precision)
    opt_rows = optimizer_rows(tspec, tsetup, memo)
    if adapter:
        rows = _lora.finetune_weight_rows(spec, setup, plan, memo) + opt_rows
        weight = grad = _lora.train_dtype(lora_of(setup), plan)
        master = plan.master if weight.bits < 32 else None
        frozen: PerParamRow | None = rows[0]
        layer_grads = tuple(_lora.layer_grad_bytes(spec, setup, i, memo) for i in range(len(spec.groups)))
    else:
        rows = weight_rows(spec, setup, memo) + opt_rows
        weight, grad, master, frozen = plan.weight, plan.grad, plan.master, None
        layer_grads = tuple(grad.nbytes(n) for n in spec_facts(spec, memo).layer_params)
    root = sum(t.numel for t in spec.outer)
    # the frozen base outside the layers: in the model's dtype, or QLoRA's float dtype (bitsandbytes
    # quantizes no embedding or norm, and the head only under Lightning: formulas/qlora.py root_bytes)
    quant = quant_of(setup) if adapter else None
    frozen_root = plan.weight.nbytes(root) if quant is None else _qlora.root_bytes(spec, quant)
    return Technique(
        base_dtype=plan.weight, root_numel=root, frozen_root_bytes=frozen_root if adapter else 0,
        spec=spec, tspec=tspec, tsetup=tsetup, adapter=adapter, rows=rows,
        params=spec_facts(spec, memo).params, trainable=trainable_params(tspec, tsetup, memo), frozen=frozen,
        weight=weight, grad=grad, master=master, state_rows=opt_rows,
        step_grads=optimizer_phase_grads(tspec, tsetup, memo),
        temporaries=step_temporaries(tspec, tsetup, memo),
        largest_trainable=spec_facts(tspec, memo).largest, buffers=buffer_bytes(spec, setup),
        layer_grads=layer_grads,
        frozen_state_bytes=_qlora.quant_state_bytes(spec, quant)
        if quant is not None and setup.framework is not Framework.TORCHTUNE else 0,
    )  # fmt: skip
