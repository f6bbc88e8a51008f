"""Documents v2, the ingest half (issue 16): chunking by structure with heading paths and exact offsets,
scanned and encrypted PDFs listed with their reason, the background embedding pipeline (groups across
documents, commit per document, progress), kill -9 mid-ingest then resume, and the batched embedder against
the one-at-a-time path on the real embedding model.

PDF fixtures are built here with pypdf's writer: a text PDF, an image-only PDF (an inline image, no text
layer), an AES-256 encrypted PDF, and one with a text page and an image-only page.
"""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeEmbedder

from app.errors import EngineCrashed
from app.retrieval.chunking import ApproxTokenCounter, Heading, chunk_document, find_headings, sections
from app.retrieval.extract import extract
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------- PDF makers

def _pdf(pages: list[list[str] | None], password: str | None = None) -> bytes:
    """A PDF whose pages show lines of Helvetica text, or (for None) only a 2x2 inline image scaled up."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject
    from pypdf.generic import NameObject as N

    writer = PdfWriter()
    font = DictionaryObject({N("/Type"): N("/Font"), N("/Subtype"): N("/Type1"), N("/BaseFont"): N("/Helvetica")})
    for lines in pages:
        page = writer.add_blank_page(612, 792)
        stream = DecodedStreamObject()
        if lines is None:
            stream.set_data(b"q 300 0 0 300 72 400 cm BI /W 2 /H 2 /CS /RGB /BPC 8 ID " + bytes(range(12))
                            + b" EI Q")
        else:
            page[N("/Resources")] = DictionaryObject({N("/Font"): DictionaryObject({N("/F1"): font})})
            stream.set_data(b"BT /F1 11 Tf 72 720 Td " + b"".join(b"(" + ln.encode("latin-1") + b") Tj 0 -15 Td "
                                                                  for ln in lines) + b"ET")
        page.replace_contents(stream)
    if password:
        writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="AES-256")
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


# ------------------------------------------------------------------------------------ chunking by structure

MARKDOWN = """# Kettle manual

Read this first.

## Filling

Fill to the MAX line.

```python
# not a heading: inside a fence
fill(kettle)
```

### Descaling

Use citric acid monthly.

Setext title
============

