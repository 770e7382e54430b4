"""GPUs as data: memory as the driver reports it, dense 16-bit tensor TFLOPS, bandwidth.

``memory_bytes`` is the total ``nvidia-smi`` prints in its Memory-Usage column (MiB x 1 MiB), or
``rocm-smi --showmeminfo vram`` "VRAM Total Memory (B)", or ``hw.memsize`` on a Mac, because that is
the ceiling a job meets: the marketing "80 GB" of an H100 is 81559 MiB once ECC and the driver's
reservations are taken out, and an "80 GB" A100 shows 81920 MiB. Each value was read from
published outputs of those tools (stored copies of public logs, READMEs and issues that paste
them); ``memory_source`` says what was read, and ``note`` flags the values that are only the
marketing size.

``bf16_tflops`` is the dense (no 2:4 sparsity) peak of 16-bit tensor math with fp32 accumulation,
from the vendor's datasheet or architecture whitepaper (GeForce cards run fp32-accumulate at half
their fp16-accumulate rate; that halved figure is the one PyTorch training sees). Cards without
bf16 (Volta, Turing) list their fp16 rate and say so. ``bandwidth_gbps`` is the datasheet memory
bandwidth in GB/s. Both feed a step-time model, not the memory estimate.

``interconnect`` is how a node of these cards is joined, as vLLM's and SGLang's custom all-reduce tests it
(:data:`peakmem.device.INTERCONNECTS`): SXM / OAM boards (A100 and H100 SXM, H200, H20, B200, B300, GB200)
sit on NVSwitch and AMD's MI300X / MI325X / MI355X on a full Infinity Fabric mesh (their datasheets); PCIe
datacenter and workstation cards do peer-to-peer (H100 NVL and A100 PCIe join pairs with NVLink bridges at
most); GeForce cards do not (NVIDIA's driver refuses peer-to-peer on them: noonghunna/club-3090 issue #91
benchmarks a patched P2P driver on RTX 3090s). Left unknown: V100 (SXM2's hybrid cube mesh is not fully
connected, PCIe V100s are), GH200, MI210, MI250X, Apple.

Plain literals only: no I/O at import.
"""

from __future__ import annotations

from typing import Any

MiB = 1024**2  # nvidia-smi prints MiB
GiB = 1024**3

_SMI = "nvidia-smi Memory-Usage total in published outputs"


def _torch_total(gib: float) -> int:
    """The bytes of a device total PyTorch printed in GiB to two decimals (its CUDA OOM message 'total
    capacity of 23.69 GiB', vLLM's total_gpu_memory): within 5 MiB."""
    return round(gib * GiB)


# Apple: Metal's MTLDevice.recommendedMaxWorkingSetSize is 3/4 of RAM on large-memory Macs by
# default (raised with `sysctl iogpu.wired_limit_mb`). llama.cpp logs on an M4 Max 128 GB show
# "recommendedMaxWorkingSetSize = 103079.22 MB" = 0.75 x 128 GiB; sglang PR #29949 quotes 65-75%.
APPLE_GPU_USABLE_FRACTION = 0.75
_APPLE_USABLE_SOURCE = (
    "Metal MTLDevice.recommendedMaxWorkingSetSize default: llama.cpp ggml-metal log on an M4 Max "
    "128 GB reports 103079.22 MB (= 0.75 x 128 GiB); sglang PR #29949 (macOS keeps ~65-75%); "
    "adjustable with `sudo sysctl iogpu.wired_limit_mb=N`"
)

