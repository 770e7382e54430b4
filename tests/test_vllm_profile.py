"""vLLM's memory profile as its 0.19 logs give it, from 0.9 on (formulas/serving/vllm_profile.py): the figures
by hand, where they enter the KV pool, and that they are what the fitting logs of
benchmarks/published_scale.json say."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from peakmem.formulas.serving import estimate_inference, vllm_profile
from peakmem.formulas.serving.context import CUDA_CONTEXT_BYTES
from peakmem.inference import Engine, InferenceSetup
from peakmem.resolve import resolve_model
from peakmem.units import GiB

POINTS = Path(__file__).resolve().parents[1] / "benchmarks" / "published_scale.json"
KIND = "serve-vllm-v1-kv-pool"
LLAMA_VOCAB = 128_256


def test_sampler_by_hand() -> None:
    # 1024 rows x 128,256 logits x (2 B of bf16 logits + 13.25 B)
    assert vllm_profile.sampler_bytes(1024, LLAMA_VOCAB, 2) == 1024 * LLAMA_VOCAB * 61 // 4
    assert vllm_profile.measured((0, 9)) and vllm_profile.measured((0, 18)) and vllm_profile.measured((0, 27))
    assert not vllm_profile.measured((0, 8))  # 0.8.5 subtracts every byte outside torch, the context too
    # the top-k / top-p path of the warm-up: FlashInfer's (CUDA, to 0.11; the 0.19 figure assumed), the full
    # sort (0.12-0.16, and ROCm before 0.17), the triton kernel (0.17 on)
    sort, triton = vllm_profile.SORT_BYTES_PER_LOGIT, vllm_profile.SAMPLER_BYTES_PER_LOGIT
    assert [vllm_profile.bytes_per_logit((0, m)) for m in (10, 11, 12, 16, 17, 27)] == [triton] * 2 + [
        sort
    ] * 2 + [triton] * 2
    assert vllm_profile.bytes_per_logit((0, 11), flashinfer=False) == sort
    assert vllm_profile.bytes_per_logit((0, 17), flashinfer=False) == triton
    # by the source's count: fp32 copy 4 + sort values 4 + indices 8 + int64 iota 8 + cub's alternate key and
    # value buffers 4 + 8 = 36 B beyond the logits; the fitting log reads 36.92
    assert 36 <= sort < 37
    assert vllm_profile.non_torch(1) is vllm_profile.NON_TORCH_ONE_GPU
    assert vllm_profile.non_torch(4) is vllm_profile.NON_TORCH_TENSOR_PARALLEL


def _pool(tp: int, version: str = "0.19") -> tuple[int, int, int]:
    spec = resolve_model("llama-3.1-8b")
    setup = InferenceSetup(engine=Engine.VLLM, context=8192, tp=tp, max_num_seqs=1024, gpu_bytes=80 * GiB,
                           enforce_eager=True, engine_version=version)  # fmt: skip
    est = estimate_inference(spec, setup)
    weights = next(i.bytes for i in est.items if i.path.startswith("weights"))
    act = next(i.bytes for i in est.items if i.path.startswith("activations"))
    budget = est.extra["memory_budget_bytes"]
    assert isinstance(budget, int)
    return budget - weights - act, est.extra["kv_pool_bytes"], act  # type: ignore[return-value]


def test_the_sampler_spans_the_whole_vocabulary_on_every_rank() -> None:
    """Llama-3.1-8B at max_num_seqs 1024: the sampler warm-up (1.87 GiB) is the profile's peak at TP 1, 2
    and 4 alike (the logs read a torch peak increase of 1.89 GiB at each); the pool loses the non-torch
    increase, 0.25 GiB on one GPU and 2.13 GiB at TP > 1."""
    sampler = vllm_profile.sampler_bytes(1024, LLAMA_VOCAB, 2)
    for tp in (1, 2, 4):
        rest, pool, act = _pool(tp)
        assert act == sampler, tp
        assert pool == rest - vllm_profile.non_torch(tp).likely, tp
    rest, pool, act = _pool(1, "0.8")  # before the baseline accounting: the context, the old warm-up
    assert pool == rest - CUDA_CONTEXT_BYTES and act < sampler
    rest, pool, act = _pool(1, "0.15")  # the sort path: 1024 x 128,256 x (2 + 36.92) B
    assert act == int(1024 * LLAMA_VOCAB * (2 + vllm_profile.SORT_BYTES_PER_LOGIT)) and pool == rest - (
        vllm_profile.NON_TORCH_ONE_GPU.likely
    )


def _fitting_logs(quantity: str = "vllm_non_kv") -> list[dict[str, Any]]:
    doc = json.loads(POINTS.read_text())
    return [p for p in doc["points"] if p["kind"] == KIND and p["set"] == "fit" and not p["not_expressible"]
            and p["measured"]["quantity"] == quantity]  # fmt: skip


def test_the_figures_are_the_fitting_logs() -> None:
    """SAMPLER_BYTES_PER_LOGIT is the median torch peak increase per logit, less the bf16 logits, of the
    fitting logs of dense 16-bit models with vocabularies of at least 100k (where the sampler sets the
    peak); the non-torch figures the medians and ranges of the fitting logs at TP 1 and TP > 1."""
    logs = _fitting_logs()
    per_logit = []
    for p in logs:
        spec = resolve_model(p["model"])
        if not spec.is_moe and spec.vocab_size >= 100_000 and p["job"]["weights"] != "fp32":
            rows = p["job"]["max_num_seqs"] * spec.vocab_size
            per_logit.append(p["measured"]["components"]["torch_peak_memory_increase_gib"] * GiB / rows - 2)
    assert len(per_logit) == 11
    assert abs(statistics.median(per_logit) - vllm_profile.SAMPLER_BYTES_PER_LOGIT) < 0.01
    one, several = vllm_profile.NON_TORCH_ONE_GPU, vllm_profile.NON_TORCH_TENSOR_PARALLEL
    for many, figure in ((False, one), (True, several)):
        gib = [p["measured"]["components"]["non_torch_forward_increase_memory_gib"] for p in logs
               if (p["job"]["tp"] > 1) == many]  # fmt: skip
        assert figure.likely == int(statistics.median(gib) * GiB)
        assert figure.high == int(max(gib) * GiB)
        assert figure.low == (one.low if many else int(min(gib) * GiB))


def test_the_sort_figure_is_the_fitting_log() -> None:
    """SORT_BYTES_PER_LOGIT: the one fitting pool record with a breakdown from a release that sorts
    (llm-d-benchmark's Qwen3-32B on an H100, vLLM 0.14.1-0.15.1): its peak activation over vLLM's default
    1024 rows of 151,936 logits, less the bf16 logits."""
    from peakmem.vllm_defaults import vllm_batch

    (p,) = [p for p in _fitting_logs("vllm_available_kv_cache")
            if "peak_activation_memory_gib" in p["measured"].get("components", {})]  # fmt: skip
    spec = resolve_model(p["model"])
    seqs = vllm_batch((0, 15), gpu_bytes=80 * GiB, max_model_len=p["job"]["max_model_len"]).max_num_seqs
    peak = p["measured"]["components"]["peak_activation_memory_gib"] * GiB
    assert abs(peak / (seqs * spec.vocab_size) - 2 - vllm_profile.SORT_BYTES_PER_LOGIT) < 0.01
