"""transformers 4.x gpt-oss experts in training: a Python loop over the hit experts, what its backward holds.

peakmem measures a derived gpt-oss block with the installed transformers (5.23), whose experts run
``grouped_mm`` (5.0.0 on: ``modeling_utils.py`` ``get_correct_experts_implementation`` defaults to it): one
gradient per expert tensor. Before 5.0.0, ``GptOssExperts.forward`` in training loops over the experts any
token was routed to (4.55.0 ``models/gpt_oss/modeling_gpt_oss.py`` l. 93-113; 4.56.0 l. 98-120 and 4.57.1
l. 98-126, ``if hidden_states.device.type == "cpu" or self.training``), and takes each expert's weights by
indexing the 3-D parameters: ``current_state @ self.gate_up_proj[expert_idx]`` and
``gated_output @ self.down_proj[expert_idx]``.

* 4.55.0 indexes with ``expert_idx`` as the 1-element tensor ``nonzero()`` gives (advanced indexing,
  ``aten::index``): each expert's ``[1, H, 2I]`` and ``[1, I, H]`` slices are *copies*, and the matmuls
  save them for their input gradient, so a layer's recomputed forward holds a copy of every hit expert's
  weights (``index_copies``) until backward reaches that expert. 4.56.0 on index with ``expert_idx[0]``
  (a 0-d tensor: ``select``, a view), no copies.
* The backward of either indexing is a full-size gradient per expert (``index_backward``: ``new_zeros`` of
  the parameter's sizes, the expert's slice put into it; ``select_backward``: ``zeros(sizes)`` and a
  ``copy_`` into the slice), and the autograd engine adds the experts' contributions into the parameter's
  ``InputBuffer`` in place (torch/csrc/autograd/input_buffer.cpp ``accumulate``: ``aten::add_`` when the
  buffer is its only user). So while the second expert's ``gate_up_proj`` gradient is added, two
  ``gate_up_proj``-sized tensors and the ``down_proj`` sum are alive (``loop_backward``), where
  ``grouped_mm`` writes each weight gradient once: measured on the CPU (torch 2.13, the profiler's memory
  timeline, both indexings: tests/test_moe_loop.py) to within the routed rows' gradients.

The kernels hub's MegaBlocks layer (``use_kernels=True``) would replace this loop, but transformers 4.55
kernelizes for the device the model is on when ``from_pretrained`` returns (``modeling_utils.py`` l. 5093
``kernelize(model, device=Device(type=model.device.type))``; kernels 0.9.0 ``layer.py`` ``kernelize``
keeps the original forward for a device with no mapping, and ``hub_kernels.py`` maps ``MegaBlocksMoeMLP``
for cuda and rocm only): a model loaded on the CPU, as FSDP loads it without ``device_map``
(axolotl@ba3dba3e ``loaders/model.py`` ``_set_device_map_config``), runs the loop.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from peakmem.breakdown import Category, MemoryItem
from peakmem.formulas.activations.expert_loop import expert_rows, loop_tail
from peakmem.formulas.activations.layer import GATED_MLP_TENSORS
from peakmem.formulas.activations.mlp import interior_bytes
from peakmem.training import Framework, TrainingSetup
from peakmem.transformers_versions import gpt_oss_expert_loop

if TYPE_CHECKING:
    from peakmem.formulas.activations import LayerActivations, Shapes
    from peakmem.model import Layer, ModelSpec

SRC_COPIES = (
    "transformers 4.55.0 modeling_gpt_oss.py l. 105/111: self.gate_up_proj[expert_idx] with a 1-element "
    "index tensor copies the expert's weights, which the matmul saves (formulas/moe_loop.py)"
)
LOOP_MODEL_TYPES = frozenset({"gpt_oss"})  # the 4.x experts that loop in training with indexed 3-D weights
FULL_SIZE_AT_PEAK = 2  # the running sum and the new expert's full-size gradient (added into it in place)
EXPERTS_DONE_AT_PEAK = 2  # the peak is at the second expert backward reaches: the first's copies are freed


def experts_hit(num_experts: int, tokens: int, top_k: int) -> int:
    """The experts the loop visits: every one a token is routed to (the bound: as many as routed rows)."""
    return min(num_experts, tokens * top_k)


def expert_tensors(num_experts: int, hidden: int, inter: int, elem: int) -> tuple[int, int]:
    """Bytes of a layer's ``gate_up_proj`` ``[E, H, 2I]`` and ``down_proj`` ``[E, I, H]``."""
    return num_experts * hidden * 2 * inter * elem, num_experts * inter * hidden * elem


def index_copies(hit: int, hidden: int, inter: int, elem: int) -> int:
    """4.55.0: the hit experts' weight slices the matmuls save (``[1, H, 2I]`` and ``[1, I, H]`` each)."""
    return hit * (hidden * 2 * inter + inter * hidden) * elem


def loop_backward(gate_up: int, down: int, copy_per_expert: int) -> tuple[int, int, int]:
    """The loop's backward peak in the layer, as ``(net, freed, grads)`` above its recomputed activations
    (the ``LayerActivations.backward_*`` convention: net = temporaries + grads - freed): both weight
    gradients' running sums (grads), one more ``gate_up_proj``-sized tensor (the new expert's full-size
    gradient), and the first two experts' copies already freed (``copy_per_expert`` 0 without copies)."""
    grads = gate_up + down
    temporaries = (FULL_SIZE_AT_PEAK - 1) * gate_up
    freed = EXPERTS_DONE_AT_PEAK * copy_per_expert
    return temporaries + grads - freed, freed, grads


