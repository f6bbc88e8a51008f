"""Persistent prefix cache: KV state on disk, keyed by exact token ids and an engine fingerprint; restored bit
for bit as a cold prefill would leave it (docs/prefix-cache.md). ``keys``: block hashes and the fingerprint;
``entry``: the file format; ``state``: llama.cpp's state bytes; ``store``: files and index; ``cache``: the
engine side."""

from app.engine.local.prefix_cache.cache import MAX_PENDING_WRITES, PrefixCache
from app.engine.local.prefix_cache.entry import MAGIC, EntryError, decode_entry, encode_entry
from app.engine.local.prefix_cache.keys import (
    BLOCK,
    FORMAT_VERSION,
    LAYOUT_VERSION,
    PrefixHasher,
    block_hashes,
    fingerprint,
)
from app.engine.local.prefix_cache.state import extract_stream, seq_state_buffer, state_streams
from app.engine.local.prefix_cache.store import CacheStats, PrefixStore

__all__ = [
    "BLOCK", "FORMAT_VERSION", "LAYOUT_VERSION", "MAGIC", "MAX_PENDING_WRITES", "CacheStats", "EntryError",
    "PrefixCache", "PrefixHasher", "PrefixStore", "block_hashes", "decode_entry", "encode_entry", "extract_stream",
    "fingerprint", "seq_state_buffer", "state_streams",
]
