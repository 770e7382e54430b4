"""The JSON API: the same numbers as the CLI's --json, validated input, errors that name the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient

from peakmem.cli import main
from peakmem.options import MAX_BATCH
from peakmem.web import app as web

EXTRA_KEYS = {"headline", "chart"}  # what the API adds to the CLI's --json


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(web.create_app()) as c:
        yield c


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main([*argv, "--json"])
    assert code in (0, 1)
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def gpt2_xl_config() -> dict[str, Any]:
    from peakmem.catalog import get_model

    return dict(get_model("gpt2-xl").config)


@pytest.mark.parametrize(
    ("body", "argv"),
    [
        ({"model": "gpt2-xl"}, ["gpt2-xl"]),
        ({"model": "gpt2-xl", "gpus": ["rtx-4090", "a100-40gb", "24GB"]},
         ["gpt2-xl", "--gpu", "rtx-4090,a100-40gb,24GB"]),
        (
            {"model": "gpt2-xl", "batch": 4, "seq": 512, "grad_accum": 8, "checkpointing": "full",
             "method": "lora", "precision": "amp-bf16", "optimizer": "sgd-momentum", "attention": "eager"},
            ["gpt2-xl", "--batch", "4", "--seq", "512", "--grad-accum", "8", "--checkpointing", "full",
             "--method", "lora", "--precision", "amp-bf16", "--optimizer", "sgd-momentum",
             "--attention", "eager"],
        ),
        ({"model": "llama-3.1-8b", "batch": 2, "gpus": ["h100-sxm"]},
         ["llama-3.1-8b", "--batch", "2", "--gpu", "h100-sxm"]),
        # multi-GPU: ZeRO-3 over 8 ranks, the most loaded rank and its ways down
        ({"model": "llama-3.2-1b", "seq": 512, "gpu_count": 8, "zero": 3, "gpus": ["rtx-4090"]},
         ["llama-3.2-1b", "--seq", "512", "--gpus", "8", "--zero", "3", "--gpu", "rtx-4090"]),
        # LoRA with its own rank and targets, on 2 GPUs with FSDP
        ({"model": "llama-3.2-1b", "seq": 512, "method": "lora", "lora_rank": 16,
          "lora_targets": "q_proj,v_proj", "gpu_count": 2, "fsdp": "full-shard"},
         ["llama-3.2-1b", "--seq", "512", "--method", "lora", "--lora-rank", "16",
          "--lora-targets", "q_proj,v_proj", "--gpus", "2", "--fsdp", "full-shard"]),
        ({"model": "llama-3.2-1b", "seq": 512, "method": "qlora"},
         ["llama-3.2-1b", "--seq", "512", "--method", "qlora"]),
        # QLoRA on bitsandbytes 0.41.1: its 4-bit Linears keep their inputs (peakmem.bnb_versions)
        ({"model": "llama-3.2-1b", "seq": 512, "method": "qlora", "bitsandbytes": "0.41.1"},
         ["llama-3.2-1b", "--seq", "512", "--method", "qlora", "--bitsandbytes", "0.41.1"]),
        # the memory-saving options: torchtune's and Liger's
        ({"model": "llama-3.2-1b", "seq": 1024, "precision": "bf16", "loss": "chunked-compiled",
          "optimizer_in_backward": True, "activation_offload": True, "compile": True,
          "checkpointing": "full"},
         ["llama-3.2-1b", "--seq", "1024", "--precision", "bf16", "--loss", "chunked-compiled",
          "--optimizer-in-backward", "--activation-offload", "--compile", "--checkpointing", "full"]),
        ({"model": "llama-3.2-1b", "seq": 1024, "liger": True}, ["llama-3.2-1b", "--seq", "1024", "--liger"]),
        # a post-training job (peakmem.jobs): GRPO with a vLLM engine colocated, DPO with a LoRA policy
        ({"model": "qwen2.5-0.5b", "seq": 1024, "batch": 8, "objective": "grpo", "beta": 0.04,
          "rollout": "vllm-colocate", "rollout_memory": 0.25, "gpus": ["h100-80gb"]},
         ["qwen2.5-0.5b", "--seq", "1024", "--batch", "8", "--objective", "grpo", "--beta", "0.04",
          "--rollout", "vllm-colocate", "--rollout-memory", "0.25", "--gpu", "h100-80gb"]),
        ({"model": "qwen2.5-0.5b", "seq": 1024, "method": "lora", "objective": "dpo", "completion": 256},
         ["qwen2.5-0.5b", "--seq", "1024", "--method", "lora", "--objective", "dpo", "--completion", "256"]),
        # distillation with a teacher; a DPO job on 8 GPUs under ZeRO-3
        ({"model": "qwen3-0.6b", "seq": 1024, "objective": "distill", "teacher": "qwen3-8b", "beta": 0.5},
         ["qwen3-0.6b", "--seq", "1024", "--objective", "distill", "--teacher", "qwen3-8b", "--beta", "0.5"]),
        # PPO with a critic of another backbone and a KL reference (peakmem.ppo)
        ({"model": "qwen2.5-0.5b", "seq": 1024, "objective": "ppo", "critic": "qwen2.5-7b", "beta": 0.01},
         ["qwen2.5-0.5b", "--seq", "1024", "--objective", "ppo", "--critic", "qwen2.5-7b", "--beta", "0.01"]),
        ({"model": "qwen2.5-0.5b", "seq": 512, "objective": "dpo", "gpu_count": 8, "zero": 3},
         ["qwen2.5-0.5b", "--seq", "512", "--objective", "dpo", "--gpus", "8", "--zero", "3"]),
        # FSDP with gradient accumulation: the loop's gradient sync said on the page
        ({"model": "llama-3.2-1b", "seq": 512, "grad_accum": 4, "gpu_count": 4, "fsdp": "full-shard",
          "grad_sync": "each-micro-batch"},
         ["llama-3.2-1b", "--seq", "512", "--grad-accum", "4", "--gpus", "4", "--fsdp", "full-shard",
          "--grad-sync", "each-micro-batch"]),
    ],
)  # fmt: skip
def test_train_equals_cli_json(
    client: TestClient, capsys: pytest.CaptureFixture[str], body: dict[str, Any], argv: list[str]
) -> None:
    resp = client.post("/api/train", json=body)
    assert resp.status_code == 200, resp.text
    got = resp.json()
    expected = cli_json(capsys, "train", *argv)
    assert set(got) == set(expected) | EXTRA_KEYS
    assert {k: v for k, v in got.items() if k not in EXTRA_KEYS} == expected


def test_headline_is_the_clis_first_line(client: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "gpt2-xl", "--batch", "2", "--markdown"]) == 0
    first_line = capsys.readouterr().out.splitlines()[0]
    got = client.post("/api/train", json={"model": "gpt2-xl", "batch": 2}).json()
    assert got["headline"] == first_line
    assert "gpt2-xl" in first_line


def test_infer_and_sharded_headlines_are_the_clis_first_lines(
    client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    for path, body, argv in (
        ("/api/infer", {"model": "llama-3.1-8b", "context": 8192},
         ["infer", "llama-3.1-8b", "--context", "8192"]),
        ("/api/train", {"model": "llama-3.2-1b", "gpu_count": 8, "zero": 3},
         ["train", "llama-3.2-1b", "--gpus", "8", "--zero", "3"]),
    ):  # fmt: skip
        assert main([*argv, "--markdown"]) == 0
        first_line = capsys.readouterr().out.splitlines()[0]
        assert client.post(path, json=body).json()["headline"] == first_line


def test_chart_bars_add_up_to_each_device_total(client: TestClient) -> None:
    got = client.post("/api/train", json={"model": "gpt2-xl", "batch": 8}).json()
    bars = got["chart"]
    assert bars[0]["label"] == "as asked"
    assert bars[0]["device_total_bytes"] == got["device_total_bytes"]
    assert [b["label"] for b in bars[1:]] == [w["change"] for w in got.get("ways_down", [])]
    assert [b["device_total_bytes"] for b in bars[1:]] == [
        w["device_total_bytes"] for w in got.get("ways_down", [])
    ]
    for bar in bars:
        assert sum(s["bytes"] for s in bar["segments"]) == bar["device_total_bytes"]
    segments = {s["key"]: s["bytes"] for s in bars[0]["segments"]}
    for category, n in got["breakdown"].items():
        assert segments[category] == n


def test_pasted_config_gives_the_catalog_numbers(client: TestClient) -> None:
    by_name = client.post("/api/train", json={"model": "gpt2-xl", "batch": 2}).json()
    pasted = client.post(
        "/api/train", json={"config": gpt2_xl_config(), "name": "my-gpt2", "batch": 2}
    ).json()
    assert pasted["model"]["name"] == "my-gpt2"
    for key in ("device_total_bytes", "peak_allocated_bytes", "breakdown", "bytes_per_param"):
        assert pasted[key] == by_name[key]


def assert_error(resp: Any, status: int, field: str, *needles: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body: dict[str, Any] = resp.json()
    assert body["field"] == field, body
    assert "\n" not in body["error"]
    for needle in needles:
        assert needle in body["error"], body
    assert body["detail"][0]["loc"][0] == "body"
    return body


@pytest.mark.parametrize(
    ("body", "field", "needle"),
    [
        ({"model": "gpt2-xl", "batch": 0}, "batch", "greater than or equal to 1"),
        ({"model": "gpt2-xl", "batch": MAX_BATCH + 1}, "batch", "less than or equal"),
        ({"model": "gpt2-xl", "seq": -5}, "seq", "greater than or equal to 1"),
        ({"model": "gpt2-xl", "batch": "four"}, "batch", "integer"),
        ({"model": "gpt2-xl", "method": "dora"}, "method", "'full', 'lora' or 'qlora'"),
        ({"model": "gpt2-xl", "precision": "fp8"}, "precision", "mixed-bf16"),
        ({"model": "gpt2-xl", "checkpointing": "some"}, "checkpointing", "selective"),
        ({"model": "gpt2-xl", "optimizer": "adamw8"}, "optimizer", "adamw"),
        ({"model": "gpt2-xl", "attention": "paged"}, "attention", "flash"),
        ({"model": "gpt2-xl", "gpus": [""]}, "gpus.0", "at least 1 character"),
        ({"model": "gpt2-xl", "gpus": ["24GB"] * 17}, "gpus", "at most 16"),
        ({"model": "gpt2-xl", "gpus": ["24"]}, "gpus.0", "needs a unit"),
        ({"model": "gpt2-xl", "lr": 3e-4}, "lr", "Extra inputs"),
        ({}, "body", "exactly one of model"),
        ({"model": "gpt2-xl", "config": {"model_type": "gpt2"}}, "body", "exactly one of model"),
        ({"config": "not an object"}, "config", "dictionary"),
    ],
)
def test_bad_input_is_422_naming_the_field(
    client: TestClient, body: dict[str, Any], field: str, needle: str
) -> None:
    assert_error(client.post("/api/train", json=body), 422, field, needle)


def test_invalid_json_is_422(client: TestClient) -> None:
    resp = client.post(
        "/api/train", content=b'{"model": "gpt2-xl",', headers={"content-type": "application/json"}
    )
    assert resp.status_code == 422
    assert "JSON" in resp.json()["error"]


def test_unknown_names_are_404_with_suggestions(client: TestClient) -> None:
    body = assert_error(client.post("/api/train", json={"model": "gpt2-xxl"}), 404, "model", "gpt2-xxl")
    assert "gpt2-xl" in body["suggestions"]
    body = assert_error(
        client.post("/api/train", json={"model": "gpt2-xl", "gpus": ["rtx-4091"]}), 404, "gpus"
    )
    assert "rtx-4090" in body["suggestions"]


def test_server_reads_no_paths(client: TestClient, tmp_path: Any) -> None:
    (tmp_path / "config.json").write_text(json.dumps(gpt2_xl_config()))
    for model in (str(tmp_path / "config.json"), str(tmp_path), "openai-community/not-there"):
        assert client.post("/api/train", json={"model": model}).status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"n_embd": 10**9}, "config.n_embd"),
        ({"n_layer": 10**6}, "config.n_layer"),
        ({"vocab_size": 2**40}, "config.vocab_size"),
        ({"n_embd": 2**23, "n_head": 2**10}, "config.n_embd"),  # wider than any model (2^20)
        ({"n_embd": "1600"}, "config.n_embd"),
        ({"n_layer": 0}, "config.n_layer"),
    ],
)
def test_bad_or_absurd_configs_are_422(client: TestClient, change: dict[str, Any], field: str) -> None:
    config = {**gpt2_xl_config(), **change}
    assert_error(client.post("/api/train", json={"config": config}), 422, field)


def test_config_missing_a_key_names_it(client: TestClient) -> None:
    config = {k: v for k, v in gpt2_xl_config().items() if k != "vocab_size"}
    assert_error(client.post("/api/train", json={"config": config}), 422, "config.vocab_size", "vocab_size")
    assert_error(client.post("/api/train", json={"config": {"hidden_size": 8}}), 422, "config.model_type")


def test_body_over_the_limit_is_413(client: TestClient) -> None:
    big = b'{"model": "gpt2-xl", "name": "' + b"x" * (10 * 1000 * 1000) + b'"}'
    resp = client.post("/api/train", content=big, headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["field"] == "body"


FIT_EXTRA_KEYS = {"headline", "estimate"}  # what /api/fit adds to `peakmem fit --json`
VARYING = {"elapsed_s"}  # wall time of the search: differs between any two runs


@pytest.mark.parametrize(
    ("body", "argv"),
    [
        ({"model": "gpt2-xl", "seq": 1024, "gpus": ["24GB"]}, ["gpt2-xl", "--seq", "1024", "--gpu", "24GB"]),
        ({"model": "gpt2-xl", "gpus": ["rtx-4090", "a100-40gb", "h100-sxm"]},
         ["gpt2-xl", "--gpu", "rtx-4090,a100-40gb,h100-sxm"]),
        ({"model": "llama-3.2-1b", "seq": 512, "method": "lora", "lora_rank": 16, "gpus": ["8GB"]},
         ["llama-3.2-1b", "--seq", "512", "--method", "lora", "--lora-rank", "16", "--gpu", "8GB"]),
    ],
)  # fmt: skip
def test_fit_equals_cli_json(
    client: TestClient, capsys: pytest.CaptureFixture[str], body: dict[str, Any], argv: list[str]
) -> None:
    """/api/fit is `peakmem fit --json` (the planner's one search), plus the page's keys."""
    resp = client.post("/api/fit", json=body)
    assert resp.status_code == 200, resp.text
    got = resp.json()
    expected = cli_json(capsys, "fit", *argv)
    assert set(got) == set(expected) | FIT_EXTRA_KEYS
    assert {k: v for k, v in got.items() if k not in FIT_EXTRA_KEYS | VARYING} == {
        k: v for k, v in expected.items() if k not in VARYING
    }
    train = client.post("/api/train", json={k: v for k, v in body.items()}).json()
    assert got["estimate"] == train and got["headline"] == train["headline"]


@pytest.mark.parametrize(
    ("body", "argv"),
    [
        ({"model": "gpt2-xl", "weights": "bf16", "batch": 4, "gpus": ["rtx-4090"]},
         ["gpt2-xl", "--weights", "bf16", "--batch", "4", "--gpu", "rtx-4090"]),
        ({"model": "llama-3.1-8b", "engine": "vllm", "context": 8192, "batch": 16, "gpus": ["rtx-4090"]},
         ["llama-3.1-8b", "--engine", "vllm", "--context", "8192", "--batch", "16", "--gpu", "rtx-4090"]),
        ({"model": "llama-3.1-8b", "engine": "sglang", "gpu_memory_utilization": 0.8, "gpus": ["h100-sxm"]},
         ["llama-3.1-8b", "--engine", "sglang", "--gpu-memory-utilization", "0.8", "--gpu", "h100-sxm"]),
        ({"model": "llama-3.1-8b", "weights": "awq-4bit", "kv_cache": "fp8", "tp": 2, "context": 4096},
         ["llama-3.1-8b", "--weights", "awq-4bit", "--kv-cache", "fp8", "--tp", "2", "--context", "4096"]),
        ({"model": "llama-3.1-8b", "engine": "vllm", "context": 8192, "gpus": ["a100-80gb"], "max_loras": 4,
          "max_lora_rank": 32, "prefix_tokens": 6000},
         ["llama-3.1-8b", "--engine", "vllm", "--context", "8192", "--gpu", "a100-80gb", "--max-loras", "4",
          "--max-lora-rank", "32", "--prefix-tokens", "6000"]),
        # gpt-oss ships MXFP4 experts: the page prices them from its quantization_config, as the CLI
        ({"model": "gpt-oss-20b", "engine": "vllm", "context": 32768, "gpus": ["h100-sxm"]},
         ["gpt-oss-20b", "--engine", "vllm", "--context", "32768", "--gpu", "h100-sxm"]),
        # a torchao format, typed as the page's datalist offers it
        ({"model": "llama-3.1-8b", "weights": "torchao-int4wo", "context": 4096, "batch": 2},
         ["llama-3.1-8b", "--weights", "torchao-int4wo", "--context", "4096", "--batch", "2"]),
    ],
)  # fmt: skip
def test_infer_equals_cli_json(
    client: TestClient, capsys: pytest.CaptureFixture[str], body: dict[str, Any], argv: list[str]
) -> None:
    resp = client.post("/api/infer", json=body)
    assert resp.status_code == 200, resp.text
    got = resp.json()
    expected = cli_json(capsys, "infer", *argv)
    assert set(got) == set(expected) | EXTRA_KEYS
    assert {k: v for k, v in got.items() if k not in EXTRA_KEYS} == expected


def test_fit_reports_verdicts_and_limits(client: TestClient) -> None:
    from peakmem.catalog import get_gpu

    resp = client.post("/api/fit", json={"model": "gpt2-xl", "gpus": ["rtx-4090", "a100-40gb", "h100-sxm"]})
    assert resp.status_code == 200, resp.text
    got = resp.json()
    total = got["device_total_bytes"]
    assert total == got["estimate"]["device_total_bytes"]
    rows = {r["gpu"]: r for r in got["gpus"]}
    for name, row in rows.items():
        capacity = get_gpu(name).usable_bytes
        assert row["capacity_bytes"] == capacity
        assert row["fits"] == (total <= capacity)
        assert row["headroom_bytes"] == capacity - total
        for change in row["candidates"]:
            assert change["needed_bytes"] <= capacity
        best = row["limits"]["largest_micro_batch"]
        if best:  # the largest batch fits, one more does not
            at = client.post("/api/train", json={"model": "gpt2-xl", "batch": best}).json()
            assert at["device_total_bytes"] <= capacity
            more = client.post("/api/train", json={"model": "gpt2-xl", "batch": best + 1}).json()
            assert more["device_total_bytes"] > capacity
    assert got["fits_any"] == any(r["fits"] for r in rows.values())
    assert_error(client.post("/api/fit", json={"model": "gpt2-xl"}), 422, "gpus")


def test_infer(client: TestClient) -> None:
    resp = client.post(
        "/api/infer", json={"model": "gpt2-xl", "weights": "bf16", "batch": 4, "gpus": ["rtx-4090"]}
    )
    assert resp.status_code == 200, resp.text
    got = resp.json()
    assert got["job"] == "infer"
    assert got["verdicts"][0]["fits"] is True
    assert got["chart"][0]["device_total_bytes"] == got["device_total_bytes"]
    assert_error(
        client.post("/api/infer", json={"model": "gpt2-xl", "weights": "gptq-3bit-g7"}), 422, "weights"
    )
    assert_error(client.post("/api/infer", json={"model": "gpt2-xl", "engine": "tgi"}), 422, "engine")


def test_catalogs_match_the_cli(client: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    models = client.get("/api/models").json()
    assert main(["models", "--json"]) == 0
    cli_models = json.loads(capsys.readouterr().out)
    assert [{k: m[k] for k in cli_models[0]} for m in models] == cli_models
    gpt2_xl = next(m for m in models if m["name"] == "gpt2-xl")
    assert gpt2_xl["params"] == 1_557_611_200
    gpus = client.get("/api/gpus").json()
    assert main(["gpus", "--json"]) == 0
    assert gpus == json.loads(capsys.readouterr().out)


def test_openapi_and_pages(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for path in (
        "/api/train",
        "/api/infer",
        "/api/fit",
        "/api/fit_infer",
        "/api/plan",
        "/api/models",
        "/api/gpus",
    ):
        assert path in schema["paths"]
    train = schema["components"]["schemas"]["TrainRequest"]["properties"]
    assert train["batch"]["minimum"] == 1
    assert set(schema["components"]["schemas"]["Method"]["enum"]) == {"full", "lora", "qlora"}
    for url in ("/", "/docs"):
        page = client.get(url)
        assert page.status_code == 200
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert "http" not in page.text.replace('href="/', "")  # no CDN, no external resource
    for name in ("app.js", "style.css", "docs.js"):
        asset = client.get(f"/static/{name}")
        assert asset.status_code == 200
        assert "https://" not in asset.text and "http://" not in asset.text.replace(
            "http://www.w3.org/2000/svg", ""
        )


def test_field_of() -> None:
    assert web.field_of(ValueError("batch=0: must be positive"), "x") == "batch"
    assert web.field_of(ValueError("--gpu='9': needs a unit"), "x") == "gpu"
    assert web.field_of(
        ValueError("config.json: missing key 'n_embd' (model_type=gpt2)"), "x", "config."
    ) == ("config.n_embd")
    assert web.field_of(ValueError("something else"), "x") == "x"


@pytest.mark.parametrize(
    ("body", "argv"),
    [
        ({"model": "llama-3.1-8b", "engine": "vllm", "context": 8192, "batch": 16,
          "gpus": ["rtx-4090", "h100-sxm"]},
         ["llama-3.1-8b", "--infer", "--engine", "vllm", "--context", "8192", "--batch", "16",
          "--gpu", "rtx-4090,h100-sxm"]),
        ({"model": "qwen3-0.6b", "weights": "awq-4bit", "kv_cache": "fp8", "context": 4096, "gpus": ["8GB"]},
         ["qwen3-0.6b", "--infer", "--weights", "awq-4bit", "--kv-cache", "fp8", "--context", "4096",
          "--gpu", "8GB"]),
    ],
)  # fmt: skip
def test_fit_infer_equals_cli_json(
    client: TestClient, capsys: pytest.CaptureFixture[str], body: dict[str, Any], argv: list[str]
) -> None:
    """/api/fit_infer is `peakmem fit --infer --json`, plus the /api/infer answer as `estimate`."""
    resp = client.post("/api/fit_infer", json=body)
    assert resp.status_code == 200, resp.text
    got = resp.json()
    expected = cli_json(capsys, "fit", *argv)
    assert set(got) == set(expected) | FIT_EXTRA_KEYS
    assert {k: v for k, v in got.items() if k not in FIT_EXTRA_KEYS | VARYING} == {
        k: v for k, v in expected.items() if k not in VARYING
    }
    served = client.post("/api/infer", json=body).json()
    assert got["estimate"] == served and got["headline"] == served["headline"]
    assert_error(client.post("/api/fit_infer", json={**body, "gpus": []}), 422, "gpus")


@pytest.mark.parametrize(
    ("body", "argv"),
    [
        ({"model": "llama-3.1-8b", "gpus": ["h100-sxm"], "max_gpus": 8},
         ["llama-3.1-8b", "--gpu", "h100-sxm", "--max-gpus", "8"]),
        ({"model": "llama-3.2-1b", "gpus": ["24GB"], "max_gpus": 4, "global_batch": 64, "seq": 1024,
          "method": "lora"},
         ["llama-3.2-1b", "--gpu", "24GB", "--max-gpus", "4", "--global-batch", "64", "--seq", "1024",
          "--method", "lora"]),
    ],
)  # fmt: skip
def test_plan_equals_cli_json(
    client: TestClient, capsys: pytest.CaptureFixture[str], body: dict[str, Any], argv: list[str]
) -> None:
    resp = client.post("/api/plan", json=body)
    assert resp.status_code == 200, resp.text
    got = resp.json()
    expected = cli_json(capsys, "plan", *argv)
    assert {k: v for k, v in got.items() if k not in VARYING} == {
        k: v for k, v in expected.items() if k not in VARYING
    }
    assert got["layouts"], "some layout fits"


def test_plan_and_fit_refuse_what_their_command_has_no_option_for(client: TestClient) -> None:
    assert_error(client.post("/api/plan", json={"model": "gpt2", "gpus": ["h100-sxm"]}), 422, "max_gpus")
    two = {"model": "gpt2", "gpus": ["h100-sxm", "a100-80gb"], "max_gpus": 8}
    assert_error(client.post("/api/plan", json=two), 422, "gpus", "at most 1")
    # fit takes the job's layout as train does, and judges its most loaded rank as train reports it
    sharded = {"model": "gpt2", "gpus": ["24GB"], "gpu_count": 8, "zero": 3}
    fit, train = client.post("/api/fit", json=sharded), client.post("/api/train", json=sharded)
    assert fit.status_code == train.status_code == 200, fit.text
    assert fit.json()["gpus"][0]["needed_bytes"] == train.json()["device_total_bytes"]
    assert_error(client.post("/api/train", json={"model": "gpt2", "gpus": ["24GB,40GB"]}), 422, "gpus.0")
    # an error the core finds in a layout names the request's field (gpu_count, the CLI's --gpus)
    bad = {"model": "gpt2", "gpu_count": 6, "tp": 4}
    assert_error(client.post("/api/train", json=bad), 422, "gpu_count", "not divisible")
    huge = {"model": "gpt2", "gpus": ["h100-sxm"], "max_gpus": 8, "global_batch": 2**21}
    assert_error(client.post("/api/plan", json=huge), 422, "global_batch", "less than or equal")


def test_qlora_model_states_per_param_is_the_clis(client: TestClient) -> None:
    """The page's total row: model_state_bytes over the model's parameters (render.states_per_param),
    not the sum of the rows' bytes/param (which cover different parameter sets with adapters)."""
    from peakmem.answers import fmt_per_param

    got = client.post("/api/train", json={"model": "llama-3.1-8b", "method": "qlora"}).json()
    rows = got["bytes_per_param"]
    assert sum(r["total_bytes"] for r in rows) == got["model_state_bytes"]
    per_param = got["model_state_bytes"] / got["model"]["params"]
    assert fmt_per_param(per_param) == "0.7519"  # the CLI's total row: 6.04 GB over 8.03 B parameters
    assert round(sum(r["bytes"] for r in rows), 2) == 16.71  # the wrong total the page used to show


def test_the_host_header_must_name_this_server(capsys: pytest.CaptureFixture[str]) -> None:
    """DNS rebinding (issue 32): `peakmem serve` answers only a Host naming it; 400 says how to serve more."""
    import uvicorn

    from peakmem.web.hosts import ALLOW_HOST_FLAG

    served: dict[str, Any] = {}
    real_run = uvicorn.run
    uvicorn.run = lambda app, **kw: served.update(app=app, **kw)  # type: ignore[assignment]
    try:
        web.serve("127.0.0.1", 8765, allow_hosts=["Box.LAN"])
    finally:
        uvicorn.run = real_run  # type: ignore[assignment]
    assert (served["host"], served["port"]) == ("127.0.0.1", 8765)
    with TestClient(served["app"], base_url="http://127.0.0.1:8765") as c:
        for host in ("127.0.0.1:8765", "127.0.0.1", "localhost:8765", "[::1]:8765", "box.lan"):
            assert c.get("/api/gpus", headers={"host": host}).status_code == 200, host
        for host in ("evil.example:8765", "localhost:9999", "127.0.0.1.evil.example", "[::1", "box.lan:x"):
            got = c.get("/api/gpus", headers={"host": host})
            assert got.status_code == 400 and got.json()["field"] == "host", host
            assert f"peakmem serve {ALLOW_HOST_FLAG} NAME" in got.json()["error"]
        evil = {"host": "evil.example"}
        assert c.post("/api/train", json={"model": "gpt2"}, headers=evil).status_code == 400
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--allow-host NAME" in capsys.readouterr().out
    assert main(["serve", "--allow-host", "evil.example:80"]) == 2
    assert "not a host name" in capsys.readouterr().err
