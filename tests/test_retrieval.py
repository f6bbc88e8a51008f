"""Retrieval without an embedding model: real files built here, ingested into a real SQLite store, searched
with BM25. (The embedding model, the embedding engine and hybrid search: tests/test_retrieval_embed.py.)"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.cli import main
from app.errors import IngestError, InvalidRequest
from app.retrieval.chunking import SPECIAL_TOKENS, ApproxTokenCounter, chunk_text
from app.retrieval.extract import decode_text, extract
from app.retrieval.ingest import Ingester
from app.retrieval.rag import cited_ids, format_evidence_block, parse_citations
from app.retrieval.schema import migrations
from app.retrieval.search import Retriever, rrf
from app.retrieval.store import DocumentStore, evidence_id, fts_query
from app.retrieval.types import Evidence

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------- file makers

def make_pdf(path: Path, pages: list[list[str]], password: str | None = None, image_only: bool = False) -> Path:
    """A real PDF written with pypdf: each page shows its lines in Helvetica (or only an inline image)."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    def name(n: str) -> NameObject:
        return NameObject(n)

    writer = PdfWriter()
    for lines in pages:
        page = writer.add_blank_page(612, 792)
        stream = DecodedStreamObject()
        if image_only:  # a 2x2 RGB inline image scaled up: pixels, no text layer
            stream.set_data(b"q 300 0 0 300 72 400 cm BI /W 2 /H 2 /CS /RGB /BPC 8 ID " + bytes(range(12))
                            + b" EI Q")
        else:
            font = DictionaryObject({name("/Type"): name("/Font"), name("/Subtype"): name("/Type1"),
                                     name("/BaseFont"): name("/Helvetica")})
            page[name("/Resources")] = DictionaryObject({name("/Font"): DictionaryObject({name("/F1"): font})})
            ops = b"".join(b"(" + ln.encode("latin-1") + b") Tj 0 -16 Td " for ln in lines)
            stream.set_data(b"BT /F1 12 Tf 72 720 Td " + ops + b"ET")
        page.replace_contents(stream)
    if password:
        writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="AES-256")
    with open(path, "wb") as f:
        writer.write(f)
    return path


