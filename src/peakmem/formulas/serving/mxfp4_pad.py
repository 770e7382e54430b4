"""vLLM's MXFP4 experts as it allocates them: padded to its MoE kernel's tiles.

``Mxfp4MoEMethod.create_weights`` allocates ``w13_weight`` [E, 2 I', H' / 2], ``w2_weight`` [E, H', I' / 2]
(uint8, two E2M1 values a byte) and their E8M0 scales [E, 2 I', H' / 32], [E, H', I' / 32], where the hidden
size H and the rank's intermediate size I are rounded up for the backend the GPU gets (read in vLLM
0.10.1.1, 0.10.2 and 0.19.0: ``quantization/mxfp4.py`` ``create_weights``; 0.19.0 ``fused_moe/oracle/
mxfp4.py`` ``select_mxfp4_moe_backend`` and ``mxfp4_round_up_hidden_size_and_intermediate_size``):

* Marlin (compute capability 8.x; Hopper too before 0.10.2, whose torch 2.7.1 is below the 2.8.0 that
  0.10.1.1's ``_should_use_marlin`` wants for triton_kernels; 0.10.2 pins torch 2.8.0): I to 128, H to 256
  ("the moe marlin kernel requires that for each linear n % 256 == 0 and k % 128 == 0");
* FlashInfer TRT-LLM (Blackwell, capability 10.x): I and H to 256;
* triton_kernels (Hopper from 0.10.2): I to 64; the Hopper value layout's own padding of the swizzled
  weights (triton_kernels ``HopperMXValueLayout``) is not counted;
* ROCm: I to 128 before 0.19 (0.10.1.1), I and H to 256 from 0.19 (0.19.0; releases between not read).

gpt-oss-120b at TP 4 on an A100: H 2880 -> 3072 and I 720 -> 768, 13.8 % more expert bytes, 1.96 GiB a rank,
where the 0.10.1.1 log reads "Model loading took 17.2217 GiB" against 15.21 GiB unpadded. Expert biases
(bf16, fp32 on triton_kernels) are padded too and not counted (a few MiB).
"""

from __future__ import annotations

from peakmem.device import is_rocm
from peakmem.formulas.serving.context import ServingContext
from peakmem.formulas.weights import E8M0_BYTES
from peakmem.inference import CURRENT_ENGINE_VERSION, Engine
from peakmem.releases import Release, parse_release
from peakmem.weight_formats import MXFP4_BLOCK, Scheme

MXFP4_BLOCK_BYTES = MXFP4_BLOCK // 2 + E8M0_BYTES  # 32 E2M1 values in 16 bytes and their E8M0 scale
MARLIN_ALIGN = (128, 256)  # (I, H)
FLASHINFER_ALIGN = (256, 256)
TRITON_ALIGN = (64, 1)
ROCM_ALIGN_BEFORE_019 = (128, 1)
ROCM_ALIGN = (256, 256)
ROCM_ALIGN_RELEASE = (0, 19, 0)
TRITON_HOPPER_RELEASE = (0, 10, 2)  # the first release on torch 2.8.0 (requirements/cuda.txt)
MARLIN_ARCHITECTURES = ("ampere", "ada")
HOPPER, BLACKWELL = "hopper", "blackwell"


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def alignment(architecture: str, release: Release) -> tuple[int, int] | None:
    """(I, H) rounding of vLLM ``release``'s MXFP4 MoE backend on a GPU of ``architecture`` (None: not
    known, nothing counted)."""
    if is_rocm(architecture):
        return ROCM_ALIGN if release >= ROCM_ALIGN_RELEASE else ROCM_ALIGN_BEFORE_019
    if architecture in MARLIN_ARCHITECTURES or (architecture == HOPPER and release < TRITON_HOPPER_RELEASE):
        return MARLIN_ALIGN
    if architecture == HOPPER:
        return TRITON_ALIGN
    if architecture == BLACKWELL:
        return FLASHINFER_ALIGN
    return None


def vllm_mxfp4_pad_bytes(c: ServingContext) -> int:
    """The bytes vLLM's padding adds to one rank's MXFP4 experts (0: another engine or format, or a GPU
    whose backend is not known)."""
    s = c.setup
    if s.engine is not Engine.VLLM or s.weight_format.scheme is not Scheme.MXFP4:
        return 0
    release = parse_release(s.engine_version or CURRENT_ENGINE_VERSION["vllm"], field="engine_version",
                            examples="0.10.1 or 0.19")  # fmt: skip
    align = alignment(s.gpu_architecture, release)
    if align is None:
        return 0
    ways = s.layout.expert_ways
    hidden = c.spec.hidden_size
    total = 0
    for g in c.spec.groups:
        mlp = g.layer.mlp
        if not mlp.num_experts:
            continue
        # expert parallel: whole experts, E / ways of them; else every expert's intermediate split ways ways
        experts, inter = (
            (-(-mlp.num_experts // ways), mlp.intermediate_size)
            if s.ep > 1
            else (mlp.num_experts, mlp.intermediate_size // ways)
        )
        padded = _round_up(inter, align[0]) * _round_up(hidden, align[1]) - inter * hidden
        total += g.count * experts * 3 * padded * MXFP4_BLOCK_BYTES // MXFP4_BLOCK
    return total
