"""``ToolsController``: the desktop app's MCP servers (``app.mcp.McpHub``) and the person's answers to calls.

The hub is built from ``mcp.json`` when the window opens and started without waiting (``start(wait=False)``):
servers come up on the hub's own loop thread and report through ``on_status``, which runs there and only
emits ``status_changed``; the queued connection delivers it on the GUI thread. Nothing here blocks the GUI
thread except ``close()`` at exit (each server gets stdin closed, then SIGTERM; bounded by the hub).

The reasoning: docs/ui.md, 'app/ui/tools_ctl.py'.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.assistant import Permission, ToolBox, ToolCallRequested
from app.errors import HearthError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0  # the defaults of app.settings.ToolSettings
CALL_TIMEOUT_S = 60.0
MAX_STEPS = 6


class ToolsController(QObject):
    """Signals: ``status_changed(ServerStatus)`` (GUI thread), ``config_changed()`` after ``apply``.
    ``config_path``: the mcp.json to use (None: the data folder's); ``settings``: the ``ToolSettings`` limits
    (None: the defaults)."""

    status_changed = Signal(object)
    config_changed = Signal()

    def __init__(self, config_path: str | Path | None = None, parent: QObject | None = None,
                 settings: Any = None) -> None:
        super().__init__(parent)
        from app.mcp import McpConfig, McpHub, load_config

        self.config_path = config_path
        self.config_error: str | None = None
        self.start_timeout_s, self.call_timeout_s, self.max_steps = START_TIMEOUT_S, CALL_TIMEOUT_S, MAX_STEPS
        if settings is not None:
            self.use_settings(settings)
        self.tool_choice: Any = None  # None: "auto"; a ToolChoice forces calls until the first results
        try:
            cfg = load_config(config_path)
        except (HearthError, OSError) as exc:
            log.warning("mcp.json not used: %s", exc)
            self.config_error, cfg = str(exc), McpConfig()
        self.hub = McpHub(cfg, on_status=self.status_changed.emit)
        self._lock = threading.Lock()
        self._answers: dict[str, concurrent.futures.Future] = {}
        self._closed = False

    def use_settings(self, settings: Any) -> None:
        """Take the limits of ``settings`` (``app.settings.ToolSettings``, already validated)."""
        self.max_steps = int(settings.max_steps)
        self.call_timeout_s = float(settings.call_timeout_s)
        self.start_timeout_s = float(settings.start_timeout_s)

    # -- servers ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every server not disabled, without waiting (follow ``status_changed``)."""
        if self.hub.config.servers:
            self.hub.start(timeout_s=self.start_timeout_s, wait=False)

    @property
    def config(self) -> Any:
        """The ``McpConfig`` running now."""
        return self.hub.config

    def statuses(self) -> dict[str, Any]:
        """``ServerStatus`` per configured server, in config order."""
        return self.hub.status()

    def apply(self, cfg: Any) -> None:
        """Save ``cfg`` as mcp.json (atomically) and run it: switches apply at once, new or changed servers
        (re)start in the background, removed ones stop, and servers that had failed are started again. Raises
        ``OSError`` when the file cannot be written (then nothing changes)."""
        from app.mcp import save_config

        save_config(self.config_path, cfg)
        self.config_error = None
        self.hub.apply_config(cfg, timeout_s=self.start_timeout_s)
        self.start()  # the hub may never have run (no servers, or a malformed file, at start); retries failures
        self.config_changed.emit()

    def toolbox(self) -> ToolBox | None:
        """The tools for the next turn, or None when no server is configured (the model is offered nothing)."""
        if not self.hub.config.servers:
            return None
        return ToolBox(self.hub, self.ask, max_steps=self.max_steps, call_timeout_s=self.call_timeout_s,
                       tool_choice=self.tool_choice, config_path=self.config_path)

    # -- permission -----------------------------------------------------------------------------------------
    def _future(self, call_id: str) -> concurrent.futures.Future:
        with self._lock:
            fut = self._answers.get(call_id)
            if fut is None:
                fut = self._answers[call_id] = concurrent.futures.Future()
                if self._closed:
                    fut.set_result(Permission.DENY)
            return fut

    def ask(self, request: ToolCallRequested) -> Permission:
        """The ``ToolBox`` permission callback (on the chat worker): wait for ``answer`` for this call."""
        fut = self._future(request.call.id)
        try:
            return fut.result()
        finally:
            with self._lock:
                self._answers.pop(request.call.id, None)

    def answer(self, call_id: str, permission: Permission) -> None:
        """The person's answer to call ``call_id`` (GUI thread)."""
        fut = self._future(call_id)
        if not fut.done():
            fut.set_result(Permission(permission))

    def release_all(self) -> None:
        """Answer every waiting call with deny (Stop: the turn then ends as cancelled)."""
        with self._lock:
            waiting = list(self._answers.values())
        for fut in waiting:
            if not fut.done():
                fut.set_result(Permission.DENY)

    def close(self) -> None:
        """Release waiting calls and stop every server (blocks up to about 10 s; at exit)."""
        with self._lock:
            self._closed = True
        self.release_all()
        self.hub.close()