# fmt: off
GPU_ENTRIES: tuple[dict[str, Any], ...] = (
    # ------------------------------------------------------------------- consumer (GeForce)
    {
        "name": "rtx-3060-12gb", "display_name": "NVIDIA GeForce RTX 3060 12GB", "vendor": "nvidia",
        "interconnect": "pcie-no-p2p",
        "architecture": "ampere", "memory_bytes": 12288 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GeForce RTX 3060 ... 12288MiB'",
        "bf16_tflops": 25.6, "bandwidth_gbps": 360.0,
        "aliases": ("3060", "rtx-3060", "rtx3060", "nvidia geforce rtx 3060"),
        "source": "NVIDIA Ampere GA102 whitepaper, appendix (GeForce RTX 30 series specs)",
        "note": "tensor fp16 with fp16 accumulate is 51.2 TFLOPS; fp32 accumulate half that",
    },
    {
        "name": "rtx-3080-10gb", "display_name": "NVIDIA GeForce RTX 3080 10GB", "vendor": "nvidia",
        "interconnect": "pcie-no-p2p",
        "architecture": "ampere", "memory_bytes": 10240 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GeForce RTX 3080 ... 10240MiB'",
        "bf16_tflops": 59.5, "bandwidth_gbps": 760.0,
        "aliases": ("3080", "rtx-3080", "rtx3080", "nvidia geforce rtx 3080"),
        "source": "NVIDIA Ampere GA102 whitepaper, table 9",
        "note": "bare '3080' means the 10 GB card (the 12 GB variant is not listed)",
    },
    {
        "name": "rtx-3090", "display_name": "NVIDIA GeForce RTX 3090", "vendor": "nvidia",
        "interconnect": "pcie-no-p2p",
        "architecture": "ampere", "memory_bytes": 24576 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GeForce RTX 3090 ... 24576MiB'",
        # torch sees 23.69 GiB (printed to 2 decimals: +-5 MiB)
        "driver_reserved_bytes": 24576 * MiB - _torch_total(23.69),
        "driver_reserved_source": (
            "nvidia-smi total less torch's 'total capacity of 23.69 GiB' in CUDA OOM messages on RTX "
            "3090s (vllm-project/vllm issue #2140, 2023-12-17, with nvidia-smi naming the card; "
            "JiaweiLian/AP-PA issue #3, 2023-03-17); 23.70 with a 2022 driver (GaoLii/DSP #10), 23.56 "
            "with a 2026 one (noonghunna/club-3090 #58): newer drivers reserve more"
        ),
        "bf16_tflops": 71.0, "bandwidth_gbps": 936.0,
        "aliases": ("3090", "rtx3090", "rtx-3090-24gb", "nvidia geforce rtx 3090"),
        "source": "NVIDIA Ampere GA102 whitepaper, table 9",
    },
    {
        "name": "rtx-4060-ti-16gb", "display_name": "NVIDIA GeForce RTX 4060 Ti 16GB", "vendor": "nvidia",
        "interconnect": "pcie-no-p2p",
        "architecture": "ada", "memory_bytes": 16380 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GeForce RTX 4060 Ti ... 16380MiB'",
        "bf16_tflops": 44.2, "bandwidth_gbps": 288.0,
        "aliases": ("4060ti", "4060-ti", "rtx-4060-ti", "rtx4060ti", "nvidia geforce rtx 4060 ti"),
        "source": "NVIDIA Ada Lovelace architecture whitepaper, appendix",
        "note": "bare '4060 Ti' means the 16 GB card (the 8 GB variant shows 8188 MiB)",
    },
    {
        "name": "rtx-4070-ti", "display_name": "NVIDIA GeForce RTX 4070 Ti", "vendor": "nvidia",
        "interconnect": "pcie-no-p2p",
        "architecture": "ada", "memory_bytes": 12282 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GeForce RTX 4070 Ti ... 12282MiB'",
        "bf16_tflops": 80.2, "bandwidth_gbps": 504.0,
        "aliases": ("4070ti", "4070-ti", "rtx4070ti", "nvidia geforce rtx 4070 ti"),
        "source": "NVIDIA Ada Lovelace architecture whitepaper, appendix",
    },
    {
        "name": "rtx-4080", "display_name": "NVIDIA GeForce RTX 4080", "vendor": "nvidia",
        "interconnect": "pcie-no-p2p",
        "architecture": "ada", "memory_bytes": 16376 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GeForce RTX 4080 ... 16376MiB'",
        "bf16_tflops": 97.5, "bandwidth_gbps": 716.8,
        "aliases": ("4080", "rtx4080", "rtx-4080-16gb", "nvidia geforce rtx 4080"),
        "source": "NVIDIA Ada Lovelace architecture whitepaper, appendix",
    },
    {
        "name": "rtx-4090", "display_name": "NVIDIA GeForce RTX 4090", "vendor": "nvidia",
        "interconnect": "pcie-no-p2p",
        "architecture": "ada", "memory_bytes": 24564 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GeForce RTX 4090 ... 24564MiB'",
        # torch sees 23.65 GiB (printed to 2 decimals: +-5 MiB)
        "driver_reserved_bytes": 24564 * MiB - _torch_total(23.65),
        "driver_reserved_source": (
            "nvidia-smi total less torch's 'total capacity of 23.65 GiB' on RTX 4090s (TRI-ML/packnet-sfm "
            "issue #250, 2023-06-08; mahmoodlab/Patch-GCN #28, 2023-09-23); other drivers print 23.68 "
            "(zai-org/CogVideo #36), 23.64 (2025) down to 23.52 (2026)"
        ),
        "bf16_tflops": 165.2, "bandwidth_gbps": 1008.0,
        "aliases": ("4090", "rtx4090", "rtx-4090-24gb", "nvidia geforce rtx 4090"),
        "source": "NVIDIA Ada Lovelace architecture whitepaper, table 2",
    },
    {
        "name": "rtx-5090", "display_name": "NVIDIA GeForce RTX 5090", "vendor": "nvidia",
        "interconnect": "pcie-no-p2p",
        "architecture": "blackwell", "memory_bytes": 32607 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GeForce RTX 5090 ... 32607MiB'",
        # torch sees 31.37 GiB (printed to 2 decimals: +-5 MiB)
        "driver_reserved_bytes": 32607 * MiB - _torch_total(31.37),
        "driver_reserved_source": (
            "nvidia-smi total less torch's 'total capacity of 31.37 GiB' on an RTX 5090 (Wan-Video/Wan2.1 "
            "issue #465, 2025-07-03) and vLLM's total_gpu_memory (31.37GiB) (vllm-project/vllm issue "
            "#14452, 2025-04-23)"
        ),
        "bf16_tflops": 209.5, "bandwidth_gbps": 1792.0,
        "aliases": ("5090", "rtx5090", "rtx-5090-32gb", "nvidia geforce rtx 5090"),
        "source": "NVIDIA RTX Blackwell GPU architecture whitepaper, appendix",
        "note": "TFLOPS: fp16 tensor with fp32 accumulate, dense; uncertain to a few percent",
    },
    # ----------------------------------------------------------- workstation / inference
    {
        "name": "rtx-a6000", "display_name": "NVIDIA RTX A6000", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "ampere", "memory_bytes": 49140 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA RTX A6000 ... 49140MiB'",
        # torch sees 47.54 GiB (printed to 2 decimals: +-5 MiB)
        "driver_reserved_bytes": 49140 * MiB - _torch_total(47.54),
        "driver_reserved_source": (
            "nvidia-smi total less torch's 'total capacity of 47.54 GiB' on RTX A6000s with ECC off "
            "(vllm-project/vllm issues #1201 and #4417, nvidia-smi 49140MiB); with ECC on, 44.55 GiB "
            "(vllm-project/vllm #16141): not this row"
        ),
        "bf16_tflops": 154.8, "bandwidth_gbps": 768.0,
        "aliases": ("a6000", "rtxa6000", "nvidia rtx a6000"),
        "source": "NVIDIA RTX A6000 datasheet (309.7 TFLOPS with sparsity)",
    },
    {
        "name": "rtx-6000-ada", "display_name": "NVIDIA RTX 6000 Ada Generation", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "ada", "memory_bytes": 49140 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA RTX 6000 Ada Gene... 49140MiB'",
        "bf16_tflops": 364.25, "bandwidth_gbps": 960.0,
        "aliases": ("6000-ada", "rtx6000-ada", "rtx-6000-ada-generation", "nvidia rtx 6000 ada generation"),
        "source": "NVIDIA RTX 6000 Ada datasheet (728.5 TFLOPS with sparsity)",
    },
    {
        "name": "rtx-pro-6000-blackwell", "display_name": "NVIDIA RTX PRO 6000 Blackwell",
        "interconnect": "pcie",
        "vendor": "nvidia", "architecture": "blackwell", "memory_bytes": 97887 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB' and "
        "'... Workstation Edition, 97887 MiB' (drivers 580.126.09, 596.59; ECC on, the default)",
        "bf16_tflops": 503.8, "bandwidth_gbps": 1792.0,
        "aliases": ("rtx-pro-6000", "rtxpro6000", "pro-6000", "rtx pro 6000",
                    "rtx-pro-6000-server", "rtx-pro-6000-workstation",
                    "nvidia rtx pro 6000 blackwell server edition",
                    "nvidia rtx pro 6000 blackwell workstation edition"),
        "source": "NVIDIA RTX PRO 6000 Blackwell datasheet (96 GB GDDR7 ECC, 1792 GB/s); TFLOPS: the "
        "RTX Blackwell whitepaper's per-SM tensor rate x 188 SMs x 2617 MHz boost",
        "note": "Server and Workstation editions report the same memory; with ECC turned off the "
        "driver shows 98304 MiB; TFLOPS (fp16 tensor, fp32 accumulate, dense) uncertain to a few "
        "percent; the 300 W Max-Q edition runs lower",
    },
    {
        "name": "l4", "display_name": "NVIDIA L4", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "ada", "memory_bytes": 23034 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA L4 ... 23034MiB'",
        # torch sees 22.03 GiB (printed to 2 decimals: +-5 MiB)
        "driver_reserved_bytes": 23034 * MiB - _torch_total(22.03),
        "driver_reserved_source": (
            "nvidia-smi total less torch's 'total capacity of 22.03 GiB' on an L4 (ArcInstitute/evo2 "
            "issue #190, 2025-11-14); vLLM's CI L4 prints 22.05 (vllm-project/vllm #20214, 2025-06-28)"
        ),
        "bf16_tflops": 121.0, "bandwidth_gbps": 300.0,
        "aliases": ("nvidia-l4", "nvidia l4", "l4-24gb"),
        "source": "NVIDIA L4 datasheet (242 TFLOPS with sparsity)",
    },
    {
        "name": "l40s", "display_name": "NVIDIA L40S", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "ada", "memory_bytes": 46068 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA L40S ... 46068MiB'",
        "bf16_tflops": 362.05, "bandwidth_gbps": 864.0,
        "aliases": ("nvidia-l40s", "nvidia l40s", "l40s-48gb"),
        "source": "NVIDIA L40S datasheet (733 TFLOPS with sparsity)",
    },
    {
        "name": "a10", "display_name": "NVIDIA A10", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "ampere", "memory_bytes": 23028 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA A10 ... 23028MiB'",
        "bf16_tflops": 125.0, "bandwidth_gbps": 600.0,
        "aliases": ("nvidia-a10", "nvidia a10", "a10-24gb"),
        "source": "NVIDIA A10 datasheet (250 TFLOPS with sparsity)",
        "note": "AWS A10G (g5) is a different card; not listed",
    },
    {
        "name": "t4", "display_name": "NVIDIA Tesla T4", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "turing", "memory_bytes": 15360 * MiB,
        "memory_source": f"{_SMI}: 'Tesla T4 ... 15360MiB' (recent drivers; older ones showed 15109MiB)",
        "driver_reserved_bytes": 15360 * MiB - 15828320256,
        "driver_reserved_source": "nvidia-smi total 15360 MiB minus torch's total_memory on Colab's T4, "
        "'GPU = Tesla T4. Max memory = 14.741 GB.' (round(torch.cuda.get_device_properties(0).total_memory "
        "/ 1024**3, 3), printed by unslothai/notebooks and huggingface/trl's notebooks, 2024-2025): "
        "14.741 GiB = 15828320256 B (to the printed rounding, +-0.5 MiB): 265 MiB",
        "bf16_tflops": 65.0, "bandwidth_gbps": 320.0,
        "aliases": ("tesla-t4", "tesla t4", "nvidia-t4", "t4-16gb"),
        "source": "NVIDIA T4 datasheet (mixed-precision FP16/FP32 65 TFLOPS)",
        "note": "no bf16 tensor cores (Turing): the figure is fp16",
    },
    {
        "name": "v100-16gb", "display_name": "NVIDIA Tesla V100-SXM2-16GB", "vendor": "nvidia",
        "architecture": "volta", "memory_bytes": 16160 * MiB,
        "memory_source": f"{_SMI}: 'Tesla V100-SXM2... 16160MiB' (PCIe 16GB shows the same)",
        "bf16_tflops": 125.0, "bandwidth_gbps": 900.0,
        "aliases": ("v100", "tesla-v100", "v100-sxm2-16gb", "tesla v100-sxm2-16gb", "v100-16g"),
        "source": "NVIDIA Tesla V100 datasheet (SXM2: 125 TFLOPS tensor)",
        "note": "bare 'v100' means the 16 GB SXM2 card (the GPU of the HF 'Model training anatomy' "
        "measurements); no bf16 (Volta): the figure is fp16",
    },
    {
        "name": "v100-32gb", "display_name": "NVIDIA Tesla V100-SXM2-32GB", "vendor": "nvidia",
        "architecture": "volta", "memory_bytes": 32510 * MiB,
        "memory_source": f"{_SMI}: 'Tesla V100-SXM2... 32510MiB'",
        # torch sees 31.74 GiB (printed to 2 decimals: +-5 MiB)
        "driver_reserved_bytes": 32510 * MiB - _torch_total(31.74),
        "driver_reserved_source": (
            "nvidia-smi total less torch's '31.74 GiB total capacity' on V100 32GB (haotian-liu/LLaVA "
            "issue #812; liucongg/ChatGLM-Finetuning #73, 2023-07-11); 31.73 with a 2024 driver "
            "(vllm-project/vllm #9356)"
        ),
        "bf16_tflops": 125.0, "bandwidth_gbps": 900.0,
        "aliases": ("v100-sxm2-32gb", "tesla v100-sxm2-32gb", "v100-32g"),
        "source": "NVIDIA Tesla V100 datasheet (SXM2: 125 TFLOPS tensor)",
        "note": "no bf16 (Volta): the figure is fp16",
    },
    # --------------------------------------------------------------------- data centre
    {
        "name": "a100-40gb", "display_name": "NVIDIA A100-SXM4-40GB", "vendor": "nvidia",
        "interconnect": "nvlink",
        "architecture": "ampere", "memory_bytes": 40536 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA A100-SXM4-40GB ... 40536MiB' (A100-PCIE-40GB the same)",
        "bf16_tflops": 312.0, "bandwidth_gbps": 1555.0,
        "aliases": ("a100-40g", "a100-sxm4-40gb", "nvidia a100-sxm4-40gb", "a100-pcie-40gb"),
        "source": "NVIDIA A100 datasheet",
    },
    {
        "name": "a100-80gb", "display_name": "NVIDIA A100-SXM4-80GB", "vendor": "nvidia",
        "interconnect": "nvlink",
        "architecture": "ampere", "memory_bytes": 81920 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA A100-SXM4-80GB ... 81920MiB'",
        "driver_reserved_bytes": (81920 - 81050) * MiB,
        "driver_reserved_source": "nvidia-smi total 81920 MiB minus torch.cuda.mem_get_info() total "
        "81050 MiB (pytorch/torchrec benchmark log on an A100-SXM4-80GB class PG509-210: "
        "'6752MiB / 81920MiB', 'total= 81050mb'; torch OOM messages: 'total capacity of 79.15 GiB'); "
        "rust-nvml/nvml-wrapper "
        "issue #57: NVML v1 used 912 MB on idle A100s, v2 used 7.8 MB",
        "bf16_tflops": 312.0, "bandwidth_gbps": 2039.0,
        "aliases": ("a100", "a100-80g", "a100-sxm", "a100-sxm4-80gb", "nvidia a100-sxm4-80gb"),
        "source": "NVIDIA A100 datasheet",
        "note": "bare 'a100' means the 80 GB SXM4 card, the common cloud variant; use a100-40gb "
        "for the 40 GB one",
    },
    {
        "name": "a100-80gb-pcie", "display_name": "NVIDIA A100 80GB PCIe", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "ampere", "memory_bytes": 81920 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA A100 80GB PCIe ... 81920MiB'",
        "driver_reserved_bytes": 81920 * MiB - 85_093_777_408,
        "driver_reserved_source": "nvidia-smi total 81920 MiB minus torch's total 85,093,777,408 B (an "
        "environment dump 'cuda:0: name=NVIDIA A100 80GB PCIe total_memory=85093777408'; torch OOM messages "
        "on 80 GB A100s: 'GPU 0 has a total capacity of 79.25 GiB')",
        "bf16_tflops": 312.0, "bandwidth_gbps": 1935.0,
        "aliases": ("a100-pcie", "a100-pcie-80gb", "nvidia a100 80gb pcie"),
        "source": "NVIDIA A100 datasheet",
    },
    {
        "name": "h100-sxm", "display_name": "NVIDIA H100 80GB HBM3 (SXM5)", "vendor": "nvidia",
        "interconnect": "nvlink",
        "architecture": "hopper", "memory_bytes": 81559 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA H100 80GB HBM3 ... 81559MiB'",
        "driver_reserved_bytes": (81559 - 81091) * MiB,
        "driver_reserved_source": "nvidia-smi total 81559 MiB minus torch's total 81091 MiB: torch OOM "
        "messages on H100 80GB ('GPU 0 has a total capacity of 79.19 GiB', many public logs) and vLLM 0.19 "
        "worker logs ('total_memory=79.19GiB', llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs); "
        "79.19 GiB rounds 81085-81095 MiB",
        "bf16_tflops": 989.4, "bandwidth_gbps": 3350.0,
        "aliases": ("h100", "h100-80gb", "h100-sxm5", "h100-80gb-sxm", "nvidia h100 80gb hbm3", "h800"),
        "source": "NVIDIA H100 datasheet (SXM: 1979 TFLOPS bf16 with sparsity)",
        "note": "bare 'h100' means the SXM5 card; H800 (same memory, cut interconnect) is an alias",
    },
    {
        "name": "h100-pcie", "display_name": "NVIDIA H100 PCIe", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "hopper", "memory_bytes": 81559 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA H100 PCIe ... 81559MiB'",
        "bf16_tflops": 756.0, "bandwidth_gbps": 2000.0,
        "aliases": ("h100-80gb-pcie", "nvidia h100 pcie"),
        "source": "NVIDIA H100 datasheet (PCIe: 1513 TFLOPS bf16 with sparsity)",
    },
    {
        "name": "h100-nvl", "display_name": "NVIDIA H100 NVL (94GB)", "vendor": "nvidia",
        "interconnect": "pcie",
        "architecture": "hopper", "memory_bytes": 95830 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA H100 NVL ... 95830MiB'",
        "bf16_tflops": 835.0, "bandwidth_gbps": 3900.0,
        "aliases": ("h100-94gb", "h100nvl", "nvidia h100 nvl"),
        "source": "NVIDIA H100 datasheet (NVL: 1671 TFLOPS bf16 with sparsity)",
    },
    {
        "name": "h200", "display_name": "NVIDIA H200 (SXM, 141GB)", "vendor": "nvidia",
        "interconnect": "nvlink",
        "architecture": "hopper", "memory_bytes": 143771 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA H200 ... 143771MiB'",
        "driver_reserved_bytes": (143771 - 143160) * MiB,
        "driver_reserved_source": "nvidia-smi total 143771 MiB minus torch's total 143160 MiB: torch OOM "
        "messages on H200 ('GPU 0 has a total capacity of 139.80 GiB' and '139.81 GiB', public logs): "
        "139.805 GiB",
        "bf16_tflops": 989.4, "bandwidth_gbps": 4800.0,
        "aliases": ("h200-141gb", "h200-sxm", "nvidia h200"),
        "source": "NVIDIA H200 datasheet",
    },
    {
        "name": "h20", "display_name": "NVIDIA H20 (96GB)", "vendor": "nvidia",
        "interconnect": "nvlink",
        "architecture": "hopper", "memory_bytes": 97871 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA H20 ... 97871MiB'",
        "bf16_tflops": 148.0, "bandwidth_gbps": 4000.0,
        "aliases": ("h20-96gb", "nvidia h20"),
        "source": "NVIDIA H20 specifications as published by resellers (no public NVIDIA datasheet)",
        "note": "the GPU of the Qwen3 inference measurements; TFLOPS and bandwidth uncertain",
    },
    {
        "name": "b200", "display_name": "NVIDIA B200", "vendor": "nvidia",
        "interconnect": "nvlink",
        "architecture": "blackwell", "memory_bytes": 183359 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA B200 ... 183359MiB'",
        "driver_reserved_bytes": (183359 - 182636) * MiB,
        "driver_reserved_source": "nvidia-smi total 183359 MiB minus torch's total 182636 MiB: torch OOM "
        "messages on B200 ('GPU 0 has a total capacity of 178.35 GiB' and '178.36 GiB', public logs): "
        "178.355 GiB",
        "bf16_tflops": 2250.0, "bandwidth_gbps": 8000.0,
        "aliases": ("b200-180gb", "b200-192gb", "nvidia b200"),
        "source": "NVIDIA HGX B200 datasheet (4.5 PFLOPS fp16/bf16 with sparsity per GPU)",
        "note": "TFLOPS for the 1000 W HGX part; air-cooled systems may run lower",
    },
    {
        "name": "b300", "display_name": "NVIDIA B300 SXM6 AC", "vendor": "nvidia",
        "interconnect": "nvlink",
        "architecture": "blackwell", "memory_bytes": 275040 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA B300 SXM6 AC, 275040 MiB' (nvidia-smi --query-gpu CSV, "
        "drivers 580.95.05 and 590.44; AWS p6-b300 and DGX B300 logs)",
        "bf16_tflops": 2250.0, "bandwidth_gbps": 8000.0,
        "aliases": ("b300-sxm6", "b300-288gb", "blackwell-ultra", "nvidia b300", "nvidia b300 sxm6 ac"),
        "source": "NVIDIA HGX B300 datasheet (36 PFLOPS fp16/bf16 with sparsity per 8 GPUs = 2.25 "
        "PFLOPS dense per GPU; 8 TB/s HBM3e)",
        "note": "sold as 288 GB HBM3e; the driver shows 275040 MiB (268.6 GiB)",
    },
    {
        "name": "gb200", "display_name": "NVIDIA GB200 (one Blackwell GPU)", "vendor": "nvidia",
        "interconnect": "nvlink",
        "architecture": "blackwell", "memory_bytes": 189471 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GB200, 189471 MiB' (GB200 NVL4/NVL72 nodes, drivers "
        "580.95.05 to 590.48.01)",
        "bf16_tflops": 2500.0, "bandwidth_gbps": 8000.0,
        "aliases": ("gb200-nvl72", "gb200-nvl4", "gb200-186gb", "nvidia gb200"),
        "source": "NVIDIA GB200 NVL72 datasheet (360 PFLOPS fp16/bf16 with sparsity per 72 GPUs = "
        "2.5 PFLOPS dense per GPU; 8 TB/s HBM3e per GPU)",
        "note": "one of the two Blackwell GPUs of a GB200 superchip (the Grace CPU's LPDDR5X is not "
        "counted); sold as 186 GB HBM3e, the driver shows 189471 MiB (185.0 GiB)",
    },
    {
        "name": "gh200", "display_name": "NVIDIA GH200 480GB (96GB HBM3)", "vendor": "nvidia",
        "architecture": "hopper", "memory_bytes": 97871 * MiB,
        "memory_source": f"{_SMI}: 'NVIDIA GH200 480GB ... 97871MiB' (GPU HBM only)",
        "bf16_tflops": 989.4, "bandwidth_gbps": 4000.0,
        "aliases": ("gh200-96gb", "gh200-480gb", "grace-hopper", "nvidia gh200 480gb"),
        "source": "NVIDIA GH200 Grace Hopper Superchip datasheet",
        "note": "the 480GB in the name counts the Grace CPU's LPDDR5X; the GPU holds 96 GB HBM3 "
        "(the 144 GB HBM3e variant is not listed)",
    },
    # ------------------------------------------------------------------------ AMD Instinct
    {
        "name": "mi210", "display_name": "AMD Instinct MI210", "vendor": "amd",
        "architecture": "cdna2", "memory_bytes": 68702699520,
        "memory_source": "rocm-smi VRAM total of one 64 GB CDNA2 die (68702699520 B, as MI250X GCDs report)",
        "bf16_tflops": 181.0, "bandwidth_gbps": 1638.4,
        "aliases": ("instinct-mi210", "amd instinct mi210"),
        "source": "AMD Instinct MI210 datasheet",
        "note": "memory taken to equal an MI250X GCD's reported 64 GB (same HBM2e stack count); "
        "not read from an MI210 log",
    },
    {
        "name": "mi250x", "display_name": "AMD Instinct MI250X (one GCD)", "vendor": "amd",
        "architecture": "cdna2", "memory_bytes": 68702699520,
        "memory_source": "HIP total GPU memory of one MI250X GCD in published logs: 68702699520",
        "bf16_tflops": 191.5, "bandwidth_gbps": 1638.4,
        "aliases": ("instinct-mi250x", "mi250x-gcd", "amd instinct mi250x"),
        "source": "AMD Instinct MI250X datasheet (383 TFLOPS bf16, 3.2 TB/s per 2-GCD module)",
        "note": "an MI250X module is two GCDs that PyTorch sees as two devices of 64 GB each; this "
        "entry is one device (half the module's TFLOPS and bandwidth)",
    },
    {
        "name": "mi300x", "display_name": "AMD Instinct MI300X", "vendor": "amd",
        "interconnect": "xgmi",
        "architecture": "cdna3", "memory_bytes": 205822885888,
        "memory_source": "rocm-smi --showmeminfo vram: 'VRAM Total Memory (B): 205822885888'",
        "bf16_tflops": 1307.4, "bandwidth_gbps": 5300.0,
        "aliases": ("instinct-mi300x", "mi300x-192gb", "amd instinct mi300x"),
        "source": "AMD Instinct MI300X datasheet",
    },
    {
        "name": "mi325x", "display_name": "AMD Instinct MI325X", "vendor": "amd",
        "interconnect": "xgmi",
        "architecture": "cdna3", "memory_bytes": 256 * GiB,
        "memory_source": "marketing size 256 GB HBM3E taken as GiB",
        "bf16_tflops": 1307.4, "bandwidth_gbps": 6000.0,
        "aliases": ("instinct-mi325x", "mi325x-256gb", "amd instinct mi325x"),
        "source": "AMD Instinct MI325X datasheet",
        "note": "no published rocm-smi total found; an MI300X reports 0.2% under its 192 GiB, so "
        "this is likely a little high",
    },
    {
        "name": "mi355x", "display_name": "AMD Instinct MI355X", "vendor": "amd",
        "interconnect": "xgmi",
        "architecture": "cdna4", "memory_bytes": 288 * GiB,
        "memory_source": "marketing size 288 GB HBM3E (8 stacks of 36 GB) taken as GiB",
        "bf16_tflops": 2516.6, "bandwidth_gbps": 8000.0,
        "aliases": ("instinct-mi355x", "mi355x-288gb", "mi355", "amd instinct mi355x"),
        "source": "AMD Instinct MI355X datasheet (2.5 PFLOPS fp16/bf16 dense, 5 with sparsity; "
        "8 TB/s); AMD CDNA 4 architecture whitepaper",
        "note": "no published rocm-smi total found; an MI300X reports up to 0.2% under its "
        "192 GiB, so this is likely a little high",
    },
    # ------------------------------------------------------------- Apple unified memory
    {
        "name": "m2-ultra-192gb", "display_name": "Apple M2 Ultra (192 GB unified)", "vendor": "apple",
        "architecture": "apple", "memory_bytes": 192 * GiB,
        "memory_source": "hw.memsize of a 192 GB Mac (unified memory is sold in GiB)",
        "bf16_tflops": 27.2, "bandwidth_gbps": 800.0,
        "aliases": ("m2-ultra", "m2ultra", "apple-m2-ultra"),
        "source": "Apple Mac Studio (2023) technical specifications; TFLOPS: 76-core GPU fp32 rate",
        "note": "TFLOPS approximate (fp16 runs at the fp32 rate on Apple GPUs)",
        "unified_memory": True, "gpu_usable_fraction": APPLE_GPU_USABLE_FRACTION,
        "gpu_usable_source": _APPLE_USABLE_SOURCE,
    },
    {
        "name": "m3-max-128gb", "display_name": "Apple M3 Max (128 GB unified)", "vendor": "apple",
        "architecture": "apple", "memory_bytes": 128 * GiB,
        "memory_source": "hw.memsize of a 128 GB Mac",
        "bf16_tflops": 14.2, "bandwidth_gbps": 400.0,
        "aliases": ("m3-max", "m3max", "apple-m3-max"),
        "source": "Apple MacBook Pro (Nov 2023) technical specifications; TFLOPS: 40-core GPU fp32 rate",
        "note": "TFLOPS approximate",
        "unified_memory": True, "gpu_usable_fraction": APPLE_GPU_USABLE_FRACTION,
        "gpu_usable_source": _APPLE_USABLE_SOURCE,
    },
    {
        "name": "m4-max-128gb", "display_name": "Apple M4 Max (128 GB unified)", "vendor": "apple",
        "architecture": "apple", "memory_bytes": 128 * GiB,
        "memory_source": "hw.memsize of a 128 GB Mac",
        "bf16_tflops": 18.4, "bandwidth_gbps": 546.0,
        "aliases": ("m4-max", "m4max", "apple-m4-max"),
        "source": "Apple MacBook Pro (2024) technical specifications; TFLOPS: 40-core GPU fp32 rate",
        "note": "TFLOPS approximate",
        "unified_memory": True, "gpu_usable_fraction": APPLE_GPU_USABLE_FRACTION,
        "gpu_usable_source": _APPLE_USABLE_SOURCE,
    },
)
# fmt: on
