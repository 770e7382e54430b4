"""Op-level selective activation checkpointing on a real model (``--checkpointing op``), as torchtitan
runs it: each decoder layer under non-reentrant ``torch.utils.checkpoint`` with
``context_fn=create_selective_checkpoint_contexts(policy)``.

The policy is torchtitan's (commit 1f029641b5caeb4df18ac094263e8bcc674b3686,
torchtitan/models/llama3/parallelize.py ``_op_sac_save_list`` and
torchtitan/distributed/activation_checkpoint.py ``_apply_op_sac``, ``selective_ac_option = "op"``):
save the outputs of the ops in the save list (matmuls, SDPA's flash / memory-efficient / cuDNN
kernels, ``reduce_scatter_tensor``, ``max``), except every second matmul (``mm_count % 2 == 0``; one
counter per layer and pass: ``meta = defaultdict(int)`` per context); recompute all else
(``CheckpointPolicy.PREFER_RECOMPUTE``). torchtitan's per-shape forced recomputation
(``per_op_sac_force_recompute_mm_shapes_by_fqns``) is empty here, and its ``_to_copy`` rule (keep
CUDA-to-CPU copies) saves nothing a decoder layer makes. The estimate's side is
peakmem.formulas.activations.op_sac.

With torchao float8 Linears (``--precision float8-*``) the policy is called with ``aten.mm.default`` on
``Float8TrainingTensor`` operands, never with ``aten._scaled_mm`` (the subclass runs it inside the mode's
call): they are counted and kept as 16-bit Linears are (op_sac.py module doc, measured on this CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

# torchtitan 1f029641b ``_op_sac_save_list`` by name (resolved with getattr: an op this torch does not
# register is skipped, as torchtitan's ``torch.ops.torch_attn`` entry needs its own extension)
SAVE_LIST = (
    "aten.mm.default",
    "aten.linear.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "aten.max.default",
    "torch_attn._varlen_attn.default",
)
MM_OPS = ("aten.mm.default", "aten.linear.default")  # the ops the every-other counter counts


def _resolve(names: tuple[str, ...]) -> set[Any]:
    import torch

    ops: set[Any] = set()
    for name in names:
        obj: Any = torch.ops
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
        except (AttributeError, RuntimeError):
            continue
        ops.add(obj)
    return ops


def op_policy() -> Callable[..., Any]:
    """A fresh policy (its own matmul counters): torchtitan's ``_custom_policy``."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    save, mm = _resolve(SAVE_LIST), _resolve(MM_OPS)
    save.add(torch._higher_order_ops.flex_attention)
    meta = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in mm:
            meta[mode] += 1
        if func in save and not (func in mm and meta[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_context_fn(
    recompute: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Callable[[], tuple[Any, Any]]:
    """``context_fn`` for ``torch.utils.checkpoint``: the selective-checkpoint contexts of a fresh
    :func:`op_policy` per call, with ``recompute()`` (a tracker's recomputation marker) entered around
    the recomputation too."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    def make() -> tuple[Any, Any]:
        forward, again = create_selective_checkpoint_contexts(op_policy())  # type: ignore[no-untyped-call]
        if recompute is None:
            return forward, again
        return forward, _both(again, recompute)

    return make


@contextmanager
def _both(
    first: AbstractContextManager[Any], make: Callable[[], AbstractContextManager[Any]]
) -> Iterator[None]:
    with ExitStack() as stack:
        stack.enter_context(first)
        stack.enter_context(make())
        yield
