"""The one turn pipeline (``app.assistant``) on the real bundled model: the events a turn yields, what it
stores, citations, evidence trimmed passage by passage, and stateless HTTP grounding giving the model the same
prompt text as a stored chat turn. The adapters' own tests (tests/test_cli_real.py, tests/test_ui_window.py,
tests/test_server_real.py) run the same path through the CLI, the window and the port."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.assistant import Assistant, DocumentSource, EvidenceFound, TextDelta, TurnDone, ground
from app.assistant.evidence import evidence_text
from app.engine.local.engine import Engine
from app.protocol.types import ChatMessage, DecodingParams, LoadSettings
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore

pytestmark = pytest.mark.model
QUESTION = "What is the code word?"


@pytest.fixture(scope="module")
def engine(bundled_model: Path):
    with Engine(bundled_model, LoadSettings(n_ctx=2048)) as eng:
        yield eng


@pytest.fixture
def docs(tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "notes.txt").write_text("The code word is PELICAN.\n", encoding="utf-8")
    for i in range(6):  # more passages that also match the question, to be trimmed
        (folder / f"other{i}.txt").write_text(f"Filler sentence {i} says one word about nothing much. " * 10,
                                              encoding="utf-8")
    store = DocumentStore(tmp_path / "documents.db")
    Ingester(store).ingest([str(folder)])
    source = DocumentSource(store, owns_store=True)  # no embedder: BM25
    yield source
    source.close()


@pytest.fixture
def memory(memory_store):
    return memory_store


def greedy(max_tokens: int = 16) -> DecodingParams:
    return DecodingParams.make(temperature=0.0, max_tokens=max_tokens)


def test_a_turn_yields_evidence_text_and_done_and_stores_the_cited_answer(engine, docs, memory):
    a = Assistant(engine, memory, decoding=greedy(), documents=docs, k=2)
    cid = a.new_conversation()
    events = list(a.turn(cid, QUESTION))
    assert isinstance(events[0], EvidenceFound) and isinstance(events[-1], TurnDone)
    assert all(isinstance(e, TextDelta) for e in events[1:-1]) and len(events) > 2
    done = events[-1]
    assert "".join(e.text for e in events[1:-1]) == done.result.text
    assert len(events[0].evidence) == 2 and "PELICAN" in events[0].evidence[0].text
    assert [e["evidence_id"] for e in done.evidence] == [e.evidence_id for e in events[0].evidence]
    stored = memory.get_message(done.result.message_id)
    assert stored.status == "complete" and stored.content == done.result.text
    assert [c.evidence_id for c in memory.citations_for(stored.id)] == [c["evidence_id"] for c in done.citations]
    assert all(isinstance(c["supported"], bool) for c in done.citations)  # checked, and stored with the check
    assert [c.supported for c in memory.citations_for(stored.id)] == [c["supported"] for c in done.citations]
    assert memory.get_conversation(cid).model == Path(engine.model_path).stem  # one model id, no ".gguf"
    ctx, m = done.result.context, done.result.metrics
    planned = sum(ctx[k] for k in ("system", "summaries", "history", "evidence", "user", "template"))
    assert m["prompt_tokens"] == planned and ctx["evidence"] > 0  # the parts sum to what was prefilled
    assert ctx["free"] == ctx["n_ctx"] - ctx["reserved"] - planned


def test_the_context_breakdown_sums_to_the_prefilled_prompt(engine, docs, memory):
    """System prompt, history and evidence: each part is its own text's tokens, ``template`` the markers."""
    a = Assistant(engine, memory, decoding=greedy(8), documents=docs, k=2, system_prompt="Answer in one word.")
    cid = a.new_conversation()
    parts = ("system", "summaries", "history", "evidence", "user", "template")
    for text in (QUESTION, "What is the capital of France?", "And of Italy?"):
        r = a.send(cid, text).result
        assert r.metrics["prompt_tokens"] == sum(r.context[k] for k in parts), r.context
        assert r.context["system"] > 0 and r.context["template"] > 0
    assert r.context["history"] > 0


