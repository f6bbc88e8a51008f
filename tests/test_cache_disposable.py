"""The disposable prefix cache and load failures that are not the model's (issue 29, item 1): a cache that
cannot open, read or write turns itself off with its reason (``cache_stats()['disk_cache']``), generation goes
on without it and it is tried again later; a damaged index is set aside and rebuilt from the segment files; a
load failure the file did not cause is tried again by the next request, one it caused is remembered until the
file changes."""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from pathlib import Path

import pytest
from crashes import tmpfs

from app.engine.local.prefix_cache import PrefixCache, PrefixStore, segment_keys
from app.engine.pool import ModelPool
from app.errors import ModelLoadError
from app.protocol.types import DecodingParams, GenerateRequest, LoadSettings

FP = "a" * 64
SHAPE = {"arch": "gemma3", "modules": []}
LONG = ("Chapter one. The keeper climbed the spiral stairs of the lighthouse every evening at dusk, "
        "counting one hundred and twelve steps, and lit the great lamp. ") * 12  # ~400 tokens


class _Slot:
    seq_id, tokens, bounds = 0, [], set()


def _cache(tmp_path: Path, dir: Path, **kw) -> PrefixCache:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF not really")
    return PrefixCache.for_runtime(str(model), LoadSettings(n_ctx=2048), str(dir), 1 << 20, min_tokens=4, **kw)


def _lookup(cache: PrefixCache, metrics: dict) -> int:
    tokens = list(range(40))
    return cache.restore_longest(None, _Slot(), tokens, 0, metrics, bounds=[16, 32])


# -- the cache on its own ---------------------------------------------------------------------------------


