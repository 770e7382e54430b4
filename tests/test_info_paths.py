"""``peakmem info`` says which path answered: formulas, derived, or both (issue 14, item 2).

Text and JSON, the CLI and the Python API (``peakmem.info``) alike. "both" needs a derived answer at
hand: shipped, cached, or derived now by ``--cross-check`` (torch tier); a plain ``info`` stays
torch-free and reads the cache the cross-check wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import peakmem
from peakmem import block_costs
from peakmem.answers import AGREE, answered_by_json, answered_by_line, block_pattern
from peakmem.cli import main
from peakmem.hf import spec_from_config
from peakmem.model import DerivedBlock, LayerGroup
from peakmem.resolve import NO_DERIVED_NOTE, AnsweredBy
from tiny_models import LLAMA

WIDE = {"COLUMNS": "400"}  # rich's width when piped is fixed; the tests read whole lines


@pytest.fixture
def empty_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(block_costs, "_MEMORY", {})
    return tmp_path / "cache"


def _info_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["info", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _info_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["info", *argv]) == 0
    return " ".join(capsys.readouterr().out.split())  # rich wraps long lines: compare words


# --- formulas only ------------------------------------------------------------------------------------
def test_formulas_only(capsys: pytest.CaptureFixture[str], empty_cache: Path) -> None:
    out = _info_json(capsys, "llama-3.1-8b")
    assert out["answered_by"] == {"path": "formulas", "note": NO_DERIVED_NOTE}
    assert out["blocks"] is None and out["block_pattern"] is None
    assert peakmem.info("llama-3.1-8b") == out  # CLI = API
    text = _info_text(capsys, "llama-3.1-8b")
    assert "answered by: formulas (peakmem.hf)" in text
    assert "`peakmem info --cross-check` derives one" in text


# --- derived ------------------------------------------------------------------------------------------
def test_derived_catalog_model_compresses_its_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-Next: 48 layers, full attention every 4th (full_attention_interval 4), all MoE: one line,
    not 48 kinds (shipped data: no torch needed)."""
    out = _info_json(capsys, "qwen3-next-80b-a3b")
    assert out["answered_by"] == {"path": "derived"}
    assert out["block_pattern"] == "12 x [3 x linear_attention+moe, attention+moe]"
    assert peakmem.info("qwen3-next-80b-a3b") == out
    text = _info_text(capsys, "qwen3-next-80b-a3b")
    assert (
        "answered by: derived path (transformers' modules; blocks measured): "
        "12 x [3 x linear_attention+moe, attention+moe]" in text
    )


def _derived_spec(kinds: list[tuple[int, str, str]]):  # type: ignore[no-untyped-def]
    """LLAMA's formula spec with its one group replaced by groups of (count, mixer, ffn) blocks."""
    base = spec_from_config(LLAMA)
    layer = base.groups[0].layer
    groups = tuple(
        LayerGroup(count=n, layer=type(layer)(**{**layer.__dict__, "derived": DerivedBlock(
            key=f"k{i}", mixer=mixer, ffn=ffn, kv_elements_per_token=0)}))
        for i, (n, mixer, ffn) in enumerate(kinds)
    )  # fmt: skip
    return type(base)(**{**base.__dict__, "groups": groups, "derived_from": "0" * 16})


@pytest.mark.parametrize(
    ("kinds", "want"),
    [
        ([(24, "attention", "dense")], "24 x attention+dense"),
        ([(1, "attention", "dense"), (3, "attention", "moe")], "attention+dense, 3 x attention+moe"),
        # Qwen3-Next: the groups of one kind may come split (different keys), the runs merge
        ([(2, "linear_attention", "moe"), (1, "linear_attention", "moe"), (1, "attention", "moe")] * 12,
         "12 x [3 x linear_attention+moe, attention+moe]"),
        # Gemma 3: 5 sliding, 1 global, and a tail of 2 sliding: not periodic as a whole
        ([(5, "sliding_attention", "dense"), (1, "attention", "dense")] * 4
         + [(2, "sliding_attention", "dense")],
         "22 x sliding_attention+dense, 4 x attention+dense (interleaved)"),
        ([(1, "ssm", "none"), (1, "attention", "moe")] * 2, "2 x [ssm, attention+moe]"),
    ],
)  # fmt: skip
def test_block_pattern(kinds: list[tuple[int, str, str]], want: str) -> None:
    assert block_pattern(_derived_spec(kinds)) == want


