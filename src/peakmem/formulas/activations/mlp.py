"""What the MLP saves.

* MLP (transformers ``activations.py``, ``LlamaMLP``): fused ``F.gelu``/``F.silu`` save their input;
  the python ``gelu_new`` formula saves x, tanh(.), 1 + tanh(.) and 0.5 x; gated MLPs keep gate,
  act(gate), up and their product.
* MoE (transformers' default grouped_mm experts, ``integrations/moe.py``): the router's fp32 scores
  and int64 top-k indices (DeepSeek: its fp32 Linear's input and weight copies; in-place top-k
  renormalisation: a clone and the sum), the dispatch's int64 permutations and sorted routing
  weights, top-k x T gathered expert inputs and scaled outputs, each expert's MLP interior over the
  routed rows; Qwen2-MoE's gated shared expert keeps its output and the sigmoid gate. Before transformers 5.0
  the per-expert ``nn.Linear`` experts loop instead: :mod:`.expert_loop`'s items replace the dispatch's.
"""

from __future__ import annotations

from peakmem.breakdown import MemoryItem
from peakmem.model import Layer, Mlp, ModelSpec
from peakmem.training import KernelPolicy

from .expert_loop import SRC_LOOP, loop_items, loop_routed_inputs
from .fused import SRC_COMPILED, fused_swiglu_item
from .shapes import SRC_WEIGHT_CAST, Shapes, item, sized

# Activations whose backward needs only their output (aten relu saves ``result``), which the next
# Linear saves anyway: one tensor instead of input + output.
OUTPUT_SAVING_ACTIVATIONS = frozenset({"relu"})

# Activations whose transformers module is a python formula that keeps several intermediates
# (transformers/activations.py): name -> tensors of size T x I saved besides the output.
PYTHON_ACTIVATIONS = {"gelu_new": 4, "gelu_fast": 4}
# CUDA autocast runs ``pow`` in fp32 (autocast_mode.cpp fp32 op list): gelu_new then saves
# x (fp32 cast), tanh (fp32), 1 + tanh (fp32) and 0.5 x (16-bit).
PYTHON_ACTIVATION_AUTOCAST_BYTES = {"gelu_new": (4, 4, 4, 2), "gelu_fast": (4, 4, 4, 2)}

# Activations whose autograd Function computes its gradient in python: the most T x I tensors alive at
# once in that backward, net of the down projection's input freed just before (``mlp_terms``' unit: a
# fused F.gelu's g and its result, 2, count 1). modeling_bloom.py ``bloom_gelu_back`` (via
# ``GeLUFunction.backward``): at ``(1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)`` the
# incoming g, tanh_out, ``0.5 * x``, ``1 - tanh_out**2``, ``0.79788456 + ...`` and their product are alive:
# 6, net 5 (traced op by op; the simulator's peak on tiny BLOOM holds these six).
CUSTOM_BACKWARD_ALIVE = {"bloom_gelu": 5}
SRC_MLP = "transformers activations.py / LlamaMLP: act(gate(x)) * up(x)"


SRC_GROUPED_MM = "transformers integrations/moe.py grouped_mm_experts_forward (the default experts)"
SRC_ROUTER = "transformers Mixtral/Qwen*Moe/DeepseekV{2,3} TopkRouter.forward"


