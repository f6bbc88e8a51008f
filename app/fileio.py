"""Atomic file writes: the one place Hearth replaces a file so that a reader never sees half of it; and the one
reader of Hearth's JSON config files (``read_json_file``), with the one way a damaged file is kept
(``set_aside``).

Every write goes to a temporary file in the target's own folder (so the final rename never crosses a file
system), is flushed and fsynced, and then ``os.replace``-d over the target, which is atomic on POSIX and on
Windows. A process killed at any point leaves either the old file or the new one, never a mix; on an error the
temporary file is removed and the target is untouched. The folder entry itself is not fsynced: after an OS
crash or power loss the rename may be lost (the old file stays), which every caller tolerates (settings, a
hash cache, prefix-cache blobs indexed after the rename, models rebuilt when missing).

A config file a person may edit, or a crash may cut (``settings.json``, ``mcp.json``), is read by
``read_json_file``: whatever its bytes, it returns the data or raises ``JsonFileError`` naming the file, the
problem and where; never ``RecursionError`` nor ``UnicodeDecodeError`` (docs/doctor.md, 'Damaged settings.json
or mcp.json').

Top-level and dependency-free so that every layer, ``app.engine`` included, may import it.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "JsonFileError", "atomic_path", "atomic_write_bytes", "atomic_write_text",
           "lone_surrogate", "read_json_file", "set_aside"]

MAX_JSON_DEPTH = 64  # nesting levels a config file may have; Hearth writes at most 5
# A JSON string (an unterminated one runs to the end) or a bracket outside strings: enough to count nesting
# without parsing, so nothing recurses on a hostile file.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)
_SURROGATE = re.compile("[\ud800-\udfff]")


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, prefix: str | None = None,
                temp_name: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block ends without an exception the temporary file is
    fsynced and renamed over ``path``, otherwise it is deleted (``BaseException`` included: Ctrl+C too).

    For writers that take a path (a model assembler, a converter, a streamed download). ``temp_name`` gives the
    temporary file a fixed name in the same folder (a large download left by a killed run is then overwritten
    by the next try instead of piling up); by default it gets a unique name (``mkstemp``, ``prefix`` + random +
    ``.tmp``), safe when several processes write the same target at once. The yielded file exists (empty) with
    a unique name, and may not exist yet with a fixed one; the writer may create or truncate it.

    Raises ``OSError`` when the folder is not writable, or the file cannot be fsynced or renamed; whatever the
    writer raises passes through unchanged."""
    target = Path(path)
    if temp_name is not None:
        tmp = target.with_name(temp_name)
    else:
        fd, name = tempfile.mkstemp(dir=str(target.parent), prefix=prefix or f".{target.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "r+b") as f:  # r+ : Windows cannot fsync a handle opened read-only
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, prefix: str | None = None) -> None:
    """Replace the file at ``path`` with ``data`` atomically (see the module docstring); the folder must exist.
    ``prefix`` names the temporary file (default ``.<name>.``). Raises ``OSError`` when the write fails, and
    then ``path`` is unchanged."""
    with atomic_path(path, prefix=prefix) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8",
                      prefix: str | None = None) -> None:
    """``atomic_write_bytes`` of ``text`` encoded with ``encoding`` (UTF-8 by default; newlines written as
    given, never translated). Raises ``OSError`` as it does, ``UnicodeEncodeError`` before touching disk."""
    atomic_write_bytes(path, text.encode(encoding), prefix=prefix)


class JsonFileError(ValueError):
    """A JSON config file cannot be used. ``path``: the file; ``problem``: what is wrong, for a person;
    ``line``, ``column``: where (1-based; None when the whole file is at fault). ``str()`` says all three."""

    def __init__(self, path: str, problem: str, line: int | None = None, column: int | None = None) -> None:
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"{path}: {problem}{where}")
        self.path, self.problem, self.line, self.column = path, problem, line, column

    def __reduce__(self):
        return (self.__class__, (self.path, self.problem, self.line, self.column))


