"""What one Llama decoder layer keeps for backward under torchtitan's op-level selective activation
checkpointing, eager and torch.compile'd per block, measured on this CPU.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/sac_compile_activations.py [--quick] [--show]``.

torchtitan (commit 775a486, 2025-06-04, torchtitan/models/llama3/parallelize_llama.py; the same order at
1f029641b in torchtitan/distributed/activation_checkpoint.py) wraps each ``TransformerBlock`` in
``ptd_checkpoint_wrapper(module, context_fn=selective_checkpointing_context_fn, preserve_rng_state=False)``
(non-reentrant ``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts``), then, with
``--training.compile``, ``torch.compile(transformer_block, fullgraph=True)`` per block ("turn on
per-TransformerBlock compile after AC wrapping and before FSDP"); it sets no ``torch._functorch.config``
(no activation memory budget) and no Inductor memory option. Its policy at 775a486 (``_save_list``): save
``aten.mm``, SDPA's flash and memory-efficient outputs, ``reduce_scatter_tensor`` and ``max``, except every
second ``mm`` (``meta[f"{mode}_mm_count"] % 2 == 0``); recompute all else (``PREFER_RECOMPUTE``).

Under torch.compile (torch 2.13 torch/_higher_order_ops/wrap.py ``tag_activation_checkpoint_impl``) the
policy is run while AOTAutograd traces the block and tags each node of the joint graph
(``node.meta["recompute"]``); the partitioner (torch/_functorch/partitioners.py
``min_cut_rematerialization_partition``) then bans MUST_SAVE nodes from recomputation, never saves a
``PREFER_RECOMPUTE`` node (``must_recompute``), and saves of the rest what backward reads. So the compiled
block saves only the MUST_SAVE outputs that its backward (or the recomputation of what backward reads) needs,
and its primals (the block's input): not the cache of every MUST_SAVE output that eager SAC fills.

The layer is the torchtune-style one of benchmarks/compile_activations.py (its RoPE is torchtitan's
``apply_rotary_emb`` in real arithmetic; torchtitan's complex ``view_as_complex`` form is not lowered by
Inductor on this CPU). ``--flash``: CUDA's flash SDPA is stood in by this CPU's flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, added to the save list: it returns the output and an
fp32 logsumexp of the CUDA kernel's sizes); without it the list is torchtitan's as is and nothing of the
attention is kept on this CPU (peakmem.measure.op_sac, ``KernelPolicy.CPU``).

Prints bytes per token per layer kept after the forward (the CPU allocator's net events less the layer's
output; the layer's input, which the caller holds, not counted), eager op SAC and compiled op SAC, next to
``peakmem.formulas.activations.op_saved`` (``TrainingSetup.compiled`` for the compiled rows), and the
difference in bytes (measured less peakmem). ``--show`` lists the saved tensors (saved-tensor hooks: the
compiled graph's saved outputs; eager SAC's cache is not seen by them).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from functools import partial
from typing import Any

import torch

from compile_activations import GRID, Dims, Layer, _live_after, llama_config, saved_shapes

# torchtitan 775a486 parallelize_llama.py ``_save_list``
SAVE_775A486 = (
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "aten.max.default",
)
CPU_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"  # stands in for CUDA's flash
FLOAT8 = "float8-"  # --precision float8-tensorwise / float8-rowwise: torchao Float8Linears over a bf16 layer


def _ops(names: tuple[str, ...]) -> set[Any]:
    out: set[Any] = set()
    for name in names:
        obj: Any = torch.ops
        for part in name.split("."):
            obj = getattr(obj, part)
        out.add(obj)
    return out


def _custom_policy(meta: dict[str, int], save: set[Any], ctx: Any, func: Any, *args: Any, **kw: Any) -> Any:
    """torchtitan 775a486 ``_get_custom_policy(meta)._custom_policy``."""
    from torch.utils.checkpoint import CheckpointPolicy

    mode = "recompute" if ctx.is_recompute else "forward"
    key = f"{mode}_mm_count"
    if func == torch.ops.aten.mm.default:
        meta[key] += 1
    to_save = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE


def wrap(layer: torch.nn.Module, flash: bool) -> torch.nn.Module:
    """torchtitan's op-SAC wrapper around one block."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    save = _ops(SAVE_775A486 + ((CPU_FLASH,) if flash else ()))

    def context_fn() -> Any:
        return create_selective_checkpoint_contexts(partial(_custom_policy, defaultdict(int), save))

    return checkpoint_wrapper(layer, context_fn=context_fn, preserve_rng_state=False)


