"""``DocumentsController``: the document index (``app.retrieval``) for the window.

Ingest and rescan run on a worker with their own ``DocumentStore`` (sqlite connections stay on one thread) and
report each file as it is handled (``file_done``). Listing and removal are small queries on the GUI thread's
own store. An embedding model is used when one is installed (``hearth setup`` converts the packaged one);
without it, chunks are sized by the approximate counter and search is keyword (BM25) only, which the panel
says. ``source()`` is the ``app.assistant.DocumentSource`` that chat turns and the local port search (its own
connection, the same embedder). If ``app.retrieval`` is missing from this build, ``available`` is False and
the panel says so.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.ui.models import DocRow
from app.ui.workers import WorkerPool

log = logging.getLogger(__name__)



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
    """Signals: ``busy_changed(bool)``, ``progress(done, total)``, ``file_done(DocRow)``, ``report(obj)``,
    ``failed(exc)``."""

    busy_changed = Signal(bool)
    progress = Signal(int, int)
    file_done = Signal(object)
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
        self._progress_item.connect(self._on_progress)

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
        from app.retrieval.embed_model import find_embedding_model

        if find_embedding_model() is None:
            return "No embedding model installed: keyword search only (run `hearth setup` for hybrid search)."
        return "Hybrid search: keywords (BM25) + embeddings (all-MiniLM-L6-v2)."

    # -- ingest -------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self._busy

    def ingest(self, paths: list[str]) -> bool:
        return self._run(lambda ing, cb: ing.ingest(paths, cb))

    def rescan(self) -> bool:
        return self._run(lambda ing, cb: ing.rescan(cb))

    def _run(self, action: Any) -> bool:
        if not self.available or self._busy:
            return False
        self._busy = True
        self.busy_changed.emit(True)
        self.pool.run(self._ingest_job, action, on_return=self.report.emit, on_error=self.failed.emit,
                      on_finish=self._finished)
        return True

    def _ingest_job(self, action: Any) -> Any:
        from app.assistant import prune_stale_citations
        from app.retrieval.ingest import Ingester
        from app.retrieval.store import DocumentStore

        with DocumentStore() as store:
            report = action(Ingester(store, self.embedder()), self._progress_item.emit)
            prune_stale_citations(doc_store=store)  # edited, renamed or deleted files: citations follow
            return report

    def _on_progress(self, p: Any) -> None:
        self.progress.emit(p.files_done, p.files_total)
        if p.last is not None:
            self.file_done.emit(doc_row(p.last))

    def _finished(self) -> None:
        self._busy = False
        self.busy_changed.emit(False)

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
        if self._embedder is None:
            from app.retrieval.embed_model import find_embedding_model

            model = find_embedding_model()
            if model is not None:
                from app.retrieval.embedder import Embedder

                self._embedder = Embedder(model)
        return self._embedder

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
