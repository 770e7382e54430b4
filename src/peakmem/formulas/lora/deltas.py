"""What the adapters change in the base's activations (base formulas: :mod:`peakmem.formulas.activations`).

peft ``lora.Linear.forward``: ``result = base_layer(x)``; ``x = x.to(lora_A.weight.dtype)``
(a new tensor per adapted module when the dtypes differ); ``lora_B(lora_A(dropout(x))) * scaling``
added to ``result``; ``result.to(result_dtype)``. Autograd saves (aten derivatives.yaml: ``mm`` keeps
``mat1`` only when ``mat2`` requires grad): lora_A's input (the cast, or the dropout output plus its
mask), lora_A's output (T x r) for lora_B. The frozen base no longer keeps what only its weight
gradients needed: Linear inputs, the RMSNorm output that multiplies the norm weight, the LM head input.
A quantized base's Linears that keep their input themselves (LLM.int8; 4-bit before bitsandbytes 0.43.2:
:func:`base_keeps_input`) keep those Linear inputs, where the input requires grad.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from peakmem import dtypes
from peakmem.adapters import LoraConfig, QuantConfig, lora_of, measured_lora, quant_of
from peakmem.bnb_versions import BNB_CURRENT, release_facts
from peakmem.breakdown import Category, MemoryItem
from peakmem.model import Layer, ModelSpec
from peakmem.peft_versions import PEFT_CURRENT, PeftRelease
from peakmem.peft_versions import release_facts as peft_facts

from ..activations import (
    LayerActivations,
    Shapes,
    block_norm_count,
    down_input_bytes,
    interior_bytes,
    norm_saved,
    post_mlp_norm_backward,
    qk_norm_width,
    rmsnorm_weight_side_bytes,
)
from ..kbit_prep import head_dtype
from ..loss import HeadActivations
from ..memo import Memo
from ..model_states import precision_plan, spec_facts
from ..qlora import autocast_cast_params, dequant_temporaries
from .param_wrapper import uses_factors, wrapper_costs
from .params import SRC_LORA, is_adapter_method, train_dtype
from .targets import (
    V4_DEFAULT_EXPERT_LEAVES,
    V4_EXPERT_LEAVES,
    AdaptedModule,
    embeddings_adapted,
    resolve_targets,
)

SRC_SAVE = "aten mm/addmm save mat1 only when the weight requires grad (derivatives.yaml)"


# --- activations ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AdapterActivations:
    """Per layer of a group: what the adapters add, and what the frozen base stops saving."""

    saved: tuple[MemoryItem, ...]  # added by the adapter path
    removed: int  # bytes full fine-tuning saves only for the frozen weights' gradients
    forward_transient: int  # the largest adapter temporary in forward (B output, sum, cast back)


def _act(path: str, nbytes: int, source: str, key: str) -> MemoryItem:
    return MemoryItem(path=path, category=Category.ACTIVATIONS, bytes=nbytes, source=source, key=key)


SRC_PARAM_WRAPPER = (
    "peft/tuners/lora/layer.py ParamWrapper._activate_lora: the parameter becomes W + scaling * lhs @ rhs "
    "(_LoraFactorsProxy: one baddbmm over the factors cast to W's dtype, when E > 1; else "
    "_LoraParameterProxy: W + delta), which its consumer (grouped_mm, F.linear) saves for the input gradient"
)


def param_wrapper_saved(
    m: AdaptedModule,
    lora: LoraConfig,
    param_bytes: int,
    a_bytes: int,
    *,
    merged_saved: bool = True,
    factors: bool = True,
) -> int:
    """What an adapted bare parameter (peft ``ParamWrapper``, ``target_parameters``) keeps per forward:
    the merged weight ``W + scaling * B A`` (the parameter's size and dtype: its consumer saves it), and,
    for a 3-D expert stack (``_LoraFactorsProxy``'s ``baddbmm``), the two factors cast to the parameter's
    dtype when the adapter's differs (``baddbmm`` saves both; ``factors`` False: peft before 0.21 forms a
    delta instead, :mod:`.param_wrapper`). Nothing per token: the adapter never sees the input
    (:data:`SRC_PARAM_WRAPPER`)."""
    merged = m.experts * m.in_features * m.out_features * param_bytes if merged_saved else 0
    rr = lora.rank * m.experts * m.rank_factor
    cast = factors and m.experts > 1 and a_bytes != param_bytes
    casts = rr * (m.in_features + m.out_features) * param_bytes if cast else 0
    return merged + casts


def adapter_saved_per_module(
    m: AdaptedModule,
    lora: LoraConfig,
    *,
    tokens: int,
    x_bytes: int,
    a_bytes: int,
    cuda: bool,
    autocast_bytes: int = 0,
    param_bytes: int = 0,
    merged_saved: bool = True,
    factors: bool = True,
    peft_cast: bool = True,
) -> tuple[int, int]:
    """(bytes lora_A's input costs beyond the shared x, bytes of the other saved adapter tensors).

    ``x_bytes``: element size of the module input; ``a_bytes``: of the adapter weights;
    ``autocast_bytes``: under torch autocast the 16-bit compute size (the adapter matmuls run on casts).
    ``param_bytes``: element size of an adapted bare parameter (``target_parameters``; ``x_bytes`` when 0);
    ``merged_saved``: whether its consumer saves the merged weight itself (False: DeepSeek's router saves
    an fp32 copy of it instead, counted with the router); ``peft_cast``: whether peft casts the input to
    the adapter dtype (its bitsandbytes Linears do not under autocast: :data:`SRC_KEEPS_INPUT`).
    """
    if m.kind in ("saved", "embedding"):
        return 0, 0
    r, t, n_in, n_out = lora.rank * m.experts * m.rank_factor, tokens, m.in_features, m.out_features
    if m.kind == "param":
        return 0, param_wrapper_saved(
            m, lora, param_bytes or x_bytes, a_bytes, merged_saved=merged_saved, factors=factors
        )
    lin = autocast_bytes or a_bytes  # dtype lora_A computes in
    input_cost = 0
    if lora.dropout > 0:
        mask = t * n_in if cuda else t * n_in * (a_bytes if a_bytes != x_bytes else x_bytes)
        input_cost = t * n_in * lin + mask  # dropout output (cast when autocast) + its mask
    elif (peft_cast and a_bytes != x_bytes) or (autocast_bytes and autocast_bytes != x_bytes):
        input_cost = t * n_in * lin  # x.to(adapter dtype) (or autocast's cast), one per adapted module
    other = t * r * lin  # lora_A output, saved by lora_B
    if lora.dora:
        other += t * n_out * (x_bytes + lin)  # base_result and lora_result saved by the DoRA muls
    return input_cost, other


SRC_KEEPS_INPUT = (
    "peft 0.21.2 tuners/lora/layer.py Linear.forward: x = self._cast_input_dtype(x, lora_A.weight.dtype) "
    "(a no-op when the dtypes match); tuners/lora/bnb.py Linear8bitLt / Linear4bit.forward: that cast only "
    "when not torch.is_autocast_enabled(); torch 2.13 aten/src/ATen/autocast_mode.h cached_cast: a tensor "
    "already in the autocast dtype is passed through; nn.Dropout(p=0) is peft's nn.Identity"
)


def peft_casts_input(sh: Shapes) -> bool:
    """Whether peft casts a module's input to the adapter dtype: ``lora.Linear`` always, its bitsandbytes
    Linears only without autocast (:data:`SRC_KEEPS_INPUT`)."""
    return not (sh.quantized_base and sh.plan.autocast)


def lora_a_keeps_input(lora: LoraConfig, sh: Shapes, x_bytes: int) -> bool:
    """lora_A saves the module input itself (no new storage): no dropout, and neither peft's cast to the
    adapter dtype (skipped by its bitsandbytes Linears under autocast) nor autocast's to the compute dtype
    changes the input's dtype (``x_bytes``) (:data:`SRC_KEEPS_INPUT`)."""
    if lora.dropout > 0:
        return False
    if peft_casts_input(sh) and train_dtype(lora, sh.plan).bits // 8 != x_bytes:
        return False
    return not sh.plan.autocast or sh.c == x_bytes


def _kept(
    readers: list[AdaptedModule], lora: LoraConfig, sh: Shapes, base_keeps: bool, x_bytes: int = 0
) -> bool:
    """The frozen base's saved input stays: the base keeps it, or a reading lora_A saves it as it is
    (``x_bytes``: the input's element size; the compute dtype's when 0)."""
    linear = any(m.kind == "linear" for m in readers)
    return base_keeps or (linear and lora_a_keeps_input(lora, sh, x_bytes or sh.c))


def base_keeps_input(setup: Any) -> bool:
    """Whether the quantized base's Linears keep their input for backward (when it requires grad):
    LLM.int8 always (``MatMul8bitLt``: ``ctx.tensors = (CAt, subA, A)``), 4-bit before bitsandbytes
    0.43.2 (``MatMul4Bit``: ``(A, B)``; :mod:`peakmem.bnb_versions`). Such an input is counted once,
    by keeping the tensor full fine-tuning saves for the frozen weight's gradient."""
    quant = quant_of(setup)
    if quant is None:
        return False
    version = getattr(setup, "bitsandbytes", BNB_CURRENT)
    return not quant.is_4bit or release_facts(version).matmul4bit_saves_input


def first_layer_input_frozen(spec: ModelSpec, group: int, setup: Any, memo: Memo | None = None) -> bool:
    """The first layer's first norm reads the frozen embeddings' output: nothing requires grad yet, so no
    autograd node is made for the quantized Linears reading it (their ctx, and the input, are dropped).
    ``group``: the first layer's own group (:func:`split_first_layer`)."""
    return group == 0 and spec.groups[0].count == 1 and not embeddings_adapted(spec, lora_of(setup), memo)


def adapt_layer(
    spec: ModelSpec, group: int, la: LayerActivations, sh: Shapes, setup: Any
) -> LayerActivations:
    """One layer's saved tensors under LoRA: the frozen base drops what only its weight gradients needed
    (Linear inputs, the RMSNorm output multiplying the norm weight); the adapters add theirs."""
    lora = lora_of(setup)
    quant = quant_of(setup)
    keeps = base_keeps_input(setup)
    layer = spec.groups[group].layer
    mods = [m for m in resolve_targets(spec, lora, sh.memo) if m.group == group]
    release = peft_facts(getattr(setup, "peft", PEFT_CURRENT))
    a_bytes = train_dtype(lora, sh.plan).bits // 8
    if layer.derived is not None:  # its costs measured the module adapters (and peft's MoE conversion)
        measured = set(resolve_targets(spec, measured_lora(lora), sh.memo))
        added = [m for m in mods if m not in measured]
        return _with_param_wrappers(la, added, lora, sh, release, setup, add_saved=True)
    first = first_layer_input_frozen(spec, group, setup, sh.memo)
    att_keeps = keeps and not first
    t, c, h = sh.tokens, sh.c, spec.hidden_size
    att_readers, mlp_readers, o_proj, down = _roles(spec, layer, mods)
    # the normalised x each frozen RMSNorm kept only for its weight's gradient (0 for LayerNorm)
    y_norm = rmsnorm_weight_side_bytes(spec, sh, h)
    x_norm = sh.r if sh.plan.autocast else c  # the norm output's element size, as the readers get it
    x_down = down_input_bytes(layer.mlp, sh)
    out: list[MemoryItem] = []
    down_dropped = 0
    for item in la.saved:
        nbytes = item.bytes
        # Falcon-7B's one shared norm output (key "input.attn_mlp"): one storage read by both halves,
        # kept while either the attention or the MLP readers keep it (``_kept``), else all of it goes
        if item.key == "input.attn_mlp":
            kept = _kept(att_readers, lora, sh, att_keeps, x_norm) or _kept(
                mlp_readers, lora, sh, att_keeps, x_norm
            )
            nbytes = nbytes if kept else 0
        elif item.key == "norms":
            nbytes -= block_norm_count(layer, sh.memo) * y_norm  # 2 pre-norms; Gemma 2/3's sandwich norms: 4
        elif item.key == "attn.qk_norm":  # Qwen3 / Gemma 3 / OLMo 2 q_norm, k_norm: frozen weights too
            nbytes -= rmsnorm_weight_side_bytes(spec, sh, qk_norm_width(layer))
        elif item.key == "input.attn":
            nbytes = nbytes if _kept(att_readers, lora, sh, att_keeps, x_norm) else 0
        elif item.key == "input.mlp":
            # an adapted router parameter that reads the 16-bit norm output (not DeepSeek's fp32 copy) saves
            # it too (a 4.x router Linear is one of the MLP readers: ``_roles``)
            router = _router_adapted(mods) and not layer.mlp.router_fp32
            nbytes = nbytes if router or _kept(mlp_readers, lora, sh, keeps, x_norm) else 0
        elif item.key == "attn.output_copy" and not _kept(o_proj, lora, sh, keeps):
            nbytes = 0  # the contiguous copy is o_proj's input only, saved for its frozen weight's grad
        elif item.key == "attn.output" and not _kept(o_proj, lora, sh, keeps):
            # eager's o_proj input (SDPA keeps its own output for its backward: "attn.sdpa_output")
            nbytes -= t * layer.attention.num_heads * layer.attention.v_head_dim * c
        elif _drops_down_input(item.key, layer, down, lora, sh, keeps):
            down_dropped = t * layer.mlp.intermediate_size * c
            nbytes -= down_dropped
        elif item.key == "autocast.weight_casts" and quant is not None:
            # the quantized Linears' weights are not autocast's (qlora.SRC_QUANT_NO_CAST)
            linear = spec_facts(spec, sh.memo).linear_params[group]
            cast = autocast_cast_params(spec, layer, quant, sh.plan.compute.name)
            nbytes = nbytes * cast // linear if linear else 0
        elif item.key in ("attn.mla_kv_latent", "attn.mla_q_latent"):
            nbytes -= _mla_latent_drop(item.key, spec, layer, mods, lora, sh, keeps)
        elif layer.mlp.is_moe:
            nbytes -= _moe_frozen_drop(item.key, spec, layer, mods, down, lora, sh, keeps)
        out.append(item if nbytes == item.bytes >= 0 else replace(item, bytes=max(0, nbytes)))
    cuda = sh.policy.value == "cuda"
    ac = c if sh.plan.autocast else 0
    inputs = others = early = down_early = 0
    att_costs: list[int] = []
    expert_in, expert_down = _expert_linears(spec, mods)
    for m in mods:
        reads_norm = m in att_readers + mlp_readers or m in expert_in
        x_bytes = x_norm if reads_norm else (x_down if m in down else c)
        merged = not (m.component == "router" and layer.mlp.router_fp32)
        rows = t * layer.mlp.experts_per_token if m in expert_in + expert_down else t
        i_cost, o_cost = adapter_saved_per_module(m, lora, tokens=rows, x_bytes=x_bytes, a_bytes=a_bytes,
                                                  cuda=cuda, autocast_bytes=ac,
                                                  peft_cast=peft_casts_input(sh),
                                                  param_bytes=sh.plan.weight.bits // 8,
                                                  merged_saved=merged,
                                                  factors=uses_factors(m, release))  # fmt: skip
        inputs += i_cost
        others += o_cost
        if m in att_readers:
            att_costs.append(i_cost)
        if m in mlp_readers or m in down or m in o_proj or m in expert_in + expert_down:
            early += i_cost + o_cost
        if m in down:
            down_early += i_cost + o_cost
    if sh.profile.fused_qkv_lora:
        shared, pad = fused_qkv_adapter(att_readers, att_costs, tokens=t, b_bytes=ac or a_bytes)
        inputs -= shared
        if pad:
            out.append(_act("lora: fused qkv zero-pad source (index_copy)", pad, SRC_FUSED_QKV_LORA,
                            "lora.fused_qkv_pad"))  # fmt: skip
    if inputs:
        out.append(_act("lora: adapter inputs (casts / dropout)", inputs, SRC_SAVE, "lora.adapter_inputs"))
    if others:
        out.append(_act("lora: A outputs" + (" + DoRA products" if lora.dora else ""), others, SRC_LORA,
                        "lora.a_outputs"))  # fmt: skip
    if first:
        first_norm = norm_saved(spec, sh, h) - y_norm
        out = [replace(i, bytes=i.bytes - first_norm) if i.key == "norms" else i for i in out]
    saved = tuple(i for i in out if i.bytes)
    # an adapter's forward temporaries come before what its layer saves after that module: net of it, as
    # under recomputation (the last layer's all-linear LoRA on tiny Falcon peaked 5% high without it);
    # at the down projection, last, its input (not saved when the frozen base dropped it) and the
    # residual stream are alive next to them (tiny BERT's peak, measured under the simulator)
    fwd = max(
        la.forward_transient, _recompute_transient(saved, att_readers, o_proj, mlp_readers, down, lora, sh)
    )
    if down:
        fwd = max(fwd, adapter_forward_transient(down, lora, sh) + down_dropped + t * h * sh.r)
    # activations/layer.py's backward transient is net of the down projection's input, freed once that
    # Linear's backward ran; a frozen down projection never saved it, so nothing is freed: its input
    # gradient and the activation's gradients (gelu_new: grad of 0.5x and of 1 + tanh; gated: of
    # act(gate) and up) sit next to every saved tensor. Measured with the tracker on CPU (tiny GPT-2,
    # c_attn LoRA, full checkpointing): 3 T x I gradient tensors above the 4 gelu_new saves.
    bwd = la.backward_transient + down_dropped
    freed = la.backward_freed
    full = _fully_checkpointed(setup)
    lora_keeps_down = not keeps and lora_a_keeps_input(lora, sh, x_down)  # as it is: no dropout, no cast
    relief = 0  # bytes of the peak state absent while a quantized base's dequantized weight is alive
    if len(la.backward_stages) == 2:
        # the attention core's backward runs after the MLP half's and the output projection's: their
        # adapters' saved inputs and A outputs are freed by then (measured under the simulator: tiny
        # Falcon, all-linear LoRA, the last layer's softmax backward); the MLP stage's peak comes after
        # the down projection's backward, which freed its adapter's
        (m_net, m_freed, m_grads), (a_net, a_freed, a_grads) = la.backward_stages
        mlp_stage = (m_net + down_dropped - down_early, m_freed - down_dropped + down_early, m_grads)
        if down_early:
            # while the adapted down projection runs its backward, nothing of the layer is freed yet: the
            # incoming gradient, the frozen base's input gradient and lora_A's gradient of the cast input
            # (the activation's backward comes after): the parity grid's gpt2 LoRA peaks here (CPU)
            during = sum(t * m.in_features for m in down) * _down_input_gradients(layer, sh, quant, a_bytes)
            mlp_stage = max(mlp_stage, (t * h * sh.r + m_grads + during, 0, m_grads))
        att_stage = (a_net + down_dropped - early, a_freed - down_dropped + early, a_grads)
        bwd, freed, _ = max(mlp_stage, att_stage)
        if mlp_stage >= att_stage and down and lora_keeps_down:
            # the MLP stage holds a T x I gradient no quantized MLP Linear's matmul sees: the down input's
            # sum, made out of place after its base freed the dequantized weight (counted here as lora_A's
            # saved input, freed first), or the product's, freed before gate / up's backward
            # (:data:`SRC_DEQUANT_RELIEF`; simulated tiny Llama h 256, I 704, T 512, amp-bf16, dropout 0,
            # full checkpointing: peak at that sum, 3 T x I recomputed + 3 gradients, no weight)
            relief = sum(t * m.in_features for m in down) * x_down
    # a block ending with a norm (Gemma 2/3, OLMo 2) starts its backward in it: a frozen norm kept no
    # weight-side y, so nothing of the block is freed yet (activations/norms.py post_mlp_norm_backward)
    post_norm = post_mlp_norm_backward(spec, layer, sh)
    if post_norm > bwd:
        bwd, freed, relief = post_norm, 0, 0
    if full:
        # the recomputation in backward runs the adapters' forward again: at each adapted module, its
        # temporaries next to what was recomputed before it (the layer's saved tensors minus those after)
        again = _recompute_transient(saved, att_readers, o_proj, mlp_readers, down, lora, sh)
        if again > bwd:
            bwd, relief = again, 0
    if quant is not None:
        # dequantized to bitsandbytes' compute dtype, not the fp32 a prepared base computes in without
        # autocast (kbit_prep.compute_dtype): the precision's
        bnb_c = precision_plan(setup.precision).compute.bits // 8
        tmp = dequant_temporaries(spec, quant, tokens=t, compute_bytes=bnb_c)
        fwd = max(fwd, tmp.forward)
        bwd = bwd + max(0, tmp.backward - relief)
    if (
        full
        and down
        and (down_dropped or lora_keeps_down)
        and not layer.parallel_residual
        and not layer.mlp.is_moe
    ):
        # the down projection's backward began the recomputation: its gradients, and the MLP's input and
        # the residual, are alive while the MLP's adapters recompute their forward, until it stops
        backdrop = recompute_backdrop(spec, layer, down, lora, sh)
        during = _recompute_transient(saved, [], [], mlp_readers, [], lora, sh,
                                      backdrop=(sum(backdrop), down_early, down_dropped))  # fmt: skip
        stop = max(recompute_stop(spec, layer, down, lora, sh), during)
        if stop > bwd:
            bwd, freed = stop, 0
    adapted = replace(
        la, saved=saved, forward_transient=fwd, backward_transient=bwd, backward_freed=max(0, freed)
    )
    return _with_param_wrappers(adapted, mods, lora, sh, release, setup, add_saved=False)


def _plus(sizes: tuple[int, ...], total: int, extra: tuple[int, ...]) -> tuple[int, ...]:
    """``sizes`` with ``extra`` made after them, where ``sizes`` still add up to ``total`` (else unknown)."""
    return (*sizes, *extra) if sizes and sum(sizes) == total else ()


def _with_param_wrappers(
    la: LayerActivations,
    mods: list[AdaptedModule],
    lora: LoraConfig,
    sh: Shapes,
    release: PeftRelease,
    setup: Any,
    *,
    add_saved: bool,
) -> LayerActivations:
    """``la`` with the ParamWrapper costs of ``mods``' targeted parameters (:mod:`.param_wrapper`): the
    merged weights saved (``add_saved``: a derived block, whose measured costs hold only the module
    adapters; adapt_layer counts them with the adapters' saved tensors), the deltas alive through the
    wrapped forward (and mid-layer under full checkpointing, whose forward holds nothing else of the
    layer: ``interior``), the merged weights' gradients in backward, and under full checkpointing the
    recomputation's deltas again."""
    params = [m for m in mods if m.kind == "param"]
    if not params:
        return la
    a_bytes, p_bytes = train_dtype(lora, sh.plan).bits // 8, sh.plan.weight.bits // 8
    merged = tuple(param_wrapper_saved(m, lora, p_bytes, a_bytes, factors=uses_factors(m, release))
                   for m in params)  # fmt: skip
    wrapped = wrapper_costs(params, release, param_bytes=p_bytes, a_bytes=a_bytes)
    saved = la.saved
    if add_saved:
        item = MemoryItem(path="lora: merged weights of target_parameters (ParamWrapper)",
                          category=Category.ACTIVATIONS, bytes=sum(merged), source=SRC_PARAM_WRAPPER,
                          key="lora.param_wrapper", tensors=len(merged), sizes=merged)  # fmt: skip
        saved = (*saved, item)
    bwd = la.backward_transient + wrapped.backward
    temps = la.backward_transient + la.backward_freed - la.backward_grads
    bwd_sizes = _plus(la.backward_sizes, temps, (wrapped.backward,) if wrapped.backward else ())
    if _fully_checkpointed(setup) and wrapped.forward > bwd:
        bwd, bwd_sizes = wrapped.forward, ()  # the recomputation forms the deltas again before the backward
    extra = (wrapped.forward,) if wrapped.forward else ()
    return replace(
        la, saved=saved, forward_transient=la.forward_transient + wrapped.forward,
        forward_sizes=_plus(la.forward_sizes, la.forward_transient, extra),
        interior=la.interior + sum(merged) + wrapped.forward,
        interior_sizes=_plus(la.interior_sizes, la.interior, (*merged, *extra)),
        backward_transient=bwd, backward_sizes=bwd_sizes,
    )  # fmt: skip


SRC_FUSED_QKV_LORA = (
    "Lit-GPT@8641822b lit_gpt/lora.py LoRAQKVLinear.forward (l. 372-386): one dropout and lora_A for the "
    "adapted q/k/v parts; zero_pad (l. 290-296) index_copy's the B output into the qkv layout, and "
    "index_copy's backward saves that source and the int64 index (derivatives.yaml index_copy)"
)
QKV_LEAVES = frozenset({"q_proj", "k_proj", "v_proj"})
INDEX_BYTES = 8  # lit_gpt/lora.py l. 294: torch.tensor(self.lora_ind), int64, one per output column


def fused_qkv_adapter(
    att: list[AdaptedModule], input_costs: list[int], *, tokens: int, b_bytes: int
) -> tuple[int, int]:
    """LoRA on a fused q/k/v Linear (:attr:`Profile.fused_qkv_lora`) against one adapter per q/k/v module:
    (the input bytes the fused module does not repeat: one dropout output and mask instead of one per
    part, the bytes its zero pad saves: the B output, ``tokens`` x the adapted parts' widths in
    ``b_bytes``, and its int64 index; nothing when all of q, k and v are adapted, as ``zero_pad`` then
    returns the B output as it is). ``input_costs``: what :func:`adapter_saved_per_module` charged each
    module of ``att`` for its input. The A outputs are the same bytes either way (r per part)."""
    parts = [(m, cost) for m, cost in zip(att, input_costs, strict=True) if m.leaf in QKV_LEAVES]
    if not parts:
        return 0, 0
    shared = sum(cost for _, cost in parts) - parts[0][1]
    if len(parts) == len(QKV_LEAVES):
        return shared, 0
    width = sum(m.out_features for m, _ in parts)
    return shared, tokens * width * b_bytes + width * INDEX_BYTES


def adapter_forward_transient(mods: list[AdaptedModule], lora: LoraConfig, sh: Shapes) -> int:
    """While one adapted module runs forward (peft ``result + lora_B(lora_A(x)) * scaling``): the base
    output (compute dtype), lora_B's output and its scaled copy (adapter dtype) at once; the largest
    module. Matters when little else is alive: under checkpointing, while a layer is recomputed."""
    a = sh.c if sh.plan.autocast else train_dtype(lora, sh.plan).bits // 8
    best = 0
    for m in mods:
        if m.kind == "linear":
            best = max(best, sh.tokens * m.out_features * (2 * a + sh.c))
            if lora.dora:  # DoRA builds B @ A through lora_B(lora_A(eye(in))) and W + s * BA each forward
                best = max(best, (m.in_features**2 + 3 * m.in_features * m.out_features) * a)
    return best


def _recompute_transient(
    saved: tuple[MemoryItem, ...],
    att: list[AdaptedModule],
    o_proj: list[AdaptedModule],
    mlp: list[AdaptedModule],
    down: list[AdaptedModule],
    lora: LoraConfig,
    sh: Shapes,
    backdrop: tuple[int, int, int] = (0, 0, 0),
) -> int:
    """The most alive beyond the full recomputation while an adapted module recomputes its forward.
    ``backdrop`` (the MLP's modules under full checkpointing, as the down projection's adapter began the
    recomputation): (what that backward holds meanwhile, :func:`recompute_backdrop`; the down projection
    adapter's saved tensors, made after every MLP module's; the product its frozen base dropped, which
    ``mlp.`` no longer holds: the half after gate_proj is up_proj's output alone)."""
    alive, down_saved, dropped = backdrop

    def total(prefixes: tuple[str, ...]) -> int:
        return sum(i.bytes for i in saved if i.key.startswith(prefixes))

    s_mlp = total(("mlp.", "moe."))
    s_mlp_in = total(("input.mlp",)) + total(("norms",)) // 2
    s_attn = total(("attn.",))
    best = 0
    for mods, after in ((att, s_attn + s_mlp_in + s_mlp), (o_proj, s_mlp_in + s_mlp), (down, 0)):
        best = max(best, adapter_forward_transient(mods, lora, sh) - after)
    for m in mlp:  # gated MLPs run gate_proj and its activation before up_proj
        after = (s_mlp + dropped) // 2 - dropped if m.leaf in ("up_proj", "w3") else s_mlp
        best = max(best, adapter_forward_transient([m], lora, sh) - after - down_saved + alive)
    return best


SRC_EARLY_STOP = (
    "torch 2.13 utils/checkpoint.py: non-reentrant checkpointing stops the recomputation once the last "
    "tensor the forward saved is packed again (early_stop=True, _StopRecomputationError): a Llama-style "
    "block's last are the down projection's lora_A / lora_B inputs; peft 0.21.2 tuners/lora/layer.py "
    "Linear.forward: result = base_layer(x), x = _cast_input_dtype(x, lora_A.weight.dtype) (always), "
    "result = result + lora_B(lora_A(dropout(x))) * scaling, result.to(the base output's dtype); "
    "tuners/lora/bnb.py Linear4bit.forward: result = base_layer(x).clone(), x cast to lora_A's dtype and "
    "the scaled lora_B output cast to result's dtype only without autocast; transformers 5.23 "
    "LlamaMLP.forward holds x and act(gate) * up as arguments, LlamaDecoderLayer.forward the residual"
)


def _fully_checkpointed(setup: Any) -> bool:
    """Whether every layer runs under full activation checkpointing (``--checkpointing full``)."""
    return str(getattr(setup.checkpointing, "value", setup.checkpointing)) == "full"


SRC_DEQUANT_RELIEF = (
    "bitsandbytes 0.49.1 autograd/_functions.py MatMul4Bit.backward: grad_A = torch.matmul(grad_output, "
    "F.dequantize_4bit(B, ctx.state).to(grad_output.dtype).t()): the dequantized weight is a temporary of "
    "that one call; torch 2.13 autograd engine: peft's lora_A (created after the base in Linear4bit.forward) "
    "runs its backward first, and its input gradient, a reshape view of the mm output, cannot be stolen "
    "(input_buffer.cpp accumulate), so the base's input gradient is added to it out of place, after the "
    "base's backward returned (a plain CPU run of the stand-in: aten::add of T x I under amp-bf16 without "
    "dropout, aten::add_ where dropout or peft's cast gives lora_A's path a fresh gradient)"
)


def _down_input_gradients(layer: Layer, sh: Shapes, quant: QuantConfig | None, a_bytes: int) -> int:
    """Bytes per element of the two gradients of the adapted down projection's input alive at once in its
    backward: the frozen base's and lora_A's. peft's ``lora.Linear`` casts the input to the adapter dtype
    (``a_bytes``); its bitsandbytes ``Linear4bit`` does so only without autocast; the base returns the
    gradient in its input's dtype (:func:`down_input_bytes`: the MLP interior's, or gelu_new's fp32
    product under CUDA autocast, whose cast for the 16-bit matmul returns an fp32 gradient)
    (:data:`SRC_EARLY_STOP`)."""
    m = down_input_bytes(layer.mlp, sh)
    return m + (m if quant is not None and sh.plan.autocast else a_bytes)


def recompute_stop(
    spec: ModelSpec, layer: Layer, down: list[AdaptedModule], lora: LoraConfig, sh: Shapes
) -> int:
    """Under full checkpointing: what is alive beyond the layer's recomputed saved tensors when its
    recomputation stops, at lora_A of the adapted down projection (:data:`SRC_EARLY_STOP`), over a 16-bit
    base (peft's ``lora.Linear``) or a quantized one (its bitsandbytes ``Linear4bit``: ``sh.quantized_base``).

    Forward's: the down projection's input (the MLP interior's dtype ``m``: the frozen base keeps it not;
    counted with the layer's saved tensors where lora_A saves it as it is, :func:`lora_a_keeps_input`);
    peft's cast of it to the adapter dtype (``lora.Linear`` always, ``Linear4bit`` only without autocast)
    unless lora_A saved that cast itself (no dropout, no autocast cast after it); the dropout output when
    autocast casts it for lora_A; the base output (``lora.Linear``: the compute dtype; ``Linear4bit``'s
    clone: the input's dtype); the MLP's input (the norm output, in the residual's dtype) and the residual
    (unless the second norm saved it as it is: an RMSNorm upcasting nothing). Backward's: the layer
    output's gradient (residual dtype), lora_B's scaled output gradient (autocast: the compute dtype, else
    the adapter's), and the base output's gradient where it is a tensor of its own: cast from the layer
    output's (a 16-bit MLP output on an fp32 residual stream, as under autocast) or from the sum's (the
    fp32 adapters' output promoting ``result + lora_B(...)`` without autocast; ``Linear4bit`` casts the
    adapters' output to the result's dtype instead).

    Measured under the simulator (tiny Llama h 256, I 704, T 512, all-linear LoRA r8, dropout 0.05):
    QLoRA amp-bf16, 1 T x I and 5 T x h bf16 without preparation (2,031,616 B); with peft's, the product,
    its dropout output, the clone, the MLP input and the gradient fp32, the scaled gradient bf16, the
    residual saved by the norm (4,718,592 B): formulas vs simulate +6.1 / -7.3 % before, +0.3 / -0.2 %
    with it (tests/test_qlora_simulate.py). Plain LoRA amp-bf16: the bf16 product, its fp32 cast and fp32
    dropout output, the fp32 MLP input and layer output gradient, the bf16 base output, its bf16 gradient
    and the scaled one (5,439,488 B); bf16: the product, its fp32 cast, the bf16 MLP input, residual,
    layer output gradient, base output and its gradient, the fp32 scaled gradient
    (tests/test_lora_recompute_simulate.py)."""
    t, c, autocast = sh.tokens, sh.c, sh.plan.autocast
    m = down_input_bytes(layer.mlp, sh)
    # what the dropout reads: x, or peft's cast of it to the adapter dtype
    x_a = train_dtype(lora, sh.plan).bits // 8 if peft_casts_input(sh) else m
    cast_saved = lora.dropout == 0 and not (autocast and x_a != c)  # lora_A saved peft's cast as it is
    cast = x_a if x_a != m and not cast_saved else 0
    dropped = x_a if lora.dropout > 0 and autocast and x_a != c else 0  # autocast casts it for lora_A
    width = sum(mod.in_features for mod in down)
    out = sum(mod.out_features for mod in down)
    grads, stream = recompute_backdrop(spec, layer, down, lora, sh)
    own = 0 if lora_a_keeps_input(lora, sh, m) else m  # else lora_A saved it: counted with the layer's
    # the down projection's input, peft's cast, the dropout output; its base output
    return t * width * (own + cast + dropped) + t * out * _base_output_bytes(layer, sh) + grads + stream


def _base_output_bytes(layer: Layer, sh: Shapes) -> int:
    """The frozen down projection's output dtype: the compute dtype, or a bitsandbytes base's input's."""
    return interior_bytes(layer.mlp, sh) if sh.quantized_base else sh.c


def recompute_backdrop(
    spec: ModelSpec, layer: Layer, down: list[AdaptedModule], lora: LoraConfig, sh: Shapes
) -> tuple[int, int]:
    """What is alive, beyond the saved tensors, from the moment the adapted down projection's backward
    (lora_B's, unpacking lora_A's output) begins the layer's recomputation under full checkpointing:
    (the gradients: the layer output's, lora_B's scaled one and the base output's where it is a tensor of
    its own; the stream: the MLP's input and the residual unless the second norm saved it)
    (:func:`recompute_stop`, :data:`SRC_EARLY_STOP`)."""
    t, h, c, r = sh.tokens, spec.hidden_size, sh.c, sh.r
    autocast = sh.plan.autocast
    a = c if autocast else train_dtype(lora, sh.plan).bits // 8  # lora_B's output, and its scaled gradient
    base = _base_output_bytes(layer, sh)
    total = base if sh.quantized_base and not autocast else max(base, a)  # result + scaled lora_B output
    base_grad = base if base != r or total != base else 0
    out = sum(mod.out_features for mod in down)
    residual_saved = spec.norm != "rmsnorm" or r == dtypes.FP32.bits // 8
    return t * out * (a + base_grad) + t * h * r, t * h * r * (1 if residual_saved else 2)


def _drops_down_input(
    key: str, layer: Layer, down: list[AdaptedModule], lora: LoraConfig, sh: Shapes, base_keeps: bool
) -> bool:
    """The MLP's down-projection input (act * up, or act(fc)) is saved only for the frozen weight's grad;
    ReLU saves its own output, and MoE experts are left as full fine-tuning counts them."""
    if key != "mlp.interior" or _kept(down, lora, sh, base_keeps, down_input_bytes(layer.mlp, sh)):
        return False
    return layer.mlp.activation != "relu" and not layer.mlp.is_moe


def _router_adapted(mods: list[AdaptedModule]) -> bool:
    """A router adapted as a bare parameter (transformers 5's ``*TopKRouter``: ``target_parameters``)."""
    return any(m.component == "router" and m.kind == "param" for m in mods)


def _expert_adapted(mods: list[AdaptedModule], leaf: str) -> bool:
    return any(m.component == "experts" and m.kind == "param" and m.leaf == leaf for m in mods)


def _expert_linears(
    spec: ModelSpec, mods: list[AdaptedModule]
) -> tuple[list[AdaptedModule], list[AdaptedModule]]:
    """Adapted per-expert Linears of transformers 4.x (formulas/lora/targets.py): (those reading the routed
    tokens: gate and up, those reading the act * up product: down). Each expert's adapter runs on the
    tokens routed to it (4.48.1 modeling_qwen2_moe.py l. 640-651: ``expert_layer(hidden_states[None,
    top_x])`` per expert), so over the E experts one adapter path over tokens x experts_per_token rows."""
    gate, up, down = V4_EXPERT_LEAVES.get(spec.model_type, V4_DEFAULT_EXPERT_LEAVES)
    linear = [m for m in mods if m.component == "experts" and m.kind == "linear"]
    return [m for m in linear if m.leaf in (gate, up)], [m for m in linear if m.leaf == down]


def _mla_latent_drop(
    key: str,
    spec: ModelSpec,
    layer: Layer,
    mods: list[AdaptedModule],
    lora: LoraConfig,
    sh: Shapes,
    base_keeps: bool,
) -> int:
    """MLA's latent RMSNorm (kv_a_layernorm / q_a_layernorm) under LoRA: its normed ``y`` is saved only for
    the frozen norm weight's gradient, and the normed latent only for the frozen kv_b_proj / q_b_proj
    weight's (unless lora_A keeps that same tensor: ``_kept``). Its fp32 upcast and rstd stay."""
    att = layer.attention
    kv = key == "attn.mla_kv_latent"
    rank, reader = (att.kv_lora_rank, "kv_b_proj") if kv else (att.q_lora_rank or 0, "q_b_proj")
    t = sh.tokens
    drop = rmsnorm_weight_side_bytes(spec, sh, rank)
    if not _kept([m for m in mods if m.leaf == reader], lora, sh, base_keeps):
        drop += t * rank * sh.c
    return drop


def _moe_frozen_drop(
    key: str,
    spec: ModelSpec,
    layer: Layer,
    mods: list[AdaptedModule],
    down: list[AdaptedModule],
    lora: LoraConfig,
    sh: Shapes,
    base_keeps: bool,
) -> int:
    """Bytes of an MoE layer's saved tensor that only a frozen weight's gradient needed (derivatives.yaml:
    mm / grouped_mm save their input only when the weight requires grad). Frozen experts: the up
    grouped_mm's gathered input and the down grouped_mm's input (the act * up product) are not kept; a
    frozen DeepSeek router keeps its fp32 weight copy but not its fp32 input copy; a frozen shared
    experts' down projection does not keep the gated product (``_drops_down_input`` for dense MLPs)."""
    mlp, t, c = layer.mlp, sh.tokens, sh.c
    s = t * mlp.experts_per_token
    # transformers 4.x per-expert Linears: lora_A keeps the routed rows themselves only when it reads them
    # uncast (``_kept``); else it saves its own cast / dropout output (adapter_saved_per_module)
    expert_in, expert_down = _expert_linears(spec, mods)
    if key == "moe.routed_inputs" and not (
        _expert_adapted(mods, "gate_up_proj") or _kept(expert_in, lora, sh, False)
    ):
        return s * spec.hidden_size * c
    if key == "mlp.interior" and not (
        _expert_adapted(mods, "down_proj") or _kept(expert_down, lora, sh, False)
    ):
        return s * mlp.intermediate_size * c
    if key == "moe.router_fp32" and not _router_adapted(mods) and not sh.plan.autocast and c != 4:
        return t * spec.hidden_size * 4
    if key == "mlp.shared_experts" and not _kept(down, lora, sh, base_keeps):
        return t * mlp.shared_intermediate_size * c
    return 0


def _roles(
    spec: ModelSpec, layer: Layer, mods: list[AdaptedModule]
) -> tuple[list[AdaptedModule], list[AdaptedModule], list[AdaptedModule], list[AdaptedModule]]:
    """Adapted modules by what they read: attention input, MLP input, attention output, MLP interior."""
    att_in_names = {"q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "query_key_value", "query", "key",
                    "value", "q_a_proj", "kv_a_proj_with_mqa"}  # fmt: skip
    mlp_in_names = {"gate_proj", "up_proj", "gate_up_proj", "c_fc", "fc1", "dense_h_to_4h", "w1", "w3"}
    o_names = {"o_proj", "out_proj", "dense"}
    down_names = {"down_proj", "fc2", "dense_4h_to_h", "w2"}
    att, mlp, o, down = [], [], [], []
    for m in mods:
        leaf, comp = m.leaf, m.component
        if comp == "attention" and leaf in att_in_names:
            att.append(m)
        elif comp == "attention" and (leaf in o_names or (leaf == "c_proj")):
            o.append(m)
        elif (
            comp in ("mlp", "shared_experts")
            and (leaf in mlp_in_names or m.path.endswith("intermediate.dense"))
        ) or (comp == "router" and m.kind == "linear"):
            mlp.append(m)  # a 4.x router Linear reads the MLP input too
        elif comp in ("mlp", "shared_experts") and (
            leaf in down_names or leaf == "c_proj" or leaf == "dense"
        ):
            down.append(m)
    del spec, layer
    return att, mlp, o, down


def adapt_head(spec: ModelSpec, head: HeadActivations, sh: Shapes, setup: Any) -> HeadActivations:
    """The frozen head keeps neither its input nor the final norm's weight-side output. A QLoRA base's
    head is 16-bit (fp32 only after peft's ``prepare_model_for_kbit_training``: formulas/kbit_prep.py), so
    autocast makes no cast of it to save."""
    quant = quant_of(setup)
    no_cast = quant is not None and head_dtype(quant, dtypes.BF16).bits < 32
    h = spec.hidden_size
    out = []
    for item in head.saved:
        nbytes = item.bytes
        if item.key == "head.lm_head_input" or (no_cast and item.key == "head.weight_cast"):
            nbytes = 0
        elif item.key == "head.final_norm":
            nbytes -= rmsnorm_weight_side_bytes(spec, sh, h)
        out.append(item if nbytes == item.bytes >= 0 else replace(item, bytes=max(0, nbytes)))
    return replace(head, saved=tuple(i for i in out if i.bytes))


def adapt_embedding_items(
    spec: ModelSpec, items: tuple[MemoryItem, ...], setup: Any, memo: Memo | None = None
) -> tuple[MemoryItem, ...]:
    """Frozen embeddings: the embedding dropout records no autograd node, so it saves no mask.

    Except under full checkpointing: transformers' ``_activation_checkpointing_enable``
    (modeling_utils.py; peft's ``_prepare_model_for_gradient_checkpointing`` too) calls
    ``enable_input_require_grads``, whose hook runs ``output.requires_grad_(True)`` on the input
    embeddings' output. That output becomes a leaf requiring grad: its ``AccumulateGrad`` node holds it
    for the whole backward, and the embedding dropout after it saves its mask again. Measured with the
    tracker on CPU (tiny GPT-2, c_attn LoRA, full checkpointing): both alive at the backward peak. The
    leaf is a tensor of its own only when something (learned positions added, dropout) runs between it
    and the first layer; otherwise (Llama, Qwen2) it is the first layer's checkpointed input itself."""
    if not is_adapter_method(setup) or embeddings_adapted(spec, lora_of(setup), memo):
        return items
    if _fully_checkpointed(setup):
        if spec.position != "learned" and spec.embedding_dropout <= 0:
            return items
        tokens = setup.micro_batch * setup.seq_len
        leaf = precision_plan(setup.precision).weight.nbytes(tokens * spec.hidden_size)
        src = "transformers enable_input_require_grads: embedding output.requires_grad_(True), a leaf"
        return (*items, MemoryItem(path="embeddings output (leaf requiring grad)",
                                   category=Category.ACTIVATIONS, bytes=leaf, source=src,
                                   key="embed.leaf_output"))  # fmt: skip
    return tuple(i for i in items if i.key != "embed.dropout_mask")
