"""One layer's saved tensors and transients (norms, projection inputs, attention, MLP), the embeddings'
and what checkpointing keeps.

* projection inputs: the norm output once (c) - or, under autocast, one 16-bit cast per Linear
  that reads it (autocast caches casts of leaf weights only, so q/k/v each cast their input), plus
  the 16-bit cast of every weight (the autocast weight cache, freed layer by layer in backward).

Checkpointing: ``full`` keeps only each layer's input (``torch.utils.checkpoint``) and rebuilds one
layer's activations during backward; ``selective`` (Korthikanti et al. 2022, arXiv 2205.05198
§4.2) drops the attention core (scores, softmax, dropout) and recomputes it in backward.
"""

from __future__ import annotations

from peakmem import dtypes
from peakmem.breakdown import Category, MemoryItem
from peakmem.errors import ConfigError
from peakmem.model import DECODER_TASKS, Layer, ModelSpec
from peakmem.training import AttentionKernel, Checkpointing

from .attention import attention_terms, padding_bool_mask
from .expert_loop import expert_rows, loop_backward, loop_interior
from .fused import compiled_layer_input
from .kernels import MATH
from .mlp import interior_bytes, mlp_terms, moe_weighting_backward, routed_width_bytes
from .norms import (
    SRC_NORM,
    norm_pieces,
    norm_saved,
    post_mlp_norm_backward,
    pre_mlp_norm_stage,
    qk_norm_item,
    rmsnorm_weight_side_bytes,
)
from .shapes import (
    SRC_DROPOUT,
    SRC_WEIGHT_CAST,
    LayerActivations,
    NormStage,
    Shapes,
    dropout_mask_bytes,
    item,
    sized,
    tensor_sizes,
    without,
)
from .structure import compiled_block, layer_structure, mlp_input_readers

MLP_COMPONENTS = ("mlp", "experts", "shared_experts", "router")
SRC_LINEAR = "aten linear/addmm saves its input (and the 16-bit weight cast under autocast)"


def input_saved_by_layer(spec: ModelSpec, sh: Shapes) -> int:
    """Bytes of a layer's saved tensors that are its input tensor itself, not a copy: a pre-norm
    block's first norm saves its input (aten ``native_layer_norm``; ``LlamaRMSNorm``'s
    ``x.to(float32)`` is a no-op on an fp32 residual stream, a new tensor on a 16-bit one); a
    post-norm encoder's q/k/v Linears save it unless autocast casts it (modeling_bert.py)."""
    t, h = sh.tokens, spec.hidden_size
    if spec.post_norm:
        return 0 if sh.plan.autocast else t * h * sh.c
    if spec.norm == "rmsnorm" and (sh.compiled or sh.fused_kernels):
        return t * h * sh.r  # the fused / compiled norm keeps its input itself
    if (spec.norm == "rmsnorm" or spec.layernorm_fp32) and sh.r != 4:
        return 0  # the norm saves an fp32 copy of a 16-bit residual, not the residual itself
    return t * h * sh.r


def layer_end_forward(spec: ModelSpec, sh: Shapes) -> tuple[int, ...]:
    """The tensors a plain pre-norm block holds beyond its saved ones at the end of its forward, its last
    residual add (modeling_llama.py ``LlamaDecoderLayer.forward``: ``hidden_states = residual +
    hidden_states``): the MLP's output (compute dtype) and the new hidden states (residual dtype), which
    the next norm saves only later (the final norm's input is the head's). Where the norms save an fp32
    copy of a 16-bit residual stream rather than the stream itself (:func:`input_saved_by_layer` 0), two
    hidden states nothing saves are alive too: the layer's input, which the decoder's loop holds until the
    layer returns, and the attention half's residual sum. Measured with the parallel oracle
    (peakmem.measure.parallel, FSDP2 mixed-bf16, a narrow MLP and a 64-token vocabulary so that the last
    layer's end is the forward peak: fsdp4 -5.3% without them, fp32 -4.8%)."""
    t, h = sh.tokens, spec.hidden_size
    unsaved = 0 if input_saved_by_layer(spec, sh) else 2
    return (t * h * sh.c, *(t * h * sh.r,) * (1 + unsaved))


SRC_FLOAT_MASK = "transformers 4.30-4.52 _update_causal_mask: additive 4-D mask where the batch is padded"


