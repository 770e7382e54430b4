"""The answers README.md prints, checked against what peakmem answers now (``make readme`` rewrites them).

    .venv/bin/python benchmarks/readme_answers.py [--check | --write]

Answers it finds (everything else in the README is prose and is left alone):

* each fenced ``text`` block whose first line is ``$ peakmem ARGS``: the lines after it are the
  command's first output lines (whitespace at line ends ignored). A line starting with ``...`` marks
  where the README elides the rest, and ``--write`` keeps the number of lines shown before it; a
  block without one shows the whole output. The command runs in-process (``peakmem.cli.main``) with
  stdout captured and ``COLUMNS`` set wide, so rich wraps no line.
* each line of a ``python`` block that is one expression ending in ``# VALUE`` or ``# VALUE: prose``,
  where VALUE is a Python literal: VALUE is ``repr`` of the expression's value. Earlier lines of the
  same block of the form ``name = expression`` are run first, so the expression may use their names.
  Only expressions made of names, attributes (none starting with ``_``), subscripts, calls and
  literals are run, with ``peakmem`` the one name given; a line with anything else is not an answer.

Today: ``$ peakmem train gpt2-xl --precision mixed-fp16 --seq 1024`` (the seed's answer), and in the
Python API section ``v.fits, v["verdicts"][0]["max_concurrent"]`` (after its block's ``r = ...`` and
``v = ...`` lines run); the lines without a value comment (``peakmem.fit``, ``peakmem.plan``) are not run.

``--check`` (the default) prints one row per answer (its README line, ok or DIFFERS) and, for each
line that differs, what the README says and what peakmem says; it exits 1 on a mismatch. ``--write``
rewrites those README lines from what peakmem says now.
tests/test_readme.py runs the check.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import shlex
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peakmem
from peakmem.cli import main as cli_main

README = Path(__file__).resolve().parents[1] / "README.md"
COLUMNS = "400"  # rich's width for the captured output: wide enough that no README line wraps
ELISION = "..."
SAFE_NODES = (
    ast.Expression, ast.Name, ast.Load, ast.Attribute, ast.Subscript, ast.Call, ast.keyword,
    ast.Constant, ast.Tuple, ast.List, ast.Dict, ast.UnaryOp, ast.USub,
)  # fmt: skip


@dataclass(frozen=True)
class Answer:
    """Lines ``first`` .. ``first + len(says) - 1`` (0-based) of the README, and what they should read."""

    first: int
    source: str  # the command or expression
    says: tuple[str, ...]
    now: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.says == self.now


def cli_output(argv: list[str]) -> list[str]:
    """``peakmem ARGV``'s stdout lines, line ends stripped, as a console COLUMNS wide prints them."""
    out = io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            cli_main(argv)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return [line.rstrip() for line in out.getvalue().splitlines()]


def _blocks(lines: list[str]) -> Iterator[tuple[str, int, int]]:
    """(language, first line inside, line of the closing fence) of each fenced block."""
    start, lang = -1, ""
    for i, line in enumerate(lines):
        if line.startswith("```"):
            if start < 0:
                start, lang = i + 1, line[3:].strip()
            else:
                yield lang, start, i
                start = -1


def _text_answer(lines: list[str], start: int, end: int) -> Answer | None:
    if not lines[start].startswith("$ peakmem "):
        return None
    body = lines[start + 1 : end]
    shown = next((n for n, line in enumerate(body) if line.startswith(ELISION)), len(body))
    output = cli_output(shlex.split(lines[start])[2:])
    now = output[:shown] if shown < len(body) else output
    return Answer(start + 1, lines[start], tuple(x.rstrip() for x in body[:shown]), tuple(now))


