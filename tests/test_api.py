"""The Python API answers what the CLI answers: ``peakmem.X(model, **options).to_dict()`` equals
``peakmem X MODEL --flags --json``, exit codes included; bad values are ValueErrors naming the field."""

from __future__ import annotations

import json

import pytest

import peakmem
from peakmem.cli import main
from peakmem.errors import InputError, UnknownNameError

CASES = [
    ("train", "gpt2-xl", ["--precision", "mixed-fp16", "--seq", "1024"],
     {"precision": "mixed-fp16", "seq": 1024}),
    ("train", "llama-3.2-1b", ["--method", "lora", "--seq", "512", "--gpus", "8", "--zero", "3",
                               "--gpu", "24GB"],
     {"method": "lora", "seq": 512, "gpus": 8, "zero": 3, "gpu": "24GB"}),
    ("infer", "llama-3.1-8b", ["--engine", "vllm", "--context", "8192", "--batch", "16", "--gpu", "rtx-4090"],
     {"engine": "vllm", "context": 8192, "batch": 16, "gpu": "rtx-4090"}),
    ("fit", "gpt2-xl", ["--gpu", "24GB,40GB", "--seq", "1024"], {"gpu": ["24GB", "40GB"], "seq": 1024}),
    ("plan", "llama-3.1-8b", ["--gpu", "a100-80gb", "--max-gpus", "16", "--seq", "4096"],
     {"gpu": "a100-80gb", "max_gpus": 16, "seq": 4096}),
]  # fmt: skip


@pytest.mark.parametrize(("command", "model", "flags", "options"), CASES, ids=[c[0] for c in CASES])
def test_api_equals_cli_json(
    command: str, model: str, flags: list[str], options: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([command, model, *flags, "--json"])
    cli = json.loads(capsys.readouterr().out)
    result = getattr(peakmem, command)(model, **options)
    api = result.to_dict()
    for out in (api, cli):
        out.pop("elapsed_s", None)  # the search's own wall time (fit, plan)
    assert api == cli
    assert result.exit_code == code and result.fits == (code == 0)


def test_bad_values_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"batch=2\.5: must be an integer"):
        peakmem.train("gpt2", batch=2.5)
    with pytest.raises(InputError, match="precision='bogus'"):
        peakmem.train("gpt2", precision="bogus")
    with pytest.raises(InputError, match="lora_ranks=8: not an option of peakmem train"):
        peakmem.train("gpt2", lora_ranks=8)
    with pytest.raises(InputError, match="plan needs both"):
        peakmem.plan("gpt2", gpu="h100-80gb")
    with pytest.raises(UnknownNameError, match="did you mean"):
        peakmem.train("gpt2-xxl")


def test_import_stays_light_and_documents_the_api() -> None:
    assert {"train", "infer", "fit", "plan"} <= set(peakmem.__all__)
    assert "peakmem.train(" in (peakmem.__doc__ or "")
