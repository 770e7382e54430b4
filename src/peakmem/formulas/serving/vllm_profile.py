"""vLLM >= 0.9: what its memory profile subtracts from ``gpu_memory_utilization`` x GPU, as 0.19 logs it.

vLLM 0.19 logs the split it sizes the KV pool with (vllm/v1/worker/gpu_worker.py
``determine_available_memory``, at DEBUG/INFO: "Total non KV cache memory: X; torch peak memory increase:
Y; non-torch forward increase memory: Z; weights memory: W"; "Available KV cache memory" = requested -
X): the weights, the profile run's torch peak increase and what the device gained outside torch during
it. The CUDA context and the NCCL communicators of worker init are the baseline of that profile
(its "worker_init_snapshot"), outside X. Two of those parts are measured here, not derived:

* the sampler warm-up (``_dummy_sampler_run``: the LM head's logits for ``max_num_seqs`` rows and the
  sampler over them) over the **full** vocabulary on every tensor-parallel rank (the torch peak
  increase of Llama-3.1-8B reads 1.89 GiB at TP 1, 2 and 4 alike), at
  :data:`SAMPLER_BYTES_PER_LOGIT` beyond the logits' own dtype;
* the non-torch increase (cuBLAS / attention workspaces; at TP > 1 the NCCL and custom all-reduce
  buffers the first collectives allocate).

Both from the FITTING half of the seventeenth search's llm-d-planner logs (benchmarks/published_scale.json,
kind serve-vllm-v1-kv-pool, set fit; vLLM 0.19.0, H100 80GB HBM3, max_num_seqs 1024), set on
2026-12-07 after that search's blind estimate had been read (its held-out points are flagged examined).
The same accounting from 0.9 (:data:`BASELINE_RELEASE`) and the warm-up's top-k / top-p path by release
(:func:`bytes_per_logit`) were set from vLLM's source and the eighteenth search's FITTING pools after its
blind estimate (its held-out points flagged examined too).
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.breakdown import BandTerm
from peakmem.model import ModelSpec
from peakmem.units import GiB
from peakmem.weight_formats import Scheme, WeightFormat

# the release whose logs these figures come from (and later ones, until a log says otherwise)
MEASURED_RELEASE = (0, 19)
# From vLLM 0.9.2 (peakmem reads the 0.9 line as its last release) the V1 worker sizes the pool the same
# way: ``requested_memory`` = gpu_memory_utilization x the total of an ``init_snapshot`` taken at worker
# init (the CUDA context inside that baseline), less ``non_kv_cache_memory`` = weights + the profile's
# torch peak increase + its non-torch increase (vllm/v1/worker/gpu_worker.py determine_available_memory,
# read in 0.9.2, 0.10.1, 0.11.0, 0.14.1, 0.17.0, 0.19.0). 0.8.5-0.9.1 subtracted every byte outside torch
# after the profile, the context included (peakmem's older accounting).
BASELINE_RELEASE = (0, 9)
# The sampler warm-up's top-k / top-p (vllm/v1/sample/ops/topk_topp_sampler.py), by release:
# 0.17 on, apply_top_k_top_p_triton for 8 or more rows (topk_topp_triton.py; no full sort): the 0.19 logs'
# figure below. 0.12-0.16: FlashInfer's sampler only on VLLM_USE_FLASHINFER_SAMPLER=1, so
# apply_top_k_top_p sorts the whole vocabulary (logits.sort: fp32 values and int64 indices out, an int64
# iota in, cub's alternate key / value buffers: 32 B per logit beside the fp32 copy, 36 beyond the 16-bit
# logits by that count); the one fitting log with that release's breakdown (llm-d-benchmark's Qwen3-32B on
# an H100: peak activation 5.64 GiB over 1024 x 151,936 logits) reads 38.92 B per logit, 36.92 beyond bf16.
# Up to 0.11 FlashInfer's fused top-k / top-p sampling ran by default on CUDA where FlashInfer is installed
# (``VLLM_USE_FLASHINFER_SAMPLER is not False``; vLLM's images ship it): not measured here, the 0.19 figure
# is taken for it. ROCm has no FlashInfer: ``forward_native`` sorts before 0.17 (0.12 on: unless the
# opt-in AITER sampler).
TRITON_TOPK_RELEASE = (0, 17)
SORT_DEFAULT_RELEASE = (0, 12)
SORT_BYTES_PER_LOGIT = 36.92
# torch peak increase / (max_num_seqs x vocabulary), on the 11 fitting logs whose peak is the sampler's
# (dense 16-bit models with vocabularies of 100k-256k: Qwen2.5-7B, Qwen3-8B, Llama-3.1-8B, Phi-4, Gemma-2-2B,
# Kimi-Dev-72B, tests/test_vllm_profile.py lists them): 14.83 (Gemma-2-2B) .. 15.88 (Phi-4) B per logit,
# median 15.25 (Qwen3-8B), less 2 for the bf16 logits. The fp32 Llama-3.1-8B reads 18.07 (this gives 17.25)
SAMPLER_BYTES_PER_LOGIT = 13.25


# From vLLM 0.14 the fused-MoE layers run as modular kernels (layers/fused_moe/modular_kernel.py
# ``_allocate_buffers``) whose intermediate caches are views of the worker's WorkspaceManager buffer
# (v1/worker/workspace.py: one uint8 tensor a micro-batch, grown on first use, never freed). The profile's
# dummy forward grows it to the chunk's size, and the sampler warm-up that follows (gpu_model_runner.py
# ``profile_run``) runs with it still held, so the profile's torch peak is that buffer plus the sampler's.
# 0.13 called the plain ``fused_experts`` (unquantized_fused_moe_method.py, fp8.py), whose caches are
# freed, except block-FP8 through DeepGEMM (TP < 8 where DeepGEMM is installed: deep_gemm_moe_fp8 builds a
# modular kernel), not priced. Triton's shapes (fused_moe.py ``TritonExperts.workspace_shapes``,
# 0.14.1-0.19.0): [M, k, max(N / 2, K)] and [M, k, max(N, K)] in the activations' dtype, the output a view
# of the first (N: the rank's gate + up rows, K: hidden, k: experts a token). Which layers run it: 16-bit
# experts on every platform (oracle/unquantized.py: Triton unless FlashInfer's opt-in or ROCm AITER's),
# block-FP8 experts on Hopper (oracle/fp8.py: Triton first for tensor parallelism from 0.17; 0.14-0.16
# Triton at TP >= 8, and below it DeepGEMM's larger M-aligned workspace where DeepGEMM is installed, which
# peakmem does not price). Not priced: other formats (FlashInfer, Marlin, triton_kernels MXFP4 paths) and
# Blackwell's FP8 experts. The llm-d-planner 0.19 fitting logs' torch peak increase (H100, 1024 rows, 8192
# tokens) reads this buffer plus the sampler's 15.25 B a logit within 2 %: DeepSeek-V2-Lite 1.93 GiB (0.45 +
# 1.49), Qwen3-30B-A3B 2.68 (0.50 + 2.21), Qwen1.5-MoE-A2.7B 2.47 (0.30 + 2.21).
MODULAR_MOE_RELEASE = (0, 14)
# to 0.17 the modular kernel cut M into chunks of VLLM_FUSED_MOE_CHUNK_SIZE tokens (envs.py: 16 x 1024),
# the output apart when more than one; 0.18 dropped the chunking
UNCHUNKED_MOE_RELEASE = (0, 18)
FUSED_MOE_CHUNK_TOKENS = 16 * 1024
WORKSPACE_ALIGN = 256  # WorkspaceManager.get_simultaneous rounds each view up to 256 B
# the architectures whose block-FP8 experts run Triton's modular kernel by default (oracle/fp8.py above)
TRITON_FP8_BLOCK_GPUS = ("hopper",)


def holds_moe_workspace(version: tuple[int, int], fmt: WeightFormat, architecture: str) -> bool:
    """Whether vLLM ``version``'s MoE layers keep the modular kernels' workspace for ``fmt`` experts on a
    GPU of ``architecture`` (see :data:`MODULAR_MOE_RELEASE`)."""
    if version < MODULAR_MOE_RELEASE:
        return False
    return fmt.scheme is Scheme.FLOAT or (
        fmt.scheme is Scheme.FP8_BLOCK and architecture in TRITON_FP8_BLOCK_GPUS
    )


def moe_workspace_bytes(
    spec: ModelSpec, tokens: int, expert_slices: int, act_bytes: int, version: tuple[int, int]
) -> int:
    """The WorkspaceManager buffer the largest MoE layer grows for a ``tokens``-token forward, its experts'
    intermediate rows split ``expert_slices`` ways (0 for a dense model)."""
    m = tokens if version >= UNCHUNKED_MOE_RELEASE else min(tokens, FUSED_MOE_CHUNK_TOKENS)
    best = 0
    for g in spec.groups:
        mlp = g.layer.mlp
        if not mlp.is_moe:
            continue
        width = -(-mlp.intermediate_size // expert_slices)
        n, h, k = (2 * width if mlp.gated else width), spec.hidden_size, mlp.experts_per_token
        views = [m * k * max(width, h), m * k * max(n, h)]
        if m < tokens:  # chunked: the whole output apart
            views.append(tokens * h)
        best = max(best, sum(-(-v * act_bytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN for v in views))
    return best


def workspace_note(workspace: int, tokens: int) -> str:
    """The answer's line for the MoE workspace the sampler warm-up runs beside."""
    return (
        f"vLLM >= {MODULAR_MOE_RELEASE[0]}.{MODULAR_MOE_RELEASE[1]}: the fused-MoE layers' workspace for "
        f"{tokens} tokens ({workspace} B, never freed) is "
        "still held when the sampler warm-up runs, so the profile's peak is both (formulas/serving/"
        "vllm_profile.py MODULAR_MOE_RELEASE)"
    )


