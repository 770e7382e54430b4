"""Op-level selective activation checkpointing (``--checkpointing op``): what one layer keeps.

torchtitan (commit 1f029641b5caeb4df18ac094263e8bcc674b3686, torchtitan/models/llama3/parallelize.py
``_op_sac_save_list``, torchtitan/distributed/activation_checkpoint.py ``_apply_op_sac``,
``selective_ac_option = "op"``) wraps each block in non-reentrant ``torch.utils.checkpoint`` with
``create_selective_checkpoint_contexts`` (torch 2.13 torch/utils/checkpoint.py): the outputs of the ops
in the save list are kept (``CheckpointPolicy.MUST_SAVE``) and every other op is recomputed in backward.
The list names ``aten.mm`` (and ``aten.linear`` where a backend does not decompose it), SDPA's flash,
memory-efficient and cuDNN kernels, ``reduce_scatter_tensor`` and ``max``; every second matmul of a
block is recomputed (a counter per block and pass, saved when ``mm_count % 2 == 1``).

What that keeps per decoder layer (peakmem.measure.op_sac runs the same policy on the real model):

* the layer input (``torch.utils.checkpoint`` keeps the block's arguments for its recomputation);
* the outputs of its bias-free Linears at odd positions, in forward order (attention q, k, v, o, then
  the MLP's gate, up, down: q, v, gate, down for a Llama layer): ``aten::linear`` decomposes to ``mm``
  without a bias; with one it runs ``addmm`` (aten/src/ATen/native/Linear.cpp), which is neither in the
  list nor counted, so a biased Linear (GPT-2's Conv1D, Qwen2's q/k/v) keeps nothing;
* on CUDA, SDPA's flash / memory-efficient output and logsumexp. CPU's SDPA runs
  ``_scaled_dot_product_flash_attention_for_cpu`` and eager attention ``bmm``: neither is in the list,
  so nothing of the attention is kept there; the math kernel is a composite of ``bmm`` too.

In backward the recomputation rebuilds the layer's saved tensors, with the kept outputs served from the
cache (their storage is the one the layer's own saved tensors use, or freed once read).

Float8 Linears (``--precision float8-*``, torchao ``convert_to_float8_training``, eager) count and are
kept as ``mm``, as bias-free 16-bit ones are, and so do biased ones (``Float8Linear.forward`` adds the bias
after the matmul: ``output + self.bias``, where a 16-bit biased Linear runs ``addmm``). torchao
0.18 float8_linear.py ``matmul_with_hp_or_float8_args.forward`` (as ``manual_float8_matmul_with_args_in
_float8`` at eab345c, 2024-12-20, and at 0afa4c1, 2025-06-13: the torchao commits of the published
float8 points) calls ``torch.mm`` on two ``Float8TrainingTensor`` operands. The selective-checkpoint
policy is a TorchDispatchMode, and a mode is consulted before a subclass's ``__torch_dispatch__``: it
sees ``aten.mm.default`` (counted; saved at odd positions), and the subclass turns it into
``torch._scaled_mm`` (float8_ops.py ``float8_mm`` -> ``addmm_float8_unwrapped``) inside the mode's own
call, where the mode is off. What the cache keeps is the ``mm`` result the subclass returns: a plain
tensor of the Linear's output dtype (rowwise's ``output *= post_inverse_scale`` is applied before it
returns), the bytes of a 16-bit Linear's output. Measured on this CPU (torch 2.13, torchao 0.18, the
tiny Llama, tensorwise and rowwise): the policy is called with ``aten.mm.default`` on
``Float8TrainingTensor`` arguments and never with ``aten._scaled_mm``. So whether the list names
``_scaled_mm`` does not matter in eager (torchtitan never named it up to 1f029641b; since 114151ad4,
2026-03-23, distributed/activation_checkpoint.py ``_get_default_save_ops`` takes torch's partitioner
``compute_intensive_ops``, which in torch 2.13 _functorch/partitioners.py include ``_scaled_mm``, as well
as ``addmm`` and ``bmm``: the latter two are not modelled here, this module stays at 1f029641b). The
casts' ``aten.max`` (tensorwise amax, float8_utils.py ``tensor_to_amax``) is in every list since 9dec370:
kept, one fp32 value per cast (two per Linear), not counted; rowwise's ``aten.amax`` is recomputed. The
casts themselves are recomputed in backward (peakmem.formulas.activations.float8 ``float8_layer``,
``recomputed``). torchtitan 9dec370's list also named ``aten.abs`` (the casts' ``abs(x)``, a full-size
copy of each Linear's input and weight), removed by 88247277c (2025-02-06) after it kept unsharded
weights' ``abs`` under compile with rowwise scaling; its tensorwise runs there read 47.77 GiB with and
without it: not modelled. Under torch.compile (torch 2.13, torchao 0.18, tensorwise and rowwise, measured
by benchmarks/sac_compile_activations.py ``--precision float8-*``) the policy still sees ``aten.mm.default``
on the float8 Linears, never ``_scaled_mm``: the compiled block keeps what a bf16 one keeps (below), and a
few fp32 scalars (tensorwise's amaxes: 44 bytes per layer there) or, rowwise, two fp32 per token (8 bytes
per token, 0.2 to 0.6 % of the layer's there): not counted. The casts' own bytes under compile follow
float8.py, which is eager only.

Under torch.compile (torchtitan applies the op policy to each block, then ``torch.compile(block,
fullgraph=True)`` per block: 775a486 torchtitan/models/llama3/parallelize_llama.py ``apply_ac`` then
``apply_compile``) the policy is not a cache: torch 2.13 torch/_higher_order_ops/wrap.py
``tag_activation_checkpoint_impl`` runs it while AOTAutograd traces the block and tags the joint graph's
nodes (``node.meta["recompute"]``), and the partitioner (torch/_functorch/partitioners.py
``min_cut_rematerialization_partition``) never saves a ``PREFER_RECOMPUTE`` node (``must_recompute``), never
recomputes a ``MUST_SAVE`` one, and saves of them only what the backward graph reads (directly or to
recompute what it reads). So a kept output that no backward reads is not kept: the MLP's output projection's
(the block's last Linear), whose output only joins the residual stream (the add's backward reads nothing),
unless a post-MLP norm reads it (:data:`~.norms.POST_MLP_NORM_MODULES`, Gemma 2's sandwich block). The
layer's input (a primal), the other kept matmul outputs (q: RoPE and SDPA's backward; v: SDPA's; gate: the
activation's; o_proj's: rebuilding the residual sum the second norm reads) and SDPA's outputs stay. Measured
by benchmarks/sac_compile_activations.py (torchtitan 775a486's policy on a Llama layer, torch 2.13
Inductor, bf16 and fp32, with and without SDPA's output kept): to the byte less one constant buffer of
5 kB per layer, where the eager policy keeps the down projection's output too.
"""