def _run(code: str, names: dict[str, Any]) -> tuple[bool, Any]:
    """(True, its value) for an expression of SAFE_NODES over ``names`` (no attribute starting with
    ``_``), (False, None) for any other code, which is left unrun."""
    try:
        tree = ast.parse(code.strip(), mode="eval")
    except SyntaxError:
        return False, None
    for n in ast.walk(tree):
        if (
            not isinstance(n, SAFE_NODES)
            or (isinstance(n, ast.Attribute) and n.attr.startswith("_"))
            or (isinstance(n, ast.Name) and n.id not in names)
        ):
            return False, None
    return True, eval(compile(tree, "README.md", "eval"), dict(names))  # only the nodes checked above


def _split_comment(line: str) -> tuple[str, str] | None:
    """(code, comment text) of a line ending in a comment, or None."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    comment = next((t for t in tokens if t.type == tokenize.COMMENT), None)
    return None if comment is None else (line[: comment.start[1]], comment.string[1:].strip())


def _value_text(comment: str) -> str | None:
    """The literal a comment starts with (up to a ':' that ends it, or the whole comment)."""
    for end in [i for i, c in enumerate(comment) if c == ":"] + [len(comment)]:
        with contextlib.suppress(ValueError, SyntaxError):
            ast.literal_eval(comment[:end])
            return comment[:end]
    return None


def _python_answers(lines: list[str], start: int, end: int) -> Iterator[Answer]:
    names: dict[str, Any] = {"peakmem": peakmem}
    for i in range(start, end):
        split = _split_comment(lines[i])
        name, _, expr = lines[i].partition(" = ")
        if split is None and name.isidentifier():
            ran, value = _run(expr, names)
            if ran:
                names[name] = value
        elif split is not None and (says := _value_text(split[1])) is not None:
            ran, value = _run(split[0], names)
            if ran:
                yield Answer(i, split[0].strip(), (says,), (repr(value),))


def answers(text: str) -> list[Answer]:
    """Every answer README ``text`` prints, with what peakmem answers now."""
    lines = text.split("\n")
    found: list[Answer] = []
    for lang, start, end in _blocks(lines):
        if lang == "text" and (a := _text_answer(lines, start, end)) is not None:
            found.append(a)
        elif lang == "python":
            found.extend(_python_answers(lines, start, end))
    return found


def rewrite(text: str, found: list[Answer]) -> str:
    """README ``text`` with each answer's lines replaced by what peakmem says now."""
    lines = text.split("\n")
    for a in sorted((a for a in found if not a.ok), key=lambda a: a.first, reverse=True):
        split = None if a.source.startswith("$ ") else _split_comment(lines[a.first])
        if split is None:
            lines[a.first : a.first + len(a.says)] = list(a.now)
        else:  # the value at the start of the comment; the prose after it stays
            lines[a.first] = f"{split[0]}# {a.now[0]}{split[1][len(a.says[0]) :]}"
    return "\n".join(lines)


def differences(a: Answer) -> list[str]:
    """'README.md:LINE: README says ... / peakmem says ...' for each line of ``a`` that differs."""
    pad = max(len(a.says), len(a.now))
    says, now = (x + ("(no line)",) * (pad - len(x)) for x in (a.says, a.now))
    return [
        f"README.md:{a.first + n + 1}: README says {s!r}; peakmem says {w!r}"
        for n, (s, w) in enumerate(zip(says, now, strict=True))
        if s != w
    ]


def table(found: list[Answer]) -> str:
    """One row per answer: its first README line, ok or DIFFERS, its source; then each differing line."""
    rows = [f"{'line':>5}  {'':7}  answer"]
    for a in found:
        rows.append(f"{a.first + 1:>5}  {'ok' if a.ok else 'DIFFERS':7}  {a.source}")
        rows += [f"         {d}" for d in differences(a)]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="print the answers; exit 1 on a mismatch")
    mode.add_argument("--write", action="store_true", help="rewrite the README's answers from peakmem's")
    args = ap.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    found = answers(text)
    print(table(found))
    if args.write:
        README.write_text(rewrite(text, found), encoding="utf-8")
        print(f"README.md: {sum(not a.ok for a in found)} of {len(found)} answers rewritten")
        return 0
    return 0 if all(a.ok for a in found) else 1


if __name__ == "__main__":
    raise SystemExit(main())