def make_docx(path: Path) -> Path:
    import docx

    d = docx.Document()
    d.add_heading("Quarterly flamingo census", level=1)
    d.add_paragraph("The flamingo count at the northern lagoon was 412 birds.")
    table = d.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "Lagoon"
    table.cell(0, 1).text = "Count"
    table.cell(1, 0).text = "Southern"
    table.cell(1, 1).text = "97 narwhals"
    d.save(str(path))
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A folder with one file per case of issue 5's "Must show" list."""
    d = tmp_path / "docs"
    d.mkdir()
    make_pdf(d / "report.pdf", [["Alpha page about otters."], ["The omega clause is on page two."]])
    make_pdf(d / "locked.pdf", [["Secret text"]], password="secret")
    make_pdf(d / "scan.pdf", [[], []], image_only=True)
    make_docx(d / "census.docx")
    data = (d / "census.docx").read_bytes()
    (d / "broken.docx").write_bytes(data[: len(data) // 2])
    (d / "legacy.txt").write_bytes(b"Gr\xfc\xdfe aus M\xfcnchen\n")  # printf 'Gr\xfc\xdfe aus M\xfcnchen\n'
    (d / "utf16.txt").write_bytes("Zebras graze in the UTF-16 savanna.\n".encode("utf-16"))  # with BOM
    (d / "bom.md").write_bytes(b"\xef\xbb\xbf# Lighthouse keeping\n\nThe lamp is lit at dusk.\n")
    (d / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (d / "empty.txt").write_bytes(b"")
    (d / "page.html").write_text("<html><head><title>Giraffes</title><script>var hidden = 'xylophone';</script>"
                                 "</head><body><h1>Giraffes</h1><p>Giraffes eat acacia leaves.</p></body></html>")
    (d / "tool.py").write_text('def kestrel_speed():\n    """Return the hover speed of a kestrel."""\n    return 0\n')
    (d / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    return d


def _texts(results) -> list[str]:
    return [e.text for e in results]


# ----------------------------------------------------------------------------------------------- ingestion

def test_must_show_files_each_get_a_status_and_the_rest_of_the_batch_is_indexed(corpus: Path, doc_store):
    seen = []
    report = Ingester(doc_store).ingest([corpus], progress=lambda p: p.event == "file" and seen.append(
        (p.files_done, p.files_total, p.chunks)))
    status = {Path(f.path).name: f for f in report.files}
    assert {n: s.status for n, s in status.items()} == {
        "report.pdf": "indexed", "locked.pdf": "failed", "scan.pdf": "failed", "census.docx": "indexed",
        "broken.docx": "failed", "legacy.txt": "indexed", "utf16.txt": "indexed", "bom.md": "indexed",
        "binary.txt": "failed", "empty.txt": "failed", "page.html": "indexed", "tool.py": "indexed",
        "photo.png": "skipped"}  # found in a folder: an unsupported type is skipped, not a failure
    assert status["locked.pdf"].reason == "encrypted"
    assert status["scan.pdf"].reason == "no text layer (scanned?)"
    assert "corrupt" in status["broken.docx"].reason and "DOCX" in status["broken.docx"].reason
    assert status["binary.txt"].reason == "not text (binary content)"
    assert status["empty.txt"].reason == "empty file (0 bytes)"
    assert status["photo.png"].reason == "unsupported type (.png)"
    named = Ingester(doc_store).ingest([corpus / "photo.png"]).files[0]  # named explicitly: a failure with a reason
    assert (named.status, named.reason) == ("failed", "unsupported type (.png)")
    assert status["report.pdf"].pages == 2
    # progress: one file event per file, done/total and a growing chunk count
    assert [s[0] for s in seen] == list(range(1, 14)) and {s[1] for s in seen} == {13}
    assert seen[-1][2] == report.chunks > 0
    # only successes are indexed; failures are recorded with their reason
    stats = doc_store.stats()
    assert stats["documents"] == 7 and stats["failed"] == 6
    failed = {Path(d.path).name: d.error for d in doc_store.documents("status = 'failed'")}
    assert failed["locked.pdf"] == "encrypted"


def test_content_of_every_format_is_searchable_with_its_page(corpus: Path, doc_store):
    Ingester(doc_store).ingest([corpus])
    r = Retriever(doc_store)
    hit = r.search("Grüße aus München", k=1)[0]
    assert hit.text.strip() == "Grüße aus München" and hit.path.endswith("legacy.txt")
    assert r.search("Grusse aus Munchen", k=1)[0].path.endswith("legacy.txt")  # diacritics folded
    omega = r.search("omega clause", k=1)[0]
    assert omega.path.endswith("report.pdf") and omega.page == 2
    assert r.search("otters", k=1)[0].page == 1
    assert r.search("narwhals", k=1)[0].path.endswith("census.docx")  # table cell
    assert r.search("flamingo lagoon", k=1)[0].path.endswith("census.docx")
    assert r.search("zebras savanna", k=1)[0].path.endswith("utf16.txt")
    bom = r.search("lighthouse lamp", k=1)[0]
    assert bom.path.endswith("bom.md") and not bom.text.startswith("\ufeff")
    assert r.search("acacia", k=1)[0].path.endswith("page.html")
    assert r.search("xylophone", k=5) == []  # <script> content is not text
    assert r.search("kestrel hover speed", k=1)[0].path.endswith("tool.py")
    assert r.search("Secret text", k=5) == []


def test_evidence_spans_are_exact_and_ids_resolve(corpus: Path, doc_store):
    Ingester(doc_store).ingest([corpus])
    path = corpus / "report.pdf"
    extracted = extract(path, path.read_bytes()).text
    rows = doc_store._query("SELECT c.evidence_id, c.text, c.char_start, c.char_end, c.ordinal, d.sha256 "
                        "FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.path = ?", [str(path)])
    assert len(rows) == 2
    for row in rows:
        assert extracted[row["char_start"]:row["char_end"]] == row["text"]
        assert row["evidence_id"] == evidence_id(row["sha256"], row["ordinal"])
    resolved = doc_store.resolve([rows[1]["evidence_id"], "000000000000"])
    assert list(resolved) == [rows[1]["evidence_id"]]
    assert resolved[rows[1]["evidence_id"]].page == 2


def test_decoding_rules():
    p = Path("x.txt")
    assert decode_text(p, "Grüße".encode("cp1252")) == "Grüße"
    assert decode_text(p, "Grüße".encode()) == "Grüße"
    assert decode_text(p, b"\xef\xbb\xbfGr\xc3\xbc\xc3\x9fe") == "Grüße"
    assert decode_text(p, b"\xfe\xff" + "Grüße\r\nzwei".encode("utf-16-be")) == "Grüße\nzwei"
    assert decode_text(p, "plain ascii without BOM".encode("utf-16-le")) == "plain ascii without BOM"
    for bad in (b"\x00\x01\x02\x03binary", bytes(range(256))):
        with pytest.raises(IngestError, match="not text"):
            decode_text(p, bad)


def test_twenty_thousand_character_paragraph_is_split_so_every_chunk_fits():
    counter = ApproxTokenCounter()
    words = " ".join(f"word{i % 97}" for i in range(3000))[:20000]
    assert len(words) == 20000 and "\n" not in words
    for text in (words, "x" * 20000):  # with spaces, and one 20,000-character "word"
        chunks = chunk_text(text, counter, max_tokens=128, overlap_tokens=16)
        assert len(chunks) > 10
        for c in chunks:
            assert text[c.start:c.end] == c.text
            assert counter.count_tokens([c.text])[0] + SPECIAL_TOKENS <= 128
        covered = set()
        for c in chunks:
            covered.update(range(c.start, c.end))
        assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())
    overlapping = chunk_text(words, counter, max_tokens=128, overlap_tokens=16)
    assert all(b.start < a.end for a, b in zip(overlapping, overlapping[1:]))  # overlap inside a paragraph


def test_chunks_respect_paragraph_boundaries():
    counter = ApproxTokenCounter()
    paragraphs = [f"Paragraph {i} " + "lorem ipsum dolor " * 12 + "end." for i in range(12)]
    text = "\n\n".join(paragraphs)
    starts = {text.index(p) for p in paragraphs}
    ends = {text.index(p) + len(p) for p in paragraphs}
    chunks = chunk_text(text, counter, max_tokens=128, overlap_tokens=16)
    assert len(chunks) > 2
    for c in chunks:
        assert c.start in starts and c.end in ends  # whole paragraphs only, no overlap across them
        assert c.token_count + SPECIAL_TOKENS <= 128


def test_pelican_edit_rename_delete_only_current_truth_is_retrievable(tmp_path: Path, doc_store):
    folder = tmp_path / "notes"
    folder.mkdir()
    f = folder / "code.txt"
    f.write_text("The code word is PELICAN.\n")
    ing, r = Ingester(doc_store), Retriever(doc_store)
    assert ing.ingest([folder]).files[0].status == "indexed"
    first = r.search("code word", k=5)
    assert _texts(first) == ["The code word is PELICAN."] and first[0].path == str(f)

    f.write_text("The code word is OSPREY.\n")
    assert ing.ingest([folder]).files[0].status == "indexed"
    now = r.search("code word", k=5)
    assert _texts(now) == ["The code word is OSPREY."]
    assert r.search("PELICAN", k=5) == []
    assert doc_store.resolve([first[0].evidence_id]) == {}  # the old evidence is gone

    g = folder / "renamed.txt"
    f.rename(g)
    statuses = {s.status for s in ing.ingest([folder]).files}
    assert statuses == {"renamed"}
    moved = r.search("code word", k=5)
    assert _texts(moved) == ["The code word is OSPREY."] and moved[0].path == str(g)
    assert moved[0].evidence_id == now[0].evidence_id  # a rename keeps the evidence ID

    g.unlink()
    assert [s.status for s in ing.ingest([folder]).files] == ["removed"]
    assert r.search("code word", k=5) == [] and r.search("OSPREY", k=5) == []
    assert doc_store.stats() == {"documents": 0, "failed": 0, "chunks": 0, "embeddings": 0,
                                 "lead_vectors": 0}


def test_reindex_skips_unchanged_and_touch_does_not_reindex(corpus: Path, doc_store):
    ing = Ingester(doc_store)
    ing.ingest([corpus])
    again = ing.ingest([corpus])
    assert {f.status for f in again.files if f.ok} == {"unchanged", "skipped"}
    assert len(again.failed) == 5  # failures stay failures, with their reasons (the .png is skipped)
    before = doc_store._query("SELECT evidence_id FROM chunks ORDER BY id")
    os.utime(corpus / "legacy.txt", ns=(1, 1))  # new mtime, same bytes
    third = ing.ingest([corpus / "legacy.txt"])
    assert third.files[0].status == "unchanged"
    assert doc_store._query("SELECT evidence_id FROM chunks ORDER BY id") == before


def test_duplicate_content_is_indexed_once_and_survives_deleting_the_original(tmp_path: Path, doc_store):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("Albatross migration notes.")
    (d / "b.txt").write_text("Albatross migration notes.")
    ing = Ingester(doc_store)
    assert [f.status for f in ing.ingest([d]).files] == ["indexed", "duplicate"]
    assert [f.status for f in ing.ingest([d]).files] == ["unchanged", "duplicate"]
    (d / "a.txt").unlink()
    report = ing.ingest([d])
    assert [(Path(f.path).name, f.status) for f in report.files] == [("b.txt", "renamed")]
    hits = Retriever(doc_store).search("albatross", k=5)
    assert len(hits) == 1 and hits[0].path == str(d / "b.txt")
    assert doc_store.stats()["documents"] == 1 and len(doc_store.documents()) == 1


def test_watch_polls_and_reports_changes(tmp_path: Path):
    import threading

    d = tmp_path / "watched"
    d.mkdir()
    (d / "first.txt").write_text("Cormorants dive for fish.")
    db = tmp_path / "documents.db"
    with DocumentStore(db) as s:
        Ingester(s).ingest([d])
    reports, stop = [], threading.Event()

    def worker():
        with DocumentStore(db) as s:  # its own connection: one per thread
            Ingester(s).watch(stop, interval_s=0.05, on_report=lambda r: (reports.append(r), stop.set()))

    t = threading.Thread(target=worker)
    t.start()
    (d / "second.txt").write_text("Gannets plunge from height.")
    t.join(timeout=20)
    stop.set()
    assert not t.is_alive()
    assert [(Path(f.path).name, f.status) for f in reports[0].files if f.status != "unchanged"] == \
        [("second.txt", "indexed")]


def test_rescan_on_demand_finds_new_and_deleted_files(tmp_path: Path, doc_store):
    d = tmp_path / "d"
    d.mkdir()
    (d / "one.txt").write_text("Heron facts.")
    ing = Ingester(doc_store)
    ing.ingest([d])
    (d / "two.txt").write_text("Egret facts.")
    (d / "one.txt").unlink()
    statuses = {Path(f.path).name: f.status for f in ing.rescan().files}
    assert statuses == {"two.txt": "indexed", "one.txt": "removed"}
    assert doc_store.roots() == [str(d)]


def test_a_killed_ingest_leaves_finished_files_intact_and_resumes(tmp_path: Path):
    d = tmp_path / "many"
    d.mkdir()
    for i in range(6):
        (d / f"f{i}.txt").write_text(f"Document number {i} about topic{i}.\n\n" + "filler text. " * 50)
    db = tmp_path / "documents.db"
    # The child indexes f0..f2, then dies (os._exit: no cleanup, like SIGKILL) in the middle of f3's
    # transaction, after its chunks were inserted but before the commit.
    script = textwrap.dedent(f"""
        import os, sqlite_utils.db as sdb
        from app.retrieval.store import DocumentStore
        from app.retrieval.ingest import Ingester
        original = sdb.Table.insert_all
        calls = [0]
        def insert_all(self, *a, **k):
            result = original(self, *a, **k)
            if self.name == "chunks":
                calls[0] += 1
                if calls[0] == 4:
                    os._exit(9)
            return result
        sdb.Table.insert_all = insert_all
        Ingester(DocumentStore({str(db)!r})).ingest([{str(d)!r}])
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('integrity-check')")  # raises if FTS is off
    paths = [Path(p).name for (p,) in conn.execute("SELECT path FROM documents ORDER BY path")]
    assert paths == ["f0.txt", "f1.txt", "f2.txt"]
    orphan = conn.execute("SELECT COUNT(*) FROM chunks WHERE document_id NOT IN (SELECT id FROM documents)")
    assert orphan.fetchone()[0] == 0
    conn.close()
    with DocumentStore(db) as s:
        statuses = [f.status for f in Ingester(s).ingest([d]).files]
        assert statuses == ["unchanged"] * 3 + ["indexed"] * 3
        assert len(Retriever(s).search("topic3", k=3)) == 1


# ------------------------------------------------------------------------------------------ store, search

def test_store_migrations_are_named_applied_once_and_wal(tmp_path: Path):
    path = tmp_path / "documents.db"
    DocumentStore(path).close()
    s = DocumentStore(path)  # reopening applies nothing twice
    names = [m.name for m in migrations.applied(s.db)]
    assert names == ["m001_create_documents", "m002_create_chunks", "m003_create_chunks_fts",
                     "m004_create_embeddings", "m005_create_meta", "m006_create_roots", "m007_chunk_heading_path",
                     "m008_fts_heading_path", "m009_lead_vectors", "m010_embedding_models"]
    assert migrations.pending(s.db) == []
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.close()


def test_bm25_mode_is_reported_without_an_embedding_model(tmp_path: Path, doc_store):
    (tmp_path / "a.txt").write_text("Puffins nest on cliffs.")
    Ingester(doc_store).ingest([tmp_path / "a.txt"])
    res = Retriever(doc_store).search("puffins", k=3)
    assert res.mode == "bm25" and "keyword search (BM25) only" in res.notice
    assert res[0].score > 0
    with pytest.raises(InvalidRequest):
        Retriever(doc_store).search("puffins", k=0)


def test_fts_query_neutralises_syntax_and_drops_stopwords():
    assert fts_query('what is "NEAR(a b)" OR title:x*') == '"near" OR "b" OR "title" OR "x"'
    assert fts_query("the") == '"the"'
    assert fts_query("?!") == ""


def test_rrf_matches_cormack_formula():
    fused = rrf([[1, 2, 3], [3, 1, 4]], k=60)
    score = dict(fused)
    assert score[1] == pytest.approx(1 / 61 + 1 / 62)
    assert score[3] == pytest.approx(1 / 63 + 1 / 61)
    assert score[4] == pytest.approx(1 / 63)
    assert [i for i, _ in fused] == [1, 3, 2, 4]


# ----------------------------------------------------------------------------------------------------- RAG

def _ev(eid: str, text: str, page: int | None = None) -> Evidence:
    return Evidence(eid, f"/docs/{eid}.pdf", page, 1.0, text, 100, 100 + len(text))


def test_evidence_block_and_citation_parsing():
    a = _ev("3f2a9c1b7d04", "Intro. The code word is OSPREY. More text.", page=4)
    b = _ev("aa11bb22cc33", "Birds fly south in winter.")
    block = format_evidence_block([a, b])
    assert "[E:3f2a9c1b7d04] 3f2a9c1b7d04.pdf (page 4)\nIntro." in block
    assert "[E:aa11bb22cc33]" in block and "cite" in block
    assert len(format_evidence_block([a, b], max_chars=len(block) - 5)) < len(block)  # second one dropped

    answer = ('The file says "the code word is osprey." [E:3f2a9c1b7d04]. Birds migrate [E:aa11bb22, '
              'E:ffffffffffff]. Again [e:3F2A9C1B7D04].')
    assert cited_ids(answer) == ["3f2a9c1b7d04", "aa11bb22", "ffffffffffff"]
    cites = parse_citations(answer, [a, b])
    assert [c.evidence_id for c in cites] == ["3f2a9c1b7d04", "aa11bb22cc33", "3f2a9c1b7d04"]
    first = cites[0]
    assert first.quoted and first.quote == "The code word is OSPREY." and first.page == 4
    assert a.text[first.char_start - a.char_start:first.char_end - a.char_start] == first.quote
    assert answer[first.marker_start:first.marker_end] == "[E:3f2a9c1b7d04]"
    assert not cites[1].quoted and cites[1].quote == b.text  # no quotation: the whole passage


# ------------------------------------------------------------------------------------------------------ CLI

def test_cli_ingest_and_search_json(corpus: Path, capsys):
    rc = main(["ingest", str(corpus)])
    out, err = capsys.readouterr()
    assert rc == 1  # some files failed; the others were indexed
    assert "failed    " + str(corpus / "locked.pdf") + "  (encrypted)" in out
    assert "7 indexed" in out and "5 failed" in out and "1 skipped" in out and "keyword search (BM25) only" in out
    assert main(["search", "Grüße aus München", "--k", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    items = json.loads(out)
    assert items[0]["text"].strip() == "Grüße aus München"
    assert set(items[0]) == {"evidence_id", "path", "page", "score", "text"}
    assert "BM25" in err
    assert main(["search", "omega clause"]) == 0
    out, _ = capsys.readouterr()
    assert "report.pdf  page 2" in out and "[E:" in out
    assert main(["ingest", str(corpus)]) == 1
    assert "7 unchanged" in capsys.readouterr().out


def test_extract_rejects_unsupported_and_reads_html_title():
    with pytest.raises(IngestError, match=r"unsupported type \(\.xyz\)"):
        extract(Path("a.xyz"), b"data")
    text = extract(Path("a.html"), b"<title>T</title><p>One</p><p>Two &amp; three</p>").text
    assert text == "T\n\nOne\n\nTwo & three"


def test_docx_reads_in_memory_bytes(tmp_path: Path):
    data = make_docx(tmp_path / "x.docx").read_bytes()
    text = extract(Path("x.docx"), data).text
    assert "412 birds" in text and "Southern | 97 narwhals" in text
    with pytest.raises(IngestError, match="corrupt"):
        extract(Path("x.docx"), data[:100])
    with pytest.raises(IngestError, match="corrupt"):
        extract(Path("x.docx"), io.BytesIO(b"PK\x03\x04 not a zip").getvalue())


def test_split_balanced_keeps_order_and_minimises_the_largest_part():
    from app.retrieval.embedder import _split_balanced

    assert [[len(x) for x in p] for p in _split_balanced(["a" * 5000, "a" * 5000, "a"], 2)] == [[5000], [5000, 1]]
    assert _split_balanced(["a", "b", "c"], 5) == [["a"], ["b"], ["c"]] and _split_balanced([], 3) == []
    texts = ["x" * k for k in (30, 1, 1, 1, 30, 2, 2, 30)]
    parts = _split_balanced(texts, 3)
    assert sum(parts, []) == texts and len(parts) == 3
    assert max(sum(len(t) + 1 for t in p) for p in parts) == 36  # [30,1,1] [1,30,2] [2,30]: 35, 36, 34