def read_json_file(path: str | os.PathLike[str], *, max_depth: int = MAX_JSON_DEPTH,
                   object_only: bool = True) -> Any:
    """The JSON value in the file at ``path`` (a dict when ``object_only``). Raises ``JsonFileError`` when the
    file is empty, not UTF-8 (cut inside a character, another encoding), nested deeper than ``max_depth``
    (checked before parsing, without recursion), not valid JSON (cut short or mistyped), holds a lone
    surrogate (``\\ud800`` without its pair: not text, it could not be written back), or is not an object
    when ``object_only``; ``FileNotFoundError`` / ``OSError`` when it cannot be read. A UTF-8 byte order
    mark is allowed."""
    p = Path(path)
    raw = p.read_bytes()
    text = _decode(str(p), raw)
    if not text.strip():
        raise JsonFileError(str(p), "the file is empty (it may have been cut short)")
    deep = _too_deep(text, max_depth)
    if deep is not None:
        line, column = _line_column(text, deep)
        raise JsonFileError(str(p), f"nested deeper than {max_depth} levels", line, column)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        cut = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string")
        hint = "; the file ends too early, as one cut short does" if cut else ""
        raise JsonFileError(str(p), f"not valid JSON ({e.msg}{hint})", e.lineno, e.colno) from None
    except RecursionError:  # not reached after _too_deep; kept so that no file can stop a command
        raise JsonFileError(str(p), "nested too deeply") from None
    bad = lone_surrogate(data)
    if bad is not None:
        raise JsonFileError(str(p), f"{bad} holds a lone surrogate (a \\ud800-\\udfff escape without its "
                                    "pair), which is not text")
    if object_only and not isinstance(data, dict):
        raise JsonFileError(str(p), f"the file must hold a JSON object ({{...}}), not {_json_kind(data)}")
    return data


def set_aside(path: str | os.PathLike[str], tag: str = "corrupt") -> Path:
    """Rename the file at ``path`` to ``<name>.<tag>-<UTC time>`` in its folder (``-2``, ``-3``... when that
    name is taken), so that a damaged file is kept rather than written over; returns the new path. Raises
    ``OSError`` when the rename fails (the file then stays where it was)."""
    p = Path(path)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target, n = p.with_name(f"{p.name}.{tag}-{stamp}"), 2
    while target.exists():
        target, n = p.with_name(f"{p.name}.{tag}-{stamp}-{n}"), n + 1
    os.replace(p, target)
    return target


def _decode(path: str, raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        if e.reason == "unexpected end of data":
            problem = "the file was cut short: it ends inside a UTF-8 character"
        else:
            problem = f"not UTF-8 text (byte 0x{raw[e.start]:02x}; was it saved in another encoding?)"
        raise JsonFileError(path, problem, line, column) from None
    return text[1:] if text.startswith("\ufeff") else text


def _too_deep(text: str, max_depth: int) -> int | None:
    """The offset of the first bracket nested deeper than ``max_depth`` outside strings, or None."""
    depth = 0
    for m in _JSON_TOKENS.finditer(text):
        c = m.group()
        if c == "[" or c == "{":
            depth += 1
            if depth > max_depth:
                return m.start()
        elif c == "]" or c == "}":
            depth -= 1  # below 0 only in a file json.loads refuses before it nests
    return None


def _line_column(text: str, pos: int) -> tuple[int, int]:
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1


def lone_surrogate(data: Any) -> str | None:
    """Where the first string or key holding a lone surrogate is (``a.b[2]``), or None (depth is bounded)."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return where or "the top-level string"
        elif isinstance(value, dict):
            items = []
            for k, v in value.items():
                at = f"{where}.{_shown(k)}" if where else _shown(k)
                if _SURROGATE.search(k):
                    return f"the key {at}"
                items.append((v, at))
            stack.extend(reversed(items))
        elif isinstance(value, list):
            stack.extend(reversed([(v, f"{where}[{i}]") for i, v in enumerate(value)]))
    return None


def _shown(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_kind(v: Any) -> str:
    return {list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(type(v), "a number")
