"""A plain size keeps its decimal meaning and says so, naming the cards sold under it; a GPU that cannot
run the setup (bf16 or flash attention before Ampere) gets a warning, and the estimate stands as asked."""

from __future__ import annotations

import pytest

from peakmem.cli import main
from peakmem.resolve import gpu_of_size, resolve_gpu, sold_as


def test_24gb_is_decimal_and_names_the_cards_sold_as_24gb() -> None:
    g = gpu_of_size("24GB")
    assert g.memory_bytes == 24 * 10**9
    names = {c.name for c in sold_as("24GB")}
    assert {"rtx-4090", "rtx-3090", "a10", "l4"} <= names and "a100-40gb" not in names
    # what torch sees of each: the RTX 4090 23.65 GiB (catalog driver_reserved_bytes)
    assert "24,000,000,000 B" in g.note and "rtx-4090 (25,393,994,138 B)" in g.note
    assert sold_as("24.5GB") == [] and sold_as("3e10") == []


def test_cli_states_the_bytes_and_warns_before_ampere(capsys: pytest.CaptureFixture[str]) -> None:
    assert resolve_gpu("v100").pre_ampere and not resolve_gpu("a100-80gb").pre_ampere
    main(["train", "gpt2", "--seq", "512", "--gpu", "v100,24GB", "--json"])
    err = capsys.readouterr().err.splitlines()
    assert any("V100" in line and "no bf16" in line and "mixed-fp16" in line for line in err)
    assert any(line.startswith("peakmem: --gpu 24gb = 24,000,000,000 B") for line in err)
    main(["train", "gpt2", "--seq", "512", "--gpu", "v100", "--precision", "mixed-fp16", "--json"])
    assert "bf16" not in capsys.readouterr().err