def moe_router_items(spec: ModelSpec, mlp: Mlp, sh: Shapes) -> list[MemoryItem]:
    """What an MoE router's backward keeps (T tokens, E experts, top-k): its scores (softmax, DeepSeek-V3's
    sigmoid: they save their fp32 output; the logits themselves are not kept) and the top-k indices
    (``topk`` / ``gather`` backward, int64). DeepSeek's fp32 router Linear (``F.linear(x.type(float32),
    weight.type(float32))``) saves an fp32 copy of its input and of its weight; an in-place renormalisation
    of the top-k weights (``/=`` their sum: Mixtral, ``norm_topk_prob``) makes autograd clone them and
    keeps the sum; DeepSeek-V2's group_limited_greedy ``masked_fill`` keeps its bool mask."""
    t, h, c = sh.tokens, spec.hidden_size, sh.c
    e, k = mlp.num_experts, mlp.experts_per_token
    items = [
        item("moe.router scores (fp32)", t * e * 4, SRC_ROUTER + ": softmax/sigmoid saves its output",
              "moe.router"),
        item("moe.router top-k indices (int64)", t * k * 8, SRC_ROUTER + ": topk/gather saves the indices",
              "moe.router_indices"),
    ]  # fmt: skip
    if mlp.router_fp32 and sh.plan.autocast:
        # the fp32 upcasts are no-ops on autocast's fp32 norm output and weight; autocast casts the input
        # to 16 bits for the Linear (its weight's cast is counted with the autocast weight casts)
        items.append(item("moe.router input (autocast cast)", t * h * c, SRC_WEIGHT_CAST, "moe.router_fp32"))
    elif mlp.router_fp32 and c != 4:
        weight = 0 if sh.plan.weight.bits == 32 else e * h * 4
        items.append(item("moe.router fp32 input + weight copies", t * h * 4 + weight,
                           "modeling_deepseek_v3.py DeepseekV3TopkRouter.forward: "
                           "F.linear(hidden_states.type(float32), self.weight.type(float32))",
                           "moe.router_fp32", 2 if weight else 1))  # fmt: skip
    if mlp.router_norm_topk:
        items.append(item("moe.router top-k weights clone + sum (in-place renormalisation)",
                           t * k * 4 + t * 4, SRC_ROUTER + ": topk_weights /= topk_weights.sum(...): "
                           "autograd saves the original (a clone) and the divisor", "moe.router_norm",
                           2))  # fmt: skip
    if mlp.router_group_mask:
        items.append(item("moe.router group mask (bool)", t * e,
                           "modeling_deepseek_v2.py DeepseekV2TopkRouter: scores.masked_fill(~score_mask, 0)",
                           "moe.router_group_mask"))  # fmt: skip
    return items


def moe_dispatch_items(mlp: Mlp, sh: Shapes) -> list[MemoryItem]:
    """The grouped_mm experts' bookkeeping (S = tokens x top-k routed rows): ``perm`` from ``torch.sort``,
    ``perm // top_k`` (the gather's index) and ``inv_perm`` (int64, each saved by an ``index`` backward),
    the routing weights sorted by expert (``sample_weights[perm]``, saved by the weighting mul: fp32, or
    the compute dtype where the router casts them) and the int32 ``offsets`` (``cumsum``, saved by the
    grouped_mm)."""
    s = sh.tokens * mlp.experts_per_token
    w = 4 if mlp.routing_weights_fp32 else sh.c
    return [
        item("moe.dispatch indices (perm, perm // k, inv_perm; int64)", 3 * s * 8, SRC_GROUPED_MM,
              "moe.dispatch", 3),
        item("moe.routing weights sorted by expert + offsets", s * w + mlp.num_experts * 4, SRC_GROUPED_MM,
              "moe.dispatch_weights", 2),
    ]  # fmt: skip


def routed_width_bytes(spec: ModelSpec, layer: Layer, sh: Shapes) -> int:
    """Bytes of one (routed) tokens x MLP-width tensor: the down projection's input."""
    mlp = layer.mlp
    rows = sh.tokens * (mlp.experts_per_token if mlp.is_moe else 1)
    return rows * mlp.intermediate_size * sh.c


