"""Ranking without a model: the BM25 query of content words (FTS5 syntax inert, codes as phrases), weighted
RRF and normalised score fusion, the fusion settings' validation, and the retriever wired to them (BM25 over
a keyword-only store; hybrid with the fake embedder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import InvalidRequest
from app.retrieval.fusion import DEFAULT_FUSION, FusionConfig, fuse, normalised, score_fusion, weighted_rrf
from app.retrieval.ingest import Ingester
from app.retrieval.query import keyword_query
from app.retrieval.search import Retriever, rrf
from tests.fakes import FakeEmbedder


def test_keyword_query_keeps_content_words_and_codes():
    q = keyword_query("How do I fix error E24 on my dishwasher?")
    assert q.words == ("fix", "error", "e24", "dishwasher")
    q = keyword_query("what is LN-2291 about")
    assert q.phrases == (("ln", "2291"),) and "ln" in q.words and "2291" in q.words
    assert q.match().startswith('"ln 2291" OR ')
    assert keyword_query("what is it").words == ("what", "is", "it")  # nothing but function words: keep them


@pytest.mark.parametrize("text", ['NEAR(a b) AND c*', 'x" OR "y', "col:value ^start", "(unbalanced", '"""'])
def test_fts5_syntax_in_a_question_is_inert(doc_store, tmp_path: Path, text):
    (tmp_path / "a.txt").write_text("near and value start unbalanced x y column", encoding="utf-8")
    Ingester(doc_store).ingest([str(tmp_path / "a.txt")])
    hits = Retriever(doc_store).search(text, k=3, mode="bm25")  # no FTS5 syntax error
    # its words are searched as plain words: the file holds them all (a question of quotes alone has none)
    assert [Path(h.path).name for h in hits] == (["a.txt"] if keyword_query(text).words else [])


