"""Issue 30 part 4: an answer whose bitsandbytes base keeps fused MoE experts 16-bit says so first.

transformers 5.23.0 ``integrations/bitsandbytes.py`` ``replace_with_bnb_linear`` converts only
``Conv1D`` / ``nn.Linear`` modules; ``MixtralExperts`` holds its experts as 3-D ``nn.Parameter``s, so
they stay bf16 under ``load_in_4bit`` / ``load_in_8bit``. The counts below are derived by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peakmem.cli import main
from peakmem.units import fmt_both, fmt_count
from tiny_models import FAMILY_CONFIGS

# tiny mixtral (tests/tiny_models.py): hidden 64, 3 layers, intermediate 96, 4 experts, vocab 128,
# 4 heads of 16, 2 kv heads, untied head
H, LAYERS, INTER, EXPERTS, VOCAB, KV = 64, 3, 96, 4, 128, 2 * 16
TINY_EXPERTS = LAYERS * EXPERTS * (2 * INTER * H + H * INTER)  # gate_up_proj (E, 2I, H) + down_proj (E, H, I)
TINY_LAYER = H * H + 2 * H * KV + H * H + EXPERTS * H + 2 * H  # q, k, v, o, router, two norms
TINY_TOTAL = 2 * VOCAB * H + LAYERS * TINY_LAYER + TINY_EXPERTS + H  # embed + head, layers, final norm
# mixtral-8x7b: 32 layers x 8 experts x 3 matrices of 4096 x 14336
MIXTRAL_EXPERTS = 32 * 8 * 3 * 4096 * 14336
MIXTRAL_TOTAL = 46_702_792_704  # its exact count (tests/test_param_counts_torch.py)


def _tiny(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(FAMILY_CONFIGS["mixtral"]))
    return str(path)


def _message(bits: str, kept: int, total: int) -> str:
    return (
        f"experts stay 16-bit under bitsandbytes {bits} (transformers 5 keeps fused 3-D expert parameters, "
        f"not nn.Linear): {fmt_count(kept)} of {fmt_count(total)} parameters at 2 bytes (bf16), "
        f"{fmt_both(2 * kept)}"
    )


def _answer(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict, list[str]]:  # type: ignore[type-arg]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(list(argv)) == 0
    return got, capsys.readouterr().out.splitlines()


def _opens_with_warning(lines: list[str], message: str) -> None:
    """The warning is the first line after the headline (which wraps at the pipe width)."""
    text = " ".join(line.strip() for line in lines[:8])
    headline_end = text.index(" on the device;" if "fine-tuning" in text else " per GPU;")
    warning = text.index("warning: " + message[:40])
    assert headline_end < warning
    assert " ".join(text[warning:].split()).startswith(" ".join(("warning: " + message).split()))
    assert "bytes per parameter" not in text[:warning] and "at the peak" not in text[:warning]


def test_tiny_moe_qlora_says_experts_stay_16bit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got, lines = _answer(capsys, "train", _tiny(tmp_path), "--method", "qlora", "--seq", "64")
    assert got["model"]["params"] == TINY_TOTAL
    message = _message("4-bit", TINY_EXPERTS, TINY_TOTAL)
    assert got["warnings"] == [message]
    _opens_with_warning(lines, message)


@pytest.mark.parametrize(("weights", "bits"), [("nf4", "4-bit"), ("int8", "8-bit")])
def test_tiny_moe_bnb_inference_says_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], weights: str, bits: str
) -> None:
    got, lines = _answer(capsys, "infer", _tiny(tmp_path), "--weights", weights, "--context", "64")
    message = _message(bits, TINY_EXPERTS, TINY_TOTAL)
    assert got["warnings"] == [message]
    _opens_with_warning(lines, message)


def test_mixtral_qlora_opens_with_the_warning(capsys: pytest.CaptureFixture[str]) -> None:
    got, lines = _answer(capsys, "train", "mixtral-8x7b", "--method", "qlora")
    message = _message("4-bit", MIXTRAL_EXPERTS, MIXTRAL_TOTAL)
    assert "45.10 B of 46.70 B parameters at 2 bytes" in message
    assert got["warnings"] == [message]
    _opens_with_warning(lines, message)


def test_markdown_says_it_after_the_headline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", _tiny(tmp_path), "--method", "qlora", "--seq", "64", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "**Warning:** " + _message("4-bit", TINY_EXPERTS, TINY_TOTAL)


@pytest.mark.parametrize(
    "argv",
    [
        ("train", "llama-3.1-8b", "--method", "qlora"),  # dense: every Linear quantized
        ("train", "mixtral-8x7b", "--method", "lora"),  # no bitsandbytes
        ("infer", "mixtral-8x7b", "--weights", "awq"),  # AWQ quantizes the experts
        ("infer", "mixtral-8x7b"),  # 16-bit weights
    ],
)
def test_no_warning_without_16bit_experts_under_bnb(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    got, lines = _answer(capsys, *argv)
    assert got["warnings"] == []
    assert not any(line.startswith("warning:") for line in lines)


def test_experts_as_linears_are_quantized_and_not_warned_about() -> None:
    """Per-expert ``nn.Linear`` modules (kind linear_weight) are quantized; their 16-bit biases alone are
    not fused experts left 16-bit: no warning, though expert rows stay bf16."""
    import dataclasses

    from peakmem.adapters import QuantConfig
    from peakmem.formulas.qlora import base_rows
    from peakmem.formulas.weights import bnb_kept_expert_params
    from peakmem.hf import spec_from_config
    from peakmem.model import Tensor

    spec = spec_from_config(FAMILY_CONFIGS["mixtral"])
    fmt = QuantConfig(quant="nf4", double_quant=True)
    assert bnb_kept_expert_params(base_rows(spec, fmt), fmt.weight_format) == TINY_EXPERTS

    def as_linears(t: Tensor) -> Tensor:
        return dataclasses.replace(t, kind="linear_weight") if t.kind == "expert_weight" else t

    bias = Tensor(name="mlp.experts.down_bias", module="experts", shape=(EXPERTS, H), component="experts",
                  kind="linear_bias")  # fmt: skip
    groups = tuple(
        dataclasses.replace(
            g, layer=dataclasses.replace(g.layer, tensors=(*map(as_linears, g.layer.tensors), bias))
        )
        for g in spec.groups
    )
    linears = dataclasses.replace(spec, groups=groups)
    rows = base_rows(linears, fmt)
    assert any(r.component == "experts" and r.storage == "bf16" for r in rows)  # the biases
    assert bnb_kept_expert_params(rows, fmt.weight_format) == 0
