"""A new model's first answer: what peakmem says while it measures (peakmem.progress, on stderr only),
and the libraries' own warnings and log lines, captured instead of printed (peakmem.simulate.quiet)."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

from peakmem import progress


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def stage(self, text: str, total: int) -> None:
        self.events.append(("stage", (text, total)))

    def advance(self, done: int) -> None:
        self.events.append(("advance", done))

    def close(self) -> None:
        self.events.append(("close", None))


def test_stages_reach_the_reporter_installed_and_nothing_is_said_without_one(
    capfd: pytest.CaptureFixture[str],
) -> None:
    progress.stage("nobody listens", 3)
    rec = _Recorder()
    with progress.reporting(rec):
        progress.stage("measuring", 2)
        progress.advance(1)
    assert rec.events == [("stage", ("measuring", 2)), ("advance", 1), ("close", None)]
    assert capfd.readouterr() == ("", "")


def test_notes_stay_with_the_answer_that_collects_them() -> None:
    with progress.collecting() as outer:
        progress.note("a")
        with progress.collecting() as inner:
            progress.note("b")
            progress.note("b")
        progress.note("c")
    assert (outer, inner) == (["a", "c"], ["b"])


def test_library_warnings_and_logs_are_captured_not_printed(capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from peakmem.simulate.quiet import notes_that_matter, quiet_libraries

    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    before = (bnb.handlers[:], logging.getLogger("bitsandbytes").propagate)
    with quiet_libraries() as said:
        bnb.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s", "no kernels")
        logging.getLogger("transformers.modeling_utils").warning(
            "flash attention not supported: falls back to sdpa"
        )
        warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)
    assert capfd.readouterr() == ("", "")
    assert len(said) == 3 and said[0].startswith("bitsandbytes.backends.cpu.ops: Failed to load")
    assert notes_that_matter(said) == [
        "measured with a library fallback: transformers.modeling_utils: flash attention not supported: falls "
        "back to sdpa"
    ]  # only a message saying what runs instead becomes a note; deprecations and import notices do not
    assert (bnb.handlers, logging.getLogger("bitsandbytes").propagate) == before


@pytest.mark.torch
@pytest.mark.slow
def test_a_first_train_says_its_stages_on_stderr_and_prints_no_library_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Piped (stderr not a terminal): one line per stage, each peakmem's own; stdout the JSON alone. The
    fake steps run in forked processes, whose output shares the file descriptors captured here."""
    pytest.importorskip("torch")
    from peakmem import block_costs
    from peakmem.cli import main
    from peakmem.simulate.derive import tiny_config

    monkeypatch.setenv(block_costs.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(block_costs, "_MEMORY", {})
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_config("smollm3")))
    flags = ["--method", "lora", "--precision", "fp32", "--kernels", "cpu", "--seq", "64", "--batch", "2"]
    code = main(["train", str(config), *flags, "--json"])
    out, err = capfd.readouterr()
    assert code == 0 and json.loads(out)["model"]["trainable_params"] > 0
    lines = err.splitlines()
    assert lines and all(line.startswith("peakmem: ") for line in lines), err
    assert any(
        "fake-tensor steps of its blocks at the fit shapes" in line and "steps)" in line for line in lines
    )


def test_a_note_where_no_answer_collects_is_dropped_not_kept_for_later() -> None:
    progress.note("left by a call outside any answer")
    with progress.collecting() as notes:
        progress.note("left by a call outside any answer")
    assert notes == ["left by a call outside any answer"]
