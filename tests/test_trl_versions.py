"""``--trl VERSION``: what a TRL release's trainer does to a LoRA / QLoRA model (peakmem.trl_versions), its
rows as read in TRL's tags, the option's precedence and errors, and the bytes it moves on a tiny Llama."""

from __future__ import annotations

import pytest

from peakmem import options
from peakmem.errors import InputError
from peakmem.estimate import estimate_training
from peakmem.hf import spec_from_config
from peakmem.question import training_setup
from peakmem.training import TrainingSetup
from peakmem.trl_versions import TRAINER_ROWS, peft_preparation, trl_objective

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
}  # fmt: skip
NORMS = 64 + 2 * 2 * 64  # final norm, input + post-attention norm per layer
ADAPTERS = 2 * 4 * ((64 + 64) + (64 + 32))  # layers x r x ((in + out) of q_proj, of v_proj)


@pytest.mark.parametrize(("version", "objective", "method", "precision", "quant", "sharded", "expected"), [
    # SFTTrainer: prepare, get_peft_model (fp32), cast back under bf16 on a 4-bit base
    ("0.13.0", "sft", "qlora", "amp-bf16", "nf4", False, ("trl", None)),
    ("0.25.1", "sft", "qlora", "mixed-bf16", "nf4", False, ("trl", None)),
    ("0.13.0", "sft", "qlora", "fp32", "nf4", False, ("peft", None)),  # no args.bf16: no cast back
    ("0.13.0", "sft", "qlora", "amp-bf16", "int8", False, ("peft", None)),  # the cast is for 4-bit only
    ("0.13.0", "sft", "qlora", "bf16", "nf4", True, ("none", "bf16")),  # sharded: no autocast
    ("v0.26.0", "sft", "qlora", "amp-bf16", "nf4", False, ("none", "bf16")),
    ("0.26.0", "sft", "qlora", "amp-fp16", "nf4", False, ("none", "bf16")),  # bf16 whatever the precision
    ("0.29.1", "sft", "qlora", "fp32", "int8", True, ("none", "bf16")),
    ("0.8.6", "sft", "qlora", "amp-bf16", "nf4", False, ("trl", "bf16")),  # the cast took BaseTunerLayer too
    ("0.8.6", "sft", "qlora", "amp-bf16", "nf4", True, ("none", None)),  # sharded skip, peft's fp32 adapters
    ("0.7.5", "sft", "qlora", "amp-bf16", "nf4", True, ("trl", "bf16")),  # no sharded check yet
    ("0.7.4", "sft", "qlora", "amp-bf16", "nf4", False, ("peft", None)),
    ("0.4.1", "sft", "qlora", "amp-bf16", "nf4", False, ("none", None)),  # no SFTTrainer
    ("0.28.0", "dpo", "qlora", "amp-bf16", "nf4", True, ("trl", None)),  # DPO: no sharded check
    ("0.29.0", "dpo", "qlora", "amp-bf16", "nf4", False, ("none", "bf16")),
    ("0.21.0", "grpo", "qlora", "amp-bf16", "nf4", False, ("none", None)),  # get_peft_model only
    ("0.22.0", "grpo", "qlora", "amp-bf16", "nf4", False, ("trl", None)),
    ("0.26.0", "grpo", "qlora", "amp-bf16", "nf4", False, ("none", "bf16")),
    ("0.26.2", "rloo", "qlora", "amp-bf16", "nf4", False, ("trl", None)),
    ("0.27.0", "rloo", "qlora", "amp-bf16", "nf4", False, ("none", "bf16")),
    ("1.7.0", "sft", "lora", "mixed-bf16", "nf4", True, (None, "base")),  # ZeRO-3 LoRA: model's dtype
    ("1.6.0", "sft", "lora", "mixed-bf16", "nf4", True, (None, None)),
    ("1.16.0", "kto", "qlora", "amp-bf16", "nf4", False, (None, None)),  # a trainer not read: as given
])  # fmt: skip
def test_release_rows(version: str, objective: str, method: str, precision: str, quant: str, sharded: bool,
                      expected: tuple[str | None, str | None]) -> None:  # fmt: skip
    prep = peft_preparation(version, objective=objective, method=method, precision=precision, quant=quant,
                            sharded=sharded, zero3=sharded)  # fmt: skip
    assert prep is not None and (prep.kbit_prep, prep.adapter_dtype) == expected


def test_tables_newest_first_down_to_zero() -> None:
    for rows in TRAINER_ROWS.values():
        assert [r.since for r in rows] == sorted((r.since for r in rows), reverse=True)
        assert len({r.since for r in rows}) == len(rows) and rows[-1].since == (0, 0, 0)
        assert all(r.source for r in rows)


def test_full_fine_tuning_has_nothing_to_prepare() -> None:
    assert peft_preparation("0.13.0", objective="sft", method="full", precision="amp-bf16", quant="nf4",
                            sharded=False, zero3=False) is None  # fmt: skip


def test_trl_config_classes_name_the_objective() -> None:
    sft = type("SFTConfig", (), {"__module__": "trl.trainer.sft_config"})
    kto = type("KTOConfig", (), {"__module__": "trl.trainer.kto_config"})
    mine = type("MyConfig", (sft,), {"__module__": "myproject.config"})  # a subclass of TRL's
    assert [trl_objective(c) for c in (sft, kto, mine)] == ["sft", "KTOConfig", "sft"]
    assert trl_objective(type("TrainingArguments", (), {"__module__": "transformers.training_args"})) is None