def test_an_exact_code_ranks_above_passages_sharing_one_part(doc_store, tmp_path: Path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.md").write_text("Fixed LN 2310 and other LN items in 2291 words of notes.", encoding="utf-8")
    (folder / "b.md").write_text("LN-2291: fixed a crash at startup.", encoding="utf-8")
    Ingester(doc_store).ingest([str(folder)])
    hits = Retriever(doc_store).search("what was LN-2291?", k=2, mode="bm25")
    assert hits[0].path.endswith("b.md")


def test_function_words_do_not_lift_a_passage(doc_store, tmp_path: Path):
    """'should my' occur in the wrong passage only; the content words decide."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "wrong.md").write_text("You should ask my neighbour when you can.", encoding="utf-8")
    (folder / "right.md").write_text("Lubricate the chain every 150 km.", encoding="utf-8")
    Ingester(doc_store).ingest([str(folder)])
    hits = Retriever(doc_store).search("how often should I lubricate my chain", k=2, mode="bm25")
    assert hits[0].path.endswith("right.md") and len(hits) == 1


def test_weighted_rrf_with_equal_weights_is_cormacks_rrf():
    assert weighted_rrf([[1, 2, 3], [3, 1, 4]], None, 60) == rrf([[1, 2, 3], [3, 1, 4]], k=60)
    fused = dict(weighted_rrf([[1, 2], [2, 1]], [3.0, 1.0], 60))
    assert fused[1] == pytest.approx(3 / 61 + 1 / 62) and fused[1] > fused[2]
    with pytest.raises(ValueError):
        weighted_rrf([[1]], [1.0, 2.0])


def test_normalised_scores_and_score_fusion_keep_a_strong_margin():
    assert normalised([(1, 10.0), (2, 5.0), (3, 0.0)]) == {1: 1.0, 2: 0.5, 3: 0.0}
    assert normalised([(7, 3.0)]) == {7: 1.0} and normalised([]) == {}
    lexical = [(1, 20.0), (2, 5.0), (3, 4.8), (4, 1.0), (5, 0.5)]  # BM25 is sure of 1
    vector = [(2, 0.61), (3, 0.60), (1, 0.58), (4, 0.30), (5, 0.20)]  # the vector side barely prefers 2
    assert rrf([[i for i, _ in lexical], [i for i, _ in vector]])[0][0] == 2  # plain RRF pulls 1 down
    assert score_fusion([lexical, vector], [0.5, 0.5])[0][0] == 1  # score fusion keeps it first
    assert fuse(lexical, vector, FusionConfig("score", 0.5, 0.5))[0][0] == 1


def test_items_missing_from_one_ranking_get_zero_from_it():
    fused = dict(score_fusion([[(1, 2.0), (2, 1.0)], [(3, 0.9), (2, 0.1)]], [1.0, 1.0]))
    assert fused == {1: 1.0, 2: 0.0, 3: 1.0}


@pytest.mark.parametrize("cfg,param", [
    (FusionConfig("max"), "fusion.method"),
    (FusionConfig("score", -1.0), "fusion.bm25_weight"),
    (FusionConfig("score", 0.0, 0.0), "fusion.bm25_weight"),
    (FusionConfig("rrf", rrf_k=0), "fusion.rrf_k"),
    (FusionConfig("score", 1.0, True), "fusion.vector_weight"),
])
def test_fusion_settings_are_validated(cfg, param):
    with pytest.raises(InvalidRequest) as e:
        cfg.validate()
    assert e.value.param == param


def test_default_fusion_is_valid_and_described():
    assert DEFAULT_FUSION.validate() is DEFAULT_FUSION
    assert DEFAULT_FUSION.describe().startswith(DEFAULT_FUSION.method)


def test_hybrid_search_fuses_both_rankings_with_the_fake_embedder(doc_store, tmp_path: Path):
    folder = tmp_path / "h"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.md").write_text(f"kettle descaling note {i} " + "x" * (10 * i), encoding="utf-8")
    embedder = FakeEmbedder()
    Ingester(doc_store, embedder).ingest([str(folder)])
    r = Retriever(doc_store, embedder)
    try:
        ranks = r.rankings("kettle descaling", 10)
        hits = r.search("kettle descaling", k=3)
    finally:
        r.close()
    assert hits.mode == "hybrid" and len(hits) == 3
    assert ranks.vector is not None and len(ranks.lexical) == 4
    fused = fuse(ranks.lexical, ranks.vector, DEFAULT_FUSION)
    assert [e.score for e in hits] == pytest.approx([s for _, s in fused[:3]])


def test_the_reranker_reorders_the_top_by_relevance_and_blends_with_the_fused_score():
    from app.retrieval.rerank import Reranker
    from app.retrieval.types import Evidence
    from tests.fakes import FakeEngine

    class Scripted(Reranker):  # the model's judgement scripted; the ordering and blending are what is tested
        def relevance(self, question, passage):
            return {"a": -2.0, "b": 0.5, "c": 3.0}[passage]

    ev = [Evidence(x, "/p", None, s, x, 0, 1) for x, s in (("a", 0.9), ("b", 0.8), ("c", 0.1), ("d", 0.05))]
    engine = FakeEngine()
    assert [e.text for e in Scripted(engine, depth=3).rerank("q", ev)] == ["c", "b", "a", "d"]  # d below depth
    assert [e.text for e in Scripted(engine, depth=3, blend=0.0).rerank("q", ev)] == ["a", "b", "c", "d"]
    with pytest.raises(ValueError):
        Reranker(engine, depth=0)


# ---------------------------------------------------------------------------- structure and headings in ranking

def test_a_signature_line_of_api_reference_text_starts_a_section():
    from app.retrieval.chunking import SIGNATURE_LEVEL, ApproxTokenCounter, chunk_document, find_headings

    text = ("# os\n\nOperating system services.\n\nos.lseek(fd, position, whence, /)\nSet the position.\n\n"
            "os.makedirs(name, mode=511, exist_ok=False) -> None\nSuper-mkdir; create a leaf directory.\n\n"
            "Call it like f(x) in prose.\nprint(x)\n")
    hs = find_headings(text, "markdown")
    assert [(h.title, h.level) for h in hs] == [("os", 1), ("os.lseek", SIGNATURE_LEVEL),
                                                ("os.makedirs", SIGNATURE_LEVEL)]  # print(x) opens no paragraph
    chunks = chunk_document(text, ApproxTokenCounter(), 256, 32, headings=hs)
    assert [c.heading_path for c in chunks] == [("os",), ("os", "os.lseek"), ("os", "os.makedirs")]
    assert chunks[2].text.startswith("os.makedirs(") and "Super-mkdir" in chunks[2].text
    assert [h.title for h in find_headings("math.gcd(*integers)\nGreatest common divisor.\n", "text")] == ["math.gcd"]
    assert find_headings("a lone(call)\n", "text") == []  # no description under it


def test_heading_path_words_are_in_the_keyword_index_with_their_weight(doc_store, tmp_path: Path):
    from app.retrieval.query import bm25_ranking

    (tmp_path / "lease.md").write_text("# Notice period\n\nTwo months in writing.\n\n# Deposit\n\n"
                                       "Returned within thirty days.\n", encoding="utf-8")
    Ingester(doc_store).ingest([str(tmp_path / "lease.md")])
    texts = dict(doc_store.db.conn.execute("SELECT id, text FROM chunks").fetchall())
    hits = bm25_ranking(doc_store, "notice period", 5)
    assert texts[hits[0][0]].startswith("# Notice period")
    hits = bm25_ranking(doc_store, "deposit", 5, heading_weight=0.0)  # the text column alone still matches
    assert len(hits) == 1 and "Returned" in texts[hits[0][0]]
    assert doc_store.check() == []


def test_m008_rebuilds_the_keyword_index_of_an_existing_store(tmp_path: Path):
    """A store made before m008 (one FTS column) is searchable by its heading paths once reopened."""
    import sqlite3

    from app.retrieval.query import bm25_ranking
    from app.retrieval.store import DocumentStore, NewChunk

    path = tmp_path / "documents.db"
    with DocumentStore(path) as s:
        s.write_document("/x.md", sha256="ab", size=1, mtime_ns=1, type="text", page_count=None,
                         chunks=[NewChunk("Two months in writing.", None, 0, 22, 5, ("Notice period",))])
    conn = sqlite3.connect(path)  # back to the m007 shape: one column, triggers on text only
    conn.executescript("""
        DROP TRIGGER chunks_ai; DROP TRIGGER chunks_ad; DROP TRIGGER chunks_au; DROP TABLE chunks_fts;
        CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunks', content_rowid='id');
        INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild');
        DELETE FROM _sqlite_migrations WHERE name = 'm008_fts_heading_path';""")
    conn.close()
    with DocumentStore(path) as s:
        assert [r[0] for r in bm25_ranking(s, "notice", 5)] == [1]
        assert s.check() == []
