"""Property: every change ``fit`` suggests, re-estimated on its own through the public estimators,
fits its GPU; every limit it reports fits too.

Over a sample of catalog models (decoders and an encoder, dense and MoE, 100 M to 405 B), catalog
GPUs and plain sizes, and setups (batch, sequence, accumulation, precision, checkpointing, kernel).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs

from peakmem import planner
from peakmem.catalog import Gpu, get_gpu
from peakmem.estimate import estimate_training
from peakmem.model import ModelSpec
from peakmem.ranks import estimate_ranks
from peakmem.resolve import gpu_of_size, resolve_model
from peakmem.training import AttentionKernel, Checkpointing, PaddedLengths, Precision, TrainingSetup
from tiny_models import op_modelled

MODELS = (
    "gpt2", "gpt2-xl", "pythia-1.4b", "opt-1.3b", "llama-3.2-1b", "llama-3.1-8b", "qwen3-0.6b",
    "mistral-7b-v0.1", "gemma-2-2b", "phi-3-mini", "mixtral-8x7b", "qwen3-30b-a3b", "bert-base-uncased",
    "llama-3.1-70b", "llama-3.1-405b",
)  # fmt: skip
GPUS = ("rtx-3060-12gb", "rtx-4090", "l4", "t4", "a100-40gb", "a100-80gb", "h100-sxm", "m4-max-128gb")
SIZES = ("4GB", "8GB", "16GB", "24GB", "48GB")


@cache
def _spec(name: str) -> ModelSpec:
    return resolve_model(name)


@cache
def _gpu(name: str) -> Gpu:
    return get_gpu(name) if name not in SIZES else gpu_of_size(name)


def _needed(spec: ModelSpec, setup: TrainingSetup, par: object) -> int:
    """What the GPU must hold (``Estimate.needed_bytes``: the device total less the cache the allocator frees
    before an OOM, which only batches of varying lengths leave)."""
    if par is None:
        return estimate_training(spec, setup).needed_bytes
    return estimate_ranks(spec, setup, par).most_loaded.estimate.needed_bytes  # type: ignore[arg-type]


setups = hs.builds(
    TrainingSetup,
    micro_batch=hs.sampled_from((1, 2, 4, 8)),
    seq_len=hs.sampled_from((128, 512, 1024, 2048, 4096)),
    grad_accum=hs.sampled_from((1, 2, 4)),
    precision=hs.sampled_from((Precision.MIXED_BF16, Precision.AMP_BF16, Precision.BF16, Precision.FP32)),
    checkpointing=hs.sampled_from(tuple(Checkpointing)),
    attention=hs.sampled_from(tuple(AttentionKernel)),
    padded_lengths=hs.sampled_from(tuple(PaddedLengths)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=hs.sampled_from(MODELS), gpus=hs.lists(hs.sampled_from(GPUS + SIZES), min_size=1, max_size=2,
       unique=True), setup=setups)  # fmt: skip
def test_every_suggestion_fits_when_re_estimated(model: str, gpus: list[str], setup: TrainingSetup) -> None:
    spec = _spec(model)
    assume(op_modelled(spec, setup))
    seq = min(setup.seq_len, spec.max_position_embeddings)
    setup = replace(setup, seq_len=seq)
    report = planner.fit(spec, setup, [_gpu(g) for g in gpus])
    for g in report.gpus:
        cap = g.gpu.usable_bytes
        assert g.verdict.fits == (_needed(spec, setup, None) <= cap)
        for c in g.candidates:
            assert c.fits, c.label
            assert _needed(spec, c.setup, c.parallelism) == c.needed_bytes <= cap, c.label
            assert len(c.steps) <= planner.MAX_CHANGES
        for c in g.singles:
            assert _needed(spec, c.setup, c.parallelism) == c.needed_bytes
        lim = g.limits
        if lim.largest_micro_batch:
            assert _needed(spec, replace(setup, micro_batch=lim.largest_micro_batch), None) <= cap
        if lim.longest_seq:
            assert _needed(spec, replace(setup, seq_len=lim.longest_seq), None) <= cap
        if lim.fewest_gpus and lim.fewest_gpus > 1:
            from peakmem.parallel import Parallelism

            assert _needed(spec, setup, Parallelism(gpus=lim.fewest_gpus, zero_stage=3)) <= cap


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=hs.sampled_from(MODELS[:-1]), gpu=hs.sampled_from(GPUS[:-1] + SIZES),
       engine=hs.sampled_from(("hf", "vllm", "sglang")), batch=hs.sampled_from((1, 4, 16)),
       context=hs.sampled_from((1024, 4096, 16384)))  # fmt: skip
def test_every_inference_suggestion_fits(model: str, gpu: str, engine: str, batch: int, context: int) -> None:
    from peakmem.formulas.serving import estimate_inference
    from peakmem.inference import InferenceSetup

    spec = _spec(model)
    if spec.task != "causal-lm":
        return
    setup = InferenceSetup(engine=engine, batch=batch, context=min(context, spec.max_position_embeddings))
    report = planner.fit_inference(spec, setup, [_gpu(gpu)])
    for g in report.gpus:
        for c in g.candidates:
            est = estimate_inference(spec, c.setup)
            assert est.device_total_bytes == c.needed_bytes <= g.capacity_bytes, c.label
            if engine in ("vllm", "sglang"):
                conc = est.extra["max_concurrent_sequences"]
                assert isinstance(conc, int) and conc >= c.setup.batch, c.label


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=hs.sampled_from(("llama-3.2-1b", "llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt2-xl")),
       gpu=hs.sampled_from(("rtx-4090", "a100-80gb", "h100-sxm")), max_gpus=hs.sampled_from((8, 24, 64)),
       seq=hs.sampled_from((2048, 8192, 32768)))  # fmt: skip
def test_every_plan_layout_fits_when_re_estimated(model: str, gpu: str, max_gpus: int, seq: int) -> None:
    """Each layout ``plan`` shows (context and expert parallel included), re-estimated per rank on its
    own, needs what the plan says and fits; the GPUs it uses are within --max-gpus."""
    spec = _spec(model)
    setup = TrainingSetup(seq_len=min(seq, spec.max_position_embeddings))
    report = planner.plan(spec, setup, _gpu(gpu), max_gpus, top=4)
    for lay in (*report.layouts, *((report.fewest_gpus,) if report.fewest_gpus else ())):
        par = lay.parallelism
        assert lay.step.gpus <= max_gpus and par.gpus == lay.step.gpus
        assert _needed(spec, lay.setup, par) == lay.needed_bytes <= _gpu(gpu).usable_bytes
        assert lay.setup.seq_len % par.cp == 0
        assert par.dp * lay.setup.micro_batch * lay.setup.grad_accum == report.global_batch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=hs.sampled_from(MODELS), gpu=hs.sampled_from((None, *GPUS, *SIZES)), setup=setups)
def test_every_way_down_saves_memory_when_re_estimated(
    model: str, gpu: str | None, setup: TrainingSetup
) -> None:
    """Issue 13: train lists only changes that save memory; each, re-estimated through the public
    estimators, needs strictly less than the job as asked."""
    spec = _spec(model)
    assume(op_modelled(spec, setup))
    setup = replace(setup, seq_len=min(setup.seq_len, spec.max_position_embeddings))
    base = _needed(spec, setup, None)
    got = planner.ways_down(spec, setup, capacity_bytes=_gpu(gpu).usable_bytes if gpu else None)
    for w in got.ways:
        assert w.needed_bytes == _needed(spec, w.setup, w.parallelism) < base
        assert w.saving_bytes == base - w.needed_bytes
    assert not got.no_help or "save" in got.no_help