def test_a_cache_folder_that_cannot_be_made_turns_the_cache_off(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cache = _cache(tmp_path, blocker / "kv-cache")
    try:
        stats = cache.stats()
        assert stats["disk_cache"].startswith("off: ") and str(blocker) in stats["disk_cache"]
        metrics: dict = {}
        assert _lookup(cache, metrics) == 0  # generation goes on cold; nothing raised
        assert cache.save_slot(None, _Slot()) == 0
    finally:
        cache.close()


def test_a_store_that_fails_while_running_turns_the_cache_off_until_it_is_tried_again(tmp_path, monkeypatch):
    cache = _cache(tmp_path, tmp_path / "kv", retry_s=3600)
    try:
        assert cache.stats()["disk_cache"] == "on"

        def broken(*a, **kw):
            raise sqlite3.DatabaseError("database disk image is malformed")

        monkeypatch.setattr(cache.store, "present", broken)
        metrics: dict = {}
        assert _lookup(cache, metrics) == 0
        assert "disk cache off" in metrics["cache_error"]
        assert "damaged" in cache.stats()["disk_cache"] and cache.stats()["disk_cache"].startswith("off: ")
        later: dict = {}
        assert _lookup(cache, later) == 0 and cache.store is None  # not tried again before retry_s
        assert later["cache_error"].startswith("disk cache off: ")  # every answer says so while it is off
        cache.retry_s = 0.0
        cache._retry_at = 0.0  # the hour has passed
        reopened: dict = {}
        assert _lookup(cache, reopened) == 0 and cache.stats()["disk_cache"] == "on"  # reopened at the next use
        assert "cache_error" not in reopened
    finally:
        cache.close()


def test_a_write_on_a_full_disk_turns_the_cache_off(tmp_path, monkeypatch):
    cache = _cache(tmp_path, tmp_path / "kv")
    try:
        def full(*a, **kw):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(cache.store, "write", full)
        cache._enqueue("k" * 64, (0, [1, 2, 3], SHAPE, b"x" * 10))  # what save_slot queues for the writer
        assert cache.flush(10)
        assert cache.stats()["disk_cache"] == f"off: disk full: {tmp_path / 'kv'} (free some space and try again)"
    finally:
        cache.close()


def _store_segments(root: Path) -> list[str]:
    st = PrefixStore(root, 10 << 20)
    tokens = list(range(300))
    keys = segment_keys(FP, tokens, [100, 200, 300])
    for a, b, k in zip([0, 100, 200], [100, 200, 300], keys):
        st.write(FP, k, a, tokens[a:b], SHAPE, os.urandom(1000))
    conn = st.db  # rows enough for the index to span several pages
    conn.executemany("INSERT INTO segments VALUES (?,?,?,?,?,?,?,?)",
                     [("f" * 64, f"{i:064d}", 0, 1, f"x/{i}.seg", 1, 0.0, 0.0) for i in range(2000)])
    conn.execute("DELETE FROM segments WHERE fingerprint = ?", ["f" * 64])  # free pages, same file
    conn.executemany("INSERT INTO segments VALUES (?,?,?,?,?,?,?,?)",
                     [("f" * 64, f"{i:064d}", 0, 1, f"x/{i}.seg", 1, 0.0, 0.0) for i in range(2000)])
    st.close()
    return keys


@pytest.mark.parametrize("damage", ["garbage", "one-page"])
def test_a_damaged_index_is_set_aside_and_rebuilt_from_the_segment_files(tmp_path, damage):
    keys = _store_segments(tmp_path)
    index = tmp_path / "index.db"
    if damage == "garbage":
        index.write_bytes(os.urandom(index.stat().st_size))
    else:
        conn = sqlite3.connect(index)
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'segments'").fetchone()[0]
        conn.close()
        with open(index, "r+b") as f:
            f.seek((root - 1) * page)
            f.write(b"\xa5" * 64)
    st = PrefixStore(tmp_path, 10 << 20)
    try:
        assert st.rebuilt and "damaged" in st.rebuilt
        assert st.run(FP, keys) == 3, "the three segments were indexed again from their headers"
        assert st.count() == 3  # the rows without files are gone
        assert any(p.name.endswith("-index.db") for p in (tmp_path / "quarantine").iterdir())
    finally:
        st.close()


# -- the pool: failures that are not the file's are tried again ---------------------------------------------


class _Engine:
    def __init__(self, fail: BaseException | None) -> None:
        self.fail = fail

    def load(self) -> dict:
        if self.fail is not None:
            raise self.fail
        return {}

    def close(self) -> None:
        pass


def _pool(tmp_path: Path, failures: list[BaseException | None], **kw) -> tuple[ModelPool, list[str]]:
    model = tmp_path / "m.gguf"
    if not model.exists():
        model.write_bytes(b"GGUF")
    made: list[str] = []

    def make(key: str, path: str) -> _Engine:
        made.append(key)
        return _Engine(failures.pop(0) if failures else None)

    pool = ModelPool(lambda name: ("m", str(model)), make, lambda key, path: 0, reaper_interval_s=0, **kw)
    return pool, made


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    ModelLoadError("the engine process could not load the model: it died", path="m.gguf", file_fault=False),
    ModelLoadError("OperationalError: database or disk is full", path="m.gguf"),  # cause unknown
])
def test_a_load_failure_the_file_did_not_cause_is_tried_again_by_the_next_request(tmp_path, failure):
    pool, made = _pool(tmp_path, [failure], blame_file=False)
    try:
        with pytest.raises(type(failure)):
            pool.acquire(None)
        assert pool.load_error() is not None and pool.load_errors()["m"]["retry"] == "next request"
        with pool.acquire(None) as lease:
            assert lease.engine is not None
        assert made == ["m", "m"] and pool.load_error() is None and pool.load_errors() == {}
    finally:
        pool.close()


