"""Serving verdicts: what a request needs depends on the GPU asked about only through the engine's own
defaults for it (vLLM's batch, SGLang's tier); vLLM/SGLang fit when the KV pool they preallocate on that
GPU holds the request; ``infer`` and ``fit --infer`` agree."""

from __future__ import annotations

import json

import pytest

from peakmem import planner
from peakmem.cli import main
from peakmem.formulas.serving import estimate_inference, serving_fit
from peakmem.formulas.serving.context import CUDA_CONTEXT_BYTES
from peakmem.formulas.serving.vllm_profile import NON_TORCH_ONE_GPU
from peakmem.inference import VLLM_GPU_MEMORY_UTILIZATION, InferenceSetup
from peakmem.resolve import resolve_gpu, resolve_gpus, resolve_model
from peakmem.units import GiB

GPUS = ("rtx-4090", "a100-80gb", "h200")
EXAMPLE = ["llama-3.1-8b", "--engine", "vllm", "--context", "8192", "--batch", "16"]

# Llama-3.1-8B by hand: 8,030,261,248 bf16 parameters; KV 32 layers x 8 KV heads x 128 x (K, V) x 2 B
# = 131,072 B a token, so a 8192-token sequence is 1 GiB (512 blocks of 16). vllm serve's defaults on a
# GPU under 70 GiB (vllm/engine/arg_utils.py get_batch_defaults; peakmem.vllm_defaults): max_num_seqs 256,
# max_num_batched_tokens 2048. The profiled chunk of 2048 tokens (formulas/serving/forward.py
# layer_transient_bytes, fused): MLP 3 x 14336 x 2 B + residual 2 x 4096 x 2 B = 102,400 B a token, below
# vLLM 0.19+'s sampler warm-up, 256 rows x 128,256 x (2 + 13.25) B (formulas/serving/vllm_profile.py)
WEIGHTS = 2 * 8_030_261_248
KV_PER_SEQUENCE = 8192 * 32 * 8 * 128 * 2 * 2
ACTIVATIONS = 2048 * (3 * 14336 * 2 + 2 * 4096 * 2)
SAMPLER = int(256 * 128_256 * 15.25)  # 500,711,424 > ACTIVATIONS = 209,715,200
# CUDA graphs (formulas/serving/cuda_graphs.py), vLLM 0.12+ at its defaults: 51 PIECEWISE + 35 FULL graphs
# x 6 MiB, plus the largest capture's working set (512 tokens x 102,400 B): 541,065,216 + 52,428,800 =
# 593,494,016 B. vLLM 0.27 runs a dense Llama on Model Runner V2, which reserves nothing for them (its
# profile_cudagraph_memory returns 0 before 0.29): they come on top of the KV pool, not out of it.
GRAPHS = 86 * 6 * 2**20 + 512 * (3 * 14336 * 2 + 2 * 4096 * 2)


def _cli_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, object]]:
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_vllm_example_by_hand_on_a_4090() -> None:
    spec = resolve_model("llama-3.1-8b")
    cap = resolve_gpu("rtx-4090").usable_bytes
    f = serving_fit(spec, InferenceSetup(engine="vllm", context=8192, batch=16), cap)  # type: ignore[arg-type]
    budget = int(cap * VLLM_GPU_MEMORY_UTILIZATION)
    # vLLM >= 0.19 (0.27 here): the profile's non-torch increase comes out of the budget, the context is its
    # baseline (formulas/serving/vllm_profile.py); the profile's peak is the sampler warm-up (0.47 GiB)
    pool = budget - WEIGHTS - SAMPLER - NON_TORCH_ONE_GPU.likely
    assert (f.budget_bytes, f.pool_bytes) == (budget, pool)
    assert (
        pool == 6_024_925_348
    )  # 5.61 GiB of torch's 23.65 (5.06 GiB where the V1 runner takes the graphs out)
    assert f.estimate.extra["prefill_chunk_tokens"] == 2048 and f.estimate.extra["max_num_seqs"] == 256
    assert f.kv_needed_bytes == 16 * KV_PER_SEQUENCE == 16 * GiB
    assert f.max_concurrent == pool // KV_PER_SEQUENCE == 5
    v1 = serving_fit(spec, InferenceSetup(engine="vllm", context=8192, batch=16, model_runner="v1"), cap)  # type: ignore[arg-type]
    assert v1.pool_bytes == pool - GRAPHS == 5_431_431_332 and v1.max_concurrent == 5
    assert not f.fits
    assert f.headroom_bytes == pool - 16 * GiB  # the pool's shortfall, the tighter of the two
    # the request: weights + 16 sequences' KV + the profiled chunk + CUDA context and the profile's
    # non-torch increase, plus allocator slack
    outside = CUDA_CONTEXT_BYTES + NON_TORCH_ONE_GPU.likely
    floor = WEIGHTS + 16 * KV_PER_SEQUENCE + SAMPLER + outside + GRAPHS
    assert floor <= f.needed_bytes <= floor * 1.01


