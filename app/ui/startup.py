"""The model the window loads at start, with fallbacks.

A model is saved as the startup model only after it loaded (``AppContext.load_model``), and every model that
loads is remembered in ``ui.json`` as the last one that worked (``app.ui.prefs``). At start the window tries, in
order: the saved model, the last model that worked, the bundled one; a candidate that cannot be found or fails
to load is skipped for the next, and the status line says which was loaded instead and why (issue 27: one
truncated GGUF left every later start with no model). The model loaded instead becomes the startup model, so
the next start does not fail the same way again (the note says so).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.catalog.registry import BUNDLED_MODEL_ID, model_id, resolve_model
from app.errors import ModelNotFound

log = logging.getLogger(__name__)


def candidates(saved: str | None, last_good: str | None) -> list[str | None]:
    """The models to try at start, in order (None: the bundled one), without repeats."""
    out: list[str | None] = []
    for name in (saved or None, last_good or None, None):
        if name not in out:
            out.append(name)
    return out


def name_of(name: str | None) -> str:
    """How the status line names a candidate (a path by its model id)."""
    return BUNDLED_MODEL_ID if not name else model_id(name) if name.lower().endswith(".gguf") else name


def missing_text(name: str | None, exc: BaseException) -> str:
    """Why a candidate was not tried: its file is gone, it is not installed, or ``exc``. (A model not found
    is not followed by the models found: the Models tab lists them.)"""
    if not isinstance(exc, ModelNotFound):
        return f"not found: {exc}"
    return "its file is gone" if name and (os.sep in name or name.lower().endswith(".gguf")) else "not installed"


class StartupLoader(QObject):
    """Loads the first candidate that works (see the module docstring). ``done(note)`` once a model loaded
    (``note``: "" when it was the first candidate, else what was loaded instead, then what failed);
    ``gave_up(note)`` when none could be loaded. An abort (Esc) ends the fallbacks."""

    done = Signal(str)
    gave_up = Signal(str)

    def __init__(self, ctx: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        from app.ui.prefs import load_prefs

        self.queue = candidates(ctx.settings.model, load_prefs().last_model)
        self.failures: list[tuple[str, str]] = []  # (model, why)
        self.current = ""
        self.active = False
        self._paths: set[str] = set()

    def start(self) -> None:
        """Load the first candidate (the engine's signals drive the rest)."""
        eng = self.ctx.engine
        eng.loaded.connect(self._loaded)
        eng.load_failed.connect(self._failed)
        eng.state_changed.connect(self._state)
        self.active = True
        self._next()

    def _next(self) -> None:
        while self.queue:
            name = self.queue.pop(0)
            try:
                path = str(resolve_model(name))
            except Exception as exc:  # noqa: BLE001 - a missing model must not stop the window from opening
                self.failures.append((name_of(name), missing_text(name, exc)))
                continue
            if path in self._paths:
                continue
            self._paths.add(path)
            self.current = name_of(name)
            self.ctx.engine.load(self.ctx.job_for(path, model_id(path)))
            return
        self._finish()
        self.gave_up.emit(f"No model: {self._failed_text()}; choose one in the Models tab")

    def _failed(self, exc: BaseException) -> None:
        if self.active:
            log.warning("the start model %s did not load (%s); trying the next", self.current, exc)
            self.failures.append((self.current, str(exc)))
            self._next()

    def _loaded(self, _info: dict) -> None:
        if not self.active:
            return
        self._finish()
        if not self.failures:
            self.done.emit("")
            return
        saved = self._save_startup_model()
        self.done.emit(f"Loaded {self.current} instead{' (now the startup model)' if saved else ''}: "
                       f"{self._failed_text()}")

    def _save_startup_model(self) -> bool:
        """Make the model that loaded the startup model (the bundled one: none saved). True when saved."""
        job = self.ctx.engine.job
        if job is None or job.remote:
            return False
        model = None if self.current == BUNDLED_MODEL_ID else job.path
        if self.ctx.settings.model == model:
            return False
        try:
            self.ctx.save_settings(replace(self.ctx.settings, model=model))
        except OSError as exc:
            log.warning("cannot save the startup model: %s", exc)
            return False
        return True

    def _state(self, state: str) -> None:
        if self.active and state == "idle":  # aborted: no fallbacks after an Esc
            self._finish()

    def _failed_text(self) -> str:
        return "; ".join(f"{name} could not be loaded ({why})" for name, why in self.failures)

    def _finish(self) -> None:
        self.active = False
        eng = self.ctx.engine
        eng.loaded.disconnect(self._loaded)
        eng.load_failed.disconnect(self._failed)
        eng.state_changed.disconnect(self._state)
