"""Stores that refuse to lose data (issue 29, item 5): a damaged, empty or foreign database file is refused at
open and left untouched, with the command that recovers it; a full disk is named "disk full: <path>"; a failed
write inside ``Store.transaction()`` leaves nothing behind (no empty conversation)."""

from __future__ import annotations

import errno
import hashlib
import pickle
import sqlite3
from pathlib import Path

import pytest
from crashes import tmpfs

from app.errors import DiskFull, ModelLoadError, StoreDamaged, StoreError, store_error
from app.memory import Store
from app.retrieval.store import DocumentStore

STORES = {"conversations": Store, "documents": DocumentStore}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _filled_store(path: Path, n: int = 200) -> None:
    """A real conversation store with enough messages for the messages table to span many pages, closed (its
    write-ahead log checkpointed into the file)."""
    with Store(path) as store:
        cid = store.create_conversation("damage")
        parent = None
        for i in range(n):
            parent = store.append_message(cid, "user" if i % 2 == 0 else "assistant", f"message {i} " * 40, parent)
    assert not Path(str(path) + "-wal").exists() or Path(str(path) + "-wal").stat().st_size == 0


def _damage_one_page(path: Path, table: str = "messages") -> int:
    """Overwrite the b-tree header of ``table``'s root page (one page) with garbage; returns the page number."""
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", [table]).fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xa5" * 64)
    return root


def test_a_store_with_one_damaged_page_is_refused_at_open_and_left_untouched(tmp_path):
    db = tmp_path / "hearth.db"
    _filled_store(db)
    _damage_one_page(db)
    before = _digest(db)
    with pytest.raises(StoreDamaged) as err:
        Store(db)
    assert _digest(db) == before, "the damaged file was left untouched"
    msg = str(err.value)
    assert str(db) in msg and ".recover" in msg and "quick_check" in msg
    assert err.value.path == str(db)


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_zero_byte_file_is_refused_not_replaced(tmp_path, kind):
    db = tmp_path / f"{kind}.db"
    db.write_bytes(b"")
    with pytest.raises(StoreDamaged, match="0 bytes") as err:
        STORES[kind](db)
    assert db.stat().st_size == 0, "no new empty store was put in its place"
    assert f"mv {db}" in str(err.value)


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_database_without_its_migrations_table_is_refused(tmp_path, kind):
    db = tmp_path / f"{kind}.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE notes (x TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.commit()
    conn.close()
    before = _digest(db)
    with pytest.raises(StoreDamaged, match="_sqlite_migrations"):
        STORES[kind](db)
    assert _digest(db) == before


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_healthy_store_opens_again(tmp_path, kind):
    db = tmp_path / f"{kind}.db"
    STORES[kind](db).close()
    STORES[kind](db).close()  # a store it made itself passes its own check


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs (root only), unmounted after the test; skipped where it cannot be mounted."""
    with tmpfs(tmp_path, "1m") as mnt:
        yield mnt


def _fill_until_full(store: Store, cid: str) -> DiskFull:
    parent = None
    for i in range(10_000):
        try:
            parent = store.append_message(cid, "user", f"{i} " + "x" * 20_000, parent)
        except DiskFull as exc:
            return exc
    raise AssertionError("the disk never filled")


def test_a_full_disk_is_named_disk_full_and_a_failed_turn_leaves_no_conversation(full_disk):
    db = full_disk / "hearth.db"
    store = Store(db)
    try:
        exc = _fill_until_full(store, store.create_conversation("filler"))
        assert str(exc).startswith(f"disk full: {db}")
        before = [c.id for c in store.list_conversations()]
        with pytest.raises(DiskFull):
            with store.transaction():
                cid = store.create_conversation("new chat")
                store.append_message(cid, "user", "y" * 500_000)
        assert [c.id for c in store.list_conversations()] == before, "no empty conversation was left"
    finally:
        store.close()


def test_a_full_database_is_disk_full_and_the_transaction_is_all_or_nothing(tmp_path):
    """The same without root: SQLite's ``max_page_count`` makes the database full (SQLITE_FULL)."""
    db = tmp_path / "hearth.db"
    with Store(db) as store:
        kept = store.create_conversation("kept")
        pages = store.db.execute("PRAGMA page_count").fetchone()[0]
        store.db.execute(f"PRAGMA max_page_count = {pages + 4}")
        with pytest.raises(DiskFull, match=f"^disk full: {db}"):
            with store.transaction():
                cid = store.create_conversation("new chat")
                store.append_message(cid, "user", "y" * 200_000)
        assert [c.id for c in store.list_conversations()] == [kept]
        with pytest.raises(DiskFull):  # the same outside a transaction of the caller's
            store.append_message(kept, "user", "z" * 200_000)
        assert store.messages(kept) == []


def test_store_error_maps_what_sqlite_and_the_os_raise(tmp_path):
    path = tmp_path / "x.db"
    assert isinstance(store_error(OSError(errno.ENOSPC, "No space left on device"), path), DiskFull)
    assert isinstance(store_error(sqlite3.OperationalError("database or disk is full"), path), DiskFull)
    damaged = store_error(sqlite3.DatabaseError("database disk image is malformed"), path)
    assert isinstance(damaged, StoreDamaged) and str(path) in str(damaged)
    other = store_error(sqlite3.OperationalError("no such table: t"), path, "conversation store")
    assert type(other) is StoreError and str(path) in str(other)


def test_the_new_errors_cross_processes():
    for err in (DiskFull("/d/hearth.db"), StoreDamaged("/d/hearth.db", "empty"),
                ModelLoadError("bad", path="/m.gguf", file_fault=True)):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)


def test_a_full_documents_database_is_disk_full_and_keeps_what_it_had(tmp_path):
    """The documents store said "documents database error: database or disk is full" (issue 29, item 5)."""
    from app.retrieval.store import DocumentStore, NewChunk

    db = tmp_path / "documents.db"

    def write(s, path, text):
        s.write_document(path, sha256=path, size=len(text), mtime_ns=1, type="text", page_count=None,
                         chunks=[NewChunk(text, None, 0, len(text), 10)])

    with DocumentStore(db) as s:
        write(s, "/kept.md", "kept")
        pages = s.db.execute("PRAGMA page_count").fetchone()[0]
        s.db.execute(f"PRAGMA max_page_count = {pages + 4}")
        with pytest.raises(DiskFull, match=f"^disk full: {db}"):
            write(s, "/big.md", "word " * 100_000)
        assert [d.path for d in s.documents()] == ["/kept.md"]
