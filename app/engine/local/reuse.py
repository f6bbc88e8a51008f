"""Prefix reuse in a slot: the live KV prefix that is exactly reusable, a copy from another slot, a restore from
the disk cache, the cut back to the reused prefix, and why a prompt ran cold (docs/prefix-cache.md)."""

from __future__ import annotations

import logging

from app.engine.local.layout import common_prefix, usable_within
from app.engine.local.seqs import LlamaSeq, _Slot

MIN_LIVE_REUSE = 16  # a shorter live prefix (the BOS before the first turn break) is prefilled, not reused
MIN_COPY_TOKENS = 32  # a shorter prefix is prefilled rather than copied from another slot (measured below)
SPLIT_ROWS = 64  # batches this big give each token the same bits, wherever the batch starts, but for its last
SPLIT_ALIGN = 4  # (size mod 4) tokens, when ``_probe_split`` confirms it: ggml's CPU flash attention is tiled
# from GGML_FA_TILE_Q = 64 query rows on; the repacked matmuls take 4 rows at a time, the rest one by one

SPLIT_PROBE_TEXT = ("The keeper climbed the stairs at dusk, trimmed the wick and wrote the wind, the sea and the "
                    "ships that passed into the log. ")

log = logging.getLogger("app.engine.local.runtime")