def test_a_failure_the_file_caused_is_remembered_until_the_file_changes(tmp_path):
    bad = ModelLoadError("m.gguf: not a GGUF file", path="m.gguf", file_fault=True)
    pool, made = _pool(tmp_path, [bad])
    try:
        for _ in range(2):
            with pytest.raises(ModelLoadError, match="not a GGUF"):
                pool.acquire(None)
        assert made == ["m"] and pool.load_errors()["m"]["retry"] == "when the file changes"
        model = tmp_path / "m.gguf"
        model.write_bytes(b"GGUF, fixed")
        os.utime(model, ns=(time.time_ns(), time.time_ns() + 10**9))
        with pool.acquire(None):
            pass
        assert made == ["m", "m"]
    finally:
        pool.close()


# -- the real engine ------------------------------------------------------------------------------------------


def _req(n: int = 16) -> GenerateRequest:
    return GenerateRequest(prompt=LONG, decoding=DecodingParams.make(temperature=0.0, max_tokens=n))


def _engine(model, cache_dir):
    from app.engine.local.engine import Engine

    cfg = None if cache_dir is None else {"dir": str(cache_dir), "budget_bytes": 1 << 30, "min_tokens": 64}
    e = Engine(model, LoadSettings(n_ctx=2048), prefix_cache=cfg)
    e.load()
    return e


@pytest.fixture(scope="module")
def cold_text(bundled_model):
    with _engine(bundled_model, None) as e:
        return e.complete(_req()).text


@pytest.mark.model
def test_a_damaged_index_does_not_stop_the_model_and_is_rebuilt(bundled_model, cold_text, tmp_path):
    cache = tmp_path / "kv-cache"
    cache.mkdir()
    (cache / "index.db").write_bytes(b"this is not sqlite" * 300)
    with _engine(bundled_model, cache) as e:
        assert e.complete(_req()).text == cold_text
        stats = e.cache_stats()
        assert stats["disk_cache"] == "on" and "damaged" in stats["disk_cache_rebuilt"]
    assert list((cache / "quarantine").glob("*-index.db"))


@pytest.mark.model
def test_an_unwritable_cache_folder_does_not_stop_the_model(bundled_model, cold_text, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache folder cannot be made under a file")
    with _engine(bundled_model, blocker / "kv-cache") as e:
        assert e.complete(_req()).text == cold_text
        assert e.complete(_req()).text == cold_text
        assert e.cache_stats()["disk_cache"].startswith("off: ")


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (root only): room for the index, not for a segment; unmounted after the test."""
    with tmpfs(tmp_path, "512k") as mnt:
        yield mnt


@pytest.mark.model
def test_a_full_disk_turns_the_cache_off_and_answers_go_on(bundled_model, cold_text, small_disk):
    with _engine(bundled_model, small_disk / "kv-cache") as e:
        assert e.complete(_req()).text == cold_text
        deadline = time.monotonic() + 30
        while not e.cache_stats()["disk_cache"].startswith("off") and time.monotonic() < deadline:
            time.sleep(0.2)  # the slot is saved once the engine is idle (SAVE_GRACE_S)
        assert e.cache_stats()["disk_cache"].startswith(f"off: disk full: {small_disk / 'kv-cache'}")
        assert e.complete(_req()).text == cold_text


@pytest.mark.model
def test_a_load_that_failed_for_want_of_disk_is_retried_by_the_next_request(bundled_model, tmp_path):
    from app.engine.local.engine import Engine
    from app.engine.pool import local_pool

    tries: list[int] = []

    def make(key: str, path: str):
        tries.append(1)
        if len(tries) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return Engine(path, LoadSettings(n_ctx=1024))

    pool = local_pool(make, lambda key: LoadSettings(n_ctx=1024), budget_bytes=None)
    try:
        with pytest.raises(OSError):
            pool.acquire(str(bundled_model))
        assert pool.load_error(str(bundled_model)) is not None
        with pool.acquire(str(bundled_model)) as lease:
            out = lease.engine.complete(GenerateRequest(prompt="The capital of France is",
                                                        decoding=DecodingParams.make(temperature=0.0, max_tokens=4)))
        assert out.text and pool.load_error(str(bundled_model)) is None
    finally:
        pool.close()