def build(d: Dims, mode: str, precision: str, flash: bool) -> tuple[Any, torch.Tensor, torch.nn.Module]:
    torch.manual_seed(0)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    layer = Layer(d, "torchtune").to(dtype)
    if precision.startswith(FLOAT8):  # torchao's float8 Linears (as torchtitan's float8 converter) over bf16
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        recipe = precision.removeprefix(FLOAT8)
        convert_to_float8_training(layer, config=Float8LinearConfig.from_recipe_name(recipe))
    fn: Any = wrap(layer, flash)
    if mode == "compiled":
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True)
    x = torch.randn(d.batch, d.seq, d.hidden, dtype=dtype, requires_grad=True)
    return fn, x, layer


def measure(d: Dims, mode: str, precision: str, flash: bool) -> int:
    fn, x, layer = build(d, mode, precision, flash)
    _live_after(fn, x)  # warm-up: compile, first-call caches
    layer.zero_grad(set_to_none=True)
    saved, _ = _live_after(fn, x)
    return saved


def formula(d: Dims, compiled: bool, precision: str, flash: bool) -> int:
    """peakmem's bytes one op-SAC layer keeps, less its input (the caller's tensor)."""
    from peakmem.formulas import activations as act
    from peakmem.hf import spec_from_config
    from peakmem.training import Checkpointing, Framework, KernelPolicy, Precision, TrainingSetup

    spec = spec_from_config(llama_config(d))
    float8 = precision.startswith(FLOAT8)
    setup = TrainingSetup(
        precision=Precision("bf16" if float8 else precision), micro_batch=d.batch, seq_len=d.seq,
        framework=Framework("torchtune"),
        compiled=compiled, kernel_policy=KernelPolicy.CUDA if flash else KernelPolicy.CPU,
        checkpointing=Checkpointing.OP,
    )  # fmt: skip
    layer = spec.groups[0].layer
    sh = act.shapes(spec, setup)
    la = act.layer_activations(spec, layer, sh)
    kept = act.op_saved(spec, layer, sh, la, float8=float8)
    return sum(i.bytes for i in kept) - la.layer_input


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="two shapes, bf16 only")
    ap.add_argument("--show", action="store_true", help="list the saved tensors")
    ap.add_argument("--precision", default="bf16,fp32", help="bf16, fp32, float8-tensorwise, float8-rowwise")
    args = ap.parse_args(argv)
    grid = GRID[:2] if args.quick else GRID
    precisions = ("bf16",) if args.quick else tuple(args.precision.split(","))
    print("bytes per token per layer kept from forward to backward, op SAC (input and output not counted)")
    print(f"{'precision':17} {'flash':5} {'h':>4} {'a/g':>5} {'I':>5} {'b x s':>7} {'mode':8} "
          f"{'measured':>9} {'peakmem':>9} {'error':>7} {'diff B':>7}")  # fmt: skip
    worst = 0.0
    for precision in precisions:
        for flash in (True,) if precision.startswith(FLOAT8) else (False, True):  # float8: CUDA's case only
            for d in grid:
                for mode in ("eager", "compiled"):
                    measured = measure(d, mode, precision, flash)
                    predicted = formula(d, mode == "compiled", precision, flash)
                    t = d.batch * d.seq
                    err = predicted / measured - 1 if measured else float(predicted != 0)
                    worst = max(worst, abs(err))
                    print(f"{precision:17} {flash!s:5} {d.hidden:4} {d.heads:2}/{d.kv_heads:<2} {d.inter:5} "
                          f"{d.batch:2}x{d.seq:<4} {mode:8} {measured / t:9.1f} {predicted / t:9.1f} "
                          f"{err:+7.2%} {measured - predicted:7d}", flush=True)  # fmt: skip
                    if args.show:
                        fn, x, layer = build(d, mode, precision, flash)
                        print("  saved:", saved_shapes(fn, x, layer))
    print(f"worst {worst:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
