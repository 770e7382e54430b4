"""The one table of options and its one conversion (peakmem.options): every face takes the same
names, and every bad value of every option raises the documented InputError (a ValueError) naming
that option, before any work is done."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import peakmem
from peakmem import options
from peakmem.cli import build_parser
from peakmem.errors import InputError

BASE: dict[str, dict[str, Any]] = {  # what each command needs besides the option tried
    "train": {}, "infer": {}, "fit": {"gpu": "24GB"}, "plan": {"gpu": "h100-80gb", "max_gpus": 8},
}  # fmt: skip
PAIRS = [(c, o) for c in options.JOB_COMMANDS for o in options.of(c)]
_TEXT = st.text(max_size=8)
_WRONG: dict[type, st.SearchStrategy[Any]] = {  # values of another type than the option holds
    int: st.one_of(st.booleans(), st.floats(allow_nan=True), _TEXT, st.lists(st.integers(), max_size=2)),
    float: st.one_of(st.booleans(), _TEXT, st.just(float("nan")), st.just(float("inf")), st.just(2**41)),
    bool: st.one_of(st.integers(), _TEXT, st.floats()),
    str: st.one_of(st.integers(), st.floats(), st.booleans(), st.dictionaries(_TEXT, st.none())),
}  # fmt: skip


@pytest.mark.parametrize(("command", "option"), PAIRS, ids=[f"{c}-{o.name}" for c, o in PAIRS])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_a_value_of_another_type_names_the_option(command: str, option: options.Option, data: Any) -> None:
    value = data.draw(_WRONG[option.kind])
    kw = {**BASE[command], option.name: value}
    with pytest.raises(InputError) as err:
        getattr(peakmem, command)("llama-3.2-1b", **kw)
    assert str(err.value).startswith(f"{option.name}="), str(err.value)


@pytest.mark.parametrize("command", options.JOB_COMMANDS)
def test_an_unknown_name_lists_the_commands_options(command: str) -> None:
    with pytest.raises(InputError, match=r"^lora_rnak=8: not an option of peakmem \w+ \(options: "):
        getattr(peakmem, command)("llama-3.2-1b", **BASE[command], lora_rnak=8)


@pytest.mark.parametrize("command", options.JOB_COMMANDS)
def test_the_cli_takes_every_option_of_the_table(command: str) -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    dests = {a.dest: a for a in sub.choices[command]._actions}
    for o in options.of(command):
        assert o.name in dests, f"peakmem {command} has no {o.flag}"
        assert o.flag in dests[o.name].option_strings
        assert dests[o.name].default == o.default


def test_conversion_keeps_good_values_and_spellings() -> None:
    out = options.convert("train", {"lora_targets": ["q_proj", "v_proj"], "lora_alpha": 16, "seq": 512})
    assert (out["lora_targets"], out["lora_alpha"], out["seq"]) == ("q_proj,v_proj", 16.0, 512)
    assert out["batch"] == 1 and out["optimizer_impl"] == options.AUTO  # defaults filled
    with pytest.raises(InputError, match=r"^cuda_context_mib='xxxxx.*: must be a number$"):
        options.convert("train", {"cuda_context_mib": "x" * 10_000})


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"global_batch": 0}, r"^global_batch=0: must be positive"),
     ({"gpus_per_node": 0}, r"^gpus_per_node=0"),
     ({"cuda_context_mib": -1.0}, r"^cuda_context_mib=-1.0: must be >= 0")],
)  # fmt: skip
def test_values_out_of_range_are_refused_even_where_they_change_nothing(
    kw: dict[str, Any], match: str
) -> None:
    command = "plan" if "global_batch" in kw else "train"
    with pytest.raises(InputError, match=match):
        getattr(peakmem, command)("llama-3.2-1b", **BASE[command], **kw)


LIMITED = [(c, o) for c, o in PAIRS if o.maximum is not None]


@pytest.mark.parametrize(("command", "option"), LIMITED, ids=[f"{c}-{o.name}" for c, o in LIMITED])
def test_a_value_past_its_limit_is_refused_naming_the_option(command: str, option: options.Option) -> None:
    assert option.maximum is not None
    assert options.convert(command, {option.name: option.maximum})[option.name] == option.maximum
    with pytest.raises(InputError, match=rf"^{option.name}={option.maximum + 1}: too large \(at most "):
        options.convert(command, {option.name: option.maximum + 1})


def test_limits_the_issue_named() -> None:
    with pytest.raises(InputError, match=r"^max_gpus=1000000000: too large"):
        peakmem.plan("gpt2", gpu="h100-80gb", max_gpus=10**9)
    with pytest.raises(InputError, match=r"^seq=1000000000000: too large"):
        peakmem.train("llama-3.2-1b", seq=10**12)
    with pytest.raises(InputError, match=r"^lora_rank=1000: above gpt2's hidden size 768"):
        peakmem.train("gpt2", method="lora", lora_rank=1000)
    assert peakmem.train("gpt2", method="lora", lora_rank=768).to_dict()["model"]["trainable_params"] > 0


def test_a_long_target_list_is_checked_in_one_pass() -> None:
    """LoraConfig joined the whole list once per target (16,000 targets: 2.9 s); now once, for the error."""
    import time

    from peakmem.adapters import LoraConfig

    names = tuple(f"m{i}" for i in range(200_000))
    start = time.perf_counter()
    assert LoraConfig(targets=names).targets == names
    with pytest.raises(InputError, match=r"^lora_targets='m0,m1,.*: empty module name$"):
        LoraConfig(targets=(*names, " "))
    assert time.perf_counter() - start < 2  # a quadratic check takes hours here; linear: ~0.05 s