# --- both ---------------------------------------------------------------------------------------------
def test_both_line_and_json_are_hand_checked() -> None:
    spec = spec_from_config(LLAMA)
    a = AnsweredBy(path="both", params_equal=True, formulas_peak_bytes=1000 * 2**20,
                   derived_peak_bytes=1003 * 2**20, setup="S")  # fmt: skip
    assert a.peak_diff == pytest.approx(0.003)
    assert answered_by_line(a, spec) == (
        "answered by: both (formulas and derived agree within 0.3%: the same parameter count; "
        "peak allocated 1,000.00 MiB vs 1,003.00 MiB on S)"
    )
    assert answered_by_json(a) == {
        "path": "both", "params_equal": True, "formulas_peak_allocated_bytes": 1000 * 2**20,
        "derived_peak_allocated_bytes": 1003 * 2**20, "peak_diff": a.peak_diff, "setup": "S",
    }  # fmt: skip
    far = AnsweredBy(
        path="both", params_equal=True, formulas_peak_bytes=100, derived_peak_bytes=105, setup="S"
    )
    assert "formulas and derived differ by 5.0%" in answered_by_line(far, spec)
    assert AGREE == 0.02
    odd = AnsweredBy(
        path="both", params_equal=False, formulas_peak_bytes=100, derived_peak_bytes=100, setup="S"
    )
    assert "differ by 0.1%: different parameter counts" in answered_by_line(odd, spec)


@pytest.mark.torch
def test_cross_check_then_cached_both(
    capsys: pytest.CaptureFixture[str], empty_cache: Path, tmp_path: Path
) -> None:
    """``--cross-check`` derives the tiny Llama and measures it (torch); the cache it writes lets a
    plain ``info`` answer "both" in a process where torch cannot be imported; CLI = API."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    out = _info_json(capsys, str(folder), "--cross-check")
    got = out["answered_by"]
    assert got["path"] == "both" and got["params_equal"] is True
    assert abs(got["peak_diff"]) <= AGREE
    assert got["setup"] == "peakmem train defaults (full, mixed-bf16, adamw, batch 1 x seq 256)"
    assert peakmem.info(str(folder)) == out  # the cache answers now, without --cross-check
    assert "answered by: both (formulas and derived agree within" in _info_text(capsys, str(folder))
    code = (
        "import sys, json; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "import peakmem; print(json.dumps(peakmem.info(sys.argv[1])['answered_by']))"
    )
    import os

    env = {**os.environ, block_costs.CACHE_ENV: str(empty_cache), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,
                          env=env, timeout=60, check=True)  # fmt: skip
    assert json.loads(proc.stdout) == got


def test_cross_check_without_torch_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, empty_cache: Path
) -> None:
    from peakmem.errors import InputError

    monkeypatch.setattr("peakmem.simulate.deriver", lambda: None)  # as without torch
    with pytest.raises(InputError, match=r"--cross-check: .*pip install 'peakmem\[torch\]'"):
        peakmem.info("llama-3.1-8b", cross_check=True)


def test_forced_paths(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from peakmem import resolve
    from peakmem.errors import ConfigError, InputError

    assert not resolve.spec_for_config(dict(LLAMA), path="formulas").derived_from
    with pytest.raises(InputError, match="path='other'"):
        resolve.spec_for_config(dict(LLAMA), path="other")
    with pytest.raises(ConfigError, match=r"no derived spec shipped or cached"):  # no deriver handed in
        resolve.spec_for_config(dict(LLAMA), path="derived")
