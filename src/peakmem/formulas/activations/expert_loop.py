"""transformers 4.x's per-expert MoE loop in training (Mixtral-style ``nn.Linear`` experts).

Before 5.0.0 the MoE blocks of :data:`peakmem.transformers_versions.EXPERT_LINEAR_MODEL_TYPES` loop over
their experts (4.48.1 ``models/mixtral/modeling_mixtral.py`` ``MixtralSparseMoeBlock.forward`` l. 112-150;
``Qwen2MoeSparseMoeBlock`` l. 619-660, ``OlmoeSparseMoeBlock``, ``PhimoeSparseMoeBlock``, Jamba's alike):
``expert_mask = one_hot(selected_experts).permute(2, 1, 0)``, then per expert ``idx, top_x =
torch.where(expert_mask[e])``, ``current_state = hidden_states[None, top_x]``, the expert's ``nn.Linear``
MLP ``w2(act(w1(x)) * w3(x))`` over its own rows, ``* routing_weights[top_x, idx, None]`` (the weights cast to
the hidden states' dtype) and ``final_hidden_states.index_add_(0, top_x, ...)``. What autograd keeps
(torch 2.13 ``Functions.h``: ``IndexBackward0`` its indices, ``MulBackward0`` both factors,
``IndexAddBackward0`` its ``index_`` and ``source_``, ``MmBackward0`` its ``self_`` only where the weight's
gradient is computed), over all experts (S = tokens x top-k routed rows):

* ``torch.where``'s ``nonzero`` output, ``[n, 2]`` int64 per expert (``idx`` and ``top_x`` are its columns):
  16 bytes per routed row (:func:`loop_items`);
* the routing weight slices ``[n, 1]`` (hidden dtype; fp32 in DeepSeek-V3's loop), saved by the weighting mul;
* each expert's down-projection output, saved by the weighting mul (``moe.expert_outputs``), and the
  weighted output, which ``index_add_`` saves as its source (``moe.weighted_outputs``: promoted to the
  routing weights' dtype where it differs);
* the experts' gate / up outputs, the activation and (for a trainable down projection) the product:
  ``mlp.interior`` over the S rows, and the routed rows (``moe.routed_inputs``) where w1 / w3 are trained.

No ``perm`` / ``inv_perm`` / sorted weights (5.x ``grouped_mm``'s, :func:`.mlp.moe_dispatch_items`). What
is alive at once is one expert's rows, not all S: the forward interior under a checkpoint's no_grad
(:func:`loop_interior`), the backward's gradients in flight (:func:`loop_backward`: the first expert
backward reaches is the loop's last, nothing of the others freed yet) and the recomputation's end
(:func:`loop_tail`). Measured with benchmarks/moe_loop_4x.py (tiny Mixtral, transformers 4.48.1, CPU).

DeepSeek-V3's loop (``DeepseekV3MoE.moe``; dots1, glm4_moe, longcat_flash) weights and accumulates in its
router's fp32 (:func:`routing_bytes`); DeepSeek-V2's sorts its rows instead and is not this loop
(:data:`peakmem.transformers_versions.INDEX_ADD_LOOP_MODEL_TYPES`: it keeps the ``grouped_mm`` formulas).

The rows of one expert depend on what the router chooses, which the formulas cannot know: they take a
balanced router's, ``ceil(S / E)`` (:func:`expert_rows`, :data:`BALANCED_ROWS`).
"""

from __future__ import annotations

from peakmem.breakdown import MemoryItem
from peakmem.model import Layer, Mlp, ModelSpec
from peakmem.transformers_versions import FP32_ROUTED_LOOP_MODEL_TYPES

from .shapes import Shapes, item

SRC_LOOP = (
    "transformers 4.48.1 modeling_mixtral.py MixtralSparseMoeBlock.forward l. 112-150 (per-expert loop)"
)
# torch.where(expert_mask[e]) is nonzero(): one [n, 2] int64 tensor per expert, idx and top_x its columns
LOOP_INDEX_BYTES = 2 * 8
# The rule for one expert's routed rows: a balanced router gives each of the E experts S / E of the
# S = tokens x top-k rows (ceil). The tiny random Mixtral of benchmarks/moe_loop_4x.py routes within a few
# per cent of it (its docstring prints the counts); a trained router can be more skewed.
BALANCED_ROWS = "balanced: ceil(tokens x top-k / experts)"
FP32 = 4  # DeepSeek-V3's router: F.linear(hidden_states.type(torch.float32), ...).sigmoid()
MASK_BYTES = 8  # one_hot(selected_experts): int64, T x k x E, alive through the loop (forward only)


