"""Quantized kernels' workspaces and temporaries (formulas/quant_kernels.py), derived by hand on the tiny
spec: 2 layers, hidden 64, q 4 x 16, k/v 2 x 16, MLP 128; the linears (in, out) per layer are q (64, 64),
k (64, 32), v (64, 32), o (64, 64), gate (64, 128), up (64, 128), down (128, 64); the head stays fp16."""

from __future__ import annotations

from typing import Any

import pytest

from _infer_specs import infer_cli_equals_api, tiny
from peakmem.breakdown import Phase
from peakmem.errors import InputError
from peakmem.formulas import quant_kernels as qk
from peakmem.formulas.serving import estimate_inference
from peakmem.inference import GptqKernel, InferenceSetup
from peakmem.weight_formats import parse_weight_format

TINY_LINEARS = sorted(
    [(64, 64, 2), (64, 32, 2), (64, 32, 2), (64, 64, 2), (64, 128, 2), (64, 128, 2), (128, 64, 2)]
)
LARGEST = 64 * 128  # weights of gate / up / down (one layer)


def test_quantized_linears_are_the_layer_linears() -> None:
    got = qk.quantized_linears(tiny(), parse_weight_format("gptq-4bit-g32"))
    assert sorted(got) == TINY_LINEARS
    assert qk.quantized_linears(tiny(), parse_weight_format("fp16")) == ()


def test_exllama_temp_dq_by_hand() -> None:
    # largest qweight.numel() = in / 32 x 4 x out = 64 / 8 x 128 = 1024; x 8 fp16 elements,
    # + the (1, 1) temp_state
    assert qk.exllama_temp_dq_bytes(tuple(TINY_LINEARS)) == (1024 * 8 + 1) * 2
    assert qk.exllama_temp_dq_bytes(()) == 0


def test_exllamav2_scratch_and_perms_by_hand() -> None:
    # gate/up: temp_dq 64 x 128 x 2 + 128, temp_fwd 128 x 2048 x 8 x 4 + 128 (down's out is 64: smaller)
    assert qk.exllamav2_scratch_bytes(tuple(TINY_LINEARS)) == (64 * 128 * 2 + 128) + (
        128 * 2048 * 8 * 4 + 128
    )
    # out not a multiple of 32 is padded: out 40 -> 64
    assert qk.exllamav2_scratch_bytes(((32, 40, 1),)) == (32 * 64 * 2 + 128) + (64 * 2048 * 8 * 4 + 128)
    # q_perm + q_invperm: 2 x in int16 per linear with more than one group: in summed over a layer =
    # 6 x 64 + 128 = 512, 2 layers
    assert qk.exllamav2_perm_bytes(tuple(TINY_LINEARS), 4, 32) == 2 * 2 * 512 * 2
    # group 128 >= every in (64, 128): g_idx all zero, no permutation
    assert qk.exllamav2_perm_bytes(tuple(TINY_LINEARS), 4, 128) == 0
    assert qk.exllamav2_perm_bytes(tuple(TINY_LINEARS), 4, -1) == 0


@pytest.mark.parametrize(
    ("bits", "group", "want"),
    [
        # int32 shift (4 N) + its int8 copy (N); zeros int8 G x out, G = 64 / 32 = 2
        (4, 32, 5 * LARGEST + 2 * 128),
        (2, -1, 5 * LARGEST + 1 * 128),  # one group
        # 8 bits: int16 copy: max(4 + 2, 2 x 2 + 2) = 6 B per weight; zeros int16
        (8, 32, 6 * LARGEST + 2 * 2 * 128),
        # 3 bits: int32 weight + int32 difference + fp16 product; zeros int32
        (3, 32, 10 * LARGEST + 4 * 2 * 128),
    ],
)
def test_cuda_old_dequant_by_hand(bits: int, group: int, want: int) -> None:
    assert qk.cuda_old_dequant_bytes(64, 128, bits, group) == want


