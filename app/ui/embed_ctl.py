"""``EmbeddingController``: the embedding model of the documents library for the window: which one search uses,
choosing another, and the re-embed into it on a worker (``app.retrieval.embed_switch``), resumed at start.
docs/retrieval.md, "Embedding models"."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from app.ui.workers import StoppableWorker, WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddingView:
    """What the Documents page shows: ``active`` (the model search uses, a name, or None: keyword search only),
    ``pending`` (the model being re-embedded into, or None), ``progress`` (a ``ReembedProgress`` of the
    running or last re-embed, or None), ``failed`` (the reason the last one failed, or None), ``running``."""

    active: str | None
    pending: str | None = None
    progress: Any = None
    failed: str | None = None
    running: bool = False

    @property
    def fraction(self) -> float | None:
        p = self.progress
        return p.done / p.total if p is not None and p.total else None


class EmbeddingController(QObject):
    """Signals: ``changed(EmbeddingView)`` (after each batch of a re-embed, and when it ends); ``switched()``
    once search uses the new model (the owner then drops its embedder: ``on_switched``)."""

    changed = Signal(object)
    switched = Signal()
    _progress_item = Signal(object)  # from the worker thread: queued to the GUI thread

    def __init__(self, pool: WorkerPool, open_store: Callable[[], Any], on_switched: Callable[[], None],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool, self.open_store, self.on_switched = pool, open_store, on_switched
        self._worker: StoppableWorker | None = None
        self._again = False  # start the (new) pending re-embed once the stopped one has finished
        self._progress: Any = None
        self._progress_item.connect(self._on_progress)

    @property
    def running(self) -> bool:
        return self._worker is not None

    def view(self) -> EmbeddingView:
        """The current ``EmbeddingView`` (reads the store's roles: cheap)."""
        from app.retrieval import embed_switch as sw

        with self.open_store() as store:
            state, active = sw.read_state(store), sw.active_ref(store)
        failed = f"{state.failed[0]}: {state.failed[1]}" if state.failed else None
        return EmbeddingView(active.name if active else None, state.pending.name if state.pending else None,
                             self._progress, failed, self.running)

    def choose(self, path: str, pooling: str | None, save: Callable[[str | None, str | None], None]) -> str:
        """The person chose the file ``path`` (``pooling``: an override or None): validate it
        (``ModelLoadError`` / ``InvalidRequest`` naming the problem, nothing changed), ``save(path or None
        for the default, pooling)`` the setting, record the choice and start the re-embed it needs. Returns
        ``embed_switch.plan``'s action."""
        from app.retrieval import embed_switch as sw

        ref = sw.check_model_file(path, pooling)[0]
        default = sw.default_ref()
        is_default = default is not None and default.model_id == ref.model_id
        save(None if is_default else ref.path, None if is_default else ref.pooling)
        self._again = self.running
        self.stop()
        with self.open_store() as store:
            action = sw.choose(store, ref, default)[0]
        self._progress = None
        if action == sw.ADOPT:
            self.on_switched()
        self._start_if_pending()
        return action

    def resume(self, desired: Any) -> str:
        """At start: bring the library to ``desired`` (a ``ModelRef`` or None, from the settings), resuming or
        starting the re-embed it needs on a worker. Returns the action."""
        from app.retrieval import embed_switch as sw

        with self.open_store() as store:
            action = sw.reconcile(store, desired, sw.default_ref())[0]
        if action == sw.ADOPT:
            self.on_switched()
        self._start_if_pending()
        return action

    def stop(self) -> None:
        """Stop the re-embed after the batch in flight (it resumes at the next ``resume``)."""
        if self._worker is not None:
            self._worker.quit()

    def _start_if_pending(self) -> None:
        from app.retrieval import embed_switch as sw

        with self.open_store() as store:
            pending = sw.read_state(store).pending
        if pending is None or self._worker is not None:
            self.changed.emit(self.view())
            return
        self._worker = self.pool.start(StoppableWorker(self._job, pending), on_return=self._returned,
                                       on_error=self._errored, on_finish=self._finished)
        self.changed.emit(self.view())

    def _job(self, stop: threading.Event, pending: Any) -> Any:
        """On the worker: the re-embed, with its own store and embedding engine."""
        from app.retrieval import embed_switch as sw

        embedder = sw.embedder_for(pending)
        try:
            with self.open_store() as store:
                return sw.reembed(store, embedder, stop, lambda p: self._progress_item.emit(_copy(p)))
        finally:
            embedder.close()

    def _on_progress(self, p: Any) -> None:
        self._progress = p
        self.changed.emit(self.view())

    def _returned(self, p: Any) -> None:
        self._progress = p
        if p.phase == "switched":
            self.on_switched()
            self.switched.emit()

    def _errored(self, exc: BaseException) -> None:
        from app.retrieval.embed_switch import ReembedProgress

        log.warning("re-embedding stopped: %s", exc)
        name = self._progress.model if self._progress is not None else "the new model"
        self._progress = ReembedProgress(name, phase="failed", reason=str(exc) or type(exc).__name__)

    def _finished(self) -> None:
        self._worker = None
        if self._again:
            self._again = False
            self._start_if_pending()
            return
        self.changed.emit(self.view())


def _copy(p: Any) -> Any:
    from dataclasses import replace

    return replace(p)
