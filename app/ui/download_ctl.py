"""``DownloadController``: Hugging Face search and one GGUF download at a time, on workers (``app.catalog.hub``).

Progress arrives from the download thread through a queued signal and is forwarded at most every 100 ms.
``cancel()`` sets the event the progress class checks; the partial file stays for a resume.
"""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QObject, Signal

from app.catalog.hub import HubClient
from app.ui.workers import WorkerPool


class DownloadController(QObject):
    """Signals: ``results(list[HubModel])``, ``files(list[HubFile])``, ``progress(done, total)`` (total 0 when
    unknown), ``downloaded(path)``, ``failed(exc)`` (``DownloadCancelled`` when cancelled), ``busy_changed``;
    ``searching(bool)`` while a search runs."""

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
        self._raw_progress.connect(self._throttle)

    def search(self, query: str) -> None:
        """Search the Hub on a worker: ``searching(True)``, then ``results`` or ``failed`` (offline: within
        seconds, ``app.catalog.hub.OFFLINE``), then ``searching(False)``."""
        self.searching.emit(True)
        self.pool.run(self.client.search, query, on_return=self.results.emit, on_error=self.failed.emit,
                      on_finish=lambda: self.searching.emit(False))

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