Under the setext title.
"""


def test_markdown_headings_give_every_chunk_its_path_and_exact_offsets():
    hs = find_headings(MARKDOWN, "markdown")
    assert [(h.level, h.title) for h in hs] == [(1, "Kettle manual"), (2, "Filling"), (3, "Descaling"),
                                                (1, "Setext title")]
    chunks = chunk_document(MARKDOWN, ApproxTokenCounter(), 256, 32, headings=hs)
    assert [c.heading_path for c in chunks] == [("Kettle manual",), ("Kettle manual", "Filling"),
                                                ("Kettle manual", "Filling", "Descaling"), ("Setext title",)]
    for c in chunks:
        assert MARKDOWN[c.start:c.end] == c.text
    assert "# not a heading" in chunks[1].text and chunks[2].text.startswith("### Descaling")


def test_a_bare_heading_joins_the_next_section_and_breaks_are_never_crossed():
    text = "# Title\n\n## Sub\n\nbody one\n\nbody two"
    hs = find_headings(text, "markdown")
    spans = sections(text, hs)
    assert [(text[a:b], p) for a, b, p in spans] == [("# Title\n\n## Sub\n\nbody one\n\nbody two", ("Title", "Sub"))]
    cut = text.index("body two")
    assert [text[a:b].strip() for a, b, _ in sections(text, hs, breaks=[cut])] == [
        "# Title\n\n## Sub\n\nbody one", "body two"]


def test_python_code_is_cut_by_definitions_nested_by_indentation():
    code = textwrap.dedent('''\
        import os


        class Kettle:
            """A kettle."""

            @property
            def full(self):
                return True

            def boil(self):
                return 100


        def descale(kettle):
            return kettle
        ''')
    hs = find_headings(code, "python")
    assert [(h.level, h.title) for h in hs] == [(1, "Kettle"), (2, "full"), (2, "boil"), (1, "descale")]
    assert code[hs[1].start:].startswith("    @property")  # the decorator belongs to its definition
    chunks = chunk_document(code, ApproxTokenCounter(), 256, 0, headings=hs)
    assert [c.heading_path for c in chunks] == [(), ("Kettle",), ("Kettle", "full"), ("Kettle", "boil"),
                                                ("descale",)]
    assert all(code[c.start:c.end] == c.text for c in chunks)
    js = "export function brew(tea) {\n  return tea;\n}\n\nclass Pot {\n  pour() {}\n}\n"
    assert [h.title for h in find_headings(js, "code")] == ["brew", "Pot"]


def test_html_and_docx_headings_come_from_the_markup(tmp_path: Path):
    html = b"<html><body><h1>Guide</h1><p>Intro text.</p><h2>Setup <em>steps</em></h2><p>Plug it in.</p></body>"
    ex = extract(tmp_path / "g.html", html)
    assert [(h.level, h.title) for h in ex.headings] == [(1, "Guide"), (2, "Setup steps")]
    assert all(ex.text[h.start:h.end] == h.title for h in ex.headings)

    import docx

    d = docx.Document()
    d.add_heading("Leave policy", level=1)
    d.add_paragraph("Everyone gets 25 days.")
    d.add_heading("Carry over", level=2)
    d.add_paragraph("Five days carry over to March.")
    buf = io.BytesIO()
    d.save(buf)
    ex = extract(tmp_path / "p.docx", buf.getvalue())
    assert [(h.level, h.title) for h in ex.headings] == [(1, "Leave policy"), (2, "Carry over")]
    assert all(ex.text[h.start:h.end] == h.title for h in ex.headings)


def test_pdf_pages_paragraphs_and_numbered_headings(tmp_path: Path, doc_store):
    long = "The pump moves water from the tank into the boiler when the float drops below the"
    page1 = ["1 Introduction", long, "mark, and it stops when the float rises.", "2.1 Maintenance",
             long, "line again.", long, "end of the paragraph."]
    page2 = ["The maintenance section goes on here on page two.", "3 Safety", "Unplug before opening."]
    pdf = tmp_path / "manual.pdf"
    pdf.write_bytes(_pdf([page1, page2]))
    ex = extract(pdf, pdf.read_bytes())
    assert [(h.level, h.title) for h in ex.headings] == [(1, "1 Introduction"), (2, "2.1 Maintenance"),
                                                        (1, "3 Safety")]
    Ingester(doc_store).ingest([pdf])
    rows = doc_store.db.execute("SELECT text, page, char_start, char_end, heading_path FROM chunks "
                                "ORDER BY ordinal").fetchall()
    text = ex.text
    assert all(text[a:b] == t for t, _p, a, b, _h in rows)
    by_text = {t.split("\n")[0]: (p, h) for t, p, _a, _b, h in rows}
    assert by_text["The maintenance section goes on here on page two."] == (
        2, '["1 Introduction", "2.1 Maintenance"]')
    assert by_text["3 Safety"] == (2, '["3 Safety"]')
    ev = doc_store.evidence([(doc_store.db.execute("SELECT id FROM chunks ORDER BY ordinal DESC").fetchone()[0],
                              1.0)])
    assert ev[0].heading_path == ("3 Safety",)


# ------------------------------------------------------------------------------------ scanned / encrypted

def test_scanned_and_encrypted_pdfs_are_listed_with_their_reason(tmp_path: Path, doc_store, capsys):
    d = tmp_path / "pdfs"
    d.mkdir()
    (d / "scan.pdf").write_bytes(_pdf([None, None]))
    (d / "locked.pdf").write_bytes(_pdf([["Secret minutes of the board."]], password="hunter2"))
    (d / "open.pdf").write_bytes(_pdf([["Permissions only."]], password=""))  # empty user password: readable
    (d / "half.pdf").write_bytes(_pdf([["A page with text about herons."], None]))
    report = Ingester(doc_store).ingest([d])
    st = {Path(f.path).name: f for f in report.files}
    assert (st["scan.pdf"].status, st["scan.pdf"].reason) == ("failed", "no text layer (scanned?)")
    assert (st["locked.pdf"].status, st["locked.pdf"].reason) == ("failed", "encrypted")
    assert st["open.pdf"].status == "indexed"
    assert st["half.pdf"].status == "indexed"
    assert st["half.pdf"].reason == "1 of 2 pages have no text layer (scanned?)"
    failed = {Path(r.path).name: r.error for r in doc_store.documents("status = 'failed'")}
    assert failed == {"scan.pdf": "no text layer (scanned?)", "locked.pdf": "encrypted"}

    from app.cli import main

    assert main(["ingest", str(d)]) == 1  # the CLI lists both (exit 1: some failed), never skips them
    out = capsys.readouterr().out
    assert f"failed    {d / 'scan.pdf'}  (no text layer (scanned?))" in out
    assert f"failed    {d / 'locked.pdf'}  (encrypted)" in out


# -------------------------------------------------------------------------------- the embedding pipeline

class SlowFake(FakeEmbedder):
    """``FakeEmbedder`` whose ``embed`` takes time and reports progress like ``Embedder.embed``; records the
    size of each call and the thread it ran on."""

    def __init__(self, delay_s: float = 0.0, fail_after: int | None = None) -> None:
        super().__init__()
        self.delay_s, self.fail_after = delay_s, fail_after
        self.calls: list[int] = []
        self.threads: set[str] = set()

    def embed(self, texts, progress=None):
        self.calls.append(len(texts))
        self.threads.add(threading.current_thread().name)
        if self.fail_after is not None and len(self.calls) > self.fail_after:
            raise EngineCrashed("the embedding engine died during embed (test)")
        time.sleep(self.delay_s)
        if progress is not None:
            half = len(texts) // 2
            progress(half, half * 10)
            progress(len(texts), len(texts) * 10)
        return super().embed(texts)


def _many(folder: Path, n: int, paras: int = 1) -> Path:
    folder.mkdir()
    for i in range(n):
        body = "\n\n".join(f"Note {i} part {j} about topic{i} and {'filler words ' * 12}" for j in range(paras))
        (folder / f"n{i:03d}.md").write_text(f"# Note {i}\n\n{body}\n")
    return folder


def test_chunks_of_many_documents_are_embedded_together_in_the_background(tmp_path: Path, doc_store):
    d = _many(tmp_path / "notes", 30, paras=2)
    fake = SlowFake()
    events = []
    report = Ingester(doc_store, fake, embed_group_tokens=400).ingest(
        [d], progress=lambda p: events.append(p.snapshot()))
    assert report.count("indexed") == 30
    assert len(fake.calls) < 30 and max(fake.calls) > 2  # groups span documents
    assert fake.threads == {"hearth-embed_0"}  # embedded on the worker thread
    stats = doc_store.stats()
    assert stats["embeddings"] == stats["chunks"] == report.chunks and doc_store.check() == []
    files = [e for e in events if e.event == "file"]
    assert [e.files_done for e in files] == list(range(1, 31))
    embeds = [e for e in events if e.event == "embed"]
    assert embeds and any(e.in_flight for e in embeds)
    # each chunk and its lead (heading path and first sentence) are embedded: 10 tokens each for SlowFake
    assert embeds[-1].chunks_embedded == report.chunks and embeds[-1].tokens_embedded == report.chunks * 2 * 10
    assert stats["lead_vectors"] == stats["chunks"]
    assert all(0 <= done <= total for e in embeds for done, total in e.in_flight.values())
    assert files[-1].bytes_read == files[-1].bytes_total > 0 and files[-1].eta_s == 0.0
    assert {threading.main_thread().name} == {"MainThread"}  # callbacks ran on this (the ingest) thread


def test_serial_mode_matches_the_pipeline(tmp_path: Path):
    d = _many(tmp_path / "notes", 8, paras=3)

    def run(name, **kw):
        with DocumentStore(tmp_path / f"{name}.db") as s:
            Ingester(s, SlowFake(), **kw).ingest([d])
            return s.db.execute("SELECT c.evidence_id, c.text, c.heading_path, e.vector FROM chunks c JOIN "
                                "embeddings e ON e.chunk_id = c.id ORDER BY c.evidence_id").fetchall()

    assert run("serial", embed_group_tokens=0, background=False) == run("pipelined")


def test_content_waiting_for_vectors_is_indexed_once(tmp_path: Path, doc_store):
    d = tmp_path / "dups"
    d.mkdir()
    for name in ("a.md", "b.md", "c.md"):
        (d / name).write_text("# Same\n\nIdentical content in three files.\n")
    report = Ingester(doc_store, SlowFake(), embed_group_tokens=10_000).ingest([d])
    assert [f.status for f in report.files] == ["indexed", "duplicate", "duplicate"]
    assert doc_store.check() == []


def test_an_engine_failure_mid_run_indexes_the_rest_for_keyword_search(tmp_path: Path, doc_store):
    d = _many(tmp_path / "notes", 12, paras=2)
    report = Ingester(doc_store, SlowFake(fail_after=1), embed_group_tokens=200).ingest([d])
    assert report.count("indexed") == 12
    keyword_only = [f for f in report.files if f.reason and "keyword search only" in f.reason]
    assert keyword_only and doc_store.stats()["embeddings"] < doc_store.stats()["chunks"]
    assert doc_store.check() == []


# ------------------------------------------------------------------------------------ kill -9, then resume

_INGEST_SCRIPT = """
import sys, time
sys.path[:0] = [{repo!r}, {tests!r}]
from fakes import FakeEmbedder
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore

