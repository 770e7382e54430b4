"""vLLM multi-LoRA serving: the LoRA slots it preallocates on the GPU.

With ``enable_lora`` vLLM wraps every linear layer of the decoder that the model supports for LoRA
(``LoRAModelManager._create_lora_modules``, vllm/lora/models.py, vLLM 0.11: every module that
``_match_target_modules`` finds among the model's supported LoRA modules, whatever an adapter
targets) and each wrapper allocates, once at load, zero-filled stacks for ``max_loras`` adapters of
``max_lora_rank`` in the LoRA dtype (``lora_dtype="auto"``: the model's dtype,
vllm/config/lora.py ``verify_with_model_config``). vllm/lora/layers/base_linear.py
``create_lora_weights`` (vLLM 0.11), per slice of a wrapped layer:

* ``lora_a_stacked``: ``[max_loras, 1, max_lora_rank, input_size]``;
* ``lora_b_stacked``: ``[max_loras, 1, output_size, max_lora_rank]``.

A merged layer (``qkv_proj``, ``gate_up_proj``: vllm/lora/layers/column_parallel_linear.py
``MergedColumnParallelLinearWithLoRA`` / ``MergedQKVParallelLinearWithLoRA``) has one A and one B
stack per slice (q, k, v; gate, up), so it holds what the separate q/k/v (gate/up) Linears would:
the slots are summed per transformers Linear. Under tensor parallelism a column-parallel layer keeps
its full input and its output per rank (``output_size_per_partition``), a row-parallel one
(``o_proj``, ``down_proj``: vllm/lora/layers/row_parallel_linear.py) its input per rank
(``input_size_per_partition``) and its full output (``fully_sharded_loras=False``, the default).

vLLM V1 counts these stacks in the memory profile: they exist after ``load_model``, so
``determine_available_memory`` (vllm/v1/worker/gpu_worker.py) sees them with the weights and the KV
pool shrinks by exactly their bytes (vllm-project/vllm issue #14450, fixed for V0 by PR #14469;
"V1 of LoRA should not have this issue").

Defaults and limits (vllm/config/lora.py ``LoRAConfig``, vLLM 0.11): ``max_loras=1``,
``max_lora_rank=16``, ``MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]``
(:data:`peakmem.inference.VLLM_DEFAULT_MAX_LORA_RANK`, ``VLLM_MAX_LORA_RANKS``, checked there);
``max_cpu_loras`` (the CPU-side LRU cache of adapters, vllm/lora/worker_manager.py
``LRUCacheWorkerLoRAManager``) defaults to ``max_loras``.

Not counted: the embedding / LM-head LoRA wrappers (``VocabParallelEmbeddingWithLoRA``,
``LogitsProcessorWithLoRA``) of models that declare ``embedding_modules``, LoRA on MoE experts
(vllm/lora/layers/fused_moe.py), and the punica wrapper's index vectors
(vllm/lora/punica_wrapper/punica_base.py: a few int64 vectors of ``max_num_batched_tokens``, under
1 MiB): each is said in the estimate's assumptions.
"""

from __future__ import annotations

from peakmem.formulas.model_parallel import ROW_PARALLEL_MODULES, TP_SPLIT_COMPONENTS
from peakmem.model import ModelSpec

# The KV budget counts the stacks from vLLM 0.8: V0 sized the pool before it built the LoRA manager until
# PR #14469 (0.8.0, vllm issue #14450); V1 (the default from 0.8) builds them inside load_model's profile.
VLLM_LORA_PROFILED_RELEASE = (0, 8)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def lora_slot_elements_per_adapter(spec: ModelSpec, *, rank: int, tp: int = 1) -> int:
    """Elements of one adapter slot on one tensor-parallel rank: ``rank x (input + output)`` of
    every decoder Linear vLLM wraps (attention and dense MLP projections), split as vLLM splits them."""
    total = 0
    for group in spec.groups:
        per_layer = 0
        for t in group.layer.tensors:
            if t.kind != "linear_weight" or t.component not in TP_SPLIT_COMPONENTS:
                continue
            out_features, in_features = t.shape[0], t.shape[-1]
            if t.module in ROW_PARALLEL_MODULES:
                in_features = _cdiv(in_features, tp)
            else:
                out_features = _cdiv(out_features, tp)
            per_layer += rank * (in_features + out_features) * t.copies
        total += per_layer * group.count
    return total


def lora_slot_bytes(spec: ModelSpec, *, max_loras: int, rank: int, dtype_bytes: int, tp: int = 1) -> int:
    """Bytes of vLLM's preallocated LoRA stacks on one rank: ``max_loras`` slots of ``rank``."""
    return max_loras * lora_slot_elements_per_adapter(spec, rank=rank, tp=tp) * dtype_bytes