def test_evidence_is_trimmed_passage_by_passage_under_one_header(engine, docs, memory):
    small = Engine(engine.model_path, LoadSettings(n_ctx=512))
    with small:
        a = Assistant(small, memory, decoding=greedy(8), documents=docs, k=6)
        found = docs.search(QUESTION, 6)
        done = a.send(a.new_conversation(), QUESTION)
    given = done.evidence
    assert 0 < len(given) < len(found.evidence), "some passages fitted, the rest were left out whole"
    ids = [e.evidence_id for e in found.evidence]
    kept = [ids.index(g["evidence_id"]) for g in given]
    assert kept == sorted(kept) and given[0]["evidence_id"] == ids[0]  # rank order kept, the best one first
    assert f"{len(found.evidence) - len(given)} matching passages left out" in done.notice
    prompt = evidence_text([found.evidence[i] for i in kept]).block()
    assert prompt.count("Answer from the evidence below") == 1  # one header, not two stacked


def test_http_grounding_gives_the_same_prompt_text_as_a_stored_turn(engine, docs, memory):
    a = Assistant(engine, memory, decoding=greedy(), documents=docs, k=2)
    found = docs.search(QUESTION, 2)
    stored = a.session.builder.build([], QUESTION, evidence=evidence_text(found.evidence))
    messages, grounding = ground(engine, docs, (ChatMessage("user", QUESTION),), k=2, max_tokens=16)
    assert messages[-1] == stored.messages[-1]
    assert [e.evidence_id for e in grounding.evidence] == [e.evidence_id for e in found.evidence]
    assert grounding.tokens == stored.breakdown["evidence"]


def test_stop_keeps_the_partial_answer_and_the_next_turn_goes_on(engine, memory):
    a = Assistant(engine, memory, decoding=greedy(64))
    cid = a.new_conversation()
    turn = a.turn(cid, "Count from 1 to 50: 1, 2, 3,")
    first = next(turn)
    assert isinstance(first, TextDelta)
    a.cancel()
    from app.errors import Cancelled

    with pytest.raises(Cancelled):
        list(turn)
    last = memory.messages(cid)[-1]
    assert last.status == "error" and last.meta["error"] == "Cancelled"
    again = a.send(cid, "What is the capital of France?")
    assert again.result.finish_reason in ("stop", "length") and memory.get_message(again.result.message_id)


def test_thinking_on_the_bundled_model_is_stored_apart_from_the_answer(engine, memory):
    """Gemma 3 270M has no thinking markers: with a budget the engine prefills ``<think>\\n`` and forces the
    end of thinking at the budget. The thinking streams as ReasoningDelta, is stored apart, and neither the
    answer text nor the next turn's prompt holds it."""
    from app.assistant import ReasoningDelta

    a = Assistant(engine, memory, decoding=greedy(48))
    cid = a.new_conversation()
    memory.set_reasoning_settings(cid, {"reasoning_budget": 16})
    events = list(a.turn(cid, "What is 12 + 30?"))
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    done = events[-1]
    assert isinstance(done, TurnDone) and thought.strip() and answer == done.result.text
    m = done.result.metrics
    assert (m["reasoning_tokens"], m["reasoning_stopped_by"], m["reasoning_forced"]) == (16, "budget", True)
    assert m["ttfat_s"] > m["ttft_s"] and m["answer_tokens"] > 0
    for marker in ("<think>", "</think>"):
        assert marker not in done.result.text and marker not in thought
    assert thought not in done.result.text
    stored = memory.get_message(done.result.message_id)
    assert stored.content == done.result.text
    r = memory.reasoning_for(stored.id)
    assert (r.text, r.tokens, r.budget, r.stopped_by) == (thought, 16, 16, "budget")
    plan, _ = a.session.plan(cid, memory.append_message(cid, "user", "And 1 + 1?", stored.id))
    assert all(thought not in msg.content for msg in plan.messages)
    assert [msg.content for msg in plan.messages if msg.role == "assistant"] == [stored.content]
