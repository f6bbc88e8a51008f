"""The conversation store: migrations, content addressing, branches, append-only history, FTS search,
crash safety (SIGKILL mid-stream), corrupt rows, export/import round trips. Pure SQLite, no model."""

from __future__ import annotations

import ast
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlite_utils import Database

from app.errors import InvalidRequest, StoreError
from app.memory.migrations import migrations
from app.memory.records import message_id
from app.memory.store import Store

REPO = Path(__file__).resolve().parents[1]
MIGRATIONS = ["m001_conversations_messages", "m002_summaries_citations", "m003_messages_fts", "m004_tool_messages",
              "m005_message_reasoning", "m006_presets_projects", "m007_citation_check", "m008_attributions"]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "hearth.db"


def snapshot(store: Store, cid: str) -> dict:
    data = store.load_conversation(cid)
    return {"conversation": data.conversation.to_dict(), "messages": [m.to_dict() for m in data.messages],
            "summaries": [s.to_dict() for s in data.summaries], "citations": [c.to_dict() for c in data.citations]}


def turn(store: Store, cid: str, question: str, answer: str, parent: str | None) -> tuple[str, str]:
    u = store.append_message(cid, "user", question, parent)
    return u, store.append_message(cid, "assistant", answer, u)


# ---- migrations --------------------------------------------------------------------------------------------------


def test_migrations_apply_on_new_db(db_path: Path) -> None:
    Store(db_path).close()
    db = Database(db_path)
    assert [m.name for m in migrations.applied(db)] == MIGRATIONS
    assert db.journal_mode == "wal"
    assert {"conversations", "messages", "summaries", "citations", "messages_fts"} <= set(db.table_names())
    db.close()
    Store(db_path).close()  # reopening applies nothing twice
    assert [m.name for m in migrations.applied(Database(db_path))] == MIGRATIONS


def test_migrations_apply_on_existing_db_and_index_old_rows(db_path: Path) -> None:
    db = Database(db_path)
    migrations.apply(db, stop_before="m003_messages_fts")  # a database written by an older Hearth
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES ('c1', 'old', 't', 't')")
    db.execute("INSERT INTO messages (id, conversation_id, role, content, created) "
               "VALUES ('m1', 'c1', 'user', 'an aardvark from before the index', 't')")
    db.close()
    with Store(db_path) as store:
        assert [m.name for m in migrations.applied(store.db)] == MIGRATIONS
        assert [h.message_id for h in store.search("aardvark")] == ["m1"]
        assert store.get_message("m1").content == "an aardvark from before the index"


def test_citations_from_before_the_check_load_as_not_checked(db_path: Path) -> None:
    db = Database(db_path)
    migrations.apply(db, stop_before="m007_citation_check")
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES ('c1', 'old', 't', 't')")
    db.execute("INSERT INTO messages (id, conversation_id, role, content, created) "
               "VALUES ('m1', 'c1', 'assistant', 'It is 25 °C [E:ab12].', 't')")
    db.execute("INSERT INTO citations (message_id, evidence_id, path, page, quote) "
               "VALUES ('m1', 'ab12', 'a.txt', NULL, 'q')")
    db.close()
    with Store(db_path) as store:
        (old,) = store.citations_for("m1")
        assert (old.supported, old.sentence_start, old.support) == (None, None, None)
        assert old.to_dict() == {"message_id": "m1", "evidence_id": "ab12", "path": "a.txt", "page": None,
                                 "quote": "q"}  # exported as before the check
        support = {"supported": True, "missing": [], "similarity": 0.71, "threshold": 0.58, "reason": "ok"}
        store.add_citations("m1", [{"evidence_id": "ab12", "supported": True, "sentence_start": 0,
                                    "sentence_end": 11, "support": support}])
        new = store.citations_for("m1")[1]
        assert (new.supported, new.sentence_start, new.sentence_end, new.support) == (True, 0, 11, support)


def test_not_a_database_is_a_store_error(db_path: Path) -> None:
    db_path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        Store(db_path)
    assert db_path.read_bytes().startswith(b"this is not sqlite")  # left untouched


# ---- content addressing, branches, append-only ----------------------------------------------------------------


def test_content_addressing(memory_store: Store) -> None:
    c1, c2 = memory_store.create_conversation("one"), memory_store.create_conversation("two")
    u = memory_store.append_message(c1, "user", "hi", None, meta={"first": True})
    assert u == message_id("user", "hi", None, c1)
    assert memory_store.append_message(c1, "user", "hi", None, meta={"second": True}) == u  # same id, nothing written
    assert memory_store.get_message(u).meta == {"first": True}
    assert len(memory_store.messages(c1)) == 1
    assert memory_store.append_message(c2, "user", "hi", None) != u  # another conversation's first message
    a = memory_store.append_message(c1, "assistant", "hello", u)
    assert a == message_id("assistant", "hello", u, c1)
    assert memory_store.append_message(c1, "user", "hello", u) != a  # the role is part of the address


