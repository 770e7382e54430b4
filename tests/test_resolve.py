"""The MODEL and GPU argument resolvers: catalog, local config, Hub id (no network), sizes."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from peakmem import hub
from peakmem.catalog import get_model
from peakmem.errors import EXIT_INPUT_ERROR, EXIT_UNKNOWN_NAME, ConfigError, InputError, UnknownNameError
from peakmem.resolve import gpu_of_size, is_hub_id, resolve_gpu, resolve_gpus, resolve_model

GB = 1000**3
GiB = 1024**3

# A tiny GPT-2 (hand count: wte 100x8 + wpe 16x8 + 2 x block(2 LN 32 + c_attn 8x24+24 + c_proj 8x8+8
# + c_fc 8x32+32 + c_proj 32x8+8 = 32+216+72+288+264 = 872) + ln_f 16 = 800+128+1744+16 = 2688).
TINY_GPT2 = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 100, "n_positions": 16,
    "n_embd": 8, "n_head": 2, "n_layer": 2,
}  # fmt: skip
TINY_GPT2_PARAMS = 2688


# --- catalog --------------------------------------------------------------------------------------
def test_catalog_name_resolves_to_its_spec() -> None:
    spec = resolve_model("gpt2-xl")
    assert spec.name == "gpt2-xl"
    assert spec.params == 1_557_611_200


def test_catalog_alias_and_hub_id_resolve_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "fetch_config", _must_not_be_called)
    assert resolve_model("meta-llama/Meta-Llama-3.1-8B").name == "llama-3.1-8b"
    assert resolve_model("Qwen/Qwen3-8B").params == 8_190_735_360


def _must_not_be_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the Hub was asked")


# --- local files --------------------------------------------------------------------------------------
def _write_config(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_folder_holding_a_config(tmp_path: Path) -> None:
    _write_config(tmp_path / "my-gpt", TINY_GPT2)
    spec = resolve_model(str(tmp_path / "my-gpt"))
    assert spec.params == TINY_GPT2_PARAMS
    assert spec.name == "my-gpt"


def test_path_to_a_config_file(tmp_path: Path) -> None:
    path = _write_config(tmp_path / "ckpt", TINY_GPT2)
    assert resolve_model(str(path)).params == TINY_GPT2_PARAMS
    loose = tmp_path / "tiny.json"
    loose.write_text(json.dumps(TINY_GPT2), encoding="utf-8")
    assert resolve_model(str(loose)).name == "tiny"


def test_catalog_config_written_to_disk_gives_the_same_count(tmp_path: Path) -> None:
    entry = get_model("llama-3-8b")
    path = _write_config(tmp_path / "Meta-Llama-3-8B", dict(entry.config))
    assert resolve_model(str(path.parent)).params == 8_030_261_248


def test_relative_owner_name_folder_wins_over_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_config(tmp_path / "acme" / "tiny", TINY_GPT2)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub, "fetch_config", _must_not_be_called)
    assert resolve_model("acme/tiny").params == TINY_GPT2_PARAMS


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"holds no config\.json") as info:
        resolve_model(str(tmp_path))
    assert info.value.exit_code == EXIT_INPUT_ERROR


@pytest.mark.parametrize("arg", ["./missing/config.json", "/no/such/dir/model", "missing.json", "a/b/c"])
def test_missing_path_is_an_input_error(arg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "fetch_config", _must_not_be_called)
    with pytest.raises(ConfigError, match="no such file or folder") as info:
        resolve_model(arg)
    assert info.value.exit_code == EXIT_INPUT_ERROR


def test_bad_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config\.json"):
        resolve_model(str(tmp_path))


def test_empty_model_argument() -> None:
    with pytest.raises(InputError, match="empty"):
        resolve_model("  ")


# --- unknown names ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("arg", "first"), [("gpt2-xxl", "gpt2-xl"), ("lama-3-8b", "llama-3-8b")])
def test_unknown_name_suggests(arg: str, first: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hub, "fetch_config", _must_not_be_called)
    with pytest.raises(UnknownNameError) as info:
        resolve_model(arg)
    assert info.value.exit_code == EXIT_UNKNOWN_NAME
    assert info.value.suggestions[0] == first


@pytest.mark.parametrize(
    ("text", "ok"),
    [("meta-llama/Llama-3.1-8B", True), ("a/b", True), ("gpt2", False), ("a/b/c", False),
     ("a b/c", False), ("/abs", False), ("a/../b", False), ("x/" + "y" * 100, False)],
)  # fmt: skip
def test_is_hub_id(text: str, ok: bool) -> None:
    assert is_hub_id(text) is ok


# --- the Hub, without the network -------------------------------------------------------------------
hf_errors = pytest.importorskip("huggingface_hub.errors")


def _http_module() -> Any:
    return importlib.import_module(hf_errors.Response.__module__.split(".")[0])


def _response(status: int) -> Any:
    http = _http_module()
    return http.Response(
        status, request=http.Request("HEAD", "https://hub.invalid/x/y/resolve/main/config.json")
    )


class _FakeHub:
    """Stand-ins for huggingface_hub's functions: record calls, raise or return what a test sets."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, *, probe_error: Exception | None, path: str = ""
    ) -> None:
        import huggingface_hub

        self.calls: list[str] = []
        self.probe_error = probe_error
        self.path = path
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.download)
        monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", self.probe)

    def download(self, repo_id: str, filename: str, *, revision: str | None = None, **kw: Any) -> str:
        if kw.get("local_files_only"):
            self.calls.append("cache")
            raise hf_errors.LocalEntryNotFoundError("not in the cache")
        self.calls.append("download")
        return self.path

    def probe(self, url: str, **kw: Any) -> Any:
        self.calls.append("probe")
        if self.probe_error is not None:
            raise self.probe_error
        return None


