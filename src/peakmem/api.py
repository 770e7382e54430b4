"""The Python API: ``peakmem.train/infer/fit/plan(model, **options)``.

Options are the CLI's flags with underscores (``seq=1024``, ``lora_rank=16``, ``gpu="rtx-4090"``,
``zero=3``); each call answers what ``peakmem COMMAND MODEL --flags --json`` answers, through the same
function (:func:`peakmem.question.answer`), so ``result.to_dict()`` equals the CLI's JSON; the values
are converted and checked by the same table (:mod:`peakmem.options`). Bad values
raise :class:`peakmem.errors.InputError` (a ``ValueError``) naming the field; an unknown model or GPU
raises :class:`peakmem.errors.UnknownNameError` (a ``LookupError``) with close names.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from peakmem import options as opt
from peakmem.errors import EXIT_OK, InputError

COMMANDS = opt.JOB_COMMANDS


@dataclass(frozen=True)
class Result:
    """One answer: ``to_dict()`` is the CLI's ``--json``; ``fits`` is the CLI's exit code 0."""

    command: str
    model: str
    exit_code: int
    data: dict[str, Any] = field(repr=False)

    @property
    def fits(self) -> bool:
        return self.exit_code == EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.data)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


def run(command: str, model: str | None, options: dict[str, Any]) -> Result:
    """``peakmem COMMAND MODEL`` with ``options`` (flag names with underscores). ``from_file`` (train,
    fit): a framework config path, or a list of them, as ``--from``; the other options override it."""
    from peakmem.question import answer, ask, read_from

    if command not in COMMANDS:
        raise InputError(f"command={command!r}: one of {', '.join(COMMANDS)}")
    given = dict(options)
    from_file = given.pop("from_file", None)
    if from_file is not None and command not in ("train", "fit"):
        raise InputError(f"from_file={from_file!r}: only train and fit read a framework config")
    if model is None and from_file is None:
        raise InputError("model=None: give a model (or from_file= naming one)")
    if model is not None and not isinstance(model, str):
        raise InputError(f"model={model!r}: a catalog name, a config.json path or a Hub id (a string)")
    converted = opt.convert(command, given)  # every value checked before the files are read
    read = None
    if from_file is not None:
        read, model = read_from(converted, from_file, set(given), model)
    from peakmem.simulate import oracles

    got = answer(ask(command, converted, model=model, from_file=read, **oracles()))
    name = got.question.spec.name if model is None else model
    return Result(command=command, model=str(name), exit_code=got.exit_code,
                  data=json.loads(json.dumps(got.json)))  # fmt: skip


def info_json(model: str, *, cross_check: bool = False) -> dict[str, Any]:
    """``peakmem info MODEL [--cross-check] --json``, through the command's own function."""
    from peakmem.answers import spec_json
    from peakmem.resolve import info_answer
    from peakmem.simulate import oracles

    spec, answered = info_answer(model, cross_check=cross_check, **oracles())
    return json.loads(json.dumps(spec_json(spec, answered)))  # type: ignore[no-any-return]
