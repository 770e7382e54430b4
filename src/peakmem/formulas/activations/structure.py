"""A block's structure as its tensors show it: how many norms act on the hidden state, how many Linears
read the attention and MLP inputs, which parameters come before the attention core. An estimator's
memo keeps them by the layer's identity (a planner asks thousands of times)."""

from __future__ import annotations

from peakmem.model import Layer, ModelSpec

from ..memo import Memo, memoised
from .norms import QK_NORM_MODULES
from .shapes import Shapes


def block_norm_count(layer: Layer, memo: Memo | None = None) -> int:
    """Norms applied to the hidden state in one block (:func:`_block_norms`; ``memo``: an estimator's)."""
    return layer_structure(layer, memo)[0]


def _block_norms(layer: Layer) -> int:
    """Norms applied to the hidden state in one block (2 pre-norms; Gemma 2/3 add 2 post-norms;
    Falcon-7B's parallel block has one), counted from the layer's norm weights."""
    n = sum(
        1 for t in layer.tensors
        if t.kind == "norm" and t.name.endswith("weight") and t.module not in QK_NORM_MODULES
    )  # fmt: skip
    return n or 2


def _attention_readers(layer: Layer) -> int:
    """Linears that read the attention input: all attention Linears but the output projection."""
    n = sum(1 for t in layer.tensors if t.component == "attention" and t.kind == "linear_weight")
    return max(1, n - 1)


# the attention's output projection, as each family's transformers code names it (o_proj; GPT-2's
# attn.c_proj; BERT's attention.output.dense, GPT-NeoX/BLOOM/Falcon/Phi's dense; OPT's out_proj)
OUTPUT_PROJECTIONS = frozenset({"o_proj", "c_proj", "dense", "out_proj"})


def _attention_input_params(layer: Layer) -> int:
    """Parameters of the attention's Linears before its core (q, k, v; MLA's down and up projections):
    all the attention's parameters but the output projection's. Their gradients are written after the
    core's backward."""
    return sum(
        t.numel for t in layer.tensors if t.component == "attention" and t.module not in OUTPUT_PROJECTIONS
    )


def layer_structure(layer: Layer, memo: Memo | None = None) -> tuple[int, int, int]:
    """(:func:`_block_norms`, :func:`_attention_readers`, :func:`_attention_input_params`) of ``layer``:
    they scan the layer's tensors, and a planner asks them thousands of times, so an estimator's ``memo``
    keeps them by the layer's identity."""
    return memoised(memo, "layer_structure", layer, lambda: _structure(layer))


def _structure(layer: Layer) -> tuple[int, int, int]:
    return _block_norms(layer), _attention_readers(layer), _attention_input_params(layer)


def mlp_input_readers(layer: Layer) -> int:
    if not layer.mlp.gated or layer.mlp.fused_gate_up:
        return 1
    return 2


def compiled_block(spec: ModelSpec, layer: Layer, sh: Shapes) -> bool:
    """Whether ``layer``'s saved tensors follow torch.compile's block (:data:`.fused.SRC_COMPILED`: the layer
    input kept, each norm's output once and its statistics only, SDPA's output copied for the output
    projection): measured on Llama's RMSNorm blocks and on GPT-2's sequential pre-LayerNorm block
    (benchmarks/compile_activations.py). Other LayerNorm blocks (a parallel residual, post-norm, OLMo's
    fp32 LayerNorm) are estimated as eager."""
    if not sh.compiled:
        return False
    if spec.norm == "rmsnorm":
        return True
    sequential = not (spec.post_norm or layer.parallel_residual or spec.layernorm_fp32)
    return spec.norm == "layernorm" and sequential and layer_structure(layer, sh.memo)[0] == 2
