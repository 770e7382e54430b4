"""How sure is the answer: a low / likely / high band from named unknowns.

Three things an estimate rests on are unknown until a GPU runs: the CUDA context (driver, CUDA
version, lazy module loading), the caching allocator's fragmentation (it depends on the order and
sizes of every request), and, for multi-GPU or serving jobs, memory outside PyTorch's allocator
(NCCL buffers, CUDA graphs). Each is a :class:`BandTerm`: a signed range *relative to the likely
value* (``low_bytes <= 0 <= high_bytes``) with its source, applying at one of three levels:

* ``allocated`` (what ``max_memory_allocated`` shows) - it shifts reserved and device total too;
* ``reserved`` (``max_memory_reserved``) - it shifts the device total too;
* ``device_total`` (``nvidia-smi``) only.

A quantity's low (high) end is its likely value plus every low (high) delta at its level and
above: the terms are independent unknowns and the band is their worst corner, not a statistical
interval. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.breakdown import Band, BandTerm, Range
from peakmem.units import MiB


def build_band(*, allocated: int, reserved: int, device_total: int, terms: tuple[BandTerm, ...]) -> Band:
    """The band of the three likely values under ``terms`` (zero-width terms are dropped)."""
    kept = tuple([t for t in terms if t.low_bytes or t.high_bytes])
    a_lo = a_hi = r_lo = r_hi = d_lo = d_hi = 0
    for t in kept:
        if t.level == "allocated":
            a_lo += t.low_bytes
            a_hi += t.high_bytes
        elif t.level == "reserved":
            r_lo += t.low_bytes
            r_hi += t.high_bytes
        else:
            d_lo += t.low_bytes
            d_hi += t.high_bytes
    r_lo, r_hi = a_lo + r_lo, a_hi + r_hi
    d_lo, d_hi = r_lo + d_lo, r_hi + d_hi
    # each level holds the one below it (the allocator reserves at least what it hands out; the device
    # holds the reserved segments): a reserved-level term wider than the likely gap to allocated (the
    # expandable segments' slack on a tiny model) cannot put reserved's low end below allocated's
    a_low = max(0, allocated + a_lo)
    r_low = min(reserved, max(a_low, reserved + r_lo))
    d_low = min(device_total, max(r_low, device_total + d_lo))
    return Band(
        allocated=Range(low=a_low, likely=allocated, high=allocated + a_hi),
        reserved=Range(low=r_low, likely=reserved, high=reserved + r_hi),
        device_total=Range(low=d_low, likely=device_total, high=device_total + d_hi),
        terms=kept,
    )


# --- the formulas' own residual -----------------------------------------------------------------
# benchmarks/simulate_vs_analytic.md: analytic peak allocated vs simulate (the real transformers model
# under fake tensors, CUDA-faithful kernels) over the 65 catalog models at their defaults: all within
# 3 %, worst -2.06 % (gpt2-large, gpt2-xl). The GPU's own kernel picks (flash / memory-efficient /
# math attention, cuBLAS and cuDNN workspaces) move allocations either way, so the term is symmetric.
FORMULA_RESIDUAL = 0.021
SRC_RESIDUAL = (
    "analytic vs simulate (fake-tensor run of the transformers model) over the 65 catalog models: worst "
    "-2.06 % (benchmarks/simulate_vs_analytic.md); +-2.1 %, kernels on the GPU move it either way"
)


def residual_term(allocated: int) -> BandTerm:
    d = int(allocated * FORMULA_RESIDUAL)
    return BandTerm(
        name="formula_residual", level="allocated", low_bytes=-d, high_bytes=d, source=SRC_RESIDUAL
    )


# --- the CUDA context ------------------------------------------------------------------------------
# What a process holds outside PyTorch's allocator with lazy module loading, as published
# (benchmarks/cuda_context_logs.json: 29 figures from 16 repositories and sites; benchmarks/cuda_context.py
# prints them): a bare context measures 254-426 MiB (P1: torch 1.13 + CUDA 11.7, pytorch PR #86509; P3: RTX
# 6000 Ada, torch 2.10 + CUDA 13.0, unsloth-zoo PR #1053), and what a job's kernels add to it on one GPU
# without NCCL (vLLM's non_torch_increase) 113-164 MiB (V2/V3 A100, V1 H100: vllm PR #12126). NCCL's
# buffers are formulas/nccl.py's. Low: the smallest bare context; high: the largest bare context plus the
# largest job increment. The assumed 512 MiB (formulas/overhead.py) sits inside.
CONTEXT_BARE_MIN_BYTES = int(253.75 * MiB)  # P1: 287,047,680 B in use less its tensor's 20 MiB segment
CONTEXT_BARE_MAX_BYTES = 426 * MiB  # P3: nvidia-smi with torch's allocated and reserved 0 / 0
JOB_KERNELS_MAX_BYTES = int(0.16 * 1024 * MiB)  # V1: "non_torch_memory takes 0.16GiB" (H100, TP 1)
CONTEXT_LOW_BYTES = CONTEXT_BARE_MIN_BYTES
CONTEXT_HIGH_BYTES = CONTEXT_BARE_MAX_BYTES + JOB_KERNELS_MAX_BYTES
SRC_CONTEXT = (
    "lazy module loading (torch >= 1.13 sets CUDA_MODULE_LOADING=LAZY): 254-590 MiB, the published bare "
    "contexts (254-426 MiB) plus what a job's kernels add on one GPU (up to 164 MiB; "
    "benchmarks/cuda_context_logs.json); CUDA 11 without lazy loading measured 1,343 MiB on a V100 (HF docs "
    "'Model training anatomy'): pass --cuda-context-mib or a calibrated profile for such a stack"
)
# A context measured on the machine (a CONTEXT_SIZES row that is a measurement, --cuda-context-mib, or
# a calibrated profile): what remains is what loads after the measurement (cuDNN, NCCL and kernel
# images loaded lazily at their first use) and run-to-run driver variation; +-5 % of the measured
# value (1,343 MiB +- 67 MiB) covers the spread the HF-docs V100 runs show around their measurement.
MEASURED_CONTEXT_SPREAD = 0.05
SRC_CONTEXT_MEASURED = (
    "context measured on the machine (CONTEXT_SIZES row, --cuda-context-mib or a calibrated profile): "
    "+-5 % for kernels loaded lazily after the measurement and driver variation"
)


def context_term(context_bytes: int, *, assumed: bool, profile: str | None = None) -> BandTerm:
    """The CUDA context: the CUDA 12 lazy-loading range when ``assumed`` (peakmem's default row),
    +-5 % of a measured one (``profile``: a calibrated profile, named in the source)."""
    if assumed and profile is None:
        low, high = min(0, CONTEXT_LOW_BYTES - context_bytes), max(0, CONTEXT_HIGH_BYTES - context_bytes)
        return BandTerm(name="cuda_context", level="device_total", low_bytes=low, high_bytes=high,
                        source=SRC_CONTEXT)  # fmt: skip
    spread = int(context_bytes * MEASURED_CONTEXT_SPREAD)
    src = SRC_CONTEXT_MEASURED + (f" (profile {profile!r})" if profile else "")
    return BandTerm(
        name="cuda_context", level="device_total", low_bytes=-spread, high_bytes=spread, source=src
    )


# --- the caching allocator -------------------------------------------------------------------------
# The calibration of formulas/allocator.py DEFAULT_FRAGMENTATION: fractions 0.10-0.15 of the churn fit
# the 7 HF-docs V100 points best; 0.15 is the upper end of that fit.
FRAGMENTATION_HIGH = 0.15
# With a calibrated profile the fraction was fitted on the user's own runs: the band keeps a third of
# the default term's width around it (the spread the 7 V100 points leave around their best fit:
# 0.10-0.15 is a third of the 0-0.15 range the uncalibrated term spans).
PROFILE_FRAGMENTATION_SHARE = 1 / 3
SRC_FRAGMENTATION = (
    "c10/cuda/CUDACachingAllocator.cpp: low = no fragmentation (reserved = blocks in use, rounded); "
    "high = 15 % of the per-step churn (the upper end of DEFAULT_FRAGMENTATION's calibration, "
    "formulas/allocator.py)"
)
SRC_PHASE_SEGMENTS = (
    "c10/cuda/CUDACachingAllocator.cpp: segments are released only on OOM or empty_cache(), and "
    "get_free_block reuses a cached block only for a request no larger than it. (1) Blocks cut for one "
    "phase (forward/backward activations: < 10 MiB requests share 20 MiB kLargeBuffer segments) may not "
    "serve the other phase's larger requests (the optimizer step's parameter-sized fp32 temporaries); "
    "(2) optimizer states created lazily in step 1 (torch/optim/adamw.py _init_group: zeros_like) land "
    "by best fit in blocks backward freed, so step 2's activations need new segments. High = the larger "
    "of the two with fragmentation, less what the analytic replay of the step (formulas/step_sequence.py) "
    "already put in the likely value: simulate's replay of the 65 catalog defaults lies within 3 % of it "
    "for 61 (GPT-2 XL -0.3 %, Llama-3.2-1B -0.8 %, Qwen3-0.6B -3.4 %, Gemma-3-1B +0.5 %; worst opt-125m "
    "+11 %; benchmarks/reserved_vs_replay.py)"
)
SRC_EXPANDABLE = (
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (c10/cuda/CUDACachingAllocator.cpp, Note "
    "[Expandable Segments]): one segment per pool grows by mapping pages (2 MiB small pool, 20 MiB "
    "kLargeBuffer large pool), so freed blocks merge and serve any later request; what remains is "
    "the last page's slack"
)


def fragmentation_term(
    *,
    churn: int,
    fragmentation: float,
    profile: str | None = None,
    expandable: bool = False,
    replayed: int = 0,
) -> BandTerm:
    """Fragmentation inside the peak phase: from none to FRAGMENTATION_HIGH of the churn (a calibrated
    profile keeps a third of that width around its fitted fraction). ``replayed``: what the allocator
    replay put on top of the closed form (formulas/step_sequence.py): also slack the low end removes."""
    likely = int(churn * fragmentation) + replayed
    if expandable:
        return BandTerm(name="allocator_fragmentation", level="reserved", low_bytes=-likely,
                        high_bytes=0, source=SRC_EXPANDABLE)  # fmt: skip
    high = int(churn * max(fragmentation, FRAGMENTATION_HIGH)) + replayed
    if profile is not None:
        half = int(churn * FRAGMENTATION_HIGH * PROFILE_FRAGMENTATION_SHARE / 2)
        share = PROFILE_FRAGMENTATION_SHARE / 2 * FRAGMENTATION_HIGH
        src = f"fragmentation calibrated in profile {profile!r}; +-{share:.1%} of the churn"
        return BandTerm(name="allocator_fragmentation", level="reserved", low_bytes=-min(likely, half),
                        high_bytes=half, source=src)  # fmt: skip
    return BandTerm(name="allocator_fragmentation", level="reserved", low_bytes=-likely,
                    high_bytes=high - likely, source=SRC_FRAGMENTATION)  # fmt: skip


def phase_segments_term(
    *, other_churn: int, fragmentation: float, expandable: bool = False, replayed: int = 0
) -> BandTerm:
    """Segments one phase reserved that the peak phase cannot reuse: up to ``other_churn`` (the other
    phase's churn) with its fragmentation, on top of the peak phase's own segments; nothing with
    expandable segments (freed blocks of the one segment merge). ``replayed``: the bytes the allocator
    replay (formulas/step_sequence.py) already added to the likely value for them: the term keeps the rest."""
    high = 0 if expandable else other_churn + int(other_churn * max(fragmentation, FRAGMENTATION_HIGH))
    high = max(0, high - replayed)
    return BandTerm(name="allocator_segments_of_other_phases", level="reserved", low_bytes=0,
                    high_bytes=high, source=SRC_PHASE_SEGMENTS)  # fmt: skip


# --- multi-GPU and serving ------------------------------------------------------------------------
# NCCL docs "Environment Variables": NCCL_BUFFSIZE default 4 MiB per channel and peer for the Simple
# protocol; LL and LL128 buffers add to it; NCCL_MAX_NCHANNELS up to 32 (NVLink/NVSwitch systems
# open 16-32 channels, PCIe 2-4). peakmem's likely figure is nccl.nccl_communicator_bytes();
# the band spans 2 channels x 4 MiB x 2 peers (low) to 32 channels x (4 MiB + LL128 ~4.6 MiB) x 2
# peers (high), per communicator.
NCCL_LOW_PER_COMMUNICATOR = 2 * 4 * MiB * 2
NCCL_HIGH_PER_COMMUNICATOR = 32 * (4 * MiB + 4_718_592) * 2
SRC_NCCL = (
    "NCCL docs 'Environment Variables': NCCL_BUFFSIZE 4 MiB default per channel and peer (Simple), "
    "LL128 buffers on top, 2 (PCIe) to 32 (NVSwitch, NCCL_MAX_NCHANNELS) channels per communicator"
)


def nccl_term(*, communicators: int, likely_bytes: int) -> BandTerm:
    low = communicators * NCCL_LOW_PER_COMMUNICATOR
    high = communicators * NCCL_HIGH_PER_COMMUNICATOR
    return BandTerm(name="nccl_buffers", level="device_total", low_bytes=min(0, low - likely_bytes),
                    high_bytes=max(0, high - likely_bytes), source=SRC_NCCL)  # fmt: skip


# DeepSpeed ZeRO-3's prefetcher: v0.7.0 to v0.15.x let its count of gathered parameters go negative after
# each backward, so every later step keeps the input embedding gathered on top of today's working set
# (formulas/zero3.py version_drift; fixed by DeepSpeed PR #6726, v0.16.0). peakmem does not know the
# release a job runs: the older engine's bytes are the band's high end.
SRC_ZERO3_VERSION = (
    "deepspeed partitioned_param_coordinator.py v0.7.0-v0.15.x: reset_step zeroes __n_available_params "
    "while the embedding is gathered (PR #6726, v0.16.0 'becomes negative'): the embedding kept on top"
)


def zero3_version_term(high_bytes: int) -> BandTerm:
    return BandTerm(name="zero3_engine_version", level="allocated", low_bytes=0, high_bytes=high_bytes,
                    source=SRC_ZERO3_VERSION)  # fmt: skip


# vLLM / SGLang CUDA graphs are a likely term of their own (formulas/serving/cuda_graphs.py); what stays
# unknown is its spread: +-10 % (the fitting set's residuals are +4 and +5 %) and, above 272 tokens, the
# 20 MiB segment a PIECEWISE capture was logged to take in vLLM 0.10 (PR #22897, #23184), as the high end.
# (Before the term existed this band was 0 .. +1.5 GiB, "not modelled".)
SRC_CUDA_GRAPHS = (
    "CUDA graph capture (formulas/serving/cuda_graphs.py, in the likely value): +-10 % of the term, and "
    "+20 MiB a PIECEWISE graph above 272 tokens (vLLM PR #22897 / #23184 log 24-28 MiB per such capture)"
)


def cuda_graphs_term(*, low_bytes: int, high_bytes: int) -> BandTerm:
    """The spread of the CUDA-graph term (formulas/serving/cuda_graphs.py graph_band)."""
    return BandTerm(name="cuda_graphs", level="allocated", low_bytes=min(0, low_bytes),
                    high_bytes=max(0, high_bytes), source=SRC_CUDA_GRAPHS)  # fmt: skip


# --- what published GPU runs showed beyond the named terms ----------------------------------------
# Per kind of job, the smallest widening of the band above that holds every point of the FITTING sets of
# benchmarks/published_scale.json (the split rules that alternate, split_rule, _2 and _9, each decided before
# any estimate of its points: within a kind, alternate by the SHA-256 of the id): for each fitting point, how
# far its measurement lies below the band's low end or above its high end, as a fraction of the estimate's
# likely allocated bytes; the term spans the worst of each side. ``benchmarks/published_scale.py --residuals``
# prints these numbers; the held-out set never sets them and the script reports how many held-out points the
# band then holds. A kind with no fitting point has no term. Training is split by its GPUs and, on one GPU,
# into full training and adapter training by a quantized base (:func:`training_kind`; full training on one GPU
# has a term since the ninth search, 2026-12-06, whose torchtune rows are its first fitting points). The
# one-GPU kinds had no term until session 9 (2026-12-06): the CPU grid and the shared validation set were
# taken to check them. Their fitting points (Lit-GPT, torchtune) read 4-15 % low after the library releases
# they ran were modelled (--bitsandbytes 0.41.1, --torchao 0.1, the litgpt profile), so the rule now applies
# to them too; that was decided AFTER their held-out points had been read, so the held-out coverage of those
# two kinds is not a blind test: the third search's points (split_rule_3) are.
@dataclass(frozen=True, kw_only=True)
class MeasuredResidual:
    low: float  # <= 0: a fraction of the likely allocated bytes
    high: float  # >= 0
    points: int  # fitting points of the kind
    worst: str  # the fitting points that set the low and the high end


TRAIN_SEVERAL_GPUS = "training on several GPUs"
TRAIN_ONE_GPU_ADAPTERS = "adapter training on one GPU, 16-bit base"
TRAIN_ONE_GPU_QUANTIZED = "adapter training on one GPU, quantized base"
TRAIN_ONE_GPU_FULL = "full training on one GPU"
# GaLore's optimizer (--optimizer galore-adamw) on one GPU: its own kind, outside the one-GPU family, because
# its remainder comes from the optimizer implementation's own copies, not from the allocator and framework the
# family shares. Decided 2026-12-07 AFTER its fitting point (torchao's GaLore reference, +21.6 %) had widened
# the one-GPU family's band (held-out median width 21.4 -> 27.6 %) and that had been read.
TRAIN_ONE_GPU_GALORE = "GaLore training on one GPU"
GENERATE = "transformers generate, 16-bit weights"
GENERATE_QUANTIZED = "transformers generate, quantized weights"
MEASURED_RESIDUALS: dict[str, MeasuredResidual] = {
    TRAIN_SEVERAL_GPUS: MeasuredResidual(
        low=-0.131, high=0.253, points=33,
        worst="low: torchao's float8 pretraining tutorial, its bf16 baseline (torchtitan@775a486 Llama3-8B "
        "on 8 x H100, FSDP2, op-level SAC, per-block compile, seq 8192: +22.5 % once the compiled block's "
        "unread down projection output is dropped, the rest not explained; torchao's B200 rows of the same "
        "config read +12 %); high: Answer.AI's fsdp_qlora Llama-2-7B LoRA r64 with FSDP1 CPU offload at "
        "batch 10 x 2048 on two RTX 4090s (reserved 22.69 GiB of a 24 GB card, 25 % above its estimate: "
        "the largest batch the post found to fit, where the caching allocator runs close to full; not "
        "explained)",
    ),
    TRAIN_ONE_GPU_ADAPTERS: MeasuredResidual(
        low=0.0, high=0.119, points=9,
        worst="high: ms-swift v2's Qwen1.5-MoE-A2.7B LoRA (all linear, r 8, max_length 1024) on one GPU, its "
        "script's header (42 GB; 13 % above its estimate, not explained; the twenty-third search's fitting "
        "point)",
    ),
    TRAIN_ONE_GPU_QUANTIZED: MeasuredResidual(
        low=0.0, high=0.154, points=3,
        worst="low: none (Lit-GPT's Llama-2-7B nf4 LoRA, its longest batch first: 8 % above its estimate, "
        "inside the named terms); high: torchtune's "
        "Llama-2-7B QLoRA tutorial run, reserved, set at load (torchao 0.1's "
        "whole-weight to_nf4, modelled with --torchao 0.1; 1.2 GB above the load's replay, not explained)",
    ),
    TRAIN_ONE_GPU_FULL: MeasuredResidual(
        low=-0.018, high=0.049, points=8,
        worst="low: torchtune's README Llama 3.2 3B, packed 2 x 4096, eager (+4 %); high: the same with "
        "compile=True (per-layer compile and the compiled loss over the model's fp32 logits: 6 % below, not "
        "explained)",
    ),
    TRAIN_ONE_GPU_GALORE: MeasuredResidual(
        low=0.0, high=0.216, points=1,
        worst="high: torchao's GaLore prototype profiled on GaLore's Llama-1B config in fp32 (its "
        "GaLoreAdamW reference implementation, rank 128: the profiler's Parameter category peaks at "
        "8,047 MiB against the model's 5,108, 'likely due to extra data copies' says its README; the "
        "seventeenth search's fitting point)",
    ),
    GENERATE: MeasuredResidual(
        low=0.0, high=0.007, points=10, worst="high: optimum's Llama-2-13B fp16 prefill at batch 2",
    ),
    GENERATE_QUANTIZED: MeasuredResidual(
        low=-0.003, high=0.068, points=24,
        worst="low: Qwen2.5-7B-Instruct GPTQ int8 (cuda-old kernel) generating 2,048 tokens after a "
        "30,720-token prompt on an A100 (Qwen's speed benchmark: 2.4 % below its estimate); high: "
        "optimum's Llama-2-13B GPTQ "
        "(exllama) prefill at batch 1: the ~0.75 GiB the fp16 rows miss too (not a kernel buffer: "
        "formulas/quant_kernels.py models those)",
    ),
}  # fmt: skip
SRC_MEASURED = (
    "benchmarks/published_scale.json fitting set ({points} points of this kind, {worst}): the band's "
    "terms widened just enough to hold them (benchmarks/published_scale.py --residuals); the held-out "
    "set checks it"
)


def training_kind(*, gpus: int, adapters: bool, quantized: bool, galore: bool = False) -> str:
    """The kind of a training job in :data:`MEASURED_RESIDUALS`: by its GPUs; on one GPU, GaLore, full
    training, and adapter training by whether the base is quantized (QLoRA)."""
    if gpus > 1:
        return TRAIN_SEVERAL_GPUS
    if galore:
        return TRAIN_ONE_GPU_GALORE
    if not adapters:
        return TRAIN_ONE_GPU_FULL
    return TRAIN_ONE_GPU_QUANTIZED if quantized else TRAIN_ONE_GPU_ADAPTERS


# --- a kind with few fitting points borrows its family's range -----------------------------------
# The range of n fitting residuals holds one more point of the same distribution with probability
# (n - 1) / (n + 1) (order statistics: the new point is equally likely to rank anywhere among n + 1), so a
# kind's own range is a 90 % interval only from 19 points; below that it is widened to the range of its
# family's fitting points, the jobs whose unmodelled remainder has the same origin (one GPU's caching
# allocator and framework; transformers' generate). Decided 2026-12-07 before the fifteenth search
# gathered its points, but after the earlier held-out points had been read: those searches' misses are not
# a blind test of it, the fifteenth's held-out half is.
MIN_OWN_POINTS = 19
FAMILIES: tuple[tuple[str, ...], ...] = (
    (TRAIN_ONE_GPU_ADAPTERS, TRAIN_ONE_GPU_QUANTIZED, TRAIN_ONE_GPU_FULL),
    (GENERATE, GENERATE_QUANTIZED),
)
SRC_FAMILY = (
    "{kind} has {points} fitting points (fewer than {min_points}, where the range of n points holds a new "
    "one with probability (n - 1) / (n + 1) = 90 %): widened to its family's {family_points} fitting "
    "points ({family})"
)


def family_range(kind: str) -> tuple[float, float, int, tuple[str, ...]]:
    """(low, high, points, kinds): the range of the fitting residuals the band of ``kind`` spans: its own
    from :data:`MIN_OWN_POINTS` points, else the union of its family's (:data:`FAMILIES`)."""
    own = MEASURED_RESIDUALS[kind]
    family = next((f for f in FAMILIES if kind in f), (kind,))
    if own.points >= MIN_OWN_POINTS:
        family = (kind,)
    rs = [MEASURED_RESIDUALS[k] for k in family if k in MEASURED_RESIDUALS]
    return min(r.low for r in rs), max(r.high for r in rs), sum(r.points for r in rs), family


def measured_residual_term(kind: str | None, allocated: int) -> BandTerm | None:
    """The published fitting set's residual beyond the named terms for ``kind`` (or its family's, see
    :func:`family_range`), in bytes of the likely ``allocated`` (applies at every level); None where no
    fitting point of the kind exists."""
    r = MEASURED_RESIDUALS.get(kind) if kind is not None else None
    if kind is None or r is None:
        return None
    low, high, points, family = family_range(kind)
    source = f"{kind}: " + SRC_MEASURED.format(points=r.points, worst=r.worst)
    if family != (kind,):
        source += "; " + SRC_FAMILY.format(kind=kind, points=r.points, min_points=MIN_OWN_POINTS,
                                          family_points=points, family=", ".join(family))  # fmt: skip
    return BandTerm(name="published_residual", level="allocated", low_bytes=int(allocated * low),
                    high_bytes=int(allocated * high), source=source)  # fmt: skip


# --- which optimizer kernel runs ------------------------------------------------------------------
SRC_OPTIMIZER_IMPL = (
    "torch/optim/adamw.py: with neither foreach nor fused given, torch picks foreach on CUDA "
    "(_default_to_fused_or_foreach), whose _foreach_sqrt/_foreach_div allocate a step temporary per "
    "parameter group (the likely value); fused=True runs one kernel without them, and transformers 5.23 "
    "TrainingArguments defaults to optim='adamw_torch_fused' on torch >= 2.8 (training_args.py "
    "default_optim): low = the peak without the step's temporaries"
)


def optimizer_impl_term(delta_bytes: int) -> BandTerm:
    """The step's peak with a fused optimizer (``delta_bytes <= 0``) instead of the foreach estimated."""
    return BandTerm(name="optimizer_kernel", level="allocated", low_bytes=min(0, delta_bytes), high_bytes=0,
                    source=SRC_OPTIMIZER_IMPL)  # fmt: skip


# --- the order of a chunked loss's backward -------------------------------------------------------------
SRC_LOSS_ORDER = (
    "torchtune CEWithChunkedOutputLoss under compile_loss: the likely value has every 16-bit logits chunk "
    "saved and one chunk's gradient alive at the start of backward. High: autograd's ready queue runs the "
    "node with the highest sequence number first (torch/csrc/autograd/engine.cpp ReadyQueue), so all the "
    "chunks' CE backwards run before any of the head's matmul backwards, and on torch 2.13's CPU Inductor "
    "the saved chunks stay alive meanwhile: every chunk's gradient is alive at once (measured, "
    "tests/test_compile_torch.py). Low: each gradient takes the place of its freed saved chunk"
)


def loss_backward_term(*, low_delta: int, high_delta: int) -> BandTerm:
    """The allocated peak if the chunked loss's gradients replace their saved chunks (``low_delta <= 0``)
    or all live at once next to them (``high_delta >= 0``); computed by the estimator, which knows the
    phases."""
    return BandTerm(name="loss_backward_order", level="allocated", low_bytes=min(0, low_delta),
                    high_bytes=max(0, high_delta), source=SRC_LOSS_ORDER)  # fmt: skip


def with_terms(band: Band, terms: tuple[BandTerm, ...]) -> Band:
    """``band`` with more terms (the likely values unchanged)."""
    return build_band(allocated=band.allocated.likely, reserved=band.reserved.likely,
                      device_total=band.device_total.likely, terms=band.terms + terms)  # fmt: skip


SRC_KERNEL_PRE_AMPERE = (
    "torch sdp_utils.cpp: the flash kernel needs sm80+ (Ampere); before Ampere SDPA runs the "
    "memory-efficient kernel where its constraints hold and the math kernel otherwise, which "
    "materialises the T x T scores like eager attention; flash-attn 2 needs Ampere too (its README). "
    "High = the setup estimated with eager attention"
)


def kernel_term(*, low_delta: int, high_delta: int, source: str) -> BandTerm:
    """Attention-kernel alternatives on the named GPU: the allocated difference of the alternative
    kernels to the one estimated (computed by the estimator, which knows the kernels)."""
    return BandTerm(name="attention_kernel", level="allocated", low_bytes=min(0, low_delta),
                    high_bytes=max(0, high_delta), source=source)  # fmt: skip


SRC_LOOP_ORDER = (
    "Lit-GPT@8641822b finetune/lora.py get_batch: the longest sample is the first micro-batch (nothing of an "
    "earlier one alive, the likely value), later ones are random samples each padded to its own length, so "
    "a long batch may follow another long one whose logits and quantized-Linear inputs the loop still holds "
    "(formulas/loop_held.py). High = the fixed-length step (every batch --seq long)"
)


def loop_order_term(high_bytes: int) -> BandTerm:
    """A loop that runs its longest batch first (formulas/padded_lengths.py ``first_is_longest``): the
    allocated difference to the step whose long batch follows another long one."""
    return BandTerm(name="loop_order", level="allocated", low_bytes=0, high_bytes=max(0, high_bytes),
                    source=SRC_LOOP_ORDER)  # fmt: skip
