"""Ingest progress as a person sees it (``app.retrieval.progress``), without Qt: the shared figures and ETA text
(the CLI's bar and the window's panel draw the same numbers), the per-file fold of a run's ``Progress``
events, and cancelling between documents on a real ``Ingester`` with the fake embedder."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fakes import FakeEmbedder

from app.retrieval.ingest import Ingester
from app.retrieval.progress import (
    EMBEDDING,
    READING,
    IngestCancelled,
    IngestRun,
    eta_text,
    figures,
    format_duration,
    stop_after_document,
    summary_text,
)
from app.retrieval.types import FileStatus, IngestReport, Progress


def test_figures_and_their_text():
    p = Progress(files_total=30, files_done=12, bytes_total=1000, bytes_read=450, elapsed_s=20.0, chunks=300,
                 chunks_pending=120, chunks_embedded=340, tokens_embedded=60_000,
                 in_flight={"/d/a.pdf": (40, 100), "/d/b.md": (0, 20)})
    f = figures(p)
    assert (f.percent, f.files_done, f.files_total, f.chunks_done, f.chunks_total) == (45, 12, 30, 340, 420)
    assert f.tokens_per_s == pytest.approx(3000.0)
    assert f.eta_s == pytest.approx(p.eta_s) == pytest.approx(20.0 * 0.55 / 0.45)  # the one ETA: Progress's
    assert summary_text(f) == "12 of 30 files · 340 of 420 chunks · 3,000 tok/s"
    assert eta_text(f) == "ETA 24s: time until all 30 files are indexed, at the rate measured so far"


def test_figures_before_a_rate_and_when_done():
    start = figures(Progress(files_total=3, bytes_total=300))
    assert start.eta_s is None and start.tokens_per_s is None and start.percent == 0
    assert eta_text(start).startswith("Estimating the time left")
    assert summary_text(start) == "0 of 3 files · 0 chunks"  # no embedding yet: no rate shown
    done = figures(Progress(files_total=2, files_done=2, bytes_total=10, bytes_read=10, elapsed_s=1.0, chunks=7))
    assert done.finished and done.eta_s is None and eta_text(done) == "" and done.percent == 100
    assert summary_text(done) == "2 of 2 files · 7 chunks"
    assert figures(Progress(files_total=3, files_done=1, bytes_total=3, bytes_read=2, elapsed_s=1.0)).percent == 66


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (45, "45s"), (90, "1m30s"), (3599, "59m59s"),
                                               (7300, "2h01m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def _event(p: Progress, **changes) -> Progress:
    for k, v in changes.items():
        setattr(p, k, v)
    return p.snapshot()


def test_a_run_folds_into_per_file_rows_and_keeps_skipped_and_failed_files():
    run = IngestRun("1 item")
    assert run.status_text() == "Indexing 1 item…" and run.eta_text() == ""
    p = Progress(files_total=5, bytes_total=500)
    run.update(_event(p, event="file", files_done=1, bytes_read=10, elapsed_s=0.1, current="/d/photo.jpg",
                      last=FileStatus("/d/photo.jpg", "skipped", "unsupported type (.jpg)"), counts={"skipped": 1}))
    assert run.active == []  # the skipped file is done, not being read
    run.update(_event(p, event="embed", current="/d/c.md", chunks_pending=12, chunks_embedded=3,
                      tokens_embedded=300, elapsed_s=0.5, in_flight={"/d/a.txt": (3, 10), "/d/b.txt": (0, 2)}))
    assert [(r.state, r.text()) for r in run.active] == [
        (READING, "c.md — reading"), (EMBEDDING, "a.txt — embedding 3 of 10 chunks"),
        (EMBEDDING, "b.txt — embedding 0 of 2 chunks")]
    assert run.active[1].fraction == pytest.approx(0.3) and run.active[0].fraction is None
    assert run.status_text() == "1 of 5 files · 3 of 12 chunks · 600 tok/s"
    assert run.eta_text().startswith("ETA ") and "all 5 files" in run.eta_text()
    # the flight ends just before its documents are written: the chunk count never steps back
    run.update(_event(p, event="embed", chunks_embedded=12, in_flight={}))
    assert run.figures.chunks_done == 3
    run.update(_event(p, event="file", files_done=2, bytes_read=200, chunks=10, chunks_pending=2,
                      last=FileStatus("/d/a.txt", "indexed", None, 10)))
    run.update(_event(p, event="file", files_done=3, bytes_read=250, chunks=12, chunks_pending=0,
                      last=FileStatus("/d/b.txt", "indexed", None, 2)))
    assert run.figures.chunks_done == 12 and run.figures.chunks_total == 12
    run.update(_event(p, event="file", files_done=4, bytes_read=400, current="/d/scan.pdf",
                      last=FileStatus("/d/scan.pdf", "failed", "no text layer (scanned?)")))
    run.update(_event(p, event="file", files_done=5, bytes_read=500, current="/d/old.md",
                      last=FileStatus("/d/old.md", "unchanged", None, 4),
                      counts={"skipped": 1, "indexed": 2, "failed": 1, "unchanged": 1}))
    assert run.active == []
    run.finish(IngestReport(files=[FileStatus("/d/gone.md", "removed", "file no longer exists")], elapsed_s=1.5))
    assert [r.text() for r in run.listed] == [
        "photo.jpg — skipped: unsupported type (.jpg)", "a.txt — indexed, 10 chunks", "b.txt — indexed, 2 chunks",
        "scan.pdf — failed: no text layer (scanned?)", "gone.md — removed: file no longer exists"]  # not unchanged
    assert [r.name for r in run.problems] == ["photo.jpg", "scan.pdf"]
    assert run.status_text() == "Done in 1.5 s: 2 indexed, 1 unchanged, 1 removed, 1 skipped, 1 failed."
    assert len(run.report().files) == 6


def test_outcome_lines_count_every_kind():
    run = IngestRun()
    p = Progress(files_total=3, bytes_total=3)
    for i, (status, reason) in enumerate([("indexed", None), ("unchanged", None), ("failed", "encrypted")], 1):
        run.update(_event(p, files_done=i, bytes_read=i, last=FileStatus(f"/d/{i}", status, reason),
                          counts={**p.counts, status: 1}))
    run.finish(IngestReport(files=[], elapsed_s=2.0))
    assert run.status_text() == "Done in 2.0 s: 1 indexed, 1 unchanged, 1 failed."
    cancelled = IngestRun()
    cancelled.update(_event(Progress(files_total=9, bytes_total=9), files_done=2, bytes_read=2,
                            counts={"indexed": 2}, last=FileStatus("/d/x", "indexed", None, 1)))
    cancelled.cancelling = True
    assert cancelled.status_text().startswith("Cancelling") and cancelled.eta_text() == ""
    cancelled.finish(None, cancelled=True)
    assert cancelled.status_text().startswith("Cancelled after 2 of 9 files (2 indexed)")
    failed = IngestRun()
    failed.finish(None, error="disk I/O error")
    assert failed.status_text() == "Indexing failed: disk I/O error"


def _folder(tmp_path: Path, n: int) -> Path:
    d = tmp_path / "docs"
    d.mkdir()
    for i in range(n):
        (d / f"note{i}.md").write_text(f"# Note {i}\n\nThe heron number {i} waits by the river at dawn.\n")
    return d


def test_stop_after_document_ends_a_real_run_between_documents_and_the_next_run_goes_on(tmp_path, doc_store):
    d = _folder(tmp_path, 5)
    stop = threading.Event()
    seen: list[Progress] = []

    def progress(p: Progress) -> None:
        seen.append(p.snapshot())
        if p.event == "file":
            stop.set()  # cancel as soon as the first document is committed

    with pytest.raises(IngestCancelled, match="cancelled after 1 of 5 files"):
        Ingester(doc_store, FakeEmbedder()).ingest([d], stop_after_document(progress, stop))
    assert any(p.event == "embed" for p in seen)  # embed events never stop the run
    indexed = doc_store.documents("status = 'indexed'")
    assert len(indexed) == 1 and indexed[0].path.endswith("note0.md")
    assert doc_store.check() == []  # committed documents are complete
    report = Ingester(doc_store, FakeEmbedder()).ingest([d])
    assert sorted(f.status for f in report.files) == ["indexed"] * 4 + ["unchanged"]


def test_stop_after_document_without_a_stop_is_the_plain_callback():
    seen = []
    cb = stop_after_document(seen.append, threading.Event())
    cb(Progress(files_total=1, files_done=1))
    assert len(seen) == 1
    stop_after_document(None, threading.Event())(Progress(files_total=1))  # no callback: fine


def test_break_it_bytes_past_the_total_are_not_done_until_every_file_is():
    from app.retrieval.progress import eta_text, figures
    from app.retrieval.types import Progress

    f = figures(Progress(files_total=3, files_done=1, bytes_read=120, bytes_total=100, elapsed_s=5))
    assert f.percent == 99 and not f.finished
    assert eta_text(f).startswith("Finishing: 2 file(s)")
