"""Context parallelism (CP) for the parallel execution oracle (:mod:`peakmem.measure.parallel`), on the CPU.

torch's ``context_parallel`` (torch 2.13, ``torch/distributed/tensor/experimental/_context_parallel/
_attention.py``) monkey-patches ``F.scaled_dot_product_attention`` so that q, k and v enter it as
DTensors sharded on the sequence (``Shard(2)``), and adds DTensor handlers (``custom_ops``, calling
``_templated_ring_attention`` / ``_templated_ring_attention_backward``) for the CUDA SDPA kernels
(``_scaled_dot_product_flash_attention``, ``_efficient_attention``, ``_cudnn_attention`` and their
backwards). On the CPU, SDPA dispatches to ``_scaled_dot_product_flash_attention_for_cpu`` (and its
``_backward``), which CP does not intercept. :func:`cpu_ring_attention` adds DTensor handlers for those
two ops that run the same templated ring (same rotater, same ``_SDPAMerger``, same fp32 gradient
accumulators) with the CPU kernel as the per-block op, for the run only.

Bytes: the CPU flash kernel returns ``out`` as ``[B, H, S, D]`` (a ``[B, S, H, D]`` buffer, transposed)
and ``logsumexp`` fp32 ``[B, H, S]`` (a ``[B, S, H]`` buffer), the same element counts and dtypes as
CUDA flash's ``out`` and fp32 ``[B, H, S]`` logsumexp; CUDA flash's extra outputs (cum_seq, philox seed
and offset, debug mask) are empty or scalar tensors. So the ring's buffers are those it would hold on a
GPU: the rotater's K/V buffers (all-gather: ``cp`` x the local ``cat(k, v)``, once per call;
all-to-all: one chunk), the merger's fp32 ``out``/``lse``, the backward's fp32 ``grad_query``,
``grad_key``, ``grad_value`` and the all-to-all dK/dV buffers.

CP is applied as torchtitan applies it (pytorch/torchtitan commit b5bcd76c66d0acb1a08b176d9639425bc55e0b2a,
``torchtitan/distributed/utils.py`` ``create_context_parallel_ctx``; ``torchtitan/train.py`` wraps
forward and backward in it): ``set_rotate_method(rotate)`` (job config
``parallelism.context_parallel_rotate_method``, default ``"allgather"``), then
``context_parallel(mesh["cp"], buffers=[inputs, labels], buffer_seq_dims=[1, 1], no_restore_buffers=
{inputs, labels})``, torch's
default head-tail load balancing (on for a causal mask when the sequence divides by ``2 x cp``). FSDP2
shards over ``dp x cp`` (torchtitan's ``dp_shard_cp`` mesh, ``parallel_dims.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

ROTATE_METHODS = ("allgather", "alltoall")
SEQ_DIM = 2  # q, k, v are [B, H, S, D] in SDPA; CP shards dim 2 (torch hard-codes it: "seq_dim = 2")


def _wrap(local: torch.Tensor, mesh: Any) -> Any:
    """A DTensor ``Shard(2)`` over ``mesh`` around a rank's local result (global dim 2 = cp x local)."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    shape = list(local.shape)
    shape[SEQ_DIM] *= mesh.size()
    meta = TensorMeta(torch.Size(shape), torch.empty(shape, device="meta").stride(), local.dtype)
    spec = DTensorSpec(mesh, (Shard(SEQ_DIM),), tensor_meta=meta)
    return DTensor(local, spec, requires_grad=False)  # type: ignore[no-untyped-call]


def _local(x: Any) -> Any:
    return x._local_tensor if hasattr(x, "_local_tensor") else x


def _forward_handler(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p=0., is_causal=False, *,
    attn_mask=None, scale=None)`` on ``Shard(2)`` DTensors: torch's ring forward with the CPU kernel."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    names = ("query", "key", "value", "dropout_p", "is_causal")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    if bound.get("attn_mask") is not None:
        raise NotImplementedError("context parallel on the CPU: an explicit attention mask is not supported")
    query = bound["query"]
    mesh = query.device_mesh
    out, lse = _templated_ring_attention(
        mesh.get_group(), SEQ_DIM, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        query=_local(query), key=_local(bound["key"]), value=_local(bound["value"]),
        is_causal=bool(bound.get("is_causal", False)), dropout_p=float(bound.get("dropout_p", 0.0)),
        scale=bound.get("scale"),
    )  # fmt: skip
    return _wrap(out, mesh), _wrap(lse, mesh)


