"""torchao's release as a version fact (peakmem.torchao_versions) and torchtune QLoRA's load (step_load.py).

Hand-derived bytes of one ``to_nf4`` of a bf16 weight of ``n`` elements (e = 2 B; nb = n / 64 blocks) at
its peak, with the 16-bit source (formulas/nf4_load.py, read in torchao 0.1 and 0.2.0 dtypes/nf4tensor.py):
the source 2n, the kept int8 scalers nb and quantization factor 2 nb, the block scalers 2 nb, the scaled copy
2n, and the (k, 16) difference and its abs, 64 k:

* torchao 0.1, k = n: 68 n + 5 nb;
* 0.2.0 on, k = min(n, 1024**2) with a uint8 buffer of n: 5 n + 5 nb + 64 k; past 64 chunk elements per
  element the packing (two n / 2 uint8 tensors next to the buffer) is larger: 6 n + 5 nb.

The CPU measurement of both wheels' code (68.078 B and 5.078 + 64 k / n B an element) is quoted in
formulas/nf4_load.py. Tiny Llama: hidden 128, intermediate 256, 2 layers: the largest quantized weight
is an MLP one, n = 32,768, nb = 512.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import peakmem
from peakmem.cli import main
from peakmem.errors import InputError
from peakmem.formulas.nf4_load import quantize_peak
from peakmem.torchao_versions import NF4_CHUNK_ELEMENTS, TORCHAO_CURRENT, parse_torchao_version, release_facts
from tiny_models import llama_config_file

H, INTER, LAYERS, BATCH, SEQ = 128, 256, 2, 2, 32
N = H * INTER
NB = N // 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return llama_config_file(
        tmp_path_factory.mktemp("tiny"), hidden=H, intermediate=INTER, layers=LAYERS, seq=SEQ
    )


def _train(config: str, version: str, **kw: Any) -> dict[str, Any]:
    opts: dict[str, Any] = dict(method="qlora", precision="bf16", batch=BATCH, seq=SEQ, lora_rank=4,
                                lora_alpha=8, adapter_dtype="base", framework="torchtune")  # fmt: skip
    opts.update(kw)
    out: dict[str, Any] = peakmem.train(config, torchao=version, **opts).to_dict()
    return out


@pytest.mark.parametrize(
    ("version", "chunk"),
    [("0.1", None), ("0.1.0", None), ("0.2.0", NF4_CHUNK_ELEMENTS), ("v0.18.0", NF4_CHUNK_ELEMENTS),
     ("0.5.0+cu121", NF4_CHUNK_ELEMENTS)],
)  # fmt: skip
def test_the_release_that_chunked_to_nf4(version: str, chunk: int | None) -> None:
    assert release_facts(version).nf4_chunk == chunk


def test_to_nf4_peak_hand_derived() -> None:
    assert quantize_peak(N, 2, None) == 68 * N + 5 * NB == 2_230_784
    assert quantize_peak(N, 2, NF4_CHUNK_ELEMENTS) == 69 * N + 5 * NB  # one chunk: the buffer on top
    assert quantize_peak(N, 2, 4096) == 5 * N + 5 * NB + 64 * 4096  # eight chunks
    assert quantize_peak(N, 2, 64) == 6 * N + 5 * NB  # the packing is larger than a 64-element chunk


def test_load_phase_of_torchtune_qlora(tiny: str) -> None:
    old, new = _train(tiny, "0.1"), _train(tiny, "0.2.0")
    for out, peak in ((old, 68 * N + 5 * NB), (new, 69 * N + 5 * NB)):
        assert out["peak_phase"] == "load"
        bd = out["breakdown"]
        assert set(bd) == {"parameters", "buffers", "temporaries"}  # no states, gradients or activations
        assert bd["temporaries"] == peak
        assert out["phases"]["load"] == out["peak_allocated_bytes"] == sum(bd.values())
        assert out["peak_reserved_bytes"] >= out["peak_allocated_bytes"]
    # HF's QLoRA (bitsandbytes: formulas/qlora_load.py, no to_nf4) does not peak at load; a multi-GPU job
    # has no load phase
    hf = _train(tiny, "0.1", framework="hf")
    assert hf["peak_phase"] != "load" and hf["phases"]["load"] < old["phases"]["load"]
    assert "load" not in _train(tiny, "0.1", gpus=2, fsdp="full-shard")["phases"]


@pytest.mark.parametrize("bad", ["latest", "0.1.2.3.4", "1", ""])
def test_malformed_version_is_one_line_error(tiny: str, bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match=re.escape(f"torchao={bad!r}: a release number")):
        _train(tiny, bad)
    assert main(["train", tiny, "--method", "qlora", "--torchao", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torchao" in err[0] and "Traceback" not in err[0]
    assert parse_torchao_version(TORCHAO_CURRENT) == (0, 18, 0)


def test_cli_equals_api(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", tiny, "--method", "qlora", "--precision", "bf16", "--batch", str(BATCH),
            "--seq", str(SEQ), "--lora-rank", "4", "--lora-alpha", "8", "--adapter-dtype", "base",
            "--framework", "torchtune", "--torchao", "0.1", "--json"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == _train(tiny, "0.1")
