"""What ``nvidia-smi`` shows above ``max_memory_reserved``: the CUDA context and workspaces.

The CUDA context (driver state, loaded kernel images of torch and its libraries) is not allocated
through PyTorch's allocator. Its size depends on the GPU, driver, CUDA version and whether modules
load lazily (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 11.7 with torch >= 1.13), so it
is a named, overridable table, not a constant.
"""

from __future__ import annotations

from dataclasses import dataclass

from peakmem.device import Gpu
from peakmem.errors import require
from peakmem.units import MiB
from peakmem.validate import MAX_DEVICE_BYTES, check_int, check_real, check_str

from .allocator import DEFAULT_FRAGMENTATION, MAX_ROUNDUP_DIVISIONS, NO_ROUNDUP, roundup_divisions_ok


@dataclass(frozen=True, kw_only=True)
class ContextSize:
    key: str
    bytes: int
    source: str


CONTEXT_SIZES: dict[str, ContextSize] = {
    c.key: c
    for c in (
        ContextSize(
            key="v100-cuda11-eager-loading", bytes=1343 * MiB,
            source="HF Transformers docs 'Model training anatomy' (2022): torch.ones((1,1)).cuda() "
            "then nvidia-smi = 1343 MiB on a V100-SXM2 16GB (shared/validation HF-A00 notes)",
        ),
        ContextSize(
            key="cuda12-lazy-loading", bytes=512 * MiB,
            source="torch 2.x + CUDA 12 with lazy module loading (CUDA_MODULE_LOADING=LAZY): 512 MiB "
            "assumed, inside the published 254-590 MiB of a context plus a job's kernels "
            "(benchmarks/cuda_context_logs.json; an A100 80GB litgpt job at its OOM: 522 MiB) - measure "
            "yours with nvidia-smi minus torch.cuda.memory_reserved() after a step",
        ),
    )
}  # fmt: skip
DEFAULT_CONTEXT = "cuda12-lazy-loading"

# torch/csrc/cuda/CublasHandlePool.cpp: default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" ->
# 2 x 4096 KiB + 8 x 16 KiB = 8.125 MiB per handle/stream (newer GPUs: below); allocated through
# the caching allocator at the first matmul, counted here as overhead.
CUBLAS_WORKSPACE_BYTES = 2 * 4096 * 1024 + 8 * 16 * 1024
# The same function in the current source (a stored copy read 2026-12-06; the pinned torch's CPU wheel ships
# no CUDA source): the default is ":4096:8" = 32 MiB on NVIDIA compute capability 9 to 12 (Hopper,
# Blackwell); on ROCm 32 MiB, 128 MiB on gfx942 / gfx950 (MI300X, MI325X, MI355X). By the catalog GPU's
# architecture (peakmem.device.Gpu.architecture); any other keeps CUBLAS_WORKSPACE_BYTES.
CUBLAS_WORKSPACE_BY_ARCHITECTURE = {
    "hopper": 32 * MiB, "blackwell": 32 * MiB, "cdna2": 32 * MiB, "cdna3": 128 * MiB, "cdna4": 128 * MiB,
}  # fmt: skip


def cublas_workspace_bytes(architecture: str) -> int:
    """The cuBLAS (hipBLAS) workspace torch allocates per handle and stream on a GPU of ``architecture``."""
    return CUBLAS_WORKSPACE_BY_ARCHITECTURE.get(architecture, CUBLAS_WORKSPACE_BYTES)