def _setup(**given: object) -> tuple[TrainingSetup, tuple[str, ...]]:
    base = {"method": "qlora", "precision": "amp-bf16", "lora_rank": 4, "lora_targets": "q_proj,v_proj",
            "batch": 2, "seq": 16, "checkpointing": "full", "optimizer_impl": "foreach"}  # fmt: skip
    return training_setup(options.convert("train", {**base, **given}), None)


def _kbit(setup: TrainingSetup) -> str:
    quant = setup.quant
    return "none" if quant is None else str(quant.kbit_prep)  # None: nf4 + double quant, unprepared


def _adapters(setup: TrainingSetup) -> str:
    assert setup.lora is not None
    return setup.lora.adapter_dtype


def test_no_release_keeps_the_options() -> None:
    setup, taken = _setup()
    assert setup.quant is None and _adapters(setup) == "fp32" and taken == ()


def test_explicit_options_win_over_the_release() -> None:
    setup, taken = _setup(trl="0.13.0", kbit_prep="peft")
    assert _kbit(setup) == "peft" and _adapters(setup) == "fp32"
    assert taken[0].startswith("TRL 0.13.0 sft trainer: kbit_prep trl")
    assert "given: kbit_prep=peft" in taken[0]
    setup, _ = _setup(trl="0.26.0", adapter_dtype="fp32")
    assert _kbit(setup) == "none" and _adapters(setup) == "fp32"
    setup, _ = _setup(trl="0.26.0")
    assert _kbit(setup) == "none" and _adapters(setup) == "bf16"


def test_a_sharded_base_follows_the_layout() -> None:
    """FSDP / ZeRO-3 put TRL 0.13's 4-bit base on cpu / meta: no preparation, adapters in the float dtype."""
    setup, _ = _setup(trl="0.13.0", gpus=2, fsdp="full-shard")
    assert _kbit(setup) == "none" and _adapters(setup) == "bf16"


def test_bad_release_is_one_line_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    from peakmem.cli import main

    with pytest.raises(InputError, match=r"^trl='0\.x': a release number such as 0\.13\.0"):
        _setup(trl="0.x")
    assert main(["train", "gpt2", "--method", "qlora", "--trl", "zero"]) == 2
    err = capsys.readouterr().err.strip()
    assert "trl='zero'" in err and "\n" not in err and "Traceback" not in err


def test_release_0_25_against_0_26_by_hand() -> None:
    """TRL 0.25.1 (kbit_prep trl: fp32 norms; fp32 adapters) against 0.26.0 (no preparation; bf16
    adapters): the frozen base differs by the norms' 2 extra bytes, the adapters, their gradients and both
    AdamW states by 2 bytes each per adapter parameter (fp32 -> bf16)."""
    spec = spec_from_config(LLAMA, name="t")

    def rows(version: str) -> dict[str, int]:
        est = estimate_training(spec, _setup(trl=version)[0])
        return {r.tensor.split(" (")[0]: r.bytes for r in est.per_param}

    old, new = rows("0.25.1"), rows("0.26.0")
    assert old["base weights"] - new["base weights"] == 2 * NORMS
    for row in ("LoRA adapters", "gradients", "AdamW m", "AdamW v"):
        assert old[row] == 4 * ADAPTERS and new[row] == 2 * ADAPTERS, row
    assert set(old) == set(new)


def test_from_a_trl_qlora_config_notes_the_release(tmp_path: object) -> None:
    from pathlib import Path

    from peakmem.fromfile import read_from_files
    from peakmem.fromfile.hf_trainer import TRL_RELEASE_NOTE

    path = Path(str(tmp_path)) / "sft.yaml"
    path.write_text("model_name_or_path: gpt2\nload_in_4bit: true\nuse_peft: true\nbf16: true\n")
    found = read_from_files([path])
    assert TRL_RELEASE_NOTE in found.notes and found.options["method"] == "qlora"


def test_a_layout_the_planner_proposes_gets_its_own_preparation() -> None:
    """TRL 0.13 prepares a one-GPU 4-bit base (kbit_prep trl, fp32 adapters) but skips a sharded one (none,
    bf16 adapters): plan and fit propose layouts the user did not ask, and each must take its own row
    (where_it_acts), from either starting layout; an explicit option stays on every layout."""
    from peakmem.parallel import FsdpMode, Parallelism
    from peakmem.planner import where_it_acts

    fsdp = Parallelism(gpus=2, fsdp=FsdpMode.FULL_SHARD)
    for asked in ({}, {"gpus": 2, "fsdp": "full-shard"}):
        setup, _ = _setup(trl="0.13.0", **asked)
        assert setup.layout_prep is not None
        one, sharded = where_it_acts(setup, None), where_it_acts(setup, fsdp)
        assert (_kbit(one), _adapters(one)) == ("trl", "fp32")
        assert (_kbit(sharded), _adapters(sharded)) == ("none", "bf16")
    setup, _ = _setup(trl="0.13.0", kbit_prep="peft")
    assert _kbit(where_it_acts(setup, fsdp)) == "peft" and _adapters(where_it_acts(setup, fsdp)) == "bf16"
    # a release that prepares every layout alike carries no per-layout rows
    assert _setup(trl="0.26.0")[0].layout_prep is None and _setup()[0].layout_prep is None
