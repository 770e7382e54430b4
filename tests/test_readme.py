"""README.md's printed answers equal what peakmem prints now (benchmarks/readme_answers.py; `make readme`
rewrites them)."""

from __future__ import annotations

from types import ModuleType

from _bench import load_benchmark


def _load() -> ModuleType:
    return load_benchmark("readme_answers", "_readme_answers")


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
