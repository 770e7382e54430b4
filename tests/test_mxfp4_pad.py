"""vLLM's MXFP4 experts padded to its MoE kernel's tiles (formulas/serving/mxfp4_pad.py)."""

from __future__ import annotations

from peakmem.formulas.serving import estimate_inference
from peakmem.formulas.serving.mxfp4_pad import MARLIN_ALIGN, TRITON_ALIGN, alignment
from peakmem.inference import InferenceSetup
from peakmem.resolve import resolve_gpu, resolve_model

GiB = 2**30


def _pad(model: str, gpu: str, version: str, tp: int) -> int:
    g = resolve_gpu(gpu)
    setup = InferenceSetup(engine="vllm", engine_version=version, weights="mxfp4", context=8192, tp=tp,  # type: ignore[arg-type]
                           gpu_bytes=g.usable_bytes, gpu_architecture=g.architecture)  # fmt: skip
    rows = [i for i in estimate_inference(resolve_model(model), setup).items if "padding" in i.path]
    return sum(i.bytes for i in rows)


def test_marlin_pads_hidden_to_256_and_intermediate_to_128_by_hand() -> None:
    # gpt-oss-120b at TP 4 on an A100 (Marlin): 36 layers x 128 experts x 3 x (768 x 3072 - 720 x 2880)
    # x 17 / 32 bytes
    by_hand = 36 * 128 * 3 * (768 * 3072 - 720 * 2880) * 17 // 32
    assert _pad("gpt-oss-120b", "a100-80gb", "0.10.1.1", 4) == by_hand
    # the 0.10.1.1 log: "Model loading took 17.2217 GiB", 15.21 GiB unpadded: the padding within 0.1 GiB
    assert abs(by_hand / GiB - (17.2217 - 15.211)) < 0.1


def test_backend_by_gpu_and_release() -> None:
    assert alignment("ampere", (0, 19, 0)) == MARLIN_ALIGN
    assert alignment("hopper", (0, 10, 1)) == MARLIN_ALIGN  # torch 2.7.1: no triton_kernels path
    assert alignment("hopper", (0, 10, 2)) == TRITON_ALIGN
    assert alignment("blackwell", (0, 19, 0)) == (256, 256)
    assert alignment("cdna3", (0, 10, 1)) == (128, 1) and alignment("cdna3", (0, 19, 0)) == (256, 256)
    assert alignment("", (0, 19, 0)) is None
    # gpt-oss-20b at TP 1 on an H100 from 0.10.2: I = 2880 is a multiple of 64, nothing padded
    assert _pad("gpt-oss-20b", "h100-sxm", "0.19.0", 1) == 0
    assert _pad("gpt-oss-20b", "a100-80gb", "0.19.0", 1) > 0