def nvml_v1_used_bytes(device_total_bytes: int, gpu: Gpu) -> int:
    """What NVML's v1 ``nvmlDeviceGetMemoryInfo(handle).used`` reads for a job whose ``nvidia-smi`` used
    memory is ``device_total_bytes``: v1's ``used`` is total - free of nvidia-smi's total, so it also counts
    the memory the driver and firmware set aside (:attr:`peakmem.device.Gpu.driver_reserved_bytes`), which
    nvidia-smi (NVML v2 since driver R510) reports apart. fbcotter/py3nvml issue #25 (py3nvml has no v2
    struct), huggingface/optimum-benchmark issue #31 ('py3nvml measures reserved and not used memory'),
    rust-nvml/nvml-wrapper issue #57 (v1 used 912 MB on idle A100s, v2 7.8 MB)."""
    reserved = gpu.driver_reserved_bytes
    require(
        reserved is not None, "gpu", gpu.name, "its driver reservation is not known (driver_reserved_bytes)"
    )
    return device_total_bytes + (reserved or 0)


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """Everything above allocated bytes, each part overridable."""

    context_bytes: int = CONTEXT_SIZES[DEFAULT_CONTEXT].bytes
    context_source: str = CONTEXT_SIZES[DEFAULT_CONTEXT].source
    cublas_workspace_bytes: int = CUBLAS_WORKSPACE_BYTES
    # None: reserved is the estimate's own step replayed through the caching-allocator model where it can
    # be (formulas/step_sequence.py), DEFAULT_FRAGMENTATION of the churn where not; a fraction (the
    # user's, or a calibrated profile's): the closed form with that fraction everywhere
    fragmentation: float | None = None
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: reserved grows by pages, freed blocks merge
    # (formulas/allocator.py reserved_bytes; formulas/band.py SRC_EXPANDABLE)
    expandable_segments: bool = False
    # PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:N (its single-int form): every block above 512 B x N
    # rounded up to the next 1/N of its power of two (formulas/allocator.py round_request); 0: not set
    alloc_roundup_divisions: int = NO_ROUNDUP
    profile: str | None = None  # name of a calibrated profile (peakmem calibrate) these figures come from
    # the named GPU's memory as torch's total_memory reads it (peakmem.device.Gpu.usable_bytes: less its
    # driver_reserved_bytes where the catalog knows them), where every GPU named has the same; None: not
    # named. Less context_bytes it is what a load may reserve (peakmem.step_load: the CUDA allocator frees
    # its cache when cudaMalloc fails, formulas/caching_allocator.py) and the warm-up block's free memory
    device_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("context_bytes", "cublas_workspace_bytes"):
            value = getattr(self, name)
            check_int(name, value, minimum=0, maximum=MAX_DEVICE_BYTES, what="bytes; no GPU holds more")
        check_str("context_source", self.context_source)
        if self.fragmentation is not None:
            check_real("fragmentation", self.fragmentation, minimum=0.0, maximum=1.0)
        require(isinstance(self.expandable_segments, bool), "expandable_segments", self.expandable_segments,
                "must be True or False")  # fmt: skip
        check_roundup_divisions(self.alloc_roundup_divisions)
        if self.profile is not None:
            check_str("profile", self.profile)
        if self.device_bytes is not None:
            check_int("device_bytes", self.device_bytes, minimum=1, maximum=MAX_DEVICE_BYTES, what="bytes")

    @property
    def context_assumed(self) -> bool:
        """Whether the context is peakmem's assumed default row (not measured on the user's machine)."""
        default = CONTEXT_SIZES[DEFAULT_CONTEXT]
        return (
            self.profile is None
            and self.context_bytes == default.bytes
            and self.context_source == default.source
        )

    @property
    def fraction(self) -> float:
        """The fragmentation fraction of the closed form: the given one, else DEFAULT_FRAGMENTATION."""
        return DEFAULT_FRAGMENTATION if self.fragmentation is None else self.fragmentation

    @property
    def replay_reserved(self) -> bool:
        """No fraction given and no calibrated profile (which fits its own fraction): reserved is replayed
        where the step can be written tensor by tensor."""
        return self.fragmentation is None and self.profile is None

    @classmethod
    def for_context(cls, key: str, fragmentation: float | None = None) -> Overheads:
        require(key in CONTEXT_SIZES, "context", key, f"choose one of {', '.join(CONTEXT_SIZES)}")
        ctx = CONTEXT_SIZES[key]
        return cls(context_bytes=ctx.bytes, context_source=ctx.source, fragmentation=fragmentation)


def check_roundup_divisions(value: object) -> int:
    """``alloc_roundup_divisions`` as PyTorch's parser takes it (parseRoundUpPower2Divisions: a power of
    two; formulas/allocator.py), or 0 for not set; a one-line error naming the field otherwise."""
    n = check_int("alloc_roundup_divisions", value, minimum=0, maximum=MAX_ROUNDUP_DIVISIONS)
    require(roundup_divisions_ok(n), "alloc_roundup_divisions", n,
            f"must be 0 (not set) or a power of two (1, 2, 4, ... {MAX_ROUNDUP_DIVISIONS}), as PyTorch's "
            "roundup_power2_divisions")  # fmt: skip
    return n
