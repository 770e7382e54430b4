"""The GPU description every part of peakmem shares: memory as the driver reports it, and rates.

It lives in the core, apart from the catalog, so that formulas (the step-time model) can describe a
GPU without importing the catalog (DESIGN.md: ``formulas/`` imports neither ``catalog`` nor ``hf``).
The catalog (:mod:`peakmem.catalog`) holds the known GPUs as data and re-exports :class:`Gpu`;
:func:`peakmem.resolve.gpu_of_size` builds the anonymous GPU of a plain memory size.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from peakmem.errors import require

Vendor = Literal["nvidia", "amd", "apple", "unknown"]


# bf16 arithmetic and flash-attn 2 need compute capability 8.0 (Ampere) or newer: torch's
# ``torch.cuda.is_bf16_supported()`` is False below sm_80 (Volta sm_70, Turing sm_75), and flash-attn's
# README lists "Ampere, Ada, or Hopper GPUs" (Turing only in flash-attn 1.x).
PRE_AMPERE_ARCHITECTURES = frozenset({"pascal", "volta", "turing"})
ROCM_ARCHITECTURE_PREFIX = "cdna"  # AMD Instinct (CDNA) parts: ROCm, not CUDA


def is_rocm(architecture: str) -> bool:
    """Whether a GPU of ``architecture`` runs ROCm (an AMD Instinct part)."""
    return architecture.startswith(ROCM_ARCHITECTURE_PREFIX)


# How the GPUs of one node are joined, as the serving engines' custom all-reduce tests it (vLLM
# distributed/device_communicators/custom_all_reduce.py ``CustomAllreduce.__init__``, SGLang's port of it):
# "nvlink" / "xgmi": every GPU of the node reaches every other (NVSwitch, AMD Infinity Fabric); "pcie":
# PCIe with peer-to-peer access (datacenter and workstation cards; NVLink bridges join pairs at most);
# "pcie-no-p2p": PCIe without peer-to-peer access (GeForce cards: the driver refuses it); "": not known.
INTERCONNECTS = ("", "nvlink", "xgmi", "pcie", "pcie-no-p2p")


def check_interconnect(value: str) -> None:
    """An InputError naming ``interconnect`` unless ``value`` is one of :data:`INTERCONNECTS`."""
    require(value in INTERCONNECTS, "interconnect", value, f"one of {', '.join(map(repr, INTERCONNECTS))}")


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """An accelerator: memory as the driver reports it, and rates for a step-time model."""

    name: str  # canonical, lowercase: "h100-80gb-sxm"
    display_name: str  # "NVIDIA H100 80GB HBM3 (SXM)"
    vendor: Vendor
    architecture: str  # "volta", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "apple", ...
    memory_bytes: int  # total device memory as nvidia-smi / rocm-smi / the OS reports it
    memory_source: str  # where memory_bytes comes from (a published nvidia-smi output, a spec sheet)
    bf16_tflops: float | None = None  # dense (no sparsity) 16-bit tensor-core peak, TFLOPS
    bandwidth_gbps: float | None = None  # memory bandwidth, GB/s
    aliases: tuple[str, ...] = ()
    source: str = ""  # spec sheet for TFLOPS and bandwidth
    note: str = ""
    # Unified memory (Apple silicon): the share of RAM the GPU may wire by default.
    unified_memory: bool = False
    gpu_usable_fraction: float | None = None
    gpu_usable_source: str = ""
    # A GPU without rates of its own (a plain memory size, ``--gpu 24GB``): the GPU whose rates the
    # step-time model borrows (:data:`peakmem.formulas.step_time.REFERENCE_GPU`, set by the resolver).
    rates_from: Gpu | None = None
    interconnect: str = ""  # one of INTERCONNECTS: how a node's GPUs of this kind are joined
    # Memory the driver and firmware set aside: inside nvidia-smi's total (memory_bytes), outside the total
    # torch.cuda.mem_get_info() reports and outside nvidia-smi's used since R510 (NVML v2), but inside the
    # ``used`` of NVML's v1 nvmlDeviceGetMemoryInfo (py3nvml, pynvml's default). None: not known.
    driver_reserved_bytes: int | None = None
    driver_reserved_source: str = ""

    def __post_init__(self) -> None:
        require(self.name == self.name.lower() and bool(self.name), "name", self.name, "must be lowercase")
        require(self.memory_bytes > 0, "memory_bytes", self.memory_bytes, "must be positive")
        check_interconnect(self.interconnect)
        if self.driver_reserved_bytes is not None:
            require(
                0 <= self.driver_reserved_bytes < self.memory_bytes, "driver_reserved_bytes",
                self.driver_reserved_bytes, "must be at least 0 and below memory_bytes",
            )  # fmt: skip
        if self.gpu_usable_fraction is not None:
            require(
                0 < self.gpu_usable_fraction <= 1, "gpu_usable_fraction", self.gpu_usable_fraction,
                "must be in (0, 1]",
            )  # fmt: skip

    @property
    def pre_ampere(self) -> bool:
        """No bf16 and no flash-attn 2 (an NVIDIA card older than Ampere)."""
        return self.architecture in PRE_AMPERE_ARCHITECTURES

    @property
    def has_rates(self) -> bool:
        """Whether the GPU states its own TFLOPS and bandwidth (catalog GPUs do; a plain size does not)."""
        return self.bf16_tflops is not None and self.bandwidth_gbps is not None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def usable_bytes(self) -> int:
        """Memory a job can use, what torch's ``total_memory`` / ``mem_get_info()`` total reads (vLLM sizes
        its pool on it): all of it less what the driver and firmware set aside where known
        (:attr:`driver_reserved_bytes`), or the default GPU share of unified memory."""
        if self.gpu_usable_fraction is None:
            return self.memory_bytes - (self.driver_reserved_bytes or 0)
        return int(self.memory_bytes * self.gpu_usable_fraction)


__all__ = ["INTERCONNECTS", "Gpu", "Vendor", "check_interconnect"]
