"""Under load, on loopback: 240 requests from 16 concurrent clients, no error; oversized bodies and
absurd configs rejected cleanly while the server keeps answering."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from _web_server import running_server

REQUESTS = 240  # 15 per client, every kind of request (job) 24 times: 500 took 72 s of the suite
CLIENTS = 16
# A hang guard, not a speed target (speed lives in benchmarks/): with the reserved replay
# (formulas/step_sequence.py) each fit replays ~50 candidate steps, and the 500 requests took 100 s
# alone on this 2-core machine, more beside another pytest worker
TIME_LIMIT_S = 400.0
TEN_MB = 10 * 1000 * 1000


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    with running_server() as url:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        yield parts.hostname, parts.port


def gpt2_xl_config() -> dict[str, Any]:
    from peakmem.catalog import get_model

    return dict(get_model("gpt2-xl").config)


def job(i: int) -> tuple[str, str, dict[str, Any] | None, int]:
    """The i-th request: (method, path, JSON body, expected status); mostly estimates, some errors."""
    kind = i % 10
    if kind == 0:
        return "GET", "/api/models", None, 200
    if kind == 1:
        return "GET", "/api/gpus", None, 200
    if kind == 2:
        return "POST", "/api/fit", {"model": "gpt2-xl", "gpus": ["rtx-4090", "a100-80gb"]}, 200
    if kind == 3:
        return "POST", "/api/train", {"model": "gpt2-xl", "batch": 0}, 422
    if kind == 4:
        return "POST", "/api/train", {"model": "gpt2-xxl"}, 404
    if kind == 5:
        return "POST", "/api/infer", {"model": "gpt2-xl", "batch": 1 + i % 8}, 200
    methods = ("full", "lora", "qlora")
    model = ("gpt2-xl", "llama-3.1-8b", "qwen2.5-0.5b")[i % 3]
    # seq within every model's positions (gpt2-xl has 1,024 learned ones: a longer one is refused)
    body = {"model": model, "batch": 1 + i % 16, "seq": 256 * (1 + i % 4), "method": methods[i % 3],
            "gpus": ["rtx-4090", "h100-sxm"]}  # fmt: skip
    return "POST", "/api/train", body, 200


def send(
    conn: http.client.HTTPConnection, method: str, path: str, body: dict[str, Any] | None
) -> tuple[int, Any]:
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"} if payload is not None else {}
    conn.request(method, path, body=payload, headers=headers)
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def test_240_requests_from_16_clients(server: tuple[str, int]) -> None:
    host, port = server
    from peakmem.catalog import find_model

    for name in ("gpt2-xl", "llama-3.1-8b", "qwen2.5-0.5b"):
        assert find_model(name) is not None, name

    def client(k: int) -> list[str]:
        problems = []
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            for i in range(k, REQUESTS, CLIENTS):
                method, path, body, expected = job(i)
                status, data = send(conn, method, path, body)
                if status != expected:
                    problems.append(f"{method} {path} {body}: {status} {data}")
                elif (
                    path in ("/api/train", "/api/infer") and status == 200 and data["device_total_bytes"] <= 0
                ):
                    problems.append(f"{path} {body}: no total")
        finally:
            conn.close()
        return problems

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        results = list(pool.map(client, range(CLIENTS), timeout=TIME_LIMIT_S))
    elapsed = time.monotonic() - start
    problems = [p for r in results for p in r]
    assert not problems, problems[:5]
    assert elapsed < TIME_LIMIT_S


def test_ten_megabyte_body_is_413(server: tuple[str, int]) -> None:
    host, port = server
    big = b'{"model": "gpt2-xl", "name": "' + b"x" * TEN_MB + b'"}'
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("POST", "/api/train", body=big, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 413
        assert json.loads(resp.read())["field"] == "body"
    finally:
        conn.close()


def test_ten_megabyte_chunked_body_is_413(server: tuple[str, int]) -> None:
    """No Content-Length: the limit is enforced as the body streams in."""
    host, port = server

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "gpt2-xl", "name": "'
        for _ in range(TEN_MB // 65536):
            yield b"x" * 65536
        yield b'"}'

    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        headers = {"content-type": "application/json", "transfer-encoding": "chunked"}
        conn.request("POST", "/api/train", body=chunks(), encode_chunked=True, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 413
        assert json.loads(resp.read())["field"] == "body"
    finally:
        conn.close()


def test_absurd_config_is_422_and_the_server_still_answers(server: tuple[str, int]) -> None:
    host, port = server
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        for change, field in (({"n_embd": 10**9}, "config.n_embd"), ({"n_layer": 10**9}, "config.n_layer"),
                              ({"n_embd": 2**23, "n_head": 2**10}, "config.n_embd")):  # fmt: skip
            status, data = send(conn, "POST", "/api/train", {"config": {**gpt2_xl_config(), **change}})
            assert (status, data["field"]) == (422, field)
        status, data = send(conn, "POST", "/api/train", {"model": "gpt2-xl"})
        assert status == 200 and data["model"]["name"] == "gpt2-xl"
    finally:
        conn.close()