def causal_mask_bytes(spec: ModelSpec, sh: Shapes) -> int:
    """The 4-D causal mask a decoder builds once per forward and passes to every layer:
    ``create_causal_mask`` (transformers/masking_utils.py) materialises B x 1 x s x s in the model's
    dtype for eager attention; for SDPA it returns None and the kernel runs ``is_causal``."""
    eager = sh.kernel is AttentionKernel.EAGER and not sh.kernel_note.startswith(MATH)
    if spec.task not in DECODER_TASKS:
        return 0
    if not eager:
        # a batch with padding hands SDPA masking_utils' boolean mask (transformers 4.53.0 on,
        # ``Profile.padding_mask``; measured: tiny Llama, 5.23, benchmarks/sdpa_repeat_kv.py); before 4.53 an
        # additive one that SDPA saves, alive through the step (:func:`padding_mask_items`)
        if not padding_bool_mask(sh):
            return 0
        return dtypes.BOOL.nbytes(sh.batch * sh.seq * sh.seq)
    # one mask per kind of layer: a model mixing full and sliding-window layers builds both
    # (modeling_gemma2.py Gemma2Model.forward ``causal_mask_mapping``; Qwen2/3 when ``has_sliding_layers``);
    # all-sliding Mistral builds its sliding mask only
    kinds = len({g.layer.attention.sliding_window is None for g in spec.groups})
    return kinds * sh.batch * sh.seq * sh.seq * (sh.plan.weight.bits // 8)


def linear_inputs(sh: Shapes, numel: int, readers: int) -> int:
    """Inputs saved by ``readers`` Linears that read one residual-dtype tensor of ``numel``: under autocast,
    one 16-bit cast per Linear call, or the tensor itself when it is already 16-bit (a QLoRA base loaded in
    bf16 without k-bit preparation; torch 2.13 aten/src/ATen/autocast_mode.h cached_cast passes a tensor
    already in the autocast dtype through)."""
    if sh.plan.autocast and sh.r != sh.c:
        return readers * numel * sh.c  # one 16-bit cast per Linear call
    return numel * sh.c


def layer_activations(
    spec: ModelSpec,
    layer: Layer,
    sh: Shapes,
    grad_bytes: int = 0,
    *,
    mlp_params: int | None = None,
    linear_params: int | None = None,
    layer_params: int | None = None,
) -> LayerActivations:
    """``grad_bytes``: bytes of this layer's weight gradients (written during its backward);
    ``mlp_params``/``linear_params``: precomputed sums over the layer's tensors (or computed here)."""
    if layer.derived is not None:
        return derived_activations(spec, layer, sh, grad_bytes)
    if mlp_params is None:
        mlp_params = sum(t.numel for t in layer.tensors if t.component in MLP_COMPONENTS)
    if linear_params is None:
        linear_params = sum(t.numel for t in layer.tensors if t.kind in ("linear_weight", "expert_weight"))
    h, t, c, r = spec.hidden_size, sh.tokens, sh.c, sh.r
    items: list[MemoryItem] = []
    compiled = compiled_block(spec, layer, sh)
    # each norm's saved tensors; compiled: each block norm keeps its statistics only (RMSNorm its fp32
    # rstd, LayerNorm its mean and rstd: see SRC_COMPILED)
    pieces = norm_pieces(spec, sh, h)
    norm_each = pieces[1:] if compiled else pieces
    norm_one = sum(norm_each)
    n_norms, att_readers, att_in_params = layer_structure(layer, sh.memo)
    norms = norm_each * n_norms
    if layer.parallel_residual and n_norms == 2 and spec.norm == "layernorm" and not spec.layernorm_fp32:
        # GPT-NeoX's parallel block (modeling_gpt_neox.py: ``input_layernorm(hidden_states)`` and
        # ``post_attention_layernorm(hidden_states)``), Falcon-40B's ln_attn / ln_mlp: both LayerNorms save
        # the same block input, one storage
        norms = norm_each + norm_each[1:]
    items.append(sized(f"norms (input + stats) x{n_norms}", norms, SRC_NORM, "norms"))
    att = layer.attention
    if att.qk_norm != "none":  # Qwen3/OLMo-2: RMSNorm over q and k (per head or full width)
        items.append(qk_norm_item(spec, layer, sh))
    att_in = linear_inputs(sh, t * h, att_readers)
    mlp_in = linear_inputs(sh, t * h, mlp_input_readers(layer))
    if compiled:
        # one 16-bit copy of each norm output (autocast's per-Linear casts are one node in the graph),
        # and the layer's input itself, which the compiled graph keeps for the first norm's backward
        att_in = mlp_in = t * h * c
        items.append(compiled_layer_input(sh, t * h))
    if layer.parallel_residual and n_norms == 1 and not sh.plan.autocast:
        # Falcon-7B: attention and MLP read the same norm output: one saved tensor
        items.append(item("attn+mlp input (one shared norm output)", att_in, SRC_LINEAR, "input.attn_mlp"))
    else:
        casts = sh.plan.autocast and not compiled  # one 16-bit cast per Linear that reads it
        items.append(item("attn input (norm output)", att_in, SRC_LINEAR, "input.attn",
                           att_readers if casts else 1))  # fmt: skip
        items.append(item("mlp input (norm output)", mlp_in, SRC_LINEAR, "input.mlp",
                           mlp_input_readers(layer) if casts else 1))  # fmt: skip
    att_items, core, att_fwd, att_bwd, att_bwd_sizes = attention_terms(spec, layer, sh)
    items.extend(att_items)
    mlp_items, mlp_bwd = mlp_terms(spec, layer, sh)
    items.extend(mlp_items)
    if sh.plan.autocast:
        n_casts = sum(t.copies for t in layer.tensors if t.kind in ("linear_weight", "expert_weight"))
        items.append(item("autocast weight casts (16-bit copies)", linear_params * c,
                           SRC_WEIGHT_CAST, "autocast.weight_casts", max(1, n_casts)))  # fmt: skip
    mask = dropout_mask_bytes(t * h, c, sh.policy, sh.compiled) if spec.hidden_dropout > 0 else 0
    if mask:
        items.append(item("residual dropout masks x2", 2 * mask, SRC_DROPOUT, "dropout.residual_masks", 2))
    saved = tuple([i for i in items if i.bytes])
    mlp_items_bytes = sum([i.bytes for i in mlp_items])
    # Backward runs the MLP half first, then attention; the MLP's saved tensors are freed in between.
    # Next to the saved tensors: the incoming gradient, the largest intermediate gradients, and the
    # weight gradients written so far (the MLP's output projection first: 1/3 of a gated MLP's
    # weights, 1/2 of a plain one). In the MLP half the residual gradient is the incoming one
    # (``AddBackward`` passes the same tensor to both branches: one T x h), and the MLP's output
    # dropout has already run its backward (its mask freed) - measured with the tracker on CPU.
    mlp_saved = mlp_in + mlp_items_bytes + norm_one * n_norms // 2 + mask
    total = layer_params if layer_params is not None else layer.params
    share = mlp_params / total if total else 0.0
    mlp_grads = int(grad_bytes * share) // (3 if layer.mlp.gated else 2)
    # (net bytes above the layer's saved tensors, saved bytes already freed, weight grads written)
    mlp_out_in = routed_width_bytes(spec, layer, sh)  # the output projection's input, freed first
    mlp_stage = (mlp_bwd + t * h * r + mlp_grads - mask, mlp_out_in + mask, mlp_grads)
    # its temporaries (net + freed - grads): the incoming T x h gradient, the down projection's input
    # gradient, then the activation's T x width gradients (backward_gradients_alive of them)
    alive = mlp_bwd // mlp_out_in if mlp_out_in and mlp_bwd % mlp_out_in == 0 else 0
    mlp_sizes = (t * h * r, mlp_out_in, *(mlp_out_in,) * alive)
    loop = layer.mlp.is_moe and sh.expert_loop  # transformers 4.x's per-expert loop (expert_loop.py)
    if loop:
        mlp_stage, mlp_sizes = _loop_stage(spec, layer, sh, grad_bytes, total)
    # At the attention core's backward: the incoming gradient and o_proj's input gradient (heads x
    # v_head_dim wide: wider than h for Qwen3). The output projection and the residual dropout after it
    # have run their backward (the dropout's mask freed), and so has, in a post-norm block (BERT), the
    # norm after the attention's residual sum (its saved input freed); q, k and v have not: their weight
    # gradients come after the core's. Measured under the simulator (tiny BERT, the top layer's SDPA
    # backward: 76 kB of those three above its peak, 2.6%).
    att_out = t * layer.attention.num_heads * layer.attention.v_head_dim * c
    att_grads = grad_bytes - int(grad_bytes * att_in_params / total) if total else grad_bytes
    att_freed = mlp_saved + mask + (norm_one if spec.post_norm and n_norms == 2 else 0)
    att_stage = (att_bwd + t * h * c + att_out + att_grads - att_freed, att_freed, att_grads)
    att_sizes = (t * h * c, att_out, *att_bwd_sizes)  # the incoming gradient, o_proj's input gradient, dq..
    stage = max(mlp_stage, att_stage)
    pre_norm_block = n_norms == 2 and not (spec.post_norm or layer.parallel_residual or compiled)
    mlp_all_grads = int(grad_bytes * share)
    norm = (
        pre_mlp_norm_stage(spec, sh, mlp_in, mlp_items_bytes + mask, mlp_all_grads)
        if pre_norm_block
        else NormStage()
    )
    norm_at = norm.stage()
    stage = max(stage, norm_at)
    post_norm = post_mlp_norm_backward(spec, layer, sh)
    if post_norm:  # the block's last norm runs its backward first (its weight-side y freed by then)
        y = rmsnorm_weight_side_bytes(spec, sh, h)
        stage = max(stage, (post_norm - y, y, 0))
    if layer.mlp.is_moe and not loop:
        stage = max(stage, _moe_stage(spec, layer, sh, grad_bytes, total, mlp_in))
    # forward: the attention's momentary extra (QK^T and its scaled copy) comes before the rest of
    # the layer's saved tensors exist, so only what exceeds them adds to the end-of-forward total
    att_rest = core + mlp_items_bytes + mlp_in + norm_one * n_norms // 2 + mask
    end = layer_end_forward(spec, sh) if pre_norm_block else ()
    core_sizes = tensor_sizes(i for i in att_items if i.key in CORE_KEYS or i.key in CORE_EXTRA_KEYS)
    loop_sizes = loop_interior(spec, layer, sh, interior_bytes(layer.mlp, sh)) if loop else ()
    mlp_sizes_fwd = loop_sizes if loop else tensor_sizes(mlp_items)
    larger = core_sizes if core > sum(mlp_sizes_fwd) else mlp_sizes_fwd
    # the stage's temporaries where it is one of the two above (a post-norm's or an MoE's: their sum only)
    bwd_sizes = mlp_sizes if stage == mlp_stage else att_sizes if stage == att_stage else ()
    if norm.sizes and stage == norm_at:
        bwd_sizes = norm.sizes
    return LayerActivations(
        saved=saved, core=core, layer_input=t * h * r, forward_transient=max(0, att_fwd - att_rest, sum(end)),
        forward_sizes=end if sum(end) > att_fwd - att_rest else (),
        forward_headroom=max(0, att_rest - att_fwd), forward_core=max(0, att_fwd - att_rest),
        backward_transient=stage[0], backward_freed=stage[1], backward_grads=stage[2],
        interior=max(core, sum(loop_sizes) if loop else mlp_items_bytes) + t * h * c,
        input_saved=input_saved_by_layer(spec, sh), mask_arg=causal_mask_bytes(spec, sh),
        backward_stages=(mlp_stage, att_stage), backward_sizes=bwd_sizes, norm_stage=norm,
        interior_sizes=(t * h * c, *larger),
    )  # fmt: skip


def _moe_stage(
    spec: ModelSpec, layer: Layer, sh: Shapes, grad_bytes: int, layer_params: int, mlp_in: int
) -> tuple[int, int, int]:
    """An MoE layer's backward at its routed experts' output (:func:`moe_weighting_backward`): (net bytes
    above the layer's saved tensors, saved bytes already freed, weight gradients written). Where the
    shared experts run after the routed ones in forward (DeepSeek: ``hidden + shared_experts(residuals)``)
    their backward has run: their saved interior is freed and their weight gradients written, and so is
    the MLP input when only they read it (the router reads its own fp32 copy, the experts gather rows)."""
    mlp, t, h = layer.mlp, sh.tokens, spec.hidden_size
    freed = grads = 0
    if mlp.shared_after_routed and mlp.shared_intermediate_size:
        freed = 4 * t * mlp.shared_intermediate_size * sh.c
        if mlp.router_fp32 and sh.c != 4 and not sh.plan.autocast and not mlp.shared_gate:
            freed += mlp_in
        shared = sum(x.numel for x in layer.tensors if x.component == "shared_experts")
        grads = int(grad_bytes * shared / layer_params) if layer_params else 0
    net = moe_weighting_backward(spec, mlp, sh) + t * h * sh.r + grads - freed
    return net, freed, grads


def _loop_stage(
    spec: ModelSpec, layer: Layer, sh: Shapes, grad_bytes: int, layer_params: int
) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """The MLP half's backward stage under transformers 4.x's expert loop (:func:`.expert_loop.loop_backward`:
    one expert's rows; its down projection's weight gradient written, a layer's share of ``grad_bytes``) and
    its temporaries at their sizes."""
    mlp, t = layer.mlp, sh.tokens
    m = interior_bytes(mlp, sh)
    down = spec.hidden_size * mlp.intermediate_size
    grads = int(grad_bytes * down / layer_params) if layer_params else 0
    stage = loop_backward(spec, layer, sh, m, grads)
    n_i = expert_rows(mlp, t) * mlp.intermediate_size * m
    return stage, (t * spec.hidden_size * sh.r, n_i, n_i, n_i, t * mlp.experts_per_token * sh.r)


SRC_DERIVED = (
    "measured: the block's saved and transient bytes in a fake-tensor training step of transformers' "
    "model at 3 small shapes, fitted per token, per sequence squared and constant (peakmem.simulate.derive)"
)


def derived_activations(spec: ModelSpec, layer: Layer, sh: Shapes, grad_bytes: int = 0) -> LayerActivations:
    """A derived block's activations: its measured costs (``sh.costs``, the lookup the estimator's caller
    handed in) at the setup's shape.
    Its backward peak is the measured instant with the most bytes once its weight gradients written by
    then are counted (``grad_bytes``, as many as the method trains, times the share measured written at
    that instant: an MoE block's peak at its experts' output gradients comes before any of its weight
    gradients exist, an attention block's after its MLP's)."""
    assert layer.derived is not None
    if sh.costs is None:
        raise ConfigError(f"{spec.name}: a derived spec's block costs need a cost lookup (shapes(costs=...))")
    cost = sh.costs(spec, sh.family, layer.derived.key)
    b, s, t = sh.batch, sh.seq, sh.tokens
    layer_input = t * spec.hidden_size * sh.r
    saved = bwd = fwd = freed = grads = 0
    kept = None
    if cost is not None:
        at = cost.at(b, s, grad_bytes)
        kept = at.output_kept
        saved, fwd, bwd, freed, grads = (at.saved, at.forward_transient, at.backward_transient, at.freed,
                                         at.grads_in_flight)  # fmt: skip
    what = layer.derived.mixer + ("" if layer.derived.ffn == "none" else f" + {layer.derived.ffn} ffn")
    items = (item(f"{what} block (measured)", saved, SRC_DERIVED, "derived.saved"),) if saved else ()
    # of its saved bytes, its output kept by what follows and alive when its backward starts: under
    # checkpointing its recomputation does not rebuild it (the next block's kept input). What of the output
    # the next block's backward frees before (its Linears' saved input) is in the measured transients, net:
    # the recomputation must rebuild it for them to add up. Measured; costs before it: one layer input
    input_saved = kept if kept is not None else min(saved, layer_input)
    return LayerActivations(
        saved=items, core=0, layer_input=layer_input, forward_transient=fwd,
        backward_transient=bwd, backward_freed=freed, backward_grads=grads,
        interior=saved + fwd, input_saved=input_saved, mask_arg=causal_mask_bytes(spec, sh),
    )  # fmt: skip


# A gated MLP's unfused interior (mlp_terms): gate, act(gate), up and their product, 4 equal tensors.
GATED_MLP_TENSORS = 4


def full_ac_forward(la: LayerActivations, out: int, copy: int, held: int) -> int:
    """The forward transient of a fully checkpointed layer whose gated MLP runs as transformers' eager
    module (modeling_llama.py ``LlamaMLP.forward``: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``),
    beyond ``copy`` (the output projection's collective copy, :func:`peakmem.formulas.model_parallel
    .dtensor_rowwise_copy`, which the estimator adds to every layer's forward): the larger of two
    instants. With nothing saved (non-reentrant checkpointing packs no tensor, torch/utils/checkpoint.py
    ``_checkpoint_hook``) ``gate_proj(x)`` is freed once ``act_fn`` returned, so at the product its
    input ``x``, act(gate), up and the product live (3 of the 4 tensors the unfused item counts); at the
    down projection's output ``x``, the product and that output (``out``: ``T x h``, the whole partial
    sum under TP) live, next to the collective's copy. At both, ``held``: the block's residual stream
    (``residual = hidden_states`` before the MLP's norm, modeling_llama.py ``LlamaDecoderLayer``) and,
    under PyTorch's SP, the norm's output shard the MLP's input was all-gathered from. ``la``: the layer
    before checkpointing (after the TP split); its interior when the MLP is not the unfused gated one.
    Measured with the parallel oracle (peakmem.measure.parallel_ac): tiny Llama under full AC, pp2 first
    stage forward +4.4%, tp2+sp x fsdp2 +3.5% with the gate counted; the 70B-ratio model at tp8+sp
    (512 vocab) -6.8% without the output instant, -4.5% without ``held``."""
    return full_ac_forward_sizes(la, out, copy, held)[0]


def full_ac_forward_sizes(
    la: LayerActivations, out: int, copy: int, held: int
) -> tuple[int, tuple[int, ...]]:
    """:func:`full_ac_forward` and its tensors at their sizes (() where ``copy``, the collective's copy
    the estimator adds apart, is in the instant): at the product ``held``, ``x`` and act(gate), up and
    the product (or the attention core, when larger); at the down projection's output ``held``, ``x``,
    the product and that output."""
    mlp = [i for i in la.saved if i.key == "mlp.interior"]
    loop = any(i.key == "moe.loop_indices" for i in la.saved)  # 4.x's expert loop: its own interior
    if len(mlp) != 1 or mlp[0].tensors != GATED_MLP_TENSORS or loop:
        return la.interior, la.interior_sizes
    whole, one = mlp[0].bytes, mlp[0].bytes // GATED_MLP_TENSORS
    x = max(0, la.interior - max(la.core, whole))  # the Linears' input, next to the larger interior
    at_product = held + x + max(la.core, whole - one)
    at_output = held + x + one + out + copy
    if at_output >= at_product:
        return at_output - copy, (held, x, one, out)
    core = la.interior_sizes[2:] if la.core > whole - one and la.interior_sizes[:1] == (x,) else ()
    return at_product - copy, () if copy else (held, x, *(core or (one,) * (GATED_MLP_TENSORS - 1)))


def checkpointed(
    la: LayerActivations,
    mode: Checkpointing,
    *,
    eager_mlp: bool = False,
    out: int = 0,
    copy: int = 0,
    held: int = 0,
) -> LayerActivations:
    """What stays saved between forward and backward under each checkpointing mode. ``eager_mlp``: the
    MLP runs as transformers' eager module (no LoRA, no float8, no fused kernel): its forward under full
    checkpointing is :func:`full_ac_forward` (``out``, ``copy``, ``held``: its arguments)."""
    if mode is Checkpointing.NONE:
        return la
    # the recomputation rebuilds the layer's saved tensors but its input, which stays kept
    rebuilt = without(tensor_sizes(la.saved), (la.input_saved,) if la.input_saved else ())
    backward = (*la.backward_sizes, la.mask_arg) if la.mask_arg and la.backward_sizes else la.backward_sizes
    if mode is Checkpointing.FULL:
        forward, forward_sizes = full_ac_forward_sizes(la, out, copy, held) if eager_mlp else (
            la.interior, la.interior_sizes)  # fmt: skip
        keep = (MemoryItem(path="layer input (checkpoint)", category=Category.ACTIVATIONS,
                           bytes=la.layer_input,
                           source="torch.utils.checkpoint: only the block's inputs are saved",
                           key="checkpoint.layer_input"),)  # fmt: skip
        # forward runs each layer without keeping its tensors: what lives mid-layer is transient;
        # the recomputation saves the layer's tensors again, its (kept) input not twice. Non-reentrant
        # checkpointing keeps each layer's arguments for its recomputation (torch/utils/checkpoint.py
        # ``_checkpoint_without_reentrant_generator``), so the attention mask outlives the forward
        # until the first layer's recomputation: a temporary next to every layer's backward.
        return LayerActivations(
            saved=keep, core=0, layer_input=la.layer_input, forward_transient=forward,
            backward_transient=la.backward_transient + la.mask_arg, recompute=la.saved_bytes - la.input_saved,
            interior=la.interior, backward_freed=la.backward_freed, backward_grads=la.backward_grads,
            forward_sizes=forward_sizes, recompute_sizes=rebuilt, backward_sizes=backward,
            interior_sizes=la.interior_sizes,
        )  # fmt: skip
    kept = tuple(i for i in la.saved if not _is_core(i))
    return LayerActivations(
        saved=kept, core=0, layer_input=la.layer_input, forward_transient=la.forward_transient,
        backward_transient=la.backward_transient, recompute=la.core,
        backward_freed=la.backward_freed, backward_grads=la.backward_grads,
        forward_sizes=la.forward_sizes, recompute_sizes=tensor_sizes(i for i in la.saved if _is_core(i)),
        backward_sizes=la.backward_sizes,
    )  # fmt: skip


# The attention core's saved tensors (what selective checkpointing drops and recomputes).
CORE_KEYS = frozenset({"attn.softmax", "attn.probs", "attn.dropout", "attn.dropout_mask", "attn.clamp"})
# of the attention core's bytes (``attention_terms``), the tensors selective checkpointing keeps
CORE_EXTRA_KEYS = frozenset({"attn.softcap", "attn.logsumexp"})


def _is_core(item: MemoryItem) -> bool:
    return item.key in CORE_KEYS


def padding_mask_items(spec: ModelSpec, sh: Shapes) -> tuple[MemoryItem, ...]:
    """Before transformers 4.53 a padded batch's SDPA mask (``Profile.float_padding_mask``): one B x 1 x s x s
    additive mask in the model's dtype (4.52.1 modeling_llama.py ``_update_causal_mask``, min_dtype where
    masked) handed to every layer and saved by each SDPA call (no checkpointing) or each checkpoint
    (full): one tensor alive through the step (measured: tiny Llama, 4.48.1, +1.05 MB at 2 x 512 bf16 with
    and without checkpointing, benchmarks/sdpa_repeat_kv.py)."""
    if (
        spec.task not in DECODER_TASKS
        or sh.kernel is not AttentionKernel.SDPA
        or not sh.profile.float_padding_mask
    ):
        return ()
    mask = sh.plan.weight.nbytes(sh.batch * sh.seq * sh.seq)
    return (item("padded batch's additive SDPA mask", mask, SRC_FLOAT_MASK, "embed.padding_mask"),)


def embedding_items(spec: ModelSpec, sh: Shapes) -> tuple[MemoryItem, ...]:
    """Before the first layer: token ids (int64, kept by embedding backward), embedding dropout,
    BERT-style embedding LayerNorm, and RoPE cos/sin (B x s x d, shared by all layers)."""
    t, h = sh.tokens, spec.hidden_size
    items = [item("input_ids (int64)", t * 8, "aten embedding_backward keeps indices", "embed.input_ids")]
    if spec.embedding_norm:
        items.append(
            item("embeddings.LayerNorm (input + stats)", norm_saved(spec, sh, h), SRC_NORM, "embed.norm")
        )
    if spec.embedding_dropout > 0:
        items.append(
            item(
                "embeddings.dropout mask",
                dropout_mask_bytes(t * h, sh.r, sh.policy, sh.compiled),
                SRC_DROPOUT,
                "embed.dropout_mask",
            )
        )
    items.extend(padding_mask_items(spec, sh))
    if spec.position == "rope" and not sh.profile.rope_cache_at_seq:  # Lit-GPT slices its cached buffers
        d = spec.first_layer.attention.head_dim
        # cos/sin follow position_ids (1 x seq), in the dtype of the hidden states
        items.append(
            item(
                "rotary cos/sin",
                2 * sh.seq * d * sh.r,
                "transformers RotaryEmbedding: cos, sin",
                "embed.rotary",
            )
        )
    return tuple(i for i in items if i.bytes)