class Slow(FakeEmbedder):
    def embed(self, texts, progress=None):
        time.sleep(0.15)
        return super().embed(texts)

Ingester(DocumentStore({db!r}), Slow(), embed_group_tokens=150).ingest([{folder!r}])
print("finished", flush=True)
"""


def test_kill_9_mid_ingest_then_resume_ingests_everything_exactly_once(tmp_path: Path):
    n = 60
    d = _many(tmp_path / "notes", n)
    db = tmp_path / "documents.db"
    script = _INGEST_SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), db=str(db), folder=str(d))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    committed = 0
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                try:
                    with sqlite3.connect(db, timeout=5) as c:
                        committed = c.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
                except sqlite3.OperationalError:  # schema not created yet
                    committed = 0
            if committed >= 8:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, (out, err)
    assert "finished" not in out

    with DocumentStore(db) as s:
        assert s.check() == []  # SQLite + FTS5 integrity, no orphans, chunk counts right
        before = {r.path for r in s.documents()}
        assert 8 <= len(before) < n
        assert s.stats()["embeddings"] == s.stats()["chunks"]  # every committed document is whole
        report = Ingester(s, FakeEmbedder()).ingest([d])
        by = {Path(f.path).name: f.status for f in report.files}
        assert sum(1 for v in by.values() if v == "unchanged") == len(before)
        assert sum(1 for v in by.values() if v == "indexed") == n - len(before)
        assert s.check() == []
        rows = s.db.execute("SELECT path, COUNT(*) FROM documents GROUP BY path").fetchall()
        assert len(rows) == n and all(k == 1 for _p, k in rows)
        assert s.db.execute("SELECT COUNT(*), COUNT(DISTINCT evidence_id) FROM chunks").fetchone() == (n, n)
        assert s.stats()["embeddings"] == n


# ------------------------------------------------------------------------------------------- real model

@pytest.fixture(scope="module")
def embedders(embedding_model: Path):
    pytest.importorskip("llama_cpp")
    from app.retrieval.embedder import Embedder

    batched, legacy = Embedder(embedding_model), Embedder(embedding_model, batch_tokens=0)
    yield batched, legacy
    batched.close()
    legacy.close()


@pytest.mark.model
def test_batched_embeddings_match_one_at_a_time(embedders):
    batched, legacy = embedders
    from benchmarks.retrieval_corpus import build_corpus  # noqa: F401  (same kind of text as the benchmark)

    words = ("The kettle switches itself off when the water boils; descale it monthly with citric acid, "
             "and never fill it above the MAX line. ").split()
    texts = [" ".join(words[: 5 + (i * 7) % len(words)] * (1 + i % 9)) for i in range(40)]
    events = []
    vb = batched.embed(texts, progress=lambda n, t: events.append((n, t)))
    vl = legacy.embed(texts)
    assert vb.shape == vl.shape == (40, 384)
    assert float(np.abs(vb - vl).max()) < 1e-3
    assert float((vb * vl).sum(axis=1).min()) > 0.9999
    assert [n for n, _ in events] == sorted(n for n, _ in events) and events[-1][0] == 40
    assert batched.count_tokens(["hello world"]) == legacy.count_tokens(["hello world"]) == [2]
    one = batched.embed(texts[3:4])
    assert float(np.abs(one[0] - vb[3]).max()) < 1e-3  # a text's vector does not depend on its batch mates


@pytest.mark.model
def test_tokens_are_counted_while_an_embedding_runs(embedders):
    batched, _ = embedders
    texts = ["a sentence about herons and egrets " * 40] * 48
    counts: list[list[int]] = []
    t = threading.Thread(target=lambda: batched.embed(texts))
    t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    counts.append(batched.count_tokens(["one two three"]))
    waited = time.perf_counter() - t0
    t.join()
    assert counts == [[3]]
    assert waited < 1.0  # the side lane answers without waiting for the whole embedding


@pytest.mark.model
def test_batch_tokens_must_not_be_negative(embedding_model: Path):
    from app.retrieval.embedder import Embedder

    with pytest.raises(ValueError, match="batch_tokens"):
        Embedder(embedding_model, batch_tokens=-1)


def test_heading_offsets_are_exact_on_every_supported_text_format():
    rst = "Title\n=====\n\nIntro.\n\nSection\n-------\n\nBody.\n"
    hs = find_headings(rst, "rst")
    assert [(h.level, h.title) for h in hs] == [(1, "Title"), (2, "Section")]
    assert all(isinstance(h, Heading) and rst[h.start:h.end].startswith(h.title) for h in hs)


def test_cli_progress_bar_shows_percentage_tokens_eta_and_the_file():
    from app.cli.ingest import render_bar
    from app.retrieval.types import Progress

    p = Progress(files_total=30, files_done=12, bytes_total=1000, bytes_read=450, elapsed_s=20.0,
                 chunks_embedded=340, tokens_embedded=60_000, current="/docs/annual_report_2025.pdf")
    line = render_bar(p, width=120)
    assert line.startswith("[##########--------------]  45%  12/30 files  340 chunks  3,000 tok/s  ETA 24s")
    assert line.endswith("annual_report_2025.pdf") and len(line) <= 120
    assert render_bar(p, width=90).endswith("…") and len(render_bar(p, width=90)) == 90
    assert p.eta_s == pytest.approx(20.0 * 0.55 / 0.45)
    assert "ETA" not in render_bar(Progress(files_total=2, files_done=2, bytes_total=10, bytes_read=10,
                                            elapsed_s=1.0))


@pytest.mark.model
def test_two_workers_split_a_call_and_agree_with_one(embedding_model: Path, embedders):
    from app.retrieval.embedder import Embedder

    batched, _ = embedders
    texts = [f"Passage {i} about the migration of herons along the coast. " * (1 + i % 5) for i in range(24)]
    events = []
    with Embedder(embedding_model, workers=2) as wide:
        vw = wide.embed(texts, progress=lambda n, t: events.append((n, t)))
        assert wide.hosts[1].pid is not None and wide.hosts[1].pid != wide.pid
    v1 = batched.embed(texts)
    assert float(np.abs(vw - v1).max()) < 1e-3
    assert events[-1][0] == 24 and [n for n, _ in events] == sorted(n for n, _ in events)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_reported_not_read(tmp_path: Path):
    """A FIFO in a folder (or named on the command line) would block a read forever: it is listed as failed
    with the reason, and the folder's other files are indexed."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# Apples\n\nApples are red or green.\n", encoding="utf-8")
    os.mkfifo(folder / "pipe.md")
    store = DocumentStore(tmp_path / "documents.db")
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(
        folder=Ingester(store).ingest([str(folder)], remember=False),
        named=Ingester(store).ingest([str(folder / "pipe.md")], remember=False)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "ingest blocked on the named pipe"
    for report in (result["folder"], result["named"]):
        failed = {f.path: f.reason for f in report.failed}
        assert failed == {str(folder / "pipe.md"): "not a regular file (a named pipe, socket or device)"}
    assert store.stats()["chunks"] >= 1
    store.close()


def test_document_paths_are_the_paths_an_ingest_records(tmp_path: Path) -> None:
    # What a drop on a chat attaches: the files of the folders named too, as the store records them
    from app.retrieval.ingest import document_paths
    from app.retrieval.store import DocumentStore

    (tmp_path / "notes" / "sub").mkdir(parents=True)
    (tmp_path / "notes" / "a.txt").write_text("Alpha.\n", encoding="utf-8")
    (tmp_path / "notes" / "sub" / "b.md").write_text("# Beta\n\nBeta text.\n", encoding="utf-8")
    (tmp_path / "notes" / ".hidden.txt").write_text("hidden\n", encoding="utf-8")
    (tmp_path / "c.txt").write_text("Gamma.\n", encoding="utf-8")
    named = [str(tmp_path / "notes"), str(tmp_path / "notes" / ".." / "c.txt")]
    paths = document_paths(named)
    assert paths == [str(tmp_path / "notes" / "a.txt"), str(tmp_path / "notes" / "sub" / "b.md"),
                     str(tmp_path / "c.txt")]
    with DocumentStore(tmp_path / "documents.db") as store:
        Ingester(store).ingest(named)
        assert sorted(d.path for d in store.documents()) == sorted(paths)
