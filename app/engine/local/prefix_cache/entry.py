"""An entry file: a header that says exactly what the state is (magic, format version, fingerprint, the
token ids, the payload's size and sha256), then the payload; ``decode_entry`` checks every part of it."""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

from app.engine.local.prefix_cache.keys import FORMAT_VERSION, _tok_bytes

MAGIC = b"HEARTHKV"
_HDR = struct.Struct("<8sI64sI")


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
