"""Hypothesis fuzzing of the web API: whatever the body, the answer is 200 or a 4xx naming what is
wrong, never a 500 (an exception the project did not mean), and every request stays bounded in time."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from peakmem.web import app as web

NUMBERS = hs.one_of(hs.integers(-(10**30), 10**30), hs.floats(allow_nan=True, allow_infinity=True),
                    hs.sampled_from([0, 1, 2, 7, 2048, 2**40, -1]))  # fmt: skip
SCALARS = hs.one_of(NUMBERS, hs.text(max_size=30), hs.booleans(), hs.none())
MODELS = hs.sampled_from(["gpt2", "llama-3.2-1b", "qwen3-0.6b", "nope", ""])
TRAIN_KEYS = ["batch", "seq", "grad_accum", "lora_rank", "lora_alpha", "gpu_count", "zero", "tp", "pp",
              "method", "precision", "optimizer", "checkpointing", "attention", "fsdp", "offload",
              "quant"]  # fmt: skip
INFER_KEYS = ["batch", "context", "weights", "engine", "kv_cache", "tp", "gpu_memory_utilization"]
PLAN_KEYS = ["max_gpus", "global_batch"]
CONFIGS = hs.dictionaries(
    hs.sampled_from(["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                     "intermediate_size", "max_position_embeddings", "num_key_value_heads"]),
    hs.one_of(SCALARS, hs.sampled_from(["llama", "gpt2"])), max_size=8,
)  # fmt: skip


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(web.create_app()) as c:
        yield c


def _body(model: str | None, config: dict[str, Any] | None, extra: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = dict(extra)
    if config is not None:
        body["config"] = config
    if model is not None:
        body["model"] = model
    return body


@settings(
    max_examples=int(os.environ.get("PEAKMEM_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    endpoint=hs.sampled_from(["/api/train", "/api/fit", "/api/infer", "/api/fit_infer", "/api/plan"]),
    model=hs.one_of(MODELS, hs.none()),
    config=hs.one_of(hs.none(), CONFIGS),
    extra=hs.dictionaries(hs.sampled_from(TRAIN_KEYS + INFER_KEYS + PLAN_KEYS + ["gpus", "bogus"]),
                          hs.one_of(SCALARS, hs.lists(hs.text(max_size=12), max_size=3)), max_size=5),
)  # fmt: skip
def test_no_body_makes_a_500(
    client: TestClient, endpoint: str, model: str | None, config: dict[str, Any] | None, extra: dict[str, Any]
) -> None:
    start = time.perf_counter()
    try:
        response = client.post(endpoint, json=_body(model, config, extra))
    except ValueError:  # NaN / inf cannot be sent as JSON at all: nothing reached the server
        return
    assert response.status_code < 500, (response.status_code, response.text[:300])
    assert time.perf_counter() - start < 10
    if response.status_code >= 400:
        assert response.json()  # an error body that says what is wrong
