"""bitsandbytes' release as a version fact (peakmem.bnb_versions): before 0.43.2 MatMul4Bit kept its input
A for backward (``ctx.tensors = (A, B)``), from 0.43.2 ``(None, B)`` (PR #1270).

Hand-derived on a tiny Llama (hidden h = 64, intermediate I = 176, 3 layers, batch 2 x seq 32 = T = 64
tokens, bf16: c = 2 B), LoRA on q_proj and v_proj. What the old release adds, per layer, is each 4-bit
Linear's input that nothing else keeps already:

* the first norm's output (q/k/v's input, h): kept by lora_A itself when dropout is 0 (same dtype, no
  cast: ``mm`` saves the very tensor); with dropout lora_A keeps dropout's output instead, so the base
  adds it, except in the first layer, where nothing requires grad yet (no autograd node is made);
* o_proj's input (h): SDPA's output, already saved by SDPA's own backward: nothing added;
* the second norm's output (gate/up's input, h) and the MLP product before down_proj (I): added.

So dropout 0: T c L (h + I) = 64 * 2 * 3 * 240 = 92,160 B; dropout > 0: that + T c (L - 1) h = 108,544 B.
The same differences were measured on CPU (bitsandbytes 0.50.2's Linear4bit and peft, live storage after
the forward, MatMul4Bit as shipped vs patched to keep A): 92,160 and 108,544 B.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import peakmem
from peakmem.bnb_versions import BNB_CURRENT, parse_bnb_version, release_facts
from peakmem.cli import main
from peakmem.errors import InputError
from tiny_models import llama_config_file

H, INTER, LAYERS, BATCH, SEQ, C = 64, 176, 3, 2, 32, 2
TOKENS = BATCH * SEQ


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return llama_config_file(
        tmp_path_factory.mktemp("tiny"), hidden=H, intermediate=INTER, layers=LAYERS, seq=SEQ
    )


def _train(config: str, version: str, **kw: Any) -> dict[str, Any]:
    opts: dict[str, Any] = dict(method="qlora", precision="bf16", batch=BATCH, seq=SEQ, lora_rank=4,
                                lora_alpha=8, lora_targets="q_proj,v_proj", adapter_dtype="base")  # fmt: skip
    opts.update(kw)
    out: dict[str, Any] = peakmem.train(config, bitsandbytes=version, **opts).to_dict()
    return out


def _added(config: str, **kw: Any) -> int:
    old, new = _train(config, "0.41.1", **kw), _train(config, BNB_CURRENT, **kw)
    assert new["setup"]["bitsandbytes"] == BNB_CURRENT and old["setup"]["bitsandbytes"] == "0.41.1"
    added: int = old["breakdown"]["activations"] - new["breakdown"]["activations"]
    return added


@pytest.mark.parametrize(
    ("version", "saves"),
    [("0.39.1", True), ("0.41.1", True), ("0.43.1", True), ("0.43.2", False), ("0.45", False),
     ("v0.50.2.dev0", False), ("0.38.0", False)],
)  # fmt: skip
def test_the_release_that_dropped_the_input(version: str, saves: bool) -> None:
    assert release_facts(version).matmul4bit_saves_input is saves


def test_versions_parse() -> None:
    assert parse_bnb_version("0.41.1") == (0, 41, 1)
    assert parse_bnb_version("0.43") == (0, 43, 0)
    assert parse_bnb_version(" 0.45.0.post1 ") == (0, 45, 0)


def test_old_release_keeps_the_inputs_nothing_else_keeps(tiny: str) -> None:
    assert _added(tiny, lora_dropout=0.0) == TOKENS * C * LAYERS * (H + INTER)
    assert _added(tiny, lora_dropout=0.05) == TOKENS * C * (LAYERS * (H + INTER) + (LAYERS - 1) * H)
    # adapters on every Linear with no dropout: lora_A keeps each input itself, nothing added
    all_linear = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    assert _added(tiny, lora_dropout=0.0, lora_targets=all_linear) == 0
    # LLM.int8 keeps its inputs in every release (MatMul8bitLt): the version changes nothing
    assert _added(tiny, quant="int8") == 0


def test_old_release_is_said(tiny: str) -> None:
    said = " ".join(_train(tiny, "0.41.1")["assumptions"])
    assert "bitsandbytes 0.41.1: each 4-bit Linear" in said
    assert "each 4-bit Linear" not in " ".join(_train(tiny, BNB_CURRENT)["assumptions"])


@pytest.mark.parametrize("bad", ["latest", "0.41.1.2.3", "41", ""])
def test_malformed_version_is_one_line_error(tiny: str, bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match=re.escape(f"bitsandbytes={bad!r}: a release number")):
        _train(tiny, bad)
    assert main(["train", tiny, "--method", "qlora", "--bitsandbytes", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bitsandbytes" in err[0] and "Traceback" not in err[0]


def test_no_4bit_before_0_39(tiny: str) -> None:
    with pytest.raises(InputError, match=re.escape("no 4-bit Linear before 0.39.0")):
        _train(tiny, "0.38.0")
    assert _train(tiny, "0.38.0", quant="int8")["peak_allocated_bytes"] > 0


def test_cli_equals_api(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", tiny, "--method", "qlora", "--precision", "bf16", "--batch", str(BATCH),
            "--seq", str(SEQ), "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q_proj,v_proj",
            "--adapter-dtype", "base", "--lora-dropout", "0.05", "--bitsandbytes", "0.41.1",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == _train(tiny, "0.41.1", lora_dropout=0.05)
