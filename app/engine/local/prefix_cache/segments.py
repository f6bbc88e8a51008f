"""One slot's KV in llama.cpp 0.3.36's state bytes, cut into chunks and put back together: ``read_stream`` finds a
stream's cells and layers in a whole-context state, ``segment_payload`` copies out the cells of positions
[a, b), ``assemble`` joins consecutive segments into the sequence state ``llama_state_seq_set_data`` reads.
The byte format is documented in ``state.state_streams``; why chunks: docs/prefix-cache.md."""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from app.engine.local.prefix_cache.entry import EntryError
from app.engine.local.prefix_cache.state import _SEQ_MAGIC, _arch_end


@dataclass
class _Module:
    """One memory module's block for one stream: ``cells`` cells (positions 0 … cells−1 in order), per layer
    K ``(offset, row bytes)`` and V ``(offset, row bytes)`` or, transposed, ``(offset, v_el, n_embd_v)``."""

    cells: int
    v_trans: int
    k: list[tuple[int, int]]
    v: list[tuple[int, ...]]


@dataclass
class StreamView:
    """A stream of a whole-context state, ready to be cut: the state's bytes (``view``), its architecture
    name, its modules and the shape every segment of it carries (``shape``: a JSON-able dict)."""

    view: memoryview
    arch: bytes
    modules: list[_Module]
    shape: dict[str, Any]

    @property
    def cells(self) -> int:
        return self.modules[0].cells if self.modules else 0


def _u32(view: memoryview, at: int) -> int:
    if at + 4 > len(view):
        raise EntryError("state ends inside a KV stream")
    return struct.unpack_from("<I", view, at)[0]


def _u64(view: memoryview, at: int) -> int:
    if at + 8 > len(view):
        raise EntryError("state ends inside a KV stream")
    return struct.unpack_from("<Q", view, at)[0]


def _check_cells(view: memoryview, at: int, cells: int) -> int:
    """Check that the stream's cells hold positions 0 … cells−1 in order, one sequence each; returns the offset
    after them. Raises ``EntryError`` otherwise (merged or reordered cells cannot be cut by position)."""
    end = at + 12 * cells
    if end > len(view):
        raise EntryError("state ends inside a KV stream")
    meta = np.frombuffer(view, dtype="<i4", count=3 * cells, offset=at).reshape(cells, 3)
    if not (np.array_equal(meta[:, 0], np.arange(cells)) and (meta[:, 1] == 1).all()):
        raise EntryError("the slot's KV cells are not positions 0 … n−1 in order")
    return end


def _read_block(view: memoryview, off: int, keep: bool) -> tuple[int, _Module | None]:
    """Walk one stream block from ``off``; returns the offset after it and, when ``keep``, its ``_Module``."""
    cells = _u32(view, off)
    off += 4
    if not cells:
        return off, (_Module(0, 0, [], []) if keep else None)
    if keep:
        off = _check_cells(view, off, cells)
    else:
        for _c in range(cells):
            off += 8 + 4 * _u32(view, off + 4)
    v_trans, n_layer = _u32(view, off), _u32(view, off + 4)
    off += 8
    if v_trans > 1 or not 0 < n_layer <= 4096:
        raise EntryError("unreadable KV state (layer header)")
    k: list[tuple[int, int]] = []
    v: list[tuple[int, ...]] = []
    for _l in range(n_layer):
        row = _u64(view, off + 4)
        k.append((off + 12, row))
        off += 12 + cells * row
    for _l in range(n_layer):
        if v_trans:
            el, n_embd = _u32(view, off + 4), _u32(view, off + 8)
            v.append((off + 12, el, n_embd))
            off += 12 + el * n_embd * cells
        else:
            row = _u64(view, off + 4)
            v.append((off + 12, row))
            off += 12 + cells * row
    if off > len(view):
        raise EntryError("state ends inside a KV stream")
    return off, (_Module(cells, v_trans, k, v) if keep else None)


def _types(view: memoryview, m: _Module) -> dict[str, Any]:
    """The shape of one module: layer types and row sizes (what two segments must share to be joined)."""
    k = [[struct.unpack_from("<i", view, o - 12)[0], row] for o, row in m.k]
    v = [[struct.unpack_from("<i", view, x[0] - 12)[0], *x[1:]] for x in m.v]
    return {"v_trans": m.v_trans, "k": k, "v": v}


def read_stream(whole: Any, stream: int = 0) -> StreamView:
    """Stream ``stream`` of a whole-context state (``llama_state_get_data``'s bytes): every module's cells and
    layer offsets. Raises ``EntryError`` for a state it cannot read, a missing stream, modules that disagree on
    the cell count, or cells that are not positions 0 … n−1 in order."""
    view = memoryview(whole).cast("B")
    off = _arch_end(view)
    arch = bytes(view[4:off])
    modules: list[_Module] = []
    while off < len(view):
        n_stream = _u32(view, off)
        if not 1 <= n_stream <= 256 or stream >= n_stream:
            raise EntryError(f"unreadable KV state (stream {stream} of {n_stream})")
        off += 4
        for s in range(n_stream):
            off, m = _read_block(view, off, s == stream)
            if m is not None:
                modules.append(m)
    if off != len(view) or not modules:
        raise EntryError("unreadable KV state (trailing bytes)")
    if len({m.cells for m in modules}) != 1:
        raise EntryError("the KV modules hold different numbers of cells (a window-only sliding-window cache?)")
    shape = {"arch": arch.decode("ascii", "replace"), "modules": [_types(view, m) for m in modules]}
    return StreamView(view, arch, modules, shape)


