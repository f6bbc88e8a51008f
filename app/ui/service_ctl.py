"""``ServiceController``: is the Hearth service (``hearth service install``, which runs ``hearth serve`` in the
background) answering on this machine, and can the window use it instead of loading its own engine?

It asks ``GET http://127.0.0.1:<settings.server.port>/health`` on a worker every ``POLL_MS`` (a refused
connection answers in well under a millisecond; a 1 s timeout bounds a hung one) and emits ``status(dict |
None)``: the health body (``status`` ok / no_model, ``model``...) or None when nothing Hearth-like answers.
While the window serves that port itself (the Port panel), the answer is its own and is not reported.

The reasoning: docs/ui.md, 'app/ui/service_ctl.py'.
"""

from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.ui.workers import WorkerPool

POLL_MS = 5000


def probe(host: str, port: int, timeout_s: float = 1.0) -> dict[str, Any] | None:
    """The ``/health`` JSON of a Hearth server at ``host:port`` (a 503 ``no_model`` counts), else None
    (``app.service_unit.probe_health``)."""
    from app.service_unit import probe_health

    return probe_health(host, port, timeout_s)


def service_text(health: dict[str, Any] | None, port: int, connected: bool) -> str:
    """The status strip's words for the service (rich text; "" when none answers)."""
    if health is None:
        return ""
    if connected:
        return f"service :{port} · connected"
    model = f" · {health['model']}" if health.get("model") else " · no model"
    return f"service running on :{port}{model} · <a href='connect'>connect</a>"


class ServiceController(QObject):
    """Polls the service (module docstring). ``own_port()``: the port the window serves now, or None."""

    status = Signal(object)

    def __init__(self, pool: WorkerPool, settings_fn: Callable[[], Any], own_port: Callable[[], int | None],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool, self.settings_fn, self.own_port = pool, settings_fn, own_port
        self.health: dict[str, Any] | None = None
        self._asking = False
        self._timer = QTimer(self, interval=POLL_MS)
        self._timer.timeout.connect(self.poll)

    @property
    def port(self) -> int:
        return int(self.settings_fn().server.port)

    def start(self) -> None:
        """Ask now and every ``POLL_MS``."""
        self.poll()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def poll(self) -> None:
        if self._asking:
            return
        self._asking = True
        port = self.port
        self.pool.run(probe, "127.0.0.1", port, on_return=lambda h: self._answer(h, port),
                      on_finish=self._finished)

    def _finished(self) -> None:
        self._asking = False

    def _answer(self, health: dict[str, Any] | None, port: int) -> None:
        if self.own_port() == port:
            health = None  # the window's own port answered
        self.health = health
        self.status.emit(health)

    def url(self) -> str:
        """The service's OpenAI base URL."""
        return f"http://127.0.0.1:{self.port}/v1"
