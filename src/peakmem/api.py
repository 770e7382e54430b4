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


def run(command: str, model: str, options: dict[str, Any]) -> Result:
    """``peakmem COMMAND MODEL`` with ``options`` (flag names with underscores)."""
    from peakmem.cli import build_parser, json_answer

    if command not in COMMANDS:
        raise InputError(f"command={command!r}: one of {', '.join(COMMANDS)}")
    if not isinstance(model, str):
        raise InputError(f"model={model!r}: a catalog name, a config.json path or a Hub id (a string)")
    required = ["--max-gpus", "1", "--gpu", "h100-80gb"] if command == "plan" else []
    args = build_parser().parse_args([command, model, *required])
    known = sorted(k for k in vars(args) if k not in _OUTPUT_ONLY)
    for name, value in options.items():
        if name not in known:
            raise InputError(
                f"{name}={value!r}: not an option of peakmem {command} (options: {', '.join(known)})"
            )
        setattr(args, name, _flag_value(value))
    if command == "plan" and ("gpu" not in options or "max_gpus" not in options):
        raise InputError("gpu, max_gpus: plan needs both (e.g. gpu='h100-80gb', max_gpus=64)")
    data, code = json_answer(command, args)
    return Result(command=command, model=model, exit_code=code, data=json.loads(json.dumps(data)))
