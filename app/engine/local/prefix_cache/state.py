"""llama.cpp 0.3.36's state bytes, read and rewritten in Python: a whole-context state's KV streams
(``state_streams``), one stream of it as a one-stream state (``extract_stream``, the entry format), and the
sequence-state form a restore hands to ``llama_state_seq_set_data`` (``seq_state_buffer``)."""

from __future__ import annotations

import ctypes
import struct

from app.engine.local.prefix_cache.entry import EntryError

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
