"""Sentence attribution with real models: the hand-made wrong facts are flagged and the paraphrase kept with
the real all-MiniLM-L6-v2 similarity (``ATTRIBUTION_THRESHOLD``), and a chat turn over a real indexed
document with the real bundled model (Gemma 3 270M base, which rarely cites) returns ``hearth.attributions``
through the official ``openai`` client, the same attributions the check gives on its answer."""

from __future__ import annotations

import openai
import pytest

from app.retrieval.attribution import attribute
from app.retrieval.citecheck import CitationChecker
from app.retrieval.types import Evidence
from tests.test_attribution import FERRY, GIVEN, KITCHEN

pytestmark = pytest.mark.model
TIMETABLE = ("Ferry timetable for Lindholm island.\n\nThe first ferry to Lindholm island leaves at 7:45 every "
             "morning from pier 4. The crossing takes 45 minutes. A return ticket costs 12 euros.\n")


def test_wrong_facts_are_flagged_and_a_paraphrase_kept_with_real_embeddings(embedding_model):
    from app.retrieval.embedder import Embedder

    cases = [("The ferry to Lindholm leaves at 9:35 every morning from pier 4.", FERRY, "9:35", "9:15"),
             ("The last crossing of the season is on 2024-11-27.", FERRY, "2024-11-27", "2024-10-27"),
             ("Tickets for adults cost £14.", FERRY, "£14", "£12"),
             ("Bake the bread at 220 °F for 30 minutes.", KITCHEN, "220 °F", "220 °C")]
    with Embedder(embedding_model) as embedder:
        checker = CitationChecker(embedder.embed)
        for answer, passage, wrong, right in cases:
            (a,) = attribute(answer, GIVEN, checker)
            assert (a.evidence_id, a.supported) == (passage.evidence_id, False), (answer, a)
            assert a.reason == f"{wrong} is not in the passage; it says {right}"
            assert a.similarity is not None and a.similarity >= 0.4
        good = attribute("Every morning at a quarter past nine the boat for Lindholm island sails from pier 4.",
                         GIVEN, checker)
        assert [(a.evidence_id, a.supported) for a in good] == [(FERRY.evidence_id, True)]
        off = attribute("Volcanoes erupt molten rock from deep underground.", GIVEN, checker)
        assert [(a.evidence_id, a.supported) for a in off] == [(None, None)]


def test_a_chat_turn_over_a_real_document_returns_attributions_through_the_openai_client(bundled_model, tmp_path):
    from app.assistant import DocumentSource
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore
    from app.server import ServerThread, create_app
    from app.settings import ServerSettings

    doc = tmp_path / "ferry.txt"
    doc.write_text(TIMETABLE, encoding="utf-8")
    store = DocumentStore(tmp_path / "documents.db")
    assert Ingester(store).ingest([doc]).count("indexed") == 1
    docs = DocumentSource(store, owns_store=True)  # BM25 and word overlap: no embedder in this one
    try:
        with Engine(bundled_model, LoadSettings(n_ctx=2048), max_queue=4) as engine:
            with ServerThread(create_app(engine, ServerSettings(), documents=docs)) as srv:
                client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)
                r = client.chat.completions.create(
                    model="gemma-3-270m-q4_k_m", temperature=0, max_tokens=40,
                    messages=[{"role": "user", "content": "When does the first ferry to Lindholm island leave?"}],
                    extra_body={"hearth": {"documents": True, "k": 2}})
        h = r.model_extra["hearth"]
        content = r.choices[0].message.content
        (given,) = h["evidence"]
        assert "7:45" in given["text"] and isinstance(h["attributions"], list) and "citations" in h
        passage = Evidence(given["evidence_id"], given["path"], given["page"], 0.0, given["text"], 0, 0)
        expected = [a.to_dict() for a in attribute(content, [passage], docs.checker())]
        assert h["attributions"] == expected, (content, h["attributions"])
        for a in h["attributions"]:
            assert 0 <= a["sentence_start"] < a["sentence_end"] <= len(content)
            assert a["evidence_id"] in (None, given["evidence_id"]) and a["support"]["reason"]
            assert a["supported"] in (True, False, None)
        print(f"answer: {content!r}\nattributions: {h['attributions']}")
    finally:
        docs.close()


def test_the_check_embeds_with_minilm_whatever_model_search_uses(embedding_model, doc_store):
    from app.assistant.evidence import DocumentSource
    from app.retrieval.embed_model import default_embedding_model_path
    from app.retrieval.embedder import Embedder, model_id_for
    from tests.fakes import FakeEmbedder

    default_embedding_model_path().symlink_to(embedding_model)  # MiniLM installed in this HEARTH_HOME
    docs = DocumentSource(doc_store, FakeEmbedder())  # search on another model (its cosines are all ~1)
    try:
        checker = docs.checker()
        assert checker.embed is not None and checker.embed.__self__.model_id == model_id_for(embedding_model)
        for answer in ("Bananas are a yellow fruit rich in potassium.",
                       "My grandmother knitted a blue scarf last winter."):
            assert [(a.evidence_id, a.supported) for a in attribute(answer, GIVEN, checker)] == [(None, None)]
    finally:
        docs.close()
    assert checker.embed.__self__.pid is None  # the check's own embedder is closed with the source
    with Embedder(embedding_model) as embedder:  # search on MiniLM itself: the check shares its embedder
        shared = DocumentSource(doc_store, embedder)
        assert shared.checker().embed.__self__ is embedder
        shared.close()


def test_the_subject_decides_the_passage_with_real_embeddings(embedding_model):
    from app.retrieval.embedder import Embedder
    from tests.test_attribution import BUS, FERRY_ONLY

    with Embedder(embedding_model) as embedder:
        checker = CitationChecker(embedder.embed)
        (a,) = attribute("The ferry leaves at 10:40.", [FERRY_ONLY, BUS], checker)
        assert (a.evidence_id, a.supported) == (FERRY_ONLY.evidence_id, False)
        assert a.reason == "10:40 is not in the passage; it says 9:15"
        (b,) = attribute("The ferry costs 12 dollars.", [FERRY_ONLY, BUS], checker)
        assert (b.evidence_id, b.reason) == (FERRY_ONLY.evidence_id,
                                             "12 dollars is not in the passage; it says 12 euros")
        (c,) = attribute("The bus to the airport leaves at 10:40.", [FERRY_ONLY, BUS], checker)
        assert (c.evidence_id, c.supported) == (BUS.evidence_id, True) and "similarity" in c.reason
