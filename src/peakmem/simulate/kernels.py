# mypy: disable-error-code="no-untyped-call,no-any-return,unused-ignore"
"""Make a fake-tensor step on the CPU allocate what the CUDA kernels allocate.

The simulator runs on fake CPU tensors (a fake CUDA training step does not work without a GPU),
so PyTorch picks the CPU's kernels. Where the CPU and CUDA kernels allocate differently, the
``cuda`` policy changes the call; the ``cpu`` policy changes nothing (parity with
``peakmem measure --device cpu``). What the ``cuda`` policy changes, precisely:

1. **SDPA** (``F.scaled_dot_product_attention``). The CPU runs
   ``_scaled_dot_product_flash_attention_for_cpu`` or the math composite; CUDA's dispatcher
   (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, ``select_sdp_backend``: priority
   flash > memory-efficient > math) picks as below. On sm90/sm100 (H100, H200, B200) with cuDNN
   >= 9.9, torch puts cuDNN attention first unless ``TORCH_CUDNN_SDPA_PREFERRED=0``
   (``check_prefer_cudnn_attention``); where it applies it saves the same output, fp32 log-sum-exp
   and RNG state as flash, so the forward bytes are the same; its backward workspace is not
   modelled (flash's is):

   * **flash** (FlashAttention-2) when q/k/v are fp16/bf16, there is no ``attn_mask``, the head dim
     is at most 256 and equal for q/k/v (grouped-query attention native): we call
     ``aten._scaled_dot_product_flash_attention``, whose autograd saves q, k, v, the output and the
     fp32 log-sum-exp ``[B, H, S]`` (plus the philox RNG state when dropout is on: no mask is
     stored, dropout is regenerated in backward). Its backward
     (``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`` ``mha_bwd``) also
     allocates, for the duration of the kernel: ``softmax_d`` fp32 ``[B, H, round128(S)]``,
     ``dq_accum`` fp32 ``[B, round128(S), H, round32(D)]``, and for GQA/MQA ``dk_expanded`` and
     ``dv_expanded`` ``[B, S_k, H, D]`` in the input dtype (summed into dk/dv at the end);
   * **memory-efficient** (xformers' CUTLASS kernel) for fp32, or with an ``attn_mask``, when the
     heads of q and k/v are equal: ``aten._scaled_dot_product_efficient_attention`` saves q, k, v,
     the mask, the output and the fp32 log-sum-exp ``[B, H, round32(S)]`` (+ philox state). Its
     backward (``mem_eff_attention/kernel_backward.h``) allocates ``delta`` fp32 ``[B, H, S]`` and,
     for 16-bit inputs, an fp32 gradient-of-q accumulator ``[B, H, S, D]`` (``kNeedsAccumGradQ``);
   * **math** otherwise (e.g. fp32 with grouped-query ``enable_gqa``, head dim > 256 with a mask,
     Falcon-7B's one k/v head without ``enable_gqa``): the math composite (attention.cpp
     ``_scaled_dot_product_attention_math``: 16-bit q, k, v upcast to fp32, k/v repeated or broadcast,
     fp32 scores and softmax saved, a bool mask made additive and added in place); its dropout draws
     a bool mask (``native_dropout``), as on CUDA.

   The choice is the formulas' rule (``peakmem.formulas.activations.cuda_sdpa_backend``), applied
   here to the call's tensors.

2. **Dropout** (``F.dropout`` in training, 0 < p < 1). ``aten::dropout`` takes the fused
   ``native_dropout`` only for CUDA tensors (``is_fused_kernel_acceptable`` in
   ``aten/src/ATen/native/Dropout.cpp``): it saves a **bool** mask (1 byte/element). On the CPU it
   multiplies by a noise tensor in the input dtype, saved for backward (2 or 4 bytes/element). We
   call ``native_dropout``.

3. **Autocast** (``amp-*`` precisions; ``aten/src/ATen/autocast_mode.cpp``). CPU autocast runs
   softmax, log_softmax, layer_norm, group_norm and the pointwise fp32 list in the input's 16-bit
   dtype; CUDA autocast runs them in fp32: softmax/log_softmax (and sum/cumsum/prod) with
   ``dtype=float32`` (``fp32_set_opt_dtype``: fp32 output, no input copy), layer_norm/group_norm
   and exp, log, pow, rsqrt, reciprocal, ... on fp32 copies of their 16-bit inputs (``fp32``). The
   lower-precision lists (linear, matmul, bmm, addmm, baddbmm, conv, SDPA) agree on both devices
   and are left to CPU autocast, which caches weight casts as CUDA autocast does.

4. **Optimizers**: torch.optim's ``foreach`` implementations are Python over ``torch._foreach_*``
   ops whose outputs (e.g. AdamW's ``_foreach_sqrt`` of every ``exp_avg_sq``) are allocated the
   same way on both devices; ``fused`` steps in place on both. Nothing changes, except that the
   scalar ``step`` tensors of non-fused, non-capturable optimizers live in host memory on CUDA
   (``torch/optim/adam.py``: ``torch.tensor(0.0, dtype=_get_scalar_dtype())``), so the ``cuda``
   policy leaves them out of device memory.

Not modelled (documented in the estimate's assumptions): cuDNN attention's backward workspace,
flash's head-dim padding to a multiple of 8, cuBLAS/cuBLASLt workspaces (added as overhead), NCCL
buffers.
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from peakmem.formulas.activations import FLASH_BWD_SEQ_ROUND, flash_bwd_head_rounded
from peakmem.formulas.activations import cuda_sdpa_backend as rule_sdpa_backend
from peakmem.training import KernelPolicy

aten = torch.ops.aten
# a fake tensor's ``.device`` is itself an op (prim.device) that goes down every mode on the stack: 7,000 of
# the 11,061 ops of a fake step of Qwen3-Next's six measured blocks at 2 x 32. The modes here pass it
# straight on (that step 10% faster: 2.56 -> 2.30 s; the tracker's mode doing the same gained nothing)
DEVICE_QUERY = torch.ops.prim.device.default
HALF = (torch.float16, torch.bfloat16)

# CUDA autocast's fp32 list (autocast_mode.cpp, KERNEL_CUDA(..., fp32)) that CPU autocast lacks,
# as torch function names (torch.* and Tensor.* methods share names).
CUDA_FP32_POINTWISE = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "logsumexp",
})  # fmt: skip
CUDA_FP32_NORMS = frozenset({"layer_norm", "group_norm"})
CUDA_FP32_OPT_DTYPE = frozenset({"softmax", "log_softmax", "_softmax", "cumsum", "cumprod", "prod", "sum"})


def _round(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def cuda_sdpa_backend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any, enable_gqa: bool
) -> str:
    """Which SDPA kernel CUDA would run (sm80+, torch 2.13 default priority): flash, efficient or math.
    The rule is the formulas' (formulas/activations/ ``cuda_sdpa_backend``), applied to these tensors."""
    if q.dim() != 4 or k.dim() != 4 or q.dtype not in (*HALF, torch.float32) or q.shape[-1] != k.shape[-1]:
        return "math"
    return rule_sdpa_backend(
        half=q.dtype in HALF, q_heads=q.shape[1], kv_heads=k.shape[1], enable_gqa=enable_gqa,
        mask=attn_mask is not None, qk_head_dim=q.shape[-1], v_head_dim=v.shape[-1],
    )  # fmt: skip


