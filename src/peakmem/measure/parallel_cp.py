"""Context parallelism (CP) for the parallel execution oracle (:mod:`peakmem.measure.parallel`), on the CPU.

torch's context parallel (torch 2.13, ``torch/distributed/tensor/experimental/_context_parallel/
_attention.py``) is what torchtitan runs (pytorch/torchtitan b5bcd76, ``torchtitan/distributed/utils.py``
``create_context_parallel_ctx``: ``set_rotate_method(rotate_method)`` then ``context_parallel(cp_mesh,
buffers=..., buffer_seq_dims=..., no_restore_buffers=...)``, entered around each micro-batch's forward and
backward in ``train.py``). ``context_parallel`` monkey-patches ``F.scaled_dot_product_attention`` so that
q, k, v become DTensors sharded on the sequence (``Shard(2)``) over the CP mesh, and puts handlers for the
CUDA SDPA ops (``aten._scaled_dot_product_flash_attention`` / ``_efficient_attention`` /
``_cudnn_attention`` and their backwards) into ``DTensor._op_dispatcher._custom_op_handlers``
(``_enable_cp_dtensor_dispatcher``); they run ``_templated_ring_attention(_backward)`` on local tensors.
On the CPU SDPA dispatches to ``aten._scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``),
which has neither a handler nor a sharding rule. :func:`cp_context` adds the two handlers, built as
torch's ``_scaled_dot_product_ring_flash_attention(_backward)`` are: the same ring templates, with the CPU
op as the per-chunk kernel. The CPU op returns what the CUDA flash op's first two outputs are, the output
``[B, H, S, D]`` in the input dtype and the logsumexp ``[B, H, S]`` in fp32 (the CPU kernel keeps it as a
``[B, S, H]`` storage, same bytes); it has no ``cum_seq``/``philox`` outputs, which the ring passes through
untouched (``*rest``), so the bytes the ring allocates are the CUDA path's.

Everything else is torch's: the all-gather (default) or all-to-all K/V rotation (``_AllGatherRotater``
gathers ``cat(k, v)`` of all CP ranks once per attention call; ``_AllToAllRotater`` holds one chunk in
flight), the fp32 ``_SDPAMerger`` of out/lse, the fp32 ``grad_query/grad_key/grad_value`` accumulators and
the all-to-all dK/dV ring of the backward, and the head-tail load balancer (``_HeadTailLoadBalancer``,
chosen when ``seq % (2 cp) == 0``; it needs ``is_causal=True``).

The model's attention is transformers' own SDPA function registered under another name
(:data:`CP_ATTENTION`): transformers builds no mask for an implementation it has no mask function for
(``masking_utils._preprocess_mask_arguments`` exits early), so SDPA runs ``is_causal=True`` with no mask,
as torchtitan's own attention does; with the ``"sdpa"`` name transformers would see the load-balanced
(non-monotonic) position ids as packed sequences and build a mask, which ring attention refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.errors import InputError
from peakmem.parallel import Parallelism
from peakmem.training import TrainingSetup

ROTATE_METHODS = ("allgather", "alltoall")
DEFAULT_ROTATE = "allgather"  # torch's _ContextParallelOptions.rotate_method; torchtitan's default too
CP_ATTENTION = "peakmem_cp_sdpa"
SEQ_DIM = 2  # q/k/v [B, H, S, D]: torch's ring hard-codes seq_dim=2
CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def check_cp(setup: TrainingSetup, par: Parallelism) -> None:
    """The CP layouts the oracle runs: no PP (its stages pass whole sequences), and a sequence that
    torch's default head-tail load balancer splits (``seq % (2 cp) == 0``, else torch runs CP
    unbalanced, which torchtitan does not)."""
    if par.pp > 1:
        raise InputError(f"cp={par.cp} with pp={par.pp}: the oracle's pipeline stages pass whole sequences")
    if par.cp_ring.value not in ROTATE_METHODS:
        raise InputError(
            f"cp_rotate={par.cp_ring.value!r}: the oracle runs torch's context_parallel "
            f"({' or '.join(ROTATE_METHODS)}; 'auto' without FSDP2 means Megatron's p2p ring)"
        )
    if setup.seq_len % (2 * par.cp):
        raise InputError(
            f"seq_len={setup.seq_len}: context parallel's head-tail load balancing needs a multiple of "
            f"2 x cp = {2 * par.cp}"
        )


def use_cp_attention(model: Any) -> None:
    """Register transformers' SDPA attention as :data:`CP_ATTENTION` and make ``model`` use it."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(CP_ATTENTION, sdpa_attention_forward)
    model.config._attn_implementation = CP_ATTENTION