def _moments(la: LayerActivations, copies: int) -> list[tuple[int, int, int]]:
    """The instants of the layer's backward the estimate can peak at, each ``(net, freed, grads)``: the
    measured one at the layer's end (the copies freed by then) and, with copies, the end of the
    recomputation (everything recomputed alive, nothing freed or written yet)."""
    end = (la.backward_transient - copies, la.backward_freed + copies, la.backward_grads)
    return [end, (0, 0, 0)] if copies else [end]


def linear_loop_layer(
    la: LayerActivations, spec: ModelSpec, layer: Layer, sh: Shapes, *, recomputed: bool
) -> LayerActivations:
    """A Mixtral-style 4.x expert loop's last expert (:func:`peakmem.formulas.activations.expert_loop
    .loop_tail`), once the adapters decided what is saved: at the end of the layer's recomputation, next to
    its incoming gradient (``layer_input``'s size), a backward moment; without recomputation a forward one.
    The norm output, the expert's rows and its gated product are temporaries there where no trained
    Linear saves them (``input.mlp``, ``moe.routed_inputs``, the product in ``mlp.interior``)."""
    mlp, t, h = layer.mlp, sh.tokens, spec.hidden_size
    keyed = {i.key: i.bytes for i in la.saved}
    m = interior_bytes(mlp, sh)
    n = expert_rows(mlp, t)
    product = n * mlp.intermediate_size * m
    full_interior = GATED_MLP_TENSORS * t * mlp.experts_per_token * mlp.intermediate_size * m
    not_saved = 0 if keyed.get("input.mlp") else t * h * sh.r
    not_saved += 0 if keyed.get("moe.routed_inputs") else n * h * sh.r
    not_saved += product if keyed.get("mlp.interior", 0) < full_interior else 0
    later = keyed.get("mlp.shared_experts", 0) + keyed.get("mlp.shared_gate", 0)
    tail = loop_tail(spec, mlp, sh, m, not_saved=not_saved, later=later)
    if not recomputed:
        if tail <= la.forward_transient:
            return la
        return replace(la, forward_transient=tail, forward_sizes=())
    moment = (la.layer_input + tail, 0, 0)
    if moment <= (la.backward_transient, la.backward_freed, la.backward_grads):
        return la
    return replace(la, backward_transient=moment[0], backward_freed=0, backward_grads=0, backward_sizes=())


def expert_loop_layer(
    la: LayerActivations,
    spec: ModelSpec,
    layer: Layer,
    sh: Shapes,
    setup: TrainingSetup,
    *,
    trainable: bool,
    recomputed: bool = False,
) -> LayerActivations:
    """``la`` (measured with ``grouped_mm``) as the 4.x loop runs it: the copies saved (4.55.0), and the
    backward peak the larger of the measured one (:func:`_moments`) and, for trainable experts, the loop's
    (:func:`loop_backward`). Unchanged for transformers >= 5.0, another model type or a framework with its
    own model code. Mixtral-style ``nn.Linear`` experts: :func:`linear_loop_layer` (``recomputed``: the
    layer runs again in backward under full checkpointing)."""
    if sh.expert_loop and layer.mlp.num_experts and layer.derived is None:
        return linear_loop_layer(la, spec, layer, sh, recomputed=recomputed)
    style = gpt_oss_expert_loop(setup.transformers)
    mlp = layer.mlp
    if style is None or setup.framework is not Framework.HF or spec.model_type not in LOOP_MODEL_TYPES:
        return la
    if not mlp.num_experts:
        return la
    hit = experts_hit(mlp.num_experts, sh.tokens, mlp.experts_per_token)
    h, i, c = spec.hidden_size, mlp.intermediate_size, sh.c
    copies = index_copies(hit, h, i, c) if style == "index" else 0
    moments = _moments(la, copies)
    gate_up, down = expert_tensors(mlp.num_experts, h, i, c)
    if trainable:
        moments.append(loop_backward(gate_up, down, copies // hit))
    net, freed, grads = max(moments, key=lambda m: m[0])
    saved = la.saved
    if copies:
        saved += (MemoryItem(path="MoE experts: each hit expert's weight copy, saved by its matmuls",
                             category=Category.ACTIVATIONS, bytes=copies, source=SRC_COPIES,
                             key="moe_loop.copies"),)  # fmt: skip
    if (net, freed, grads) == moments[0] and not copies:
        return la
    looped = trainable and (net, freed, grads) == moments[-1]
    sizes = (gate_up,) * (FULL_SIZE_AT_PEAK - 1) if looped else ()  # the temporaries, at their sizes
    return replace(la, saved=saved, backward_transient=net, backward_freed=freed, backward_grads=grads,
                   backward_stages=(), backward_sizes=sizes)  # fmt: skip


__all__ = [
    "LOOP_MODEL_TYPES",
    "expert_loop_layer",
    "expert_tensors",
    "experts_hit",
    "index_copies",
    "linear_loop_layer",
    "loop_backward",
]
