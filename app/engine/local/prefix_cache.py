"""Persistent prefix cache: KV state on disk, keyed by exact token IDs and an engine fingerprint.

Why our own store: llama-cpp-python's ``Llama.save_state`` / ``LlamaRAMCache`` / ``LlamaDiskCache`` copy the
logits (hundreds of MB), delete disk entries when read and carry no compatibility key (docs/llama-cpp-notes.md).
Here an entry is llama.cpp's context state (``llama_state_get_data``: the KV cells; llama.cpp 0.3.36 keeps no
logits in it) after the prefill of a prompt's first L−1 tokens, written with a header that says exactly what it
is, and indexed in SQLite. Restoring the same prompt then evaluates only its last token, exactly as a cold
prefill does (same canonical layout, see ``Runtime.prefill``), so the logits belong to this prompt, never to a
longer older one. A shorter stored prefix gives back its chunks of the layout (``app.engine.local.layout``) and the
rest is prefilled.

Keys (as vLLM ``kv_cache_utils.hash_block_tokens``): the prompt is cut into blocks of ``BLOCK`` tokens;
each block's hash covers its parent's hash and its token IDs, so a hash names one exact token prefix. An entry
stores the hash of its whole prefix (full blocks, then the partial tail) and its token IDs; a lookup is a hit
only if an entry's every token equals the start of the new prompt (checked by hash, then token by token).
Similar text is never a hit.

Fingerprint: llama-cpp-python version, llama.cpp system info, the model file's sha256, type_k, type_v,
flash attention, swa_full, n_ctx, n_batch, n_ubatch, n_gpu_layers and offload_kqv: everything the state layout
or its bits depend on (n_batch sets the canonical chunks, so an entry prefilled in other chunks would differ
from this engine's cold prefill in the last bits; the GPU layers compute with other kernels). The thread count
is not in it: the prefilled KV state was measured bit-identical with 1 and 2 threads. An entry from another
fingerprint is never restored.

Exactness needs the same bits *and* the same cells: llama.cpp sums a token's attention over KV cells in cell
order (split across threads by cell index in the decode kernel), so a restored entry must put every position
back in the cell the cold prefill used. ``PrefixCache._set_state`` says how (the sequence restore, not the
whole-context one, whose head reset moved the next token of a sliding-window cache to cell 0).

Sliding-window models (Gemma 3): Hearth loads them with ``swa_full=True`` (the full-size SWA cache), so every
layer keeps every cell and a restored prefix gives the same logits as a cold prefill. With a window-only cache
a restored shorter prefix would be wrong (docs/llama-cpp-notes.md); the engine therefore does not use the prefix
cache when ``swa_full`` is off on a model with a sliding window, and says so (``cache_reuse_reason``).

Files: ``kv-cache/<fingerprint[:16]>/<prefix hash>.kv`` with header
``MAGIC | u32 version | 64-byte fingerprint hex | u32 n_tokens | n_tokens × i32 token ids | u64 payload bytes |
32-byte sha256 of payload`` then the payload. Written atomically (``app.fileio``: temp file, fsync, rename).
A file that fails any check (short, zero bytes, bad magic, other fingerprint, other tokens, checksum) is moved
to ``kv-cache/quarantine/`` and the request is served cold with the KV cache cleared.

Budget: the sum of entry file sizes never exceeds ``budget_bytes``: least recently used entries are evicted
before a write; an entry larger than the whole budget is not stored (logged).

Off the request's path: a save captures the slot's KV state at once (``llama_state_get_data``, before the
prompt's last token changes the KV) and a writer thread encodes, checksums, writes, fsyncs and indexes it
while the request decodes. Measured here on a 3000-token Gemma 3 270M prompt (a 55 MB entry): the write
part took about 0.2 s that used to come before the first token. A lookup waits for pending writes first (so
an entry just saved is found; only a long prompt right after another long one waits), as do ``stats`` and
``close``; at most ``MAX_PENDING_WRITES`` captured states wait in memory (a further save waits for a slot).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import queue
import shutil
import sqlite3
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from app.engine.local.layout import usable
from app.fileio import atomic_write_bytes

log = logging.getLogger(__name__)

MAGIC = b"HEARTHKV"
FORMAT_VERSION = 1
# The prefill layout an entry's KV was laid out in (app.engine.local.layout), part of the fingerprint: 1 = chunks of
# n_batch from position 0; 2 = also cut before each turn break; 3 = the break after an answer too (the
# transcript's ``User``). An entry of another layout is never restored.
LAYOUT_VERSION = 3
BLOCK = 64  # tokens per hash block
_HDR = struct.Struct("<8sI64sI")


# ------------------------------------------------------------------------------------------------------
# pure bookkeeping (tested with made-up tokens)
# ------------------------------------------------------------------------------------------------------
def _tok_bytes(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def block_hashes(tokens: Sequence[int], block: int = BLOCK) -> list[str]:
    """Chained hashes of the full blocks of ``tokens``: ``h[i] = sha256(h[i-1] | tokens of block i)``.
    Returns one hex digest per full block (shape: ``len(tokens) // block``); the chain ``PrefixHasher`` keys on."""
    h = PrefixHasher(tokens, block)
    return [h._chain_to(k).hex() for k in range(1, len(tokens) // block + 1)]


class PrefixHasher:
    """``prefix_hash(n)``: the hash naming exactly ``tokens[:n]`` (full-block chain + partial tail + n)."""

    def __init__(self, tokens: Sequence[int], block: int = BLOCK) -> None:
        self.tokens = list(tokens)
        self.block = block
        self._chain = [b""]  # chain[i] = hash after i full blocks

    def _chain_to(self, k: int) -> bytes:
        while len(self._chain) <= k:
            i = len(self._chain) - 1
            blk = self.tokens[i * self.block:(i + 1) * self.block]
            self._chain.append(hashlib.sha256(self._chain[-1] + _tok_bytes(blk)).digest())
        return self._chain[k]

    def prefix_hash(self, n: int) -> str:
        if n > len(self.tokens):
            raise ValueError("prefix longer than tokens")
        full = n // self.block
        parent = self._chain_to(full)
        tail = self.tokens[full * self.block:n]
        return hashlib.sha256(parent + _tok_bytes(tail) + struct.pack("<I", n)).hexdigest()


def fingerprint(model_sha256: str, settings: Any, extra: dict | None = None) -> tuple[str, dict]:
    """The engine fingerprint (hex sha256) and the dict it hashes. ``settings``: ``LoadSettings``."""
    try:
        import llama_cpp

        lib = llama_cpp.__version__
        sysinfo = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - pure tests run without the library
        lib, sysinfo = "unknown", ""
    d = {"format": FORMAT_VERSION, "layout": LAYOUT_VERSION, "llama_cpp_python": lib, "llama_cpp_system": sysinfo,
         "model_sha256": model_sha256, "type_k": settings.type_k, "type_v": settings.type_v,
         "flash_attn": bool(settings.flash_attn), "swa_full": bool(settings.swa_full), "n_ctx": settings.n_ctx,
         "n_batch": settings.n_batch, "n_ubatch": settings.n_ubatch, "n_gpu_layers": settings.n_gpu_layers,
         "offload_kqv": bool(settings.offload_kqv), **(extra or {})}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest(), d


class EntryError(Exception):
    """An entry file failed a check; ``reason`` says which."""


def encode_entry(fp: str, tokens: Sequence[int], payload: bytes) -> bytes:
    """Serialize one entry (header + payload)."""
    head = _HDR.pack(MAGIC, FORMAT_VERSION, fp.encode("ascii"), len(tokens))
    return head + _tok_bytes(tokens) + struct.pack("<Q", len(payload)) + hashlib.sha256(payload).digest() + payload


def decode_entry(data: bytes, fp: str, tokens: Sequence[int]) -> memoryview:
    """Check an entry against the expected fingerprint and token prefix; return its payload (a view of ``data``).
    Raises ``EntryError`` naming the first failed check."""
    if len(data) == 0:
        raise EntryError("empty file")
    if len(data) < _HDR.size:
        raise EntryError(f"truncated header ({len(data)} bytes)")
    magic, ver, efp, n = _HDR.unpack_from(data, 0)
    if magic != MAGIC:
        raise EntryError("not a Hearth KV entry (bad magic)")
    if ver != FORMAT_VERSION:
        raise EntryError(f"format version {ver}, expected {FORMAT_VERSION}")
    if efp.decode("ascii", "replace") != fp:
        raise EntryError("saved by another engine configuration (model, KV type, flash attention, n_ctx or "
                         "library version differ)")
    off = _HDR.size
    if len(data) < off + 4 * n + 40:
        raise EntryError("truncated token list")
    saved = struct.unpack_from(f"<{n}i", data, off)
    if n > len(tokens) or list(saved) != list(tokens[:n]):
        raise EntryError("token ids differ from the prompt")
    off += 4 * n
    (plen,) = struct.unpack_from("<Q", data, off)
    digest = data[off + 8:off + 40]
    payload = memoryview(data)[off + 40:]  # a view: an entry is tens of MB, and it is copied once, into llama.cpp
    if len(payload) != plen:
        raise EntryError(f"truncated payload: expected {plen} bytes, found {len(payload)}")
    if hashlib.sha256(payload).digest() != digest:
        raise EntryError("checksum mismatch")
    return payload


_SEQ_MAGIC = 0xAF143CD8  # llama.cpp llama-context.cpp ``io_magic``: the head of a sequence state


def _arch_end(view: memoryview) -> int:
    """Offset of the memory part of a whole-context state (``u32 n | n bytes of architecture name``)."""
    if len(view) < 4:
        raise EntryError("state too short")
    (n,) = struct.unpack_from("<I", view, 0)
    name = bytes(view[4:4 + n])
    if n == 0 or n > 64 or len(view) < 4 + n or not name.isascii() or not name.decode().isprintable():
        raise EntryError("state does not start with an architecture name (unknown llama.cpp state format)")
    return 4 + n


def seq_state_buffer(whole: bytes | memoryview, seq_id: int = 0, n_stream: int = 1) -> ctypes.Array:
    """The sequence-state form (``llama_state_seq_set_data``) of a one-stream whole-context state, as the ctypes
    buffer llama.cpp reads, for a context of ``n_stream`` KV streams (one per sequence; one copy of the payload).

    llama.cpp 0.3.36 writes a whole-context state as ``u32 n | n bytes of architecture name | memory`` and a
    sequence state as ``u32 magic | i32 seq_id | memory``. Memory is one module per KV cache (two for a
    sliding-window model: the full layers, then the window layers), each ``u32 n_stream`` then one block per
    stream (``state_streams``). For one stream the memory part is the same bytes in both forms, so only the
    header is rewritten. For ``n_stream`` > 1 each module's block is placed in stream ``seq_id`` (the
    non-unified cache maps sequence s to stream s) and the other streams are written empty (cell count 0):
    llama.cpp's sequence reader puts the cells of any stream into the target sequence's own stream. Raises
    ``EntryError`` for a state it cannot read."""
    view = memoryview(whole).cast("B")
    off = _arch_end(view)
    if n_stream == 1:
        body = view[off:]
        buf = (ctypes.c_uint8 * (8 + len(body)))()
        out = memoryview(buf).cast("B")
        struct.pack_into("<Ii", out, 0, _SEQ_MAGIC, seq_id)
        out[8:] = body
        return buf
    modules = state_streams(view, off)
    if any(len(m) != 1 for m in modules):
        raise EntryError("entry is not a one-stream state")
    size = 8 + sum(4 + 4 * (n_stream - 1) + (e - b) for ((b, e),) in modules)
    buf = (ctypes.c_uint8 * size)()
    out = memoryview(buf).cast("B")
    struct.pack_into("<Ii", out, 0, _SEQ_MAGIC, seq_id)
    at = 8
    for ((b, e),) in modules:
        struct.pack_into("<I", out, at, n_stream)
        at += 4
        for s in range(n_stream):
            if s == seq_id:
                out[at:at + e - b] = view[b:e]
                at += e - b
            else:
                struct.pack_into("<I", out, at, 0)
                at += 4
    return buf


def state_streams(view: memoryview, off: int) -> list[list[tuple[int, int]]]:
    """The byte spans ``(begin, end)`` of every stream block of every memory module in ``view[off:]`` (the
    memory part of a whole-context state), read as llama.cpp 0.3.36 ``llama_kv_cache::state_write`` writes it:
    ``u32 n_stream``; per stream ``u32 cell_count`` then, when not 0, per cell ``i32 pos | u32 n_seq |
    n_seq × i32 seq_id`` and the data ``u32 v_trans | u32 n_layer``, per layer ``i32 k_type | u64 k_row |
    cells × k_row bytes``, then V per layer either ``i32 v_type | u64 v_row | cells × v_row`` or (v_trans)
    ``i32 v_type | u32 v_el | u32 n_embd_v | n_embd_v × cells × v_el``. Raises ``EntryError`` when the bytes do
    not parse to the end exactly (another format, e.g. a model whose cells carry M-RoPE positions)."""
    modules = []
    n = len(view)

    def u32(at: int) -> int:
        if at + 4 > n:
            raise EntryError("state ends inside a KV stream")
        return struct.unpack_from("<I", view, at)[0]

    while off < n:
        n_stream = u32(off)
        if not 1 <= n_stream <= 256:
            raise EntryError(f"unreadable KV state (n_stream {n_stream})")
        off += 4
        spans = []
        for _ in range(n_stream):
            begin = off
            cells = u32(off)
            off += 4
            if cells:
                for _c in range(cells):
                    off += 8 + 4 * u32(off + 4)
                v_trans, n_layer = u32(off), u32(off + 4)
                off += 8
                if v_trans > 1 or not 0 < n_layer <= 4096:
                    raise EntryError("unreadable KV state (layer header)")
                for _l in range(n_layer):
                    off += 12 + cells * _u64(view, off + 4)
                for _l in range(n_layer):
                    if v_trans:
                        off += 12 + u32(off + 8) * cells * u32(off + 4)
                    else:
                        off += 12 + cells * _u64(view, off + 4)
                if off > n:
                    raise EntryError("state ends inside a KV stream")
            spans.append((begin, off))
        modules.append(spans)
    if off != n or not modules:
        raise EntryError("unreadable KV state (trailing bytes)")
    return modules


def _u64(view: memoryview, at: int) -> int:
    if at + 8 > len(view):
        raise EntryError("state ends inside a KV stream")
    return struct.unpack_from("<Q", view, at)[0]


def extract_stream(whole: bytes | memoryview, stream: int) -> bytes:
    """A one-stream whole-context state holding only stream ``stream`` of a many-stream state: the entry
    format, the same bytes a context of one sequence would have written (cells' sequence ids set to 0).
    Raises ``EntryError`` for a state it cannot read."""
    view = memoryview(whole).cast("B")
    off = _arch_end(view)
    parts = [bytes(view[:off])]
    for spans in state_streams(view, off):
        if stream >= len(spans):
            raise EntryError(f"state has no stream {stream}")
        b, e = spans[stream]
        block = bytearray(view[b:e])
        cells = struct.unpack_from("<I", block, 0)[0]
        at = 4
        for _c in range(cells):
            n_seq = struct.unpack_from("<I", block, at + 4)[0]
            for k in range(n_seq):
                struct.pack_into("<i", block, at + 8 + 4 * k, 0)
            at += 8 + 4 * n_seq
        parts += [struct.pack("<I", 1), bytes(block)]
    return b"".join(parts)


# ------------------------------------------------------------------------------------------------------
# index + files
# ------------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------------
# the engine side (runs inside the engine process, next to the Llama)
# ------------------------------------------------------------------------------------------------------
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