@dataclass(frozen=True, kw_only=True)
class NonTorch:
    """vLLM's "non-torch forward increase memory" on one worker: its likely value and the fitting logs'
    range."""

    low: int
    likely: int
    high: int


# one GPU: 0.24-0.27 GiB on 14 fitting logs (median 0.25), 0.46 on Granite-3.1-8B's
NON_TORCH_ONE_GPU = NonTorch(low=int(0.24 * GiB), likely=int(0.25 * GiB), high=int(0.46 * GiB))
# TP 2 and 4 on H100 80GB HBM3 (NVSwitch): 2.07 (Mixtral-8x7B, gpt-oss-20b tp 2) .. 2.21 GiB (Kimi-Dev-72B
# tp 4), median 2.13 (Qwen2.5-7B tp 4). Low: the one-GPU figure, since no log of a GPU without NVSwitch
# (whose NCCL sets up no NVLink SHARP buffers) was read
NON_TORCH_TENSOR_PARALLEL = NonTorch(low=NON_TORCH_ONE_GPU.low, likely=int(2.13 * GiB), high=int(2.21 * GiB))


def measured(version: tuple[int, int]) -> bool:
    """Whether ``version`` sizes its pool as the 0.19 logs show (the baseline accounting: 0.9 and later)."""
    return version >= BASELINE_RELEASE


