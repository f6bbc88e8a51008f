"""``ServerController``: the local OpenAI-compatible port inside the desktop app.

The reasoning: docs/ui.md, 'app/ui/server_ctl.py'.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.settings import ServerSettings
from app.ui.workers import WorkerPool

log = logging.getLogger(__name__)
NOT_COUNTED = frozenset({"/health"})  # endpoints the Port page's request count leaves out (see requests_served)


def server_available() -> bool:
    try:
        from app.server import create_app  # noqa: F401
        from app.server.run import ServerThread  # noqa: F401
    except ImportError:
        return False
    return True


def new_api_key() -> str:
    return "hearth-" + secrets.token_urlsafe(24)


def base_url(s: ServerSettings) -> str:
    host = f"[{s.host}]" if ":" in s.host else s.host
    return f"http://{host}:{s.port}/v1"


def curl_example(s: ServerSettings, model: str = "") -> str:
    auth = f' \\\n  -H "Authorization: Bearer {s.api_key}"' if s.api_key else ""
    body = '{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}]}' % (model or "default")
    return f"curl {base_url(s)}/chat/completions{auth} \\\n  -H 'Content-Type: application/json' \\\n  -d '{body}'"


class ServerController(QObject):
    """Signals: ``running_changed(bool, url)``, ``failed(exc)``."""

    running_changed = Signal(bool, str)
    failed = Signal(object)

    def __init__(self, pool: WorkerPool, engine_provider: Any, *, documents: Any = None, embedder: Any = None,
                 parent: QObject | None = None) -> None:
        """``documents`` / ``embedder``: callables giving the window's ``DocumentSource`` / ``Embedder`` (or
        None), asked when the port starts."""
        super().__init__(parent)
        self.pool, self.provider = pool, engine_provider
        self.documents, self.embedder = documents, embedder
        self.available = server_available()
        self.thread: Any = None
        self.metrics: Any = None
        self._models: Any = None  # the ModelPool of the other models the port serves
        self._busy = False

    @property
    def running(self) -> bool:
        return self.thread is not None

    def requests_served(self) -> tuple[int, int]:
        """(requests answered, requests in flight) since the port started; ``/health`` is not counted: the
        window itself asks it every 5 s (``service_ctl``), and a health check is not a request anyone made."""
        m = self.metrics
        if m is None:
            return 0, 0
        counts = list(m.requests.items())  # one C-level copy: the server thread may add keys meanwhile
        return sum(n for (endpoint, _method, _status), n in counts if endpoint not in NOT_COUNTED), m.in_flight

    def apply(self, s: ServerSettings) -> None:
        """Start, stop or restart so that the port matches ``s``."""
        if not self.available or self._busy:
            return
        self._busy = True
        old, self.thread = self.thread, None
        self.pool.run(self._restart, old, s if s.enabled else None, on_return=self._started,
                      on_error=self._failed)

    def _restart(self, old: Any, s: ServerSettings | None) -> Any:
        if old is not None:
            old.stop()
        self._close_models()
        if s is None:
            return None
        from app.server import create_app
        from app.server.metrics import ServerMetrics
        from app.server.run import ServerThread

        metrics = ServerMetrics()
        docs = self.documents() if self.documents is not None else None
        embedder = self.embedder() if self.embedder is not None else None
        from app.backends import model_pool
        from app.server.app import settings_reasoning_defaults
        from app.settings import load_user_settings

        user = load_user_settings()
        defaults = settings_reasoning_defaults(user)  # each model's thinking default
        # Other installed models (and remote engines) load on demand for the port, within the RAM available
        # now (the window's model is already in it); the window's own model is served by its engine.
        self._models = model_pool(user)
        app = create_app(self.provider, s, pool=self._models, metrics=metrics, documents=docs, embedder=embedder,
                         reasoning_defaults=defaults)
        return ServerThread(app, s.host, s.port).start(), metrics

    def _started(self, started: Any) -> None:
        self._busy = False
        if started is None:
            self.metrics = None
            self.running_changed.emit(False, "")
            return
        self.thread, self.metrics = started
        self.running_changed.emit(True, self.thread.url)

    def _failed(self, exc: BaseException) -> None:
        self._busy = False
        self.running_changed.emit(False, "")
        self.failed.emit(exc)

    def shutdown(self) -> None:
        thread, self.thread = self.thread, None
        if thread is not None:
            thread.stop()
        self._close_models()

    def _close_models(self) -> None:
        """Unload the models the port loaded on demand (their engine processes end)."""
        models, self._models = self._models, None
        if models is not None:
            models.close()
