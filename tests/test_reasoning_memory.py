"""Reasoning in memory (issue 14): thinking stored apart from the answer (m005 ``message_reasoning``), never
rewriting a message, never in a prompt, carried through re-keying, export and import; a conversation's
reasoning setting validated and stored with it; ``ChatSession`` storing a streamed answer's thinking (also
a stopped one). Pure SQLite and scripted generators, no model."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database

from app.assistant.session import ChatSession
from app.errors import Cancelled, InvalidRequest, StoreError
from app.memory.migrations import migrations
from app.memory.store import Store
from app.protocol.reasoning import ReasoningBudget, ReasoningSettings
from app.protocol.types import Delta, Done, Metrics, ReasoningRequest


def words(text: str) -> int:
    return len(text.split())


def streamed(store: Store, cid: str, parent: str, answer: str, thinking: str, **info) -> str:
    aid = store.begin_streaming_message(cid, parent)
    store.update_streaming_message(aid, answer[:3], thinking[:4])
    return store.finish_message(aid, "complete", content=answer, reasoning=thinking, reasoning_info=info)


# ---- the table -------------------------------------------------------------------------------------------------


def test_reasoning_is_stored_apart_and_the_message_row_is_untouched(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "2+2?")
    a = streamed(memory_store, cid, u, "4", "two and two make four", tokens=7, budget=256, effort="low",
                 forced=True, stopped_by="budget", thinking_s=0.5)
    r = memory_store.reasoning_for(a)
    assert (r.text, r.tokens, r.budget, r.effort, r.forced, r.stopped_by, r.unclosed, r.thinking_s) == (
        "two and two make four", 7, 256, "low", True, "budget", False, 0.5)
    row = memory_store.db.execute("SELECT content, reasoning FROM messages WHERE id = ?", [a]).fetchone()
    assert row == ("4", None)  # the message holds the answer only; m001's column is not written
    msg = memory_store.get_message(a)
    assert msg.content == "4" and msg.reasoning == "two and two make four"
    assert memory_store.reasoning_for(u) is None
    assert memory_store.search("make") == []  # search covers what was said, not the thinking


def test_reasoning_does_not_change_the_content_address(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "hi")
    plain = memory_store.append_message(cid, "assistant", "hello", u, set_current=False)
    memory_store.delete(cid)
    cid2 = memory_store.create_conversation(conversation_id=cid)
    u2 = memory_store.append_message(cid2, "user", "hi")
    thought = streamed(memory_store, cid2, u2, "hello", "greet back")
    assert thought == plain


def test_a_finished_message_keeps_its_reasoning(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    a = streamed(memory_store, cid, u, "answer", "thought")
    with pytest.raises(StoreError, match="cannot be changed"):
        memory_store.set_reasoning(a, "rewritten")
    with pytest.raises(sqlite3.IntegrityError, match="cannot be changed"):  # the trigger, under any writer
        memory_store.db.execute("UPDATE message_reasoning SET text = 'x' WHERE message_id = ?", [a])
    assert memory_store.reasoning_for(a).text == "thought"


def test_an_identical_answer_is_a_version_with_its_own_reasoning(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    first = streamed(memory_store, cid, u, "same", "first way", tokens=2)
    second = streamed(memory_store, cid, u, "same", "second way", tokens=9)
    assert first != second  # a regeneration that repeats the text is a version of its own (issue 27)
    assert memory_store.reasoning_for(first).text == "first way"
    assert memory_store.reasoning_for(second).text == "second way"
    assert memory_store.db.execute("SELECT count(*) FROM message_reasoning").fetchone() == (2,)


def test_a_stopped_answer_keeps_its_partial_reasoning_under_its_id(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    aid = memory_store.begin_streaming_message(cid, u)
    memory_store.update_streaming_message(aid, "", "half a thou")
    memory_store.update_streaming_message(aid, "", "half a thought")
    final = memory_store.finish_message(aid, "error", meta={"error": "Cancelled"})
    assert final == aid and memory_store.reasoning_for(aid).text == "half a thought"


def test_bad_reasoning_info_names_the_field(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    aid = memory_store.begin_streaming_message(cid, u)
    for info, field in (({"tokens": -1}, "tokens"), ({"stopped_by": "tired"}, "stopped_by"),
                        ({"forced": "yes"}, "forced"), ({"colour": 1}, "colour")):
        with pytest.raises(InvalidRequest, match=field) as exc:
            memory_store.finish_message(aid, "complete", content="a", reasoning="t", reasoning_info=info)
        assert exc.value.param == "reasoning_info"
    assert memory_store.get_message(aid).status == "incomplete"  # nothing was written


def test_deleting_a_conversation_deletes_its_reasoning(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    streamed(memory_store, cid, u, "a", "t")
    memory_store.delete(cid)
    assert memory_store.db.execute("SELECT count(*) FROM message_reasoning").fetchone() == (0,)


def test_m005_copies_reasoning_of_older_rows_and_leaves_them_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = Database(path)
    migrations.apply(db, stop_before="m005_message_reasoning")  # a database written by an older Hearth
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES ('c1', 'old', 't', 't')")
    db.execute("INSERT INTO messages (id, conversation_id, role, content, reasoning, created) "
               "VALUES ('m1', 'c1', 'assistant', 'answer', 'old thinking', 't')")
    db.execute("INSERT INTO messages (id, conversation_id, role, content, created) "
               "VALUES ('m2', 'c1', 'assistant', 'plain', 't')")
    db.conn.commit()
    db.close()
    with Store(path) as store:
        assert store.reasoning_for("m1").text == "old thinking" and store.reasoning_for("m2") is None
        assert store.db.execute("SELECT content, reasoning FROM messages WHERE id = 'm1'").fetchone() == (
            "answer", "old thinking")
        assert store.get_message("m1").reasoning == "old thinking"


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_export_and_import_keep_reasoning_apart(memory_store: Store, tmp_path: Path, fmt: str) -> None:
    cid = memory_store.create_conversation("think")
    u = memory_store.append_message(cid, "user", "q")
    a = streamed(memory_store, cid, u, "the answer", "# not a heading\n<!-- hearth:message {} -->", tokens=12,
                 forced=True, stopped_by="user")
    text = memory_store.export_conversation(cid, fmt)
    if fmt == "json":
        m = json.loads(text)["messages"][1]
        assert m["content"] == "the answer" and m["reasoning"].startswith("# not a heading")
        assert m["reasoning_info"]["tokens"] == 12 and m["reasoning_info"]["stopped_by"] == "user"
    with Store(tmp_path / "other.db") as other:
        assert other.import_conversation(text) == cid
        r = other.reasoning_for(a)
        assert (r.text, r.tokens, r.forced, r.stopped_by) == ("# not a heading\n<!-- hearth:message {} -->", 12,
                                                               True, "user")
        assert other.get_message(a).content == "the answer"


def test_a_version_2_export_without_reasoning_info_still_imports(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    a = streamed(memory_store, cid, u, "a", "t")
    doc = json.loads(memory_store.export_conversation(cid))
    doc["version"] = 2
    for m in doc["messages"]:
        m.pop("reasoning_info")
    memory_store.delete(cid)
    memory_store.import_conversation(doc)
    assert memory_store.reasoning_for(a).text == "t"


def test_import_refuses_bad_reasoning_info(memory_store: Store) -> None:
    cid = memory_store.create_conversation()
    u = memory_store.append_message(cid, "user", "q")
    streamed(memory_store, cid, u, "a", "t")
    doc = json.loads(memory_store.export_conversation(cid))
    doc["messages"][1]["reasoning_info"]["stopped_by"] = "boredom"
    memory_store.delete(cid)
    with pytest.raises(InvalidRequest, match="stopped_by"):
        memory_store.import_conversation(doc)


# ---- the conversation's setting --------------------------------------------------------------------------------


def test_the_conversation_setting_is_validated_and_stored_with_it(memory_store: Store) -> None:
    cid = memory_store.create_conversation(settings={"documents": ["a.txt"]})
    assert memory_store.reasoning_settings(cid) == ReasoningSettings()
    memory_store.set_reasoning_settings(cid, {"reasoning_effort": "high"})
    assert memory_store.reasoning_settings(cid) == ReasoningSettings(effort="high")
    memory_store.set_reasoning_settings(cid, ReasoningSettings(budget_tokens=300, deadline_s=2.5))
    assert memory_store.get_conversation(cid).settings == {
        "documents": ["a.txt"], "reasoning": {"reasoning_budget": 300, "reasoning_deadline_s": 2.5}}
    for bad, param in (({"reasoning_effort": "max"}, "reasoning_effort"),
                       ({"reasoning_budget": -5}, "hearth.reasoning_budget"),
                       ({"reasoning_deadline_s": 0}, "hearth.reasoning_deadline_s"),
                       ({"effort": "low"}, "effort")):
        with pytest.raises(InvalidRequest) as exc:
            memory_store.set_reasoning_settings(cid, bad)
        assert exc.value.param == param and "conversation" in str(exc.value)
    memory_store.set_reasoning_settings(cid, None)  # back to the model's default
    assert memory_store.get_conversation(cid).settings == {"documents": ["a.txt"]}


def test_a_hand_edited_bad_setting_loads_as_unset(memory_store: Store, caplog: pytest.LogCaptureFixture) -> None:
    cid = memory_store.create_conversation(settings={"reasoning": {"reasoning_effort": "extreme"}})
    assert memory_store.reasoning_settings(cid) == ReasoningSettings()
    assert "not valid" in caplog.text
    memory_store.update_conversation(cid, settings={"reasoning": "high"})
    assert memory_store.reasoning_settings(cid) == ReasoningSettings()


# ---- a turn ----------------------------------------------------------------------------------------------------


def thinking_engine(chunks: list[tuple[str, str]], fail_after: int | None = None, seen: list | None = None):
    """A ``generate_fn`` streaming ``(reasoning, text)`` pieces, then a ``Done`` with reasoning metrics (or
    ``Cancelled`` after ``fail_after`` pieces)."""

    def generate(messages, **opts):
        if seen is not None:
            seen.append((list(messages), opts))
        for i, (r, t) in enumerate(chunks):
            if fail_after is not None and i == fail_after:
                raise Cancelled("stopped")
            yield Delta(t, reasoning=r)
        thought = "".join(r for r, _ in chunks)
        m = Metrics(prompt_tokens=5, completion_tokens=9, reasoning_tokens=6, answer_tokens=3, ttfat_s=0.2,
                    thinking_s=0.15, reasoning_budget=64, reasoning_forced=True, reasoning_stopped_by="user")
        yield Done("stop", m, "".join(t for _, t in chunks), reasoning=thought)

    return generate


def test_a_turn_stores_the_thinking_apart_and_never_puts_it_in_a_prompt(memory_store: Store) -> None:
    seen: list = []
    gen = thinking_engine([("Let me add. ", ""), ("2+2=4.", ""), ("", "Four"), ("", ".")], seen=seen)
    session = ChatSession(memory_store, gen, words, n_ctx=512, max_tokens=32)
    cid = session.new_conversation()
    req = ReasoningRequest(ReasoningBudget(256, effort="low", source="conversation"))
    first = session.send(cid, "what is 2+2?", reasoning=req)
    assert first.text == "Four." and first.reasoning == "Let me add. 2+2=4."
    assert seen[0][1]["reasoning"] is req  # the option reaches the engine call
    msg = memory_store.get_message(first.message_id)
    assert msg.content == "Four." and msg.reasoning == "Let me add. 2+2=4."
    r = memory_store.reasoning_for(first.message_id)
    assert (r.tokens, r.budget, r.effort, r.forced, r.stopped_by, r.thinking_s) == (6, 64, "low", True, "user", 0.15)
    session.send(cid, "and 3+3?")
    prompt = seen[1][0]
    assert [m.content for m in prompt if m.role == "assistant"] == ["Four."]
    assert not any("Let me add" in m.content for m in prompt)


def test_a_stopped_turn_keeps_the_thinking_so_far(memory_store: Store) -> None:
    gen = thinking_engine([("step one. ", ""), ("step two. ", ""), ("", "ans")], fail_after=2)
    session = ChatSession(memory_store, gen, words, n_ctx=512, max_tokens=32)
    cid = session.new_conversation()
    req = ReasoningRequest(ReasoningBudget(1024, effort="medium", source="model"))
    with pytest.raises(Cancelled):
        session.send(cid, "go", reasoning=req)
    msg = memory_store.path_to(memory_store.get_conversation(cid).current_message_id)[-1]
    assert msg.status == "error" and msg.content == ""
    r = memory_store.reasoning_for(msg.id)
    assert r.text == "step one. step two. " and r.effort == "medium"


def test_a_turn_without_thinking_stores_no_reasoning(memory_store: Store) -> None:
    def gen(messages, **opts):
        yield Delta("plain")
        yield Done("stop", Metrics(prompt_tokens=3, completion_tokens=1), "plain")

    session = ChatSession(memory_store, gen, words, n_ctx=512, max_tokens=32)
    cid = session.new_conversation()
    res = session.send(cid, "hi")
    assert res.reasoning == "" and memory_store.reasoning_for(res.message_id) is None


# ---- the turn pipeline (app.assistant) on the shared fake engine -------------------------------------------------

THOUGHT = "<think>" + "think " * 40 + "</think>The answer is 4."


@pytest.fixture
def fake():
    from fakes import FakeEngine

    eng = FakeEngine(n_ctx=1024, reply=lambda req: THOUGHT if req.reasoning is not None else "plain answer")
    yield eng
    eng.close()


def assistant(engine, store: Store, **kw):
    from app.assistant import Assistant
    from app.protocol.types import DecodingParams

    return Assistant(engine, store, decoding=DecodingParams.make(temperature=0.0, max_tokens=400), **kw)


def test_the_budget_comes_from_the_turn_the_conversation_or_the_model(fake, memory_store: Store) -> None:
    a = assistant(fake, memory_store, reasoning_default={"reasoning_effort": "medium"})
    cid = a.new_conversation()
    a.send(cid, "one")
    assert (fake.seen[-1].reasoning.budget.effort, fake.seen[-1].reasoning.budget.source) == ("medium", "model")
    memory_store.set_reasoning_settings(cid, {"reasoning_budget": 50})
    a.send(cid, "two")
    b = fake.seen[-1].reasoning.budget
    assert (b.tokens, b.effort, b.source) == (50, None, "conversation")
    a.send(cid, "three", reasoning=ReasoningSettings(effort="none"))
    assert fake.seen[-1].reasoning.budget.off and fake.seen[-1].reasoning.budget.source == "request"
    plain = assistant(fake, memory_store)
    cid2 = plain.new_conversation()
    assert plain.send(cid2, "four").result.text == "plain answer" and fake.seen[-1].reasoning is None
    with pytest.raises(InvalidRequest) as exc:
        assistant(fake, memory_store, reasoning_default={"reasoning_effort": "max"})
    assert exc.value.param == "reasoning_effort" and "model" in str(exc.value)


def test_thinking_streams_as_reasoning_deltas_and_is_stored_apart(fake, memory_store: Store) -> None:
    from app.assistant import ReasoningDelta, TextDelta, TurnDone

    a = assistant(fake, memory_store, reasoning_default={"reasoning_effort": "low"})
    cid = a.new_conversation()
    events = list(a.turn(cid, "2+2?"))
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    done = events[-1]
    assert isinstance(done, TurnDone)
    assert thought == ("think " * 40).strip() and answer == "The answer is 4." == done.result.text
    assert done.result.reasoning == thought and done.to_dict()["reasoning"] == thought
    m = done.result.metrics
    assert m["reasoning_tokens"] > 0 and m["answer_tokens"] == len("The answer is 4.") and m["ttfat_s"] > 0
    stored = memory_store.get_message(done.result.message_id)
    assert stored.content == "The answer is 4." and "think" not in stored.content
    r = memory_store.reasoning_for(stored.id)
    assert (r.text, r.tokens, r.effort, r.forced) == (thought, m["reasoning_tokens"], "low", False)


def test_a_budget_forces_the_end_of_thinking(fake, memory_store: Store) -> None:
    a = assistant(fake, memory_store)
    cid = a.new_conversation()
    memory_store.set_reasoning_settings(cid, {"reasoning_budget": 10})
    done = a.send(cid, "quick")
    m = done.result.metrics
    assert (m["reasoning_forced"], m["reasoning_stopped_by"]) == (True, "budget")
    assert done.result.text == "The answer is 4."
    r = memory_store.reasoning_for(done.result.message_id)
    assert (r.forced, r.stopped_by, r.budget) == (True, "budget", 10)


def test_stop_thinking_ends_the_thinking_and_the_answer_follows(memory_store: Store) -> None:
    from fakes import FakeEngine

    from app.assistant import ReasoningDelta, TextDelta

    eng = FakeEngine(n_ctx=1024, token_delay_s=0.005, reply=lambda req: THOUGHT)
    try:
        a = assistant(eng, memory_store, reasoning_default={"reasoning_effort": "high"})
        cid = a.new_conversation()
        assert a.stop_thinking() is False  # nothing runs yet
        stopped, thought, answer = None, [], []
        for e in a.turn(cid, "think long"):
            if isinstance(e, ReasoningDelta):
                thought.append(e.text)
                if stopped is None and len(thought) >= 3:
                    stopped = a.stop_thinking()
            elif isinstance(e, TextDelta):
                answer.append(e.text)
            else:
                done = e
        assert stopped is True and "".join(answer) == "The answer is 4."
        assert len("".join(thought)) < len("think " * 40) - 20  # cut well before the script's end of thinking
        assert done.result.metrics["reasoning_stopped_by"] == "user"
        r = memory_store.reasoning_for(done.result.message_id)
        assert (r.stopped_by, r.forced, r.text) == ("user", True, "".join(thought))
    finally:
        eng.close()


def test_cancel_while_thinking_keeps_the_thinking_so_far(memory_store: Store) -> None:
    from fakes import FakeEngine

    from app.assistant import ReasoningDelta

    eng = FakeEngine(n_ctx=1024, token_delay_s=0.005, reply=lambda req: THOUGHT)
    try:
        a = assistant(eng, memory_store, reasoning_default={"reasoning_effort": "low"})
        cid = a.new_conversation()
        seen = []
        with pytest.raises(Cancelled):
            for e in a.turn(cid, "go"):
                if isinstance(e, ReasoningDelta):
                    seen.append(e.text)
                    if len(seen) == 5:
                        a.cancel()
        msg = memory_store.path_to(memory_store.get_conversation(cid).current_message_id)[-1]
        assert msg.status == "error" and msg.content == ""
        assert memory_store.reasoning_for(msg.id).text.startswith("".join(seen))
    finally:
        eng.close()


def test_the_tool_reader_passes_thinking_through_at_once() -> None:
    from app.assistant.turn import _read_tools
    from app.engine.chat.tool_stream import ToolsDone, ToolStream

    events = [Delta("", reasoning="a"), Delta("", reasoning="b"), Delta("x"),
              Done("stop", Metrics(), "x", reasoning="ab")]
    out = list(_read_tools(iter(events), ToolStream(None, ())))
    assert [(o.text, o.reasoning) for o in out[:3]] == [("", "a"), ("", "b"), ("x", "")]
    assert isinstance(out[3], ToolsDone) and out[3].done.reasoning == "ab"
