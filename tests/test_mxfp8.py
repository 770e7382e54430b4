"""torchao MXFP8 training (``--precision float8-mxfp8``; torchtitan's MX converter, recipes mxfp8_cublas /
mxfp8_cublas_rceil): the Linears save what ``nn.Linear`` saves (``mx_mm.forward``:
``ctx.save_for_backward(input_hp, weight_hp)``), and each cast is one kernel writing e4m3 elements and an
e8m0 scale per 32 (torchao 0.18 prototype/moe_training/mxfp8_linear.py), with no fp32 copies and no
``_scaled_mm`` layout copies. Hand-derived on one Linear and the tiny Llama; the kernels need SM100, so
``measure`` refuses it on this CPU."""

from __future__ import annotations

import pytest

from peakmem.errors import InputError
from peakmem.formulas.activations.float8 import (
    RECIPES,
    cast_sizes,
    fp8_bytes,
    linear_backward_peak,
    linear_forward_peak,
)
from peakmem.training import Precision, TrainingSetup
from test_float8_training import SMALL_VOCAB, _estimate, _saved
from test_fromfile_torchtitan import _map, _minimal

MX = RECIPES[Precision.FLOAT8_MXFP8]


def test_an_mx_cast_writes_its_result_only() -> None:
    # 33 elements: 33 e4m3 bytes and two e8m0 scales (blocks of 32); no fp32 copies
    assert fp8_bytes(33, mx=True) == 35 and cast_sizes(33, mx=True) == (35,)
    assert sum(cast_sizes(33)) == 9 * 33  # torchao's eager float8 cast, for contrast


def test_linear_forward_hand_derived() -> None:
    # 16 tokens, 64 -> 4096: the input's MX copy (1,024 + 32) beside the weight's (262,144 + 8,192)
    assert linear_forward_peak(16, 64, 4096, mx=True) == 1_056 + 270_336 == 271_392


def test_linear_backward_hand_derived() -> None:
    # gate_proj (m 512, k 64, n 176), bf16: grad_output along dim 0 (90,112 + 2,816) and the weight along
    # dim 1 (11,264 + 352), grad_input (2 x 32,768); then grad_output again along dim 1 and the input
    # along dim 1 (32,768 + 1,024) for the 16-bit grad_weight (2 x 11,264): no layout copies
    go8, w8, x8 = 92_928, 11_616, 33_792
    assert linear_backward_peak(512, 64, 176, 2, MX) == go8 + w8 + 65_536 + go8 + x8 + 22_528 == 319_328


def test_saved_tensors_are_mixed_bf16s_and_casts_lighter_than_float8() -> None:
    # the 128-token vocabulary: with the tiny Llama's own 1000 the logits decide every peak
    mx, bf16 = _estimate(Precision.FLOAT8_MXFP8, SMALL_VOCAB), _estimate(Precision.MIXED_BF16, SMALL_VOCAB)
    tensorwise = _estimate(Precision.FLOAT8_TENSORWISE, SMALL_VOCAB)
    assert _saved(mx) == _saved(bf16)
    assert mx.model_state_bytes == bf16.model_state_bytes
    assert bf16.peak_allocated_bytes <= mx.peak_allocated_bytes < tensorwise.peak_allocated_bytes


def test_measure_refuses_it_in_one_line() -> None:
    from peakmem.measure.float8 import convert_float8

    with pytest.raises(InputError) as e:
        convert_float8(None, TrainingSetup(precision=Precision.FLOAT8_MXFP8))
    assert "SM100" in str(e.value) and "\n" not in str(e.value)


def test_simulate_refuses_it_without_pointing_at_measure() -> None:
    with pytest.raises(InputError) as e:
        TrainingSetup(precision=Precision.FLOAT8_MXFP8).check_oracle_runs("simulate")
    assert "simulate does not run" in str(e.value) and "measure" not in str(e.value)


def test_torchtitan_mx_converter_maps_to_it() -> None:
    doc = _minimal(quantize={"linear": {"mx": {"recipe_name": "mxfp8_cublas_rceil"}}})
    doc["model"]["converters"] = ["quantize.linear.mx"]
    assert _map(doc, gpus=8).options["precision"] == "float8-mxfp8"
    emulated = _minimal(quantize={"linear": {"mx": {"recipe_name": "mxfp8_emulated"}}})
    emulated["model"]["converters"] = ["mx"]
    with pytest.raises(InputError, match="mxfp8_emulated"):
        _map(emulated, gpus=8)
