"""Prefix-cache bookkeeping on made-up tokens (no model): hashing, entry checks, LRU within the budget."""

from __future__ import annotations

import os
import random

import pytest

from app.engine.local.prefix_cache import (
    EntryError,
    PrefixStore,
    assemble,
    decode_segment,
    encode_segment,
    extract_stream,
    fingerprint,
    read_stream,
    segment_keys,
    segment_payload,
    seq_state_buffer,
)

FP = "a" * 64
FP2 = "b" * 64
SHAPE = {"arch": "gemma3", "modules": []}


def test_segment_keys_name_tokens_and_cuts_up_to_each_chunk():
    a = list(range(300))
    ka = segment_keys(FP, a, [100, 200, 299])
    assert len(ka) == 3 and len(set(ka)) == 3
    assert segment_keys(FP, a[:250], [100, 200]) == ka[:2], "a longer prompt shares its first chunks' keys"
    b = [7] + a[1:]  # differs at token 0
    assert all(x != y for x, y in zip(ka, segment_keys(FP, b, [100, 200, 299]))), "a change reaches every later key"
    assert segment_keys(FP, a, [50, 200])[1] != ka[1], "the same tokens in another layout are another key"
    assert segment_keys(FP2, a, [100])[0] != ka[0], "another engine configuration"
    with pytest.raises(ValueError):
        segment_keys(FP, a, [200, 100])
    with pytest.raises(ValueError):
        segment_keys(FP, a, [301])


def test_segment_roundtrip_and_every_rejection():
    toks = list(range(100, 150))
    payload = os.urandom(1000)
    key = segment_keys(FP, list(range(150)), [100, 150])[1]
    blob = encode_segment(FP, key, 100, toks, SHAPE, payload)
    shape, got = decode_segment(blob, FP, key, 100, toks)
    assert shape == SHAPE and bytes(got) == payload
    cases = {
        "empty": b"",
        "truncated header": blob[:10],
        "truncated payload": blob[: len(blob) // 2],
        "bad magic": b"X" * len(blob),
        "checksum": blob[:-1] + bytes([blob[-1] ^ 0xFF]),
    }
    for name, data in cases.items():
        with pytest.raises(EntryError):
            decode_segment(data, FP, key, 100, toks)
    with pytest.raises(EntryError, match="another engine configuration"):
        decode_segment(blob, FP2, key, 100, toks)
    with pytest.raises(EntryError, match="token ids differ"):
        decode_segment(blob, FP, key, 100, [1] + toks[1:])
    with pytest.raises(EntryError, match="another chunk"):
        decode_segment(blob, FP, "c" * 64, 100, toks)


def _store_chain(st, tokens, cuts, size=10):
    keys = segment_keys(FP, tokens, cuts)
    for a, b, k in zip([0] + cuts, cuts, keys):
        st.write(FP, k, a, tokens[a:b], SHAPE, os.urandom(size))
    return keys


def test_run_finds_shared_chunks_never_similar(tmp_path):
    st = PrefixStore(tmp_path, 10 << 20)
    base = list(range(300))
    _store_chain(st, base, [100, 250])
    other = base[:250] + [9, 9, 9]  # shares both chunks, then differs
    assert st.run(FP, segment_keys(FP, other, [100, 250, 252])) == 2
    assert st.run(FP, segment_keys(FP, base[:200], [100, 199])) == 1
    assert st.run(FP, segment_keys(FP, [5] + base[1:], [100, 250])) == 0  # differs at token 0
    assert st.run(FP2, segment_keys(FP2, base, [100, 250])) == 0  # other fingerprint


def test_shared_chunks_are_stored_once(tmp_path):
    st = PrefixStore(tmp_path, 10 << 20)
    pre = list(range(1000))
    for i in range(10):
        _store_chain(st, pre + [5000 + i] * 50, [256, 512, 768, 1000, 1050], size=1000)
    assert st.count() == 4 + 10, "four preamble chunks once, then one tail per conversation"
    assert st.total_bytes() == st.bytes_on_disk()


def test_budget_never_exceeded_and_lru(tmp_path):
    budget = 50_000
    st = PrefixStore(tmp_path, budget)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000) for _ in range(64)] for _ in range(40)]
    hot = segment_keys(FP, prompts[0], [32, 64])
    for i, p in enumerate(prompts):
        _store_chain(st, p, [32, 64], size=2000)
        assert st.bytes_on_disk() <= budget
        assert st.total_bytes() <= budget
        st.touch(FP, hot)  # keep prompt 0 hot
    assert st.run(FP, hot) == 2, "a recently used chain survives eviction"
    assert st.run(FP, segment_keys(FP, prompts[1], [32, 64])) == 0, "old, unused chains are evicted"
    assert st.stats.evicted > 0
    big = segment_keys(FP, [1, 2, 3], [3])[0]
    assert st.write(FP, big, 0, [1, 2, 3], SHAPE, os.urandom(budget)) is None  # larger than the budget