def test_matmul_temporaries_by_kernel_and_rows() -> None:
    spec = tiny()

    def temp(weights: str, rows: int, kernel: str | None = None, *, prefill: bool = True) -> int:
        setup = InferenceSetup(weights=weights, gptq_kernel=kernel)  # type: ignore[arg-type]
        return qk.matmul_temporary_bytes(spec, setup, rows, 2, prefill=prefill)

    # bitsandbytes 4-bit: gemv for one row only; from 2 rows one weight dequantized (fp16), in decode too
    assert temp("nf4", 1) == 0
    assert temp("nf4", 2) == LARGEST * 2 == temp("nf4", 2, prefill=False)
    assert temp("nf4-dq", 2) == LARGEST * 2 + LARGEST // 64 * 4  # + the fp32 absmax dequantized first
    # cuda-old: the torch dequantization from 128 rows (g128: one group of the 64 inputs)
    assert temp("gptq-4bit-g128", 127, "cuda-old") == 0
    assert temp("gptq-4bit-g128", 128, "cuda-old") == 5 * LARGEST + 128
    assert temp("gptq-4bit-g128", 128, "cuda-old", prefill=False) == 5 * LARGEST + 128
    # exllama kernels reconstruct into their persistent temp_dq: nothing per forward
    assert temp("gptq-4bit-g128", 512, "exllama") == temp("gptq-4bit-g128", 512, "exllamav2") == 0
    # no kernel named: one weight dequantized in prefill (as before), nothing in decode
    assert temp("gptq-4bit-g128", 512) == LARGEST * 2
    assert temp("gptq-4bit-g128", 4, prefill=False) == 0
    assert temp("fp16", 512) == 0


def _phases(weights: str, kernel: str | None, batch: int = 2) -> dict[Phase, int]:
    setup = InferenceSetup(weights=weights, context=100, prompt=60, batch=batch, gptq_kernel=kernel)  # type: ignore[arg-type]
    return {p.phase: p.bytes for p in estimate_inference(tiny(), setup).phases}


def test_generate_adds_the_kernel_terms() -> None:
    """Against the unnamed kernel: exllamav2 trades the prefill's dequantized weight for its scratch and
    permutations, held in decode too; exllama for its temp_dq; cuda-old (120 prefill rows < 128: the
    CUDA kernel) drops it."""
    base = _phases("gptq-4bit-g32", None)
    scratch = (64 * 128 * 2 + 128) + (128 * 2048 * 8 * 4 + 128)
    perms = 2 * 2 * 512 * 2
    v2 = _phases("gptq-4bit-g32", "exllamav2")
    assert v2[Phase.PREFILL] - base[Phase.PREFILL] == scratch + perms - LARGEST * 2
    assert v2[Phase.DECODE] - base[Phase.DECODE] == scratch + perms
    v1 = _phases("gptq-4bit-g32", "exllama")
    assert v1[Phase.PREFILL] - base[Phase.PREFILL] == 2
    assert v1[Phase.DECODE] - base[Phase.DECODE] == (1024 * 8 + 1) * 2
    old = _phases("gptq-4bit-g32", "cuda-old")
    assert old[Phase.PREFILL] - base[Phase.PREFILL] == -LARGEST * 2
    assert old[Phase.DECODE] == base[Phase.DECODE]
    # batch 3 x 60 = 180 rows: cuda-old dequantizes in prefill (G = 2 groups of 32)
    base3, old3 = _phases("gptq-4bit-g32", None, 3), _phases("gptq-4bit-g32", "cuda-old", 3)
    assert old3[Phase.PREFILL] - base3[Phase.PREFILL] == 5 * LARGEST + 2 * 128 - LARGEST * 2


def _dequant_items(weights: str, batch: int) -> list[tuple[Phase, int]]:
    setup = InferenceSetup(weights=weights, context=100, prompt=60, batch=batch)
    return [
        (p.phase, i.bytes)
        for p in estimate_inference(tiny(), setup).phases
        for i in p.items
        if i.path.startswith("quantized matmul")
    ]


def test_bnb_decode_dequantizes_from_batch_two() -> None:
    """matmul_4bit takes gemv_4bit for one input row only: decode at batch 1 holds no dequantized weight,
    at batch 2 it holds one (64 x 128 fp16), as prefill does."""
    assert _dequant_items("nf4", 1) == [(Phase.PREFILL, LARGEST * 2)]
    assert _dequant_items("nf4", 2) == [(Phase.PREFILL, LARGEST * 2), (Phase.DECODE, LARGEST * 2)]
    assert _dequant_items("fp4", 2) == _dequant_items("nf4", 2)


