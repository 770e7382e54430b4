"""Gradient accumulation under FSDP when the loop skips the gradient sync: what a rank keeps between
micro-batches.

A loop that runs every micro-batch but the last without gradient sync (peakmem.defaults ``GRAD_SYNC``:
the HF Trainer through accelerate's ``no_sync``, Lightning Fabric's ``no_backward_sync``) makes FSDP
keep the unsharded gradients from the first micro-batch's backward to the last one, whose backward
reduce-scatters them once (torch 2.13):

* FSDP1 ``FullyShardedDataParallel.no_sync`` (fully_sharded_data_parallel.py: "FSDP will accumulate
  the full model gradients (instead of gradient shards) until the eventual sync"): the post-backward
  hook returns before the reduce-scatter (_runtime_utils.py ``_post_backward_hook``: ``if not
  state._sync_gradients``), so each unit's ``FlatParameter.grad`` stays the unsharded gradient autograd
  wrote, in the dtype the unit ran in (``MixedPrecision(param_dtype)``), and the next backward
  accumulates into it (``_post_backward_final_callback``: "``.grad`` remains the unsharded gradient
  from prior ``no_sync()`` iterations"); under CPU offload it stays on the GPU (``no_sync`` docstring);
* FSDP2 ``set_requires_gradient_sync(False)`` (_fully_shard.py: "the equivalence of ``no_sync`` in
  FSDP1"): ``FSDPParamGroup.post_backward`` returns before the reduce-scatter (``if not
  self.reduce_grads``), keeping each trainable parameter's unsharded gradient, upcast to the reduce
  dtype (_fsdp_param.py ``to_accumulated_grad_if_needed``); frozen parameters have none. Full
  fine-tuning is :func:`peakmem.formulas.fsdp2.accumulated`, shared with pipeline parallelism.
"""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem
from peakmem.defaults import grad_sync
from peakmem.dtypes import DType
from peakmem.parallel import Parallelism
from peakmem.training import GradSync, TrainingSetup

SRC_FSDP1_MIXED = (
    "torch fsdp _flat_param.py _validate_tensors_to_flatten (use_orig_params: the unit's FlatParameter "
    "requires grad if any of its parameters does) and _use_unsharded_views (every view a Parameter with "
    "the flat parameter's requires_grad): the gradient of the whole unit, frozen weights included"
)
SRC_FSDP1_NO_SYNC = (
    "torch fsdp fully_sharded_data_parallel.py no_sync ('accumulate the full model gradients (instead of "
    "gradient shards) until the eventual sync'), _runtime_utils.py _post_backward_hook (returns before the "
    "reduce-scatter when not _sync_gradients); accelerate no_sync, Lightning Fabric no_backward_sync"
)
SRC_FSDP2_NO_SYNC = (
    "torch fsdp2 _fully_shard.py set_requires_gradient_sync ('the equivalence of no_sync in FSDP1'), "
    "_fsdp_param_group.py post_backward (returns before the reduce-scatter when not reduce_grads)"
)


def unsharded_grads(
    par: Parallelism, *, adapter: bool, mixed: int, trainable: int, numel: int, grad_dt: DType, no_sync: bool
) -> MemoryItem | None:
    """The unsharded gradients an FSDP rank keeps between micro-batches when the loop skips the sync
    (``no_sync``) without PP, in ``grad_dt`` (what autograd writes), for ``numel`` elements on the rank
    of which ``trainable`` train: FSDP1 full fine-tuning (every unit), adapters inside the layer units
    (FSDP1: the ``mixed`` elements of the whole units, peakmem.formulas.sharding), in units of their own
    (FSDP1) or per parameter (FSDP2). None where FSDP2 full fine-tuning decides it
    (:func:`peakmem.formulas.fsdp2.accumulated`) or the gradients are synced every micro-batch."""
    if not no_sync or par.pp > 1:
        return None
    src = SRC_FSDP1_NO_SYNC if par.fsdp_version == 1 else SRC_FSDP2_NO_SYNC
    if mixed:
        elements, what = mixed, "every unit's unsharded gradient, frozen weights included"
        src = f"{SRC_FSDP1_MIXED}; {SRC_FSDP1_NO_SYNC}"
    elif adapter:
        elements, what = trainable, "the adapters' unsharded gradients"
    elif par.fsdp_version == 1:
        elements, what = numel, "every unit's unsharded gradient"
    else:
        return None
    return MemoryItem(path=f"FSDP{par.fsdp_version} no_sync: {what} ({grad_dt.name})",
                      category=Category.GRADIENTS, bytes=grad_dt.nbytes(elements), source=src,
                      key=f"fsdp{par.fsdp_version}.no_sync_grads")  # fmt: skip


def sync_note(setup: TrainingSetup, kept_whole: bool, *, fsdp2: bool) -> str:
    """The assumption line saying when the loop reduces the gradients and what FSDP keeps between
    micro-batches (``kept_whole``: the unsharded gradients; ``fsdp2``: sharded by FSDP2)."""
    if setup.grad_sync is GradSync.AUTO:
        said = grad_sync(setup, fsdp2=fsdp2).assumption
    else:
        said = f"grad-sync {setup.grad_sync.value} (asked)"
    kept = "the unsharded gradients" if kept_whole else "gradient shards"
    return f"{said}; FSDP keeps {kept} between micro-batches"
