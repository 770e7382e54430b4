"""The block-cost disk cache is data from disk (issue 32): a tampered, truncated, foreign-version or
hostile file is never believed and never crashes; it is ignored with a note in the answer and its costs
measured again (or refused without torch)."""

from __future__ import annotations

import json
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from peakmem import block_costs, progress
from peakmem.hf import spec_from_config

FAMILY = "fp32|sdpa|cpu|full"
LLAMA: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "max_position_embeddings": 128,
}  # fmt: skip


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path))
    return tmp_path


def _written(cache: Path) -> Path:
    cost = block_costs.BlockCost(saved=block_costs.Fit(per_token=Fraction(3)))
    block_costs._write_cache("abc", FAMILY, {"k": cost})
    return block_costs._cache_file("abc", FAMILY)


def _read_with_notes() -> tuple[Any, list[str]]:
    with progress.collecting() as notes:
        got = block_costs._read_cache("abc", FAMILY)
    return got, notes


def test_a_file_as_written_is_read_back(cache: Path) -> None:
    _written(cache)
    got, notes = _read_with_notes()
    assert got is not None and got["k"].saved.per_token == 3 and notes == []


def _edit(body: dict[str, Any]) -> None:
    body["costs"]["k"]["saved"][0] = "900"  # 300-fold the bytes, digest left as it was


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_edit, "do not match its digest"),
        (lambda b: b.pop("costs_version"), "do not match its digest"),
        (lambda b: b.update(costs_version=block_costs.COSTS_VERSION - 1), "do not match its digest"),
        (lambda b: b.pop("digest"), "not a cache file of this layout"),
    ],
    ids=["tampered", "no-version", "old-version", "no-digest"],
)
def test_an_edited_file_is_ignored_with_a_note(cache: Path, change: Any, why: str) -> None:
    path = _written(cache)
    body = json.loads(path.read_text())
    change(body)
    path.write_text(json.dumps(body))
    got, notes = _read_with_notes()
    assert got is None and len(notes) == 1 and why in notes[0] and path.name in notes[0]


@pytest.mark.parametrize(
    "text",
    ["[]", "null", '"costs"', "[" * 100_000 + "]" * 100_000, '{"format": 3, "costs": ', b"\xff\xfe"],
    ids=["list", "null", "string", "deep", "truncated", "not-utf8"],
)  # fmt: skip
def test_a_hostile_file_is_ignored_not_crashed_on(cache: Path, text: str | bytes) -> None:
    path = _written(cache)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    got, notes = _read_with_notes()
    assert got is None and len(notes) == 1


def test_a_file_that_is_no_regular_file_is_ignored(cache: Path) -> None:
    path = _written(cache)
    path.unlink()
    os.mkfifo(path)
    got, notes = _read_with_notes()
    assert got is None and "not" in notes[0]


def test_a_well_formed_file_with_a_matching_digest_but_huge_numbers_is_ignored(cache: Path) -> None:
    path = _written(cache)
    body = json.loads(path.read_text())
    body.pop("digest")
    body["costs"]["k"]["saved"][0] = "9" * 500
    path.write_text(json.dumps({**body, "digest": block_costs._digest(body)}))
    got, notes = _read_with_notes()
    assert got is None and "digits" in notes[0]


def test_a_cached_spec_outside_a_configs_limits_is_ignored(cache: Path) -> None:
    spec = spec_from_config(LLAMA)
    chash = block_costs.config_hash(LLAMA)
    from dataclasses import replace

    derived = replace(spec, derived_from=chash)
    block_costs.cache_spec(LLAMA, derived)
    assert block_costs.cached_spec(LLAMA) == derived
    path = cache / f"{chash}--spec.json"
    body = json.loads(path.read_text())
    body.pop("digest")
    body["spec"]["groups"][0]["count"] = 10**9  # the digest recomputed: only the limits can tell
    path.write_text(json.dumps({**body, "digest": block_costs._digest(body)}))
    with progress.collecting() as notes:
        assert block_costs.cached_spec(LLAMA) is None
    assert "not a valid spec" in notes[0] and "1000000000" in notes[0]


BASE_FAMILY = "bf16|sdpa|cuda|lora|LoraConfig(rank=8, dropout=0.05, adapter_dtype='base')"
QLORA_FAMILY = "amp-bf16|sdpa|cuda|qlora|(LoraConfig(rank=8, adapter_dtype='base'), None)"


@pytest.mark.parametrize(
    ("family", "revision", "stale"),
    [
        (BASE_FAMILY, 1, None),  # adapter_dtype 'base' costs cached before revision 1 carry none
        (QLORA_FAMILY, 2, 1),  # '|qlora|' 2 (dd2f788's 4-bit stand-in) outranks adapter_dtype 'base''s 1
    ],
)
def test_a_revised_familys_costs_cached_before_the_revision_are_measured_again(
    cache: Path, family: str, revision: int, stale: int | None
) -> None:
    """block_costs.FAMILY_REVISIONS: a family carries the highest revision of the parts it holds; a file of
    that family written before (an older or no revision, a valid digest) is ignored with a note; families
    without a revised part carry none."""
    assert block_costs.family_revision(family) == revision
    cost = block_costs.BlockCost(saved=block_costs.Fit(per_token=Fraction(3)))
    block_costs._write_cache("abc", family, {"k": cost})
    path = block_costs._cache_file("abc", family)
    body = json.loads(path.read_text())
    assert body["revision"] == revision and block_costs._read_cache("abc", family) is not None
    body.pop("digest")
    body.pop("revision")
    if stale is not None:
        body["revision"] = stale
    path.write_text(json.dumps({**body, "digest": block_costs._digest(body)}))
    with progress.collecting() as notes:
        assert block_costs._read_cache("abc", family) is None
    assert len(notes) == 1 and f"revision {stale}, expected {revision}" in notes[0]
    assert "revision" not in json.loads(_written(cache).read_text())  # FAMILY: no revision
