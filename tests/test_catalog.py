"""The catalog: models and GPUs as data, exact lookup, suggestions, and sanity of every entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from peakmem import catalog
from peakmem.catalog import GPUS, MODELS, CatalogModel, Gpu, get_gpu, get_model
from peakmem.errors import EXIT_UNKNOWN_NAME, UnknownNameError
from peakmem.hf import SUPPORTED_MODEL_TYPES, spec_from_config

MiB = 1024**2
GiB = 1024**3


# --- sizes of the catalog -------------------------------------------------------------------------
def test_catalog_is_large_enough() -> None:
    assert len(MODELS) >= 40
    assert len(GPUS) >= 25
    assert all(isinstance(m, CatalogModel) for m in MODELS)
    assert all(isinstance(g, Gpu) for g in GPUS)


def test_families_asked_for_are_present() -> None:
    families = {m.family for m in MODELS}
    for family in (
        "gpt2", "pythia", "gpt-neox", "opt", "bloom", "falcon", "llama", "mistral", "mixtral", "qwen2.5",
        "qwen3", "qwen2-moe", "qwen3-moe", "gemma", "gemma2", "gemma3", "phi3", "starcoder2", "olmo",
        "olmo2", "deepseek", "bert",
    ):  # fmt: skip
        assert family in families, family


# --- uniqueness ---------------------------------------------------------------------------------
@pytest.mark.parametrize("entries", [MODELS, GPUS], ids=["models", "gpus"])
def test_names_and_aliases_are_unique_across_entries(entries: tuple[CatalogModel | Gpu, ...]) -> None:
    owner: dict[str, str] = {}
    for entry in entries:
        for alias in set(a.lower() for a in entry.names):
            assert alias not in owner, f"{alias!r} is declared by {owner[alias]!r} and {entry.name!r}"
            owner[alias] = entry.name


@pytest.mark.parametrize("entries", [MODELS, GPUS], ids=["models", "gpus"])
def test_canonical_names_are_lowercase_and_trimmed(entries: tuple[CatalogModel | Gpu, ...]) -> None:
    for entry in entries:
        assert entry.name == entry.name.lower().strip()
        assert " " not in entry.name


# --- model lookup ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("gpt2-xl", "gpt2-xl"),
        ("GPT2-XL", "gpt2-xl"),
        ("openai-community/gpt2-xl", "gpt2-xl"),
        ("  llama-3.1-8b ", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/llama-3.1-8b-instruct", "llama-3.1-8b"),
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("mistral-7b", "mistral-7b-v0.1"),
        ("google-bert/bert-large-uncased", "bert-large-uncased"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        # This year's entries the formulas answer (issue 14).
        ("microsoft/phi-4", "phi-4"),
        ("phi4", "phi-4"),
        ("microsoft/Phi-4-mini-instruct", "phi-4-mini"),
        ("mistralai/Mistral-Small-24B-Instruct-2501", "mistral-small-24b-2501"),
        ("mistral-small-24b", "mistral-small-24b-2501"),
        ("deepseek-ai/DeepSeek-V3.1", "deepseek-v3.1"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
    ],
)
def test_get_model_by_name_alias_and_hub_id(query: str, name: str) -> None:
    assert get_model(query).name == name


def test_lookup_is_exact_not_fuzzy() -> None:
    for near_miss in ("gpt2-x", "llama-3.1-8", "qwen3", "llama"):
        assert catalog.find_model(near_miss) is None
        with pytest.raises(UnknownNameError):
            get_model(near_miss)


@pytest.mark.parametrize(
    ("typo", "first"),
    [
        ("gpt2-xxl", "gpt2-xl"),
        ("lama-3-8b", "llama-3-8b"),
        ("qwen3-9b", "qwen3-8b"),
        ("mixtral-8x7", "mixtral-8x7b"),
    ],
)
def test_unknown_model_suggests_close_canonical_names(typo: str, first: str) -> None:
    with pytest.raises(UnknownNameError) as info:
        get_model(typo)
    error = info.value
    assert error.exit_code == EXIT_UNKNOWN_NAME
    assert error.kind == "model"
    assert error.suggestions[0] == first
    assert len(error.suggestions) == len(set(error.suggestions)) <= 3
    assert all(
        catalog.find_model(s) is not None and catalog.find_model(s).name == s for s in error.suggestions
    )
    assert first in str(error) and "\n" not in str(error)


def test_variant_entry_does_not_claim_the_hub_id() -> None:
    cls2 = get_model("bert-large-uncased-cls2")
    assert cls2.variant_of == "bert-large-uncased"
    assert get_model(cls2.hub_id).name == "bert-large-uncased"


# --- every model entry ------------------------------------------------------------------------------
CONFIG_FILE_NAMES = {
    p.name.removesuffix(".json")
    for p in (Path(__file__).parents[1] / "src" / "peakmem" / "catalog" / "configs").glob("*.json")
}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_model_entry_is_complete(model: CatalogModel) -> None:
    if model.name in CONFIG_FILE_NAMES:  # whole config.json files: the source says where it was read
        assert "huggingface.co" in model.source or model.hub_id in model.source
    else:
        assert model.source == f"https://huggingface.co/{model.hub_id}/blob/main/config.json"
    assert model.family
    config = model.config
    assert isinstance(config["model_type"], str)
    assert isinstance(config["architectures"], list) and config["architectures"]
    assert "vocab_size" in config or "vocab_size" in (config.get("text_config") or {})  # VL: text_config


# catalog/configs/*.json entries: their reported counts are the card's rounding (checked within it by
# tests/test_flagship_configs.py), not exact
FORMULA_MODELS = [
    m for m in MODELS if m.config["model_type"] in SUPPORTED_MODEL_TYPES and m.name not in CONFIG_FILE_NAMES
]


@pytest.mark.parametrize("model", FORMULA_MODELS, ids=lambda m: m.name)
def test_every_model_parses_and_matches_its_reported_count(model: CatalogModel) -> None:
    spec = spec_from_config(model.config, name=model.name)
    assert spec.name == model.name
    assert spec.params > 0
    if model.reported_params is not None:
        assert spec.params == model.reported_params


@pytest.mark.parametrize(
    ("name", "params"),
    [
        # Counts of transformers' own models (the hf helper's meta-device checks and model cards).
        ("gpt2-xl", 1_557_611_200),
        ("llama-2-7b", 6_738_415_616),
        ("llama-3-8b", 8_030_261_248),
        ("mixtral-8x7b", 46_702_792_704),
        ("llama-3.1-405b", 405_853_388_800),
        # Validation set: HF "Model training anatomy" (bert-large-uncased, 2-label classifier) and
        # the Qwen3 speed benchmark.
        ("bert-large-uncased-cls2", 335_143_938),
        ("qwen3-0.6b", 596_049_920),
        ("qwen3-30b-a3b", 30_532_122_624),
        ("llama-3.2-3b", 3_212_749_824),
        # This year's entries (issue 14): counts of transformers' own model on the meta device.
        ("phi-4", 14_659_507_200),
        ("phi-4-mini", 3_836_021_760),
        ("mistral-small-24b-2501", 23_572_403_200),
        ("deepseek-v3.1", 671_026_404_352),
    ],
)
def test_known_exact_counts(name: str, params: int) -> None:
    assert spec_from_config(get_model(name).config).params == params


def test_sizes_span_100m_to_671b() -> None:
    counts = {m.name: spec_from_config(m.config).params for m in FORMULA_MODELS}
    assert min(counts.values()) < 150_000_000  # gpt2, 124 M
    assert max(counts.values()) > 600_000_000_000  # deepseek-v3, 671 B
    assert 670e9 < counts["deepseek-v3"] < 672e9  # main model only; the 14 B MTP layer is not built


# --- GPU lookup -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "name", "mib"),
    [
        ("h100", "h100-sxm", 81559),
        ("H100-80GB", "h100-sxm", 81559),
        ("NVIDIA H100 80GB HBM3", "h100-sxm", 81559),
        ("a100", "a100-80gb", 81920),
        ("a100-80gb", "a100-80gb", 81920),
        ("a100-40gb", "a100-40gb", 40536),
        ("4090", "rtx-4090", 24564),
        ("rtx-4090", "rtx-4090", 24564),
        ("v100", "v100-16gb", 16160),
        ("h200", "h200", 143771),
        ("h100-nvl", "h100-nvl", 95830),
        ("3090", "rtx-3090", 24576),
        # This year's GPUs (issue 14): the totals nvidia-smi prints.
        ("b200", "b200", 183359),
        ("NVIDIA B200", "b200", 183359),
        ("b300", "b300", 275040),
        ("NVIDIA B300 SXM6 AC", "b300", 275040),
        ("gb200", "gb200", 189471),
        ("NVIDIA GB200", "gb200", 189471),
        ("5090", "rtx-5090", 32607),
        ("rtx-pro-6000", "rtx-pro-6000-blackwell", 97887),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-blackwell", 97887),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-blackwell", 97887),
        ("h20", "h20", 97871),
        ("l40s", "l40s", 46068),
    ],
)
def test_get_gpu_and_exact_driver_bytes(query: str, name: str, mib: int) -> None:
    gpu = get_gpu(query)
    assert gpu.name == name
    assert gpu.memory_bytes == mib * MiB


@pytest.mark.parametrize(
    ("query", "name", "nbytes"),
    [
        ("mi300x", "mi300x", 205822885888),
        ("AMD Instinct MI300X", "mi300x", 205822885888),
        ("mi325x", "mi325x", 256 * GiB),
        ("mi355x", "mi355x", 288 * GiB),
        ("AMD Instinct MI355X", "mi355x", 288 * GiB),
    ],
)
def test_get_amd_gpu_bytes(query: str, name: str, nbytes: int) -> None:
    gpu = get_gpu(query)
    assert gpu.name == name
    assert gpu.memory_bytes == nbytes


def test_this_years_gpus_are_present_with_sources() -> None:
    for name in (
        "b200", "b300", "gb200", "rtx-5090", "rtx-pro-6000-blackwell", "h20", "l40s", "mi300x",
        "mi325x", "mi355x",
    ):  # fmt: skip
        gpu = get_gpu(name)
        assert gpu.source and gpu.memory_source, name
        # a value that is only the marketing size says so
        if "marketing" in gpu.memory_source:
            assert "no published" in gpu.note, name


def test_unknown_gpu_suggests() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_gpu("rtx-4900")
    assert info.value.kind == "gpu"
    assert "rtx-4090" in info.value.suggestions


def test_bare_ambiguous_aliases_say_which_variant_they_pick() -> None:
    for alias in ("a100", "h100", "v100"):
        gpu = get_gpu(alias)
        assert f"'{alias}'" in gpu.note, gpu.name


# --- every GPU entry --------------------------------------------------------------------------------
ARCHITECTURES = {
    "volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "cdna4", "apple",
}  # fmt: skip


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_gpu_entry_is_sensible(gpu: Gpu) -> None:
    assert 8 * GiB <= gpu.memory_bytes <= 300 * GiB
    assert gpu.vendor in ("nvidia", "amd", "apple")
    assert gpu.architecture in ARCHITECTURES
    assert gpu.memory_source and gpu.source and gpu.display_name
    assert gpu.bf16_tflops is not None and 1 < gpu.bf16_tflops < 5000
    assert gpu.bandwidth_gbps is not None and 100 < gpu.bandwidth_gbps < 10000
    if gpu.vendor == "nvidia":
        assert gpu.memory_bytes % MiB == 0  # nvidia-smi reports whole MiB
    assert gpu.usable_bytes <= gpu.memory_bytes


def test_apple_entries_carry_the_gpu_share_of_unified_memory() -> None:
    apple = [g for g in GPUS if g.vendor == "apple"]
    assert {g.name for g in apple} >= {"m2-ultra-192gb", "m3-max-128gb", "m4-max-128gb"}
    for gpu in apple:
        assert gpu.unified_memory
        assert gpu.gpu_usable_fraction == 0.75
        assert "recommendedMaxWorkingSetSize" in gpu.gpu_usable_source
        assert gpu.usable_bytes == gpu.memory_bytes * 3 // 4
    # llama.cpp on an M4 Max 128 GB logs recommendedMaxWorkingSetSize = 103079.22 MB
    assert round(get_gpu("m4-max").usable_bytes / 1e6, 2) == 103079.22


def test_discrete_gpus_have_no_usable_fraction() -> None:
    for gpu in GPUS:
        if gpu.vendor != "apple":
            assert not gpu.unified_memory and gpu.gpu_usable_fraction is None


def test_gpu_rejects_bad_values() -> None:
    from peakmem.errors import InputError

    with pytest.raises(InputError, match="memory_bytes"):
        Gpu(
            name="x",
            display_name="x",
            vendor="nvidia",
            architecture="ampere",
            memory_bytes=0,
            memory_source="",
        )
    with pytest.raises(InputError, match="gpu_usable_fraction"):
        Gpu(
            name="x", display_name="x", vendor="apple", architecture="apple", memory_bytes=GiB,
            memory_source="", gpu_usable_fraction=1.5,
        )  # fmt: skip


# --- import cost ------------------------------------------------------------------------------------
def test_import_is_lazy() -> None:
    code = (
        "import sys, peakmem.catalog\n"
        "assert 'peakmem.catalog.models' not in sys.modules\n"
        "assert 'peakmem.catalog.gpus' not in sys.modules\n"
        "assert 'huggingface_hub' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
