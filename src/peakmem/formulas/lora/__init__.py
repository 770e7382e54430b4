"""LoRA / DoRA adapters as peft 0.21.2 creates them: which modules, how many parameters, what they save.

The configuration itself (``LoraConfig``, ``QuantConfig``) is an input: :mod:`peakmem.adapters`. Here:

* :mod:`.targets`: which modules and parameters peft adapts (``resolve_targets``);
* :mod:`.params`: the tensors peft creates, their dtype, and the estimator's view of a LoRA / QLoRA
  job's model states (``optimizer_view``, ``finetune_weight_rows``, ``assumptions``);
* :mod:`.layers`: the layer groups LoRA splits off (the first layer, layers a target names);
* :mod:`.deltas`: what the adapters add to, and the frozen base drops from, the base activations of
  :mod:`peakmem.formulas.activations` (which never imports this package).
"""

from __future__ import annotations

from .deltas import (
    AdapterActivations,
    adapt_embedding_items,
    adapt_head,
    adapt_layer,
    adapter_forward_transient,
    adapter_saved_per_module,
    param_wrapper_saved,
)
from .layers import split_first_layer, split_target_layers
from .params import (
    adapter_dtype,
    adapter_tensors,
    assumptions,
    finetune_weight_rows,
    is_adapter_method,
    layer_grad_bytes,
    layer_trainable_params,
    module_adapter_tensors,
    optimizer_precision,
    optimizer_view,
    outer_grad_split,
    saved_copy_params,
    train_dtype,
    trainable_params,
    trainable_spec,
    weight_rows_for,
)
from .targets import (
    PEFT_DEFAULT_TARGETS,
    SEQ_CLS_HEAD_NAMES,
    AdaptedModule,
    available_modules,
    embeddings_adapted,
    resolve_targets,
)

__all__ = [
    "PEFT_DEFAULT_TARGETS",
    "SEQ_CLS_HEAD_NAMES",
    "AdaptedModule",
    "AdapterActivations",
    "adapt_embedding_items",
    "adapt_head",
    "adapt_layer",
    "adapter_dtype",
    "adapter_forward_transient",
    "adapter_saved_per_module",
    "adapter_tensors",
    "assumptions",
    "available_modules",
    "embeddings_adapted",
    "finetune_weight_rows",
    "is_adapter_method",
    "layer_grad_bytes",
    "layer_trainable_params",
    "module_adapter_tensors",
    "optimizer_precision",
    "optimizer_view",
    "outer_grad_split",
    "param_wrapper_saved",
    "resolve_targets",
    "saved_copy_params",
    "split_first_layer",
    "split_target_layers",
    "train_dtype",
    "trainable_params",
    "trainable_spec",
    "weight_rows_for",
]