def test_needs_follow_vllms_batch_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """Each GPU's answer is its verdict's need; the 4090 and the A100-80GB (its name keeps it in the small
    tier) and no GPU named share vLLM's small-tier batch (256 sequences, 2048 tokens), the H200 profiles
    1024 sequences (peakmem.vllm_defaults): its sampler warm-up is 4 x 500,711,424 B, and its FULL decode
    graphs reach 512 (51, not 35: 16 more graphs of 6 MiB)."""
    totals, fits = [], []
    for gpu in GPUS:
        rc, out = _cli_json(capsys, ["infer", *EXAMPLE, "--gpu", gpu, "--json"])
        (v,) = out["verdicts"]  # type: ignore[misc]
        assert v["needed_bytes"] == out["device_total_bytes"]
        totals.append(out["device_total_bytes"])
        fits.append((rc, v["fits"], v["max_concurrent"], out["max_num_seqs"], out["prefill_chunk_tokens"]))
    # the graphs' 0.55 GiB on top of each pool (Model Runner V2, vLLM 0.27). The A100-80GB's budget is 0.9
    # x torch's total, 81050 MiB (its driver's 870 MiB left out, as mem_get_info does), less weights, the
    # sampler warm-up and vLLM 0.19+'s 0.25 GiB non-torch increase: 55.56 GiB, 55 sequences
    assert fits == [(1, False, 5, 256, 2048), (0, True, 55, 256, 2048), (0, True, 108, 1024, 8192)]
    small, _, large = totals
    assert totals[0] == totals[1] and large - small >= 3 * SAMPLER + 16 * 6 * 2**20
    rc, out = _cli_json(capsys, ["infer", *EXAMPLE, "--json"])  # no GPU: vLLM's small tier
    assert rc == 0 and out["device_total_bytes"] == small


@pytest.mark.parametrize("gpu", GPUS)
def test_infer_and_fit_infer_exit_alike(capsys: pytest.CaptureFixture[str], gpu: str) -> None:
    rc_infer, infer = _cli_json(capsys, ["infer", *EXAMPLE, "--gpu", gpu, "--json"])
    rc_fit, fit = _cli_json(capsys, ["fit", *EXAMPLE, "--infer", "--gpu", gpu, "--json"])
    (v,) = infer["verdicts"]  # type: ignore[misc]
    (g,) = fit["gpus"]  # type: ignore[misc]
    assert rc_infer == rc_fit
    for key in ("fits", "needed_bytes", "max_concurrent"):
        assert v[key] == g[key], key


