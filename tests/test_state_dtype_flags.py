"""The engines' recurrent-state dtype flags (InferenceSetup ``ssm_cache_dtype`` / ``conv_cache_dtype``:
vLLM ``--mamba-ssm-cache-dtype`` / ``--mamba-cache-dtype``, SGLang ``--mamba-ssm-dtype`` /
``SGLANG_MAMBA_CONV_DTYPE``) and llama.cpp's ``d_conv - 1`` fp32 state (formulas/recurrent_state.py).

Every number is derived by hand from the configs:
* Falcon-H1-7B: 44 Mamba-2 layers; conv over x, B, C = d_ssm 3072 + 2 x 1 group x d_state 256 = 3584
  channels, kernel 4 (the engines keep 3 inputs); SSM state 24 heads x 128 x 256 = 786,432; no config
  ``mamba_ssm_dtype`` and no vLLM hook.
* Qwen3.5-27B: 48 gated delta-nets; conv over q, k, v = 10,240 channels, kernel 4; delta-rule state
  48 x 128 x 128 = 786,432; the config asks ``"mamba_ssm_dtype": "float32"`` (vLLM's Qwen3.5 hook and
  SGLang's config step read it).
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

import peakmem
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.formulas.recurrent_state import engine_state
from peakmem.formulas.serving import estimate_inference
from peakmem.inference import Engine, InferenceSetup
from peakmem.resolve import resolve_model

FALCON_LAYERS, FALCON_CONV, FALCON_SCAN = 44, 3584, 24 * 128 * 256
Q35_LAYERS, Q35_CONV, Q35_SCAN = 48, 10240, 48 * 128 * 128
WINDOW = 4 - 1  # conv_kernel - 1 inputs (vLLM, SGLang mamba_utils.py; llama.cpp n_embd_r)


def _layer(conv_channels: int, scan: int, conv_bytes: int, scan_bytes: int) -> int:
    return conv_channels * WINDOW * conv_bytes + scan * scan_bytes


# (engine, ssm_cache_dtype, conv_cache_dtype) -> (conv, scan) bytes per element, Falcon-H1 (no hook)
FALCON_CASES = [
    ("vllm", "auto", "auto", 2, 2),  # "auto": the model dtype for both
    ("vllm", "float32", "auto", 2, 4),
    ("vllm", "float16", "auto", 2, 2),
    ("vllm", "auto", "float32", 4, 4),  # the scan state follows --mamba-cache-dtype while auto
    ("vllm", "bfloat16", "float32", 4, 2),
    ("sglang", "auto", "auto", 2, 4),  # bf16 conv, fp32 scan
    ("sglang", "bfloat16", "auto", 2, 2),
    ("sglang", "float16", "float32", 4, 2),
    ("sglang", "auto", "float32", 4, 4),  # SGLang's conv dtype does not move its scan state
]


@pytest.mark.parametrize(("engine", "ssm", "conv", "conv_b", "scan_b"), FALCON_CASES)
def test_falcon_h1_state_per_flag(engine: str, ssm: str, conv: str, conv_b: int, scan_b: int) -> None:
    spec = resolve_model("falcon-h1-7b")
    state = engine_state(spec, Engine(engine), act_bytes=2, ssm_dtype=ssm, conv_dtype=conv)
    assert state.conv == FALCON_LAYERS * FALCON_CONV * WINDOW * conv_b
    assert state.temporal == FALCON_LAYERS * FALCON_SCAN * scan_b
    assert state.largest_layer == _layer(FALCON_CONV, FALCON_SCAN, conv_b, scan_b)
    assert (state.conv_dtype_bytes, state.temporal_dtype_bytes) == (conv_b, scan_b)


def test_the_flag_wins_over_the_model_config() -> None:
    spec = resolve_model("qwen3.5-27b")
    assert spec.mamba_ssm_dtype == "float32"
    for engine in (Engine.VLLM, Engine.SGLANG):
        # auto: the config's float32 (vLLM's Qwen3_5 hook, SGLang's config step)
        assert engine_state(spec, engine, act_bytes=2).temporal == Q35_LAYERS * Q35_SCAN * 4
        # the flag: bf16 (the hook sets mamba_ssm_cache_dtype only while it is "auto"; SGLang ranks
        # SGLANG_MAMBA_SSM_DTYPE above the config)
        bf16 = engine_state(spec, engine, act_bytes=2, ssm_dtype="bfloat16")
        assert bf16.temporal == Q35_LAYERS * Q35_SCAN * 2
    # vLLM --mamba-cache-dtype float32 alone: the conv state in fp32, the scan state still the hook's
    wide = engine_state(spec, Engine.VLLM, act_bytes=2, conv_dtype="float32")
    assert (wide.conv, wide.temporal) == (Q35_LAYERS * Q35_CONV * WINDOW * 4, Q35_LAYERS * Q35_SCAN * 4)


def test_llamacpp_keeps_d_conv_minus_one_inputs_in_fp32() -> None:
    # llama-hparams.cpp n_embd_r: (d_conv - 1) x (d_inner + 2 n_group d_state); n_embd_s: d_state x d_inner;
    # llama-model.cpp: recurrent_type_k / _v GGML_TYPE_F32
    spec = resolve_model("falcon-h1-7b")
    state = engine_state(spec, Engine.LLAMACPP, act_bytes=2)
    assert state.largest_layer == FALCON_CONV * 3 * 4 + FALCON_SCAN * 4
    assert state.total == FALCON_LAYERS * (FALCON_CONV * 3 * 4 + FALCON_SCAN * 4)
    # transformers keeps conv_kernel = 4 inputs in the compute dtype
    assert engine_state(spec, Engine.HF, act_bytes=2).conv == FALCON_LAYERS * FALCON_CONV * 4 * 2


def test_setup_reaches_the_estimate() -> None:
    spec = resolve_model("falcon-h1-7b")
    base: dict[str, Any] = {"engine": "sglang", "batch": 2, "context": 1024, "gpu_bytes": 80 * 10**9}
    plain = estimate_inference(spec, InferenceSetup(**base))
    half = estimate_inference(spec, InferenceSetup(**base, ssm_cache_dtype="bfloat16"))
    key = "recurrent_state_bytes_per_sequence"
    assert plain.extra[key] == FALCON_LAYERS * _layer(FALCON_CONV, FALCON_SCAN, 2, 4)
    assert half.extra[key] == FALCON_LAYERS * _layer(FALCON_CONV, FALCON_SCAN, 2, 2)
    assert half.setup["ssm_cache_dtype"] == "bfloat16" and "ssm_cache_dtype" not in plain.setup
    assert any("ssm_cache_dtype bfloat16" in a for a in half.assumptions)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"engine": "vllm", "ssm_cache_dtype": "fp8"}, "ssm_cache_dtype"),
        ({"engine": "sglang", "conv_cache_dtype": "int8"}, "conv_cache_dtype"),
        ({"engine": "hf", "ssm_cache_dtype": "bfloat16"}, "ssm_cache_dtype"),
        ({"engine": "llamacpp", "conv_cache_dtype": "float16"}, "conv_cache_dtype"),
    ],
)
def test_bad_values_name_the_field(given: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError, match=field) as err:
        InferenceSetup(**given)
    assert "\n" not in str(err.value)


def _cli(*args: str) -> dict[str, Any]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["infer", *args, "--json"])
    return json.loads(buf.getvalue())  # type: ignore[no-any-return]


def test_cli_api_and_page_agree() -> None:
    flags = {"engine": "vllm", "batch": 4, "context": 4096}
    api = peakmem.infer("falcon-h1-7b", ssm_cache_dtype="float32", **flags)
    assert api["setup"]["ssm_cache_dtype"] == "float32"
    cli = _cli("falcon-h1-7b", "--ssm-cache-dtype", "float32", "--engine", "vllm", "--batch", "4",
               "--context", "4096")  # fmt: skip
    assert cli["peak_allocated_bytes"] == api["peak_allocated_bytes"]
    # the fp32 scan state is larger than vLLM's auto (bf16) one
    assert api["peak_allocated_bytes"] > peakmem.infer("falcon-h1-7b", **flags)["peak_allocated_bytes"]
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from peakmem.web import app as web

    body = {"model": "falcon-h1-7b", "ssm_cache_dtype": "float32", **flags}
    with TestClient(web.create_app()) as client:
        page = client.post("/api/infer", json=body).json()
        bad = client.post("/api/infer", json={**body, "engine": "hf"})
    assert page["peak_allocated_bytes"] == api["peak_allocated_bytes"]
    assert bad.status_code == 422 and "ssm_cache_dtype" in bad.text
