"""``peakmem fit --objective dpo|grpo|...``: the changes that make a post-training job fit, each
re-estimated by :func:`peakmem.jobs.estimate_post_training`.

The changes are the ones the frameworks' OOM guides name (TRL #2688 "reduce
``vllm_gpu_memory_utilization``", verl's OOM guide, OpenRLHF's offloading notes), least invasive first:
the rollout engine's sleep mode, a smaller engine share, the engine on GPUs of its own, gradient
checkpointing, an 8-bit optimizer, a LoRA policy (its reference the adapter disabled), precomputed
reference log-probs (DPO), half the micro-batch with twice the accumulation (the generation batch and the
global batch kept), a shorter completion and, last, beta 0 (no reference: it changes the objective).
Each change alone is estimated on every GPU; the ones that fit are ranked in that order. Where none
alone fits, the changes are taken together in that order until the job fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from peakmem.breakdown import Estimate, Verdict
from peakmem.catalog import Gpu
from peakmem.errors import InputError
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.serving.estimate import estimate_inference
from peakmem.inference import Engine, InferenceSetup
from peakmem.jobs import estimate_post_training
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import Parallelism
from peakmem.post_training import PostTraining, Reference, Rollout
from peakmem.training import Checkpointing, Method, OptimizerName, TrainingSetup

SHARE_STEP = 0.05  # vLLM shares offered in steps of 5% of the GPU
# the smallest share offered: what generate of the generation batch needs (weights in bf16 and its KV),
# with this much over for vLLM's activations and CUDA graphs (not modelled: a floor, not a promise)
SHARE_HEADROOM = 1.2


@dataclass(frozen=True, kw_only=True)
class PostChange:
    """One change (or several, ``label`` joined) and the job's estimate with it."""

    label: str
    setup: TrainingSetup
    post: PostTraining
    estimate: Estimate
    steps: tuple[Callable[..., object], ...] = ()  # the changes taken together: the STEPS applied, in order


@dataclass(frozen=True, kw_only=True)
class PostGpuFit:
    gpu: Gpu
    verdict: Verdict
    singles: tuple[tuple[PostChange, Verdict], ...]  # every change alone
    fitting: tuple[tuple[PostChange, Verdict], ...]  # those that fit, least invasive first
    combined: tuple[PostChange, Verdict] | None  # the changes together, in order, until it fits


@dataclass(frozen=True, kw_only=True)
class PostFitReport:
    model: str
    setup: TrainingSetup
    post: PostTraining
    baseline: Estimate
    gpus: tuple[PostGpuFit, ...]


_Got = (
    tuple[str, TrainingSetup, PostTraining] | None
)  # a change's label and the job with it; None: not applicable
_Step = Callable[[TrainingSetup, PostTraining, int, ModelSpec], _Got]