def _offline_errors() -> list[Exception]:
    http = _http_module()
    return [
        http.ConnectError("[Errno -2] Name or service not known"),
        hf_errors.OfflineModeIsEnabled("offline"),
        hf_errors.LocalEntryNotFoundError("no connection and not cached"),
        OSError("network is unreachable"),
    ]


@pytest.mark.parametrize("error", _offline_errors(), ids=lambda e: type(e).__name__)
def test_hub_id_offline_is_one_clear_line(error: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeHub(monkeypatch, probe_error=error)
    with pytest.raises(hub.HubUnavailableError) as info:
        resolve_model("acme/brand-new-model")
    message = str(info.value)
    assert "could not reach the Hugging Face Hub" in message
    assert "'acme/brand-new-model'" in message
    assert "local path to its config.json" in message
    assert "\n" not in message
    assert info.value.exit_code == EXIT_INPUT_ERROR
    assert fake.calls == ["cache", "probe"]  # one HEAD, no retries, no download


def test_gated_repo_asks_for_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeHub(monkeypatch, probe_error=hf_errors.GatedRepoError("gated", response=_response(403)))
    with pytest.raises(hub.HubAccessError, match=r"gated.*HF_TOKEN.*huggingface-cli login"):
        resolve_model("acme/gated-model")


def test_unauthorized_asks_for_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeHub(monkeypatch, probe_error=hf_errors.HfHubHTTPError("forbidden", response=_response(403)))
    with pytest.raises(hub.HubAccessError, match="HF_TOKEN"):
        resolve_model("acme/private-model")


def test_repo_not_found_is_an_unknown_model_with_suggestions(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeHub(monkeypatch, probe_error=hf_errors.RepositoryNotFoundError("404", response=_response(401)))
    with pytest.raises(UnknownNameError) as info:
        resolve_model("meta-llama/Llama-3.1-8B-Instrukt")
    assert info.value.exit_code == EXIT_UNKNOWN_NAME
    assert info.value.suggestions[0] == "llama-3.1-8b"
    assert "no Hub repository" in str(info.value) and "HF_TOKEN" in str(info.value)


def test_repo_without_config_json(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeHub(monkeypatch, probe_error=hf_errors.RemoteEntryNotFoundError("404", response=_response(404)))
    with pytest.raises(ConfigError, match=r"no config\.json"):
        resolve_model("acme/dataset-not-model")


def test_hub_download_builds_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write_config(tmp_path / "snap", TINY_GPT2)
    fake = _FakeHub(monkeypatch, probe_error=None, path=str(path))
    spec = resolve_model("acme/tiny-gpt2")
    assert spec.params == TINY_GPT2_PARAMS
    assert spec.name == "acme/tiny-gpt2"
    assert fake.calls == ["cache", "probe", "download"]


def test_cached_config_needs_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    path = _write_config(tmp_path / "snap", TINY_GPT2)
    calls: list[bool] = []

    def cached(repo_id: str, filename: str, *, revision: str | None = None, **kw: Any) -> str:
        calls.append(bool(kw.get("local_files_only")))
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", cached)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", _must_not_be_called)
    assert resolve_model("acme/tiny-gpt2").params == TINY_GPT2_PARAMS
    assert calls == [True]


def test_without_huggingface_hub_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    with pytest.raises(hub.HubUnavailableError, match=r"peakmem\[hub\].*local path"):
        resolve_model("acme/some-model")


# --- GPUs ---------------------------------------------------------------------------------------------
def test_gpu_by_catalog_name() -> None:
    assert resolve_gpu("4090").name == "rtx-4090"
    assert resolve_gpu(" H100 ").name == "h100-sxm"


@pytest.mark.parametrize(
    ("text", "n_bytes", "name"),
    [
        ("24GB", 24 * GB, "24gb"),
        ("24 GB", 24 * GB, "24gb"),
        ("24GiB", 24 * GiB, "24gib"),
        ("24g", 24 * GB, "24g"),
        ("80 GiB", 80 * GiB, "80gib"),
        ("1.5TB", 1500 * GB, "1.5tb"),
    ],
)
def test_gpu_of_a_plain_size(text: str, n_bytes: int, name: str) -> None:
    gpu = resolve_gpu(text)
    assert gpu.memory_bytes == n_bytes
    assert gpu.name == name
    assert gpu.vendor == "unknown"
    assert gpu.usable_bytes == n_bytes


def test_bare_number_needs_a_unit() -> None:
    with pytest.raises(InputError, match="needs a unit") as info:
        resolve_gpu("24")
    assert info.value.exit_code == EXIT_INPUT_ERROR
    assert "24GiB" in str(info.value)


def test_unknown_gpu_lists_accepted_forms() -> None:
    with pytest.raises(UnknownNameError) as info:
        resolve_gpu("rtx-9090")
    message = str(info.value)
    assert info.value.exit_code == EXIT_UNKNOWN_NAME
    assert "rtx-5090" in info.value.suggestions
    assert "24GB" in message and "24GiB" in message


def test_zero_or_negative_size_is_rejected() -> None:
    with pytest.raises(InputError, match="must be positive"):
        gpu_of_size("0GB")
    with pytest.raises(InputError, match="'-5GB': the size must be positive"):
        resolve_gpu("-5GB")


def test_gpu_list() -> None:
    gpus = resolve_gpus("4090, 24GB,a100")
    assert [g.name for g in gpus] == ["rtx-4090", "24gb", "a100-80gb"]
    with pytest.raises(InputError):
        resolve_gpus(" , ")


def test_resolve_config_returns_a_copy() -> None:
    from peakmem.resolve import resolve_config

    name, config = resolve_config("gpt2")
    assert name == "gpt2" and config["n_layer"] == 12
    config["n_layer"] = 1
    assert get_model("gpt2").config["n_layer"] == 12


# --- bounds (peakmem.validate) --------------------------------------------------------------------------
def test_a_name_too_long_for_the_file_system_is_an_unknown_model() -> None:
    with pytest.raises(UnknownNameError) as info:
        resolve_model("m" * 300)  # ENAMETOOLONG from the path check is "no such file"
    assert len(str(info.value)) < 200


def test_a_model_argument_longer_than_any_path() -> None:
    with pytest.raises(InputError, match="10,000 characters is too long"):
        resolve_model("m" * 10_000)


def test_config_file_bounds_apply_to_paths(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"a":' * 1000 + "1" + "}" * 1000, encoding="utf-8")
    with pytest.raises(ConfigError, match="nested 1000 levels deep"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**TINY_GPT2, "n_layer": "2"}), encoding="utf-8")
    with pytest.raises(ConfigError, match="n_layer='2': must be an integer"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("text", ["1" + "0" * 150 + "GB", "2000000TB"])
def test_gpu_sizes_no_device_holds(text: str) -> None:
    with pytest.raises(InputError, match="too large"):
        resolve_gpu(text)
