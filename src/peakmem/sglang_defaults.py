"""SGLang's own memory defaults: the ``chunked_prefill_size``, ``cuda_graph_max_bs`` and
``mem_fraction_static`` it picks for a GPU when they are not given, as sglang 0.5.5 computes them.

Read in the sglang 0.5.5 wheel, ``python/sglang/srt/server_args.py``: ``ServerArgs.__post_init__`` takes
``gpu_mem = get_device_memory_capacity(self.device)`` (``utils/common.py``: on CUDA
``get_nvgpu_memory_capacity``, the smallest ``nvidia-smi --query-gpu=memory.total`` of the node in MiB, a
float; ``torch.cuda.mem_get_info()[1] // 2**20`` under MIG; None without a GPU) and hands it to
``_handle_gpu_memory_settings``:

* **Tiers** (lines 689-772), by ``gpu_mem``: below 20 GiB (T4, 4080) chunked_prefill_size 2048,
  cuda_graph_max_bs 8; below 35 GiB (A10, 4090, 5090) 2048, 24 at ``tp_size < 4`` else 80; below 60 GiB
  (A100-40GB, L40) 4096, 32 / 160; below 90 GiB (H100, A100-80GB) 8192, 256 / 512; below 160 GiB (H20,
  H200) 8192, 256 / 512; above (B200, MI300) 16384, 512; no GPU known: 4096, 160. A value given on the
  command line is kept (``--cuda-graph-bs`` sets ``cuda_graph_max_bs = max(cuda_graph_bs)``).
* **The reserve** (lines 785-817), in MiB, when ``--mem-fraction-static`` is not given: 512 ("constant
  meta data") + ``max(chunked_prefill_size, 2048) x 1.5`` ("activation during large prefill") +
  ``cuda_graph_max_bs x 2`` ("cuda graphs") + ``tp_size x pp_size / 8 x 1024`` ("large parallel size");
  with ``--enable-dp-attention`` + ``cuda_graph_max_bs x dp_size x 3``, and another ``x 1.5`` when
  cuda_graph_max_bs > 300; at least 10 GiB on GPUs above 60 GiB; then + 6 GiB for a STANDALONE draft, +
  2 GiB for the other speculative algorithms but NGRAM (EAGLE, EAGLE3, NEXTN).
* ``mem_fraction_static = round((gpu_mem - reserved_mem) / gpu_mem, 3)`` (line 819), 0.88 when no GPU is
  known. Multimodal models then multiply it by ``adjust_mem_fraction_for_vlm``'s factor (0.95 x a ViT-size
  term): not modelled here (peakmem's serving specs carry no vision tower); nor the aiter backend's x 0.85
  (AMD) or the NPU tiers.

Releases (their wheels' ``server_args.py``): 0.5.3 has this scheme (sglang PR #10975, "Use more general
heuristics to set the default value of --mem-fraction-static"), with 16 instead of 24 at tp < 4 below 35
GiB; 0.5.2 reserved ``9.5 + tp x pp / 2`` GiB on 35-90 GiB GPUs, ``12 + tp x pp / 2`` below 160 GiB, ``2.8
+ tp x pp / 10`` below 35 GiB, 32 GiB above, + 4 GiB with DP attention, and left cuda_graph_max_bs unset
(None in its log: the runner captured up to 160, 256 above 90 GiB, 512 above 160 GB) from 35 GiB up. 0.5.23
(``arg_groups/memory_hook.py`` ``handle_gpu_memory_settings``) changed it again: 4096 and 48 / 160 below 35
GiB, cuda_graph_max_bs capped at max_running_requests when that is given, a reserve for the prefill CUDA
graphs (8 MiB per captured size, 1.5 GiB with MLA), no speculative term in that hook, 2 GiB for DeepEP,
1.5 GiB + tp x pp / 8 GiB only when the KV pool is sized after capture, and 0.95 without a GPU. peakmem
models 0.5.5 for the whole 0.5 line (``inference.CURRENT_ENGINE_VERSION``), as
``formulas/serving/sglang_graphs.py`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.errors import require
from peakmem.units import MiB
from peakmem.validate import MAX_GPUS, MAX_TOKENS, check_bool, check_int

# (below this many GiB of gpu_mem, chunked_prefill_size, cuda_graph_max_bs at tp < 4, at tp >= 4):
# server_args.py 0.5.5 _handle_gpu_memory_settings, lines 690-759 (the NPU-only tiers left out)
SGLANG_GPU_TIERS: tuple[tuple[int, int, int, int], ...] = (
    (20, 2048, 8, 8),  # "T4, 4080"
    (35, 2048, 24, 80),  # "A10, 4090, 5090"
    (60, 4096, 32, 160),  # "A100 (40GB), L40"
    (90, 8192, 256, 512),  # "H100, A100"
    (160, 8192, 256, 512),  # "H20, H200"
)
SGLANG_LARGEST_TIER = (16384, 512, 512)  # "B200, MI300", lines 760-766
SGLANG_UNKNOWN_GPU_TIER = (4096, 160, 160)  # "Fallback defaults when gpu_mem is None", lines 768-772
SGLANG_LARGE_TP = 4  # "cuda_graph_max_bs 256 if tp < 4 else 512"
SGLANG_UNKNOWN_GPU_FRACTION = 0.88  # line 822: "if gpu_mem is not None else 0.88"
SGLANG_FRACTION_DIGITS = 3  # round(..., 3)

# The reserve, in MiB (lines 785-817)
SGLANG_RESERVED_BASE_MIB = 512  # "Constant meta data (e.g., from attention backend)"
SGLANG_MIN_PREFILL_TOKENS = 2048  # max(self.chunked_prefill_size, 2048)
SGLANG_MIB_PER_PREFILL_TOKEN = 1.5  # "For activation during large prefill"
SGLANG_MIB_PER_GRAPH_BS = 2  # "For cuda graphs": cuda_graph_max_bs * 2
SGLANG_RANKS_PER_GIB = 8  # "adjustments for large parallel size": tp_size * pp_size / 8 * 1024
SGLANG_DP_ATTN_MIB_PER_BS = 3  # "DP attention needs more padding": cuda_graph_max_bs * dp_size * 3
SGLANG_DP_ATTN_LARGE_BS = 300  # "if self.cuda_graph_max_bs > 300"
SGLANG_DP_ATTN_LARGE_MIB_PER_BS = 1.5  # cuda_graph_max_bs * dp_size * 1.5
SGLANG_FLOOR_ABOVE_MIB = 60 * 1024  # "if gpu_mem is not None and gpu_mem > 60 * 1024"
SGLANG_FLOOR_MIB = 10 * 1024  # reserved_mem = max(reserved_mem, 10 * 1024)
# speculative_algorithm: STANDALONE (peakmem's draft_model) + 6 GiB "standalone draft model and cuda
# graphs"; NGRAM nothing; the others (EAGLE, EAGLE3, NEXTN: peakmem's eagle, eagle3, mtp) + 2 GiB
SGLANG_SPEC_RESERVED_MIB = {"draft_model": 6 * 1024, "ngram": 0}
SGLANG_SPEC_RESERVED_MIB_DEFAULT = 2 * 1024


@dataclass(frozen=True, kw_only=True)
class SglangDefaults:
    """What SGLang runs with on one GPU: its choices, or the values given on the command line."""

    gpu_mib: float | None  # get_device_memory_capacity (nvidia-smi memory.total, MiB); None: not known
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    reserved_mib: float | None  # the reserve (None: mem_fraction_static given, or no GPU known)
    mem_fraction_static: float

    def __post_init__(self) -> None:
        check_int("chunked_prefill_size", self.chunked_prefill_size, maximum=MAX_TOKENS, what="tokens")
        check_int("cuda_graph_max_bs", self.cuda_graph_max_bs, maximum=MAX_TOKENS, what="sequences")
        require(0.0 <= self.mem_fraction_static <= 1.0, "mem_fraction_static", self.mem_fraction_static,
                "a share of the GPU between 0 and 1")  # fmt: skip


def sglang_tier(gpu_mib: float | None, tp: int) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, cuda_graph_max_bs) for a GPU of ``gpu_mib`` MiB at ``tp``."""
    if gpu_mib is None:
        chunk, small, large = SGLANG_UNKNOWN_GPU_TIER
    else:
        chunk, small, large = next(
            (t[1:] for t in SGLANG_GPU_TIERS if gpu_mib < t[0] * 1024), SGLANG_LARGEST_TIER
        )
    return chunk, small if tp < SGLANG_LARGE_TP else large