def bytes_per_logit(version: tuple[int, int], *, flashinfer: bool = True) -> float:
    """The sampler warm-up's bytes per logit beyond the logits' own dtype in ``version`` (``flashinfer``:
    whether the platform has FlashInfer's sampler: CUDA, not ROCm)."""
    if version < TRITON_TOPK_RELEASE and (version >= SORT_DEFAULT_RELEASE or not flashinfer):
        return SORT_BYTES_PER_LOGIT
    return SAMPLER_BYTES_PER_LOGIT


def sampler_bytes(
    max_num_seqs: int,
    vocab_size: int,
    logits_bytes: int,
    version: tuple[int, int] = MEASURED_RELEASE,
    *,
    flashinfer: bool = True,
) -> int:
    """The sampler warm-up's torch peak: ``max_num_seqs`` rows of the whole vocabulary."""
    per_logit = logits_bytes + bytes_per_logit(version, flashinfer=flashinfer)
    return int(max_num_seqs * vocab_size * per_logit)


def non_torch(tp: int) -> NonTorch:
    """The non-torch increase of one worker of a ``tp``-way tensor-parallel group."""
    return NON_TORCH_TENSOR_PARALLEL if tp > 1 else NON_TORCH_ONE_GPU


def non_torch_term(figure: NonTorch) -> BandTerm:
    """The band's term for the non-torch increase: the fitting logs' range around its likely value (at TP > 1
    down to the one-GPU figure: a GPU without NVSwitch was not read)."""
    return BandTerm(
        name="vllm_non_torch", level="device_total", low_bytes=figure.low - figure.likely,
        high_bytes=figure.high - figure.likely,
        source="vLLM 0.19 logs' non-torch forward increase (formulas/serving/vllm_profile.py): the fitting "
        f"logs' range, {figure.low} .. {figure.high} B",
    )  # fmt: skip


def profile_note(sampler: int, max_num_seqs: int, figure: NonTorch, tp: int) -> str:
    """The answer's assumption line for the logged profile."""
    where = "at TP > 1, read on H100 NVSwitch" if tp > 1 else "on one GPU"
    return (
        f"vLLM >= 0.9 profile as its 0.19 logs give it: the sampler warm-up over {max_num_seqs} rows of the "
        f"whole vocabulary on every rank ({sampler} B) and a non-torch increase of {figure.likely} B "
        f"({where}) come out of the budget; the CUDA context is the profile's baseline "
        "(formulas/serving/vllm_profile.py)"
    )
