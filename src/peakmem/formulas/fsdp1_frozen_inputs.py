"""FSDP1, frozen layer units, reentrant checkpointing: every layer's input and its gradient live to the end.

A layer unit whose ``FlatParameter`` does not require gradients (LoRA / QLoRA with the adapters wrapped in
units of their own: peft's ``fsdp_auto_wrap_policy``, which transformers' ``_fsdp_qlora_plugin_updates``
installs for any peft model under FSDP) has no ``AccumulateGrad`` for FSDP1 to hook, so FSDP1 reshards it
from a hook on the unit's *inputs* instead (torch 2.4.1 and 2.13 torch/distributed/fsdp/_runtime_utils.py
``_register_post_backward_reshard_only_hook``: ``register_multi_grad_hook(inp_tensors, ...)`` on the forward
arguments that require grad, the handle kept in ``flat_param._post_backward_hook_state`` and removed only by
``_finalize_params`` in the post-backward final callback, at the end of backward).
``register_multi_grad_hook`` (torch/autograd/graph.py, both releases) keeps
``grad_fns = list(map(_get_grad_fn_or_grad_acc, tensors))`` in the hook's closure: for a leaf tensor
its ``AccumulateGrad`` node, which owns the tensor.

Under reentrant checkpointing (transformers before 5.0: :mod:`peakmem.transformers_versions`) the unit's
forward that needs grad is the recomputation, run on ``detach_variable(inputs)`` (torch/utils/checkpoint.py
``CheckpointFunction.backward``): leaves that share the checkpoint's saved layer input and receive its
gradient in ``.grad``. So from each layer's backward to the end of backward the hook keeps that layer's
input (which autograd would have freed there) and its input gradient (a tensor of the same shape and dtype),
two ``layer_input`` bytes per layer done instead of none. One of them, the gradient the running layer
received from the layer above, is the incoming gradient its own backward already counts.

Measured with the parallel oracle (transformers 4.48.1 Trainer, accelerate 1.0.1 FSDP1 FULL_SHARD,
use_orig_params, BACKWARD_PRE, peft 0.13.2 LoRA r 16 on q/k/v/o wrapped apart, bf16 base, bf16=True with
MixedPrecision(bf16); rank 0 of a fake 2-rank world, tiny Llama hidden 256, 2 x 256 tokens): the backward
peak above the resting states grows by 524,288 B per layer (8 -> 16 layers), two bf16 ``2 x 256 x 256``
tensors, where one process without FSDP grows by 262,144 B (the checkpoint alone); removing the hook once it
has fired takes it to 210,944 B per layer (the peak back at the top layer). With the hook kept the peak
moves to the first layer's backward (the last one backward reaches): the 8-layer oracle holds there every
layer's input and 7 of their gradients.

The same adapter units decide what FSDP1's backward prefetch gathers (:func:`backward_units`). FSDP1 records
each handle's place in the forward's post-forward order once (torch 2.4.1 fsdp/_exec_order_utils.py
``record_post_forward``: "Only record the first usage") and ``BACKWARD_PRE`` prefetches the handle recorded
just before the running one (``get_handle_to_backward_prefetch``: ``current_index - 1``). A layer unit's
nested adapter units finish their forward before it does, so a layer unit's target is its own last adapter
unit; the layer below is gathered only from the pre-backward hook of the layer's first adapter unit (q_proj's
``lora_A``, preceded by the layer below), at the end of the layer's backward, past its MLP and attention
core. The oracle holds one layer unit (and the root) at its backward peak, with or without the hook
removed above; the FSDP1 estimate otherwise counts the running and the prefetched layer unit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from peakmem.breakdown import MemoryItem
from peakmem.formulas.timeline import GroupCost
from peakmem.parallel import AdapterWrap, FsdpMode, Parallelism
from peakmem.training import Checkpointing

NOTE = (
    "FSDP1 over frozen layer units with reentrant checkpointing (transformers < 5.0's default): each layer's "
    "input and its gradient stay until the end of backward (FSDP1's reshard hook on the unit's inputs)"
)

SRC_FROZEN_INPUTS = (
    "torch 2.4.1 fsdp/_runtime_utils.py _register_post_backward_reshard_only_hook (register_multi_grad_hook "
    "on a frozen unit's inputs, removed by _finalize_params at the end of backward); autograd/graph.py "
    "register_multi_grad_hook keeps the inputs' AccumulateGrad nodes; utils/checkpoint.py "
    "CheckpointFunction.backward: detached inputs, their .grad"
)


def keeps_layer_inputs(
    par: Parallelism, adapter: bool, checkpointing: Checkpointing, reentrant: bool
) -> bool:
    """Whether backward keeps each layer's checkpointed input and its gradient to its end: FSDP1 (no PP)
    over layer units that hold only frozen parameters (an adapter, wrapped apart), each layer under
    reentrant full checkpointing."""
    return (
        adapter
        and par.fsdp is not FsdpMode.NONE
        and par.fsdp_version == 1
        and par.pp == 1
        and par.fsdp_adapter_wrap is AdapterWrap.SEPARATE
        and checkpointing is Checkpointing.FULL
        and reentrant
    )


def kept_per_layer(layer_input: int) -> int:
    """Bytes one layer leaves behind once its backward has run: its input and the input's gradient."""
    return 2 * layer_input


def incoming_gradient(groups: Iterable[GroupCost]) -> int:
    """Of what the layers done keep, the bytes the running layer's backward transient already counts: the
    gradient it received, the input gradient of the layer above (half of that layer's ``kept``)."""
    return max((g.kept // 2 for g in groups), default=0)


def one_layer_unit(par: Parallelism, adapter: bool) -> bool:
    """Whether FSDP1's backward holds one layer unit at a layer's backward peak, not two: the adapters are
    units of their own inside the layer units, and the layer unit's prefetch target is its last one."""
    return (
        adapter
        and par.fsdp_version == 1
        and par.fsdp is FsdpMode.FULL_SHARD
        and par.fsdp_adapter_wrap is AdapterWrap.SEPARATE
    )


UNITS_KEY = "fsdp.units"  # peakmem.formulas.sharding: the FSDP1 layer units' item, two units of a stage


def backward_units(
    items: Iterable[MemoryItem], par: Parallelism, adapter: bool, layers: int
) -> tuple[MemoryItem, ...]:
    """``items`` (a rank's gathered parameters in backward) with the FSDP1 layer units' item (sharding.py:
    ``min(2, layers)`` units) holding one unit where :func:`one_layer_unit` says so."""
    if not one_layer_unit(par, adapter) or layers < 2:
        return tuple(items)
    return tuple(
        replace(i, path="FSDP all-gathered unit (the running layer; its prefetch target is its own last "
                "adapter unit)", bytes=i.bytes // 2, source=SRC_PREFETCH_TARGET) if i.key == UNITS_KEY else i
        for i in items
    )  # fmt: skip


SRC_PREFETCH_TARGET = (
    "torch 2.4.1 fsdp/_exec_order_utils.py record_post_forward (first usage only), "
    "get_handle_to_backward_prefetch (current_index - 1): a layer unit's target is its last nested adapter "
    "unit"
)