def mlp_terms(spec: ModelSpec, layer: Layer, sh: Shapes) -> tuple[list[MemoryItem], int]:
    """Saved MLP interior (after its input) and the backward transient, per layer."""
    mlp = layer.mlp
    t, c = sh.tokens, sh.c
    items: list[MemoryItem] = []
    routed_tokens = t
    if mlp.is_moe:
        k = mlp.experts_per_token
        items.extend(moe_router_items(spec, mlp, sh))
        if sh.expert_loop:  # transformers 4.x: a loop over nn.Linear experts (expert_loop.py)
            m = interior_bytes(mlp, sh)
            items.extend(loop_items(spec, mlp, sh, m))
            items.append(item("moe.routed token copies (top-k x tokens)", loop_routed_inputs(spec, mlp, sh),
                               SRC_LOOP + ": hidden_states[None, top_x], saved by w1 and w3",
                               "moe.routed_inputs"))  # fmt: skip
            items.append(item("moe.expert outputs (before the routing weights)", k * t * spec.hidden_size * m,
                               SRC_LOOP + ": expert_layer(current_state) * routing_weights[...] saves it",
                               "moe.expert_outputs"))  # fmt: skip
        else:
            items.extend(moe_dispatch_items(mlp, sh))
            items.append(item("moe.routed token copies (top-k x tokens)", k * t * spec.hidden_size * c,
                               SRC_GROUPED_MM + ": hidden_states[perm // top_k], saved by the up grouped_mm",
                               "moe.routed_inputs"))  # fmt: skip
            items.append(item("moe.expert outputs (scaled by the routing weights)",
                               k * t * spec.hidden_size * c,
                               SRC_GROUPED_MM + ": proj_out * sample_weights_g saves proj_out",
                               "moe.expert_outputs"))  # fmt: skip
        routed_tokens = k * t
    width = mlp.intermediate_size
    n = routed_tokens * width
    m = interior_bytes(mlp, sh)
    if mlp.gated and (sh.compiled or sh.fused_kernels):
        items.append(fused_swiglu_item(sh, n))
    elif mlp.gated and m != c:
        # the product (the down projection's input) as its readers keep it: a compute-dtype cast or nothing
        items.append(sized("mlp.gate, act(gate), up, product", (n * m, n * m, n * m, n * c),
                           SRC_MLP + "; " + SRC_QUANT_OUT, "mlp.interior"))  # fmt: skip
    elif mlp.gated:
        items.append(item("mlp.gate, act(gate), up, product", 4 * n * c, SRC_MLP, "mlp.interior", 4))
    elif mlp.activation in PYTHON_ACTIVATIONS and not sh.compiled:
        if sh.plan.autocast and sh.policy is KernelPolicy.CUDA:
            per = sum(PYTHON_ACTIVATION_AUTOCAST_BYTES[mlp.activation]) + c
        else:
            per = (PYTHON_ACTIVATIONS[mlp.activation] + 1) * c
        items.append(
            item(
                f"mlp.fc output + {mlp.activation} intermediates + act output",
                n * per,
                SRC_MLP,
                "mlp.interior",
                PYTHON_ACTIVATIONS[mlp.activation] + 1,
            )
        )
    elif mlp.activation in OUTPUT_SAVING_ACTIVATIONS:
        items.append(
            item(f"mlp.{mlp.activation} output (saved by it and by fc2)", n * c, SRC_MLP, "mlp.relu_output")
        )
    else:  # compiled, a python activation's chain is one kernel: its input and output kept (SRC_COMPILED)
        name = f"mlp.fc output + {mlp.activation} output"
        items.append(sized(name, (n * m, n * c), SRC_COMPILED if sh.compiled else SRC_MLP, "mlp.interior"))
    if mlp.is_moe and mlp.shared_intermediate_size:
        items.append(
            item(
                "mlp.shared experts (gated)",
                4 * t * mlp.shared_intermediate_size * c,
                SRC_MLP,
                "mlp.shared_experts",
                4,
            )
        )
    if mlp.is_moe and mlp.shared_gate:
        # Qwen2MoeSparseMoeBlock: F.sigmoid(shared_expert_gate(x)) * shared_expert_output; the mul saves
        # both, the sigmoid its output (the same tensor)
        items.append(item("mlp.shared expert output + its sigmoid gate", t * (spec.hidden_size + 1) * c,
                           "modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock.forward", "mlp.shared_gate",
                           2))  # fmt: skip
    # backward, net of the down projection's freed input: the gradient of the intermediate; a gated
    # product or a python activation chain has two such gradients alive at once
    return items, backward_gradients_alive(mlp) * n * m


