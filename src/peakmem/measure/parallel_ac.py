"""Full activation checkpointing in the parallel oracle, and the activation-dominated regime of the
published 70B runs.

Full AC is applied as torchtitan applies it (pytorch/torchtitan commit
b5bcd76c66d0acb1a08b176d9639425bc55e0b2a, ``torchtitan/distributed/activation_checkpoint.py``
``FullAC._wrap_block``): every transformer block replaced by
``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper(block,
preserve_rng_state=..., early_stop=False)`` (non-reentrant ``torch.utils.checkpoint``), after tensor
parallelism and before FSDP2 (``models/llama3/parallelize.py``: ``apply_tp``, then ``apply_ac``, then
``apply_fsdp``), so ``fully_shard`` wraps the checkpoint wrapper and the wrapper's recomputation runs
the block's own TP/SP hooks (SP's all-gathers of the norm outputs) again in backward. The RNG state a
block stashes lives in host memory on a GPU and is not counted (as in :mod:`peakmem.measure.runner`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from torch import nn

from peakmem.measure.tracker import LiveStorageTracker
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import Checkpointing

# The checkpointing modes the parallel oracle runs (the others are refused by its _check).
ORACLE_CHECKPOINTING = (Checkpointing.NONE, Checkpointing.FULL)


def check_checkpointing(mode: Checkpointing, every: int) -> str | None:
    """Why the oracle cannot run ``mode`` (every ``every`` layers), or None when it can."""
    if mode not in ORACLE_CHECKPOINTING:
        return (
            f"checkpointing={mode.value!r}: the parallel oracle runs "
            + " or ".join(m.value for m in ORACLE_CHECKPOINTING)
            + " (torchtitan's FullAC)"
        )
    if mode is Checkpointing.FULL and every != 1:
        return f"checkpoint_every={every}: the parallel oracle checkpoints every block (torchtitan's FullAC)"
    return None


def apply_full_ac(model: nn.Module, tracker: LiveStorageTracker) -> None:
    """Replace each decoder layer of ``model`` (an HF ``*ForCausalLM``, possibly a pipeline stage's cut)
    by torchtitan's ``ptd_checkpoint_wrapper(block, preserve_rng_state=False, early_stop=False)``.
    ``context_fn`` tags what the recomputation saves as activations (its second half is
    ``tracker.recompute``, as :mod:`peakmem.measure.runner` does); it adds no memory."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers: Any = model.model.layers  # type: ignore[union-attr]
    for i, block in enumerate(list(layers)):
        layers[i] = checkpoint_wrapper(
            block,
            # torchtitan's default is True; its stash (a CPU generator state, 5056 B) is host memory on a
            # GPU but would be counted on this CPU run
            preserve_rng_state=False,
            early_stop=False,
            context_fn=lambda: (nullcontext(), tracker.recompute()),
        )


# The regime of Llama-3.1-70B at TP8 in ratios, not sizes (Llama-3.1-70B config.json: hidden 8192,
# 64 heads, 8 KV heads, intermediate 28672, vocab 128256): 16 heads and 8 KV heads (one KV head per TP8
# rank), ffn/hidden 3.5 (896/256), vocab/hidden 16 (4096/256, Llama's 15.66), 2 layers; with a
# micro-batch of 4 x 512 tokens the layer activations outweigh the parameters, as at 16 x 8192.
REGIME_70B: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 4096, "hidden_size": 256,
    "intermediate_size": 896, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8,
    "max_position_embeddings": 1024, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
REGIME_70B_MICRO_BATCH = 4
REGIME_70B_SEQ = 512
# The published run's inner layout, shrunk: TP8 with torchtitan's SP (and loss_parallel), alone and under
# FSDP2 over 2 data-parallel ranks (16 fake ranks; every rank of a stage holds the same shard sizes).
REGIME_70B_GRID: tuple[Parallelism, ...] = (
    Parallelism(gpus=8, tp=8, sequence_parallel=True),
    Parallelism(gpus=16, tp=8, sequence_parallel=True, fsdp=FsdpMode.FULL_SHARD),
)

__all__ = [
    "ORACLE_CHECKPOINTING",
    "REGIME_70B",
    "REGIME_70B_GRID",
    "REGIME_70B_MICRO_BATCH",
    "REGIME_70B_SEQ",
    "apply_full_ac",
    "check_checkpointing",
]
