"""``peakmem fit``: verdicts per GPU, fit's families of changes, the ranked candidates and the limits."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from peakmem.breakdown import Estimate, Verdict
from peakmem.catalog import Gpu
from peakmem.defaults import skips_grad_sync
from peakmem.errors import require
from peakmem.estimate import setup_dict
from peakmem.formulas import step_time as st
from peakmem.formulas.overhead import Overheads
from peakmem.formulas.profiles import liger_applies
from peakmem.formulas.zero3 import torch_linear
from peakmem.model import CostLookup, ModelSpec
from peakmem.parallel import FsdpMode, Offload, Parallelism
from peakmem.planner.search import (
    MAX_CHANGES,
    MAX_LIMIT_GPUS,
    MAX_MICRO_BATCH,
    MAX_NODE_GPUS,
    SEQ_STEP,
    TOP_CANDIDATES,
    Candidate,
    Family,
    _candidate_json,
    _Config,
    _discrete_configs,
    _Estimator,
    _family_json,
    _first_fit,
    _largest_true,
    _minimal,
    _Option,
    _rank_key,
    _Search,
    _step_json,
)
from peakmem.training import (
    AttentionKernel,
    Checkpointing,
    Framework,
    GradSync,
    LossImpl,
    Method,
    OptimizerImpl,
    OptimizerName,
    TrainingSetup,
)


@dataclass(frozen=True, kw_only=True)
class Limits:
    largest_micro_batch: int  # 0: not even micro-batch 1 fits
    longest_seq: int  # 0: not even the shortest fits
    seq_capped: bool  # longest_seq is the model's own context (it could go further)
    fewest_gpus: int | None  # None: not found up to MAX_LIMIT_GPUS
    fewest_gpus_layout: str
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class GpuFit:
    gpu: Gpu
    verdict: Verdict
    candidates: tuple[Candidate, ...]  # fitting changed jobs, ranked (empty when it already fits)
    singles: tuple[Candidate, ...]  # every single change alone, fitting or not ("why not X")
    limits: Limits


@dataclass(frozen=True, kw_only=True)
class FitReport:
    model: str
    params: int
    setup: TrainingSetup
    baseline: Estimate
    baseline_step: st.StepTime
    gpus: tuple[GpuFit, ...]
    smallest_sufficient: str | None  # name of the smallest GPU given that fits
    search_space: tuple[Family, ...]
    assumptions: tuple[str, ...]
    estimates: int  # how many setups were estimated
    elapsed_s: float
    parallelism: Parallelism | None = None  # the job's layout, or None: one GPU

    @property
    def any_fits(self) -> bool:
        return any(g.verdict.fits for g in self.gpus)


# --- the families of changes --------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Ctx:
    spec: ModelSpec
    setup: TrainingSetup
    gpus: tuple[Gpu, ...]
    estimator: _Estimator
    par: Parallelism | None = None  # the job's layout (None: one GPU)


FamilyFn = Callable[[_Ctx], "tuple[Family, tuple[_Option, ...]]"]


def _family_checkpointing(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    ladder = (Checkpointing.SELECTIVE, Checkpointing.FULL)
    # what is searched from each mode: op-level SAC (kept out of the ladder, so that the ways down of a
    # job at none stay as they were) goes on to full
    rungs = {Checkpointing.NONE: ladder, Checkpointing.SELECTIVE: ladder[1:], Checkpointing.OP: ladder[1:]}
    opts = tuple(_Option(label=f"checkpointing {c.value}", setup=(("checkpointing", c),))
                 for c in rungs.get(ctx.setup.checkpointing, ()))  # fmt: skip
    if not opts:
        return Family(name="activation checkpointing", status="not applicable",
                      reason="already full checkpointing"), ()  # fmt: skip
    return Family(name="activation checkpointing", status="searched",
                  options=tuple(o.label for o in opts)), opts  # fmt: skip


def _family_attention(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    order = (AttentionKernel.EAGER, AttentionKernel.SDPA, AttentionKernel.FLASH)
    better = order[order.index(ctx.setup.attention) + 1 :]
    if not better:
        return Family(name="attention kernel", status="not applicable", reason="already flash attention"), ()
    opts = tuple(_Option(label=f"attention {k.value}", setup=(("attention", k),)) for k in better)
    return Family(name="attention kernel", status="searched", options=tuple(o.label for o in opts)), opts


def _eight_bit(name: OptimizerName) -> OptimizerName | None:
    for member in OptimizerName:
        if member.value == f"{name.value}-8bit":
            return member
    return None


def _family_optimizer(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    fam = "8-bit optimizer"
    if "8bit" in ctx.setup.optimizer.value:
        return Family(name=fam, status="not applicable", reason=f"already {ctx.setup.optimizer.value}"), ()
    target = _eight_bit(ctx.setup.optimizer)
    if target is None:
        return Family(name=fam, status="not applicable",
                      reason=f"no 8-bit variant of {ctx.setup.optimizer.value}"), ()  # fmt: skip
    opt = _Option(label=f"optimizer {target.value}", setup=(("optimizer", target),))
    return Family(name=fam, status="searched", options=(opt.label,)), (opt,)


def _family_adapter(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    fam = "LoRA / QLoRA"
    if ctx.setup.method is not Method.FULL:
        ladder = (Method.LORA, Method.QLORA)
        if ctx.setup.method is Method.QLORA:
            return Family(name=fam, status="not applicable", reason="already QLoRA"), ()
        methods: tuple[Method, ...] = ladder[1:]
    else:
        methods = (Method.LORA, Method.QLORA)
    opts: list[_Option] = []
    missing: list[str] = []
    for m in methods:
        changed = replace(ctx.setup, method=m)
        if ctx.estimator.unmeasured(changed):  # listed, and named as not measured yet (planner.ways)
            opts.append(_Option(label=f"method {m.value}", setup=(("method", m),)))
            continue
        res = ctx.estimator(changed)
        if res is None or res.estimate.trainable_params >= ctx.spec.params:
            missing.append(m.value)
        else:
            opts.append(_Option(label=f"method {m.value}", setup=(("method", m),)))
    if not opts:
        return Family(name=fam, status="not available",
                      reason=f"the estimator does not model {' / '.join(missing)} yet "
                             "(trainable parameters unchanged or setup rejected)"), ()  # fmt: skip
    reason = f"not modelled: {', '.join(missing)}" if missing else ""
    labels = tuple(o.label for o in opts)
    return Family(name=fam, status="searched", reason=reason, options=labels), tuple(opts)


def _family_offload(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    fam = "CPU offload"
    if ctx.gpus and all(g.unified_memory for g in ctx.gpus):
        return Family(name=fam, status="not applicable", reason="unified memory: the CPU shares it"), ()
    opts = (
        _Option(label="offload optimizer to CPU (ZeRO-2 Offload)",
                par=(("zero_stage", 2), ("offload_optimizer", Offload.CPU))),
        _Option(label="offload optimizer + parameters to CPU (ZeRO-3 Offload)",
                par=(("zero_stage", 3), ("offload_optimizer", Offload.CPU), ("offload_params", Offload.CPU))),
    )  # fmt: skip
    return Family(name=fam, status="searched", options=tuple(o.label for o in opts)), opts


def _family_fused(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    """torch.optim.AdamW(fused=True) updates each tensor in one kernel: no foreach temporaries
    (torch/optim/adamw.py, _fused_adamw)."""
    fam = "fused optimizer"
    if ctx.setup.optimizer not in (OptimizerName.ADAM, OptimizerName.ADAMW):
        return Family(name=fam, status="not applicable", reason=f"no fused {ctx.setup.optimizer.value}"), ()
    if ctx.setup.optimizer_impl is not OptimizerImpl.FOREACH:
        return Family(name=fam, status="not applicable",
                      reason=f"already {ctx.setup.optimizer_impl.value}"), ()  # fmt: skip
    opt = _Option(
        label="fused AdamW (no foreach temporaries)", setup=(("optimizer_impl", OptimizerImpl.FUSED),)
    )
    return Family(name=fam, status="searched", options=(opt.label,)), (opt,)


def _family_kernels(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    """Liger's Triton kernels (RMSNorm, SwiGLU, RoPE, fused linear cross-entropy: HF Trainer
    ``use_liger_kernel``) on the model types Liger patches, ``torch.compile`` of each layer, and of the
    cross-entropy (``loss='compiled'``: no fp32 copy of the logits, formulas/lowbit_optim.compiled_ce)."""
    fam = "fused kernels / torch.compile"
    opts: list[_Option] = []
    if (
        ctx.setup.framework is Framework.HF
        and not ctx.setup.liger
        and ctx.spec.task == "causal-lm"
        and liger_applies(ctx.spec.model_type)
    ):
        opts.append(_Option(label="Liger kernels", setup=(("liger", True),)))
    if not ctx.setup.compiled:
        opts.append(_Option(label="torch.compile", setup=(("compiled", True),)))
    if ctx.setup.loss is LossImpl.STANDARD and not ctx.setup.liger and ctx.spec.task == "causal-lm":
        opts.append(_Option(label="compiled cross-entropy", setup=(("loss", LossImpl.COMPILED),)))
    if not opts:
        return Family(
            name=fam, status="not applicable", reason="already compiled (and Liger, where it applies)"
        ), ()
    return Family(name=fam, status="searched", options=tuple(o.label for o in opts)), tuple(opts)


def _family_zero_grad(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    """``optimizer.zero_grad(set_to_none=True)`` (torch >= 2.0's default): the gradients are freed between
    steps instead of kept zeroed through the next forward (``keep_grads``)."""
    fam = "free gradients between steps"
    if ctx.setup.grads_set_to_none:
        return Family(name=fam, status="not applicable", reason="zero_grad already sets them to None"), ()
    opt = _Option(label="zero_grad(set_to_none=True)", setup=(("grads_set_to_none", True),))
    return Family(name=fam, status="searched", options=(opt.label,)), (opt,)


def _family_grad_sync(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    """Under FSDP with gradient accumulation, a loop that skips the gradient sync until the last
    micro-batch (HF Trainer / accelerate's default, peakmem.defaults GRAD_SYNC) keeps every unit's unsharded
    gradients between micro-batches; reducing in every micro-batch (accelerate
    ``GradientAccumulationPlugin(sync_each_batch=True)``, as torchtitan and torchtune do) keeps the shards
    only, for one reduce-scatter a micro-batch more."""
    fam = "gradient sync under accumulation"
    fsdp = ctx.par is not None and ctx.par.fsdp is not FsdpMode.NONE
    if not (fsdp and ctx.par is not None and skips_grad_sync(ctx.setup, fsdp2=ctx.par.is_fsdp2)):
        why = "no FSDP loop that skips the gradient sync between micro-batches"
        return Family(name=fam, status="not applicable", reason=why), ()
    opt = _Option(label="reduce every micro-batch (accelerate sync_each_batch=True)",
                  setup=(("grad_sync", GradSync.EACH),))  # fmt: skip
    return Family(name=fam, status="searched", options=(opt.label,)), (opt,)


def _family_zero_init(ctx: _Ctx) -> tuple[Family, tuple[_Option, ...]]:
    """A ZeRO-3 model built outside ``deepspeed.zero.Init`` goes whole to each GPU and keeps torch's
    F.linear, which holds every gathered weight until its backward (formulas/zero3.py); built under it
    (TrainingArguments(deepspeed=...) before from_pretrained), neither."""
    fam = "deepspeed.zero.Init"
    par = ctx.par
    if par is None or not torch_linear(par):
        return Family(name=fam, status="not applicable", reason="not ZeRO-3 outside zero.Init"), ()
    opt = _Option(label="build the model under deepspeed.zero.Init",
                  par=(("zero_init", True), ("memory_efficient_linear", True)))  # fmt: skip
    return Family(name=fam, status="searched", options=(opt.label,)), (opt,)


FAMILIES: tuple[FamilyFn, ...] = (
    _family_checkpointing, _family_attention, _family_optimizer, _family_adapter, _family_offload,
    _family_fused, _family_kernels, _family_zero_grad, _family_grad_sync, _family_zero_init,
)  # fmt: skip


def _limits(search: _Search, gpu: Gpu) -> Limits:
    spec, s, cap = search.spec, search.setup, gpu.usable_bytes
    est = search.est

    def fits(setup: TrainingSetup, par: Parallelism | None = None) -> bool:
        return est.fits(setup, par, cap)

    # largest micro-batch: double, then bisect
    mb = 0
    if fits(replace(s, micro_batch=1)):
        hi = 1
        while hi < MAX_MICRO_BATCH and fits(replace(s, micro_batch=hi * 2)):
            hi *= 2
        top = min(hi * 2, MAX_MICRO_BATCH)
        mb = _largest_true(hi, top, lambda b: fits(replace(s, micro_batch=b))) or hi
    # longest sequence, up to the model's context
    ctx = spec.max_position_embeddings or s.seq_len
    seq = _largest_true(1, ctx, lambda n: fits(replace(s, seq_len=n))) or 0
    capped = seq == ctx
    # fewest GPUs: ZeRO-3 over N, same per-GPU setup
    fewest: int | None = None
    layout, note = "", ""
    if fits(s):
        fewest, layout = 1, "1 GPU"
    else:

        def ok(n: int) -> bool:
            return fits(s, Parallelism(gpus=n, zero_stage=3))

        n = 2
        while n < MAX_LIMIT_GPUS and not ok(n):
            n *= 2
        n = min(n, MAX_LIMIT_GPUS)
        if ok(n):
            lo = n // 2 + 1 if n > 2 else 2
            k = _first_fit(n - lo + 1, lambda i: ok(lo + i))
            fewest = lo + (k if k is not None else n - lo)
            layout = f"{fewest} GPUs, ZeRO-3 data parallel"
        else:
            note = (f"none up to {MAX_LIMIT_GPUS} with ZeRO-3 alone (activations do not "
                    "shard over data-parallel ranks); see `peakmem plan` for tensor/pipeline parallel "
                    "layouts")  # fmt: skip
    return Limits(largest_micro_batch=mb, longest_seq=seq, seq_capped=capped, fewest_gpus=fewest,
                  fewest_gpus_layout=layout, note=note)  # fmt: skip


def fit(
    spec: ModelSpec, setup: TrainingSetup, gpus: tuple[Gpu, ...] | list[Gpu], *,
    overheads: Overheads | None = None, top: int = TOP_CANDIDATES, margin: bool = False,
    par: Parallelism | None = None,
    costs: CostLookup | None = None,
) -> FitReport:  # fmt: skip
    """Verdicts for ``setup`` on each GPU, and the ranked changes that make it fit where it does not.
    ``margin``: a change makes it fit only when the high end of its band fits (verdict "fits", not
    "tight"); the candidates' ``needed_bytes`` are then those high ends. ``par``: the job's parallel
    layout (a :class:`peakmem.parallel.Parallelism`; None: one GPU), whose most loaded rank is judged.
    ``costs``: a derived spec's block-cost lookup (:class:`peakmem.estimate.TrainingEstimator`)."""
    require(len(gpus) > 0, "gpu", "", "give at least one GPU")
    t0 = time.perf_counter()
    gpus = tuple(gpus)
    est = _Estimator(spec, overheads, margin=margin, costs=costs)
    search = _Search(spec, setup, gpus, est, par)
    ctx = _Ctx(spec=spec, setup=setup, gpus=gpus, estimator=est, par=par)
    families: list[Family] = []
    options: list[tuple[str, tuple[_Option, ...]]] = []
    for fn in FAMILIES:
        fam, opts = fn(ctx)
        families.append(fam)
        if opts:
            options.append((fam.name, opts))
    families += _finisher_families(setup)
    base_cfg = _Config(setup=setup, par=par, changes=(), labels=())
    discrete = list(_discrete_configs(base_cfg, options))
    singles_cfgs = [c for c in discrete if len(c.labels) == 1]

    results: list[GpuFit] = []
    for gpu in gpus:
        rates = st.rates_for(gpu)
        base_step = search.base_step(rates)
        base = search.base.estimate
        verdict = Verdict(gpu=gpu.name, capacity_bytes=gpu.usable_bytes,
                          needed_bytes=base.needed_bytes, high_bytes=base.needed_high_bytes)  # fmt: skip
        cap = gpu.usable_bytes
        settled = search.base.needed <= cap  # the likely value fits (under margin: the high end)
        single_cfgs = list(singles_cfgs) if not settled else []
        for fin in (search.finish_micro_batch, search.finish_shard, search.finish_seq):
            c = fin(base_cfg, cap) if not settled else None
            if c is not None:
                single_cfgs.append(c)
        made = (search.candidate(cfg, gpu, rates, base_step) for cfg in single_cfgs)
        singles = [c for c in made if c is not None]
        cands: list[Candidate] = []
        if not settled:
            for cfg in discrete[1:]:
                if search.est.floor_needed(cfg.setup, cfg.par) is None:
                    continue
                if search.est.fits(cfg.setup, cfg.par, cap):
                    cand = search.candidate(cfg, gpu, rates, base_step)
                    if cand is not None:
                        cands.append(cand)
                    continue
                if len(cfg.labels) >= MAX_CHANGES:
                    continue
                for fin in (search.finish_micro_batch, search.finish_shard):
                    done = fin(cfg, cap)
                    if done is not None:
                        cand = search.candidate(done, gpu, rates, base_step)
                        if cand is not None:
                            cands.append(cand)
            cands += [c for c in singles if c.fits]
            cands = sorted(_minimal(_dedupe(cands)), key=_rank_key)[:top]
        results.append(GpuFit(gpu=gpu, verdict=verdict, candidates=tuple(cands),
                              singles=tuple(sorted(singles, key=_rank_key)),
                              limits=_limits(search, gpu)))  # fmt: skip
    fitting = [g for g in results if g.verdict.fits]
    smallest = min(fitting, key=lambda g: g.verdict.capacity_bytes).gpu.name if fitting else None
    base_step0 = search.base_step(st.rates_for(gpus[0]))
    assumptions = _fit_assumptions(gpus)
    return FitReport(
        model=spec.name, params=spec.params, setup=setup, baseline=search.base.estimate,
        baseline_step=base_step0,
        gpus=tuple(results), smallest_sufficient=smallest, search_space=tuple(families),
        assumptions=assumptions, estimates=est.calls, elapsed_s=time.perf_counter() - t0, parallelism=par,
    )  # fmt: skip


def _dedupe(cands: list[Candidate]) -> list[Candidate]:
    seen: set[frozenset[tuple[str, str, str]]] = set()
    out = []
    for c in cands:
        key = frozenset(ch.as_tuple() for ch in c.changes)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _finisher_families(setup: TrainingSetup) -> list[Family]:
    out = [
        Family(name="micro-batch + accumulation",
               status="searched" if setup.micro_batch > 1 else "not applicable",
               reason="" if setup.micro_batch > 1 else "micro-batch is already 1",
               options=("the largest divisor of the micro-batch that fits; accumulation keeps the "
                        "global batch",)),
    ]  # fmt: skip
    out.append(
        Family(
            name="shard over N GPUs",
            status="searched",
            options=(f"ZeRO-3 over the fewest of 2..{MAX_NODE_GPUS} GPUs",),
        )
    )
    out.append(Family(name="shorter sequence", status="searched",
                      reason="last resort: changes the job (flagged)",
                      options=(f"the longest multiple of {SEQ_STEP} that fits",)))  # fmt: skip
    out.append(
        Family(
            name="precision / other optimizers",
            status="not applicable",
            reason="not searched: they change numerics; compare with `peakmem train`",
        )
    )
    return out


def _fit_assumptions(gpus: tuple[Gpu, ...]) -> tuple[str, ...]:
    notes: list[str] = []
    seen: set[str] = set()
    for g in gpus:
        for n in st.rates_for(g).notes():
            if n not in seen:
                seen.add(n)
                notes.append(n)
    notes += [
        "a GPU fits a job when the device total (what nvidia-smi shows) is at most its usable memory",
        f"candidates combine at most {MAX_CHANGES} changes; a candidate is dropped when a subset of its "
        "changes already fits; ranked by fewest changes, then GPU-seconds per token (step-time model)",
        "relative cost: GPU-seconds per token against the unchanged job; MFU assumed independent of "
        "micro-batch and kernel; QLoRA's dequantisation at the full memory bandwidth (a lower bound)",
    ]
    return tuple(notes)


def fit_json(report: FitReport) -> dict[str, object]:
    """The fit report as JSON-ready values (bytes as int)."""
    return {
        "model": {"name": report.model, "params": report.params},
        "setup": setup_dict(report.setup),
        "parallelism": report.parallelism.describe() if report.parallelism is not None else None,
        "device_total_bytes": report.baseline.device_total_bytes,
        "needed_bytes": report.baseline.needed_bytes,
        "peak_allocated_bytes": report.baseline.peak_allocated_bytes,
        "step_time": _step_json(report.baseline_step),
        "smallest_sufficient": report.smallest_sufficient,
        "fits_any": report.any_fits,
        **({"verdict": report.gpus[0].verdict.state} if len(report.gpus) == 1 else {}),
        **({"band": report.baseline.band.json()} if report.baseline.band is not None else {}),
        "gpus": [
            {
                "gpu": g.gpu.name, "display_name": g.gpu.display_name,
                "capacity_bytes": g.verdict.capacity_bytes,
                "needed_bytes": g.verdict.needed_bytes, "fits": g.verdict.fits, "verdict": g.verdict.state,
                "high_bytes": g.verdict.high_bytes,
                "headroom_bytes": g.verdict.headroom_bytes,
                "candidates": [_candidate_json(c) for c in g.candidates],
                "singles": [_candidate_json(c) for c in g.singles],
                "limits": {
                    "largest_micro_batch": g.limits.largest_micro_batch, "longest_seq": g.limits.longest_seq,
                    "seq_capped_at_context": g.limits.seq_capped, "fewest_gpus": g.limits.fewest_gpus,
                    "fewest_gpus_layout": g.limits.fewest_gpus_layout, "note": g.limits.note,
                },
            }
            for g in report.gpus
        ],
        "search_space": [_family_json(f) for f in report.search_space],
        "assumptions": list(report.assumptions),
        "estimates": report.estimates,
        "elapsed_s": report.elapsed_s,
    }  # fmt: skip