def expert_rows(mlp: Mlp, tokens: int) -> int:
    """Routed rows of one expert under :data:`BALANCED_ROWS`."""
    return -(-tokens * mlp.experts_per_token // mlp.num_experts)


def routing_bytes(spec: ModelSpec, sh: Shapes) -> int:
    """Bytes per element of the routing weights the loop multiplies by, and of its accumulator
    (``final_hidden_states``): the hidden states' dtype (``routing_weights.to(hidden_states.dtype)``, the
    residual stream's), or the router's fp32 where the loop weights in it
    (:data:`peakmem.transformers_versions.FP32_ROUTED_LOOP_MODEL_TYPES`: DeepSeek-V3's)."""
    return FP32 if spec.model_type in FP32_ROUTED_LOOP_MODEL_TYPES else sh.r


def weighted_bytes(spec: ModelSpec, m: int, sh: Shapes) -> int:
    """Bytes per element of ``expert_out * routing_weights[...]`` as ``index_add_`` keeps it: promoted to the
    wider of the routing weights' dtype (:func:`routing_bytes`) and the expert output's ``m``."""
    return max(m, routing_bytes(spec, sh))


def loop_items(spec: ModelSpec, mlp: Mlp, sh: Shapes, m: int) -> list[MemoryItem]:
    """The loop's bookkeeping and weighting, saved (see the module docstring), ``m`` the expert output's
    bytes per element: the ``nonzero`` indices, the routing weight slices and the weighted outputs
    (``index_add_``'s source). The down projections' outputs are ``moe.expert_outputs`` (mlp.py)."""
    s = sh.tokens * mlp.experts_per_token
    weighted = s * spec.hidden_size * weighted_bytes(spec, m, sh)
    return [
        item("moe.loop indices (torch.where: idx, top_x; int64)", s * LOOP_INDEX_BYTES, SRC_LOOP,
              "moe.loop_indices"),
        item("moe.routing weight slices", s * routing_bytes(spec, sh),
              SRC_LOOP + ": routing_weights[top_x, idx, None]", "moe.loop_weights"),
        item("moe.weighted expert outputs (index_add_ source)", weighted,
              SRC_LOOP + ": final_hidden_states.index_add_(0, top_x, ...) saves its source",
              "moe.weighted_outputs"),
    ]  # fmt: skip


def loop_routed_inputs(spec: ModelSpec, mlp: Mlp, sh: Shapes) -> int:
    """``hidden_states[None, top_x]`` over all experts, as w1 and w3 save it: the hidden dtype's rows, or
    under autocast one 16-bit cast per Linear (the two read the same rows)."""
    s = sh.tokens * mlp.experts_per_token * spec.hidden_size
    return 2 * s * sh.c if sh.plan.autocast and sh.r != sh.c else s * sh.r


def _router_temporaries(spec: ModelSpec, mlp: Mlp, sh: Shapes) -> tuple[int, ...]:
    """Alive through the loop, saved by nothing: ``final_hidden_states`` (T x h, :func:`routing_bytes`), the
    one-hot expert mask (int64), the routing weights cast to the hidden dtype (none where they stay fp32) and
    the router logits (returned)."""
    t, k, e = sh.tokens, mlp.experts_per_token, mlp.num_experts
    w = routing_bytes(spec, sh)
    cast = 0 if w == FP32 else t * k * sh.r  # fp32 weights: nothing cast (or a no-op cast of fp32 ones)
    return t * spec.hidden_size * w, t * k * e * MASK_BYTES, cast, t * e * sh.c


def loop_interior(spec: ModelSpec, layer: Layer, sh: Shapes, m: int) -> tuple[int, ...]:
    """The MoE block's largest moment under no_grad (a checkpointed layer's forward), beside its input, at
    its tensors' sizes: the loop's temporaries and one expert's rows at its gate-up product (the rows,
    act(w1), w3's output and their product); a shared expert after the loop (Qwen2-MoE) over all tokens,
    its gate, up and product."""
    mlp = layer.mlp
    n, h = expert_rows(mlp, sh.tokens), spec.hidden_size
    expert = (n * h * sh.r, *(n * mlp.intermediate_size * m,) * 3)
    shared = (sh.tokens * mlp.shared_intermediate_size * sh.c,) * 3
    return (*_router_temporaries(spec, mlp, sh), *(expert if sum(expert) >= sum(shared) else shared))


def loop_backward(spec: ModelSpec, layer: Layer, sh: Shapes, m: int, grads: int) -> tuple[int, int, int]:
    """The loop's backward at the first expert it reaches (the loop's last), as ``(net, freed, grads)``
    above the layer's saved tensors: the incoming T x h gradient, the gated product's gradient and the two
    gradients of the mul behind it (n x I each, as :func:`.mlp.backward_gradients_alive` counts a dense
    MLP's), ``grads`` (that expert's down-projection weight gradient, trainable), the routing weights'
    running gradient (``IndexBackward0``'s T x k zeros); freed by then: the product (the down projection's
    input, after its backward), the expert's output and weighted output."""
    mlp = layer.mlp
    t, h = sh.tokens, spec.hidden_size
    n = expert_rows(mlp, t)
    temporaries = (
        t * h * sh.r + 3 * n * mlp.intermediate_size * m + t * mlp.experts_per_token * routing_bytes(spec, sh)
    )
    freed = n * mlp.intermediate_size * m + n * h * (m + weighted_bytes(spec, m, sh))
    return temporaries + grads - freed, freed, grads


def loop_tail(spec: ModelSpec, mlp: Mlp, sh: Shapes, m: int, *, not_saved: int, later: int) -> int:
    """Beyond the layer's saved tensors, what is alive at the loop's last expert's down projection (the
    peak of its forward, and the end of its recomputation in backward: non-reentrant checkpointing stops
    once the last saved tensor is rebuilt): the attention half's residual sum, the loop's temporaries,
    ``not_saved`` (the norm output, the expert's rows and its product where no frozen Linear keeps them),
    less what that expert has not made yet (its weighted output and weight slice) and ``later`` (saved
    tensors made after the loop: a shared expert's)."""
    n, h = expert_rows(mlp, sh.tokens), spec.hidden_size
    pending = n * h * weighted_bytes(spec, m, sh) + n * routing_bytes(spec, sh)
    return sh.tokens * h * sh.r + sum(_router_temporaries(spec, mlp, sh)) + not_saved - pending - later


__all__ = [
    "BALANCED_ROWS",
    "expert_rows",
    "loop_backward",
    "loop_interior",
    "loop_items",
    "loop_routed_inputs",
    "loop_tail",
    "routing_bytes",
]
