"""The engine side of the prefix cache (inside the engine process, next to the ``Llama``): restore the stored
chunks a prompt shares with anything saved before, and save a slot's chunks off the request's path through a
writer thread (docs/prefix-cache.md)."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from app.engine.local.prefix_cache.entry import EntryError
from app.engine.local.prefix_cache.keys import fingerprint, segment_keys
from app.engine.local.prefix_cache.segments import assemble, read_stream, segment_payload
from app.engine.local.prefix_cache.store import CacheStats, PrefixStore
from app.errors import DiskFull, StoreDamaged, store_error

log = logging.getLogger("app.engine.local.prefix_cache")

MAX_PENDING_BYTES = 256 << 20  # captured segments waiting for the writer thread at most (bytes)
RETRY_S = 300.0  # a cache that turned itself off is tried again after this many seconds
FACTS_FILE = "engine-facts.json"  # measurements about an engine, by fingerprint (``recall``, ``remember``)


class PrefixCache:
    """Restores and saves the KV of a ``Runtime``'s slots as segments (one per chunk of the canonical layout)
    through a ``PrefixStore``.

    ``min_tokens``: prompts shorter than this are not looked up on disk and slots holding fewer are not saved
    (the live KV cache already covers short repeats; a disk write costs more than their prefill).

    The cache is disposable: when its store cannot be opened, read or written (full disk, no permission, an
    index that fails), it turns itself off with a warning (``off``: the reason, in ``stats()['disk_cache']``)
    and generation goes on without it; ``reopen`` (``() -> (PrefixStore, fingerprint, info)``) is tried again
    at the first use ``retry_s`` seconds later.
    """

    def __init__(self, store: PrefixStore | None, fp: str, fp_info: dict, min_tokens: int = 256, *,
                 reopen: Callable[[], tuple[PrefixStore, str, dict]] | None = None, retry_s: float = RETRY_S,
                 clock: Callable[[], float] = time.monotonic, where: str | Path = "kv-cache") -> None:
        self.store: PrefixStore | None = store
        self.where = Path(where)  # the cache's folder, named in ``off``
        self.fp = fp
        self.fp_info = fp_info
        self.min_tokens = min_tokens
        self.off: str | None = None if store is not None else "not opened"
        self._stats = store.stats if store is not None else CacheStats()
        self._reopen, self.retry_s, self._clock = reopen, retry_s, clock
        self._retry_at = 0.0
        # key -> (start, tokens, shape, payload): captured, not yet on disk (under ``_idle``); restores use them
        self._pending: dict[str, tuple[int, list[int], dict, bytes]] = {}
        self._pending_bytes = 0
        self._idle = threading.Condition()
        self._queue: "queue.Queue[str | None]" = queue.Queue()
        self._writer: threading.Thread | None = None

    @classmethod
    def for_runtime(cls, model_path: str, settings: Any, dir: str, budget_bytes: int = 4 << 30,
                    min_tokens: int = 256, retry_s: float = RETRY_S) -> "PrefixCache":
        """The cache of the model at ``model_path`` loaded with ``settings``, stored under ``dir``. Never raises
        for the cache's own trouble: it comes back off (``off`` says why) and is tried again later."""
        known: list[tuple[str, dict]] = []  # the fingerprint, computed once (hashing a model takes seconds)

        def reopen() -> tuple[PrefixStore, str, dict]:
            from app.catalog.gguf import file_sha256

            if not known:
                known.append(fingerprint(file_sha256(model_path), settings))
            return PrefixStore(dir, budget_bytes), *known[0]

        cache = cls(None, "", {}, min_tokens, reopen=reopen, retry_s=retry_s, where=dir)
        cache._open()
        return cache

    def _open(self) -> bool:
        """Try to (re)open the store; True when the cache is on."""
        if self._reopen is None:
            return False
        try:
            store, self.fp, self.fp_info = self._reopen()
        except (OSError, sqlite3.Error, EntryError) as exc:
            self._turn_off(exc)
            return False
        store.stats = self._stats
        self.store, self.off = store, None
        if store.rebuilt:
            log.warning("prefix cache: %s", store.rebuilt)
        return True

    def _usable(self) -> PrefixStore | None:
        """The store while the cache is on; when off, one more try once ``retry_s`` has passed."""
        if self.store is None and self._reopen is not None and self._clock() >= self._retry_at:
            self._open()
        return self.store

    def _turn_off(self, exc: BaseException, metrics: dict | None = None) -> None:
        """Stop using the store after ``exc`` (logged, ``off`` and ``stats()['disk_cache']`` say why); it is
        tried again after ``retry_s`` seconds."""
        store, self.store = self.store, None
        err = store_error(exc, self.where, "prefix cache")
        if isinstance(err, StoreDamaged):
            self.off = f"{self.where / 'index.db'} is damaged ({err.reason}); it is rebuilt at the next try"
        elif isinstance(err, DiskFull) or str(self.where) in str(exc):
            self.off = str(err) if isinstance(err, DiskFull) else str(exc)
        else:
            self.off = f"{self.where}: {exc}"
        self._retry_at = self._clock() + self.retry_s
        log.warning("prefix cache off (generation goes on without it; tried again in %.0f s): %s", self.retry_s,
                    self.off)
        if metrics is not None:
            metrics["cache_error"] = f"disk cache off: {self.off}"
        if store is not None:
            try:
                store.close()
            except (sqlite3.Error, OSError):
                pass

    def recall(self, name: str) -> Any:
        """A measurement about this engine (``name``, e.g. ``Runtime._probe_at_load``'s) stored beside the
        cache under its fingerprint by ``remember``; None when none is (or the file is unreadable)."""
        try:
            facts = json.loads((self.where / FACTS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        mine = facts.get(self.fp) if isinstance(facts, dict) and self.fp else None
        return mine.get(name) if isinstance(mine, dict) else None

    def remember(self, name: str, value: Any) -> None:
        """Store ``value`` (JSON) as ``name`` under this engine's fingerprint, beside the cache (written whole
        to a temporary file, then renamed: a crash leaves the old file). A failure is logged, never raised: the
        measurement is taken again at the next start."""
        if not self.fp:
            return
        path = self.where / FACTS_FILE
        try:
            facts = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            facts = {}
        facts = facts if isinstance(facts, dict) else {}
        facts.setdefault(self.fp, {})[name] = value
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(facts, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("prefix cache: could not store %s in %s: %s", name, path, exc)

    # called by Runtime._reuse
    def restore_longest(self, rt: Any, slot: Any, tokens: list[int], live: int, metrics: dict,
                        bounds: list[int] | None = None) -> int:
        """Restore the stored chunks of ``tokens``' layout (``bounds``, ``rt.layout``) from the first on, if they
        give back more than the ``live`` reuse.

        A segment holds the KV of one chunk, keyed by every token and cut up to its end
        (``keys.segment_keys``), so the chunks found are those any earlier prompt (a longer one, another chat
        with the same system prompt, an agent run with the same tools) prefilled in exactly the same layout;
        they are joined and placed in ``slot``'s cleared sequence from cell 0, as a cold prefill leaves them.
        ``slot``: the runtime's slot (``seq_id``, ``tokens``, ``bounds``). Returns the number of tokens now
        valid (≤ len(tokens) − 1). A bad segment is quarantined and the chunks before it are used; when
        llama.cpp refuses the state the slot's sequence is emptied and 0 returned. While the cache is off
        (``off``) only the live reuse counts; a store that fails here turns it off (``metrics['cache_error']``)."""
        st = self._stats
        st.lookups += 1
        st.prompt_tokens += len(tokens)
        L = len(tokens)
        cuts = [b for b in (rt.layout(tokens) if bounds is None else bounds) if b <= L - 1]
        usable = self._usable()
        if usable is None and self._reopen is not None and self.off:  # every answer says so while it is off
            metrics.setdefault("cache_error", f"disk cache off: {self.off}")
        store = usable if L - 1 >= self.min_tokens and cuts and cuts[-1] > live else None
        if store is None:
            return self._count_live(live)
        keys = segment_keys(self.fp, tokens, cuts)
        with self._idle:
            pending = {k: self._pending[k] for k in keys if k in self._pending}
        try:
            have = store.present(self.fp, keys) | set(pending)
        except (sqlite3.Error, OSError) as exc:
            self._turn_off(exc, metrics)
            return self._count_live(live)
        j = 0
        while j < len(keys) and keys[j] in have:
            j += 1
        if j == 0 or cuts[j - 1] <= live:
            return self._count_live(live)
        t0 = time.perf_counter()
        shape, parts = self._read(store, tokens, cuts[:j], keys[:j], pending, metrics)
        if not parts or parts[-1][1] <= live:
            return self._count_live(live)
        use = parts[-1][1]
        try:
            self._set_state(rt, slot, assemble(shape, parts, slot.seq_id, rt.n_slots), tokens[:use])
        except EntryError as exc:
            metrics["cache_error"] = str(exc)
            self._clear(rt, slot)
            return 0
        slot.bounds = set(cuts[:len(parts)])
        try:
            store.touch(self.fp, keys[:len(parts)])
        except (sqlite3.Error, OSError) as exc:  # the restore stands; only the cache goes off
            self._turn_off(exc, metrics)
        metrics["restore_s"] = time.perf_counter() - t0
        st.restores += 1
        st.restore_s += metrics["restore_s"]
        st.hits += 1
        st.reused_tokens += use
        return use

    def _read(self, store: PrefixStore, tokens: list[int], cuts: list[int], keys: list[str], pending: dict,
              metrics: dict) -> tuple[dict, list[tuple[int, int, Any]]]:
        """The shape and ``(start, end, payload)`` of the segments for ``cuts`` (from memory when still
        pending), stopping before the first that fails a check (quarantined; ``metrics['cache_error']``)."""
        parts: list[tuple[int, int, Any]] = []
        shape: dict = {}
        start = 0
        for end, key in zip(cuts, keys):
            try:
                if key in pending:
                    got_shape, payload = pending[key][2], pending[key][3]
                else:
                    got_shape, payload = store.read(self.fp, key, start, tokens[start:end])
                if shape and got_shape != shape:
                    raise EntryError("segments of different state shapes")
            except EntryError as exc:
                metrics["cache_error"] = str(exc)
                break
            shape = got_shape
            parts.append((start, end, payload))
            start = end
        return shape, parts

    def _count_live(self, live: int) -> int:
        self._stats.reused_tokens += live
        if live:
            self._stats.hits += 1
        return live

    def save_slot(self, rt: Any, slot: Any) -> int:
        """Save the chunks of ``slot``'s KV that are not stored yet: one segment per chunk between its cuts
        (``slot.bounds``), prompt and laid-out answers alike, each stored once however many prompts share it.
        The state is captured here (``llama_state_get_data``, a few ms per 10 MB) and only the missing chunks
        are copied out; encoding, checksum, write and fsync run on the writer thread. Returns the number of
        segments queued (0 when the slot holds fewer than ``min_tokens`` tokens in whole chunks, or the cache
        is off)."""
        cuts = sorted(slot.bounds)
        if not cuts or cuts[-1] < self.min_tokens or cuts[-1] > len(slot.tokens):
            return 0
        store = self._usable()
        if store is None:
            return 0
        tokens = list(slot.tokens[:cuts[-1]])
        keys = segment_keys(self.fp, tokens, cuts)
        with self._idle:
            known = set(self._pending)
        try:
            stored = store.present(self.fp, keys)
        except (sqlite3.Error, OSError) as exc:
            self._turn_off(exc)
            return 0
        missing = [i for i, k in enumerate(keys) if k not in stored and k not in known]
        if not missing:
            return 0
        try:
            sv = read_stream(self._get_state(rt), slot.seq_id if rt.n_slots > 1 else 0)
            payloads = [(i, segment_payload(sv, ([0] + cuts)[i], cuts[i])) for i in missing]
        except EntryError as exc:
            log.warning("prefix cache: this slot's KV state cannot be stored: %s", exc)
            return 0
        for i, payload in payloads:
            start = ([0] + cuts)[i]
            self._enqueue(keys[i], (start, tokens[start:cuts[i]], sv.shape, payload))
        return len(payloads)

    def _enqueue(self, key: str, item: tuple[int, list[int], dict, bytes]) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._pending_bytes < MAX_PENDING_BYTES)
            self._pending[key] = item
            self._pending_bytes += len(item[3])
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="prefix-cache-writer", daemon=True)
                self._writer.start()
        self._queue.put(key)

    def _write_loop(self) -> None:
        """The writer thread: store each captured segment, until ``close``; a store that fails turns the cache
        off (what is still queued is dropped)."""
        while True:
            key = self._queue.get()
            if key is None:
                return
            with self._idle:
                start, tokens, shape, payload = self._pending[key]
            store = self.store
            try:
                if store is not None:
                    store.write(self.fp, key, start, tokens, shape, payload)
            except (OSError, sqlite3.Error) as exc:
                if self.store is store:
                    self._turn_off(exc)
            except Exception:  # noqa: BLE001 - a bug here must not stop later saves; logged with its traceback
                log.exception("prefix cache: saving a segment failed")
            finally:
                with self._idle:
                    self._pending.pop(key, None)
                    self._pending_bytes -= len(payload)
                    self._idle.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every captured segment is on disk (or ``timeout_s`` seconds pass); True when none is
        pending."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout_s)

    def close(self) -> None:
        """Write what is pending, stop the writer and close the index."""
        self.flush()
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            self._writer = None
        store, self.store = self.store, None
        if store is not None:
            try:
                store.close()
            except sqlite3.Error:
                pass

    def stats(self) -> dict:
        """The cache's counters; ``disk_cache``: ``"on"`` or ``"off: <reason>"`` (``off``);
        ``disk_cache_rebuilt``: why the index was rebuilt when it opened, if it was."""
        self.flush()
        s = self._stats
        out = {"lookups": s.lookups, "hits": s.hits, "prompt_tokens": s.prompt_tokens,
               "reused_tokens": s.reused_tokens,
               "hit_rate": (s.reused_tokens / s.prompt_tokens) if s.prompt_tokens else 0.0,
               "request_hit_rate": (s.hits / s.lookups) if s.lookups else 0.0,
               "restores": s.restores, "restore_s_total": s.restore_s, "saves": s.saves, "rejected": s.rejected,
               "evicted": s.evicted, "skipped_too_large": s.skipped_too_large, "segments": 0, "bytes_on_disk": 0,
               "budget_bytes": None, "fingerprint": self.fp}
        store = self.store
        if store is not None:
            try:
                out.update(segments=store.count(), bytes_on_disk=store.total_bytes(), budget_bytes=store.budget)
            except (sqlite3.Error, OSError) as exc:
                self._turn_off(exc)
            if store.rebuilt:
                out["disk_cache_rebuilt"] = store.rebuilt
        out["disk_cache"] = "on" if self.store is not None else f"off: {self.off}"
        return out

    # llama.cpp state API: the whole context's KV cells (no logits in 0.3.36), not Llama.save_state (which copies
    # every logit row through Python).
    @staticmethod
    def _get_state(rt: Any) -> np.ndarray:
        """The whole-context state: every cell of every stream, out-of-window ones too (the sequence state
        drops those, measured: 512 of 1,022 cells of the sliding-window layers, and a shorter prefix needs
        them). Shape: (bytes,) uint8, not zero-filled first."""
        import llama_cpp

        ctx = rt.ctx
        size = llama_cpp.llama_state_get_size(ctx)
        buf = np.empty(size, np.uint8)
        n = llama_cpp.llama_state_get_data(ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size)
        return buf[:n]

    @staticmethod
    def _set_state(rt: Any, slot: Any, buf: ctypes.Array, tokens: list[int]) -> None:
        """Put the saved KV cells back so that the cache is laid out exactly as the cold prefill left it.

        Not ``llama_state_set_data``: that whole-context restore writes the cells back from index 0 but sets
        the cache head to 0, and a sliding-window cache (Gemma 3) then stores the next token in the first cell
        that is out of the window (position 0) instead of the next free one. The next token's attention sums
        its KV cells in another order (the split-KV flash-attention kernel cuts them by cell index), so its
        logits differ in the last bits and a near tie flips (docs/prefix-cache.md). The sequence restore
        (``llama_state_seq_set_data``) places the cells through the cache's own slot search, from cell 0 of a
        cleared cache, and leaves the head after the last one: every cell at the index the cold prefill gave
        it. ``buf``: the sequence state (``segments.assemble``). Only the slot's sequence is touched. Raises
        ``EntryError`` if llama.cpp refuses it."""
        import llama_cpp

        PrefixCache._clear(rt, slot)
        if llama_cpp.llama_state_seq_set_data(rt.ctx, buf, len(buf), slot.seq_id) != len(buf):
            raise EntryError("llama.cpp refused the state data")  # the caller clears the sequence
        slot.tokens = list(tokens)

    @staticmethod
    def _clear(rt: Any, slot: Any) -> None:
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(rt.mem, slot.seq_id, -1, -1)
        slot.forget()