class KernelLog:
    """Which kernel each intercepted call ran, for ``Estimate.assumptions``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def note(self, what: str) -> None:
        self.counts[what] += 1

    def lines(self) -> list[str]:
        return [f"{what} x{n}" for what, n in sorted(self.counts.items())]


class CudaFunctionMode(TorchFunctionMode):
    """The ``cuda`` policy at the torch-function level: SDPA backend, dropout, autocast lists."""

    def __init__(self, log: KernelLog, *, pad_rows: bool = True) -> None:
        super().__init__()
        self.log = log
        self.pad_rows = pad_rows  # False: flash's scratch at S rows, not round128(S) (derive/step.py's fit)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self._sdpa(*args, **kwargs)
        if func is F.dropout:
            return self._dropout(*args, **kwargs)
        if torch.is_autocast_enabled("cpu"):
            name = getattr(func, "__name__", "")
            if name in CUDA_FP32_OPT_DTYPE:
                return self._opt_dtype(func, name, args, kwargs)
            if (name in CUDA_FP32_NORMS or name in CUDA_FP32_POINTWISE) and _has_half((args, kwargs)):
                self.log.note(f"autocast fp32 (CUDA list): {name}")
                args, kwargs = _upcast((args, kwargs))
        return func(*args, **kwargs)

    # --- SDPA ---------------------------------------------------------------------------------
    def _sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):  # SDPA is on both devices' lower-precision lists
            dt = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(dt) if t.dtype == torch.float32 else t for t in (query, key, value))
        backend = cuda_sdpa_backend(query, key, value, attn_mask, enable_gqa)
        self.log.note(f"sdpa: {backend}" + (" with dropout" if dropout_p > 0 else ""))
        with torch.autocast("cpu", enabled=False):
            if backend == "flash":
                return aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale)[0]  # fmt: skip
            if backend == "efficient":
                bias = attn_mask
                if bias is not None and bias.dtype == torch.bool:  # sdpa converts a bool mask to a bias
                    bias = torch.zeros_like(bias, dtype=query.dtype).masked_fill_(~bias, float("-inf"))
                if bias is not None and bias.dim() == 4 and bias.shape[1] != query.shape[1]:
                    bias = bias.expand(-1, query.shape[1], -1, -1)
                return aten._scaled_dot_product_efficient_attention(
                    query, key, value, bias, True, dropout_p, is_causal, scale=scale)[0]  # fmt: skip
            return _math_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    # --- dropout ------------------------------------------------------------------------------
    def _dropout(
        self, input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
    ) -> torch.Tensor:
        if not training or p == 0.0 or p == 1.0 or input.numel() == 0:
            return F.dropout(input, p, training, inplace)
        self.log.note("dropout: native_dropout (bool mask)")
        out = torch.native_dropout(input, p, True)[0]
        if inplace:
            return input.copy_(out)
        return out

    # --- autocast -----------------------------------------------------------------------------
    def _opt_dtype(self, func: Any, name: str, args: Any, kwargs: Any) -> Any:
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dtype in HALF and kwargs.get("dtype") is None:
            positional_dtype = name in ("softmax", "log_softmax", "_softmax") and len(args) > 2
            if not positional_dtype:
                self.log.note(f"autocast fp32 output (CUDA list): {name}")
                kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)


def _has_half(tree: Any) -> bool:
    from torch.utils._pytree import tree_leaves

    return any(isinstance(x, torch.Tensor) and x.dtype in HALF for x in tree_leaves(tree))


def _upcast(tree: Any) -> Any:
    from torch.utils._pytree import tree_map

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in HALF:
            return x.float()
        return x

    return tree_map(up, tree)


def _math_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Any,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """``_scaled_dot_product_attention_math`` as CUDA runs it (aten/src/ATen/native/transformers/
    attention.cpp, the same composite on every device), dropout through ``native_dropout``:
    ``scaled_dot_product_attention`` first turns a bool mask into an additive one in q's dtype
    (``convert_boolean_attn_mask``); the kernel keeps 16-bit q, k, v in fp32 (``query_acc = query_.to(
    at::kFloat)``, unless ``allowFP16BF16ReductionMathSDP``), scales q and k by sqrt(scale) each, adds
    the mask in place (``attn.add_``), saves the fp32 softmax and casts the output back."""
    origin = q.dtype
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=origin).masked_fill_(~attn_mask, float("-inf"))
    if origin in HALF and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():
        q, k, v = q.float(), k.float(), v.float()
    s = scale if scale is not None else q.shape[-1] ** -0.5
    sq = s**0.5  # the math kernel scales q and k by sqrt(scale) each, for stability
    q = q * sq
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        attn_mask = torch.zeros(keep.shape, dtype=q.dtype).masked_fill_(~keep, float("-inf"))
    if enable_gqa and q.shape[1] != k.shape[1]:  # pre_process_group_query_attention_input
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    attn = q @ (k.transpose(-2, -1) * sq)
    if attn_mask is not None:
        attn.add_(attn_mask)
    attn = torch.softmax(attn, dim=-1)
    if dropout_p > 0.0:
        attn = torch.native_dropout(attn, dropout_p, True)[0]
    return (attn @ v).to(origin)


class CudaDispatchMode(TorchDispatchMode):
    """The ``cuda`` policy at the dispatch level: the scratch tensors CUDA attention backward
    kernels allocate for their own duration (see the module docstring), as fake tensors the
    tracker records as temporaries."""

    def __init__(self, log: KernelLog, *, pad_rows: bool = True) -> None:
        super().__init__()
        self.log = log
        self.pad_rows = pad_rows  # False: flash's scratch at S rows, not round128(S) (derive/step.py's fit)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is DEVICE_QUERY:
            return func(*args)
        kwargs = kwargs or {}
        scratch: list[torch.Tensor] = []
        if func is aten._scaled_dot_product_flash_attention_backward.default:
            scratch = _flash_bwd_scratch(args[1], args[2], pad_rows=self.pad_rows)
        elif func is aten._scaled_dot_product_efficient_attention_backward.default:
            scratch = _efficient_bwd_scratch(args[1])
        out = func(*args, **kwargs)
        del scratch
        return out


def _flash_bwd_scratch(q: torch.Tensor, k: torch.Tensor, *, pad_rows: bool = True) -> list[torch.Tensor]:
    b, h, s, d = q.shape
    s_k, h_k = k.shape[2], k.shape[1]
    d_round = flash_bwd_head_rounded(d)
    rows = _round(s, FLASH_BWD_SEQ_ROUND) if pad_rows else s
    out = [
        torch.empty((b, h, rows), dtype=torch.float32),  # softmax_d
        torch.empty((b, rows, h, d_round), dtype=torch.float32),  # dq_accum
    ]
    if h_k != h:
        out += [torch.empty((b, s_k, h, d), dtype=q.dtype) for _ in range(2)]  # dk/dv_expanded
    return out


def _efficient_bwd_scratch(q: torch.Tensor) -> list[torch.Tensor]:
    b, h, s, d = q.shape
    out = [torch.empty((b, h, s), dtype=torch.float32)]  # delta
    if q.dtype in HALF:
        out.append(torch.empty((b, h, s, d), dtype=torch.float32))  # grad_q accumulator
    return out


def function_mode(policy: KernelPolicy, log: KernelLog) -> TorchFunctionMode | None:
    return CudaFunctionMode(log) if policy == KernelPolicy.CUDA else None


def dispatch_mode(policy: KernelPolicy, log: KernelLog, *, pad_rows: bool = True) -> TorchDispatchMode | None:
    return CudaDispatchMode(log, pad_rows=pad_rows) if policy == KernelPolicy.CUDA else None


def describe(policy: KernelPolicy, log: KernelLog) -> str:
    if policy == KernelPolicy.CPU:
        return "kernels: the CPU's own (kernels='cpu'), as `peakmem measure --device cpu` runs them"
    used = "; ".join(log.lines()) or "no kernel-specific call"
    return (
        "kernels: CUDA-faithful (kernels='cuda', sm80+, torch 2.13 SDPA priority flash > "
        "memory-efficient > math; where sm90 prefers cuDNN attention it saves what flash saves); "
        f"calls over the simulated steps: {used} "
        "(peakmem.simulate.kernels documents each change)"
    )


class ScalarValueMode(TorchDispatchMode):
    """Fake tensors have no values, so ``.item()`` (``aten._local_scalar_dense``) cannot answer; the
    step's few data-dependent scalars decide no allocation sizes, so they read as fixed values under
    both policies: the overflow flag that ``_amp_foreach_non_finite_check_and_unscale_`` writes
    (``GradScaler``'s ``found_inf``) is 0 (no overflow, so the optimizer steps); any other number
    (a step count, ``torch.optim.Adafactor``'s ``step_t.item()``) is 1; a bool is ``True``."""

    def __init__(self) -> None:
        super().__init__()
        # the overflow flags, by identity and held weakly: an address (the storage's, or id()) is
        # reused once the flag is freed, and Adam's step count read as 0 would divide by zero
        self._zero: dict[int, weakref.ref[torch.Tensor]] = {}

    def _is_flag(self, t: torch.Tensor) -> bool:
        ref = self._zero.get(id(t))
        return ref is not None and ref() is t

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is DEVICE_QUERY:
            return func(*args)
        if func is aten._local_scalar_dense.default:
            t = args[0]
            if t.dtype == torch.bool:
                return True
            value = 0 if self._is_flag(t) else 1
            return float(value) if t.dtype.is_floating_point else value
        if func is aten._amp_foreach_non_finite_check_and_unscale_.default:
            self._zero[id(args[1])] = weakref.ref(args[1])
        return func(*args, **(kwargs or {}))
