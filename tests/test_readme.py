"""README.md's printed answers equal what peakmem prints now (benchmarks/readme_answers.py; `make readme`
rewrites them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_readme_answers", BENCH / "readme_answers.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_readme_answers"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_readme_answers_match_what_peakmem_prints() -> None:
    r = _load()
    found = r.answers(r.README.read_text(encoding="utf-8"))
    assert any(a.source.startswith("$ peakmem train gpt2-xl") for a in found)  # the seed's answer is found
    assert any(a.source.startswith("v.fits") for a in found)  # and the Python API's
    stale = [d for a in found for d in r.differences(a)]
    assert not stale, "README.md is stale; `make readme` rewrites it:\n" + "\n".join(stale)


def test_write_replaces_only_the_answers() -> None:
    r = _load()
    text = "\n".join([
        "prose (1, 2)",
        "```python",
        "x = (1, 2)",
        "x  # (1, 3): the tuple, prose kept",
        "open('f')  # 'not run': names other than peakmem and the block's are not evaluated",
        "```",
        "```text",
        "$ peakmem gpus",
        "stale first line",
        "... the rest",
        "```",
        "",
    ])  # fmt: skip
    found = r.answers(text)
    assert [a.source for a in found] == ["x", "$ peakmem gpus"]
    out = r.rewrite(text, found).split("\n")
    assert out[3] == "x  # (1, 2): the tuple, prose kept"
    assert out[8] == r.cli_output(["gpus"])[0] and out[9] == "... the rest"
    assert [line for n, line in enumerate(out) if n not in (3, 8)] == [
        line for n, line in enumerate(text.split("\n")) if n not in (3, 8)
    ]
    assert r.rewrite(r.rewrite(text, found), r.answers(r.rewrite(text, found))) == r.rewrite(text, found)
