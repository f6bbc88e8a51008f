"""``DownloadController``: Hugging Face search and one GGUF download at a time, on workers (``app.catalog.hub``).

Progress arrives from the download thread through a queued signal and is forwarded at most every 100 ms.
``cancel()`` sets the event the progress class checks; the partial file stays for a resume. A search cannot be
interrupted (one HTTP call), so ``cancel_search()`` forgets it instead: the controller goes idle at once and the
search's answer is dropped when it comes.
"""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QObject, Signal, SignalInstance

from app.catalog.hub import HubClient
from app.ui.workers import WorkerPool


class DownloadController(QObject):
    """Signals: ``results(list[HubModel])``, ``files(list[HubFile])``, ``progress(done, total)`` (total 0 when
    unknown), ``downloaded(path)``, ``failed(exc)`` (``DownloadCancelled`` when cancelled), ``busy_changed``;
    ``searching(bool)`` while a search runs (False at once on ``cancel_search``)."""

    results = Signal(list)
    files = Signal(list)
    progress = Signal(object, object)
    downloaded = Signal(str)
    failed = Signal(object)
    busy_changed = Signal(bool)
    searching = Signal(bool)
    _raw_progress = Signal(object, object)

    def __init__(self, pool: WorkerPool, client: HubClient | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool = pool
        self.client = client or HubClient()
        self.cancel_event = threading.Event()
        self.busy = False
        self.current: tuple[str, str] | None = None
        self._last_emit = 0.0
        self._search: object | None = None  # the running search's token; an answer with another is dropped
        self._raw_progress.connect(self._throttle)

    def search(self, query: str) -> None:
        """Search the Hub on a worker: ``searching(True)``, then ``results`` or ``failed`` (offline: within
        seconds, ``app.catalog.hub.OFFLINE``), then ``searching(False)``."""
        token = self._search = object()
        self.searching.emit(True)
        self.pool.run(self.client.search, query, on_return=lambda hits: self._answer(token, self.results, hits),
                      on_error=lambda exc: self._answer(token, self.failed, exc),
                      on_finish=lambda: self._search_done(token))

    def cancel_search(self) -> bool:
        """Forget the running search: ``searching(False)`` now, its results or error are never emitted.
        Returns False when no search runs."""
        if self._search is None:
            return False
        self._search = None
        self.searching.emit(False)
        return True

    def _answer(self, token: object, signal: SignalInstance, value: object) -> None:
        if token is self._search:
            signal.emit(value)

    def _search_done(self, token: object) -> None:
        if token is self._search:
            self._search = None
            self.searching.emit(False)

    def list_files(self, repo: str) -> None:
        self.pool.run(self.client.files, repo, on_return=self.files.emit, on_error=self.failed.emit)

    def download(self, repo: str, filename: str) -> bool:
        if self.busy:
            return False
        self.busy, self.current = True, (repo, filename)
        self.cancel_event.clear()
        self.busy_changed.emit(True)
        self.pool.run(self.client.download, repo, filename, self._raw_progress.emit, self.cancel_event,
                      on_return=lambda p: self.downloaded.emit(str(p)), on_error=self.failed.emit,
                      on_finish=self._done)
        return True

    def _throttle(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last_emit >= 0.1 or (total and done >= total):
            self._last_emit = now
            self.progress.emit(done, total or 0)

    def _done(self) -> None:
        self.busy, self.current = False, None
        self.busy_changed.emit(False)

    def cancel(self) -> None:
        self.cancel_event.set()