from __future__ import annotations

from peakmem.breakdown import Category, MemoryItem
from peakmem.errors import InputError
from peakmem.model import Layer, ModelSpec
from peakmem.training import AttentionKernel, KernelPolicy

from .float8 import converted
from .kernels import call_backend
from .norms import POST_MLP_NORM_MODULES
from .shapes import LayerActivations, Shapes, item, tensor_sizes, without

SRC_OP_SAC = (
    "torchtitan 1f029641b _op_sac_save_list / _apply_op_sac: mm outputs saved, every second one recomputed"
)
SRC_CHECKPOINT_INPUT = "torch.utils.checkpoint: only the block's inputs are saved"
SAVED_ATTENTION_KEYS = ("attn.sdpa_output", "attn.logsumexp")  # SDPA's outputs as attention_terms names them
SRC_COMPILED_OP_SAC = (
    "torch 2.13 _functorch/partitioners.py: a compiled op-SAC block saves the MUST_SAVE outputs its backward "
    "reads; measured by benchmarks/sac_compile_activations.py"
)


def op_saved_linears(layer: Layer, float8: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The Linears whose outputs the policy keeps: the odd positions among the layer's Linears that run
    ``mm`` (the bias-free ones, and ``float8``: the ones torchao converted, biased or not: a float8
    Linear's ``mm`` comes before its bias add, module doc), in the order the layer lists them (its
    forward order: attention, then MLP)."""
    biased = {t.name.rsplit(".", 1)[0] for t in layer.tensors if t.kind == "linear_bias"}
    weights = [t for t in layer.tensors if t.kind == "linear_weight"]
    ordered = [t for t in weights if t.component == "attention"] + [
        t for t in weights if t.component != "attention"
    ]
    names = [t.name.rsplit(".", 1)[0] for t in ordered]
    counted = [name for name in names if name not in biased or name in float8]
    return tuple(counted[0::2])  # the 1st, 3rd, ... matmul: mm_count odd


def unread_outputs(layer: Layer) -> frozenset[str]:
    """The Linears whose outputs a compiled block's backward never reads (module doc): the MLP's output
    projection (its last Linear in forward order), unless a post-MLP norm reads its output."""
    mlp = [t for t in layer.tensors if t.kind == "linear_weight" and t.component == "mlp"]
    if not mlp or any(t.kind == "norm" and t.module in POST_MLP_NORM_MODULES for t in layer.tensors):
        return frozenset()
    return frozenset({mlp[-1].name.rsplit(".", 1)[0]})


def float8_linears(spec: ModelSpec, layer: Layer) -> frozenset[str]:
    """The layer's Linears torchao's float8 conversion swaps (float8.py ``converted``), by module name."""
    return frozenset(t.name.rsplit(".", 1)[0] for t in layer.tensors if converted(spec, t))


def check_op_sac(spec: ModelSpec, layer: Layer, adapter: bool, tp: int) -> None:
    """An InputError where the layer's matmuls are not the dense Linears modelled above."""
    why = ""
    if layer.derived is not None:
        why = f"{spec.name}'s blocks are measured, not built from Linears"
    elif layer.mlp.is_moe:
        why = "MoE experts' matmuls depend on the routing"
    elif layer.attention.is_mla:
        why = "MLA's latent projections are not modelled"
    elif adapter:
        why = "LoRA adapters add matmuls of their own to the count"
    elif tp > 1:
        why = "tensor-parallel matmuls run on DTensors"
    if why:
        raise InputError(
            f"checkpointing='op': not modelled for this job ({why}); use selective, full or every-N"
        )


def op_saved(
    spec: ModelSpec, layer: Layer, sh: Shapes, la: LayerActivations, *, float8: bool = False
) -> tuple[MemoryItem, ...]:
    """The tensors one layer keeps between its forward and backward under the op policy; ``float8``: its
    Linears converted to torchao float8 Linears (``--precision float8-*``), whose biased ones count too.
    Compiled (``sh.compiled``): less the outputs no backward reads (:func:`unread_outputs`)."""
    t = sh.tokens
    width = {t_.name.rsplit(".", 1)[0]: t_.shape[0] for t_ in layer.tensors if t_.kind == "linear_weight"}
    kept = [MemoryItem(path="layer input (checkpoint)", category=Category.ACTIVATIONS, bytes=la.layer_input,
                       source=SRC_CHECKPOINT_INPUT, key="checkpoint.layer_input")]  # fmt: skip
    unread = unread_outputs(layer) if sh.compiled else frozenset()  # SRC_COMPILED_OP_SAC
    for name in op_saved_linears(layer, float8_linears(spec, layer) if float8 else frozenset()):
        if name in unread:
            continue
        leaf = name.rsplit(".", 1)[-1]
        src = SRC_COMPILED_OP_SAC if sh.compiled else SRC_OP_SAC
        kept.append(item(f"{leaf} output (op SAC: saved mm)", t * width[name] * sh.c, src, f"op_sac.{leaf}"))
    att = layer.attention
    if (
        sh.kernel is AttentionKernel.SDPA
        and sh.policy is KernelPolicy.CUDA
        and call_backend(spec, att, sh.profile, half=sh.c < 4, seq=sh.seq)[0] in ("flash", "efficient")
    ):
        kept.extend(i for i in la.saved if i.key in SAVED_ATTENTION_KEYS)
    return tuple(i for i in kept if i.bytes)


def op_checkpointed(la: LayerActivations, kept: tuple[MemoryItem, ...]) -> LayerActivations:
    """The layer under the op policy: ``kept`` saved; in backward its recomputation rebuilds the rest of
    what the layer saves (as full checkpointing does, less what the cache already holds)."""
    kept_bytes = sum(i.bytes for i in kept)
    rebuilt = la.saved_bytes - la.input_saved - (kept_bytes - la.layer_input)
    # at their sizes: the layer's saved tensors less its input and one tensor of each kept output's size
    # (a kept output is one of the tensors the layer saves: gate, q, SDPA's output; or one of their size)
    outputs = [i for i in kept if i.key != "checkpoint.layer_input"]
    gone = (*((la.input_saved,) if la.input_saved else ()), *tensor_sizes(outputs))
    backward = (*la.backward_sizes, la.mask_arg) if la.mask_arg and la.backward_sizes else la.backward_sizes
    return LayerActivations(
        saved=kept, core=0, layer_input=la.layer_input, forward_transient=la.interior,
        backward_transient=la.backward_transient + la.mask_arg, recompute=max(0, rebuilt),
        interior=la.interior, backward_freed=la.backward_freed, backward_grads=la.backward_grads,
        forward_sizes=la.interior_sizes, recompute_sizes=without(tensor_sizes(la.saved), gone),
        backward_sizes=backward, interior_sizes=la.interior_sizes,
    )  # fmt: skip
