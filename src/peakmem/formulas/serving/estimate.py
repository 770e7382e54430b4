"""Inference memory of one GPU (one tensor-parallel rank): weights + KV cache + runtime memory, per
engine, with its allocator level, device total and band.

What a request needs (weights, activations / the profiled peak, sampler buffers, the KV cache of
``batch`` sequences of ``context`` tokens, context and allocator overheads) does not depend on the GPU:
:func:`estimate_inference` reports it. Whether it fits one GPU is
:func:`peakmem.formulas.serving.fit.serving_fit`'s answer.
"""

from __future__ import annotations

from peakmem.breakdown import Band, BandTerm, Category, Estimate, MemoryItem, PerParamRow, Phase, PhasePeak
from peakmem.formulas import band as _band
from peakmem.formulas.allocator import K_ROUND_LARGE, reserved_bytes, tensor_rounding
from peakmem.formulas.block_rounding import ROUNDUP_NOTE, with_roundup
from peakmem.formulas.kv_cache import cache_kind, kv_bytes_per_token
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.serving.cache_growth import GROWTH_NO_GPU_NOTE, GROWTH_NOTE, growth_term
from peakmem.formulas.serving.context import (
    CUDA_CONTEXT_BYTES,
    EngineMemory,
    ServingContext,
    check_layout,
    resolve_context,
    serving_state,
    state_per_sequence,
)
from peakmem.formulas.serving.generate import generate_memory
from peakmem.formulas.serving.litgpt import litgpt_memory, litgpt_rows
from peakmem.formulas.serving.llamacpp import llamacpp_memory
from peakmem.formulas.serving.paged import paged_memory
from peakmem.formulas.serving.parallel import deployment_estimate
from peakmem.formulas.serving.sglang_spec import load_copies_bytes
from peakmem.formulas.serving.speculative import draft_extra
from peakmem.formulas.weights import WeightRow, weight_rows
from peakmem.inference import Engine, InferenceSetup
from peakmem.model import ModelSpec
from peakmem.units import fmt_bytes
from peakmem.weight_formats import Scheme

# engines whose requests reach PyTorch's caching allocator with nothing sized to the free memory: the
# roundup_power2_divisions item applies (formulas/block_rounding.py)
ROUNDUP_ENGINES = frozenset({Engine.HF, Engine.LITGPT})

_DEFAULT_OVERHEADS = Overheads()


def _per_param(spec: ModelSpec, rows: tuple[WeightRow, ...]) -> tuple[PerParamRow, ...]:
    by_storage: dict[str, tuple[int, int]] = {}
    for r in rows:
        p, b = by_storage.get(r.storage, (0, 0))
        by_storage[r.storage] = (p + r.params, b + r.bytes)
    return tuple(
        PerParamRow(
            tensor="weights",
            dtype=storage,
            bytes_per_param=b / p if p else 0.0,
            bytes=b,
            params=p,
            category=Category.PARAMETERS,
            source="formulas/weights.py",
        )
        for storage, (p, b) in sorted(by_storage.items(), key=lambda kv: -kv[1][1])
    )


def _phase(phase: Phase, items: list[MemoryItem]) -> PhasePeak:
    return PhasePeak(phase=phase, bytes=sum(i.bytes for i in items), items=tuple(items))


def estimate_inference(
    spec: ModelSpec, setup: InferenceSetup, *, overheads: Overheads | None = None
) -> Estimate:
    """Memory of one GPU (one tensor-parallel rank) serving ``spec`` as ``setup`` describes.
    ``overheads``: the allocator's fragmentation, expandable segments and a calibrated profile (the
    CUDA context of a serving job stays :data:`CUDA_CONTEXT_BYTES`). With pipeline, data or expert
    parallelism (formulas/serving/parallel.py): the most loaded rank, and the sequences the whole
    deployment serves."""
    layout = setup.layout
    if not layout.parallel:
        return _estimate_rank(spec, setup, overheads)
    check_layout(spec, layout)
    return deployment_estimate(spec, layout, lambda part: _estimate_rank(part, setup, overheads))