@pytest.mark.parametrize("engine", ["hf", "vllm", "sglang", "llamacpp"])
@pytest.mark.parametrize(("batch", "context"), [(1, 2048), (4, 32768), (16, 8192)])
def test_infer_verdict_equals_the_planners(engine: str, batch: int, context: int) -> None:
    """serving_fit (infer's verdict) against planner.fit_inference as it is today: its own check
    (pool holds the batch and the device total fits) reads the same estimate, so they agree; at merge the
    planner calls serving_fit itself and this stays as the regression test."""
    spec = resolve_model("llama-3.1-8b")
    gpus = resolve_gpus(",".join(GPUS))
    setup = InferenceSetup(engine=engine, batch=batch, context=context)  # type: ignore[arg-type]
    report = planner.fit_inference(spec, setup, gpus, top=1)
    needs = {estimate_inference(spec, setup).device_total_bytes}
    for g, gpu in zip(report.gpus, gpus, strict=True):
        f = serving_fit(
            spec, setup.on_gpu(gpu.usable_bytes, gpu.display_name, gpu.memory_bytes), gpu.usable_bytes
        )
        needs.add(f.needed_bytes)
        assert (f.fits, f.needed_bytes) == (g.fits, g.needed_bytes), (engine, batch, context, gpu.name)
        if engine in ("vllm", "sglang"):
            assert f.max_concurrent == g.max_concurrent
            assert f.fits == (f.max_concurrent is not None and f.max_concurrent >= batch)
    # the request's needs, whatever the GPU; but SGLang's CUDA graphs capture up to the cuda_graph_max_bs it
    # picks for each GPU (sglang_defaults.py), vLLM profiles the batch it picks for each GPU
    # (vllm_defaults.py), and transformers' generate replayed through the allocator reserves at most what
    # each GPU leaves (formulas/serving/cache_growth.py): each GPU's needs are then its own
    assert len(needs) == 1 or engine in ("sglang", "vllm", "hf")
    if engine == "sglang":  # 4090: sizes 1, 2, 4, 8, 12, 16, 24; A100-80GB, H200: up to 256 (36); no GPU: 160
        graphs = [serving_fit(spec, setup, g.usable_bytes).estimate.extra["cuda_graphs"] for g in gpus]
        assert graphs == [7, 36, 36] and estimate_inference(spec, setup).extra["cuda_graphs"] == 24


def test_pooled_verdict_is_the_pool_not_the_bytes() -> None:
    """A request that needs less than the GPU but more than vLLM's 0.9 of it does not fit (before this,
    the device total followed the GPU and the verdict said yes)."""
    spec = resolve_model("llama-3.1-8b")
    cap = resolve_gpu("rtx-4090").usable_bytes
    hf = serving_fit(spec, InferenceSetup(context=8192, batch=6), cap)
    vllm = serving_fit(spec, InferenceSetup(engine="vllm", context=8192, batch=6), cap)  # type: ignore[arg-type]
    assert vllm.max_concurrent == 5 and not vllm.fits
    assert vllm.needed_bytes < cap  # the bytes alone would have fitted
    assert hf.pool_bytes is None and hf.fits == (hf.needed_bytes <= cap)
    v = vllm.verdict("rtx-4090")
    assert (v.fits, v.headroom_bytes, v.capacity_bytes) == (False, vllm.headroom_bytes, cap)


def test_sglang_example_uses_its_default_fraction() -> None:
    """SGLang on a 4090: mem_fraction_static 0.847 (server_args.py 0.5.5: 24,564 MiB less 512 + 2048 x 1.5 +
    24 x 2 + 128 = 3,760 MiB, rounded to 3 digits) holds weights and pool only."""
    spec = resolve_model("llama-3.1-8b")
    gpu = resolve_gpu("rtx-4090")
    cap = gpu.usable_bytes  # torch's 23.65 GiB; SGLang's tiers and fraction read nvidia-smi's 24,564 MiB
    setup = InferenceSetup(engine="sglang", context=8192, batch=16).on_gpu(
        cap, gpu.display_name, gpu.memory_bytes
    )  # type: ignore[arg-type]
    f = serving_fit(spec, setup, cap)
    assert f.fraction == round((24564 - 3760) / 24564, 3) == 0.847
    # of what the CUDA context leaves (sglang model_runner.py min_per_gpu_memory: formulas/serving/paged.py)
    assert f.pool_bytes == int((cap - CUDA_CONTEXT_BYTES) * 0.847) - WEIGHTS == 4_993_460_876
    assert f.max_concurrent == 4 and not f.fits  # one-token pages: 8192 x 131,072 B a sequence