def _sleep(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if p.rollout is not Rollout.VLLM_COLOCATE or p.rollout_sleep:
        return None
    return "vLLM sleep mode between rollouts (vllm_enable_sleep_mode)", s, replace(p, rollout_sleep=True)


def _share(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if p.rollout is not Rollout.VLLM_COLOCATE:
        return None
    gen = InferenceSetup(
        weights="bf16",
        batch=s.micro_batch * p.steps_per_generation,
        context=s.seq_len,
        prompt=s.seq_len - p.completion,
        engine=Engine.HF,
    )
    need = estimate_inference(spec, gen).peak_allocated_bytes * SHARE_HEADROOM / gpu
    share = math.ceil(need / SHARE_STEP) * SHARE_STEP
    if share >= p.rollout_memory or share >= 1:
        return None
    label = (
        f"vLLM share {p.rollout_memory:g} -> {share:.2f} (vllm_gpu_memory_utilization; its KV pool shrinks)"
    )
    return label, s, replace(p, rollout_memory=round(share, 2))


def _server(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if p.rollout is not Rollout.VLLM_COLOCATE:
        return None
    return (
        "rollout on GPUs of its own (vllm_mode server; size them with peakmem infer)",
        s,
        replace(p, rollout=Rollout.VLLM_SERVER),
    )


def _checkpointing(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if s.checkpointing is Checkpointing.FULL and s.checkpoint_every == 1:
        return None
    return (
        "gradient checkpointing (full)",
        replace(s, checkpointing=Checkpointing.FULL, checkpoint_every=1),
        p,
    )


def _eight_bit(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if s.method is not Method.FULL or s.optimizer not in (OptimizerName.ADAMW, OptimizerName.ADAM):
        return None
    return "8-bit AdamW (bitsandbytes)", replace(s, optimizer=OptimizerName.ADAMW_8BIT), p


def _lora(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if s.method is not Method.FULL:
        return None
    ref = Reference.ADAPTER if p.reference is Reference.SEPARATE else p.reference
    return (
        "LoRA policy (r=8, all linears; the reference is the adapter disabled)",
        replace(s, method=Method.LORA, optimizer=OptimizerName.ADAMW),
        replace(p, reference=ref),
    )


def _precompute(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if not p.paired or p.reference not in (Reference.SEPARATE, Reference.ADAPTER):
        return None
    return (
        "precomputed reference log-probs (precompute_ref_log_probs)",
        s,
        replace(p, reference=Reference.PRECOMPUTED),
    )


def _half_batch(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if s.micro_batch < 2:
        return None
    label = f"micro-batch {s.micro_batch} -> {s.micro_batch // 2}, accumulation x 2 (the same global batch)"
    spg = p.steps_per_generation * 2 if p.generates else p.steps_per_generation
    return (
        label,
        replace(s, micro_batch=s.micro_batch // 2, grad_accum=s.grad_accum * 2),
        replace(p, steps_per_generation=spg),
    )


def _short(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if p.completion < 2:
        return None
    half = p.completion // 2
    label = f"completion {p.completion} -> {half} tokens (changes the job: shorter answers)"
    return label, replace(s, seq_len=s.seq_len - half), replace(p, completion=half)


def _no_reference(s: TrainingSetup, p: PostTraining, gpu: int, spec: ModelSpec) -> _Got:
    if not p.online or p.reference is Reference.NONE:
        return None
    return (
        "beta 0: no reference model (changes the objective: no KL term)",
        s,
        replace(p, beta=0.0, reference=Reference.NONE),
    )


STEPS: tuple[_Step, ...] = (
    _sleep,
    _share,
    _server,
    _checkpointing,
    _eight_bit,
    _lora,
    _precompute,
    _half_batch,
    _short,
    _no_reference,
)


def _verdict(est: Estimate, gpu: Gpu) -> Verdict:
    return Verdict(gpu=gpu.name, capacity_bytes=gpu.usable_bytes, needed_bytes=est.needed_bytes,
                   high_bytes=est.needed_high_bytes)  # fmt: skip


def fit_post_training(
    spec: ModelSpec,
    setup: TrainingSetup,
    post: PostTraining,
    gpus: tuple[Gpu, ...],
    *,
    overheads: Overheads | None = None,
    costs: CostLookup | None = None,
    par: Parallelism | None = None,
) -> PostFitReport:
    """The verdict on each GPU and, where it does not fit, every change alone and those that fit; on
    several GPUs (``par``, data parallel) the most loaded rank's, the layout kept as given."""
    if not gpus:
        raise InputError("gpu=None: fit needs --gpu NAME|SIZE[,NAME|SIZE...]")

    def estimate(s: TrainingSetup, p: PostTraining, gpu: Gpu) -> Estimate:
        return estimate_post_training(
            spec, s, p, gpu_bytes=gpu.memory_bytes, overheads=overheads, costs=costs, par=par
        )

    out = []
    for gpu in gpus:
        base = estimate(setup, post, gpu)
        verdict = _verdict(base, gpu)
        singles: list[tuple[PostChange, Verdict]] = []
        if not verdict.fits:
            for step in STEPS:
                got = step(setup, post, gpu.memory_bytes, spec)
                if got is not None:
                    label, s, p = got
                    est = estimate(s, p, gpu)
                    singles.append(
                        (PostChange(label=label, setup=s, post=p, estimate=est), _verdict(est, gpu))
                    )
        fitting = tuple(c for c in singles if c[1].fits)
        combined = None if verdict.fits or fitting else _together(setup, post, gpu, spec, estimate)
        out.append(
            PostGpuFit(gpu=gpu, verdict=verdict, singles=tuple(singles), fitting=fitting, combined=combined)
        )
    baseline = estimate(setup, post, gpus[0])
    return PostFitReport(model=spec.name, setup=setup, post=post, baseline=baseline, gpus=tuple(out))


def _apply(
    steps: list[_Step], setup: TrainingSetup, post: PostTraining, gpu: Gpu, spec: ModelSpec
) -> tuple[list[str], TrainingSetup, PostTraining]:
    """``steps`` applied one after another (an inapplicable one is passed over)."""
    s, p, labels = setup, post, []
    for step in steps:
        got = step(s, p, gpu.memory_bytes, spec)
        if got is not None:
            label, s, p = got
            labels.append(label)
    return labels, s, p


def _together(
    setup: TrainingSetup,
    post: PostTraining,
    gpu: Gpu,
    spec: ModelSpec,
    estimate: Callable[[TrainingSetup, PostTraining, Gpu], Estimate],
) -> tuple[PostChange, Verdict] | None:
    """The changes taken in order until the job fits, then each dropped again where the job fits without
    it (a change that a later one made unnecessary); None where not even all of them fit."""
    used: list[_Step] = []
    for step in STEPS:
        used.append(step)
        _, s, p = _apply(used, setup, post, gpu, spec)
        if _verdict(estimate(s, p, gpu), gpu).fits:
            break
    else:
        return None
    for step in list(used):
        fewer = [u for u in used if u is not step]
        _, s, p = _apply(fewer, setup, post, gpu, spec)
        if _verdict(estimate(s, p, gpu), gpu).fits:
            used = fewer
    labels, s, p = _apply(used, setup, post, gpu, spec)
    est = estimate(s, p, gpu)
    change = PostChange(label=" + ".join(labels), setup=s, post=p, estimate=est, steps=tuple(used))
    return change, _verdict(est, gpu)


def _change_json(c: PostChange, v: Verdict) -> dict[str, object]:
    return {
        "change": c.label,
        "device_total_bytes": c.estimate.device_total_bytes,
        "needed_bytes": v.needed_bytes,
        "fits": v.fits,
        "verdict": v.state,
        "peak_phase": c.estimate.peak_phase.value,
        "post_training": c.post.echo(),
        "micro_batch": c.setup.micro_batch,
        "grad_accum": c.setup.grad_accum,
        "seq_len": c.setup.seq_len,
        "method": c.setup.method.value,
        "optimizer": c.setup.optimizer.value,
        "checkpointing": c.setup.checkpointing_spelled,
    }


def post_fit_json(report: PostFitReport) -> dict[str, object]:
    return {
        "model": report.model,
        "post_training": report.post.echo(),
        "device_total_bytes": report.baseline.device_total_bytes,
        "peak_phase": report.baseline.peak_phase.value,
        "gpus": [
            {
                "gpu": g.gpu.name,
                "capacity_bytes": g.verdict.capacity_bytes,
                "fits": g.verdict.fits,
                "verdict": g.verdict.state,
                "needed_bytes": g.verdict.needed_bytes,
                "changes_that_fit": [_change_json(c, v) for c, v in g.fitting],
                "each_change_alone": [_change_json(c, v) for c, v in g.singles],
                "changes_together": _change_json(*g.combined) if g.combined is not None else None,
            }
            for g in report.gpus
        ],
    }
