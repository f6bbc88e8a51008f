"""Persistent prefix cache: the KV of each chunk of a prompt's canonical layout on disk, keyed by the exact tokens
and cuts up to it and an engine fingerprint, stored once however many prompts share it, and restored bit for
bit as a cold prefill would leave it (docs/prefix-cache.md). ``keys``: chunk keys and the fingerprint;
``entry``: the segment file format; ``state``/``segments``: llama.cpp's state bytes; ``store``: files and
index; ``cache``: the engine side."""

from app.engine.local.prefix_cache.cache import MAX_PENDING_BYTES, PrefixCache
from app.engine.local.prefix_cache.entry import MAGIC, EntryError, decode_segment, encode_segment
from app.engine.local.prefix_cache.keys import FORMAT_VERSION, LAYOUT_VERSION, fingerprint, segment_keys
from app.engine.local.prefix_cache.segments import StreamView, assemble, read_stream, segment_payload
from app.engine.local.prefix_cache.state import extract_stream, seq_state_buffer, state_streams
from app.engine.local.prefix_cache.store import CacheStats, PrefixStore

__all__ = [
    "FORMAT_VERSION", "LAYOUT_VERSION", "MAGIC", "MAX_PENDING_BYTES", "CacheStats", "EntryError", "PrefixCache",
    "PrefixStore", "StreamView", "assemble", "decode_segment", "encode_segment", "extract_stream",
    "fingerprint", "read_stream", "segment_keys", "segment_payload", "seq_state_buffer", "state_streams",
]
