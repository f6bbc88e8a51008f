"""ChatSession with a fake engine (generate_fn) and a fake tokenizer (one token per word): streaming into the
store, errors, branches, and a 60-turn conversation in a small window where every request fits and summaries
name exactly the turns they cover. The same run on the real model is the engine's test."""

from __future__ import annotations

import re

import pytest

from app.assistant.session import ChatSession, TurnResult
from app.errors import Cancelled, EngineCrashed
from app.memory.store import Store
from app.protocol.types import ChatMessage, Delta, Done, Metrics

OVERHEAD = 4


def words(text: str) -> int:
    return len(text.split())


class ScriptedGenerate:
    """A ``generate_fn`` for ``ChatSession`` (not an engine: tests/fakes.py has the one fake engine), with one
    token per word so budgets are easy to predict. Streams a canned answer word by word; answers a summary
    prompt with "covers turns A-B" where A..B are the turn numbers it can see (in the excerpt and in earlier
    summaries)."""

    def __init__(self, n_ctx: int, answer_words: int = 30) -> None:
        self.n_ctx, self.answer_words = n_ctx, answer_words
        self.requests: list[tuple[list[ChatMessage], int, int]] = []
        self.summaries: list[str] = []
        self.fail_after: int | None = None
        self.on_delta = None

    def __call__(self, messages: list[ChatMessage], max_tokens: int, **opts):
        prompt = sum(words(m.content) + OVERHEAD for m in messages)
        self.requests.append((list(messages), prompt, max_tokens))
        last = messages[-1].content
        if last.startswith("Summarize the conversation"):
            seen = [int(n) for n in re.findall(r"turn(\d+)", last)]
            seen += [n for a, b in re.findall(r"covers turns (\d+)-(\d+)", last) for n in (int(a), int(b))]
            text = f"covers turns {min(seen)}-{max(seen)}" + " note" * 37  # 40 words, as a real summary
            self.summaries.append(text)
            yield Delta(text)
            yield Done("stop", Metrics(prompt_tokens=prompt, completion_tokens=4))
            return
        n = int(re.findall(r"turn(\d+)user", last)[-1]) if "user" in last else 0
        out = [f"turn{n}answer"] + [f"w{k}" for k in range(self.answer_words - 1)]
        for k, w in enumerate(out):
            if self.fail_after is not None and k == self.fail_after:
                raise Cancelled("stopped by the person")
            yield Delta(w + " ")
            if self.on_delta:
                self.on_delta()
        yield Done("stop", Metrics(prompt_tokens=prompt, completion_tokens=len(out)))


def session(store: Store, engine: ScriptedGenerate, **kw) -> ChatSession:
    args = dict(n_ctx=engine.n_ctx, max_tokens=64, system_prompt="You are a helpful assistant.", model="fake-1",
                message_overhead=OVERHEAD, margin=8, update_interval_s=0.0)
    args.update(kw)
    return ChatSession(store, engine, words, **args)


def test_one_turn_is_stored_and_reported(memory_store: Store) -> None:
    engine = ScriptedGenerate(n_ctx=1024)
    chat = session(memory_store, engine)
    cid = chat.new_conversation()
    seen: list[str] = []
    result = chat.send(cid, "turn0user hello", on_delta=seen.append,
                       citations=[{"evidence_id": "e1", "path": "a.pdf", "page": 1}])
    assert isinstance(result, TurnResult) and "".join(seen) == result.text
    assert result.text.startswith("turn0answer w0") and result.finish_reason == "stop"
    assert result.metrics["completion_tokens"] == 30 and result.context["n_ctx"] == 1024
    answer = memory_store.get_message(result.message_id)
    assert (answer.status, answer.parent_id, answer.token_count) == ("complete", result.user_message_id, 30)
    assert answer.meta["model"] == "fake-1" and answer.meta["finish_reason"] == "stop"
    assert answer.meta["context"] == result.context
    assert memory_store.citations_for(result.message_id)[0].path == "a.pdf"
    conv = memory_store.get_conversation(cid)
    assert conv.title == "turn0user hello" and conv.current_message_id == result.message_id
    assert engine.requests[0][0] == [ChatMessage("system", "You are a helpful assistant."),
                                     ChatMessage("user", "turn0user hello")]