class ReuseMixin:
    """``Runtime``'s prefix reuse (it holds ``slots``, ``mem``, ``_lib``, ``prefix_cache``, ``reuse_ok``)."""

    def live_prefix(self, slot: _Slot, tokens: list[int], bounds: list[int] | None = None) -> int:
        """Tokens of ``tokens`` that ``slot``'s live KV gives back exactly (see ``begin``): the common prefix
        cut down to the last chunk end of ``tokens``' layout (``bounds``, ``layout``) that the slot's KV also
        ends a chunk at, or into the next chunk when both chunks are big enough (``layout.usable_within`` with
        ``split_rows``); all but the last token for a repeat of the same prompt."""
        L = len(tokens)
        n = common_prefix(slot.tokens, tokens, min(len(slot.tokens), L - 1))
        got = (usable_within(self.layout(tokens) if bounds is None else bounds, n, slot.bounds, self.split_rows,
                             SPLIT_ALIGN)
               if n else 0)
        return got if got >= MIN_LIVE_REUSE or got == L - 1 else 0

    def _copy_longer(self, dst: _Slot, tokens: list[int], have: int, bounds: list[int]) -> int | None:
        """Give ``dst`` another slot's live prefix of ``tokens`` when it is longer than ``have`` tokens and
        worth a copy (at least ``MIN_COPY_TOKENS``): llama.cpp copies the whole KV stream of a non-unified
        cache (``llama_memory_seq_cp`` across streams, applied at the next ``llama_decode``), so every cell
        is bit for bit the source's and in the same place; the tail past the prefix is removed. Returns the
        source slot's id, or None. This is how ``n`` samples of one prompt (self-consistency) prefill it
        once: the later ones start after the first has its prompt in."""
        best, src = have, None
        for other in self.slots:
            if other is dst or not other.tokens:
                continue
            n = self.live_prefix(other, tokens, bounds)
            if n > best:
                best, src = n, other
        if src is None or best - have < MIN_COPY_TOKENS:
            return None
        lib = self._lib
        lib.llama_memory_seq_cp(self.mem, src.seq_id, dst.seq_id, -1, -1)
        if best < len(src.tokens):
            lib.llama_memory_seq_rm(self.mem, dst.seq_id, best, -1)
        dst.tokens = src.tokens[:best]
        dst.bounds = {b for b in src.bounds if b <= best}
        return src.seq_id

    def _reuse(self, seq: LlamaSeq, slot: _Slot, reuse: int, allow_reuse: bool, disk: bool = True) -> None:
        """Keep (``reuse`` tokens of the live KV, ``live_prefix``) or restore (disk) the longest exact prefix of
        ``seq.tokens`` in ``slot``; drop the rest. ``disk`` False: no disk lookup (a stream copy into the slot
        is pending until the next ``llama_decode`` and would overwrite a restored state)."""
        tokens, metrics = seq.tokens, seq.metrics
        L = len(tokens)
        allowed = allow_reuse and self.reuse_ok
        cache = self.prefix_cache if allowed and disk else None
        source = "memory" if reuse else "none"
        if cache is not None:
            got = cache.restore_longest(self, slot, tokens, reuse, metrics, seq.bounds)
            if got > reuse:
                reuse, source = got, "disk"
            elif not slot.tokens:  # a rejected entry: the slot was cleared, nothing is reusable
                reuse, source = 0, "none"
        kept = self._keep_prefix(slot, tokens, reuse)
        if kept != reuse:
            reuse, source = kept, "none"
        seq.pos = seq.reused = reuse
        metrics["cached_tokens"] = reuse
        metrics["cache_source"] = source
        metrics["cache_reuse"], metrics["cache_reuse_reason"] = self._reuse_note(reuse, source, L, metrics,
                                                                                 allow_reuse, seq.bounds)

    def _keep_prefix(self, slot: _Slot, tokens: list[int], n: int) -> int:
        """Cut ``slot``'s KV back to its first ``n`` tokens (``tokens[:n]``, which it holds) and its cuts to
        those ≤ ``n``. Returns ``n``, or 0 when llama.cpp could not remove the tail: the slot is then emptied."""
        lib = self._lib
        if n < len(slot.tokens) and not lib.llama_memory_seq_rm(self.mem, slot.seq_id, n, -1):
            lib.llama_memory_seq_rm(self.mem, slot.seq_id, -1, -1)
            n = 0
        slot.tokens = tokens[:n]
        slot.bounds = {b for b in slot.bounds if b <= n}
        return n

    def _prefill_chunk(self, slot: _Slot, tokens: list[int], start: int, end: int,
                       bounds: list[int] = ()) -> None:
        """Evaluate the canonical chunk ``tokens[start:end]`` alone in one ``llama_decode`` into ``slot``, whose
        KV then ends a chunk at ``end`` (and at every one of ``bounds`` between: consecutive chunks evaluated
        together, ``layout.merged_end``)."""
        self._decode([(slot.seq_id, start, tokens[start:end])])
        slot.tokens.extend(tokens[start:end])
        slot.bounds.update(b for b in bounds if start < b < end)
        slot.bounds.add(end)

    def _probe_at_load(self) -> None:
        """Know ``split_rows`` before the first request where a disk cache keeps the answer: the measurement
        stored beside the cache under this engine's fingerprint and thread count, else ``_probe_split`` now
        (about 290 tokens of prefill, once per model and settings), stored for the next start. Without a disk
        cache the idle engine measures it after the first request (``idle_step``)."""
        cache = self.prefix_cache
        if cache is None or not self.reuse_ok or cache.store is None:
            return
        name = f"split_rows@{self.llm.n_threads}"
        known = cache.recall(name)
        if isinstance(known, int) and known >= 0:
            self.split_rows, self.split_probed = known, True
        elif self._probe_split():
            cache.remember(name, self.split_rows)

    def _probe_split(self) -> bool:
        """Measure once whether tokens get the same bits in any batch of ``SPLIT_ROWS`` tokens or more, but for
        a batch's last (size mod ``SPLIT_ALIGN``): 143 tokens evaluated in an empty slot as one batch and as
        72 + 71 (another attention tiling; the same 3 last tokens apart), the sequence's KV state compared byte
        for byte, then removed. Sets ``split_rows`` (``SPLIT_ROWS`` when equal, else 0) and returns True once
        measured; False when no slot is empty (try again later). Measured on the CPU build: equal; a last batch
        under 64 tokens, or a split that moves the (size mod 4) tail, differs (docs/prefix-cache.md)."""
        import ctypes

        n, cut = 2 * SPLIT_ROWS + 15, SPLIT_ROWS + 8
        if n > min(self.settings.n_ctx, self.capacity) or not self.reuse_ok:
            self.split_probed = True
            return True
        slot = next((s for s in self.slots if not s.tokens), None)
        if slot is None:
            return False
        lib, sid = self._lib, slot.seq_id
        toks = self.tokenize(SPLIT_PROBE_TEXT * 8, add_bos=True, special=False)[:n]
        if len(toks) < n:
            self.split_probed = True
            return True

        def state(splits: list[int]) -> bytes:
            lib.llama_memory_seq_rm(self.mem, sid, -1, -1)
            a = 0
            for b in splits:
                self._decode([(sid, a, toks[a:b])])
                a = b
            size = lib.llama_state_seq_get_size(self.ctx, sid)
            buf = (ctypes.c_uint8 * size)()
            got = lib.llama_state_seq_get_data(self.ctx, buf, size, sid)
            return bytes(buf[:got])

        try:
            same = state([n]) == state([cut, n])
        finally:
            lib.llama_memory_seq_rm(self.mem, sid, -1, -1)
            slot.forget()
        self.split_rows = SPLIT_ROWS if same else 0
        self.split_probed = True
        log.info("prefix reuse: batches of %d tokens or more %s", SPLIT_ROWS,
                 "give every token the same bits: reuse may end inside a chunk" if same
                 else "do not give the same bits: reuse ends at chunk ends")
        return True

    def _reuse_note(self, reuse: int, source: str, L: int, metrics: dict, allow_reuse: bool,
                    bounds: list[int] = ()) -> tuple[str, str]:
        """``("exact", which path)`` when a prefix was reused, else ``("cold", why not)``: every reuse path
        that ``begin`` takes gives the cold run's bits, so a path that could not does not run at all."""
        C = self.settings.n_batch
        if reuse:
            where = "restored from disk" if source == "disk" else "live KV cache"
            part = ("all but the last prompt token" if reuse == L - 1
                    else f"{reuse} tokens, up to a chunk end of the prompt's layout" if reuse in bounds
                    else f"{reuse} tokens, inside a chunk of at least {self.split_rows} tokens")
            return "exact", f"{where}: {part}"
        if not allow_reuse:
            return "cold", "prefix reuse off for this request"
        if not self.reuse_ok:
            return "cold", ("window-only sliding-window cache (swa_full off): a reused prefix would not "
                            "equal a cold prefill")
        if metrics.get("cache_error"):
            err = metrics["cache_error"]
            return "cold", err if err.startswith("disk cache off") else f"prefix-cache entry rejected: {err}"
        if L - 1 < C and not self.turn_breaks:
            return "cold", f"prompt shorter than one chunk ({C} tokens) and not a repeat of the last prompt"
        return "cold", "no cached prefix of this prompt (live or on disk)"
