"""Hearth's known errors: a small hierarchy shared by every layer.

Known errors (bad input, a bad model file, a full queue) are ``HearthError`` subclasses; they are shown to the
person as one clear line (CLI), one dialog (UI) or OpenAI error JSON (server, mapped by *type*, never by message
text). Anything else is a bug and is logged with its traceback.

Every class is picklable (it crosses the engine process boundary): ``__reduce__`` rebuilds it from its
constructor arguments. ``store_error`` and ``open_store_db`` are the one place a SQLite store's failures (a
full disk, a damaged or empty file) become these errors, for every store above (docs/memory.md, "Store").
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import sqlite3


class HearthError(Exception):
    """Base of all known Hearth errors. ``str(err)`` is the message for a person."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self):  # picklable across processes with constructor args
        return (self.__class__, (self.message,))


class ModelLoadError(HearthError):
    """A model file cannot be used: not a GGUF, truncated, malformed metadata, unsupported architecture,
    a projector file, or llama.cpp refused it. ``path`` names the file. ``file_fault``: True when the file
    itself is known to cause it (its inspection failed), so loading it again fails the same way until it
    changes; False when the cause is elsewhere (disk full, memory, a cache), so the next try may succeed; None
    when not known (``ModelPool`` decides)."""

    def __init__(self, message: str, path: str | None = None, file_fault: bool | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.file_fault = file_fault

    def __reduce__(self):
        return (self.__class__, (self.message, self.path, self.file_fault))


class ContextLengthExceeded(HearthError):
    """The prompt (plus room for the answer) does not fit the context window.

    ``prompt_tokens``: tokens in the prompt; ``n_ctx``: the context size in tokens; ``max_tokens``: tokens
    reserved for the answer (0 when none was reserved); ``tools_tokens``: of the prompt, the tokens the tool
    definitions take (0 without tools); ``param``: the request field to blame, "messages", or "tools" when
    the prompt would fit without the tools."""

    def __init__(self, prompt_tokens: int, n_ctx: int, max_tokens: int = 0, tools_tokens: int = 0,
                 param: str = "messages") -> None:
        msg = (
            f"prompt is {prompt_tokens} tokens but the context window (n_ctx) is {n_ctx} tokens"
            + (f" and {max_tokens} tokens are reserved for the answer (max_tokens)" if max_tokens else "")
            + (f"; the tool definitions take {tools_tokens} of them" if tools_tokens else "")
            + ("; send fewer or shorter tools" if param == "tools" else "")
            + "; shorten the prompt, lower max_tokens or raise n_ctx"
        )
        super().__init__(msg)
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self.tools_tokens = tools_tokens
        self.param = param

    def __reduce__(self):
        return (self.__class__, (self.prompt_tokens, self.n_ctx, self.max_tokens, self.tools_tokens, self.param))


class InvalidRequest(HearthError):
    """A request parameter is out of range or malformed. ``param`` names it (OpenAI's ``param`` field)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self):
        return (self.__class__, (self.message, self.param))


class ModelNotFound(HearthError):
    """A model id or path names no known model. ``available`` lists the valid ids."""

    def __init__(self, model: str, available: list[str] | None = None) -> None:
        avail = list(available or [])
        super().__init__(
            f"model {model!r} not found; available: {', '.join(avail) if avail else '(none)'}"
        )
        self.model = model
        self.available = avail

    def __reduce__(self):
        return (self.__class__, (self.model, self.available))


class EngineCrashed(HearthError):
    """The engine process died (llama.cpp aborted, or it was killed). It restarts on the next request."""


class EngineUnresponsive(EngineCrashed):
    """The engine process stopped sending heartbeats (stopped or frozen) and was killed by the watchdog
    (docs/engine.md, "Watchdog"). A kind of ``EngineCrashed``: it restarts on the next request."""


class Cancelled(HearthError):
    """A request was cancelled by its caller before it finished."""


class QueueFull(HearthError):
    """Too many requests are waiting for the engine. ``retry_after_s``: a hint in seconds."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self):
        return (self.__class__, (self.message, self.retry_after_s))


class StoreError(HearthError):
    """A database (conversations, documents, cache index) cannot be read or written."""


class StoreDamaged(StoreError):
    """A database file is damaged, empty (0 bytes) or not a Hearth store; it was left untouched. ``path``: the
    file; ``reason``: what is wrong; ``fix``: the command that recovers it or moves it aside."""

    def __init__(self, path: str, reason: str, fix: str | None = None) -> None:
        q = shlex.quote(str(path))
        self.fix = fix or (f"sqlite3 {q} .recover | sqlite3 {shlex.quote(str(path) + '.recovered')}, then "
                           f"mv {q} {shlex.quote(str(path) + '.damaged')} and mv the .recovered file to {q}")
        super().__init__(f"cannot open {path}: {reason}; the file was left untouched. To recover it: {self.fix}")
        self.path, self.reason = str(path), reason

    def __reduce__(self):
        return (self.__class__, (self.path, self.reason, self.fix))


class DiskFull(StoreError):
    """A write failed because the disk holding ``path`` is full."""

    def __init__(self, path: str) -> None:
        super().__init__(f"disk full: {path} (free some space and try again)")
        self.path = str(path)

    def __reduce__(self):
        return (self.__class__, (self.path,))


_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 10, 11, 13, 26
LOW_SPACE_BYTES = 1 << 20  # an I/O error while less than this is free on the file's disk is a full disk


def store_error(exc: BaseException, path: str | os.PathLike, what: str = "database") -> StoreError:
    """The clear ``StoreError`` for a ``sqlite3.Error`` or ``OSError`` on the database ``path``: ``DiskFull``
    (SQLITE_FULL, ENOSPC, or an I/O error while the disk is all but full), ``StoreDamaged`` (a malformed
    file), else a ``StoreError`` naming ``what`` and the file."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc)
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or primary == _SQLITE_FULL \
            or "database or disk is full" in text:
        return DiskFull(str(path))
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or "malformed" in text or "not a database" in text:
        return StoreDamaged(str(path), text)
    if primary == _SQLITE_IOERR or isinstance(exc, OSError) or "disk I/O error" in text:
        try:
            if shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < LOW_SPACE_BYTES:
                return DiskFull(str(path))
        except OSError:
            pass
    if isinstance(exc, StoreError):
        return exc
    return StoreError(f"{what} {path}: {text}")


class IngestError(HearthError):
    """A document cannot be indexed. ``path``: the file; ``reason``: a short reason for a person."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):
        return (self.__class__, (self.path, self.reason))


_CHECKED: set[tuple] = set()  # files that passed ``open_store_db``'s check in this process, as they were then


def open_store_db(path: str | os.PathLike, what: str = "database") -> sqlite3.Connection:
    """A connection to the SQLite store ``path`` (created when absent), after checking that an existing file
    is one: not empty (0 bytes, and no write-ahead log), ``PRAGMA quick_check`` ok, and not tables without
    sqlite-utils' ``_sqlite_migrations`` record. A file that fails is left untouched: ``StoreDamaged`` names it
    and how to recover it (``DiskFull`` / ``StoreError`` for other failures, ``store_error``). A file is checked
    once per process while its size and mtime stay the same."""
    p = str(path)
    st, wal = (_stat(p), _stat(p + "-wal")) if p != ":memory:" else (None, None)
    if st is not None and st.st_size == 0 and (wal is None or wal.st_size == 0):
        raise StoreDamaged(p, "empty file (0 bytes) where a store is expected",
                           f"restore it from a backup, or move it aside to start an empty store: "
                           f"mv {shlex.quote(p)} {shlex.quote(p + '.empty')}")
    try:
        conn = sqlite3.connect(p, check_same_thread=False, timeout=10.0)
    except sqlite3.Error as exc:
        raise store_error(exc, p, what) from exc
    stamp = (os.path.realpath(p), st.st_ino, st.st_size, st.st_mtime_ns) if st is not None else None
    if stamp is None or stamp in _CHECKED:
        return conn
    try:
        _check(conn, p)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise store_error(exc, p, what) from exc
        raise
    _CHECKED.add(stamp)
    return conn


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _check(conn: sqlite3.Connection, path: str) -> None:
    bad = [r[0] for r in conn.execute("PRAGMA quick_check(5)").fetchall() if r[0] != "ok"]
    if bad:
        raise StoreDamaged(path, "damaged (quick_check: " + "; ".join(bad) + ")")
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if names and "_sqlite_migrations" not in names:
        raise StoreDamaged(path, "tables without the _sqlite_migrations record: not a Hearth store, or damaged")