def test_eviction_takes_the_deepest_chunk_first_among_equals(tmp_path):
    st = PrefixStore(tmp_path, 10 << 20)
    toks = list(range(90))
    keys = _store_chain(st, toks, [30, 60, 90], size=100)
    st.touch(FP, keys)
    st.budget = st.total_bytes()  # room for nothing more
    _store_chain(st, [7] * 10, [10], size=100)
    assert st.run(FP, keys) == 2, "the chain loses its last chunk, not its first"


def test_bad_file_is_quarantined(tmp_path):
    st = PrefixStore(tmp_path, 10 << 20)
    toks = list(range(80))
    (key,) = _store_chain(st, toks, [80], size=100)
    path = st.path_for(FP, key)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(EntryError):
        st.read(FP, key, 0, toks)
    assert not path.exists()
    assert list((tmp_path / "quarantine").iterdir())
    assert st.run(FP, [key]) == 0


def test_an_index_of_the_previous_format_is_dropped_with_its_files(tmp_path):
    import sqlite3

    old = tmp_path / "abcd" / "x.kv"
    old.parent.mkdir()
    old.write_bytes(b"old entry")
    db = sqlite3.connect(tmp_path / "index.db")
    db.execute("CREATE TABLE entries (fingerprint, prefix_hash, n_tokens, file, size_bytes, created, last_used)")
    db.execute("INSERT INTO entries VALUES ('f', 'h', 1, 'abcd/x.kv', 9, 0, 0)")
    db.commit()
    db.close()
    st = PrefixStore(tmp_path, 1 << 20)
    assert not old.exists() and st.total_bytes() == 0


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

    from app.engine.local.prefix_cache import state_streams

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
    whole = _whole([[_stream_block([(0, 0), (1, 0)]), _stream_block([(0, 1)])]])
    with pytest.raises(EntryError):
        extract_stream(whole[:-cut], 0)
    with pytest.raises(EntryError):
        extract_stream(whole + b"\x00" * cut, 0)
    with pytest.raises(EntryError):
        seq_state_buffer(whole, seq_id=1, n_stream=4)  # two streams: not an entry
    with pytest.raises(EntryError):
        read_stream(whole[:-cut], 0)


@pytest.mark.parametrize("v_trans", [False, True])
def test_segments_of_a_stream_join_to_its_sequence_state(v_trans):
    """Cut stream 2 of a four-stream state into chunks and join them again: the bytes equal the sequence state
    of the whole stream (the restore path before segments); a gap or a short payload is refused."""
    cells = [(p, 2) for p in range(9)]
    modules = [[_stream_block([(p, s) for p in range(3)]) if s != 2 else _stream_block(cells, v_trans=v_trans)
                for s in range(4)] for _m in range(2)]
    whole = _whole(modules)
    sv = read_stream(whole, 2)
    assert sv.cells == 9 and len(sv.shape["modules"]) == 2
    cuts = [0, 4, 5, 9]
    parts = [(a, b, segment_payload(sv, a, b)) for a, b in zip(cuts, cuts[1:])]
    want = bytes(seq_state_buffer(extract_stream(whole, 2), seq_id=1, n_stream=4))
    assert bytes(assemble(sv.shape, parts, seq_id=1, n_stream=4)) == want
    with pytest.raises(EntryError, match="do not join"):
        assemble(sv.shape, [parts[0], parts[2]], 1, 4)
    with pytest.raises(EntryError, match="holds"):
        assemble(sv.shape, [(0, 4, parts[0][2][:-1])], 1, 4)
    with pytest.raises(EntryError):
        segment_payload(sv, 5, 10)


def test_cells_out_of_order_are_not_cut():
    whole = _whole([[_stream_block([(1, 0), (0, 0)])]])
    with pytest.raises(EntryError, match="in order"):
        read_stream(whole, 0)


def test_engine_facts_are_kept_per_fingerprint_and_survive_a_damaged_file(tmp_path):
    """``PrefixCache.recall`` / ``remember``: a measurement kept beside the cache under the fingerprint; another
    fingerprint's facts are kept; a damaged or missing file reads as nothing and is written afresh."""
    from app.engine.local.prefix_cache.cache import FACTS_FILE, PrefixCache

    def cache(fp: str) -> PrefixCache:
        return PrefixCache(None, fp, {}, where=tmp_path)

    a, b = cache("fp-a"), cache("fp-b")
    assert a.recall("split_rows@2") is None
    a.remember("split_rows@2", 64)
    b.remember("split_rows@2", 0)
    assert (a.recall("split_rows@2"), b.recall("split_rows@2"), a.recall("split_rows@4")) == (64, 0, None)
    (tmp_path / FACTS_FILE).write_text("{not json")
    assert a.recall("split_rows@2") is None
    a.remember("split_rows@2", 64)
    assert a.recall("split_rows@2") == 64 and b.recall("split_rows@2") is None
    cache("").remember("x", 1)  # no fingerprint (the store never opened): nothing is written under ""
    assert "" not in __import__("json").loads((tmp_path / FACTS_FILE).read_text())
