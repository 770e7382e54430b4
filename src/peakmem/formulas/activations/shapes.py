"""The sizes a layer formula needs (:class:`Shapes`), what one layer keeps (:class:`LayerActivations`),
and the saved-tensor items every part of :mod:`peakmem.formulas.activations` builds.

* dropout: CUDA's fused ``native_dropout`` saves a bool mask (1 B/elem); CPU's ``_dropout_impl``
  saves a noise tensor of the input dtype (``aten/src/ATen/native/Dropout.cpp``).
* autocast (``autocast_mode.cpp``): the 16-bit cast of every weight is cached and saved by its Linear
  (the autocast weight cache, freed layer by layer in backward).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from peakmem.adapters import lora_of, measured_lora, quant_of
from peakmem.breakdown import Category, MemoryItem
from peakmem.model import CostLookup, ModelSpec
from peakmem.training import AttentionKernel, Framework, KernelPolicy, TrainingSetup, family_key
from peakmem.transformers_versions import experts_loop, keeps_clamped_scores

from ..kbit_prep import compute_dtype, residual_dtype
from ..memo import Memo
from ..model_states import PrecisionPlan, precision_plan
from ..profiles import PROFILES, Profile, derived_code, profile_of
from .kernels import MATH, kernel_choice

SRC_WEIGHT_CAST = "torch autocast cached_cast: 16-bit weight copies saved by each Linear"
SRC_DROPOUT = (
    "aten/src/ATen/native/Dropout.cpp: CUDA native_dropout bool mask; CPU input-dtype noise; compiled, "
    "Inductor's native_dropout (rand < p) a bool mask on either device (measured on the CPU)"
)


@dataclass(kw_only=True, slots=True)
class Shapes:
    """The sizes a layer formula needs: tokens, sequence, batch and the dtype plan.

    Built once per estimate, so slotted and not frozen (a frozen ``__init__`` costs 2.5x: see
    :class:`peakmem.breakdown.MemoryItem`): read-only by convention, like every per-estimate value."""

    batch: int
    seq: int
    plan: PrecisionPlan
    policy: KernelPolicy
    kernel: AttentionKernel  # the kernel that really runs (after CPU dropout fallback)
    math_fallback: bool = False  # SDPA requested, math kernel runs (CPU with attention dropout)
    kernel_note: str = ""  # why the kernel differs from the one requested
    profile: Profile = PROFILES[Framework.HF]
    compiled: bool = False  # torch.compile per layer (see compiled_* below)
    fused_kernels: bool = False  # Liger / unsloth Triton kernels for RMSNorm and SwiGLU
    float8_weights: bool = False  # FSDP2 float8 all-gather: float8 Linears receive float8 weights (float8.py)
    # a bitsandbytes base: its Linears return their input's dtype, the norm output's (mlp.py interior_bytes);
    # its MoE experts are quantized Linears too where they are nn.Linear modules (QuantConfig.expert_linears)
    quantized_base: bool = False
    quantized_experts: bool = False
    # transformers 4.x loops over per-expert nn.Linear experts (expert_loop.py), 5.x runs grouped_mm
    expert_loop: bool = False
    # transformers' eager attention keeps the masked scores for its torch.max clamp (OPT before 4.49:
    # peakmem.transformers_versions)
    clamped_scores: bool = False
    family: str = ""  # derived specs: the setup family their measured block costs are looked up in
    costs: CostLookup | None = None  # derived specs: where their measured block costs are looked up
    memo: Memo | None = None  # the estimator's memo of what formulas compute from a layer's tensors
    # derived, set once (the formulas read them a dozen times per layer)
    tokens: int = field(init=False)  # batch x seq
    c: int = field(init=False)  # compute bytes per element
    r: int = field(init=False)  # residual-stream bytes per element

    def __post_init__(self) -> None:
        self.tokens = self.batch * self.seq
        self.c = self.plan.compute.bits // 8
        self.r = self.plan.residual.bits // 8


@dataclass(frozen=True, kw_only=True, slots=True)
class NormStage:
    """A norm's backward as one stage of its layer's (norms.py ``pre_mlp_norm_stage``), split by how
    tensor parallelism shares it out: ``T x h`` bytes (whole on every TP rank without sequence
    parallelism, where the norm is replicated) and the rest (split by TP). All 0: no such stage."""

    hidden_temporaries: int = 0  # the norm's temporaries and the gradients in flight, T x h each
    hidden_freed: int = 0  # T x h saved tensors of the layer already freed
    other_freed: int = 0  # other saved tensors already freed (the MLP's interior)
    grads: int = 0  # weight gradients written
    sizes: tuple[int, ...] = ()  # the temporaries, each at its size

    def __post_init__(self) -> None:
        for name in ("hidden_temporaries", "hidden_freed", "other_freed", "grads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: bytes must be >= 0")

    def stage(self, tp: int = 1, sequence_parallel: bool = False) -> tuple[int, int, int]:
        """(net, freed, grads) as ``LayerActivations.backward_stages`` holds them, on one of ``tp`` ranks."""
        hidden = 1 if tp == 1 or not sequence_parallel else tp
        freed = -(-self.hidden_freed // hidden) + -(-self.other_freed // tp)
        grads = -(-self.grads // tp)
        return -(-self.hidden_temporaries // hidden) + grads - freed, freed, grads


@dataclass(kw_only=True, slots=True)
class LayerActivations:
    """One layer's saved tensors and the largest extra tensors alive while it runs (per estimate:
    slotted, not frozen, read-only by convention; derive changed ones with ``dataclasses.replace``)."""

    saved: tuple[MemoryItem, ...]
    core: int  # bytes of the attention core (what selective checkpointing drops)
    layer_input: int  # what full checkpointing keeps per layer
    forward_transient: int  # beyond ``saved``, the largest momentary extra in forward
    backward_transient: int  # the largest gradient temporaries (incl. its weight grads) in its backward
    recompute: int = 0  # activations rebuilt during its backward (checkpointing)
    interior: int = 0  # the larger of the attention core and the MLP interior (alive mid-layer)
    # how ``backward_transient`` (net) splits at that peak: saved bytes of this layer already freed,
    # and weight gradients written (temporaries = net - grads + freed)
    backward_freed: int = 0
    backward_grads: int = 0
    # of ``saved``: the layer's input itself (the same storage), which full checkpointing keeps anyway
    input_saved: int = 0
    # the materialised attention mask every layer receives (full checkpointing keeps it for backward)
    mask_arg: int = 0
    # the two backward stages ``backward_*`` is the larger of, each (net, freed, grads): the MLP half's
    # and the attention core's (LoRA re-weighs them: lora/deltas.py adapt_layer); () where not built so
    backward_stages: tuple[tuple[int, int, int], ...] = ()
    # a third stage ``backward_*`` may be: the second RMSNorm's backward in a pre-norm block, by TP share
    # (model_parallel.tp_layer_activations takes it per rank)
    norm_stage: NormStage = field(default_factory=NormStage)
    # how far the attention core's moment in forward is below the layer's end-of-forward saved total
    # (the saved tensors the layer makes after its core, less the core's own transient): an extra
    # alive at the core (context parallel's ring, formulas/model_parallel.py) adds only beyond it
    forward_headroom: int = 0
    # of ``forward_transient``: what the attention core's moment adds (the rest is the layer's end,
    # layer.py ``layer_end_forward``, when no ring or buffer is alive)
    forward_core: int = 0
    # the tensors three of the sums above are made of, each at its own size, in the order they are made,
    # where the formula knows them: ``forward_transient``; ``recompute``; the backward peak's temporaries
    # (``backward_transient + backward_freed - backward_grads``: the gradients in flight, the layer's
    # saved tensors already freed at that instant, the kernels' scratch). The allocator replay
    # (step_parts.py) requests them at these sizes where they add up to their sum, else the sum cut into
    # equal parts: () where only the sum is known, and a pass that changes a sum without its sizes (TP's
    # split, a ring, LoRA, float8, tiled MLP) leaves them stale, so they no longer add up
    forward_sizes: tuple[int, ...] = ()
    recompute_sizes: tuple[int, ...] = ()
    backward_sizes: tuple[int, ...] = ()
    interior_sizes: tuple[int, ...] = ()  # ``interior`` (what checkpointing's forward holds mid-layer)

    @property
    def saved_bytes(self) -> int:
        return sum(i.bytes for i in self.saved)


def shapes(
    spec: ModelSpec, setup: TrainingSetup, costs: CostLookup | None = None, memo: Memo | None = None
) -> Shapes:
    """The sizes of ``setup`` on ``spec``; ``costs``: the lookup of a derived spec's measured block costs
    (handed in by the estimator's caller: formulas never look them up themselves); ``memo``: the
    estimator's (:class:`peakmem.formulas.memo.Memo`)."""
    kernel, why = kernel_choice(spec, setup)
    plan = precision_plan(setup.precision)
    quant = quant_of(setup)
    if quant is not None:  # a quantized base's norms decide the residual stream (formulas/kbit_prep.py)
        compute = compute_dtype(quant, plan.compute, plan.autocast)
        plan = replace(plan, compute=compute, residual_override=residual_dtype(quant, plan.residual))
    fallback = why.startswith(MATH) and plan.compute.bits < 32
    family = ""
    if spec.derived_from:
        family = derived_family(setup, spec.attention_kernels)
    return Shapes(
        batch=setup.micro_batch, seq=setup.seq_len, plan=plan, policy=setup.kernel_policy,
        kernel=kernel, math_fallback=fallback, kernel_note=why,
        profile=profile_of(setup), compiled=setup.compiled,
        fused_kernels=setup.liger or PROFILES[setup.framework].fused_kernels, family=family,
        costs=costs, memo=memo, float8_weights=setup.float8_all_gather, quantized_base=quant is not None,
        quantized_experts=quant is not None and quant.expert_linears,
        expert_loop=setup.framework is Framework.HF
        and experts_loop(setup.transformers, spec.model_type),
        clamped_scores=setup.framework is Framework.HF
        and keeps_clamped_scores(setup.transformers, spec.model_type),
    )  # fmt: skip


# the family key's mark of a quantized base whose Linears keep their inputs (bitsandbytes < 0.43.2's 4-bit,
# LLM.int8): a family of its own, measured with them (the shipped QLoRA families run the current release)
QUANT_KEEPS_INPUT = " keeps-inputs"


def quant_keeps_input(setup: TrainingSetup) -> bool:
    """Whether the quantized base's Linears keep their inputs for backward (formulas/lora/deltas.py
    :func:`base_keeps_input`)."""
    from ..lora.deltas import base_keeps_input

    return base_keeps_input(setup)


def derived_family(setup: TrainingSetup, kernels: tuple[str, ...] = ("eager", "sdpa", "flash")) -> str:
    """The setup family a derived spec's block costs are measured in: the precision, the kernel
    transformers is asked for (its own fallbacks then run inside the measured model), the kernel
    policy and the method, with the adapter's settings for LoRA/QLoRA, and the framework's model code
    where it differs from transformers' (peakmem.formulas.profiles.code_config). ``kernels``: the
    attention implementations the model's class has (``ModelSpec.attention_kernels``)."""
    adapter, objects = "", None
    if setup.method.value != "full":
        lora = measured_lora(lora_of(setup))  # target_parameters: added by formulas/lora/param_wrapper.py
        adapter = repr((lora, setup.quant)) if setup.method.value == "qlora" else repr(lora)
        if quant_keeps_input(setup):  # the fake step keeps the quantized Linears' inputs (fakeify.py)
            adapter += QUANT_KEEPS_INPUT
        objects = (lora, setup.quant, setup.bitsandbytes)
    # flash-attn is CUDA-only: a fake-tensor run measures it as SDPA's flash kernel, which allocates
    # the same (simulate/derive/build.py build_with), so the two share one measurement, unless the class
    # has no SDPA path (gpt-oss, Gemma 2): asked for SDPA it runs eager, asked for flash SDPA stands in
    flash_is_sdpa = setup.attention is AttentionKernel.FLASH and "sdpa" in kernels
    kernel = "sdpa" if flash_is_sdpa else setup.attention.value
    return family_key(precision=setup.precision.value, kernel=kernel,
                      policy=setup.kernel_policy.value, method=setup.method.value, adapter=adapter,
                      objects=objects, code=derived_code(setup))  # fmt: skip


def item(path: str, nbytes: int, source: str, key: str, tensors: int = 1) -> MemoryItem:
    """``tensors``: how many equal tensors ``nbytes`` is (``MemoryItem.tensors``)."""
    return MemoryItem(path, Category.ACTIVATIONS, nbytes, source, key, tensors)  # by position: the hot path


def sized(path: str, sizes: tuple[int, ...], source: str, key: str) -> MemoryItem:
    """An item of unequal tensors, ``sizes`` in the order they are made (``MemoryItem.sizes``)."""
    return MemoryItem(path, Category.ACTIVATIONS, sum(sizes), source, key, len(sizes), sizes)


def tensor_sizes(items: Iterable[MemoryItem]) -> tuple[int, ...]:
    """The tensor sizes of ``items``: an item's ``sizes`` where they add up to its bytes, else its bytes
    split into its ``tensors`` equal parts, the last holding the remainder (an item whose bytes a
    technique changed: LoRA's frozen norms; TP's split of unequal tensors), so that they add up."""
    out: list[int] = []
    for i in items:
        if i.sizes and sum(i.sizes) == i.bytes:
            out += i.sizes
        elif i.bytes > 0:
            n = max(1, i.tensors)
            out += [i.bytes // n] * (n - 1) + [i.bytes - (n - 1) * (i.bytes // n)]
    return tuple(out)


def without(sizes: tuple[int, ...], gone: Iterable[int]) -> tuple[int, ...]:
    """``sizes`` less one tensor of each size in ``gone``: the first of that size, else that size off the
    smallest larger one (a tensor kept apart from a larger saved one made from it: op-level SAC keeps
    ``v_proj``'s one-head output, SDPA saves its copy repeated to every head), so that the rest adds up
    to the sum less ``gone``; nothing where no tensor is that large."""
    out = list(sizes)
    for g in gone:
        if g in out:
            out.remove(g)
            continue
        larger = [i for i, n in enumerate(out) if n > g]
        if larger:
            i = min(larger, key=lambda i: out[i])
            out[i] -= g
    return tuple(out)


def dropout_mask_bytes(numel: int, elem_bytes: int, policy: KernelPolicy, compiled: bool = False) -> int:
    """Bytes a training-mode dropout saves for backward (see SRC_DROPOUT)."""
    return numel if policy is KernelPolicy.CUDA or compiled else numel * elem_bytes


def activation_dtype_note(sh: Shapes) -> str:
    return (
        f"activations in {sh.plan.compute.name}, residual stream in {sh.plan.residual.name}; "
        f"attention kernel {sh.kernel.value} ({sh.policy.value} kernels)"
    )