def _backward_handler(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, logsumexp,
    dropout_p, is_causal, *, attn_mask=None, scale=None)``: torch's ring backward with the CPU kernel."""
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention_backward,
    )

    names = ("grad_out", "query", "key", "value", "out", "logsumexp", "dropout_p", "is_causal")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    if bound.get("attn_mask") is not None:
        raise NotImplementedError("context parallel on the CPU: an explicit attention mask is not supported")
    query = bound["query"]
    mesh = query.device_mesh
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    dq, dk, dv = _templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, kernel,
        grad_out=_local(bound["grad_out"]), grad_out_name="grad_out", query=_local(query),
        key=_local(bound["key"]), value=_local(bound["value"]), out=_local(bound["out"]),
        logsumexp=_local(bound["logsumexp"]), is_causal=bool(bound["is_causal"]),
        dropout_p=float(bound["dropout_p"]), scale=bound.get("scale"),
    )  # fmt: skip
    return _wrap(dq, mesh), _wrap(dk, mesh), _wrap(dv, mesh)


@contextmanager
def cpu_ring_attention() -> Iterator[None]:
    """DTensor handlers for the CPU flash-attention ops that run torch's ring attention, installed for
    the block and removed after it (torch's own ``_enable_cp_dtensor_dispatcher`` replaces the handler
    dict on every ``context_parallel`` entry and restores its import-time copy on exit, so the handlers
    are added to that copy, ``_attention.existing_custom_ops``, which both states start from)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental._context_parallel import _attention

    aten = torch.ops.aten
    added = {
        aten._scaled_dot_product_flash_attention_for_cpu.default: _forward_handler,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _backward_handler,
    }
    base = _attention.existing_custom_ops
    saved_current = DTensor._op_dispatcher._custom_op_handlers
    base.update(added)
    try:
        yield
    finally:
        for op in added:
            base.pop(op, None)
            DTensor._op_dispatcher._custom_op_handlers.pop(op, None)
        DTensor._op_dispatcher._custom_op_handlers = saved_current


@contextmanager
def context_parallel_step(
    mesh: Any, buffers: list[torch.Tensor], rotate: str, no_restore: set[torch.Tensor] | None = None
) -> Iterator[None]:
    """torchtitan's ``create_context_parallel_ctx``: the rotate method, then torch's
    ``context_parallel`` over ``mesh`` sharding ``buffers`` (inputs, labels, positions) on dim 1."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    if rotate not in ROTATE_METHODS:
        raise ValueError(f"rotate={rotate!r}: choose one of {', '.join(ROTATE_METHODS)}")
    set_rotate_method(rotate)
    with context_parallel(
        mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers), no_restore_buffers=no_restore
    ):
        yield


def cp_plain_step(
    model: Any, setup: Any, tracker: Any, lp: Callable[[], Any], cp_mesh: Any, rotate: str
) -> Callable[[torch.Tensor, int], None]:
    """:func:`peakmem.measure.parallel._plain_step` under CP, as torchtitan's ``train.py`` runs it: per
    micro-batch, forward and backward inside ``context_parallel`` with the inputs, labels and positions
    as its buffers (``cp_no_restore_buffers={inputs, labels}``), so every rank runs its ``seq / cp``
    tokens. torchtitan also shards its RoPE table (``freqs_cis``, seq dim 0); the HF model derives its
    rotary embedding from its positions instead, computed per call for the local tokens."""
    from peakmem.breakdown import Phase
    from peakmem.measure.tracker import INPUT

    def run(ids: torch.Tensor, step: int) -> None:
        for chunk in torch.split(ids, setup.micro_batch):
            tracker.set_phase(Phase.FORWARD, step)
            inputs, labels = chunk.clone(), chunk.clone()
            for t in (inputs, labels):
                tracker.tag(t, INPUT)
            buffers = [inputs, labels]
            with context_parallel_step(cp_mesh, buffers, rotate, no_restore={inputs, labels}), lp():
                # no position_ids: the load-balanced shard's positions are not contiguous, from which
                # transformers infers packed sequences and builds a mask (CP's ring takes none); the
                # model's own positions, arange(seq / cp), have the same bytes (RoPE values differ,
                # which no byte depends on)
                loss = model(input_ids=inputs, labels=labels).loss
                if setup.grad_accum > 1:
                    loss = loss / setup.grad_accum
                tracker.set_phase(Phase.BACKWARD, step)
                loss.backward()
                del loss
            del inputs, labels, buffers

    return run


__all__ = ["ROTATE_METHODS", "context_parallel_step", "cp_plain_step", "cpu_ring_attention"]
