"""benchmarks/sglang_defaults.json (SGLang 0.5.x ServerArgs logs): the file's integrity, its recorded split,
and the comparison script's reading of a case, checked by hand."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from _bench import load_benchmark

ROOT = Path(__file__).parents[1] / "benchmarks"
FIELDS = {
    "id", "set", "source", "url", "quote", "version", "gpu", "tp", "pp", "dp", "dp_attention",
    "speculative_algorithm", "command_line", "logged",
}  # fmt: skip
QUOTE_MAX = 300  # characters: a quote, not a copy of the thread


def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "sglang_defaults.json").read_text())
    return data


def test_every_case_and_near_miss_is_cited_and_short() -> None:
    data = _data()
    cases = data["cases"]
    assert len({c["id"] for c in cases}) == len(cases)
    for c in cases:
        assert set(c) >= FIELDS, (c["id"], FIELDS - set(c))
        assert re.match(r"0\.5\.\d+", c["version"]), c["id"]
        assert c["url"].startswith("https://github.com/") and 0 < len(c["quote"]) <= QUOTE_MAX
        assert set(c["logged"]) <= {"mem_fraction_static", "cuda_graph_max_bs", "chunked_prefill_size"}
    assert data["searched"] and data["not_compared"]
    for n in data["not_compared"]:
        assert n["url"].startswith("https://github.com/") and n["why"] and 0 < len(n["quote"]) <= QUOTE_MAX


def test_the_split_follows_the_recorded_rule() -> None:
    """Sorted by SHA-256(id), the 1st, 3rd, ... cases are held out, the others fit."""
    data = _data()
    assert re.match(r"Decided \d{4}-\d{2}-\d{2}T\d{2}:\d{2}Z", data["split_rule"])
    ordered = sorted(data["cases"], key=lambda c: hashlib.sha256(c["id"].encode()).hexdigest())
    for position, c in enumerate(ordered):
        assert c["set"] == ("held_out" if position % 2 == 0 else "fit"), c["id"]


def test_the_script_reads_a_case_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    """An H100 (81,559 MiB) at tp 1 with EAGLE3: now 512 + 12,288 + 512 + 128 + 2,048 = 15,488 MiB reserved,
    round(66,071 / 81,559, 3) = 0.81; before h-sglfraction 9.5 + 0.5 + 2 = 12 GiB, round(69,271 / 81,559, 3)
    = 0.849; cuda_graph_max_bs 256."""
    script = load_benchmark("sglang_defaults")
    case = {"id": "x", "set": "fit", "gpu": "h100", "tp": 1, "speculative_algorithm": "EAGLE3",
            "logged": {"mem_fraction_static": 0.81, "cuda_graph_max_bs": 256}}  # fmt: skip
    expected = [("mem_fraction_static", 0.81, 0.849, 0.81), ("cuda_graph_max_bs", 256.0, None, 256.0)]
    assert script.rows(case) == expected
    script.main()
    assert "not compared" in capsys.readouterr().out