def _estimate_rank(spec: ModelSpec, setup: InferenceSetup, overheads: Overheads | None) -> Estimate:
    """One rank holding ``spec`` (the whole model, or one pipeline stage's part of it)."""
    ov = overheads or _DEFAULT_OVERHEADS
    c = resolve_context(spec, setup)
    rows = litgpt_rows(c) if setup.engine is Engine.LITGPT else weight_rows(spec, setup.weight_format)
    if setup.engine is Engine.HF:  # expandable segments merge what they free: nothing to replay
        r = generate_memory(c, rows, None if ov.expandable_segments else ov.alloc_roundup_divisions)
    elif setup.engine is Engine.LITGPT:
        r = litgpt_memory(c, rows)
    elif setup.engine is Engine.LLAMACPP:
        r = llamacpp_memory(c, rows)
    else:
        r = paged_memory(c, rows)
    prefill, decode = _phase(Phase.PREFILL, r.prefill), _phase(Phase.DECODE, r.decode)
    phases: tuple[PhasePeak, ...] = (
        (prefill, decode) if not r.load else (_phase(Phase.LOAD, r.load), prefill, decode)
    )
    if setup.engine in ROUNDUP_ENGINES:  # roundup_power2_divisions (formulas/block_rounding.py)
        phases = tuple(with_roundup(p, spec, ov.alloc_roundup_divisions) for p in phases)
    peak = max(phases, key=lambda p: p.bytes)  # the first of equals
    overhead = sum(i.bytes for i in r.overhead)
    # Caching allocator (formulas/allocator.py): weights and a preallocated cache are resident;
    # activations, temporaries and transformers' growing cache (re-allocated by torch.cat every
    # step) churn and carry the fragmentation slack.
    churn_categories = {Category.ACTIVATIONS, Category.TEMPORARIES}
    if setup.engine is Engine.HF:
        churn_categories.add(Category.KV_CACHE)
    churn = sum(i.bytes for i in peak.items if i.category in churn_categories)

    def reserved_at(phase: PhasePeak) -> int:
        moving = sum(i.bytes for i in phase.items if i.category in churn_categories)
        return reserved_bytes(
            resident=phase.bytes - moving,
            resident_rounding=tensor_rounding(
                tuple(i.bytes for i in phase.items if i.category not in churn_categories)
            ),
            churn=moving,
            fragmentation=ov.fraction,
            expandable=ov.expandable_segments,
        )

    # no empty_cache between the load and generation: what the load cut stays reserved
    reserved = max(reserved_at(p) for p in phases if p is peak or p.phase is Phase.LOAD)
    growth = _growth_above(r, peak, churn_categories, reserved)  # generate's replay (cache_growth.py)
    notes, engine_terms = r.notes, r.band_terms
    if growth and setup.gpu_bytes:  # on that GPU: the replay reserves at most what it leaves
        reserved += growth
        notes += (GROWTH_NOTE.format(extra=fmt_bytes(growth)),)
        engine_terms += (growth_term(growth),)
    elif growth:  # no GPU named: the need stays the closed form (a full GPU's allocator frees its cache)
        notes += (GROWTH_NO_GPU_NOTE.format(extra=fmt_bytes(growth)),)
    device_total = reserved + overhead
    kind = cache_kind(spec, latent=c.latent)
    kv_tp = setup.layout.attention_tp  # KV heads per rank: SGLang DP attention splits them tp // dp ways
    extra: dict[str, object] = {
        "engine": setup.engine.value,
        "kv_bytes_per_token": kv_bytes_per_token(spec, bits=c.kv_bits, latent=c.latent, tp=kv_tp),
        "recurrent_state_bytes_per_sequence": state_per_sequence(c),
        "kv_cache_kind": kind,
        "kv_cache_dtype": c.kv_name,
        "context": c.context,
        "prompt": c.prompt,
        "tp": setup.tp,
        "per_rank": setup.tp > 1,
        "weight_bytes": sum(rw.bytes for rw in rows),
        **draft_extra(c),
        # SGLang: the draft's own embedding/head alive from its load to set_embed_and_head (sglang_spec.py)
        **({"sglang_draft_load_copies_bytes": copies} if (copies := load_copies_bytes(c)) else {}),
        **r.extra,
    }
    assumptions = (
        *c.assumptions,
        *notes,
        f"weights: {setup.weight_format.name}; KV cache {c.kv_name}; SDPA/flash attention (no score matrix)",
    )
    checkpoint = setup.weights_assumption()
    if checkpoint is not None:
        assumptions += (checkpoint,)
    state_seq = state_per_sequence(c)
    if state_seq:
        assumptions += (_state_note(c, state_seq),)
    if setup.tp > 1:
        assumptions += (
            f"tensor parallel {setup.tp}: linears, embeddings and KV heads split per rank; norms "
            "replicated; NCCL buffers not modelled",
        )
    if setup.layout.parallel:
        assumptions += (_layout_note(setup),)
    if ov.alloc_roundup_divisions > 1:
        n = ov.alloc_roundup_divisions
        assumptions += (ROUNDUP_NOTE.format(n=n) if setup.engine in ROUNDUP_ENGINES else
                        f"roundup_power2_divisions:{n} not applied: {setup.engine.value} sizes its cache to "
                        "the free memory or does not use PyTorch's allocator",)  # fmt: skip
    return Estimate(
        band=_serving_band(setup, peak, reserved, device_total, churn, ov, engine_terms),
        method="analytic",
        job="infer",
        model_name=spec.name,
        params=spec.params,
        trainable_params=0,
        per_param=_per_param(spec, rows),
        items=peak.items,
        phases=phases,
        peak_phase=peak.phase,
        peak_allocated_bytes=peak.bytes,
        peak_reserved_bytes=reserved,
        device_total_bytes=device_total,
        assumptions=assumptions,
        setup=setup.echo(),
        extra=extra,
    )


