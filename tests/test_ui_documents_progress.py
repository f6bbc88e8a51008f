"""The Documents panel while a run indexes (fake tier, no model): the overall bar, files and chunks done of total,
tokens/s and the ETA with what it estimates; a row per file being read or embedded with its own bar; the
run's finished files with their chunks or reason (skipped and failed files listed, and still listed once the
index is reloaded); Cancel stopping after the document being written, and the next run going on.

A scripted stand-in for ``Ingester`` feeds a fixed sequence of ``Progress`` events through the controller's
real path (worker thread, snapshots as signals, the throttled ``run_changed``); the cancel test runs the real
``Ingester`` with the shared fake embedder, held inside ``embed`` until the test lets it go. The text itself
is ``app.retrieval.progress``, tested without Qt in tests/test_ingest_progress.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeEmbedder
from PySide6.QtCore import Qt

from app.retrieval.types import FileStatus, IngestReport, Progress

pytestmark = pytest.mark.gui


@pytest.fixture
def panel(qtbot):
    from app.ui.docs_ctl import DocumentsController
    from app.ui.documents_panel import DocumentsPanel
    from app.ui.workers import WorkerPool

    pool = WorkerPool()
    docs = DocumentsController(pool)
    if not docs.available:
        pytest.skip("app.retrieval is not in this build")
    w = DocumentsPanel(SimpleNamespace(docs=docs))
    qtbot.addWidget(w)
    yield w
    assert pool.shutdown(10_000) and pool.active == 0  # no worker left
    docs.shutdown()


PAUSE = object()


class ScriptedIngester:
    """Stands in for ``app.retrieval.ingest.Ingester``: ``ingest`` and ``rescan`` send ``script``'s events to the
    progress callback (the controller's, cancel check included), stopping at each ``PAUSE`` until ``go``."""

    def __init__(self, script: list, report: IngestReport) -> None:
        self.script, self.report = script, report
        self.paused, self.go = threading.Event(), threading.Event()

    def __call__(self, store, embedder=None):  # the class's constructor, as the controller calls it
        return self

    def ingest(self, paths, progress=None, remember=True) -> IngestReport:
        for item in self.script:
            if item is PAUSE:
                self.paused.set()
                assert self.go.wait(10)
                self.go.clear()
            else:
                progress(item)
        return self.report

    rescan = ingest


def _event(p: Progress, **changes) -> Progress:
    for k, v in changes.items():
        setattr(p, k, v)
    return p.snapshot()


def _script() -> list:
    p = Progress(files_total=4, bytes_total=400)
    return [
        _event(p, event="file", files_done=1, bytes_read=50, elapsed_s=0.5, current="/d/photo.jpg",
               last=FileStatus("/d/photo.jpg", "skipped", "unsupported type (.jpg)"), counts={"skipped": 1}),
        _event(p, event="embed", current="/d/b.md", chunks_pending=10, chunks_embedded=3, tokens_embedded=600,
               elapsed_s=1.0, in_flight={"/d/a.txt": (3, 10)}),
        PAUSE,
        _event(p, event="file", files_done=2, bytes_read=150, chunks=10, chunks_pending=0, chunks_embedded=10,
               in_flight={}, last=FileStatus("/d/a.txt", "indexed", None, 10), counts={"skipped": 1, "indexed": 1}),
        _event(p, event="file", files_done=3, bytes_read=300, current="/d/scan.pdf",
               last=FileStatus("/d/scan.pdf", "failed", "no text layer (scanned?)"),
               counts={"skipped": 1, "indexed": 1, "failed": 1}),
        _event(p, event="file", files_done=4, bytes_read=400, elapsed_s=1.4, current="/d/locked.pdf",
               last=FileStatus("/d/locked.pdf", "failed", "encrypted"),
               counts={"skipped": 1, "indexed": 1, "failed": 2}),
    ]


def _listed(w) -> list[str]:
    return [w.run_list.item(i).text() for i in range(w.run_list.count())]


def _indexed(w) -> list[str]:
    rows = [w.model.item(i) for i in range(w.model.rowCount())]
    return sorted(Path(r.path).name for r in rows if r.status == "indexed")


def _active(w) -> list[str]:
    return [r.label.text() for r in w.active_rows if not r.isHidden()]


def test_progress_events_draw_the_bar_eta_file_rows_and_reasons(qtbot, panel, monkeypatch):
    w = panel
    removed = FileStatus("/d/gone.md", "removed", "file no longer exists")
    scripted = ScriptedIngester(_script(), IngestReport(files=[removed], elapsed_s=1.5))
    monkeypatch.setattr("app.retrieval.ingest.Ingester", scripted)
    assert w.ingest(["/d"])
    assert scripted.paused.wait(10)
    qtbot.waitUntil(lambda: "600 tok/s" in w.state.text(), timeout=5_000)  # the throttle's trailing draw
    assert not w.bar.isHidden() and (w.bar.maximum(), w.bar.value(), w.bar.format()) == (1000, 125, "12%")
    assert w.state.text() == "1 of 4 files · 3 of 10 chunks · 600 tok/s"
    assert w.eta.text() == "ETA 7s: time until all 4 files are indexed, at the rate measured so far"
    assert not w.eta.isHidden()
    assert _active(w) == ["b.md — reading", "a.txt — embedding 3 of 10 chunks"]
    reading, embedding = w.active_rows[0].bar, w.active_rows[1].bar
    assert (reading.minimum(), reading.maximum()) == (0, 0)  # no measure while reading: a busy bar
    assert (embedding.maximum(), embedding.value()) == (10, 3)
    assert _listed(w) == ["photo.jpg — skipped: unsupported type (.jpg)"]
    assert w.run_list.item(0).data(Qt.ItemDataRole.UserRole) == "skipped"  # marked as a problem
    assert not w.cancel_btn.isHidden() and w.cancel_btn.isEnabled() and not w.add_btn.isEnabled()

    scripted.go.set()
    qtbot.waitUntil(lambda: not w.docs.busy and w.state.text().startswith("Done"), timeout=5_000)
    assert w.state.text() == "Done in 1.5 s: 1 indexed, 1 removed, 1 skipped, 2 failed."
    assert _listed(w) == ["photo.jpg — skipped: unsupported type (.jpg)", "a.txt — indexed, 10 chunks",
                          "scan.pdf — failed: no text layer (scanned?)", "locked.pdf — failed: encrypted",
                          "gone.md — removed: file no longer exists"]
    assert [w.run_list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(5)] == \
        ["skipped", "indexed", "failed", "failed", "removed"]
    assert w.bar.isHidden() and w.eta.isHidden() and w.cancel_btn.isHidden() and _active(w) == []
    assert w.add_btn.isEnabled()
    # the index was reloaded (nothing was written by the script): the run's list still shows every file
    assert w.model.rowCount() == 0 and len(_listed(w)) == 5 and not w.run_list.isHidden()


class HeldEmbedder(FakeEmbedder):
    """The fake embedder, held inside ``embed`` until ``release`` is set (``entered`` says it is there)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def embed(self, texts, progress=None):
        self.entered.set()
        assert self.release.wait(10)
        return super().embed(texts, progress)


def _folder(tmp_path: Path) -> Path:
    from test_ingest_v2 import _pdf  # the PDF fixtures' maker (pypdf's writer)

    d = tmp_path / "docs"
    d.mkdir()
    for i in range(4):
        (d / f"note{i}.md").write_text(f"# Note {i}\n\nThe heron number {i} waits by the river at dawn.\n")
    (d / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a photo")
    (d / "scan.pdf").write_bytes(_pdf([None]))
    (d / "locked.pdf").write_bytes(_pdf([["Secret minutes."]], password="hunter2"))
    return d


def test_cancel_stops_after_the_document_being_written_and_the_next_run_goes_on(qtbot, panel, tmp_path):
    w = panel
    d = _folder(tmp_path)
    embedder = w.docs._embedder = HeldEmbedder()  # what DocumentsController.embedder() hands the Ingester
    assert w.ingest([str(d)])
    assert embedder.entered.wait(10)  # every file read; the one group of chunks is being embedded
    qtbot.waitUntil(lambda: "scan.pdf — failed: no text layer (scanned?)" in _listed(w), timeout=5_000)
    assert "0 of 4 chunks" in w.state.text()  # read, waiting for vectors
    w.cancel_btn.click()
    assert w.state.text().startswith("Cancelling") and not w.cancel_btn.isEnabled()
    assert w.ingest([str(d)]) is False  # one run at a time
    embedder.release.set()
    qtbot.waitUntil(lambda: not w.docs.busy, timeout=10_000)
    assert w.state.text().startswith("Cancelled after 4 of 7 files (1 indexed, 1 skipped, 2 failed)")
    assert _listed(w) == ["locked.pdf — failed: encrypted", "photo.jpg — skipped: unsupported type (.jpg)",
                          "scan.pdf — failed: no text layer (scanned?)", "note0.md — indexed, 1 chunk"]
    assert _indexed(w) == ["note0.md"]

    assert w.ingest([str(d)])  # nothing was lost: the next run skips what is done and goes on
    qtbot.waitUntil(lambda: not w.docs.busy, timeout=10_000)
    assert w.state.text().startswith("Done in ") and "3 indexed, 1 unchanged" in w.state.text()
    assert [t for t in _listed(w) if "note" in t] == [f"note{i}.md — indexed, 1 chunk" for i in (1, 2, 3)]
    assert "scan.pdf — failed: no text layer (scanned?)" in _listed(w)  # failed again, listed again
    assert _indexed(w) == \
        ["note0.md", "note1.md", "note2.md", "note3.md"]


def test_a_stoppable_worker_sees_quit_from_the_pool_shutdown(qtbot):
    from app.ui.workers import StoppableWorker, WorkerPool

    pool, got = WorkerPool(), []
    w = StoppableWorker(lambda stop, n: (stop.wait(10), n)[1], 7)
    pool.start(w, on_return=got.append)
    qtbot.waitUntil(lambda: pool.pool.activeThreadCount() == 1, timeout=5_000)
    assert pool.shutdown(5_000)
    qtbot.waitUntil(lambda: got == [7], timeout=5_000)


@pytest.mark.model
def test_a_real_embedder_run_shows_its_rate_and_chunk_counts_real(qtbot, panel, tmp_path, embedding_model):
    pytest.importorskip("llama_cpp")
    from app.retrieval.embedder import Embedder

    w = panel
    for name, text in (("kettle.md", "Descale the kettle monthly with citric acid."),
                       ("ferry.txt", "The ferry to Lindholm leaves at 7:45 from pier 4.")):
        (tmp_path / name).write_text(text + "\n")
    w.docs._embedder = Embedder(embedding_model, workers=1)  # closed by the controller's shutdown
    shown: list[str] = []
    w.docs.run_changed.connect(lambda run: shown.append(run.status_text()))
    assert w.ingest([str(tmp_path / "kettle.md"), str(tmp_path / "ferry.txt")])
    qtbot.waitUntil(lambda: not w.docs.busy, timeout=60_000)
    assert w.state.text().startswith("Done in ") and "2 indexed" in w.state.text()
    assert sorted(_listed(w)) == ["ferry.txt — indexed, 1 chunk", "kettle.md — indexed, 1 chunk"]
    assert any("tok/s" in t for t in shown)  # the measured embedding rate was drawn while it ran
    assert _indexed(w) == ["ferry.txt", "kettle.md"]