def test_edits_and_regenerations_are_branches(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u1, a1 = turn(memory_store, cid, "Plan a trip to Oslo", "Sure: 3 days.", None)
    u2, a2 = turn(memory_store, cid, "Make it 4 days", "OK, 4 days.", a1)
    u2b, a2b = turn(memory_store, cid, "Make it 5 days", "OK, 5 days.", a1)  # an edit of u2: a sibling
    assert [m.id for m in memory_store.children(a1)] == [u2, u2b]
    assert [m.id for m in memory_store.path_to(a2b)] == [u1, a1, u2b, a2b]
    assert [m.id for m in memory_store.path_to(a2)] == [u1, a1, u2, a2]  # the old branch is intact
    r = memory_store.begin_streaming_message(cid, u2)  # regenerate the answer to u2
    r = memory_store.finish_message(r, content="Fine, four days then.")
    assert [m.content for m in memory_store.children(u2)] == ["OK, 4 days.", "Fine, four days then."]
    # A regeneration identical to an existing answer is a version of its own (it was merged into the old one,
    # and the window jumped back to it: issue 27), keyed by its variant; the original is untouched.
    same = memory_store.finish_message(memory_store.begin_streaming_message(cid, u2), content="OK, 4 days.")
    again = memory_store.finish_message(memory_store.begin_streaming_message(cid, u2), content="OK, 4 days.")
    assert len({a2, same, again}) == 3
    kids = memory_store.children(u2)
    assert [m.id for m in kids] == [a2, r, same, again]
    assert [m.content for m in kids] == ["OK, 4 days.", "Fine, four days then.", "OK, 4 days.", "OK, 4 days."]
    assert [m.meta.get("variant") for m in kids] == [None, None, 2, 3]
    assert [m.id for m in memory_store.children(None, conversation_id=cid)] == [u1]
    assert memory_store.get_conversation(cid).current_message_id == again
    # An appended (not generated) message with the same text is still the same message: idempotent writes.
    assert memory_store.append_message(cid, "assistant", "OK, 4 days.", u2) == a2


def test_finished_messages_cannot_be_overwritten(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u, a = turn(memory_store, cid, "question", "answer", None)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        memory_store.db.execute("UPDATE messages SET content = 'rewritten' WHERE id = ?", [a])
    with pytest.raises(sqlite3.IntegrityError):
        memory_store.db.execute("UPDATE messages SET status = 'incomplete' WHERE id = ?", [a])
    with pytest.raises(StoreError, match="not being streamed"):
        memory_store.update_streaming_message(a, "rewritten")
    with pytest.raises(StoreError, match="already finished"):
        memory_store.finish_message(a, content="rewritten")
    assert memory_store.get_message(a).content == "answer"
    with pytest.raises(InvalidRequest, match="another conversation"):
        memory_store.append_message(memory_store.create_conversation(), "user", "x", u)


def test_streaming_message_lifecycle(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "cite something", None)
    a = memory_store.begin_streaming_message(cid, u, meta={"model": "m"})
    assert memory_store.get_message(a).status == "incomplete"
    assert memory_store.get_conversation(cid).current_message_id == a
    memory_store.update_streaming_message(a, "According to")
    memory_store.update_streaming_message(a, "According to the manual", reasoning="look it up")
    memory_store.add_citations(a, [{"evidence_id": 7, "path": "manual.pdf", "page": 3, "quote": "the manual"}])
    final = memory_store.finish_message(a, content="According to the manual, yes.", token_count=6,
                                        meta={"finish_reason": "stop"})
    assert final == message_id("assistant", "According to the manual, yes.", u, cid)
    m = memory_store.get_message(final)
    assert (m.status, m.reasoning, m.token_count, m.meta) == ("complete", "look it up", 6,
                                                              {"model": "m", "finish_reason": "stop"})
    assert [c.evidence_id for c in memory_store.citations_for(final)] == ["7"]
    assert memory_store.get_conversation(cid).current_message_id == final
    with pytest.raises(StoreError):
        memory_store.get_message(a)  # the provisional row is gone
    e = memory_store.begin_streaming_message(cid, u)
    memory_store.update_streaming_message(e, "half an ans")
    assert memory_store.finish_message(e, "error", meta={"error": "EngineCrashed"}) == e  # keeps its id
    assert (memory_store.get_message(e).status, memory_store.get_message(e).content) == ("error", "half an ans")


# ---- search ---------------------------------------------------------------------------------------------------


def test_search_original_text_is_safe_and_survives_summaries(memory_store: Store) -> None:
    cid = memory_store.create_conversation("birds")
    u, a = turn(memory_store, cid, "Tell me about penguins running", "Emperor penguins walk 100 km.", None)
    other = memory_store.create_conversation("other")
    turn(memory_store, other, "Nothing about birds", "Right.", None)
    assert {h.message_id for h in memory_store.search("penguin")} == {u, a}  # stemmed
    assert memory_store.search("runs")[0].message_id == u
    assert memory_store.search("100 km")[0].message_id == a
    assert "[penguins]" in memory_store.search("penguins", conversation_id=cid)[0].snippet
    for nasty in ['"', "AND", "OR NOT", "NEAR(", "a:b", "*", "-x", "(penguins", "penguins)", "'; DROP TABLE", "^"]:
        memory_store.search(nasty)  # never an FTS syntax error
    assert memory_store.search("penguins\"") and memory_store.search("(emperor") and memory_store.search("") == []
    assert memory_store.search("pengu*")
    memory_store.add_summary(cid, "The user asked about zebras instead.", u, a, model="m")
    assert memory_store.search("zebras") == []  # summaries are not what was said
    assert {h.message_id for h in memory_store.search("penguins")} == {u, a}


# ---- crash safety ---------------------------------------------------------------------------------------------


_STREAMER = textwrap.dedent("""
    import sys, time
    from app.memory.store import Store
    store = Store(sys.argv[1])
    cid = sys.argv[2]
    user = store.append_message(cid, "user", "tell me a long story", None)
    mid = store.begin_streaming_message(cid, user)
    text, i = "", 0
    while True:
        i += 1
        text += f"word{i} "
        store.update_streaming_message(mid, text)
        if i == 20:
            print(mid, flush=True)
        time.sleep(0.002)
""")


def test_sigkill_mid_stream_leaves_partial_answer_incomplete(db_path: Path) -> None:
    with Store(db_path) as store:
        keep = store.create_conversation("keep me")
        turn(store, keep, "What is 2+2?", "4", None)
        before = snapshot(store, keep)
        victim = store.create_conversation("streaming")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _STREAMER, str(db_path), victim], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        mid = proc.stdout.readline().strip()
        time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL and mid
    with Store(db_path) as store:
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert snapshot(store, keep) == before
        partial = store.get_message(mid)
        assert partial.status == "incomplete"
        assert partial.content.startswith("word1 word2 ") and len(partial.content.split()) >= 20
        assert store.search("word3")[0].message_id == mid
        later = store.append_message(victim, "user", "go on", mid)  # the conversation continues from it
        assert [m.id for m in store.path_to(later)][-2] == mid


# ---- corrupt rows ---------------------------------------------------------------------------------------------


def test_corrupt_json_fields_load_with_warnings(memory_store: Store, caplog: pytest.LogCaptureFixture) -> None:
    bad = memory_store.create_conversation("bad", settings={"temperature": 0.2})
    u, a = turn(memory_store, bad, "q", "a", None)
    memory_store.add_summary(bad, "s", u, a)
    good = memory_store.create_conversation("good")
    turn(memory_store, good, "fine", "fine too", None)
    good_before = snapshot(memory_store, good)
    memory_store.db.execute("UPDATE conversations SET settings = '{bad' WHERE id = ?", [bad])  # edited by hand
    memory_store.db.execute("UPDATE messages SET meta = '{bad' WHERE id = ?", [a])
    memory_store.db.execute("UPDATE summaries SET settings = '[1, 2]' WHERE conversation_id = ?", [bad])
    data = memory_store.load_conversation(bad)
    assert data.conversation.settings == {} and [m.content for m in data.messages] == ["q", "a"]
    assert data.messages[1].meta == {} and data.summaries[0].settings == {}
    assert len(data.warnings) == 3 and any("meta" in w for w in data.warnings)
    assert "not valid JSON" in caplog.text
    assert {c.id for c in memory_store.list_conversations()} == {bad, good}
    assert snapshot(memory_store, good) == good_before
    json.loads(memory_store.export_conversation(bad))  # still exportable


# ---- export / import ------------------------------------------------------------------------------------------


def rich_conversation(store: Store) -> str:
    cid = store.create_conversation("Trip — Oslo ✈", model="gemma-3-270m", settings={"temperature": 0.7})
    u1, a1 = turn(store, cid, "Plan 3 days in Oslo\n## User\n<!-- hearth:message {} -->", "Day 1: museums -->", None)
    store.add_citations(a1, [{"evidence_id": "doc1#4", "path": "oslo.pdf", "page": 2, "quote": "Munch"},
                             {"evidence_id": "doc2#0", "path": "notes.txt"},
                             {"evidence_id": "doc1#5", "path": "oslo.pdf", "page": 3, "quote": "Open daily",
                              "supported": False, "sentence_start": 0, "sentence_end": 6,
                              "support": {"missing": ["1"], "similarity": None, "threshold": None,
                                          "reason": "not in the cited passage: 1", "supported": False}}])
    u2 = store.append_message(cid, "user", "Budget is 500 €\r\nand no boats", a1, token_count=9,
                              meta={"note": "x --> y"})
    r = store.begin_streaming_message(cid, u2)
    store.update_streaming_message(r, "With 500 €", reasoning="think >")
    err = store.begin_streaming_message(cid, u2)
    store.finish_message(err, "error", content="", meta={"error": "Cancelled"})
    a2 = store.begin_streaming_message(cid, u2)
    a2 = store.finish_message(a2, content="Skip the ferry; walk.", token_count=5)
    turn(store, cid, "Plan 4 days instead", "", None)  # an edited first message: another root
    store.add_summary(cid, "User: Oslo, 3 days, 500 €.", u1, a2, model="gemma", settings={"max_tokens": 64})
    return cid


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_export_import_round_trip_is_lossless(memory_store: Store, tmp_path: Path, fmt: str) -> None:
    cid = rich_conversation(memory_store)
    original = snapshot(memory_store, cid)
    text = memory_store.export_conversation(cid, fmt)
    with Store(tmp_path / "other.db") as other:
        assert other.import_conversation(text) == cid
        assert snapshot(other, cid) == original
        assert other.export_conversation(cid, fmt) == text
        assert other.search("ferry")
    with pytest.raises(StoreError, match="already exists"):
        memory_store.import_conversation(text)


def test_markdown_is_readable_and_edits_are_detected(memory_store: Store) -> None:
    cid = rich_conversation(memory_store)
    md = memory_store.export_conversation(cid, "md")
    assert md.startswith("# Trip — Oslo ✈\n") and "## Assistant (incomplete)" in md and "Skip the ferry" in md
    assert "- source: oslo.pdf, page 2" in md
    with pytest.raises(InvalidRequest, match="edited|damaged"):
        memory_store.import_conversation(md.replace("Skip the ferry; walk.", "Take the ferry"), as_new=True)


def test_import_as_new_recomputes_ids(memory_store: Store) -> None:
    cid = rich_conversation(memory_store)
    new = memory_store.import_conversation(memory_store.export_conversation(cid), as_new=True)
    old, copy = memory_store.load_conversation(cid), memory_store.load_conversation(new)
    assert new != cid and [m.content for m in copy.messages] == [m.content for m in old.messages]
    assert {m.id for m in copy.messages}.isdisjoint({m.id for m in old.messages})
    by_id = {m.id: m for m in copy.messages}
    s = copy.summaries[0]
    assert by_id[s.first_message_id].content.startswith("Plan 3 days")
    assert by_id[s.last_message_id].content == "Skip the ferry; walk."
    assert {c.message_id for c in copy.citations} <= set(by_id)


def test_identical_regenerations_stay_apart_through_export_and_import(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u, a = turn(memory_store, cid, "Name a colour", "Blue.", None)
    b = memory_store.finish_message(memory_store.begin_streaming_message(cid, u), content="Blue.")
    for fmt in ("json", "md"):
        new = memory_store.import_conversation(memory_store.export_conversation(cid, fmt), as_new=True)
        kids = memory_store.load_conversation(new).messages[1:]
        assert [m.content for m in kids] == ["Blue.", "Blue."] and len({m.id for m in kids}) == 2
        assert memory_store.get_conversation(new).current_message_id == kids[1].id
    assert b != a


def test_conversation_management(memory_store: Store) -> None:
    a, b = memory_store.create_conversation("a"), memory_store.create_conversation("b")
    turn(memory_store, a, "q", "r", None)
    memory_store.rename(b, "renamed")  # a rename keeps the chat's place (it jumped to the top: issue 27)
    assert [c.title for c in memory_store.list_conversations()] == ["a", "renamed"]
    assert memory_store.list_conversations()[0].message_count == 2
    assert memory_store.resolve_conversation_id(a[:6]) == a
    memory_store.delete(a)
    assert [c.id for c in memory_store.list_conversations()] == [b] and memory_store.search("q") == []
    with pytest.raises(StoreError):
        memory_store.get_conversation(a)


# ---- module layering ----------------------------------------------------------------------------------------


def _imports_of(module: Path) -> set[str]:
    """Every module named by an import statement in ``module`` (``from a import b`` gives ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_records_and_transfer_never_import_the_store() -> None:
    memory = REPO / "app" / "memory"
    assert "app.memory.store" not in _imports_of(memory / "transfer.py")
    assert not {n for n in _imports_of(memory / "records.py") if n.startswith("app.memory")}
    assert {"app.memory.records", "app.memory.transfer"} <= _imports_of(memory / "store.py")
