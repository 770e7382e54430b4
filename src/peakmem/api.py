"""The Python API: ``peakmem.train/infer/fit/plan(model, **options)``.

Options are the CLI's flags with underscores (``seq=1024``, ``lora_rank=16``, ``gpu="rtx-4090"``,
``zero=3``); each call answers what ``peakmem COMMAND MODEL --flags --json`` answers, through the same
function (:func:`peakmem.cli.json_answer`), so ``result.to_dict()`` equals the CLI's JSON. Bad values
raise :class:`peakmem.errors.InputError` (a ``ValueError``) naming the field; an unknown model or GPU
raises :class:`peakmem.errors.UnknownNameError` (a ``LookupError``) with close names.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any

from peakmem.errors import EXIT_OK, InputError

COMMANDS = ("train", "infer", "fit", "plan")
# Options that only choose how the CLI prints (the API returns data): not accepted.
_OUTPUT_ONLY = frozenset({"json", "markdown", "plot", "emit", "handler", "model"})


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


def _flag_value(value: Any) -> Any:
    """Python values as the CLI's parser leaves them: lists of names joined with commas."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return getattr(value, "value", value)  # an enum member: its CLI spelling


def run(command: str, model: str | None, options: dict[str, Any]) -> Result:
    """``peakmem COMMAND MODEL`` with ``options`` (flag names with underscores). ``from_file`` (train,
    fit): a framework config path, or a list of them, as ``--from``; the other options override it."""
    from peakmem.cli import build_parser, json_answer

    if command not in COMMANDS:
        raise InputError(f"command={command!r}: one of {', '.join(COMMANDS)}")
    options = dict(options)
    from_file = options.pop("from_file", None)
    if from_file is not None and command not in ("train", "fit"):
        raise InputError(f"from_file={from_file!r}: only train and fit read a framework config")
    if model is None and from_file is None:
        raise InputError("model=None: give a model (or from_file= naming one)")
    if model is not None and not isinstance(model, str):
        raise InputError(f"model={model!r}: a catalog name, a config.json path or a Hub id (a string)")
    required = ["--max-gpus", "1", "--gpu", "h100-80gb"] if command == "plan" else []
    args = build_parser().parse_args([command, *([model] if model is not None else []), *required])
    known = sorted(k for k in vars(args) if k not in _OUTPUT_ONLY)
    for name, value in options.items():
        if name not in known:
            raise InputError(
                f"{name}={value!r}: not an option of peakmem {command} (options: {', '.join(known)})"
            )
        setattr(args, name, _flag_value(value))
    if from_file is not None:
        from peakmem.fromfile import load_and_apply

        paths = [from_file] if isinstance(from_file, (str, os.PathLike)) else list(from_file)
        args.from_file = [os.fspath(p) for p in paths]
        load_and_apply(args, set(options) | ({"model"} if model is not None else set()))
    if command == "plan" and ("gpu" not in options or "max_gpus" not in options):
        raise InputError("gpu, max_gpus: plan needs both (e.g. gpu='h100-80gb', max_gpus=64)")
    data, code = json_answer(command, args)
    return Result(command=command, model=str(args.model), exit_code=code, data=json.loads(json.dumps(data)))


def info_json(model: str, *, cross_check: bool = False) -> dict[str, Any]:
    """``peakmem info MODEL [--cross-check] --json``, through the command's own function."""
    from peakmem.cli import info_answer
    from peakmem.render import spec_json

    spec, answered = info_answer(model, cross_check=cross_check)
    return json.loads(json.dumps(spec_json(spec, answered)))  # type: ignore[no-any-return]