def _local(x: Any) -> Any:
    return x._local_tensor if hasattr(x, "_local_tensor") else x


def _wrap(tensors: tuple[Any, ...], mesh: Any) -> tuple[Any, ...]:
    from torch.distributed.tensor import DTensor, Shard

    return tuple(
        DTensor.from_local(t, mesh, [Shard(SEQ_DIM)], run_check=False) if isinstance(t, torch.Tensor) else t
        for t in tensors
    )


def _mesh_of(args: tuple[Any, ...]) -> Any:
    for a in args:
        if hasattr(a, "device_mesh"):
            return a.device_mesh
    raise RuntimeError("context parallel: SDPA got no DTensor argument")


def _ring_forward(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """torch's ``_scaled_dot_product_ring_flash_attention`` with the CPU flash op as the chunk kernel."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    mesh = _mesh_of(args)
    query, key, value, *rest = (_local(a) for a in args)
    dropout_p = float(rest[0]) if len(rest) > 0 else float(kwargs.get("dropout_p", 0.0))
    is_causal = bool(rest[1]) if len(rest) > 1 else bool(kwargs.get("is_causal", False))
    if kwargs.get("attn_mask") is not None:
        raise NotImplementedError("context parallel: SDPA with an attention mask")
    out = _templated_ring_attention(
        mesh.get_group(), SEQ_DIM, CPU_FLASH,
        query=query, key=key, value=value, is_causal=is_causal, dropout_p=dropout_p,
        scale=kwargs.get("scale"),
    )  # fmt: skip
    return _wrap(tuple(out), mesh)


def _ring_backward(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """torch's ``_scaled_dot_product_ring_flash_attention_backward`` with the CPU flash backward."""
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention_backward,
    )

    mesh = _mesh_of(args)
    grad_out, query, key, value, out, lse, dropout_p, is_causal = (_local(a) for a in args[:8])
    if kwargs.get("attn_mask") is not None:
        raise NotImplementedError("context parallel: SDPA with an attention mask")
    grads = _templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, CPU_FLASH_BACKWARD,
        grad_out=grad_out, grad_out_name="grad_out", query=query, key=key, value=value, out=out,
        logsumexp=lse, is_causal=bool(is_causal), dropout_p=float(dropout_p), scale=kwargs.get("scale"),
    )  # fmt: skip
    return _wrap(tuple(grads), mesh)


CPU_HANDLERS: dict[Any, Any] = {CPU_FLASH: _ring_forward, CPU_FLASH_BACKWARD: _ring_backward}


@contextmanager
def cp_context(
    mesh: Any, buffers: list[torch.Tensor], seq_dims: list[int], rotate: str = DEFAULT_ROTATE
) -> Iterator[None]:
    """torchtitan's ``create_context_parallel_ctx`` (``set_rotate_method`` + ``context_parallel``), with
    the CPU flash ops handled as the CUDA ones are. ``buffers`` are sharded in place for the duration."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._context_parallel import set_rotate_method

    if rotate not in ROTATE_METHODS:
        raise ValueError(f"rotate={rotate!r}: choose one of {', '.join(ROTATE_METHODS)}")
    set_rotate_method(rotate)
    dispatcher = DTensor._op_dispatcher
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=seq_dims):
        # context_parallel installed torch's handlers on entry and restores the original dict on exit
        dispatcher._custom_op_handlers = {**dispatcher._custom_op_handlers, **CPU_HANDLERS}
        yield
    set_rotate_method(DEFAULT_ROTATE)


__all__ = ["CP_ATTENTION", "DEFAULT_ROTATE", "ROTATE_METHODS", "check_cp", "cp_context", "use_cp_attention"]
