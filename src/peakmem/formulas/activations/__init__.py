"""What autograd keeps for backward, per transformer layer, as transformers' model code saves it.

Every term is a tensor that a backward node holds (``ctx.save_for_backward`` / the saved variables of
ATen's derivatives.yaml), counted once per storage. The list was derived from the code of transformers
5.23 (``modeling_gpt2.py``, ``modeling_llama.py``, ``modeling_bert.py``,
``integrations/sdpa_attention.py``, ``activations.py``) and PyTorch 2.13 (derivatives.yaml,
``aten/src/ATen/native/Dropout.cpp``, ``autocast_mode.cpp``) and checked tensor by tensor on tiny
models with ``torch.autograd.graph.saved_tensors_hooks`` on CPU. Per layer (T = batch x seq tokens,
h hidden, a heads, g kv heads, d head dim, I MLP width, c compute bytes, r residual bytes), by module:

* :mod:`.shapes`: the sizes and dtypes of one estimate, a layer's result, dropout masks;
* :mod:`.kernels`: which attention kernel runs (CPU fallbacks, SDPA's CUDA kernel choice);
* :mod:`.fused`: torch.compile and Liger / unsloth kernels;
* :mod:`.norms`: LayerNorm, RMSNorm, q/k norms;
* :mod:`.structure`: a block's norms and Linear readers, from its tensors;
* :mod:`.attention`: eager, SDPA, flash-attn and MLA attention, their backward scratch;
* :mod:`.mlp`: dense and gated MLPs, MoE routers, dispatch and experts;
* :mod:`.expert_loop`: transformers 4.x's per-expert MoE loop (Mixtral-style ``nn.Linear`` experts);
* :mod:`.layer`: one layer (projection inputs, autocast weight casts, the backward stages), derived
  blocks, the embeddings, checkpointing;
* :mod:`.op_sac`: op-level selective checkpointing (torchtitan's save list, every other matmul).

Adapters (LoRA) re-weigh these in :mod:`peakmem.formulas.lora`; this package never imports it.
"""

from __future__ import annotations

from .attention import attention_terms, efficient_backward_scratch, flash_backward_scratch
from .fused import SRC_COMPILED, compiled_layer_input, fused_rmsnorm_saved, fused_swiglu_item
from .kernels import (
    FLASH_BWD_SEQ_ROUND,
    MATH,
    cuda_sdpa_backend,
    effective_kernel,
    flash_bwd_head_rounded,
    kernel_choice,
    sdpa_call_backend,
    sdpa_call_heads,
)
from .layer import (
    CORE_KEYS,
    causal_mask_bytes,
    checkpointed,
    derived_activations,
    embedding_items,
    input_saved_by_layer,
    layer_activations,
    layer_end_forward,
)
from .mlp import (
    backward_gradients_alive,
    down_input_bytes,
    interior_bytes,
    mlp_terms,
    moe_weighting_backward,
    routed_width_bytes,
)
from .norms import (
    norm_pieces,
    norm_saved,
    post_mlp_norm_backward,
    qk_norm_item,
    qk_norm_width,
    rmsnorm_weight_side_bytes,
)
from .op_sac import check_op_sac, op_checkpointed, op_saved, op_saved_linears
from .shapes import (
    LayerActivations,
    Shapes,
    activation_dtype_note,
    derived_family,
    dropout_mask_bytes,
    shapes,
    tensor_sizes,
)
from .structure import block_norm_count

__all__ = [
    "CORE_KEYS",
    "FLASH_BWD_SEQ_ROUND",
    "MATH",
    "SRC_COMPILED",
    "LayerActivations",
    "Shapes",
    "activation_dtype_note",
    "attention_terms",
    "backward_gradients_alive",
    "block_norm_count",
    "causal_mask_bytes",
    "check_op_sac",
    "checkpointed",
    "compiled_layer_input",
    "cuda_sdpa_backend",
    "derived_activations",
    "derived_family",
    "down_input_bytes",
    "dropout_mask_bytes",
    "effective_kernel",
    "efficient_backward_scratch",
    "embedding_items",
    "flash_backward_scratch",
    "flash_bwd_head_rounded",
    "fused_rmsnorm_saved",
    "fused_swiglu_item",
    "input_saved_by_layer",
    "interior_bytes",
    "kernel_choice",
    "layer_activations",
    "layer_end_forward",
    "mlp_terms",
    "moe_weighting_backward",
    "norm_pieces",
    "norm_saved",
    "op_checkpointed",
    "op_saved",
    "op_saved_linears",
    "post_mlp_norm_backward",
    "qk_norm_item",
    "qk_norm_width",
    "rmsnorm_weight_side_bytes",
    "routed_width_bytes",
    "sdpa_call_backend",
    "sdpa_call_heads",
    "shapes",
    "tensor_sizes",
]
