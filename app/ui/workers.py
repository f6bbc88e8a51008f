"""Workers: run slow work off the GUI thread and report back through Qt signals (STYLE.md §10).

Function and generator workers on a ``QThreadPool`` emit their signals on the GUI thread; cancellation is
cooperative.

The reasoning: docs/ui.md, 'app/ui/workers.py'.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

log = logging.getLogger(__name__)


class WorkerSignals(QObject):
    """What a worker reports. ``errored`` carries the exception object; ``finished`` always comes last."""

    started = Signal()
    yielded = Signal(object)
    returned = Signal(object)
    errored = Signal(object)
    finished = Signal()


class _Worker(QRunnable):
    def __init__(self) -> None:
        super().__init__()
        self.setAutoDelete(False)  # the pool must not delete it while Python still holds it
        self.signals = WorkerSignals()
        self._quit = threading.Event()

    @property
    def aborted(self) -> bool:
        return self._quit.is_set()

    def quit(self) -> None:
        """Ask the worker to stop at its next chance (any thread)."""
        self._quit.set()

    def run(self) -> None:  # on a pool thread
        self.signals.started.emit()
        try:
            result = self.work()
        except BaseException as exc:  # noqa: BLE001 - every failure goes to the GUI as a signal
            if not isinstance(exc, Exception):
                log.warning("worker stopped by %r", exc)
            self.signals.errored.emit(exc)
        else:
            self.signals.returned.emit(result)
        finally:
            self.signals.finished.emit()

    def work(self) -> Any:
        raise NotImplementedError


class FunctionWorker(_Worker):
    """Runs ``fn(*args, **kwargs)``; its return value is ``returned``."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def work(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


class StoppableWorker(FunctionWorker):
    """Runs ``fn(stop, *args, **kwargs)``: ``stop`` is a ``threading.Event`` that ``quit()`` sets, for a slow
    plain function that checks it itself between steps (an ingest run between documents), so a Cancel button
    and ``WorkerPool.shutdown()`` reach it as they reach a ``GeneratorWorker``."""

    def work(self) -> Any:
        return self.fn(self._quit, *self.args, **self.kwargs)


class GeneratorWorker(_Worker):
    """Iterates ``fn(*args, **kwargs)`` (a generator), emitting each item as ``yielded``; the generator's
    return value is ``returned``. ``quit()`` closes the generator before its next item (its ``finally``
    blocks run on the worker thread)."""

    def __init__(self, fn: Callable[..., Iterator[Any]], *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def work(self) -> Any:
        gen = self.fn(*self.args, **self.kwargs)
        try:
            while True:
                if self.aborted:
                    gen.close()
                    return None
                try:
                    item = next(gen)
                except StopIteration as stop:
                    return stop.value
                self.signals.yielded.emit(item)
        finally:
            gen.close()


class WorkerPool(QObject):
    """A private ``QThreadPool`` plus the workers running on it (kept alive until they finish)."""

    def __init__(self, max_threads: int = 4, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(max_threads)
        self._active: set[_Worker] = set()

    def start(self, worker: _Worker, *, on_yield=None, on_return=None, on_error=None, on_finish=None) -> _Worker:
        """Connect the given slots and start ``worker``; returns it (``quit()`` stops it)."""
        sig = worker.signals
        for signal, slot in ((sig.yielded, on_yield), (sig.returned, on_return), (sig.errored, on_error),
                             (sig.finished, on_finish)):
            if slot is not None:
                signal.connect(slot)
        if on_error is None:
            sig.errored.connect(lambda exc: log.error("worker failed: %r", exc))
        sig.finished.connect(lambda w=worker: self._active.discard(w))
        self._active.add(worker)
        self.pool.start(worker)
        return worker

    def run(self, fn: Callable[..., Any], *args: Any, **slots: Any) -> FunctionWorker:
        return self.start(FunctionWorker(fn, *args), **slots)  # type: ignore[return-value]

    @property
    def active(self) -> int:
        return len(self._active)

    def shutdown(self, timeout_ms: int = 15000) -> bool:
        """Ask every worker to quit and wait for the pool; True when all threads are idle."""
        for w in list(self._active):
            w.quit()
        done = self.pool.waitForDone(timeout_ms)
        if done:  # their queued ``finished`` may not have been delivered yet; none is running
            self._active.clear()
        return done
