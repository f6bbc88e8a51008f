"""Evidence placement for a chat that carries its own history (``app.assistant.grounding.ground``), on the fake
engine: each question keeps its evidence in its own turn, so a request's prompt begins with the previous
request's prompt and its answer (the prefix cache reuses it); a passage is given once; the oldest turns'
evidence is left out first when the prompt would not fit; a single question gets a stored turn's text."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.assistant import DocumentSource, ground
from app.assistant.evidence import evidence_text
from app.protocol.types import ChatMessage, GenerateRequest
from app.retrieval.ingest import Ingester
from tests.fakes import FakeEngine, render_text

QUESTIONS = ["How long does the kettle keep water warm?", "What does error E1 mean on the kettle?",
             "How do I descale the kettle?", "Again: how long does the kettle keep water warm?"]


@pytest.fixture
def docs(tmp_path: Path, doc_store):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "warm.md").write_text("Keep warm holds the kettle water warm for 30 minutes.", encoding="utf-8")
    (folder / "errors.md").write_text("Error E1 means the kettle was switched on empty.", encoding="utf-8")
    (folder / "scale.md").write_text("Descale the kettle with citric acid every four weeks.", encoding="utf-8")
    Ingester(doc_store).ingest([str(folder)])
    source = DocumentSource(doc_store)
    yield source
    source.close()


def chat(engine, docs, questions, k=1, system="Answer briefly.", answer=""):
    """Run a stateless chat as an API client would: the client's own messages, grounded on each request."""
    history = [ChatMessage("system", system)]
    prompts, groundings = [], []
    for q in questions:
        history.append(ChatMessage("user", q))
        messages, g = ground(engine, docs, tuple(history), k=k, max_tokens=32)
        prompts.append(render_text(GenerateRequest(messages=messages)))
        groundings.append(g)
        history.append(ChatMessage("assistant", f"answer {len(prompts)}{answer}"))
    return prompts, groundings


def test_each_prompt_begins_with_the_previous_prompt_and_its_answer(docs):
    engine = FakeEngine(n_ctx=8192)
    prompts, groundings = chat(engine, docs, QUESTIONS)
    for i in range(1, len(prompts)):
        assert prompts[i].startswith(prompts[i - 1] + f" answer {i}\n"), i
    first = groundings[0].evidence[0]
    assert "30 minutes" in first.text
    assert prompts[-1].count(first.text) == 1  # given once, in turn 1
    assert f"Also relevant, given above: [E:{first.evidence_id}]" in prompts[-1]  # turn 4 names it
    assert [len(g.evidence) for g in groundings] == [1, 2, 3, 3]  # every passage in the prompt, for citations
    assert groundings[-1].citations(f"Thirty minutes [E:{first.evidence_id}].")[0]["evidence_id"] == \
        first.evidence_id


def test_a_single_question_gets_the_stored_turns_text(docs):
    engine = FakeEngine(n_ctx=8192)
    found = docs.search(QUESTIONS[0], 1)
    messages, g = ground(engine, docs, (ChatMessage("user", QUESTIONS[0]),), k=1, max_tokens=32)
    assert messages[-1].content == evidence_text(found.evidence).block() + QUESTIONS[0]
    assert g.tokens == engine.count_tokens(evidence_text(found.evidence).block())


def test_the_oldest_turns_lose_their_evidence_first_when_it_does_not_fit(docs):
    engine = FakeEngine(n_ctx=1420)  # one character per token; long answers leave room for two turns' evidence
    prompts, groundings = chat(engine, docs, QUESTIONS[:3], answer=" blah" * 60)
    assert [e.text.split()[0] for e in groundings[-1].evidence] == ["Error", "Descale"]
    assert "30 minutes" not in prompts[-1]  # the first question's evidence was left out, the second's kept
    assert len(prompts[-1]) <= 1420 - 32 and prompts[-1].count("Answer from the evidence below") == 1


def test_searches_are_remembered_while_the_index_is_unchanged(docs, tmp_path: Path):
    a = docs.search(QUESTIONS[0], 1)
    assert docs.search(QUESTIONS[0], 1) is a
    (tmp_path / "docs" / "new.md").write_text("Keep warm is cancelled when the jug is lifted.", encoding="utf-8")
    Ingester(docs.store).ingest([str(tmp_path / "docs")])
    assert docs.search(QUESTIONS[0], 1) is not a


@pytest.mark.parametrize("question,follow_up", [
    ("And what is the least I can put in?", True),
    ("Can I use vinegar for that?", True),
    ("What about the dishwasher?", True),
    ("How do I descale the kettle?", False),  # stands alone: searched alone
    ("How long does it keep the water warm after boiling?", False),  # points back, but has content enough
])
def test_an_elliptical_follow_up_is_searched_with_the_question_before_it(question, follow_up):
    from app.assistant.grounding import is_follow_up, search_query

    assert is_follow_up(question) is follow_up
    messages = (ChatMessage("user", "How much water can the kettle hold?"), ChatMessage("assistant", "1.7 l"),
                ChatMessage("user", question))
    want = f"How much water can the kettle hold?\n{question}" if follow_up else question
    assert search_query(messages, 2) == want and search_query(messages, 0) == messages[0].content