def test_answer_is_incomplete_while_streaming(memory_store: Store) -> None:
    engine = ScriptedGenerate(n_ctx=1024, answer_words=5)
    chat = session(memory_store, engine)
    cid = chat.new_conversation()
    states = []
    engine.on_delta = lambda: states.append([(m.status, m.content) for m in memory_store.messages(cid)][-1])
    chat.send(cid, "turn0user hi")
    assert states[0] == ("incomplete", "turn0answer ") and states[-1][0] == "incomplete"
    assert memory_store.messages(cid)[-1].status == "complete"


@pytest.mark.parametrize("how", ["engine error", "consumer leaves"])
def test_interrupted_answer_keeps_partial_text_as_error(memory_store: Store, how: str) -> None:
    engine = ScriptedGenerate(n_ctx=1024)
    chat = session(memory_store, engine)
    cid = chat.new_conversation()
    if how == "engine error":
        engine.fail_after = 3
        with pytest.raises(Cancelled):
            chat.send(cid, "turn0user hi")
    else:
        stream = chat.stream(cid, "turn0user hi")
        assert type(next(stream)).__name__ == "ContextPlan"  # what the model is given comes first
        for _ in range(3):
            next(stream)
        stream.close()
    answer = memory_store.messages(cid)[-1]
    assert answer.status == "error" and answer.content == "turn0answer w0 w1 "
    assert answer.meta["error"] in ("Cancelled", "GeneratorExit")
    engine.fail_after = None
    again = chat.send(cid, "turn1user try again")  # the conversation goes on from there
    assert memory_store.path_to(again.message_id)[-3].id == answer.id


def test_edit_and_regenerate_make_branches(memory_store: Store) -> None:
    engine = ScriptedGenerate(n_ctx=1024, answer_words=3)
    chat = session(memory_store, engine)
    cid = chat.new_conversation()
    first = chat.send(cid, "turn0user plan a trip")
    second = chat.send(cid, "turn1user make it longer")
    edited = chat.send(cid, "turn1user make it shorter", parent_id=first.message_id)
    assert [m.content for m in memory_store.children(first.message_id)] == ["turn1user make it longer",
                                                                             "turn1user make it shorter"]
    engine.answer_words = 4
    regen = list(chat.regenerate(cid, second.user_message_id))[-1]
    assert {m.id for m in memory_store.children(second.user_message_id)} == {second.message_id, regen.message_id}
    assert memory_store.get_message(edited.message_id).status == "complete"
    assert memory_store.get_conversation(cid).current_message_id == regen.message_id


def test_failed_summarizer_still_fits_by_leaving_old_turns_out(memory_store: Store) -> None:
    def broken(prompt: str, max_tokens: int) -> str:
        raise EngineCrashed("the engine died")

    engine = ScriptedGenerate(n_ctx=300)
    chat = session(memory_store, engine, summarizer=broken)
    cid = chat.new_conversation()
    results = [chat.send(cid, f"turn{i}user question {i}") for i in range(10)]
    assert results[-1].dropped_ids and results[-1].summaries_added == []
    assert all(p + m <= 300 for _, p, m in engine.requests)
    assert len(memory_store.messages(cid)) == 20


