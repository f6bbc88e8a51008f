"""Tool use in conversation memory, without a model: calls and results as original records (addresses,
immutability, the m004 migration), export and import (JSON, Markdown, as new, version 1 files), and the
context builder (ChatMessages with tool_calls / role tool, a result cut to its share with a note, calls
without results left out, summaries covering tool turns while the records stay)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database

from app.errors import StoreError
from app.memory import Store
from app.memory.context import ContextBuilder, cut_note
from app.memory.migrations import migrations
from app.memory.records import message_id
from app.protocol.tools import ToolCall
from app.protocol.types import ChatMessage

CALL = ToolCall("call_a", "t__add", '{"a": 2, "b": 3}')


def tool_turn(store: Store, cid: str, parent: str | None = None, result: str = "5", answer: str = "It is 5.",
              call: ToolCall = CALL) -> list[str]:
    """user → assistant(call) → tool(result) → assistant(answer); returns the four ids."""
    u = store.append_message(cid, "user", "What is 2 + 3?", parent)
    a = store.append_message(cid, "assistant", "", u, tool_calls=(call,))
    t = store.append_message(cid, "tool", result, a, tool_call_id=call.id, name=call.name,
                             meta={"outcome": "ok", "server": "t"})
    f = store.append_message(cid, "assistant", answer, t)
    return [u, a, t, f]


def test_calls_and_results_are_stored_with_their_own_addresses(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u, a, t, _ = tool_turn(memory_store, cid)
    other = memory_store.append_message(cid, "assistant", "", u, tool_calls=(ToolCall("call_b", "t__echo", "{}"),))
    assert a != other  # two calls with no text are two messages
    assert a != message_id("assistant", "", u, cid)  # and neither is the plain empty answer
    assert message_id("user", "hi", None, cid) == message_id("user", "hi", None, cid, (), None, None)
    msg, res = memory_store.get_message(a), memory_store.get_message(t)
    assert msg.tool_calls == (CALL,) and msg.content == ""
    assert (res.role, res.content, res.tool_call_id, res.name, res.meta["outcome"]) == ("tool", "5", "call_a",
                                                                                      "t__add", "ok")
    assert memory_store.append_message(cid, "tool", "5", a, tool_call_id="call_a", name="t__add") == t  # no-op


def test_a_streamed_answer_finishes_with_its_calls_and_is_rekeyed(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    aid = memory_store.begin_streaming_message(cid, u)
    final = memory_store.finish_message(aid, content="Let me add.", tool_calls=(CALL,))
    assert final == message_id("assistant", "Let me add.", u, cid, (CALL,))
    assert memory_store.get_message(final).tool_calls == (CALL,)


def test_finished_tool_records_cannot_be_changed(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    _, a, t, _ = tool_turn(memory_store, cid)
    for sql, mid in (("UPDATE messages SET tool_calls = '[]' WHERE id = ?", a),
                     ("UPDATE messages SET content = 'forged' WHERE id = ?", t),
                     ("UPDATE messages SET tool_call_id = 'x' WHERE id = ?", t)):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            memory_store.db.execute(sql, [mid])


def test_m004_upgrades_an_older_database_and_keeps_its_addresses(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    db = Database(path)
    migrations.apply(db, stop_before="m004_tool_messages")
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES ('c1', 'old', 't', 't')")
    mid = message_id("user", "hello", None, "c1")
    db.execute("INSERT INTO messages (id, conversation_id, role, content, created) VALUES (?, 'c1', 'user', "
               "'hello', 't')", [mid])
    db.close()
    with Store(path) as store:
        old = store.get_message(mid)
        assert (old.tool_calls, old.tool_call_id, old.name) == ((), None, None)
        assert store.append_message("c1", "user", "hello") == mid
        with pytest.raises(sqlite3.IntegrityError):
            store.db.execute("UPDATE messages SET tool_name = 'x' WHERE id = ?", [mid])


def test_a_broken_tool_calls_field_loads_as_none_with_a_warning(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    aid = memory_store.begin_streaming_message(cid, None)
    memory_store.db.execute("UPDATE messages SET tool_calls = '[{\"id\": 1}]' WHERE id = ?", [aid])
    data = memory_store.load_conversation(cid)
    assert data.messages[0].tool_calls == () and "tool_calls" in data.warnings[0]


# ---- export / import ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_tool_turns_export_and_import_unchanged(memory_store: Store, tmp_path: Path, fmt: str) -> None:
    cid = memory_store.create_conversation("tools")
    ids = tool_turn(memory_store, cid, result="line one\n## not a heading\n<!-- hearth:message {} -->")
    text = memory_store.export_conversation(cid, fmt)
    if fmt == "md":
        assert "## Tool (t__add)" in text and '- calls `t__add` with `{"a": 2, "b": 3}`' in text
    else:
        doc = json.loads(text)
        assert doc["version"] == 3
        assert doc["messages"][1]["tool_calls"] == [{"id": "call_a", "name": "t__add", "arguments": CALL.arguments}]
        assert (doc["messages"][2]["tool_call_id"], doc["messages"][2]["name"]) == ("call_a", "t__add")
    with Store(tmp_path / "other.db") as other:
        assert other.import_conversation(text) == cid
        got = other.load_conversation(cid).messages
        assert [m.id for m in got] == ids
        assert [(m.role, m.content, m.tool_calls, m.tool_call_id, m.name) for m in got] == [
            (m.role, m.content, m.tool_calls, m.tool_call_id, m.name) for m in memory_store.messages(cid)]


def test_import_as_new_recomputes_tool_addresses(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    ids = tool_turn(memory_store, cid)
    new = memory_store.import_conversation(memory_store.export_conversation(cid), as_new=True)
    got = memory_store.messages(new)
    assert got[1].id == message_id("assistant", "", got[0].id, new, (CALL,)) and got[1].id not in ids
    assert got[2].parent_id == got[1].id and got[2].tool_call_id == "call_a"


def test_a_version_1_export_still_imports(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    memory_store.append_message(cid, "user", "hi")
    doc = json.loads(memory_store.export_conversation(cid))
    doc["version"] = 1
    for m in doc["messages"]:
        for k in ("tool_calls", "tool_call_id", "name"):
            m.pop(k)
    memory_store.delete(cid)
    assert memory_store.import_conversation(doc) == cid
    assert memory_store.messages(cid)[0].tool_calls == ()


def test_malformed_tool_calls_in_an_export_are_refused(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    tool_turn(memory_store, cid)
    doc = json.loads(memory_store.export_conversation(cid))
    memory_store.delete(cid)
    doc["messages"][1]["tool_calls"] = [{"id": "x", "name": "f"}]
    with pytest.raises(Exception, match=r"tool_calls\[0\] needs id, name and arguments"):
        memory_store.import_conversation(doc)
    with pytest.raises(StoreError):
        memory_store.get_conversation(cid)


# ---- the context builder -------------------------------------------------------------------------------------


def chars(text: str) -> int:
    return len(text)


def builder(**kw) -> ContextBuilder:
    args = dict(count_tokens=chars, n_ctx=2000, max_tokens=100, message_overhead=2, margin=8)
    args.update(kw)
    return ContextBuilder(**args)


def test_history_tool_turns_become_tool_messages(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    ids = tool_turn(memory_store, cid)
    history = memory_store.path_to(ids[-1])
    plan = builder().build(history, "and 3 + 4?")
    assert plan.messages == [ChatMessage("user", "What is 2 + 3?"), ChatMessage("assistant", "", tool_calls=(CALL,)),
                             ChatMessage("tool", "5", tool_call_id="call_a", name="t__add"),
                             ChatMessage("assistant", "It is 5."), ChatMessage("user", "and 3 + 4?")]


def test_the_turns_own_calls_come_after_the_message_and_count_as_tools(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u, a, t, _ = tool_turn(memory_store, cid)
    path = memory_store.path_to(t)
    plan = builder().build([], path[0].content, tail=path[1:], evidence=["[E:1] a passage"])
    assert [m.role for m in plan.messages] == ["user", "assistant", "tool"]
    assert plan.messages[0].content.endswith("What is 2 + 3?") and "[E:1]" in plan.messages[0].content
    assert plan.breakdown["tools"] == sum(chars(x) + 2 for x in ("\nt__add" + '({"a": 2, "b": 3})', "5"))
    assert plan.prompt_tokens == sum(plan.breakdown[k] for k in ("system", "summaries", "history", "evidence",
                                                                 "user", "tools"))


def test_a_result_larger_than_its_share_is_cut_with_a_note(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    big = "y" * 1_048_576
    u, a, t, _ = tool_turn(memory_store, cid, result=big)
    b = builder()
    plan = b.build([], "q", tail=memory_store.path_to(t)[1:])
    shown = plan.messages[-1].content
    cap = b.tool_result_cap
    assert cap == int((2000 - 100 - 8) * 0.25)
    n = len(shown) - len(shown.split("\n")[-1]) - 1
    assert shown == "y" * n + "\n" + cut_note(1_048_576, n) and chars(shown) <= cap and n > cap // 2
    assert shown.endswith("first {:,} shown; the whole result is kept in the conversation]".format(n))
    assert len(memory_store.get_message(t).content) == 1_048_576
    # the same cut in the next turn's history: this turn's prompt stays the prefix of the next one
    later = b.build(memory_store.path_to(memory_store.messages(cid)[-1].id), "next?")
    assert later.messages[2].content == shown


def test_results_that_together_do_not_fit_share_what_is_left(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    tip = memory_store.append_message(cid, "user", "q")
    calls = tuple(ToolCall(f"call_{i}", "t__big", "{}") for i in range(6))
    tip = memory_store.append_message(cid, "assistant", "", tip, tool_calls=calls)
    for c in calls:
        tip = memory_store.append_message(cid, "tool", "z" * 5000, tip, tool_call_id=c.id, name=c.name)
    plan = builder().build([], "q", tail=memory_store.path_to(tip)[1:])
    results = [m.content for m in plan.messages if m.role == "tool"]
    assert len(results) == 6 and all("[result cut: 5,000 bytes" in r for r in results)
    assert plan.breakdown["free"] >= 0


def test_a_call_without_its_result_is_left_out(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    a = memory_store.append_message(cid, "assistant", "", u, tool_calls=(CALL,))  # stopped before the result
    plan = builder().build(memory_store.path_to(a), "again")
    assert [m.role for m in plan.messages] == ["user"] and plan.messages[0].content == "q\n\nagain"


def test_summaries_may_cover_tool_turns_and_the_records_stay(memory_store: Store) -> None:
    from app.assistant.session import ChatSession

    cid = memory_store.create_conversation()
    tip = None
    for i in range(8):
        tip = tool_turn(memory_store, cid, tip, result=f"result {i} " * 30, answer=f"answer {i} " * 10,
                        call=ToolCall(f"call_{i}", "t__add", "{}"))[-1]
    before = [(m.id, m.content) for m in memory_store.messages(cid)]
    prompts: list[str] = []

    def summarizer(prompt: str, max_tokens: int) -> str:
        prompts.append(prompt)
        return "The user asked sums; the tools answered."

    s = ChatSession(memory_store, lambda *a, **k: iter(()), chars, n_ctx=1500, max_tokens=100,
                    summarizer=summarizer, summary_max_tokens=60)
    plan, added = s.plan(cid, memory_store.append_message(cid, "user", "and now?", tip))
    assert added and "Tool result: (t__add) result 0" in prompts[0] and "(calls t__add({}))" in prompts[0]
    assert [(m.id, m.content) for m in memory_store.messages(cid)][:len(before)] == before
    assert plan.messages[0].role == "system" and "The user asked sums" in plan.messages[0].content
    roles = [m.role for m in plan.messages]
    assert roles[-1] == "user" and all(r in ("system", "user", "assistant", "tool") for r in roles)
