"""Entries on disk and their SQLite index, within a byte budget (least recently used evicted first). Pure
Python: the engine passes payload bytes in and gets them back."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from app.engine.local.prefix_cache.entry import EntryError, decode_entry, encode_entry
from app.engine.local.prefix_cache.keys import PrefixHasher
from app.fileio import atomic_write_bytes

log = logging.getLogger("app.engine.local.prefix_cache")


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
    """Entries on disk + their SQLite index under ``root``, bounded by ``budget_bytes``. Pure Python (no
    llama.cpp): the engine passes payload bytes in and gets them back."""

    def __init__(self, root: str | Path, budget_bytes: int) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.budget = int(budget_bytes)
        # One connection shared by the engine's thread (lookups) and the cache's writer thread, under ``lock``.
        self.lock = threading.RLock()
        self.db = sqlite3.connect(str(self.root / "index.db"), timeout=30, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("""CREATE TABLE IF NOT EXISTS entries (
            fingerprint TEXT NOT NULL, prefix_hash TEXT NOT NULL, n_tokens INTEGER NOT NULL,
            file TEXT NOT NULL, size_bytes INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL,
            PRIMARY KEY (fingerprint, prefix_hash))""")
        self.db.execute("CREATE INDEX IF NOT EXISTS entries_lru ON entries(last_used)")
        self.stats = CacheStats()

    def total_bytes(self) -> int:
        with self.lock:
            return int(self.db.execute("SELECT COALESCE(SUM(size_bytes),0) FROM entries").fetchone()[0])

    def bytes_on_disk(self) -> int:
        """Sum of sizes of entry files actually present (for reports and budget tests)."""
        return sum(p.stat().st_size for p in self.root.glob("*/*.kv"))

    def candidates(self, fp: str, max_tokens: int) -> list[tuple[str, int, str]]:
        """(prefix_hash, n_tokens, file) of entries with at most ``max_tokens`` tokens, longest first."""
        with self.lock:
            return self.db.execute("SELECT prefix_hash, n_tokens, file FROM entries WHERE fingerprint=? AND "
                                   "n_tokens<=? ORDER BY n_tokens DESC", (fp, max_tokens)).fetchall()

    def find(self, fp: str, tokens: Sequence[int], min_tokens: int = 1) -> tuple[int, Path] | None:
        """Longest stored prefix of ``tokens`` (n_tokens ≥ min_tokens): (n_tokens, file) or None."""
        hasher = PrefixHasher(tokens)
        for h, n, f in self.candidates(fp, len(tokens)):
            if n < min_tokens:
                break
            if hasher.prefix_hash(n) == h:
                return n, self.root / f
        return None

    def contains(self, fp: str, tokens: Sequence[int]) -> bool:
        h = PrefixHasher(tokens).prefix_hash(len(tokens))
        with self.lock:
            return self.db.execute("SELECT 1 FROM entries WHERE fingerprint=? AND prefix_hash=?",
                                   (fp, h)).fetchone() is not None

    def read(self, fp: str, tokens: Sequence[int], n: int, path: Path) -> bytes:
        """Payload of the entry for ``tokens[:n]``; a bad entry is quarantined and ``EntryError`` raised."""
        try:
            data = path.read_bytes()
            payload = decode_entry(data, fp, tokens[:n])
        except (OSError, EntryError) as exc:
            self.quarantine(path, str(exc))
            raise EntryError(str(exc)) from None
        with self.lock:
            self.db.execute("UPDATE entries SET last_used=? WHERE file=?", (time.time(), self._rel(path)))
        return payload

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
                self.db.execute("DELETE FROM entries WHERE file=?", (self._rel(path),))
        except ValueError:
            pass

    def write(self, fp: str, tokens: Sequence[int], payload: bytes) -> Path | None:
        """Store an entry for exactly ``tokens``; evicts LRU entries to stay within the budget. Returns the
        file, or None when the entry alone is larger than the budget."""
        blob = encode_entry(fp, tokens, payload)
        size = len(blob)
        if size > self.budget:
            self.stats.skipped_too_large += 1
            log.warning("prefix cache: entry of %d bytes exceeds the budget of %d bytes; not stored", size,
                        self.budget)
            return None
        h = PrefixHasher(tokens).prefix_hash(len(tokens))
        folder = self.root / fp[:16]
        folder.mkdir(exist_ok=True)
        path = folder / f"{h}.kv"
        # The index is locked while room is made and while the row goes in, not during the file's write and
        # fsync (lookups go on meanwhile; only one thread writes, so the room made stays free).
        with self.lock:
            self._transaction(lambda: self._evict_for(size))
        atomic_write_bytes(path, blob)
        now = time.time()
        with self.lock:
            self._transaction(lambda: self.db.execute("INSERT OR REPLACE INTO entries VALUES (?,?,?,?,?,?,?)",
                                                      (fp, h, len(tokens), self._rel(path), size, now, now)))
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
            row = self.db.execute("SELECT file, size_bytes FROM entries ORDER BY last_used ASC LIMIT 1").fetchone()
            if row is None:
                break
            (self.root / row[0]).unlink(missing_ok=True)
            self.db.execute("DELETE FROM entries WHERE file=?", (row[0],))
            total -= row[1]
            self.stats.evicted += 1

    def close(self) -> None:
        with self.lock:
            self.db.close()