def segment_payload(sv: StreamView, a: int, b: int) -> bytes:
    """The KV of positions [a, b) of ``sv``: per module, every layer's K rows, then every layer's V rows (a
    transposed V: its ``n_embd_v`` rows, each cut to the cells [a, b)). Raises ``EntryError`` when the stream
    holds fewer than ``b`` cells."""
    if not 0 <= a < b <= sv.cells:
        raise EntryError(f"cells [{a}, {b}) are not in a stream of {sv.cells}")
    parts: list[Any] = []
    for m in sv.modules:
        for o, row in m.k:
            parts.append(sv.view[o + a * row:o + b * row])
        for x in m.v:
            if m.v_trans:
                o, el, n_embd = x
                rows = np.frombuffer(sv.view, np.uint8, count=n_embd * m.cells * el, offset=o)
                parts.append(rows.reshape(n_embd, m.cells * el)[:, a * el:b * el].tobytes())
            else:
                o, row = x
                parts.append(sv.view[o + a * row:o + b * row])
    return b"".join(parts)


def _module_bytes(mod: dict[str, Any], n: int) -> int:
    """Bytes of one module's layers for ``n`` cells."""
    k = sum(row for _t, row in mod["k"])
    v = sum(x[1] * x[2] if mod["v_trans"] else x[1] for x in mod["v"])
    return n * (k + v)


def assemble(shape: dict[str, Any], parts: Sequence[tuple[int, int, Any]], seq_id: int,
             n_stream: int) -> ctypes.Array:
    """The sequence state (``llama_state_seq_set_data``) of positions 0 … n−1 from consecutive segments
    ``parts`` = ``(a, b, payload)`` (the first at 0, each starting where the last ended, all of ``shape``): one
    block per module in stream ``seq_id`` of ``n_stream`` (the non-unified cache's stream for that sequence),
    the other streams empty, every cell one position of sequence 0 in order (the reader places them in the
    target sequence). One copy of each payload. Raises ``EntryError`` for gaps or payloads of the wrong size."""
    n = 0
    for a, b, payload in parts:
        if a != n or b <= a:
            raise EntryError(f"segments do not join: [{a}, {b}) after {n}")
        want = sum(_module_bytes(m, b - a) for m in shape["modules"])
        if len(payload) != want:
            raise EntryError(f"segment [{a}, {b}) holds {len(payload)} bytes, its shape says {want}")
        n = b
    mods = shape["modules"]
    per_layer = sum(12 * 2 * len(m["k"]) for m in mods)
    size = 8 + sum(4 + 4 * (n_stream - 1) + 4 + 12 * n + 8 for _m in mods) + per_layer
    size += sum(_module_bytes(m, n) for m in mods)
    buf = (ctypes.c_uint8 * size)()
    out = np.frombuffer(buf, np.uint8)
    struct.pack_into("<Ii", buf, 0, _SEQ_MAGIC, seq_id)
    at = 8
    seg_off = [0] * len(parts)  # where each payload's next module starts
    for mod in mods:
        struct.pack_into("<I", buf, at, n_stream)
        at += 4
        for s in range(n_stream):
            if s != seq_id:
                struct.pack_into("<I", buf, at, 0)
                at += 4
                continue
            at = _write_block(buf, out, at, mod, n, parts, seg_off)
    if at != size:
        raise EntryError("assembled state has the wrong size")  # a bug, never a user's input
    return buf


def _write_block(buf: ctypes.Array, out: np.ndarray, at: int, mod: dict[str, Any], n: int,
                 parts: Sequence[tuple[int, int, Any]], seg_off: list[int]) -> int:
    """Write one module's block of ``n`` cells at ``at`` (cell metadata, then layers from every part, advancing
    ``seg_off``); returns the offset after it."""
    struct.pack_into("<I", buf, at, n)
    at += 4
    meta = np.zeros((n, 3), dtype="<i4")
    meta[:, 0] = np.arange(n)
    meta[:, 1] = 1
    out[at:at + 12 * n] = meta.view(np.uint8).reshape(-1)
    at += 12 * n
    struct.pack_into("<II", buf, at, mod["v_trans"], len(mod["k"]))
    at += 8
    for t, row in mod["k"]:
        at = _write_rows(buf, out, at, t, row, n, parts, seg_off)
    for x in mod["v"]:
        if mod["v_trans"]:
            t, el, n_embd = x
            struct.pack_into("<iII", buf, at, t, el, n_embd)
            at += 12
            rows = out[at:at + n_embd * n * el].reshape(n_embd, n * el)
            for j, (a, b, payload) in enumerate(parts):
                size = n_embd * (b - a) * el
                rows[:, a * el:b * el] = np.frombuffer(payload, np.uint8, size, seg_off[j]).reshape(n_embd, -1)
                seg_off[j] += size
            at += n_embd * n * el
        else:
            at = _write_rows(buf, out, at, x[0], x[1], n, parts, seg_off)
    return at


def _write_rows(buf: ctypes.Array, out: np.ndarray, at: int, t: int, row: int, n: int,
                parts: Sequence[tuple[int, int, Any]], seg_off: list[int]) -> int:
    """Write one layer's K (or untransposed V) at ``at``: its type ``t`` and row size ``row`` (bytes), then the
    ``n`` cells' rows taken from every part in turn (advancing ``seg_off``); returns the offset after it."""
    struct.pack_into("<iQ", buf, at, t, row)
    at += 12
    for j, (a, b, payload) in enumerate(parts):
        size = (b - a) * row
        out[at + a * row:at + b * row] = np.frombuffer(payload, np.uint8, size, seg_off[j])
        seg_off[j] += size
    return at + n * row
