"""torchao float8 training (``convert_to_float8_training``): what each converted Linear saves and the
temporaries of its float8 casts, per recipe.

Read in torchao 0.18.0 (torchao/float8/):

* float8_linear.py ``matmul_with_hp_or_float8_args.forward``: ``ctx.save_for_backward(input_hp,
  weight_hp_t)`` - every recipe saves the high-precision input and the weight itself (a view of the
  parameter, no bytes), exactly what ``F.linear`` saves: the layer's saved tensors do not change. The
  float8 copies are made inside the autograd Function (autograd off), used by one ``mm`` and freed.
  The weights stay high precision (the parameter is not replaced; pytorch/ao#1102); ``Float8Linear``
  does not call ``F.linear``, so autocast caches no weight cast (it casts its input only).
* float8_training_tensor.py ``_ToFloat8ConstrFunc.forward``: ``tensor.to(float32) * scale`` then
  float8_utils.py ``to_fp8_saturated``: ``x.clamp(...)`` and ``.to(float8)``. Of a tensor of n elements
  (bf16 or fp32) an eager cast holds at most 9 n bytes beyond its source: the fp32 scaled copy and its
  clamped copy (4 + 4) and the float8 result (1); it leaves the 1-byte result
  (measured on this CPU, torch 2.13: a bf16 512 x 176 tensor's cast peaks 811,008 B + the scale).
  ``tensor_to_amax``'s ``abs`` (n of the source's bytes) comes and goes before. Scales are one fp32
  value per tensor (tensorwise) or per row (rowwise): a few KiB, not counted.
* backward: ``grad_output`` is cast for grad_input and again for grad_weight (two 1-byte copies), the
  weight once more (for grad_input), the input once more (for grad_weight); every one of them is a local
  of ``backward`` and lives until it returns. float8_ops.py ``preprocess_addmm``: ``_scaled_mm`` wants its
  first operand row-major and its second column-major, so grad_input's weight operand and grad_weight's
  two operands are copied (``.contiguous()``, ``.t().contiguous().t()``; 1 byte per element). Rowwise
  scaling without fast accumulation (the two backward gemms: ``gemm_config_grad_*`` default) scales the
  output afterwards: ``post_inverse_scale = a_inverse_scale * b_inverse_scale``, an fp32 outer product
  of the output's shape (``addmm_float8_unwrapped``).
* config.py ``Float8LinearConfig.from_recipe_name``: ``tensorwise`` (all casts per tensor), ``rowwise``
  (all axiswise), ``rowwise_with_gw_hp`` (grad_weight in high precision: ``input`` and ``grad_output``
  not cast for it; the weight cast for grad_input tensorwise).

MXFP8 (``float8-mxfp8``; torchao 0.18 prototype/moe_training/mxfp8_linear.py ``mx_mm``, the dense Linear of
torchtitan's MX converter, recipes ``mxfp8_cublas`` / ``mxfp8_cublas_rceil``): forward saves
``(input_hp, weight_hp)`` as the float8 recipes do; each cast is one kernel (Triton along dim 0, CUDA along
dim 1) that writes the e4m3 elements and one e8m0 scale per 32 (``MX_BLOCK``), no fp32 copies
(:func:`cast_sizes`); ``torch._scaled_mm`` takes the dim-1 casts as they are (no layout copies) and scales
per block (no fp32 output scaling). Backward casts grad_output along dim 0 and the weight along dim 1 for
grad_input, then grad_output and the input along dim 1 for grad_weight, each a local until it returns. Its
casts need SM100 (``MXLinearConverter`` asserts it): ``measure`` does not run them on this CPU.

Which Linears: torchtitan (commit b5bcd76c, torchtitan/components/quantization/utils.py
``module_filter_fn``) converts a Linear when both its dimensions are divisible by 16 (``_scaled_mm``'s
constraint) and its name matches none of ``filter_fqns``; its Llama 3 recipes filter the output head
(models/llama3/config_registry.py ``filter_fqns=["lm_head"]``). Its ``Float8LinearConverter``
(components/quantization/float8.py) offers ``rowwise`` (default) and ``rowwise_with_gw_hp``; torchao's
own default is ``tensorwise``.

FSDP2 float8 all-gather (``TrainingSetup.float8_all_gather``, ``--float8-all-gather``; torchao
``Float8LinearConfig(enable_fsdp_float8_all_gather=True)``, config.py: tensorwise scaling only; torchtitan's
``[float8] enable_fsdp_float8_all_gather``, on in its Llama 3 405B config at commit 9dec370; torchtune's
``enable_fp8_training`` without a recipe name): ``Float8Linear.from_float`` wraps the weight in
fsdp_utils.py ``WeightWithDynamicFloat8CastTensor``, whose ``fsdp_pre_all_gather`` casts the local fp32
shard to float8 (``hp_tensor_to_float8_dynamic``, the amax all-reduced over the shard mesh, or a scale
precomputed after the step) and hands FSDP2 the 1-byte ``_data``; ``fsdp_post_all_gather`` wraps the
gathered bytes as a ``Float8TrainingTensor``. So:

* a layer unit's all-gather output and unsharded parameters hold its converted Linear weights at 1 byte
  per element (the TP-local shard under TP), the rest (norms) in the gather dtype; the root unit
  (embeddings, final norm, head: none converted) is unchanged (:func:`gathered_unit_bytes`);
* FSDP2 (torch 2.13 _fsdp_collectives.py ``_get_param_all_gather_inputs``) calls ``fsdp_pre_all_gather``
  param by param before it allocates the all-gather output: each shard's cast (``CAST_PEAK`` bytes per
  element, the fp32 shard being its own ``.to(float32)``) next to the float8 shards cast before it
  (:func:`pre_all_gather_peak`; with the parameters offloaded, ``all_gather_inputs`` first copies the
  fp32 shard to the GPU);
* the Linear receives its weight as float8 (float8_linear.py ``tensor_already_casted_to_fp8``): forward
  casts only its input and backward does not cast the weight for grad_input; float8_ops.py
  ``preprocess_addmm`` still copies the gathered (row-major) weight to ``_scaled_mm``'s column-major
  layout for grad_input (``b_data.t().contiguous().t()``, 1 byte per element), none in forward (the
  transposed weight is column-major already) (:class:`Recipe` ``weight_fp8``).

Without it the gathered weights are 16-bit as for mixed-bf16 and every Linear casts its own weight.

Not here (neither runs on this CPU): Transformer Engine's FP8 (``te.Linear`` under ``te.autocast``; its
``DelayedScaling`` recipe keeps an amax history of ``amax_history_len=1024`` fp32 values per float8 tensor,
NVIDIA/TransformerEngine docs/api/common.rst, a few KiB per Linear, and can keep float8 weight copies
across micro-batches, ``is_first_microbatch``); DeepSeek-V3's block-wise FP8 (1 x 128 activation tiles,
128 x 128 weight blocks, DeepSeek-V3 technical report arXiv 2412.19437 §3.3). Their saved tensors and
caches were not read here in enough detail to model; ``--precision`` does not offer them.

Eager only: under ``torch.compile`` (torchtitan's usual setup) Inductor fuses the casts and may save
float8 copies instead; not modelled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from peakmem.dtypes import DType
from peakmem.errors import InputError
from peakmem.model import Layer, ModelSpec, Tensor
from peakmem.parallel import FsdpMode, Parallelism
from peakmem.training import POST_TRAINING_LOSSES, Precision, TrainingSetup

from .shapes import LayerActivations, Shapes

# bytes per element an eager float8 cast holds beyond its source: fp32 scaled copy (4) and its
# clamped copy (4), then the float8 result (1) - float8_training_tensor.py _ToFloat8ConstrFunc.forward,
# float8_utils.py to_fp8_saturated
CAST_PEAK = 4 + 4 + 1
FP8 = 1  # bytes per float8 element (e4m3 / e5m2)
FP32 = 4
# torch._scaled_mm: both dims of each operand divisible by 16 (torchtitan utils.py module_filter_fn)
DIM_MULTIPLE = 16
# MX formats: one e8m0 scale (1 byte) per block of 32 elements (torchao mx_formats, block_size 32)
MX_BLOCK = 32

# residual-stream tensors alive mid-layer in forward (float8_layer): the layer's input and the attention's
# residual sum; the decoder's embedding output, held too, is the estimate's (estimate.py ``embeds_held``)
HELD_STREAMS = 2
SRC = "torchao 0.18 float8_linear.py matmul_with_hp_or_float8_args (eager float8 casts)"
ALL_GATHER_NOTE = (
    "FSDP2 float8 all-gather (torchao enable_fsdp_float8_all_gather): each layer unit gathers its "
    "converted Linear weights in float8 (1 B per element, cast from the fp32 shard before the all-gather), "
    "its norms in {gather}; the root unit (embeddings, final norm, head) as before; the Linears receive "
    "float8 weights and skip their weight casts"
)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """One torchao float8 training recipe (config.py ``Float8LinearRecipeName``)."""

    name: str  # torchao's recipe name
    rowwise: bool  # axiswise scales: the backward gemms scale their outputs afterwards (fp32 temporary)
    grad_weight_fp8: bool  # grad_weight from float8 casts (False: in high precision)
    # the weight arrives as float8 (FSDP2 float8 all-gather, module doc): no weight casts in the Linear
    weight_fp8: bool = False
    # MX block scaling (module doc): fused cast kernels, one scale per MX_BLOCK elements, no layout copies
    mx: bool = False


RECIPES: dict[Precision, Recipe] = {
    Precision.FLOAT8_TENSORWISE: Recipe(name="tensorwise", rowwise=False, grad_weight_fp8=True),
    Precision.FLOAT8_ROWWISE: Recipe(name="rowwise", rowwise=True, grad_weight_fp8=True),
    Precision.FLOAT8_ROWWISE_GW_HP: Recipe(name="rowwise_with_gw_hp", rowwise=True, grad_weight_fp8=False),
    Precision.FLOAT8_MXFP8: Recipe(name="mxfp8_cublas", rowwise=False, grad_weight_fp8=True, mx=True),
}


def recipe_of(precision: Precision) -> Recipe | None:
    return RECIPES.get(precision)


def check_all_gather(setup: TrainingSetup, par: Parallelism) -> None:
    """A one-line InputError unless ``float8_all_gather`` runs where torchao's hook does: FSDP2
    (``fsdp_pre_all_gather`` is an FSDP2 extension; FSDP1 and DeepSpeed never call it)."""
    if setup.float8_all_gather and (par.fsdp is FsdpMode.NONE or par.fsdp_version != 2):
        raise InputError(
            f"float8_all_gather=True with {par.describe()}: torchao's float8 all-gather is an FSDP2 hook "
            "(give --fsdp full-shard|shard-grad-op|hybrid-shard with --fsdp-version 2)"
        )


def gathered_unit_bytes(numel: int, converted_numel: int, gather: DType) -> int:
    """Bytes of a unit's ``numel`` gathered elements when ``converted_numel`` of them are converted Linear
    weights all-gathered in float8 (module doc), the rest in ``gather``."""
    return FP8 * converted_numel + gather.nbytes(numel - converted_numel)


def pre_all_gather_peak(shards: Iterable[int], source: int = 0) -> int:
    """The most bytes a unit's float8 casts before its all-gather hold at once: each converted weight's
    shard (``shards``, elements, in the unit's parameter order) is cast (``CAST_PEAK`` per element, plus
    ``source`` per element for a GPU copy of an offloaded shard) beside the float8 shards cast before
    it, which FSDP2 keeps until the copy-in (module doc)."""
    done = peak = 0
    for n in shards:
        peak = max(peak, done + (CAST_PEAK + source) * n)
        done += FP8 * n
    return peak


def converted(spec: ModelSpec, weight: Tensor) -> bool:
    """torchtitan's filter: an ``nn.Linear`` weight (not a transformers ``Conv1D``: torchao swaps
    ``nn.Linear`` only, float8_linear_utils.py ``swap_linear_layers``), both dimensions divisible by 16."""
    if weight.kind != "linear_weight" or weight.module in spec.conv1d_modules:
        return False
    return all(d % DIM_MULTIPLE == 0 for d in weight.shape[:2])


def cast_sizes(n: int, mx: bool = False) -> tuple[int, ...]:
    """The tensors of one eager float8 cast of ``n`` elements at its peak (:data:`CAST_PEAK`): the fp32
    scaled copy, its clamped copy, the float8 result; an MX cast (``mx``) writes its result only."""
    return (fp8_bytes(n, mx),) if mx else (FP32 * n, FP32 * n, FP8 * n)


def fp8_bytes(n: int, mx: bool = False) -> int:
    """Bytes of a float8 copy of ``n`` elements: one byte each, and under MX one scale per block."""
    return FP8 * n + (-(-n // MX_BLOCK) if mx else 0)


def linear_forward_peak(
    m: int, k: int, n: int, c: int = 0, *, weight_fp8: bool = False, mx: bool = False
) -> int:
    """Bytes a converted Linear (m tokens, k in, n out) holds in forward beyond its input and output:
    the input's cast (``CAST_PEAK`` per element), then its float8 copy while the weight is cast, then
    both float8 operands during ``_scaled_mm``; ``c``: the bytes per element of a bias's sum
    (``Float8Linear.forward``: ``output + self.bias``, a second output beside the first), 0 without.
    ``weight_fp8``: the weight arrives as float8 (:class:`Recipe`): no weight cast and no float8 copy of
    it (the gathered weight is the unit's, counted by the engine). ``mx``: MX casts (:func:`cast_sizes`)."""
    return sum(linear_forward_sizes(m, k, n, c, weight_fp8=weight_fp8, mx=mx))


def linear_forward_sizes(
    m: int, k: int, n: int, c: int = 0, *, weight_fp8: bool = False, mx: bool = False
) -> tuple[int, ...]:
    """:func:`linear_forward_peak`'s tensors at its largest instant."""
    w = 0 if weight_fp8 else n * k
    x8, w8 = fp8_bytes(m * k, mx), fp8_bytes(w, mx)
    return _largest([cast_sizes(m * k, mx), (x8, *cast_sizes(w, mx)), (x8, w8), (c * m * n,)])


def _largest(instants: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The instant holding the most bytes (the first of equal ones), its empty tensors dropped."""
    return tuple(x for x in max(instants, key=sum) if x)


def linear_backward_peak(m: int, k: int, n: int, c: int, recipe: Recipe) -> int:
    """Bytes a converted Linear's backward holds beyond its incoming gradient (m x n, ``c`` bytes per
    element), its weight gradient and grad_input (``c`` bytes each) included - the stages of
    ``matmul_with_hp_or_float8_args.backward`` in order, each local kept until it returns."""
    return sum(linear_backward_sizes(m, k, n, c, recipe))


def linear_backward_sizes(m: int, k: int, n: int, c: int, recipe: Recipe) -> tuple[int, ...]:
    """:func:`linear_backward_peak`'s tensors at its largest stage."""
    go, w, x = m * n, n * k, m * k
    mx = recipe.mx
    post_gi = FP32 * x if recipe.rowwise else 0  # rowwise: post_inverse_scale of grad_input's shape
    cast_w = 0 if recipe.weight_fp8 else w  # the weight's float8 copy (none when it arrives as float8)
    copied = 0 if mx else 1  # float8_ops.py preprocess_addmm's layout copies (MX casts along dim 1 instead)
    go8, w8, x8 = fp8_bytes(go, mx), fp8_bytes(cast_w, mx), fp8_bytes(x, mx)
    stages = [
        cast_sizes(go, mx),  # grad_output cast for grad_input
        (go8, *cast_sizes(cast_w, mx)),  # the weight cast for grad_input
        (go8, w8, copied * FP8 * w, c * x, post_gi),  # grad_input gemm: the weight operand copied
    ]
    held = (go8, w8, c * x)  # alive from here to the return
    if recipe.grad_weight_fp8:
        post_gw = FP32 * w if recipe.rowwise else 0
        stages += [
            (*held, *cast_sizes(go, mx)),  # grad_output cast again, for grad_weight
            (*held, go8, *cast_sizes(x, mx)),  # the input cast for grad_weight
            # grad_weight gemm: both operands copied to _scaled_mm's layouts, the output c bytes
            (*held, go8, copied * go8, x8, copied * x8, c * w, post_gw),
        ]
    else:
        stages.append((*held, c * w))  # grad_weight = grad_output.t() @ input in high precision
    return _largest(stages)


def check_float8(spec: ModelSpec, layer: Layer, setup: TrainingSetup, adapter: bool) -> None:
    """A one-line InputError for what the float8 formulas do not model: adapters, non-dense layers and
    the post-training objectives (TRL's log-prob head: their generation reads the weights' own format).
    Op-level SAC is modelled for the dense layers: float8 Linears reach its policy as ``aten.mm``
    (op_sac.py module doc); its own refusals (tensor parallelism, ...) are ``check_op_sac``'s."""
    what = ""
    if setup.loss in POST_TRAINING_LOSSES:
        what = "a post-training objective"
    elif adapter:
        what = "LoRA/QLoRA adapters"
    elif layer.derived is not None:
        what = f"a derived {layer.derived.mixer} block"
    elif layer.mlp.is_moe:
        what = "MoE experts"
    elif layer.attention.kv_lora_rank:
        what = "MLA attention"
    if what:
        raise InputError(f"precision=float8-*: {spec.name} with {what} is not modelled (dense layers only)")


def _io(weight: Tensor) -> tuple[int, int]:
    out, inp = weight.shape[0], weight.shape[1]
    return inp, out


def float8_layer(
    spec: ModelSpec, layer: Layer, sh: Shapes, la: LayerActivations, recipe: Recipe, *, recomputed: bool
) -> LayerActivations:
    """``la`` with the float8 casts' temporaries: the layer's saved tensors are the same (module doc);
    ``recomputed``: full checkpointing or op-level SAC wraps the layer (its forward, the float8 casts
    with it, runs again in backward: op-level SAC recomputes every op it does not keep, casts included).

    Forward: the MLP's output projection is the layer's last Linear (nothing of the layer is saved after
    it), so its casts add to the end-of-forward total; earlier Linears' casts come before saved tensors
    at least as large. Backward: candidate stages (net above the saved tensors, freed, grads) at each
    converted Linear: the MLP's output projection first (the residual gradient incoming), its input
    projections after the MLP interior's gradients, the attention's output projection after the MLP half.
    """
    t, h, c, r = sh.tokens, spec.hidden_size, sh.c, sh.r
    weights = [w for w in layer.tensors if converted(spec, w)]
    biased = {w.name.removesuffix(".bias") for w in layer.tensors if w.kind == "linear_bias"}
    if sh.float8_weights:  # FSDP2 float8 all-gather: the weights arrive as float8
        recipe = replace(recipe, weight_fp8=True)

    fp8, mx = recipe.weight_fp8, recipe.mx

    def _bias(w: Tensor) -> int:
        return c if w.name.removesuffix(".weight") in biased else 0

    if not weights:
        return la
    mlp_w = [w for w in weights if w.component == "mlp"]
    out_proj = [w for w in mlp_w if w.shape[0] == h]
    in_proj = [w for w in mlp_w if w.shape[0] != h]
    attention = [w for w in weights if w.component == "attention"]
    # alive beside the casts of the MLP's output projection, none of it saved: the layer's input (the
    # loop's ``hidden_states``) and the attention's residual sum (the layer's ``residual``) (HELD_STREAMS of
    # them), and the decoder's embedding output (modeling_llama.py LlamaModel.forward keeps ``inputs_embeds``
    # to the end), which the estimate adds to every layer's forward instant on the first stage without PP
    # (estimate.py ``embeds_held``); each candidate instant with its tensors at their sizes (forward_sizes)
    streams = (t * h * r,) * HELD_STREAMS
    fwd_sizes = [
        (*streams, *linear_forward_sizes(t, *_io(w), _bias(w), weight_fp8=fp8, mx=mx)) for w in out_proj
    ]
    fwd = max([sum(x) for x in fwd_sizes], default=0)
    # full checkpointing's forward keeps nothing: at the output projection's casts its input (the gated
    # product) and the MLP's input (the norm output) are alive beside the residual sum; the layer's input is
    # the checkpoint's saved tensor, counted already
    inner = [
        (
            t * h * r,
            t * h * c,
            t * _io(w)[0] * c,
            *linear_forward_sizes(t, *_io(w), _bias(w), weight_fp8=fp8, mx=mx),
        )
        for w in out_proj
    ]
    interior = max([la.interior] + [sum(x) for x in inner])
    stages = list(la.backward_stages) or [(la.backward_transient, la.backward_freed, la.backward_grads)]
    # the temporaries (net + freed - grads) of each stage at their sizes: la's chosen one's only
    temps: list[tuple[int, ...]] = [
        la.backward_sizes if st == (la.backward_transient, la.backward_freed, la.backward_grads) else ()
        for st in stages
    ]
    mlp_grads = sum(w.numel for w in out_proj) * c
    width = layer.mlp.intermediate_size
    saved_mlp = sum(i.bytes for i in la.saved if i.key in ("mlp.interior", "input.mlp"))
    for w in out_proj:  # incoming: the residual gradient
        k, n = _io(w)
        temps.append((t * h * r, *linear_backward_sizes(t, k, n, c, recipe)))
        stages.append((sum(temps[-1]), 0, 0))
    # the MLP interior's gradients alive (a gated one's two: gate's and up's), down's weight gradient written
    alive_interior = 2 if layer.mlp.gated else 1
    interior_grads = alive_interior * t * width * c
    for w in in_proj:
        k, n = _io(w)
        freed = saved_mlp - t * k * c  # the MLP input stays for the other input projection
        net = t * h * r + mlp_grads + interior_grads + linear_backward_peak(t, k, n, c, recipe) - freed
        temps.append(
            (t * h * r, *(t * width * c,) * alive_interior, *linear_backward_sizes(t, k, n, c, recipe))
        )
        stages.append((net, freed, mlp_grads))
    all_mlp_grads = sum(w.numel for w in mlp_w) * c
    # the attention's output projection: the last attention Linear (o_proj, dense, out_proj, c_proj),
    # its backward first; the input projections (q/k/v or a fused qkv) after the core's backward, its
    # saved tensors freed and the gradients of every projection's output alive together
    att_all = [w for w in layer.tensors if w.kind == "linear_weight" and w.component == "attention"]
    att_out = att_all[-1:]
    att_saved = sum(i.bytes for i in la.saved if i.key.startswith("attn."))
    out_grads = all_mlp_grads + sum(w.numel for w in att_out) * c
    in_sizes = tuple(t * w.shape[0] * c for w in att_all[:-1])  # their outputs' gradients
    in_grads = sum(in_sizes)
    for w in attention:
        k, n = _io(w)
        if w in att_out:
            freed, grads, alive, alive_sizes = saved_mlp, all_mlp_grads, 0, tuple[int, ...]()
        else:
            freed, grads, alive, alive_sizes = saved_mlp + att_saved, out_grads, in_grads, in_sizes
        net = t * h * r + t * h * c + alive + grads + linear_backward_peak(t, k, n, c, recipe) - freed
        temps.append((t * h * r, t * h * c, *alive_sizes, *linear_backward_sizes(t, k, n, c, recipe)))
        stages.append((net, freed, grads))
    if recomputed:  # the recomputation's forward casts, the layer's tensors saved again, the gradient in
        for w in out_proj:
            temps.append(
                (t * h * r, t * h * r, *linear_forward_sizes(t, *_io(w), _bias(w), weight_fp8=fp8, mx=mx))
            )
            stages.append((sum(temps[-1]), 0, 0))
    best = max(range(len(stages)), key=lambda i: stages[i])
    forward = max(la.forward_transient, fwd)
    # the casts' tensors as eager torchao makes them; under torch.compile Inductor fuses the casts (not
    # modelled): their sums stand in for tensors whose sizes are not known, so they stay cut (step_parts)
    eager = not sh.compiled
    if not eager:
        temps = [ts if i < len(la.backward_stages or [0]) else () for i, ts in enumerate(temps)]
    return replace(
        la, forward_transient=forward, interior=interior,
        backward_transient=stages[best][0], backward_freed=stages[best][1], backward_grads=stages[best][2],
        backward_stages=tuple(stages), backward_sizes=temps[best],
        forward_sizes=la.forward_sizes if forward == la.forward_transient else
        max(fwd_sizes, key=sum) if eager else (),
        interior_sizes=la.interior_sizes if interior == la.interior else max(inner, key=sum) if eager else (),
    )  # fmt: skip


def assumptions(spec: ModelSpec, precision: Precision) -> tuple[str, ...]:
    """What a float8 estimate assumes, or () for the other precisions."""
    recipe = recipe_of(precision)
    if recipe is None:
        return ()
    n = sum(g.count for g in spec.groups for w in g.layer.tensors if converted(spec, w))
    total = sum(g.count for g in spec.groups for w in g.layer.tensors if w.kind == "linear_weight")
    if recipe.mx:
        return (
            f"torchao MXFP8 training ({recipe.name} / mxfp8_cublas_rceil, torchtitan's MX converter): {n} of "
            f"the layers' {total} Linears converted (not the output head, both dimensions divisible by 16); "
            "weights, gradients and optimizer states as mixed-bf16",
            "MXFP8 Linears save their high-precision input and weight, as nn.Linear does; each cast is one "
            f"kernel writing e4m3 elements and an e8m0 scale per {MX_BLOCK} (no fp32 copies, no layout "
            "copies); all-gathers stay 16-bit",
        )
    return (
        f"torchao float8 training, recipe {recipe.name!r} (torchao 0.18 convert_to_float8_training, eager): "
        f"{n} of the layers' {total} Linears converted (torchtitan's filter: not the output "
        "head, both dimensions divisible by 16); weights, gradients and optimizer states as mixed-bf16 "
        "(the weights stay high precision, pytorch/ao#1102)",
        "float8 Linears save their high-precision input and weight, as nn.Linear does; the casts' fp32 and "
        "float8 copies are temporaries (9 B per element at a cast's peak; backward: two float8 copies of "
        "the output gradient, of the weight and of the input, and _scaled_mm's layout copies)",
        "FSDP2 float8 all-gather only where asked (--float8-all-gather; the FSDP notes then say so): "
        "otherwise gathered weights as 16-bit and each Linear casts its own; float8 tensor parallelism is "
        "not modelled (TP shares out the casts' temporaries as the layer's others); under torch.compile "
        "the casts fuse (not modelled)",
    )