def sglang_defaults(
    gpu_bytes: int | None,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    dp_attention: bool = False,
    draft_method: str | None = None,
    chunked_prefill_size: int | None = None,
    cuda_graph_max_bs: int | None = None,
    mem_fraction_static: float | None = None,
) -> SglangDefaults:
    """SGLang's defaults on a GPU of ``gpu_bytes`` (nvidia-smi's total; None: not known) with ``tp`` x
    ``pp`` ranks, ``dp`` attention-DP ranks when ``dp_attention``, a speculative draft of peakmem's
    ``draft_method`` (None: none); the given ``chunked_prefill_size`` / ``cuda_graph_max_bs`` /
    ``mem_fraction_static`` are kept, and the first two enter the reserve, as in SGLang."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        check_int(name, value, maximum=MAX_GPUS, what="GPUs; no cluster has more")
    check_bool("dp_attention", dp_attention)
    gpu_mib = None if gpu_bytes is None else gpu_bytes / MiB
    chunk, max_bs = sglang_tier(gpu_mib, tp)
    chunk = chunked_prefill_size if chunked_prefill_size is not None else chunk
    max_bs = cuda_graph_max_bs if cuda_graph_max_bs is not None else max_bs
    if mem_fraction_static is not None:
        return SglangDefaults(gpu_mib=gpu_mib, chunked_prefill_size=chunk, cuda_graph_max_bs=max_bs,
                              reserved_mib=None, mem_fraction_static=mem_fraction_static)  # fmt: skip
    # the same float operations, in the same order, as server_args.py
    reserved: float = SGLANG_RESERVED_BASE_MIB
    reserved += max(chunk, SGLANG_MIN_PREFILL_TOKENS) * SGLANG_MIB_PER_PREFILL_TOKEN
    reserved += max_bs * SGLANG_MIB_PER_GRAPH_BS
    reserved += tp * pp / SGLANG_RANKS_PER_GIB * 1024
    if dp_attention:
        reserved += max_bs * dp * SGLANG_DP_ATTN_MIB_PER_BS
        if max_bs > SGLANG_DP_ATTN_LARGE_BS:
            reserved += max_bs * dp * SGLANG_DP_ATTN_LARGE_MIB_PER_BS
    if gpu_mib is not None and gpu_mib > SGLANG_FLOOR_ABOVE_MIB:
        reserved = max(reserved, SGLANG_FLOOR_MIB)
    if draft_method is not None:
        reserved += SGLANG_SPEC_RESERVED_MIB.get(draft_method, SGLANG_SPEC_RESERVED_MIB_DEFAULT)
    if gpu_mib is None:
        return SglangDefaults(gpu_mib=None, chunked_prefill_size=chunk, cuda_graph_max_bs=max_bs,
                              reserved_mib=None, mem_fraction_static=SGLANG_UNKNOWN_GPU_FRACTION)  # fmt: skip
    # SGLang takes a negative share as given (and fails at launch); peakmem's pool is then empty
    fraction = max(0.0, round((gpu_mib - reserved) / gpu_mib, SGLANG_FRACTION_DIGITS))
    return SglangDefaults(gpu_mib=gpu_mib, chunked_prefill_size=chunk, cuda_graph_max_bs=max_bs,
                          reserved_mib=reserved, mem_fraction_static=fraction)  # fmt: skip
