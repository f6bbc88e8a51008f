"""The engine side of the prefix cache (inside the engine process, next to the ``Llama``): restore the longest
stored prefix of a prompt into a slot, and save a prompt's state off the request's path through a writer
thread (docs/prefix-cache.md)."""

from __future__ import annotations

import ctypes
import logging
import queue
import sqlite3
import threading
import time
from typing import Any

from app.engine.local.layout import usable
from app.engine.local.prefix_cache.entry import EntryError
from app.engine.local.prefix_cache.keys import PrefixHasher, fingerprint
from app.engine.local.prefix_cache.state import extract_stream, seq_state_buffer
from app.engine.local.prefix_cache.store import PrefixStore

log = logging.getLogger("app.engine.local.prefix_cache")


MAX_PENDING_WRITES = 2  # captured states waiting for the writer thread at most (each is one entry's size)


class PrefixCache:
    """Restores and saves KV state of a ``Runtime``'s context through a ``PrefixStore``.

    ``min_tokens``: prompts shorter than this are neither saved nor looked up on disk (the live KV cache
    already covers short repeats; a disk write costs more than their prefill).
    """

    def __init__(self, store: PrefixStore, fp: str, fp_info: dict, min_tokens: int = 256) -> None:
        self.store = store
        self.fp = fp
        self.fp_info = fp_info
        self.min_tokens = min_tokens
        self._pending: set[str] = set()  # prefix hashes captured and not yet written (under ``_idle``)
        self._idle = threading.Condition()
        self._queue: "queue.Queue[tuple | None]" = queue.Queue()
        self._writer: threading.Thread | None = None

    @classmethod
    def for_runtime(cls, model_path: str, settings: Any, dir: str, budget_bytes: int = 4 << 30,
                    min_tokens: int = 256) -> "PrefixCache":
        from app.catalog.gguf import file_sha256

        fp, info = fingerprint(file_sha256(model_path), settings)
        return cls(PrefixStore(dir, budget_bytes), fp, info, min_tokens)

    # called by Runtime.prefill
    def restore_longest(self, rt: Any, slot: Any, tokens: list[int], live: int, metrics: dict,
                        bounds: list[int] | None = None) -> int:
        """Restore the stored entry that gives back the most of ``tokens``, if it beats the ``live`` reuse.

        An entry holds the KV state of a prompt's first n tokens (its L−1), prefilled in the canonical layout
        (``app.engine.local.layout``; ``Runtime.begin``). It shares every chunk end below n with this prompt and ends
        a chunk at n, so the tokens kept are this prompt's last chunk end ≤ n (``layout.usable`` over
        ``bounds``, this prompt's layout; all of it when n = L−1: then only the last token is evaluated, as in
        a cold run); the rest is prefilled. ``slot``: the runtime's slot (``seq_id``, ``tokens``, ``bounds``)
        whose sequence receives the entry. Returns the number of tokens now valid (≤ len(tokens) − 1). On a bad
        entry, empties the slot's sequence and returns 0."""
        st = self.store.stats
        st.lookups += 1
        st.prompt_tokens += len(tokens)
        L = len(tokens)
        if bounds is None:
            bounds = rt.layout(tokens)
        if L - 1 < self.min_tokens:
            return self._count_live(live)
        self.flush()  # an entry saved a moment ago is still being written
        found = self.store.find(self.fp, tokens[:L - 1], min_tokens=live + 1)
        if found is None:
            return self._count_live(live)
        n, path = found
        use = usable(bounds, n)
        if use <= live:
            return self._count_live(live)
        t0 = time.perf_counter()
        try:
            payload = self.store.read(self.fp, tokens, n, path)
            self._set_state(rt, slot, payload, tokens[:n])
        except EntryError as exc:
            metrics["cache_error"] = str(exc)
            self._clear(rt, slot)
            return 0
        slot.bounds = {b for b in bounds if b < n} | {n}
        metrics["restore_s"] = time.perf_counter() - t0
        st.restores += 1
        st.restore_s += metrics["restore_s"]
        st.hits += 1
        st.reused_tokens += use
        return use

    def _count_live(self, live: int) -> int:
        self.store.stats.reused_tokens += live
        if live:
            self.store.stats.hits += 1
        return live

    def maybe_save(self, rt: Any, slot: Any, tokens: list[int], metrics: dict) -> None:
        """Save ``slot``'s KV state, which holds exactly ``tokens`` (a prompt's first L−1 tokens), if long
        enough and not stored yet."""
        if len(tokens) < self.min_tokens:
            return
        h = PrefixHasher(tokens).prefix_hash(len(tokens))
        with self._idle:
            if h in self._pending:
                return
        if self.store.contains(self.fp, tokens):
            return
        t0 = time.perf_counter()
        try:
            payload = self._get_state(rt, slot)
        except EntryError as exc:
            log.warning("prefix cache: this llama.cpp state cannot be stored per sequence: %s", exc)
            return
        with self._idle:
            self._idle.wait_for(lambda: len(self._pending) < MAX_PENDING_WRITES)
            self._pending.add(h)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="prefix-cache-writer", daemon=True)
                self._writer.start()
        self._queue.put((h, list(tokens), payload))
        metrics["save_s"] = time.perf_counter() - t0

    def _write_loop(self) -> None:
        """The writer thread: store each captured state, until ``close``."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            h, tokens, payload = item
            try:
                self.store.write(self.fp, tokens, payload)
            except (OSError, sqlite3.Error) as exc:
                log.warning("prefix cache: could not save an entry: %s", exc)
            except Exception:  # noqa: BLE001 - a bug here must not stop later saves; logged with its traceback
                log.exception("prefix cache: saving an entry failed")
            finally:
                with self._idle:
                    self._pending.discard(h)
                    self._idle.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every captured state is on disk (or ``timeout_s`` seconds pass); True when none is
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
        self.store.close()

    def stats(self) -> dict:
        self.flush()
        s = self.store.stats
        return {"lookups": s.lookups, "hits": s.hits, "prompt_tokens": s.prompt_tokens,
                "reused_tokens": s.reused_tokens,
                "hit_rate": (s.reused_tokens / s.prompt_tokens) if s.prompt_tokens else 0.0,
                "request_hit_rate": (s.hits / s.lookups) if s.lookups else 0.0,
                "restores": s.restores, "restore_s_total": s.restore_s, "saves": s.saves, "rejected": s.rejected,
                "evicted": s.evicted, "skipped_too_large": s.skipped_too_large,
                "bytes_on_disk": self.store.total_bytes(), "budget_bytes": self.store.budget,
                "fingerprint": self.fp}

    # llama.cpp state API: the whole context's state (KV cells + the last token's logits; the logits of a
    # 262k vocabulary add 1 MiB), not Llama.save_state (which copies every logit row through Python).
    @staticmethod
    def _get_state(rt: Any, slot: Any) -> bytes:
        """The entry payload for ``slot``: the whole-context state (every cell, out-of-window ones too: the
        sequence state would drop those, and a shorter prefix needs them). In a context of several sequences
        that is every slot's KV; only the slot's own stream is kept (``extract_stream``)."""
        import llama_cpp

        ctx = rt.ctx
        size = llama_cpp.llama_state_get_size(ctx)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_get_data(ctx, buf, size)
        whole = memoryview(buf)[:n]
        return bytes(whole) if rt.n_slots == 1 else extract_stream(whole, slot.seq_id)

    @staticmethod
    def _set_state(rt: Any, slot: Any, payload: bytes, tokens: list[int]) -> None:
        """Put the saved KV cells back so that the cache is laid out exactly as the cold prefill left it.

        Not ``llama_state_set_data``: that whole-context restore writes the cells back from index 0 but sets
        the cache head to 0, and a sliding-window cache (Gemma 3) then stores the next token in the first cell
        that is out of the window (position 0) instead of the next free one. The next token's attention sums
        its KV cells in another order (the split-KV flash-attention kernel cuts them by cell index), so its
        logits differ in the last bits and a near tie flips (docs/prefix-cache.md). The sequence restore
        (``llama_state_seq_set_data``) places the cells through the cache's own slot search, from cell 0 of a
        cleared cache, and leaves the head after the last one: every cell at the index the cold prefill gave it.
        The entry keeps the whole-context format (every cell, out-of-window ones too, so a shorter prefix can
        be kept); for a single sequence its memory part is byte for byte the sequence format, so only the
        header is rewritten (``seq_state_buffer``; in a context of several sequences the entry's stream goes to
        the slot's own stream, the non-unified cache's layout). Only the slot's sequence is touched. Raises
        ``EntryError`` if llama.cpp refuses it."""
        import llama_cpp

        PrefixCache._clear(rt, slot)
        buf = seq_state_buffer(payload, slot.seq_id, rt.n_slots)
        if llama_cpp.llama_state_seq_set_data(rt.ctx, buf, len(buf), slot.seq_id) != len(buf):
            raise EntryError("llama.cpp refused the state data")  # the caller clears the sequence
        slot.tokens = list(tokens)

    @staticmethod
    def _clear(rt: Any, slot: Any) -> None:
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(rt.mem, slot.seq_id, -1, -1)
        slot.forget()
