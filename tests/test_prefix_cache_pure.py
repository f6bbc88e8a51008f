"""Prefix-cache bookkeeping on made-up tokens (no model): hashing, entry checks, LRU within the budget."""

from __future__ import annotations

import os
import random

import pytest

from app.engine.local.prefix_cache import (
    BLOCK,
    EntryError,
    PrefixHasher,
    PrefixStore,
    block_hashes,
    decode_entry,
    encode_entry,
    fingerprint,
    seq_state_buffer,
)

FP = "a" * 64
FP2 = "b" * 64


def test_block_hashes_chain_covers_parent():
    a = list(range(BLOCK * 3))
    b = [7] + a[1:]  # differs only in block 0
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == 3
    assert all(x != y for x, y in zip(ha, hb)), "a change in block 0 must change every later hash"
    assert block_hashes(a[: BLOCK * 2]) == ha[:2]


def test_prefix_hash_names_exact_prefix():
    toks = list(range(200))
    h = PrefixHasher(toks)
    assert h.prefix_hash(100) == PrefixHasher(toks[:100]).prefix_hash(100)
    assert h.prefix_hash(100) != h.prefix_hash(99)
    assert PrefixHasher([1, 2, 3]).prefix_hash(3) != PrefixHasher([1, 2, 4]).prefix_hash(3)


def test_entry_roundtrip_and_every_rejection():
    toks = list(range(50))
    payload = os.urandom(1000)
    blob = encode_entry(FP, toks, payload)
    assert decode_entry(blob, FP, toks + [99, 100]) == payload
    cases = {
        "empty": b"",
        "truncated header": blob[:10],
        "truncated payload": blob[: len(blob) // 2],
        "bad magic": b"X" * len(blob),
        "checksum": blob[:-1] + bytes([blob[-1] ^ 0xFF]),
    }
    for name, data in cases.items():
        with pytest.raises(EntryError):
            decode_entry(data, FP, toks)
    with pytest.raises(EntryError, match="another engine configuration"):
        decode_entry(blob, FP2, toks)
    with pytest.raises(EntryError, match="token ids differ"):
        decode_entry(blob, FP, [1] + toks[1:])


def test_find_longest_prefix_never_similar(tmp_path):
    st = PrefixStore(tmp_path, 10 << 20)
    base = list(range(300))
    st.write(FP, base[:100], b"x" * 10)
    st.write(FP, base[:250], b"y" * 10)
    n, _ = st.find(FP, base + [1, 2, 3])
    assert n == 250
    n, _ = st.find(FP, base[:200])
    assert n == 100
    assert st.find(FP, [5] + base[1:]) is None  # differs at token 0
    assert st.find(FP2, base) is None  # other fingerprint


def test_budget_never_exceeded_and_lru(tmp_path):
    budget = 50_000
    st = PrefixStore(tmp_path, budget)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000) for _ in range(64)] for _ in range(40)]
    for i, p in enumerate(prompts):
        st.write(FP, p, os.urandom(4000))
        assert st.bytes_on_disk() <= budget
        assert st.total_bytes() <= budget
        st.find(FP, prompts[0])  # keep prompt 0 hot
        if st.find(FP, prompts[0]):
            st.read(FP, prompts[0], 64, st.find(FP, prompts[0])[1])
    assert st.find(FP, prompts[0]) is not None, "a recently used entry survives eviction"
    assert st.find(FP, prompts[1]) is None, "old, unused entries are evicted"
    assert st.stats.evicted > 0
    assert st.write(FP, [1, 2, 3], os.urandom(budget)) is None  # larger than the budget: not stored


def test_bad_file_is_quarantined(tmp_path):
    st = PrefixStore(tmp_path, 10 << 20)
    toks = list(range(80))
    path = st.write(FP, toks, b"z" * 100)
    path.write_bytes(path.read_bytes()[:40])
    n, p = st.find(FP, toks)
    with pytest.raises(EntryError):
        st.read(FP, toks, n, p)
    assert not path.exists()
    assert list((tmp_path / "quarantine").iterdir())
    assert st.find(FP, toks) is None


def test_seq_state_buffer_rewrites_only_the_header():
    """A whole-context state (u32 n | arch name | memory) becomes a sequence state (magic | seq id | memory)."""
    import struct

    memory = bytes(range(256)) * 3
    whole = struct.pack("<I", 6) + b"gemma3" + memory
    seq = bytes(seq_state_buffer(whole))
    assert seq[:8] == struct.pack("<Ii", 0xAF143CD8, 0) and seq[8:] == memory
    assert bytes(seq_state_buffer(memoryview(whole), seq_id=3))[4:8] == struct.pack("<i", 3)


