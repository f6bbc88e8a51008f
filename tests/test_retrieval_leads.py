"""Lead vectors without a model: the lead text of a chunk, max-sim scoring over a chunk's two vectors, their
storage (m009: written with the document, deleted with it, re-used by hash, another recipe ignored) and an
old store that opens searchable and gets its leads on the next ingest."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from app.retrieval.chunking import LEAD_MAX_CHARS, LEAD_RECIPE, lead_text
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore, NewChunk, max_similarity
from tests.fakes import FakeEmbedder


def _unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


# ------------------------------------------------------------------------------------------------ lead text

def test_the_lead_is_the_heading_path_and_the_first_sentence_after_a_signature_line():
    text = ("shutil.which(cmd, mode=1, path=None)\nGiven a command, mode, and a PATH string, return the path\n"
            "which conforms to the given mode. `mode` defaults to os.F_OK | os.X_OK.")
    assert lead_text(text, ("shutil", "shutil.which")) == (
        "shutil > shutil.which: Given a command, mode, and a PATH string, return the path\n"
        "which conforms to the given mode.")
    assert lead_text("Descale monthly. Use citric acid.", ("Kettle", "Care")) == "Kettle > Care: Descale monthly."
    assert lead_text("One line without a full stop") == "One line without a full stop"
    assert lead_text("os.getcwd()") == "os.getcwd()"  # a signature with nothing under it stays the lead
    assert lead_text("e.g. this. And that.") == "e.g. this."  # a sentence ends before a capital only
    long = "word " * 200
    assert lead_text(long) == long.strip()[:LEAD_MAX_CHARS]


# ------------------------------------------------------------------------------------------------- max-sim

def test_max_similarity_takes_the_better_of_a_rows_two_vectors():
    q = _unit(1, 0, 0)
    matrix = np.vstack([_unit(1, 1, 0), _unit(0, 1, 0), _unit(1, 0, 0)])
    leads = np.vstack([_unit(1, 0, 0), _unit(0, 0, 1), _unit(0, 1, 0)])
    assert max_similarity(q, matrix, leads) == pytest.approx([1.0, 0.0, 1.0])
    assert max_similarity(q, matrix, None) == pytest.approx(matrix @ q)


def _store_with_two_chunks(path: Path, leads: bool = True) -> DocumentStore:
    s = DocumentStore(path)
    chunks = [NewChunk("Alpha. Details.", None, 0, 15, 40, ("A",)), NewChunk("Beta. More.", None, 16, 27, 40)]
    vectors = np.vstack([_unit(1, 1, 0), _unit(0, 1, 0)])
    lead_vectors = np.vstack([_unit(0, 0, 1), _unit(0, 1, 1)]) if leads else None
    s.write_document("/d.md", sha256="d1", size=1, mtime_ns=1, type="text", page_count=None, chunks=chunks,
                     vectors=vectors, model="m", lead_vectors=lead_vectors)
    return s


def test_vector_search_scores_a_chunk_by_its_better_vector(tmp_path: Path):
    with _store_with_two_chunks(tmp_path / "documents.db") as s:
        ids = [r[0] for r in s.db.execute("SELECT id FROM chunks ORDER BY ordinal")]
        # the query is the second chunk's lead: its lead's cosine (1.0) counts; the first chunk scores by its
        # lead too (0.71 against its own vector's 0.5)
        assert s.vector_search("m", _unit(0, 1, 1), 2) == [(ids[1], pytest.approx(1.0)),
                                                            (ids[0], pytest.approx(0.5 ** 0.5))]
        # closest to the first chunk's own vector: its chunk vector counts, not its (worse) lead
        assert s.vector_search("m", _unit(1, 1, 0), 1) == [(ids[0], pytest.approx(1.0))]
        assert s.stats()["lead_vectors"] == 2
        stored = s.lead_vectors_for("m", [lead_text("Alpha. Details.", ("A",))])
        assert list(stored.values()) == [_unit(0, 0, 1).tobytes()]
        with pytest.raises(ValueError):  # leads come with the chunks' vectors, one row per chunk
            s.write_document("/e.md", sha256="e1", size=1, mtime_ns=1, type="text", page_count=None,
                             chunks=[NewChunk("x", None, 0, 1, 1)], lead_vectors=np.zeros((1, 3)))
        s.delete_document(s.document("/d.md").id)
        assert s.stats()["lead_vectors"] == 0 and s.check() == []


def test_a_chunk_without_a_lead_vector_is_scored_by_its_own(tmp_path: Path):
    with _store_with_two_chunks(tmp_path / "documents.db", leads=False) as s:
        ids = [r[0] for r in s.db.execute("SELECT id FROM chunks ORDER BY ordinal")]
        q = _unit(0, 1, 1)
        assert s.vector_search("m", q, 2) == [(ids[1], pytest.approx(float(_unit(0, 1, 0) @ q))),
                                              (ids[0], pytest.approx(float(_unit(1, 1, 0) @ q)))]
        assert [cid for cid, _ in s.chunks_without_leads("m")] == ids


def test_leads_of_another_recipe_are_ignored_and_replaced(tmp_path: Path):
    with _store_with_two_chunks(tmp_path / "documents.db", leads=False) as s:
        ids = [r[0] for r in s.db.execute("SELECT id FROM chunks ORDER BY ordinal")]
        s.db.conn.execute("INSERT INTO lead_vectors VALUES (?, 'm', 'lead0', 'x', ?)",
                          [ids[0], _unit(0, 0, 1).tobytes()])
        s.db.conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'embeddings_version'")
        s.db.conn.commit()
        assert s.vector_search("m", _unit(0, 0, 1), 1)[0][1] == pytest.approx(0.0)  # the old lead is not used
        assert len(s.chunks_without_leads("m")) == 2
        Ingester(s, FakeEmbedder("m")).embed_missing()
        assert s.db.execute("SELECT DISTINCT recipe FROM lead_vectors").fetchall() == [(LEAD_RECIPE,)]
        assert s.stats()["lead_vectors"] == 2 and s.chunks_without_leads("m") == []


# ----------------------------------------------------------------------------------------------- ingesting

class CountingFake(FakeEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def embed(self, texts, progress=None):
        self.texts += texts
        return super().embed(texts, progress)


FILLER = " ".join(["More words."] * 20)  # FakeEmbedder counts words as tokens: these chunks get leads


def test_ingest_embeds_each_chunk_and_its_lead_and_reuses_both_for_an_unchanged_passage(doc_store, tmp_path: Path):
    doc = tmp_path / "kettle.md"
    doc.write_text(f"# Kettle\n\nDescale it monthly. {FILLER}\n\n# Warranty\n\nTwo years. {FILLER}\n\n"
                   "# Short\n\nNo lead here.\n", encoding="utf-8")
    fake = CountingFake()
    Ingester(doc_store, fake).ingest([doc])
    assert doc_store.stats()["chunks"] == 3 and doc_store.stats()["lead_vectors"] == 2  # not the short one
    assert "Kettle: # Kettle\n\nDescale it monthly." in fake.texts  # the lead of the first section
    fake.texts.clear()
    doc.write_text(doc.read_text(encoding="utf-8").replace("Two years", "Three years"), encoding="utf-8")
    Ingester(doc_store, fake).ingest([doc])
    assert fake.texts == [f"# Warranty\n\nThree years. {FILLER}", "Warranty: # Warranty\n\nThree years."]
    assert doc_store.stats()["lead_vectors"] == 2 and doc_store.check() == []


def test_leads_off_is_one_vector_per_chunk(doc_store, tmp_path: Path):
    (tmp_path / "a.md").write_text(f"# A\n\nOne. {FILLER}\n", encoding="utf-8")
    Ingester(doc_store, FakeEmbedder(), leads=False).ingest([tmp_path / "a.md"])
    assert doc_store.stats()["embeddings"] == 1 and doc_store.stats()["lead_vectors"] == 0


def test_m009_an_old_store_opens_searchable_and_gets_its_leads_on_the_next_ingest(tmp_path: Path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(3):
        (folder / f"n{i}.md").write_text(f"# Note {i}\n\nTopic {i} in short. {FILLER}\n", encoding="utf-8")
    path = tmp_path / "documents.db"
    fake = FakeEmbedder()
    with DocumentStore(path) as s:
        Ingester(s, fake, leads=False).ingest([folder])
        before = s.vector_search(fake.model_id, np.array([1.0, 30.0, 0.5], dtype=np.float32), 3)
    conn = sqlite3.connect(path)  # back to the m008 shape: no lead_vectors table
    conn.executescript("DROP TABLE lead_vectors; DELETE FROM _sqlite_migrations WHERE name = 'm009_lead_vectors';")
    conn.close()
    with DocumentStore(path) as s:
        assert s.stats()["lead_vectors"] == 0 and s.check() == []
        assert s.vector_search(fake.model_id, np.array([1.0, 30.0, 0.5], dtype=np.float32), 3) == before
        report = Ingester(s, fake).ingest([folder])  # the files are unchanged: only the leads are embedded
        assert [f.status for f in report.files] == ["unchanged"] * 3
        assert s.stats()["lead_vectors"] == s.stats()["chunks"] == 3 and s.check() == []
