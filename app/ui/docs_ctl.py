"""``DocumentsController``: the document index (``app.retrieval``) for the window.

The reasoning: docs/ui.md, 'app/ui/docs_ctl.py'.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.ui.models import DocRow
from app.ui.workers import StoppableWorker, WorkerPool

log = logging.getLogger(__name__)

RUN_RENDER_MS = 100  # the panel redraws a run's progress at most this often

def retrieval_available() -> bool:
    try:
        import app.assistant.evidence  # noqa: F401
        import app.retrieval.ingest  # noqa: F401
    except ImportError:
        return False
    return True


def doc_row(d: Any) -> DocRow:
    """A ``DocumentRow`` (store) or ``FileStatus`` (ingest) as a list row."""
    status = getattr(d, "status", "indexed")
    reason = getattr(d, "reason", None) or getattr(d, "error", None)
    chunks = getattr(d, "chunks", None)
    if chunks is None:
        chunks = getattr(d, "chunk_count", 0)
    return DocRow(d.path, status, reason, int(chunks or 0), getattr(d, "pages", getattr(d, "page_count", None)))


class DocumentsController(QObject):
    """Signals: ``busy_changed(bool)``, ``progress(done, total)``, ``file_done(DocRow)``, ``run_changed(IngestRun)``
    (throttled; the same object each time, read it on the GUI thread), ``report(IngestReport)`` (a cancelled
    run's has the files it finished), ``failed(exc)``. ``run``: the current or last ``IngestRun``."""

    busy_changed = Signal(bool)
    progress = Signal(int, int)
    file_done = Signal(object)
    run_changed = Signal(object)
    report = Signal(object)
    failed = Signal(object)
    _progress_item = Signal(object)  # from the worker thread: queued to the GUI thread

    def __init__(self, pool: WorkerPool, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool = pool
        self.available = retrieval_available()
        self._store: Any = None
        self._embedder: Any = None
        self._source: Any = None
        self._embedder_lock = threading.Lock()
        self._busy = False
        self._worker: StoppableWorker | None = None
        self.run: Any = None
        self._last_render = 0.0
        self._render_timer = QTimer(self, singleShot=True, interval=RUN_RENDER_MS)
        self._render_timer.timeout.connect(self._render_now)
        self._progress_item.connect(self._on_progress)
        from app.ui.embed_ctl import EmbeddingController

        self.embedding = EmbeddingController(pool, self._open_store, self._drop_embedder, self)

    # -- reading ------------------------------------------------------------------------------------------
    def store(self) -> Any:
        if self._store is None:
            from app.retrieval.store import DocumentStore

            self._store = DocumentStore()
        return self._store

    def documents(self) -> list[DocRow]:
        if not self.available:
            return []
        return [doc_row(d) for d in self.store().documents() if d.status != "removed"]

    def search_notice(self) -> str:
        from app.retrieval.embed_switch import active_ref

        active = active_ref(self.store())
        if active is None:
            return "No embedding model installed: keyword search only (run `hearth setup` for hybrid search)."
        return f"Hybrid search: keywords (BM25) + embeddings ({active.name})."

    @staticmethod
    def _open_store() -> Any:
        """A new ``DocumentStore`` of the data folder (a context manager): one per thread."""
        from app.retrieval.store import DocumentStore

        return DocumentStore()

    # -- ingest -------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self._busy

    def ingest(self, paths: list[str]) -> bool:
        label = f"{len(paths)} item{'s' if len(paths) != 1 else ''}"
        return self._run(lambda ing, cb: ing.ingest(paths, cb), label)

    def rescan(self) -> bool:
        return self._run(lambda ing, cb: ing.rescan(cb), "the remembered folders")

    def cancel(self) -> bool:
        """Stop the run after the document being written; False when none runs."""
        if not self._busy or self._worker is None:
            return False
        self._worker.quit()
        self.run.cancelling = True
        self._render_now()
        return True

    def _run(self, action: Any, label: str) -> bool:
        if not self.available or self._busy:
            return False
        from app.retrieval.progress import IngestRun

        self._busy = True
        self.run = IngestRun(label)
        self.busy_changed.emit(True)
        self._render_now()
        self._worker = self.pool.start(StoppableWorker(self._ingest_job, action), on_return=self._returned,
                                       on_error=self._errored, on_finish=self._finished)
        return True

    def _ingest_job(self, stop: threading.Event, action: Any) -> tuple[Any, bool]:
        """On the worker: (the report or None, cancelled)."""
        from app.assistant import prune_stale_citations
        from app.retrieval.ingest import Ingester
        from app.retrieval.progress import IngestCancelled, stop_after_document
        from app.retrieval.store import DocumentStore

        with DocumentStore() as store:
            try:
                report = action(Ingester(store, self.embedder()),
                                stop_after_document(lambda p: self._progress_item.emit(p.snapshot()), stop))
            except IngestCancelled:
                report = None  # the documents finished before it are committed: their citations follow too
            prune_stale_citations(doc_store=store)  # edited, renamed or deleted files: citations follow
            return report, report is None

    def _on_progress(self, p: Any) -> None:
        self.progress.emit(p.files_done, p.files_total)
        if p.event == "file" and p.last is not None:
            self.file_done.emit(doc_row(p.last))
        if self.run is not None:
            self.run.update(p)
            self._render_soon()

    def _render_soon(self) -> None:
        if time.monotonic() - self._last_render >= RUN_RENDER_MS / 1000:
            self._render_now()
        elif not self._render_timer.isActive():
            self._render_timer.start()

    def _render_now(self) -> None:
        self._render_timer.stop()
        self._last_render = time.monotonic()
        if self.run is not None:
            self.run_changed.emit(self.run)

    def _returned(self, result: tuple[Any, bool]) -> None:
        report, cancelled = result
        self.run.finish(report, cancelled=cancelled)
        self.report.emit(report if report is not None else self.run.report())

    def _errored(self, exc: BaseException) -> None:
        self.run.finish(None, error=str(exc) or type(exc).__name__)
        self.failed.emit(exc)

    def _finished(self) -> None:
        self._busy = False
        self._worker = None
        self.busy_changed.emit(False)
        self._render_now()

    def remove(self, path: str) -> None:
        store = self.store()
        doc = store.document(path)
        if doc is not None:
            store.delete_document(doc.id)
        if path in store.roots():
            store.remove_root(path)
        from app.assistant import prune_stale_citations

        prune_stale_citations(doc_store=store)

    # -- search (chat worker thread) ------------------------------------------------------------------
    def embedder(self) -> Any:
        """The installed embedding model's ``Embedder`` (started on first use), or None."""
        with self._embedder_lock:
            return self._embedder_unlocked()

    def _embedder_unlocked(self) -> Any:
        """The ``Embedder`` of the model search uses (``embed_switch.active_ref``: the store's active model
        while another is being re-embedded into), started on first use; None when none is installed."""
        if self._embedder is None:
            from app.retrieval.embed_switch import active_ref, embedder_for

            with self._open_store() as store:  # called from the chat's worker thread too: its own connection
                self._embedder = embedder_for(active_ref(store))
        return self._embedder

    def _drop_embedder(self) -> None:
        """The active model changed: close the search source and its embedder; the next search starts them on
        the new model."""
        with self._embedder_lock:
            source, embedder, self._source, self._embedder = self._source, self._embedder, None, None
        if source is not None:
            source.close()
        if embedder is not None:
            embedder.close()

    def source(self) -> Any:
        """The ``DocumentSource`` for chat turns and the port (None when retrieval is not in this build)."""
        if not self.available:
            return None
        with self._embedder_lock:
            if self._source is None:
                from app.assistant import DocumentSource
                from app.retrieval.store import DocumentStore

                self._source = DocumentSource(DocumentStore(), self._embedder_unlocked(), owns_store=True)
            return self._source

    def shutdown(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._store is not None:
            self._store.close()
            self._store = None
