"""The page in a real browser: Playwright driving Debian's chromium (no browser download).

Needs ``/usr/bin/chromium`` (``apt-get install chromium``; or set PEAKMEM_CHROMIUM) and the
playwright package; skipped with the reason when either is missing. Screenshots go to
PEAKMEM_SCREENSHOT_DIR when set (CI keeps them), else to pytest's temporary folder.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

CHROMIUM = os.environ.get("PEAKMEM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
DEFAULT_GPUS = ["rtx-4090", "a100-40gb", "h100-sxm"]  # app.js DEFAULT_GPUS
TIMEOUT_MS = 15_000

if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

from _web_fake import with_band  # noqa: E402
from _web_server import running_server  # noqa: E402
from peakmem.units import fmt_both  # noqa: E402

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running_server() as base:
        yield base


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1400, "height": 1000},
        )  # fmt: skip
        ctx.set_default_timeout(TIMEOUT_MS)
        yield ctx
        ctx.close()


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "console", lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None
    )
    yield page
    page.close()
    assert not problems, problems


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("PEAKMEM_SCREENSHOT_DIR")
    out = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def api(url: str, body: dict[str, Any], endpoint: str = "/api/train") -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}{endpoint}", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def gpt2_xl_config() -> dict[str, Any]:
    from peakmem.catalog import get_model

    return dict(get_model("gpt2-xl").config)


def expect(locator: Any) -> Any:
    return sync_api.expect(locator)


def wait_ready(page: Any, mode: str = "train") -> None:
    """Until the page shows an answer to ``mode`` (the question: train, fit, infer, fit_infer, plan)."""
    page.locator(f"body[data-state=ready][data-mode={mode}]").wait_for(state="attached")


def test_page_reproduces_the_gpt2_xl_answer(page: Any, url: str, shots: Path) -> None:
    expected = api(url, {"model": "gpt2-xl", "gpus": DEFAULT_GPUS})
    page.goto(f"{url}/")
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    expect(page.locator("#answer")).to_have_text(expected["headline"])
    verdicts = page.locator(".verdict")
    expect(verdicts).to_have_count(len(expected["verdicts"]))
    for v in expected["verdicts"]:
        cls = {"fits": "fits", "tight": "tight", "does not fit": "nofit"}[v["verdict"]]  # the CLI's state
        expect(page.locator(f'.verdict[data-gpu="{v["gpu"]}"]')).to_have_class(f"verdict {cls}")
    device = expected["band"]["device_total"]  # the CLI's band, drawn as the page's range line
    low, likely, high = device["low_bytes"], device["likely_bytes"], device["high_bytes"]
    band_line = f"needs ≈ {likely / 1e9:.1f} GB ({low / 1e9:.1f}–{high / 1e9:.1f} GB) on the device"
    expect(page.locator("#band")).to_contain_text(band_line)
    expect(page.locator("#chart svg g.bar")).to_have_count(len(expected["chart"]))
    expect(page.locator("#ways tbody tr")).to_have_count(len(expected["ways_down"]))
    if expected["ways_down_note"]:  # the usual changes that save nothing here, and why
        expect(page.locator("#ways-note")).to_have_text(f"Not listed: {expected['ways_down_note']}.")
    expect(page.locator("#per-param tbody tr")).to_have_count(len(expected["bytes_per_param"]) + 1)
    expect(page.locator("#per-param")).to_contain_text(fmt_both(expected["model_state_bytes"]))
    expect(page.locator("#per-param tr.total")).to_contain_text("16")  # the seed's 16 bytes/param
    expect(page.locator("#breakdown")).to_contain_text(fmt_both(expected["peak_allocated_bytes"]))
    page.locator("#model-list option").first.wait_for(state="attached")
    expect(page.locator("#model-info")).to_contain_text("1,557,611,200")
    page.screenshot(path=str(shots / "page-gpt2-xl.png"), full_page=True)


def test_changing_batch_and_method_updates_the_total(page: Any, url: str) -> None:
    page.goto(f"{url}/?model=gpt2-xl")
    wait_ready(page)
    page.fill("#batch", "4")
    expected = api(url, {"model": "gpt2-xl", "batch": 4, "gpus": DEFAULT_GPUS})
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    page.select_option("#method", "lora")
    expected = api(url, {"model": "gpt2-xl", "batch": 4, "method": "lora", "gpus": DEFAULT_GPUS})
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    page.select_option("#checkpointing", "full")
    page.fill("#seq", "512")
    options = {"batch": 4, "method": "lora", "checkpointing": "full", "seq": 512}
    expected = api(url, {"model": "gpt2-xl", **options, "gpus": DEFAULT_GPUS})
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    shared = page.locator("#share").get_attribute("href")
    for part in ("batch=4", "method=lora", "checkpointing=full", "seq=512"):
        assert part in shared
    # the URL restores the state in a fresh page
    other = page.context.new_page()
    try:
        other.goto(url + shared)
        expect(other.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
        expect(other.locator("#batch")).to_have_value("4")
        expect(other.locator("#method")).to_have_value("lora")
    finally:
        other.close()


def test_gpus_can_be_added_and_removed(page: Any, url: str) -> None:
    page.goto(f"{url}/?model=gpt2-xl&gpus=rtx-4090")
    wait_ready(page)
    expect(page.locator(".verdict")).to_have_count(1)
    page.locator("#gpu-select option[value=h200]").wait_for(state="attached")
    page.select_option("#gpu-select", "h200")
    expect(page.locator(".verdict")).to_have_count(2)
    expect(page.locator('.verdict[data-gpu="h200"]')).to_have_class("verdict fits")
    page.fill("#gpu-size", "12GB")
    page.click("#gpu-size-add")
    expect(page.locator(".verdict")).to_have_count(3)
    expect(page.locator('.verdict[data-gpu="12gb"]')).to_have_class("verdict nofit")
    page.click('.chip[data-gpu="rtx-4090"] button')
    expect(page.locator(".verdict")).to_have_count(2)
    assert "gpus=h200%2C12GB" in page.url


def test_a_pasted_config_works_and_is_shareable(page: Any, url: str) -> None:
    config = gpt2_xl_config()
    expected = api(url, {"config": config, "batch": 2, "gpus": DEFAULT_GPUS})
    page.goto(f"{url}/?batch=2")
    wait_ready(page)
    page.check("input[name=source][value=config]")
    page.fill("#config", json.dumps(config, indent=2))
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    expect(page.locator("#error")).to_be_hidden()
    assert "cfg=" in page.url
    other = page.context.new_page()
    try:
        other.goto(page.url)
        expect(other.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
        assert json.loads(other.locator("#config").input_value()) == config
    finally:
        other.close()


def test_a_bad_config_shows_an_error(page: Any, url: str, shots: Path) -> None:
    page.goto(f"{url}/")
    wait_ready(page)
    page.check("input[name=source][value=config]")
    broken = {k: v for k, v in gpt2_xl_config().items() if k != "vocab_size"}
    page.fill("#config", json.dumps(broken))
    expect(page.locator("#error")).to_be_visible()
    expect(page.locator("#error")).to_contain_text("vocab_size")
    expect(page.locator("#total")).to_have_text("—")
    expect(page.locator("#details")).to_be_hidden()
    page.screenshot(path=str(shots / "page-bad-config.png"))
    page.fill("#config", '{"model_type": "gpt2",')
    expect(page.locator("#error")).to_contain_text("not valid JSON")
    page.fill("#config", json.dumps({**gpt2_xl_config(), "n_embd": 10**9}))
    expect(page.locator("#error")).to_contain_text("n_embd")
    page.fill("#config", json.dumps(gpt2_xl_config()))
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("#total")).not_to_have_text("—")
    expect(page.locator("#details")).to_be_visible()


def test_an_unknown_model_offers_suggestions(page: Any, url: str) -> None:
    page.goto(f"{url}/?model=gpt2-xxl")
    expect(page.locator("#error")).to_contain_text("did you mean")
    page.locator("#error button", has_text="gpt2-xl").first.click()
    expected = api(url, {"model": "gpt2-xl", "gpus": DEFAULT_GPUS})
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))


def test_docs_page_lists_the_endpoints(page: Any, url: str) -> None:
    page.goto(f"{url}/docs")
    posts = ("train", "infer", "fit", "fit_infer", "plan")
    for path in (*(f"POST /api/{p}" for p in posts), "GET /api/models"):
        expect(page.locator(".endpoint h2").get_by_text(path, exact=True)).to_have_count(1)


# --- every question the CLI answers, answered on the page ------------------------------------------
def test_lora_with_rank_and_targets(page: Any, url: str) -> None:
    page.goto(f"{url}/?model=llama-3.2-1b&seq=512")
    wait_ready(page)
    expect(page.locator("#lora_rank")).to_be_hidden()  # adapter fields only with an adapter
    page.select_option("#method", "lora")
    expect(page.locator("#lora_rank")).to_be_visible()
    expect(page.locator("#quant")).to_be_hidden()  # the QLoRA base only with QLoRA
    page.fill("#lora_rank", "16")
    page.fill("#lora_targets", "q_proj,v_proj")
    body = {"model": "llama-3.2-1b", "seq": 512, "method": "lora", "lora_rank": 16,
            "lora_targets": "q_proj,v_proj", "gpus": DEFAULT_GPUS}  # fmt: skip
    expected = api(url, body)
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    expect(page.locator("#answer")).to_have_text(expected["headline"])
    trainable = expected["model"]["trainable_params"]
    assert trainable < expected["model"]["params"] // 100
    expect(page.locator("#per-param")).to_contain_text(f"{trainable:,}")


def test_memory_saving_options_reach_the_answer(page: Any, url: str) -> None:
    """The page's loss, optimizer-in-backward, offload, compile and Liger controls ask what the CLI's
    --loss/--optimizer-in-backward/--activation-offload/--compile/--liger ask, and stay in the URL."""
    page.goto(f"{url}/?model=llama-3.2-1b&seq=1024")
    wait_ready(page)
    page.select_option("#loss", "chunked-compiled")
    page.select_option("#optimizer_in_backward", "true")
    page.select_option("#compile", "true")
    page.select_option("#liger", "true")
    body = {"model": "llama-3.2-1b", "seq": 1024, "loss": "chunked-compiled", "optimizer_in_backward": True,
            "compile": True, "liger": True, "gpus": DEFAULT_GPUS}  # fmt: skip
    expected = api(url, body)
    plain = api(url, {"model": "llama-3.2-1b", "seq": 1024, "gpus": DEFAULT_GPUS})
    assert expected["device_total_bytes"] < plain["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    shared = page.locator("#share").get_attribute("href")
    for part in ("loss=chunked-compiled", "optimizer_in_backward=true", "compile=true", "liger=true"):
        assert part in shared


def test_multi_gpu_answer_is_per_rank(page: Any, url: str) -> None:
    page.goto(f"{url}/?model=llama-3.1-8b&gpus=h100-sxm")
    wait_ready(page)
    expect(page.locator("#ranks-view")).to_be_hidden()
    page.fill("#gpu_count", "8")
    page.select_option("#sharding", "zero-3")
    page.select_option("#offload", "cpu")
    body = {"model": "llama-3.1-8b", "gpu_count": 8, "zero": 3, "offload": "cpu", "gpus": ["h100-sxm"]}
    expected = api(url, body)
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    expect(page.locator("#answer")).to_contain_text("Layout: 8 GPUs")
    expect(page.locator("#ranks tbody tr")).to_have_count(len(expected["ranks"]))
    rank = expected["ranks"][0]
    expect(page.locator("#ranks tbody tr").first).to_contain_text(fmt_both(rank["device_total_bytes"]))
    expect(page.locator("#cpu-line")).to_contain_text(fmt_both(expected["cpu_per_node_bytes"]))
    # tensor and pipeline parallel: one row per kind of rank (first, last stage)
    page.select_option("#sharding", "zero-1")
    page.select_option("#offload", "none")
    page.fill("#tp", "2")
    page.fill("#pp", "2")
    body = {"model": "llama-3.1-8b", "gpu_count": 8, "zero": 1, "tp": 2, "pp": 2, "gpus": ["h100-sxm"]}
    expected = api(url, body)
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    expect(page.locator("#ranks tbody tr")).to_have_count(len(expected["ranks"]))
    assert len(expected["ranks"]) >= 2


def test_inference_with_an_engine(page: Any, url: str) -> None:
    page.goto(f"{url}/?model=llama-3.1-8b&gpus=rtx-4090,h100-sxm")
    wait_ready(page)
    expect(page.locator("#infer-box")).to_be_hidden()
    page.check("input[name=question][value=infer]")
    expect(page.locator("#infer-box")).to_be_visible()
    expect(page.locator("#train-box")).to_be_hidden()
    page.select_option("#engine", "vllm")
    page.fill("#context", "8192")
    page.fill("#infer_batch", "16")
    page.select_option("#kv_cache", "fp8")
    body = {"model": "llama-3.1-8b", "engine": "vllm", "context": 8192, "batch": 16, "kv_cache": "fp8",
            "gpus": ["rtx-4090", "h100-sxm"]}  # fmt: skip
    expected = api(url, body, "/api/infer")
    expect(page.locator("#answer")).to_have_text(expected["headline"])
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    for v in expected["verdicts"]:
        chip = page.locator(f'.verdict[data-gpu="{v["gpu"]}"]')
        expect(chip).to_have_class(f"verdict {'fits' if v['fits'] else 'nofit'}")
        expect(chip).to_contain_text(f"holds {v['max_concurrent']:,} sequences")
    expect(page.locator("#ways-view")).to_be_hidden()
    assert "q=infer" in page.url and "engine=vllm" in page.url
    page.fill("#gpu_memory_utilization", "0.5")  # a smaller pool holds fewer sequences
    expected = api(url, {**body, "gpu_memory_utilization": 0.5}, "/api/infer")
    for v in expected["verdicts"]:
        chip = page.locator(f'.verdict[data-gpu="{v["gpu"]}"]')
        expect(chip).to_contain_text(f"holds {v['max_concurrent']:,} sequences")


def test_litgpt_generate_on_the_page(page: Any, url: str) -> None:
    """The page asks engine litgpt (Lit-GPT's generate, its nf4 weights and release) as the API does."""
    page.goto(f"{url}/?q=infer&model=llama-3.1-8b&gpus=rtx-4090")
    wait_ready(page, "infer")
    page.select_option("#engine", "litgpt")
    page.fill("#weights", "nf4")
    page.fill("#context", "1024")
    page.fill("#infer_batch", "1")
    page.fill("#engine_version", "0.0")
    body = {"model": "llama-3.1-8b", "engine": "litgpt", "weights": "nf4", "context": 1024, "batch": 1,
            "engine_version": "0.0", "gpus": ["rtx-4090"]}  # fmt: skip
    expected = api(url, body, "/api/infer")
    expect(page.locator("#answer")).to_have_text(expected["headline"])
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    assert "engine=litgpt" in page.url


def test_nccl_all_reduce_choice_reaches_the_answer(page: Any, url: str) -> None:
    """8 x H100 SXM (NVLink): vLLM's custom all-reduce runs the graphs' all-reduces; choosing NCCL
    (--disable-custom-all-reduce), or saying the GPUs lack peer-to-peer access (--interconnect), adds what
    NCCL keeps per captured all-reduce, as the API says."""
    page.goto(f"{url}/?model=llama-3.1-8b&gpus=h100-sxm")
    wait_ready(page)
    page.check("input[name=question][value=infer]")
    page.select_option("#engine", "vllm")
    page.fill("#infer_tp", "8")
    body = {"model": "llama-3.1-8b", "engine": "vllm", "tp": 8, "gpus": ["h100-sxm"]}
    custom = api(url, body, "/api/infer")
    expect(page.locator("#total")).to_have_text(fmt_both(custom["device_total_bytes"]))
    page.select_option("#disable_custom_all_reduce", "true")
    nccl = api(url, {**body, "disable_custom_all_reduce": True}, "/api/infer")
    assert nccl["device_total_bytes"] > custom["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(nccl["device_total_bytes"]))
    assert "disable_custom_all_reduce=true" in page.url
    # back to the engine's choice, on GPUs said to be PCIe without P2P: NCCL again, as vLLM's own test says
    page.select_option("#disable_custom_all_reduce", "")
    expect(page.locator("#total")).to_have_text(fmt_both(custom["device_total_bytes"]))
    page.select_option("#interconnect", "pcie-no-p2p")
    said = api(url, {**body, "interconnect": "pcie-no-p2p"}, "/api/infer")
    assert said["cuda_graph_nccl_bytes"] == nccl["cuda_graph_nccl_bytes"] > 0
    expect(page.locator("#total")).to_have_text(fmt_both(said["device_total_bytes"]))
    assert "interconnect=pcie-no-p2p" in page.url


def test_cuda_graph_choices_reach_the_answer(page: Any, url: str) -> None:
    """SGLang on one H100: the largest captured batch and the attention backend change the CUDA-graph
    term as the API says; vLLM's graph mode none leaves no graph term."""
    page.goto(f"{url}/?model=qwen3-8b&gpus=h100-sxm")
    wait_ready(page)
    page.check("input[name=question][value=infer]")
    page.select_option("#engine", "sglang")
    body = {"model": "qwen3-8b", "engine": "sglang", "gpus": ["h100-sxm"]}
    chosen = {**body, "cuda_graph_max_bs": 8, "attention_backend": "triton"}
    said = api(url, chosen, "/api/infer")
    assert said["device_total_bytes"] != api(url, body, "/api/infer")["device_total_bytes"]
    page.fill("#cuda_graph_max_bs", "8")
    page.select_option("#attention_backend", "triton")
    expect(page.locator("#total")).to_have_text(fmt_both(said["device_total_bytes"]))
    assert "cuda_graph_max_bs=8" in page.url and "attention_backend=triton" in page.url
    page.fill("#cuda_graph_max_bs", "")  # SGLang's own options: vLLM refuses them
    page.select_option("#attention_backend", "")
    page.select_option("#engine", "vllm")
    page.select_option("#cudagraph_mode", "none")
    eager = api(url, {**body, "engine": "vllm", "cudagraph_mode": "none"}, "/api/infer")
    assert "cuda_graph_bytes" not in eager and said["cuda_graph_bytes"] > 0
    expect(page.locator("#total")).to_have_text(fmt_both(eager["device_total_bytes"]))


def test_fit_for_training(page: Any, url: str) -> None:
    page.goto(f"{url}/?q=fit&model=gpt2-xl")
    wait_ready(page, "fit")
    expected = api(url, {"model": "gpt2-xl", "gpus": DEFAULT_GPUS}, "/api/fit")
    expect(page.locator("#parallel-box")).to_be_visible()  # the CLI's fit takes the layout, as train does
    expect(page.locator("#fit-table tbody tr")).to_have_count(len(expected["gpus"]))
    for i, row in enumerate(expected["gpus"]):
        tr = page.locator("#fit-table tbody tr").nth(i)
        expect(tr).to_contain_text(row["verdict"])  # the CLI's three-state verdict
        if row["limits"]["largest_micro_batch"]:
            expect(tr).to_contain_text(f"{row['limits']['largest_micro_batch']:,}")
            expect(page.locator(f'.verdict[data-gpu="{row["gpu"]}"]')).to_contain_text(
                f"batch up to {row['limits']['largest_micro_batch']:,}"
            )
        changes = page.locator(f'table.changes[data-gpu="{row["gpu"]}"] tbody tr')
        expect(changes).to_have_count(len(row["candidates"]))
        if row["candidates"]:
            expect(changes.first).to_contain_text(row["candidates"][0]["label"])
        singles = page.locator(f'details.singles table[data-gpu="{row["gpu"]}"] tbody tr')
        expect(singles).to_have_count(0 if row["fits"] else len(row["singles"]))  # "why not X", as the CLI
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    expect(page.locator("#search-space li")).to_have_count(len(expected["search_space"]))


def test_fit_of_a_sharded_job_asks_what_the_api_answers(page: Any, url: str) -> None:
    page.goto(f"{url}/?q=fit&model=llama-3.1-8b&gpu_count=8&sharding=zero-3")
    wait_ready(page, "fit")
    expected = api(
        url, {"model": "llama-3.1-8b", "gpus": DEFAULT_GPUS, "gpu_count": 8, "zero": 3}, "/api/fit"
    )
    train = api(url, {"model": "llama-3.1-8b", "gpus": DEFAULT_GPUS, "gpu_count": 8, "zero": 3})
    assert expected["gpus"][0]["needed_bytes"] == train["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))


def test_fit_for_serving(page: Any, url: str) -> None:
    page.goto(f"{url}/?q=fit_infer&model=llama-3.1-8b&engine=vllm&context=8192&infer_batch=16")
    wait_ready(page, "fit_infer")
    body = {"model": "llama-3.1-8b", "engine": "vllm", "context": 8192, "batch": 16, "gpus": DEFAULT_GPUS}
    expected = api(url, body, "/api/fit_infer")
    expect(page.locator("#fit-table tbody tr")).to_have_count(len(expected["gpus"]))
    for i, row in enumerate(expected["gpus"]):
        tr = page.locator("#fit-table tbody tr").nth(i)
        expect(tr).to_contain_text(f"{row['max_context']:,}")
        expect(tr).to_contain_text("fits" if row["fits"] else "does not fit")
        changes = page.locator(f'table.changes[data-gpu="{row["gpu"]}"] tbody tr')
        expect(changes).to_have_count(len(row["candidates"]))
    expect(page.locator("#total")).to_have_text(fmt_both(expected["estimate"]["device_total_bytes"]))


def test_plan(page: Any, url: str) -> None:
    page.goto(f"{url}/?q=plan&model=llama-3.1-8b&gpus=h100-sxm,rtx-4090&max_gpus=8")
    wait_ready(page, "plan")
    expected = api(url, {"model": "llama-3.1-8b", "gpus": ["h100-sxm"], "max_gpus": 8}, "/api/plan")
    expect(page.locator("#plan-table tbody tr")).to_have_count(len(expected["layouts"]))
    best = expected["layouts"][0]
    expect(page.locator("#answer")).to_contain_text(f"fastest layout {best['layout']}")
    expect(page.locator("#plan-table tbody tr").first).to_contain_text(
        f"{best['needed_bytes'] / 1e9:,.2f} GB"
    )
    expect(page.locator("#plan-fewest")).to_contain_text(expected["fewest_gpus"]["layout"])
    expect(page.locator("#search-space li")).to_have_count(len(expected["search_space"]))
    expect(page.locator("#totals")).to_be_hidden()
    page.fill("#max_gpus", "2")
    expected = api(url, {"model": "llama-3.1-8b", "gpus": ["h100-sxm"], "max_gpus": 2}, "/api/plan")
    expect(page.locator("#plan-table tbody tr")).to_have_count(len(expected["layouts"]))


# --- layout: nothing wider than a phone, nothing clipped on a desktop --------------------------------
VIEWS = {
    "train": ("train", "/?model=gpt2-xl"),
    "qlora": ("train", "/?model=llama-3.1-8b&method=qlora"),
    "ranks": ("train", "/?model=llama-3.1-8b&gpu_count=8&tp=2&pp=2&sharding=zero-1"),
    "infer": ("infer", "/?q=infer&model=llama-3.1-8b&engine=vllm&context=8192&infer_batch=16"),
    "fit": ("fit", "/?q=fit&model=gpt2-xl"),
    "fit_infer": ("fit_infer", "/?q=fit_infer&model=llama-3.1-8b&engine=vllm&context=8192"),
    "plan": ("plan", "/?q=plan&model=llama-3.1-8b&gpus=h100-sxm"),
}

# Visible table boxes whose content is wider than the box (they would scroll: a clipped cell).
OVERFLOWING = """() => [...document.querySelectorAll('.scroll')]
  .filter((s) => s.offsetParent !== null && s.scrollWidth > s.clientWidth + 1)
  .map((s) => `${s.getAttribute('aria-label')}: ${s.scrollWidth} > ${s.clientWidth}`)"""


# Visible form controls and buttons that reach beyond the viewport's width.
OFF_SCREEN = """(width) => [...document.querySelectorAll('#controls :is(input, select, textarea, button)')]
  .filter((e) => e.offsetParent !== null)
  .filter((e) => { const r = e.getBoundingClientRect(); return r.left < 0 || r.right > width; })
  .map((e) => e.id || e.name || e.textContent)"""


def test_no_horizontal_scroll_at_a_phones_width(page: Any, url: str, shots: Path) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    for name, (mode, path) in VIEWS.items():
        page.goto(url + path)
        wait_ready(page, mode)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, (name, width)
        assert page.evaluate(OFF_SCREEN, 390) == [], name  # every control and button is on the screen
        page.screenshot(path=str(shots / f"phone-{name}.png"), full_page=True)
    page.goto(f"{url}/?model=gpt2-xxl")  # an error, too
    expect(page.locator("#error")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.goto(f"{url}/?model=gpt2-xl")  # the answer is below the form: the button brings it into view
    wait_ready(page)
    page.click("#submit")
    page.locator("body[data-trigger=submit][data-state=ready]").wait_for(state="attached")
    expect(page.locator("#answer")).to_be_in_viewport()


def test_no_clipped_table_at_a_desktops_width(page: Any, url: str) -> None:
    page.set_viewport_size({"width": 1280, "height": 900})
    for name, (mode, path) in VIEWS.items():
        page.goto(url + path)
        wait_ready(page, mode)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280, name
        assert page.evaluate(OVERFLOWING) == [], name
    page.goto(f"{url}/?model=gpt2-xl")
    wait_ready(page)
    share = page.locator("#breakdown thead th").last
    expect(share).to_have_text("share")
    box = page.locator("#breakdown").locator("xpath=..").bounding_box()
    cell = share.bounding_box()
    assert box is not None and cell is not None
    assert cell["x"] + cell["width"] <= box["x"] + box["width"] + 0.5


def cli_markdown(*argv: str) -> str:
    from peakmem.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--markdown"]) == 0
    return out.getvalue()


def test_model_states_total_is_the_clis_for_qlora(page: Any, url: str) -> None:
    """QLoRA Llama-3.1-8B: the rows cover 8 B frozen and 21 M trainable parameters; the total is the
    CLI's 0.7519 bytes/param (model-state bytes over all parameters), not the rows' sum (16.71)."""
    markdown = cli_markdown("train", "llama-3.1-8b", "--method", "qlora")
    row = next(line for line in markdown.splitlines() if line.startswith("| **Model states**"))
    cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
    per_param, total = cells[2], cells[3]
    assert per_param == "0.7519"
    page.goto(f"{url}/?model=llama-3.1-8b&method=qlora")
    wait_ready(page)
    total_row = page.locator("#per-param tr.total")
    expect(total_row.locator("td").nth(1)).to_have_text(per_param)
    expect(total_row.locator("td").nth(3)).to_have_text(total)


def test_release_and_framework_choices_reach_the_answer(page: Any, url: str) -> None:
    """QLoRA under torchtune with torchao 0.1 (whole weights quantized at load), Lit-GPT's model code, and
    vLLM's model runner: each gives the total /api/train or /api/infer gives for the same job."""
    page.goto(f"{url}/?model=llama-3.1-8b&method=qlora&seq=256")
    wait_ready(page)
    page.select_option("#framework", "torchtune")
    page.fill("#torchao", "0.1")
    gpus = ["rtx-4090", "a100-40gb", "h100-sxm"]
    body = {"model": "llama-3.1-8b", "method": "qlora", "seq": 256, "gpus": gpus}
    old = api(url, {**body, "framework": "torchtune", "torchao": "0.1"}, "/api/train")
    new = api(url, {**body, "framework": "torchtune"}, "/api/train")
    assert old["device_total_bytes"] > new["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(old["device_total_bytes"]))
    page.fill("#torchao", "")
    page.select_option("#framework", "litgpt")
    lit = api(url, {**body, "framework": "litgpt"}, "/api/train")
    expect(page.locator("#total")).to_have_text(fmt_both(lit["device_total_bytes"]))
    assert "framework=litgpt" in page.url
    # transformers 4.48's loss copies the shifted logits (transformers_versions); peft's kbit preparation
    page.select_option("#framework", "hf")
    page.fill("#transformers", "4.48.1")
    page.select_option("#kbit_prep", "peft")
    hf = {**body, "framework": "hf"}
    prepared = api(url, {**hf, "transformers": "4.48.1", "kbit_prep": "peft"}, "/api/train")
    assert prepared["device_total_bytes"] != api(url, hf, "/api/train")["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(prepared["device_total_bytes"]))
    page.select_option("#kbit_prep", "axolotl")  # axolotl's loader: norms, embeddings, head back to 16-bit
    axo = api(url, {**hf, "transformers": "4.48.1", "kbit_prep": "axolotl"}, "/api/train")
    assert axo["device_total_bytes"] != prepared["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(axo["device_total_bytes"]))
    page.goto(f"{url}/?model=llama-3.1-8b&gpus=rtx-4090")
    wait_ready(page)
    page.check("input[name=question][value=infer]")
    page.select_option("#engine", "vllm")
    page.select_option("#model_runner", "v1")
    said = api(url, {"model": "llama-3.1-8b", "engine": "vllm", "model_runner": "v1", "gpus": ["rtx-4090"]},
               "/api/infer")  # fmt: skip
    assert said["vllm_model_runner"] == "v1"
    expect(page.locator("#total")).to_have_text(fmt_both(said["device_total_bytes"]))


# --- keyboard and screen reader ---------------------------------------------------------------------
def test_keyboard_only_flow_submits(page: Any, url: str) -> None:
    page.goto(f"{url}/")
    wait_ready(page)
    seen: list[str] = []
    for _ in range(40):  # Tab through the form, in document order, to the micro-batch field
        page.keyboard.press("Tab")
        focused = page.evaluate("document.activeElement.id || document.activeElement.name || ''")
        seen.append(focused)
        if focused == "batch":
            break
    assert seen[-1] == "batch", seen
    assert seen.index("question") < seen.index("model") < seen.index("method") < seen.index("batch")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none"), outline  # focus is visible
    page.keyboard.press("Control+A")
    page.keyboard.type("4")
    page.keyboard.press("Enter")
    page.locator("body[data-trigger=submit]").wait_for(state="attached")
    wait_ready(page)
    expected = api(url, {"model": "gpt2-xl", "batch": 4, "gpus": DEFAULT_GPUS})
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    # arrow keys move between the questions; the answer follows
    page.focus("input[name=question][value=train]")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    wait_ready(page, "infer")
    expect(page.locator("input[name=question][value=infer]")).to_be_checked()


# Form controls without a label element or an aria-label.
UNLABELLED = """() => [...document.querySelectorAll('#controls :is(input, select, textarea)')]
  .filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
  .map((e) => e.id || e.name)"""


def test_controls_are_labelled_and_results_announced(page: Any, url: str) -> None:
    page.goto(f"{url}/?q=fit&method=qlora")
    wait_ready(page, "fit")
    unlabelled = page.evaluate(UNLABELLED)
    assert unlabelled == []
    for label in (
        "micro-batch",
        "sequence length",
        "LoRA rank",
        "QLoRA base",
        "model name",
        "or a memory size",
    ):
        expect(page.get_by_label(label, exact=True)).to_be_visible()
    expect(page.locator("#summary")).to_have_attribute("aria-live", "polite")
    expect(page.locator("#error")).to_have_attribute("role", "alert")
    headers = page.locator("#result thead th")
    assert headers.count() > 10
    assert page.locator("#result thead th:not([scope=col])").count() == 0
    assert page.locator("#result tbody th:not([scope=row])").count() == 0
    for region in page.locator("#result .scroll").all():  # a table that scrolls is reachable by keyboard
        assert region.get_attribute("tabindex") == "0" and region.get_attribute("aria-label")


# --- the band and the three-state verdict, fed by the fake (tests/_web_fake.py) ----------------------
def test_band_and_tight_verdict_are_drawn_when_the_json_has_them(page: Any, url: str, shots: Path) -> None:
    def banded(route: Any) -> None:
        route.fulfill(json=with_band(route.fetch().json()))

    page.route("**/api/train", banded)
    page.route("**/api/fit", banded)
    gpus = [
        "rtx-4090",
        "35GB",
        "h100-sxm",
    ]  # gpt2-xl needs 34.17 GB (high end 36.2 GB): 35 GB is within its band
    page.goto(f"{url}/?model=gpt2-xl&gpus={','.join(gpus)}")
    wait_ready(page)
    plain = api(url, {"model": "gpt2-xl", "gpus": gpus})
    expected = with_band(plain)
    device = expected["band"]["device_total"]
    low, likely, high = device["low_bytes"], device["likely_bytes"], device["high_bytes"]
    text = f"needs ≈ {likely / 1e9:.1f} GB ({low / 1e9:.1f}–{high / 1e9:.1f} GB) on the device"
    expect(page.locator("#band")).to_contain_text(text)
    states = {v["gpu"]: v["verdict"] for v in expected["verdicts"]}
    assert sorted(states.values()) == ["does not fit", "fits", "tight"]
    for gpu, state in states.items():
        chip = page.locator(f'.verdict[data-gpu="{gpu}"]')
        expect(chip).to_have_attribute("data-verdict", state)
        expect(chip).to_contain_text(state)
    tight = page.locator(".verdict.tight")
    expect(tight).to_have_count(1)
    assert tight.evaluate("(e) => getComputedStyle(e).borderStyle") == "dashed"  # styled apart
    expect(page.locator("#band-terms tbody tr")).to_have_count(len(expected["band"]["terms"]))
    page.screenshot(path=str(shots / "page-band.png"))
    # fit rows carry the verdict too
    page.check("input[name=question][value=fit]")
    wait_ready(page, "fit")
    expect(page.locator("#fit-table tr.tight")).to_have_count(1)
    expect(page.locator("#band")).to_be_visible()


def test_long_context_options_reach_the_answer(page: Any, url: str) -> None:
    """The page's Ulysses, tiled MLP and token-budget controls ask what the CLI's --ulysses, --tiled-mlp
    and --max-tokens-per-gpu ask (issue 31: each flag on the page), and stay in the URL."""
    page.goto(f"{url}/?model=llama-3.1-8b&seq=32768&gpus=h100-sxm")
    wait_ready(page)
    page.fill("#gpu_count", "8")
    page.select_option("#sharding", "zero-3")
    page.fill("#ulysses", "8")
    page.select_option("#tiled_mlp", "true")
    body = {"model": "llama-3.1-8b", "seq": 32768, "gpu_count": 8, "zero": 3, "ulysses": 8, "tiled_mlp": True,
            "gpus": ["h100-sxm"]}  # fmt: skip
    expected = api(url, body)
    plain = api(url, {**body, "ulysses": 1, "tiled_mlp": False})
    assert expected["device_total_bytes"] < plain["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    shared = page.locator("#share").get_attribute("href")
    assert "ulysses=8" in shared and "tiled_mlp=true" in shared


def test_a_ppo_job_with_a_chosen_critic(page: Any, url: str) -> None:
    """The page's objective ppo and its critic box ask what --objective ppo --critic asks, in the URL too."""
    page.goto(f"{url}/?model=qwen2.5-0.5b&seq=1024")
    wait_ready(page)
    page.select_option("#objective", "ppo")
    page.fill("#critic", "qwen2.5-7b")
    expected = api(url, {"model": "qwen2.5-0.5b", "seq": 1024, "objective": "ppo", "critic": "qwen2.5-7b"})
    own = api(url, {"model": "qwen2.5-0.5b", "seq": 1024, "objective": "ppo"})
    assert expected["device_total_bytes"] > own["device_total_bytes"]  # a 7B critic beside a 0.5B actor
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    assert "critic=qwen2.5-7b" in (page.locator("#share").get_attribute("href") or "")


def test_lora_target_parameters_and_the_peft_release_reach_the_answer(page: Any, url: str) -> None:
    """LoRA on the fused experts (peft target_parameters) and the peft release whose ParamWrapper runs: the
    page's total equals /api/train's for the same job, and each choice changes it."""
    page.goto(f"{url}/?model=mixtral-8x7b&method=lora&seq=256")
    wait_ready(page)
    gpus = ["rtx-4090", "a100-40gb", "h100-sxm"]
    body = {"model": "mixtral-8x7b", "method": "lora", "seq": 256, "gpus": gpus}
    plain = api(url, body, "/api/train")
    page.fill("#lora_target_parameters", "experts")
    experts = api(url, {**body, "lora_target_parameters": "experts"}, "/api/train")
    assert experts["device_total_bytes"] > plain["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(experts["device_total_bytes"]))
    page.fill("#peft", "0.17.0")  # a full-size delta in the adapters' dtype before the factors' baddbmm
    old = api(url, {**body, "lora_target_parameters": "experts", "peft": "0.17.0"}, "/api/train")
    assert old["device_total_bytes"] > experts["device_total_bytes"]
    expect(page.locator("#total")).to_have_text(fmt_both(old["device_total_bytes"]))
    assert "lora_target_parameters=experts" in page.url and "peft=0.17.0" in page.url
