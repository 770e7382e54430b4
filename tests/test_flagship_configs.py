"""This year's flagships whose model_type the formulas (peakmem.hf) do not know, stored as data.

Each ``src/peakmem/catalog/configs/<name>.json`` holds a model's real ``config.json`` (``config``) and
where it was read (``source``). The plain tests check the files are complete and their names do not
clash with the catalog; the torch tests build each with transformers on the meta device (the class its
``architectures`` names) and check the count against the model card's rounded figure, and pin the exact
count transformers gives (the number the derived path must reproduce).
"""

from __future__ import annotations

import json
import os
import warnings
from importlib import resources
from typing import Any

import pytest

from peakmem.catalog import MODELS
from peakmem.hf import SUPPORTED_MODEL_TYPES
from tiny_models import needs_timm

KEYS = {"name", "family", "hub_id", "aliases", "source", "reported_params", "reported_params_text", "note",
        "config"}  # fmt: skip


def _entries() -> list[dict[str, Any]]:
    folder = resources.files("peakmem.catalog") / "configs"
    return [
        json.loads(f.read_text(encoding="utf-8"))
        for f in sorted(folder.iterdir(), key=lambda f: f.name)
        if f.name.endswith(".json")
    ]


ENTRIES = _entries()

# Exact counts of transformers 5.23's model built from each config on the meta device
# (sum(p.numel() for p in model.parameters()), tied weights once).
EXACT: dict[str, int] = {
    "command-r7b": 8_028_033_024,
    "deepseek-v3.2": 671_877_929_216,
    "falcon-h1-34b": 33_642_516_224,
    "falcon-h1-7b": 7_585_654_880,
    "gemma-3n-e4b": 7_818_517_072,
    "gemma-4-26b-a4b": 25_805_933_872,
    "glm-4.5-air": 106_852_245_504,
    "glm-4.7": 352_797_814_784,
    "gpt-oss-120b": 116_829_156_672,
    "gpt-oss-20b": 20_914_757_184,
    "granite-3.1-8b": 8_170_848_256,
    "granite-3.3-8b": 8_170_864_640,
    "granite-4.0-h-small": 32_207_337_984,
    "kimi-k2": 1_026_408_209_408,
    "llama-4-maverick": 401_583_781_376,
    "llama-4-scout": 108_641_793_536,
    "olmo-3-7b": 7_298_011_136,
    "olmo-3.1-32b": 32_233_522_176,
    "olmoe-1b-7b-0924": 6_919_161_856,
    "phi-2": 2_779_683_840,
    "qwen2.5-vl-7b": 8_292_166_656,
    "qwen3-next-80b-a3b": 79_674_391_296,
    "qwen3-vl-8b": 8_767_123_696,
    "qwen3.5-27b": 27_356_728_560,
    "qwen3.5-397b-a17b": 396_802_360_816,
    "smollm3-3b": 3_075_098_624,
    "starcoder": 15_517_456_384,
}


def test_there_are_flagship_files() -> None:
    assert {e["name"] for e in ENTRIES} == set(EXACT)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_entry_is_complete(entry: dict[str, Any]) -> None:
    assert set(entry) == KEYS
    assert entry["name"] == entry["name"].lower()
    assert entry["source"].startswith("https://huggingface.co/" + entry["hub_id"])
    config = entry["config"]
    assert isinstance(config["model_type"], str) and config["architectures"]
    # whole files: mostly types the formulas do not know (answered by the shipped derived data); kimi_k2
    # is read by the formulas as DeepSeek-V3 (peakmem.hf), and is kept whole like the others
    assert config["model_type"] not in SUPPORTED_MODEL_TYPES or config["model_type"] == "kimi_k2"
    if entry["reported_params"] is not None:
        assert entry["reported_params_text"] and entry["note"]


def test_names_do_not_clash_with_the_catalog() -> None:
    files = {e["name"] for e in ENTRIES}  # the catalog lists these files' entries too
    taken = {a.lower() for m in MODELS if m.name not in files for a in m.names}
    seen: set[str] = set()
    for entry in ENTRIES:
        for alias in (entry["name"], entry["hub_id"], *entry["aliases"]):
            key = alias.lower()
            assert key not in taken, alias
            assert key not in seen, alias
            seen.add(key)


_SCALE = {"B": 9, "T": 12}


def _rounding_unit(text: str) -> float:
    """One unit of the last digit the card states: '2.7B' -> 0.1e9, '117B' -> 1e9, '1T' -> 1e12."""
    number, suffix = text[:-1], text[-1]
    if "." in number:
        return 10.0 ** (_SCALE[suffix] - len(number.split(".")[1]))
    zeros = len(number) - len(number.rstrip("0"))  # '400B' states one digit: within 100B
    return 10.0 ** (_SCALE[suffix] + zeros)


def test_rounding_unit() -> None:
    assert _rounding_unit("2.7B") == 1e8
    assert _rounding_unit("117B") == 1e9
    assert _rounding_unit("15.5B") == 1e8
    assert _rounding_unit("1T") == 1e12
    assert _rounding_unit("400B") == 1e11
    assert _rounding_unit("80B") == 1e10


def _build(config: dict[str, Any]) -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if needs_timm(config):
        pytest.importorskip("timm")

    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "auto_map")}
    cls = getattr(transformers, config["architectures"][0], None) or transformers.AutoModelForCausalLM
    if config["model_type"] in CONFIG_MAPPING_NAMES:
        hf = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    else:  # a remote-code type (kimi_k2): the config class of the architecture the file names
        hf = cls.config_class(**kwargs)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        if cls is transformers.AutoModelForCausalLM:
            return cls.from_config(hf)
        return cls(hf)


@pytest.mark.torch
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_transformers_builds_it_with_the_cards_count(entry: dict[str, Any]) -> None:
    model = _build(entry["config"])
    assert type(model).__name__ == entry["config"]["architectures"][0]
    params = sum(p.numel() for p in model.parameters())
    assert params == EXACT[entry["name"]]
    if entry["reported_params"] is not None:
        # the card rounds (or truncates) to the digits it states: within one unit of the last one
        assert abs(params - entry["reported_params"]) < _rounding_unit(entry["reported_params_text"])


DERIVED = [e for e in ENTRIES if e["config"]["model_type"] not in SUPPORTED_MODEL_TYPES]


@pytest.mark.parametrize("entry", DERIVED, ids=lambda e: e["name"])
def test_flagship_answers_without_torch_with_the_exact_count(entry: dict[str, Any], tmp_path: Any) -> None:
    """The shipped derived data (benchmarks/derive_catalog.py) answers each flagship the formulas do
    not know with the count transformers gives, in a process that never imports torch."""
    import subprocess
    import sys

    code = (
        "import sys; from peakmem.resolve import resolve_model; "
        f"s = resolve_model({entry['name']!r}); "
        "assert 'torch' not in sys.modules, 'imported torch'; print(s.params)"
    )
    env = {**os.environ, "PEAKMEM_DERIVED_CACHE": str(tmp_path / "empty-cache")}  # shipped data only
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) == EXACT[entry["name"]]