def _state_note(c: ServingContext, state_seq: int) -> str:
    """How the recurrent state per sequence was counted, per engine (formulas/recurrent_state.py)."""
    s = c.setup
    state = serving_state(c)
    dtypes = f"conv state {state.conv_dtype_bytes} B, scan state {state.temporal_dtype_bytes} B per element"
    asked = ", ".join(f"{name} {getattr(s, name)}" for name in ("ssm_cache_dtype", "conv_cache_dtype")
                      if getattr(s, name) != "auto")  # fmt: skip
    how = {
        Engine.VLLM: "vLLM's shapes (conv_kernel - 1 conv inputs in mamba_cache_dtype, the scan state in "
        "mamba_ssm_cache_dtype: the model dtype unless the model's hook or the flag sets it) in one padded "
        "page per stateful layer",
        Engine.SGLANG: "SGLang's shapes (conv_kernel - 1 conv inputs in bf16, the scan state in fp32 unless "
        "--mamba-ssm-dtype or the config's mamba_ssm_dtype says otherwise)",
        Engine.LLAMACPP: "llama.cpp's shapes (d_conv - 1 conv inputs, both states fp32)",
    }.get(s.engine, "conv state in the compute dtype, scan state in fp32 as transformers keeps it")
    how = f"{how}: {dtypes}" + (f" ({asked})" if asked else "")
    return (
        f"recurrent state (SSM / linear-attention blocks): {fmt_bytes(state_seq)} per sequence x "
        f"{c.setup.batch} = {fmt_bytes(state_seq * c.setup.batch)}, whatever the context, counted with the "
        f"KV cache (its own item); {how}"
    )


def _layout_note(setup: InferenceSetup) -> str:
    """What one rank holds under ``setup``'s layout (peakmem.serving_layout)."""
    lay = setup.layout
    attention = (f"attention weights and KV heads split tp / dp = {lay.attention_tp} ways, the token "
                 "embedding replicated (SGLang DP attention)" if lay.dp_attention else
                 f"attention weights and KV heads split tp = {lay.tp} ways")  # fmt: skip
    return (
        f"{attention}; MoE experts split {lay.expert_ways} ways; each data-parallel rank holds "
        f"{lay.rank_batch(setup.batch)} of the {setup.batch} sequences; activations modelled with the "
        "tp-way split; NCCL / all-to-all buffers not modelled"
    )


def _growth_above(r: EngineMemory, peak: PhasePeak, churn: set[Category], reserved: int) -> int:
    """What transformers generate's replay through the allocator model reserves above ``reserved`` (the
    closed form): the peak phase's resident tensors packed in their segments plus the replay's large
    pool (:mod:`peakmem.formulas.serving.cache_growth`), rounded to kRoundLarge; 0 where not replayed."""
    if not r.replayed_reserved:
        return 0
    resident = tuple(i.bytes for i in peak.items if i.category not in churn)
    replayed = sum(resident) + tensor_rounding(resident) + r.replayed_reserved
    return max(0, -(-replayed // K_ROUND_LARGE) * K_ROUND_LARGE - reserved)


def _serving_band(
    setup: InferenceSetup, peak: PhasePeak, reserved: int, device_total: int, churn: int, ov: Overheads,
    engine_terms: tuple[BandTerm, ...],
) -> Band:  # fmt: skip
    """The band of a serving estimate (formulas/band.py): the formulas' residual, fragmentation of the
    churn, the CUDA context, NCCL for tensor parallelism, the published residual of HF generate, and the
    engine's own terms (the spread of the CUDA graphs vLLM / SGLang capture). It spans the peak only: what
    generate() leaves held once it returns (weights + KV cache, ``extra['steady_state_bytes']``) is another
    quantity, not a low end of the peak."""
    terms = [
        _band.residual_term(peak.bytes),
        _band.context_term(CUDA_CONTEXT_BYTES, assumed=True, profile=ov.profile),
        _band.fragmentation_term(
            churn=churn, fragmentation=ov.fraction, profile=ov.profile, expandable=ov.expandable_segments
        ),
    ]
    if setup.tp > 1:
        terms.append(_band.nccl_term(communicators=1, likely_bytes=0))
    if setup.engine in (Engine.HF, Engine.LITGPT):  # generate's residuals: measured on both engines' rows
        kind = _band.GENERATE if setup.weight_format.scheme is Scheme.FLOAT else _band.GENERATE_QUANTIZED
        measured = _band.measured_residual_term(kind, peak.bytes)
        if measured is not None:
            terms.append(measured)
    terms.extend(engine_terms)
    return _band.build_band(allocated=peak.bytes, reserved=reserved, device_total=device_total,
                            terms=tuple(terms))  # fmt: skip