def stored_chat(engine, docs, store, questions, k=1):
    """The same chat through the stored chat's turn pipeline (``Assistant.send``): the prompts the engine got."""
    from app.assistant import Assistant
    from app.protocol.types import DecodingParams

    a = Assistant(engine, store, decoding=DecodingParams.make(temperature=0.0, max_tokens=32), documents=docs, k=k,
                  system_prompt="Answer briefly.")
    cid = a.new_conversation()
    dones = [a.send(cid, q) for q in questions]
    return [render_text(r) for r in engine.seen], dones


def test_the_stored_chat_places_evidence_as_grounding_does(docs, memory_store):
    """The window's chat (``Assistant.turn``) grounds its context with ``ground``: each question's evidence in
    its own turn, so each prompt begins with the previous one and its answer; the same text as the stateless
    path, the evidence shown and cited is every passage in the prompt, the breakdown counts all of it."""
    engine = FakeEngine(n_ctx=8192)
    prompts, dones = stored_chat(engine, docs, memory_store, QUESTIONS)
    for i in range(1, len(prompts)):
        answer = dones[i - 1].result.text
        assert prompts[i].startswith(prompts[i - 1] + f" {answer}\n"), i
    stateless, _ = chat(FakeEngine(n_ctx=8192), docs, QUESTIONS[:1])
    assert prompts[0] == stateless[0]  # one question: the same prompt as the port's
    first = dones[0].evidence[0]
    assert [len(d.evidence) for d in dones] == [1, 2, 3, 3]
    assert dones[-1].evidence[0] == first and prompts[-1].count(first["text"]) == 1
    assert f"Also relevant, given above: [E:{first['evidence_id']}]" in prompts[-1]
    ctx = dones[-1].result.context
    blocks = sum(engine.count_tokens(b) for b in _blocks(prompts[-1]))
    assert ctx["evidence"] == blocks > 0


def _blocks(prompt: str) -> list[str]:
    """The evidence blocks of a fake-rendered prompt: each user turn's text before its question."""
    out = []
    for line in prompt.split("\nuser: ")[1:]:
        body = line.split("\nassistant:")[0]
        for q in QUESTIONS:
            if body.endswith(q) and body != q:
                out.append(body[: -len(q)])
                break
    return out


def test_stored_chat_citations_resolve_against_earlier_turns_passages(docs, memory_store):
    from app.assistant import Assistant
    from app.protocol.types import DecodingParams

    first = docs.search(QUESTIONS[0], 1).evidence[0]
    engine = FakeEngine(n_ctx=8192, reply=lambda req: f"Thirty minutes [E:{first.evidence_id}].")
    a = Assistant(engine, memory_store, decoding=DecodingParams.make(temperature=0.0, max_tokens=32), documents=docs,
                  k=1)
    cid = a.new_conversation()
    a.send(cid, QUESTIONS[0])
    done = a.send(cid, QUESTIONS[1])  # its own search finds the error passage; the answer cites turn 1's
    assert [c["evidence_id"] for c in done.citations] == [first.evidence_id]
    assert "supported" in done.citations[0]


def test_the_relevance_floor_keeps_the_best_passage_and_those_close_to_it():
    from app.assistant.evidence import RELEVANCE_FLOOR, above_floor
    from app.retrieval.types import Evidence

    def ev(i):
        return Evidence(f"{i:012x}", f"/d/{i}.md", None, 1.0 / (10 + i), f"text {i}", 0, 6)

    def rel(*scores):
        return {f"{i:012x}": s for i, s in enumerate(scores, start=1)}

    four = [ev(1), ev(2), ev(3), ev(4)]
    got = above_floor(four, rel(0.9, 0.6, 0.45, 0.2))
    assert [e.evidence_id[-1] for e in got] == ["1", "2", "3"] and RELEVANCE_FLOOR == 0.5
    # the floor is relative to the best relevance among them, which need not be the first passage's
    assert [e.evidence_id[-1] for e in above_floor(four, rel(0.3, 0.9, 0.5, 0.44))] == ["1", "2", "3"]
    assert above_floor(four, rel(0.9, 0.1, 0.1, 0.1), floor=0.0) == four
    assert above_floor([ev(1)], rel(0.05)) == [ev(1)]  # the best passage is always given
    assert above_floor(four, {}) == four  # no relevance known (not hybrid): nothing to compare
    assert above_floor(four, rel(0.9, 0.1)) == four[:1] + four[2:]  # unknown relevance: kept
    assert above_floor([], {}) == []


def test_keyword_only_search_is_not_floored(docs):
    """Without an embedding model the scores are BM25's, on another scale: the floor applies to fused scores
    only (the kettle corpus here has no vectors)."""
    found = docs.search("kettle water", 3)
    assert len(found.evidence) == 3 and found.notice and "BM25" in found.notice


def test_relevance_keeps_the_margins_that_rrf_scores_lose():
    from app.retrieval.fusion import FusionConfig, fuse, relevance

    lexical = [(1, 9.0), (2, 8.9), (3, 1.0), (4, 0.9)]
    vector = [(1, 0.80), (2, 0.78), (3, 0.30), (4, 0.29)]
    cfg = FusionConfig("rrf", 0.2, 0.8, 10)
    fused = dict(fuse(lexical, vector, cfg))
    assert fused[4] / fused[1] > 0.7  # ranks only: the 4th looks almost as good as the 1st
    rel = relevance(lexical, vector, cfg)
    assert rel[1] == 1.0 and rel[2] > 0.9 and rel[4] == 0.0 and rel[3] < 0.05  # margins kept