def test_gptq_kernel_errors_name_the_field() -> None:
    with pytest.raises(InputError, match=r"^gptq_kernel='marlin': unknown"):
        InferenceSetup(weights="gptq", gptq_kernel="marlin")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^gptq_kernel='exllama': .*weights=fp16 are neither"):
        InferenceSetup(weights="fp16", gptq_kernel="exllama")  # type: ignore[arg-type]
    # AWQ runs AutoAWQ's exllama v2 only (AwqConfig version="exllama"); no v1 / cuda-old
    with pytest.raises(InputError, match=r"^gptq_kernel='exllama': .*weights=awq-4bit-g128 are neither"):
        InferenceSetup(weights="awq-4bit", gptq_kernel="exllama")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^gptq_kernel='exllamav2': .*not engine=vllm"):
        InferenceSetup(weights="gptq", engine="vllm", gptq_kernel="exllamav2")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^gptq_kernel='exllama': runs 4-bit weights, not 8-bit"):
        InferenceSetup(weights="gptq-8bit-g128", gptq_kernel="exllama")  # type: ignore[arg-type]
    s = InferenceSetup(weights="gptq-3bit-g128", gptq_kernel="cuda-old")  # type: ignore[arg-type]
    assert s.gptq_kernel is GptqKernel.CUDA_OLD and s.echo()["gptq_kernel"] == "cuda-old"
    assert "gptq_kernel" not in InferenceSetup(weights="gptq").echo()


def test_api_and_cli_llama_2_13b_exllamav2(capsys: Any) -> None:
    """Llama-2-13B: the MLP's gate/up (in 5120, out 13824) sets the scratch: 5120 x 13824 x 2 + 128 +
    13824 x 2048 x 8 x 4 + 128 = 1,047,527,680 B; the permutations: 40 layers x 4 B x (6 x 5120 + 13824)."""
    out = infer_cli_equals_api(
        capsys, "llama-2-13b", weights="gptq-4bit-g128", gptq_kernel="exllamav2", prompt=512, context=513
    )
    items = {i["path"]: i["bytes"] for i in out["items"]}
    assert items["exllamav2 scratch (temp_dq + temp_fwd of 2048 x 8 tokens, largest layer)"] == 1_047_527_680
    assert items["exllamav2 q_perm + q_invperm (int16 per input row, every layer)"] == 40 * 4 * (
        6 * 5120 + 13824
    )
    assert out["setup"]["gptq_kernel"] == "exllamav2"
    assert any("GPTQ kernel exllamav2" in a for a in out["assumptions"])


def test_awq_exllamav2_scratch_by_hand(capsys: Any) -> None:
    """transformers' AwqConfig(version="exllama") -> AutoAWQ's exllamav2 linears: the scratch of the
    largest layer, out unpadded (WQLinear_ExllamaV2.temp_dq_size), no permutations; prefill
    reconstructs into it. Tiny: out 40 stays 40 (auto-gptq pads it to 64); Llama-3.1-8B's gate/up (in
    4096, out 14336): 4096 x 14336 x 2 + 128 + 14336 x 2048 x 8 x 4 + 128 = 1,056,964,864 B."""
    assert qk.exllamav2_scratch_bytes(((32, 40, 1),), out_align=qk.AWQ_EXLLAMAV2_OUT_ALIGN) == (
        32 * 40 * 2 + 128
    ) + (40 * 2048 * 8 * 4 + 128)
    base, v2 = _phases("awq-4bit-g32", None), _phases("awq-4bit-g32", "exllamav2")
    scratch = (64 * 128 * 2 + 128) + (128 * 2048 * 8 * 4 + 128)
    assert v2[Phase.PREFILL] - base[Phase.PREFILL] == scratch - LARGEST * 2
    assert v2[Phase.DECODE] - base[Phase.DECODE] == scratch
    out = infer_cli_equals_api(capsys, "llama-3.1-8b", weights="awq-4bit", gptq_kernel="exllamav2", prompt=64,
                               context=128)  # fmt: skip
    items = {i["path"]: i["bytes"] for i in out["items"]}
    key = "AutoAWQ exllamav2 scratch (temp_dq + temp_fwd of 2048 x 8 tokens, largest layer)"
    assert items[key] == 4096 * 14336 * 2 + 128 + 14336 * 2048 * 8 * 4 + 128 == 1_056_964_864
    assert not any("q_perm" in path for path in items)
    assert any("AWQ with transformers' exllama version" in a for a in out["assumptions"])
