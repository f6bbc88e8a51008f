"""Segments on disk and their SQLite index, within a byte budget (least recently used evicted first, the deepest
chunk first among equals). Each segment is stored once, whoever shares it. Pure Python: the engine passes
payload bytes in and gets them back."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from app.engine.local.prefix_cache.entry import (
    HEADER_SIZE,
    EntryError,
    decode_segment,
    encode_segment,
    segment_header,
)
from app.errors import StoreDamaged, store_error
from app.fileio import atomic_write_bytes

log = logging.getLogger("app.engine.local.prefix_cache")

_SQL_VARS = 500  # keys per ``IN (...)`` query (SQLite's default limit is 999 variables)


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    restores: int = 0
    restore_s: float = 0.0
    saves: int = 0
    rejected: int = 0
    evicted: int = 0
    skipped_too_large: int = 0


class PrefixStore:
    """Segment files + their SQLite index under ``root``, bounded by ``budget_bytes`` (the sum of the files'
    sizes). Files: ``root/<fingerprint[:16]>/<key>.seg``; index: ``root/index.db`` (WAL). An index of the
    format before segments (one file per prompt) is dropped with its files when it opens. A damaged index
    (not a database, or failing ``PRAGMA quick_check``) is moved to ``root/quarantine/`` and rebuilt from the
    segment files' headers (``rebuilt`` says why); any other failure to open (full disk, no permission) raises
    ``OSError`` / ``sqlite3.Error`` for ``PrefixCache`` to turn itself off."""

    def __init__(self, root: str | Path, budget_bytes: int) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.budget = int(budget_bytes)
        # One connection shared by the engine's thread (lookups) and the cache's writer thread, under ``lock``.
        self.lock = threading.RLock()
        self.rebuilt: str | None = None
        self.stats = CacheStats()
        try:
            self.db = self._connect()
        except sqlite3.DatabaseError as exc:
            if not isinstance(store_error(exc, self.index_path), StoreDamaged):
                raise  # full, read-only, locked: not the file's fault; the caller turns the cache off
            self._set_aside(str(exc))
            self.db = self._connect()
        self._drop_old_format()
        self.db.execute("""CREATE TABLE IF NOT EXISTS segments (
            fingerprint TEXT NOT NULL, key TEXT NOT NULL, start INTEGER NOT NULL, "end" INTEGER NOT NULL,
            file TEXT NOT NULL, size_bytes INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL,
            PRIMARY KEY (fingerprint, key))""")
        self.db.execute('CREATE INDEX IF NOT EXISTS segments_lru ON segments(last_used, "end" DESC)')
        if self.rebuilt:
            self._reindex()

    @property
    def index_path(self) -> Path:
        """The SQLite index, ``root/index.db``."""
        return self.root / "index.db"

    def _connect(self) -> sqlite3.Connection:
        """The index's connection, after ``PRAGMA quick_check`` (a damaged file raises ``DatabaseError``)."""
        db = sqlite3.connect(str(self.index_path), timeout=30, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            bad = [r[0] for r in db.execute("PRAGMA quick_check(1)").fetchall() if r[0] != "ok"]
            if bad:
                raise sqlite3.DatabaseError(f"database disk image is malformed (quick_check: {bad[0]})")
        except BaseException:
            db.close()
            raise
        return db

    def _set_aside(self, why: str) -> None:
        """Move a damaged index (with its WAL files) to ``quarantine/``; ``_reindex`` rebuilds it."""
        qdir = self.root / "quarantine"
        qdir.mkdir(exist_ok=True)
        stamp = int(time.time() * 1000)
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.index_path) + suffix)
            if src.exists():
                src.replace(qdir / f"{stamp}-index.db{suffix}")
        self.rebuilt = f"index.db was damaged ({why}); moved to quarantine/{stamp}-index.db and rebuilt"
        log.warning("prefix cache: %s", self.rebuilt)

    def _reindex(self) -> None:
        """Index every readable segment file again (its header names it); a file that is none is removed."""
        rows = []
        for path in self.root.glob("*/*.seg"):
            try:
                with open(path, "rb") as f:
                    fp, key, start, end = segment_header(f.read(HEADER_SIZE))
                st = path.stat()
            except (OSError, EntryError):
                path.unlink(missing_ok=True)
                continue
            if path != self.path_for(fp, key):
                path.unlink(missing_ok=True)
                continue
            rows.append((fp, key, start, end, self._rel(path), st.st_size, st.st_mtime, st.st_mtime))
        with self.lock:
            self._transaction(lambda: self.db.executemany("INSERT OR REPLACE INTO segments VALUES (?,?,?,?,?,?,?,?)",
                                                          rows))

    def _drop_old_format(self) -> None:
        """Remove the one-file-per-prompt entries of format 1 (never restored again: their fingerprint differs)."""
        if self.db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='entries'").fetchone() is None:
            return
        for (f,) in self.db.execute("SELECT file FROM entries").fetchall():
            (self.root / f).unlink(missing_ok=True)
        self.db.execute("DROP TABLE entries")
        log.info("prefix cache: removed the entries of the previous format")

    def total_bytes(self) -> int:
        with self.lock:
            return int(self.db.execute("SELECT COALESCE(SUM(size_bytes),0) FROM segments").fetchone()[0])

    def count(self) -> int:
        """Segments stored (every fingerprint)."""
        with self.lock:
            return int(self.db.execute("SELECT COUNT(*) FROM segments").fetchone()[0])

    def bytes_on_disk(self) -> int:
        """Sum of sizes of segment files actually present (for reports and budget tests)."""
        return sum(p.stat().st_size for p in self.root.glob("*/*.seg"))

    def present(self, fp: str, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are stored for ``fp``."""
        found: set[str] = set()
        with self.lock:
            for i in range(0, len(keys), _SQL_VARS):
                part = list(keys[i:i + _SQL_VARS])
                q = f"SELECT key FROM segments WHERE fingerprint=? AND key IN ({','.join('?' * len(part))})"
                found.update(k for (k,) in self.db.execute(q, [fp, *part]))
        return found

    def run(self, fp: str, keys: Sequence[str]) -> int:
        """How many of ``keys`` (a prompt's chunks in order) are stored from the first on, without a gap."""
        have = self.present(fp, keys)
        n = 0
        while n < len(keys) and keys[n] in have:
            n += 1
        return n

    def path_for(self, fp: str, key: str) -> Path:
        return self.root / fp[:16] / f"{key}.seg"

    def read(self, fp: str, key: str, start: int, tokens: Sequence[int]) -> tuple[dict, memoryview]:
        """The shape and payload of the segment ``key`` (``tokens``: the chunk's own, from ``start``); a bad file
        is quarantined and ``EntryError`` raised."""
        path = self.path_for(fp, key)
        try:
            return decode_segment(path.read_bytes(), fp, key, start, tokens)
        except (OSError, EntryError) as exc:
            self.quarantine(path, str(exc))
            raise EntryError(str(exc)) from None

    def touch(self, fp: str, keys: Sequence[str]) -> None:
        """Mark ``keys`` used now (one time for all: among equals the deepest chunk is evicted first)."""
        now = time.time()
        with self.lock:
            for i in range(0, len(keys), _SQL_VARS):
                part = list(keys[i:i + _SQL_VARS])
                self.db.execute(f"UPDATE segments SET last_used=? WHERE fingerprint=? AND key IN "
                                f"({','.join('?' * len(part))})", [now, fp, *part])

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def quarantine(self, path: Path, reason: str) -> None:
        self.stats.rejected += 1
        qdir = self.root / "quarantine"
        qdir.mkdir(exist_ok=True)
        log.warning("prefix cache: rejected %s (%s); moved to quarantine", path.name, reason)
        try:
            shutil.move(str(path), str(qdir / f"{int(time.time() * 1000)}-{path.name}"))
        except OSError:
            path.unlink(missing_ok=True)
        try:
            with self.lock:
                self.db.execute("DELETE FROM segments WHERE file=?", (self._rel(path),))
        except (ValueError, sqlite3.Error):
            pass

    def write(self, fp: str, key: str, start: int, tokens: Sequence[int], shape: dict[str, Any],
              payload: bytes | memoryview) -> Path | None:
        """Store the segment ``key`` (positions ``start`` … ``start + len(tokens)``) unless it is stored already;
        evicts least recently used segments to stay within the budget. Returns the file, or None when the
        segment alone is larger than the budget."""
        path = self.path_for(fp, key)
        with self.lock:
            if self.db.execute("SELECT 1 FROM segments WHERE fingerprint=? AND key=?", (fp, key)).fetchone():
                return path
        blob = encode_segment(fp, key, start, tokens, shape, payload)
        size = len(blob)
        if size > self.budget:
            self.stats.skipped_too_large += 1
            log.warning("prefix cache: a segment of %d bytes exceeds the budget of %d bytes; not stored", size,
                        self.budget)
            return None
        path.parent.mkdir(exist_ok=True)
        # The index is locked while room is made and while the row goes in, not during the file's write and
        # fsync (lookups go on meanwhile; only one thread writes, so the room made stays free).
        with self.lock:
            self._transaction(lambda: self._evict_for(size))
        atomic_write_bytes(path, blob)
        now = time.time()
        row = (fp, key, start, start + len(tokens), self._rel(path), size, now, now)
        with self.lock:
            self._transaction(lambda: self.db.execute("INSERT OR REPLACE INTO segments VALUES (?,?,?,?,?,?,?,?)",
                                                      row))
            self.stats.saves += 1
        return path

    def _transaction(self, fn: Any) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            fn()
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _evict_for(self, size: int) -> None:
        total = self.total_bytes()
        while total + size > self.budget:
            row = self.db.execute('SELECT file, size_bytes FROM segments ORDER BY last_used ASC, "end" DESC '
                                  "LIMIT 1").fetchone()
            if row is None:
                break
            (self.root / row[0]).unlink(missing_ok=True)
            self.db.execute("DELETE FROM segments WHERE file=?", (row[0],))
            total -= row[1]
            self.stats.evicted += 1

    def close(self) -> None:
        with self.lock:
            self.db.close()
