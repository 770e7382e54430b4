"""A launch script's training command, read without running it: the argument list of the one command a
verl or OpenRLHF shell script starts (``python3 -m verl.trainer.main_ppo key=value ...``,
``ray job submit ... -- python3 -m openrlhf.cli.train_ppo_ray --flag value ...``,
``deepspeed --module $training_commands``).

The script is untrusted text and nothing in it is executed. What is read, as bash would (the examples
in verl's ``examples/*_trainer/*.sh`` and OpenRLHF's ``examples/scripts/*.sh`` use these forms):

* comments, ``\\`` line continuations, single and double quotes (``shlex``, POSIX rules);
* ``NAME=value`` and ``export NAME=value`` assignments, ``NAME=( ... )`` arrays (expanded by
  ``${NAME[@]}``), ``read -r -d '' NAME <<EOF ... EOF`` here-documents;
* ``$NAME``, ``${NAME}``, ``${NAME:-default}`` (the default when the script does not set NAME).

A variable the script does not set (``$HOME``, ``$1``, one assigned only inside an ``if`` with another
value elsewhere) is left as written and listed in :attr:`Command.unresolved`: the mapper names any field
whose value holds one. ``$@`` (the script's own arguments passed on) is recorded: overrides given when
the script was run are not seen.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from peakmem.errors import InputError

MAX_SCRIPT_LINES = 5000  # launch scripts are 20-200 lines; refuse a file far past that
MAX_EXPANDED_CHARS = 1 << 16  # a line after its variables are expanded (launch commands: a few KiB); stops
# a variable that doubles itself (A=$A$A) long before it costs time or memory
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?({_NAME})=(.*)$", re.S)
_ARRAY_OPEN = re.compile(rf"^({_NAME})=\(\s*(.*)$", re.S)
_HEREDOC = re.compile(rf"^read\s+(?:-\w+\s+(?:''\s+|\"\"\s+)?)*({_NAME})\s*<<-?\s*['\"]?(\w+)['\"]?\s*$")
_VAR = re.compile(
    rf"\$\{{({_NAME})(\[[@*]\])?(?::?-([^}}]*))?\}}|\$({_NAME})|\$([@*0-9#])|\$\{{([@*0-9#])\}}"
)
_BLOCK_OPEN = re.compile(r"^(if|for|while|until|case)\b|\{\s*$")
_BLOCK_CLOSE = re.compile(r"^(fi|done|esac|\})(\s|;|$)")
_CLOSES_INLINE = re.compile(r"[;\s](fi|done|esac)\s*;?\s*$")  # if ...; then ...; fi on one line
_OPERATORS = frozenset({"|", "||", "&&", ";", "&", "|&"})
_REDIRECT = re.compile(r"^\d*[<>]")


@dataclass(frozen=True)
class Command:
    """The training command a script runs: ``module`` (the marker found), the arguments after it, the
    shell variables it could not resolve, whether it passes the script's own arguments (``$@``) on, and
    notes (several commands in the script, ...)."""

    module: str
    argv: tuple[str, ...]
    unresolved: tuple[str, ...] = ()
    passes_args: bool = False
    notes: tuple[str, ...] = ()


def logical_lines(text: str, name: str) -> list[str]:
    """The script's lines with ``\\`` continuations joined (comments kept: shlex drops them later)."""
    lines = text.splitlines()
    if len(lines) > MAX_SCRIPT_LINES:
        raise InputError(f"--from {name}: {len(lines)} lines; a launch script has at most {MAX_SCRIPT_LINES}")
    out: list[str] = []
    current = ""
    for line in lines:
        stripped = line.rstrip()
        if stripped.endswith("\\") and not stripped.lstrip().startswith("#"):
            current += stripped[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    if current:
        out.append(current)
    return out


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (outside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _unquote(value: str) -> str:
    try:
        parts = shlex.split(value, comments=True)
    except ValueError:
        return value.strip()
    return " ".join(parts)


class _Shell:
    """The variables a script sets, read line by line (assignments inside a block count only where no
    other value is given: a conditional second value makes the variable unresolved)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.values: dict[str, str] = {}
        self.ambiguous: set[str] = set()
        self.unresolved: list[str] = []
        self.passes_args = False

    def assign(self, var: str, value: str, *, conditional: bool = False) -> None:
        """A later assignment replaces an earlier one; inside a block (``if``, ``for``, ...) a value other
        than the one already set makes the variable unknown (which branch runs is not known)."""
        if conditional and var in self.values and self.values[var] != value:
            self.ambiguous.add(var)
        elif not conditional:
            self.ambiguous.discard(var)
        self.values[var] = value

    def expand(self, text: str) -> str:
        """``text`` with the variables the script sets substituted (outside single quotes)."""
        out: list[str] = []
        size = 0
        i, quote = 0, ""
        while i < len(text):
            ch = text[i]
            if ch == "'" and quote != '"':
                quote = "" if quote == "'" else "'"
            elif ch == '"' and quote != "'":
                quote = "" if quote == '"' else '"'
            if ch == "$" and quote != "'":
                m = _VAR.match(text, i)
                if m:
                    value = self._value(m)
                    size += len(value)
                    if size > MAX_EXPANDED_CHARS:
                        raise InputError(
                            f"--from {self.name}: a line expands past {MAX_EXPANDED_CHARS} characters"
                        )
                    out.append(value)
                    i = m.end()
                    continue
            out.append(ch)
            i += 1
        return "".join(out)

    def _value(self, m: re.Match[str]) -> str:
        var = m.group(1) or m.group(4)
        special = m.group(5) or m.group(6)
        if special:
            if special in "@*":
                self.passes_args = True
                return ""
            self._missing(f"${special}")
            return m.group(0)
        assert var is not None
        if var in self.values and var not in self.ambiguous:
            return self.values[var]
        if m.group(3) is not None and var not in self.values:
            return _unquote(self.expand(m.group(3)))
        self._missing(var)
        return m.group(0)

    def _missing(self, var: str) -> None:
        if var not in self.unresolved:
            self.unresolved.append(var)


def read_command(text: str, name: str, markers: Sequence[str]) -> Command | None:
    """The arguments of the first command in ``text`` that runs one of ``markers`` (a module name such
    as ``verl.trainer.main_ppo``); None when the script runs none of them."""
    lines = logical_lines(text, name)
    shell = _Shell(name)
    found: list[tuple[str, list[str]]] = []
    i = depth = 0
    while i < len(lines):
        line = _strip_comment(lines[i]).strip()
        i += 1
        if not line:
            continue
        heredoc = _HEREDOC.match(line)
        if heredoc:
            body: list[str] = []
            while i < len(lines) and lines[i].strip() != heredoc.group(2):
                body.append(lines[i])
                i += 1
            i += 1
            shell.assign(heredoc.group(1), shell.expand(" ".join(body)), conditional=depth > 0)
            continue
        array = _ARRAY_OPEN.match(line)
        if array:
            items = [array.group(2)]
            while ")" not in _strip_comment(items[-1]) and i < len(lines):
                items.append(_strip_comment(lines[i]))
                i += 1
            joined = " ".join(_strip_comment(item) for item in items)
            shell.assign(array.group(1), shell.expand(joined.rsplit(")", 1)[0]), conditional=depth > 0)
            continue
        if _BLOCK_CLOSE.match(line):
            depth = max(0, depth - 1)
            continue
        opens = bool(_BLOCK_OPEN.match(line))
        in_block = depth > 0 or opens
        if opens and not _CLOSES_INLINE.search(line):
            depth += 1
        body_line = re.sub(r"^(if|elif|then|else|do)\s+", "", line) if _BLOCK_OPEN.match(line) else line
        body_line = re.sub(r"^(then|else|do)\s+", "", body_line)
        assign = _ASSIGN.match(body_line)
        if assign and not any(marker in body_line for marker in markers):
            value = assign.group(2)
            if "$(" in value or "`" in value:  # a command's output: not run, so never known
                shell.values[assign.group(1)] = value
                shell.ambiguous.add(assign.group(1))
            else:
                shell.assign(assign.group(1), _unquote(shell.expand(value)), conditional=in_block)
            continue
        expanded = shell.expand(body_line)
        for marker in markers:
            if marker in expanded:
                found.append((marker, _after(expanded, marker, name)))
                break
    if not found:
        return None
    marker, argv = found[0]
    notes = (
        (f"the script runs {len(found)} training commands; the first ({marker}) is read",)
        if len(found) > 1
        else ()
    )
    used = [v for v in shell.unresolved if any(_names(arg, v) for arg in argv)]
    return Command(marker, tuple(argv), tuple(used), shell.passes_args, notes)


def _names(arg: str, var: str) -> bool:
    bare = var.lstrip("$")
    return f"${bare}" in arg or f"${{{bare}" in arg


def _after(line: str, marker: str, name: str) -> list[str]:
    """The words after ``marker`` up to the first shell operator or redirection."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:
        raise InputError(f"--from {name}: cannot split the {marker} command: {e}") from None
    start = next((k for k, w in enumerate(words) if marker in w), len(words))
    out: list[str] = []
    for word in words[start + 1 :]:
        if word in _OPERATORS or _REDIRECT.match(word):
            break
        out.append(word)
    return out
