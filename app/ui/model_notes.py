"""What the chat and the status strip say about loading a model: a failed load (with the model that still
answers), a fallback at start (what was loaded instead, then what failed: one message), and when these notes
go. A note is about a moment: a new load or an unload takes the failed load's line away (it said "X is still
loaded" after X was unloaded), and the start's fallback note leaves the status strip after the next answer
(issue 27 trial, defects 3 and 4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject

from app.catalog import registry


class ModelNotes(QObject):
    """``engine``: the ``EngineController``; ``chat``: the ``ChatController``; ``status``: the ``StatusStrip``;
    ``say(text, error)``: the window's line under the chat."""

    def __init__(self, engine: Any, chat: Any, status: Any, say: Callable[[str, bool], None],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.engine, self.status, self.say = engine, status, say
        self.shown = False  # the line under the chat is a note of this module's
        engine.load_failed.connect(self.load_failed)
        engine.state_changed.connect(self._state)
        chat.finished.connect(lambda _done: status.clear_note())

    def load_failed(self, exc: BaseException) -> None:
        """A load failed: said under the chat with the model that still answers (the status line keeps it)."""
        job = self.engine.job
        still = registry.model_id(job.path) if job else None
        self._say(f"Could not load the model: {exc}" + (f" ({still} is still loaded)" if still else ""))
        self.status.show_model(f"Model: {still} (the last load failed)" if still else f"Load failed: {exc}")

    def startup_done(self, note: str) -> None:
        """The start loaded a model: ``note`` (``StartupLoader.done``), when a fallback, under the chat and
        first in the status strip until the next answer."""
        if note:
            self._say(note)
            self.status.show_note(note)

    def gave_up(self, note: str) -> None:
        """No model could be loaded at start: ``note`` under the chat and in the status strip."""
        self._say(note)
        self.status.show_model(note)

    def _say(self, text: str) -> None:
        self.say(text, True)
        self.shown = bool(text)

    def _state(self, state: str) -> None:
        """Loading another model or unloading: the last failure's line is out of date."""
        if state in ("loading", "idle") and self.shown:
            self._say("")
