"""Atomic file writes: the one place Hearth replaces a file so that a reader never sees half of it.

Every write goes to a temporary file in the target's own folder (so the final rename never crosses a file
system), is flushed and fsynced, and then ``os.replace``-d over the target, which is atomic on POSIX and on
Windows. A process killed at any point leaves either the old file or the new one, never a mix; on an error the
temporary file is removed and the target is untouched. The folder entry itself is not fsynced: after an OS
crash or power loss the rename may be lost (the old file stays), which every caller tolerates (settings, a
hash cache, prefix-cache blobs indexed after the rename, models rebuilt when missing).

Top-level and dependency-free so that every layer, ``app.engine`` included, may import it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text"]


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