@pytest.mark.parametrize("bad", [b"", b"\x01\x00", b"\x00\x00\x00\x00rest",
                                 b"\xff\x00\x00\x00" + b"x" * 300, b"\x04\x00\x00\x00\x00\x01\x02\x03mem"])
def test_seq_state_buffer_refuses_an_unknown_format(bad):
    with pytest.raises(EntryError):
        seq_state_buffer(bad)


def test_fingerprint_covers_the_canonical_chunk_and_gpu_layers():
    from app.protocol.types import LoadSettings

    base = fingerprint("0" * 64, LoadSettings())[0]
    for change in ({"n_batch": 512}, {"n_ubatch": 128}, {"n_gpu_layers": -1}, {"offload_kqv": False},
                   {"type_k": "q8_0"}, {"n_ctx": 2048}):
        assert fingerprint("0" * 64, LoadSettings(**change))[0] != base, change
    assert fingerprint("0" * 64, LoadSettings(n_threads=1))[0] == base  # prefilled KV is thread-independent


def _stream_block(cells: list[tuple[int, int]], n_layer: int = 2, k_row: int = 6, v_row: int = 4,
                  v_trans: bool = False) -> bytes:
    """One KV stream as llama.cpp writes it: cell count, (pos, n_seq, seq ids) per cell, then K and V rows."""
    import struct

    out = struct.pack("<I", len(cells))
    if not cells:
        return out
    for pos, seq in cells:
        out += struct.pack("<iIi", pos, 1, seq)
    out += struct.pack("<II", int(v_trans), n_layer)
    fill = bytes((pos * 7 + seq) % 251 for pos, seq in cells)
    for il in range(n_layer):
        out += struct.pack("<iQ", 1, k_row) + (fill * k_row)[:len(cells) * k_row]
    for il in range(n_layer):
        if v_trans:
            out += struct.pack("<iII", 1, 2, v_row) + (fill * 8)[:v_row * len(cells) * 2]
        else:
            out += struct.pack("<iQ", 1, v_row) + (fill * v_row)[:len(cells) * v_row]
    return out


def _whole(streams_per_module: list[list[bytes]]) -> bytes:
    import struct

    out = struct.pack("<I", 6) + b"gemma3"
    for streams in streams_per_module:
        out += struct.pack("<I", len(streams)) + b"".join(streams)
    return out


@pytest.mark.parametrize("v_trans", [False, True])
def test_one_stream_of_a_many_stream_state_is_the_one_sequence_entry(v_trans):
    """Saving from slot 2 of 4 keeps exactly what a one-sequence context would have written (ids set to 0);
    restoring that entry into slot 2 of 4 puts the block in stream 2 and the other streams empty."""
    import struct

    from app.engine.local.prefix_cache import extract_stream, state_streams

    def cells(seq, n):
        return [(p, seq) for p in range(n)]

    modules = [[_stream_block(cells(s, 3 + s), v_trans=v_trans) if s != 1 else _stream_block([])
                for s in range(4)] for _m in range(2)]  # two modules: a sliding-window model's two caches
    whole = _whole(modules)
    spans = state_streams(memoryview(whole), 10)
    assert [len(m) for m in spans] == [4, 4] and spans[0][0][0] == 14
    entry = extract_stream(whole, 2)
    alone = _whole([[_stream_block(cells(0, 5), v_trans=v_trans)]] * 2)
    assert len(entry) == len(alone) and entry[:10] == alone[:10]
    assert state_streams(memoryview(entry), 10) == state_streams(memoryview(alone), 10)
    buf = bytes(seq_state_buffer(entry, seq_id=2, n_stream=4))
    assert buf[:8] == struct.pack("<Ii", 0xAF143CD8, 2)
    block = entry[10 + 4:10 + 4 + (len(entry) - 10) // 2 - 4]
    one_module = struct.pack("<III", 4, 0, 0) + block + struct.pack("<I", 0)
    assert buf[8:] == one_module * 2


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_a_state_that_does_not_parse_to_its_end_is_refused(cut):
    from app.engine.local.prefix_cache import extract_stream

    whole = _whole([[_stream_block([(0, 0), (1, 0)]), _stream_block([(0, 1)])]])
    with pytest.raises(EntryError):
        extract_stream(whole[:-cut], 0)
    with pytest.raises(EntryError):
        extract_stream(whole + b"\x00" * cut, 0)
    with pytest.raises(EntryError):
        seq_state_buffer(whole, seq_id=1, n_stream=4)  # two streams: not an entry
