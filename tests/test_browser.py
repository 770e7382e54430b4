"""The page in a real browser: Playwright driving Debian's chromium (no browser download).

Needs ``/usr/bin/chromium`` (``apt-get install chromium``; or set PEAKMEM_CHROMIUM) and the
playwright package; skipped with the reason when either is missing. Screenshots go to
PEAKMEM_SCREENSHOT_DIR when set (CI keeps them), else to pytest's temporary folder.
"""

from __future__ import annotations

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


def wait_ready(page: Any) -> None:
    page.locator("body[data-state]").wait_for(state="attached")  # (wait_for_function would need eval)


def test_page_reproduces_the_gpt2_xl_answer(page: Any, url: str, shots: Path) -> None:
    expected = api(url, {"model": "gpt2-xl", "gpus": DEFAULT_GPUS})
    page.goto(f"{url}/")
    expect(page.locator("#total")).to_have_text(fmt_both(expected["device_total_bytes"]))
    expect(page.locator("#answer")).to_have_text(expected["headline"])
    verdicts = page.locator(".verdict")
    expect(verdicts).to_have_count(len(expected["verdicts"]))
    for v in expected["verdicts"]:
        cls = "fits" if v["fits"] else "nofit"
        expect(page.locator(f'.verdict[data-gpu="{v["gpu"]}"]')).to_have_class(f"verdict {cls}")
    fit = api(url, {"model": "gpt2-xl", "gpus": DEFAULT_GPUS}, "/api/fit")
    assert fit["estimate"] == expected
    for row in fit["gpus"]:
        if row["fits"]:
            expect(page.locator(f'.verdict[data-gpu="{row["gpu"]}"]')).to_contain_text(
                f"batch up to {row['limits']['largest_micro_batch']:,}"
            )
    expect(page.locator("#chart svg g.bar")).to_have_count(len(expected["chart"]))
    expect(page.locator("#ways tbody tr")).to_have_count(len(expected["ways_down"]))
    if expected["ways_down_note"]:  # the usual changes that save nothing here, and why
        expect(page.locator("#ways-note")).to_have_text(f"Not listed: {expected['ways_down_note']}.")
    expect(page.locator("#per-param tbody tr")).to_have_count(len(expected["bytes_per_param"]) + 1)
    expect(page.locator("#per-param")).to_contain_text(fmt_both(expected["model_state_bytes"]))
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
    for path in ("POST /api/train", "POST /api/infer", "POST /api/fit", "POST /api/fit_infer", "POST /api/plan",
                 "GET /api/models"):  # fmt: skip
        expect(page.locator(".endpoint h2").get_by_text(path, exact=True)).to_have_count(1)
