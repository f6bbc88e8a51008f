"""A segment file: the KV of one chunk of a prompt's canonical layout. A header says exactly what it holds (magic,
format version, fingerprint, key, the chunk's positions and token ids, the state's shape, the payload's size
and CRC-32), then the payload; ``decode_segment`` checks every part of it."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any, Sequence

from app.engine.local.prefix_cache.keys import FORMAT_VERSION, _tok_bytes

MAGIC = b"HEARTHSG"
_HDR = struct.Struct("<8sI64s64sIII")  # magic, version, fingerprint, key, start, end, shape-json length


HEADER_SIZE = _HDR.size


class EntryError(Exception):
    """A segment file failed a check, or a KV state could not be read; the message says which."""


def segment_header(head: bytes) -> tuple[str, str, int, int]:
    """``(fingerprint, key, start, end)`` from the first ``HEADER_SIZE`` bytes of a segment file (to index it
    again when the index is rebuilt); ``EntryError`` when they are no segment header of this format."""
    if len(head) < _HDR.size:
        raise EntryError(f"truncated header ({len(head)} bytes)")
    magic, ver, efp, ekey, s, e, _mlen = _HDR.unpack_from(head, 0)
    if magic != MAGIC or ver != FORMAT_VERSION or e <= s:
        raise EntryError("not a Hearth KV segment of this format")
    return efp.decode("ascii", "replace"), ekey.decode("ascii", "replace"), s, e


def encode_segment(fp: str, key: str, start: int, tokens: Sequence[int], shape: dict[str, Any],
                   payload: bytes | memoryview) -> bytes:
    """One segment file's bytes: header, the chunk's ``tokens`` (positions ``start`` … ``start + len(tokens)``),
    ``shape`` (``segments.StreamShape.to_dict``) as JSON, the payload's size and CRC-32, then ``payload``."""
    meta = json.dumps(shape, sort_keys=True).encode()
    head = _HDR.pack(MAGIC, FORMAT_VERSION, fp.encode("ascii"), key.encode("ascii"), start, start + len(tokens),
                     len(meta))
    tail = struct.pack("<QI", len(payload), zlib.crc32(payload))
    return b"".join((head, _tok_bytes(tokens), meta, tail, bytes(payload)))


def decode_segment(data: bytes, fp: str, key: str, start: int, tokens: Sequence[int]) -> tuple[dict, memoryview]:
    """Check a segment file against the expected fingerprint, key, start and token ids (``tokens``: the chunk's
    own); return its shape and payload (a view of ``data``). Raises ``EntryError`` naming the first failed
    check."""
    if len(data) == 0:
        raise EntryError("empty file")
    if len(data) < _HDR.size:
        raise EntryError(f"truncated header ({len(data)} bytes)")
    magic, ver, efp, ekey, s, e, mlen = _HDR.unpack_from(data, 0)
    if magic != MAGIC:
        raise EntryError("not a Hearth KV segment (bad magic)")
    if ver != FORMAT_VERSION:
        raise EntryError(f"format version {ver}, expected {FORMAT_VERSION}")
    if efp.decode("ascii", "replace") != fp:
        raise EntryError("saved by another engine configuration (model, KV type, flash attention, n_ctx or "
                         "library version differ)")
    if ekey.decode("ascii", "replace") != key or s != start or e != start + len(tokens):
        raise EntryError("the file holds another chunk than its name says")
    off = _HDR.size
    n = e - s
    if len(data) < off + 4 * n + mlen + 12:
        raise EntryError("truncated token list")
    if list(struct.unpack_from(f"<{n}i", data, off)) != list(tokens):
        raise EntryError("token ids differ from the prompt")
    off += 4 * n
    try:
        shape = json.loads(data[off:off + mlen])
    except ValueError:
        raise EntryError("unreadable shape") from None
    off += mlen
    plen, crc = struct.unpack_from("<QI", data, off)
    payload = memoryview(data)[off + 12:]
    if len(payload) != plen:
        raise EntryError(f"truncated payload: expected {plen} bytes, found {len(payload)}")
    if zlib.crc32(payload) != crc:
        raise EntryError("checksum mismatch")
    return shape, payload
