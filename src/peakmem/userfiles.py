"""Every file the user names is read here, within bounds: config.json, ``--from`` documents, memory
snapshots, memory_stats and measure JSON, calibration profiles. One rule for all of them, and every
way a file can break it is one :class:`~peakmem.errors.InputError` (exit 2) naming the file and why:

1. **Regular files only.** The path is stat'ed first: a FIFO (``mkfifo``; reading it blocks until a
   writer comes), a device (``/dev/zero`` never ends), a folder or a socket is refused before anything
   is opened. The file is then opened with ``O_NONBLOCK`` (a FIFO swapped in after the stat cannot
   block the open) and checked again on the open descriptor.
2. **A size cap read incrementally.** ``st_size`` only refuses early; the read itself stops after
   ``cap + 1`` bytes, in chunks (a file that grows while it is read, a file whose ``st_size`` lies).
3. **Decompression capped as it streams** (:class:`CappedStream`): a gzip snapshot is inflated in
   chunks as its reader asks for them, never more than the cap in all, and no single request larger
   than one object of that format can be (a pickle asking for a 4 GB string is not a snapshot).
4. **JSON** (and **TOML**) nesting beyond the interpreter's recursion limit is an error, not a
   RecursionError.
5. **YAML** is composed (PyYAML's node graph, where an alias is a second reference to its anchor's
   node) and its *expanded* size is counted before anything is built: the 295-byte "billion laughs"
   (9 anchors, each 9 aliases of the one before) expands to 9^9 nodes and is refused in milliseconds;
   an alias cycle is refused too. Real training configs are a few hundred nodes.

The limits of each format (how large a config.json or a snapshot can be) stay with the module that
knows the format; this module holds the rule.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
from typing import Any, BinaryIO, Protocol

from peakmem.errors import InputError, MissingExtraError

READ_CHUNK_BYTES = 1 << 20  # read (and inflate) 1 MiB at a time
MAX_YAML_NODES = 100_000  # values YAML aliases may add (counted each time); configs have ~10^2-10^3 in all
FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def shown_name(path: str | os.PathLike[str], label: str = "") -> str:
    """How an error names the file: ``--from x.yaml`` or the path itself."""
    return f"{label} {path}" if label else str(path)


def _kind(mode: int) -> str:
    for test, kind in FILE_KINDS:
        if test(mode):
            return kind
    return "not a regular file"


def _refuse_irregular(mode: int, name: str, what: str, error: type[InputError]) -> None:
    if not stat.S_ISREG(mode):
        raise error(f"{name}: {_kind(mode)}, not {what} (only a regular file is read)")


def open_user_file(
    path: str | os.PathLike[str], *, what: str, label: str = "", error: type[InputError] = InputError
) -> BinaryIO:
    """The regular file at ``path``, open for binary reading (rule 1); the caller closes it."""
    name = shown_name(path, label)
    try:
        _refuse_irregular(os.stat(path).st_mode, name, what, error)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise error(f"{name}: no such file") from None
    except NotADirectoryError:
        raise error(f"{name}: no such file (a part of the path is not a folder)") from None
    except OSError as e:
        raise error(f"{name}: cannot read it ({e.strerror or e})") from None
    try:
        _refuse_irregular(os.fstat(fd).st_mode, name, what, error)  # swapped in after the stat
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_user_file(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int,
    label: str = "",
    error: type[InputError] = InputError,
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` (rules 1 and 2); every failure is
    ``error`` naming the file (``label``: how it was given, e.g. ``--from``) and ``what`` was expected."""
    name = shown_name(path, label)

    def too_large(size: str) -> InputError:
        return error(f"{name}: {size} bytes is too large for {what} (at most {max_bytes:,})")

    with open_user_file(path, what=what, label=label, error=error) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise too_large(f"{size:,}")
        chunks: list[bytes] = []
        got = 0
        try:
            while got <= max_bytes:
                chunk = fh.read(min(READ_CHUNK_BYTES, max_bytes + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as e:
            raise error(f"{name}: cannot read it ({e.strerror or e})") from None
    if got > max_bytes:
        raise too_large(f"more than {max_bytes:,}")
    return b"".join(chunks)


def decode_text(data: bytes, name: str, what: str, error: type[InputError] = InputError) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{name}: not UTF-8 text ({e.reason} at byte {e.start:,}); expected {what}") from None


def read_user_text(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_bytes: int,
    label: str = "",
    error: type[InputError] = InputError,
) -> str:
    """:func:`read_user_file` decoded as UTF-8; other bytes are ``error`` naming the file."""
    data = read_user_file(path, what=what, max_bytes=max_bytes, label=label, error=error)
    return decode_text(data, shown_name(path, label), what, error)


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """``path`` names a regular file (following links); never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


# --- streams -----------------------------------------------------------------------------------------
class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class CappedStream(io.RawIOBase):
    """``source`` read through a cap (rule 3): more than ``max_bytes`` in all (``note``: why that many),
    or one request for more than ``max_request`` bytes, raises ``error`` naming the file; reads go at
    most ``READ_CHUNK_BYTES`` at a time into the source, so a compressed source inflates only what is
    asked for."""

    def __init__(
        self,
        source: Readable,
        *,
        name: str,
        what: str,
        max_bytes: int,
        max_request: int,
        note: str = "",
        error: type[InputError] = InputError,
    ) -> None:
        super().__init__()
        self._source, self._name, self._what, self._note = source, name, what, note
        self._max_bytes, self._max_request, self._error = max_bytes, max_request, error
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def _check(self, n: int) -> None:
        if n > self._max_request:
            raise self._error(f"{self._name}: asks for one object of {n:,} bytes; {self._what} holds "
                              f"none over {self._max_request:,}")  # fmt: skip
        if self.bytes_read + n > self._max_bytes:
            raise self._error(f"{self._name}: unpacks to more than {self._max_bytes:,} bytes{self._note}; "
                              f"too large for {self._what}")  # fmt: skip

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:  # all that is left, as far as the cap allows
            size = self._max_bytes + 1 - self.bytes_read
        else:
            self._check(size)
        out = bytearray()
        while len(out) < size:
            chunk = self._source.read(min(READ_CHUNK_BYTES, size - len(out)))
            if not chunk:
                break
            out += chunk
        self.bytes_read += len(out)
        self._check(0)
        return bytes(out)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readline(self, size: int | None = -1) -> bytes:
        limit = self._max_request if size is None or size < 0 else min(size, self._max_request)
        out = bytearray()
        while len(out) < limit:
            ch = self.read(1)
            if not ch:
                break
            out += ch
            if ch == b"\n":
                break
        return bytes(out)


# --- parsers -----------------------------------------------------------------------------------------
def parse_json(text: str | bytes) -> Any:
    """``json.loads``, with nesting too deep for the interpreter turned into a JSONDecodeError-like
    ValueError (rule 4): callers catch ValueError and name the file."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


_TOML_WHERE = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def parse_toml(text: str, name: str) -> dict[str, Any]:
    """A TOML document (Python 3.11+'s ``tomllib``, else the ``tomli`` package it came from); a syntax
    error is one line naming ``name``, the line and the column; nesting too deep is an error (rule 4).
    TOML has no aliases: its parsed size is bounded by the text, whose size the reader caps."""
    try:
        import tomllib as toml
    except ImportError:  # Python 3.10
        try:
            import tomli as toml  # type: ignore[no-redef,import-not-found,unused-ignore]
        except ImportError:
            raise InputError(f"{name}: reading TOML needs Python 3.11 or later (tomllib) or the "
                             "tomli package") from None  # fmt: skip
    try:
        doc: dict[str, Any] = toml.loads(text)
    except toml.TOMLDecodeError as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = _TOML_WHERE.search(message)
        if where is not None:
            message = message[: where.start()]
            raise InputError(
                f"{name}: invalid TOML at line {where[1]}, column {where[2]}: {message}"
            ) from None
        raise InputError(f"{name}: invalid TOML: {message}") from None
    except RecursionError:
        raise InputError(f"{name}: TOML nested too deeply") from None
    return doc


def parse_yaml(text: str, name: str, command: str = "train --from FILE.yaml") -> Any:
    """A YAML document, its expanded size counted before it is built (rule 5); errors name ``name``."""
    try:
        import yaml
    except ImportError:
        raise MissingExtraError(command, "yaml", "pyyaml") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return None
        _check_yaml_size(node, name)
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"{name}: invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise InputError(f"{name}: YAML nested too deeply") from None


def _check_yaml_size(root: Any, name: str) -> None:
    """The nodes a full walk of ``root`` visits, aliases counted each time, without walking it: one pass
    over the distinct nodes (children before parents), each node's size the sum of its children's."""
    import yaml

    def children(node: Any) -> list[Any]:
        if isinstance(node, yaml.SequenceNode):
            return list(node.value)
        if isinstance(node, yaml.MappingNode):
            return [part for pair in node.value for part in pair]
        return []

    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children(node))
            continue
        if key in size:
            continue
        if key in on_path:
            raise InputError(f"{name}: a YAML alias refers to a value that contains it (a cycle)")
        on_path.add(key)
        stack.append((node, True))
        for child in children(node):
            if id(child) in on_path:
                raise InputError(f"{name}: a YAML alias refers to a value that contains it (a cycle)")
            if id(child) not in size:
                stack.append((child, False))
    if size[id(root)] > len(size) + MAX_YAML_NODES:  # a document without aliases is never refused
        raise InputError(f"{name}: its YAML aliases expand to {size[id(root)]:,} values (an alias bomb?); "
                         f"at most {MAX_YAML_NODES:,} more than it writes out are read")  # fmt: skip


__all__ = [
    "CappedStream",
    "is_regular_file",
    "open_user_file",
    "parse_json",
    "parse_toml",
    "parse_yaml",
    "read_user_file",
    "read_user_text",
    "shown_name",
]