def test_sixty_turns_in_a_small_window(memory_store: Store) -> None:
    n_ctx = 512
    engine = ScriptedGenerate(n_ctx=n_ctx, answer_words=30)
    chat = session(memory_store, engine)
    cid = chat.new_conversation()
    results = []
    answer_prompts = []
    for i in range(60):
        results.append(chat.send(cid, f"turn{i}user please remember that item {i} costs {i * 7} euros"))
        answer_prompts.append(engine.requests[-1][0])
        assert answer_prompts[-1][-1].content.endswith(f"costs {i * 7} euros")

    # every request, answers and summaries alike, fits the window with room for its max_tokens
    assert all(prompt + max_tokens <= n_ctx for _, prompt, max_tokens in engine.requests)
    assert all(not r.dropped_ids for r in results)

    # summaries were written, each names exactly the turns it covers (the fake echoes the turns it saw)
    path = memory_store.path_to(results[-1].message_id)
    assert len(path) == 120 and all(m.status == "complete" for m in path)
    turn_of = {m.id: k // 2 for k, m in enumerate(path)}
    summaries = memory_store.summaries_for(cid)
    assert len(summaries) >= 5 and len(engine.summaries) == len(summaries)
    for s in summaries:
        first, last = memory_store.get_message(s.first_message_id), memory_store.get_message(s.last_message_id)
        assert first.role == "user" and last.role == "assistant"  # whole turns
        assert s.text.startswith(f"covers turns {turn_of[first.id]}-{turn_of[last.id]} note")
        assert s.model == "fake-1" and s.settings["max_tokens"] == chat.builder.summary_max_tokens
    assert any(s.settings["rollup_of"] for s in summaries)  # summaries were folded together along the way

    # the last prompt: summaries cover a prefix, everything after it is verbatim, nothing is missing
    last_plan, _ = chat.plan(cid, results[-1].user_message_id)
    chain = [s for s in summaries if s.id in last_plan.summary_ids]
    covered = turn_of[chain[-1].last_message_id]
    assert chain[0].first_message_id == path[0].id
    assert last_plan.history_ids == [m.id for m in path[2 * covered + 2:-2]]

    # every original message is still stored and searchable by its own words
    for i in (0, 1, 17, 42, 59):
        hits = memory_store.search(f"turn{i}user") + memory_store.search(f"turn{i}answer")
        assert {h.role for h in hits} == {"user", "assistant"}

    # turns that add no summary reuse the previous prompt as an exact prefix (what the prefix cache needs)
    quiet = [k for k in range(1, 60) if not results[k].summaries_added]
    assert len(quiet) >= 40
    for k in quiet:
        assert answer_prompts[k][: len(answer_prompts[k - 1])] == answer_prompts[k - 1]


def test_engine_error_mid_answer_keeps_what_was_said(memory_store: Store) -> None:
    def failing(messages, max_tokens, **opts):
        yield Delta("par")
        raise EngineCrashed("llama.cpp aborted")  # as Engine.generate raises it

    chat = ChatSession(memory_store, failing, words, n_ctx=256, max_tokens=32, update_interval_s=0.0)
    cid = chat.new_conversation()
    with pytest.raises(EngineCrashed):
        chat.send(cid, "again?")
    last = memory_store.messages(cid)[-1]
    assert (last.status, last.content, last.meta["error"]) == ("error", "par", "EngineCrashed")


def test_tool_definitions_are_their_own_part_of_the_context(memory_store: Store) -> None:
    # The exact prompt count includes the tool definitions the engine rendered; the parts do not, so they
    # were all counted as "Chat template" in the window's context tooltip (494 of them: issue 27).
    defs = 40

    def generate(messages, max_tokens, **opts):
        yield Delta("Sunny. ")
        yield Done("stop", Metrics(prompt_tokens=count(messages), completion_tokens=2),
                   info={"tools_tokens": defs})

    def count(messages) -> int:
        return sum(words(m.content) + OVERHEAD for m in messages) + 1 + defs

    chat = ChatSession(memory_store, generate, words, n_ctx=1024, max_tokens=64, system_prompt="Be brief.",
                       message_overhead=OVERHEAD, margin=8, update_interval_s=0.0, count_messages=count)
    cid = chat.new_conversation()
    result = chat.send(cid, "weather in Oslo")
    ctx = result.context
    assert ctx["tool_definitions"] == defs and ctx["template"] == 2 * OVERHEAD + 1
    assert sum(ctx[k] for k in ("system", "summaries", "history", "evidence", "user", "tool_definitions",
                                "template")) == result.metrics["prompt_tokens"]
    assert memory_store.get_message(result.message_id).meta["context"] == ctx  # after a restart too

    from app.ui.formatting import context_tooltip

    tip = context_tooltip(ctx, result.metrics)
    assert f"Tool definitions: {defs}" in tip and f"Chat template (role markers, BOS): {2 * OVERHEAD + 1}" in tip