SRC_QUANT_OUT = (
    "bitsandbytes nn/modules.py Linear4bit.forward (0.43.3 / 0.50.2): x.to(compute_dtype), the 4-bit matmul, "
    "then .to(inp_dtype): behind a prepared base's fp32 norms the gate / up outputs and their activation "
    "are fp32 (tests/test_kbit_prep_torch.py)"
)


def interior_bytes(mlp: Mlp, sh: Shapes) -> int:
    """Bytes per element of a dense MLP's interior (its first Linears' outputs and their activation): the
    compute dtype, or over a bitsandbytes base the norm output's dtype, which its Linears return
    (:data:`SRC_QUANT_OUT`; fp32 behind ``prepare_model_for_kbit_training``'s norms: ``sh.r``). MoE experts
    do too where they are quantized ``nn.Linear`` modules (transformers 4.x), which read the routed rows of
    the norm output; grouped_mm over unquantized expert weights (5.x) computes in the compute dtype."""
    quantized = sh.quantized_experts if mlp.is_moe else sh.quantized_base
    return sh.r if quantized else sh.c


def down_input_bytes(mlp: Mlp, sh: Shapes) -> int:
    """Bytes per element of the down projection's input as the activation makes it (before any cast its
    reader makes): the interior's dtype, or fp32 where CUDA autocast runs a python activation's ``pow`` in
    fp32 and its last product promotes (:data:`PYTHON_ACTIVATION_AUTOCAST_BYTES`: 0.5 x times the fp32
    1 + tanh(.))."""
    m = interior_bytes(mlp, sh)
    if mlp.activation in PYTHON_ACTIVATIONS and sh.plan.autocast and sh.policy is KernelPolicy.CUDA:
        return max(m, *PYTHON_ACTIVATION_AUTOCAST_BYTES[mlp.activation])
    return m


def backward_gradients_alive(mlp: Mlp) -> int:
    """How many tokens x width gradients the MLP's backward holds at once, net of the down projection's
    freed input: a gated product or a python activation chain two, a custom kernel its own count."""
    alive = 2 if mlp.gated or mlp.activation in PYTHON_ACTIVATIONS else 1
    return CUSTOM_BACKWARD_ALIVE.get(mlp.activation, alive)


def moe_weighting_backward(spec: ModelSpec, mlp: Mlp, sh: Shapes) -> int:
    """The gradients alive while backward crosses the grouped_mm experts' output (S = tokens x top-k):
    ``weighted_out = proj_out * sample_weights_g`` promotes to the routing weights' dtype (fp32 for
    Mixtral/DeepSeek), so the gradient of ``weighted_out[inv_perm].view(T, k, H).sum(1)`` is S x H in that
    dtype three times at once: the contiguous copy of the expanded sum gradient (``clone``), the ``index``
    backward's zeros and its ``index_put`` (measured under fake tensors); the mul's two gradients and the
    cast back to ``proj_out``'s dtype follow once the first two are freed. Shared experts run their
    backward first (DeepSeek; Qwen2-MoE's gated shared output waits for it instead): a T x H gradient
    waits for the routed branch's."""
    s, h, c = sh.tokens * mlp.experts_per_token, spec.hidden_size, sh.c
    w = 4 if mlp.routing_weights_fp32 else c
    grads = s * h * (3 * w + (c if w != c else 0))
    shared = sh.tokens * h * c if mlp.shared_intermediate_size else 0
    return grads + shared
