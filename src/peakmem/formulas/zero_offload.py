"""DeepSpeed ZeRO-1/2 with the optimizer offloaded (ZeRO-Offload, ``stage_1_and_2.py`` ``cpu_offload``): what
stays on the GPU beyond the 16-bit weights and the ipg bucket (used by :mod:`.sharding`); and, without the
offload, the fp16 step's overflow check over the same ``_has_inf_or_nan`` (:func:`step_check`).

Read in DeepSpeed v0.14.2 ``runtime/zero/stage_1_and_2.py`` (the same code in v0.16.4):

* ``__init__``: ``self.temp_grad_buffer_for_gpu_offload = torch.zeros(largest_param_numel, device=cuda,
  dtype=self.dtype)``, a 16-bit buffer the size of the largest trainable parameter, kept for the run
  (``OffloadItems.buffer``).
* ``copy_grads_in_partition`` (a parameter of this rank's partition, when its bucket is reduced; a
  parameter larger than the bucket is reduced alone at its own hook), at the accumulation boundary:
  ``set_norm_for_param_grad_in_gpu`` takes the norm of the partition's slice in fp64
  (``.double().norm(2)``: 8 bytes an element), then ``update_overflow_tracker_for_param_grad`` runs
  ``_has_inf_or_nan`` over the whole gradient (``x.float()``, ``isnan``, ``isinf``, ``logical_or``,
  ``.float()``: 4 + 1 + 1 + 1 + 4 bytes an element alive at once), then the slice is copied to the
  CPU through an fp32 copy (4). The overflow check is the largest of the three (``OffloadItems.check``);
  unconditional, bf16 as fp16. Its worst rank holds the largest parameter (the LM head or the embedding of
  a large vocabulary), at that parameter's gradient hook: the head's is the first of backward.
* ``step``: after the CPU optimizer, ``bit16_partitions[partition_id].data.copy_(fp32_partition.to(device))``:
  the fp32 partition copied to the GPU whole before its 16-bit cast (``OffloadItems.step_copy``).
* ``step`` without the offload, fp16 only (``if self.dtype == torch.float16: self.check_overflow()``, before
  the gradient is flattened and cast to fp32): ``has_overflow_partitioned_grads_serial`` runs
  ``_has_inf_or_nan`` over each gradient view of the rank's partition (``averaged_gradients``: one view per
  parameter, cut at the partition's edges), one at a time: 11 bytes an element of the largest view
  (:func:`step_check`). Read in v0.13.3 (where ``_has_inf_or_nan`` took this form), v0.14.2 and v0.16.4;
  v0.11.2-v0.13.2 ran ``x.float().sum()`` (4 bytes an element), and before v0.11.2 the check ran in bf16
  too.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.breakdown import Category, MemoryItem

# _has_inf_or_nan(x): float_x = x.float() (4 B), isnan (1), isinf (1), logical_or (1), .float() (4)
OVERFLOW_CHECK_BYTES_PER_ELEMENT = 4 + 1 + 1 + 1 + 4

SRC_BUFFER = (
    "deepspeed stage_1_and_2.py __init__ (cpu_offload): temp_grad_buffer_for_gpu_offload = "
    "torch.zeros(largest_param_numel, dtype=self.dtype) on the GPU"
)
SRC_STEP = "deepspeed stage_1_and_2.py step (cpu_offload): bit16_partition.copy_(fp32_partition.to(device))"
SRC_CHECK = (
    "deepspeed stage_1_and_2.py copy_grads_in_partition (cpu_offload): set_norm_for_param_grad_in_gpu "
    "(.double().norm), update_overflow_tracker_for_param_grad (_has_inf_or_nan: x.float(), isnan, isinf, "
    "logical_or, .float()), async_inplace_copy_grad_to_fp32_buffer_from_gpu (.float())"
)
SRC_STEP_CHECK = (
    "deepspeed stage_1_and_2.py step (fp16, no offload): check_overflow -> "
    "has_overflow_partitioned_grads_serial: _has_inf_or_nan (x.float(), isnan, isinf, logical_or, .float()) "
    "over each gradient view of the partition, before the flattened fp32 gradient exists (v0.13.3-v0.16.4)"
)


@dataclass(frozen=True, kw_only=True)
class OffloadItems:
    buffer: MemoryItem  # resident
    check: MemoryItem  # at a gradient's hook in backward
    step_copy: MemoryItem  # at the step


def items(grad_bytes: int, master_bytes: int, largest: int, partition: int, label: str) -> OffloadItems:
    """The three for a rank whose largest trainable parameter has ``largest`` elements and whose
    partition ``partition`` (``grad_bytes`` / ``master_bytes``: bytes an element of the 16-bit gradient
    and of the fp32 master). The check holds more than the slice's fp64 norm (8 bytes an element at
    most) and its fp32 copy (4)."""
    return OffloadItems(
        buffer=MemoryItem(path="ZeRO-Offload GPU gradient buffer (the largest parameter)",
                          category=Category.GRADIENTS, bytes=grad_bytes * largest,
                          source=SRC_BUFFER, key="zero.offload_buffer"),
        check=MemoryItem(path="ZeRO-Offload overflow check of the largest gradient at its hook",
                         category=Category.TEMPORARIES, bytes=OVERFLOW_CHECK_BYTES_PER_ELEMENT * largest,
                         source=SRC_CHECK, key="zero.offload_check"),
        step_copy=MemoryItem(path=f"ZeRO-Offload fp32 partition copied to the GPU at the step{label}",
                             category=Category.TEMPORARIES, bytes=master_bytes * partition,
                             source=SRC_STEP, key="zero.offload_step"),
    )  # fmt: skip


def step_check(largest_view: int, label: str) -> MemoryItem:
    """The fp16 step's overflow check without the offload: ``_has_inf_or_nan`` over the largest gradient
    view of the rank's partition (``largest_view`` elements: the largest trainable parameter, at most the
    partition), alive before the step's flattened and fp32 gradients are."""
    return MemoryItem(path=f"ZeRO fp16 step: overflow check of the largest gradient view{label}",
                      category=Category.TEMPORARIES, bytes=OVERFLOW_CHECK_BYTES_PER_ELEMENT * largest_view,
                      source=SRC_STEP_CHECK, key="zero.step_check")  # fmt: skip
