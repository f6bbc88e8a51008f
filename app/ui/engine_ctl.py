"""``EngineController``: the one owner of the chat ``Engine`` in the desktop app.

Loading is two steps, both on a worker: ``inspect_model`` first (a bad file fails here with its specific
``ModelLoadError`` and the model already loaded stays loaded, so chat goes on), then the old engine is closed
and the new one loaded. If llama.cpp itself refuses a file that passed inspection, the previous model is
loaded again. ``abort_load()`` during a load kills the engine child (``Engine.close()``), which frees its
memory at once. The HTTP port asks ``current()`` per request, so it always uses whatever is loaded.
``connect_remote`` makes a ``RemoteEngine`` on a running Hearth service the engine instead (no model is loaded
in the window's process then).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QObject, Signal

from app import backends
from app.backends import BackendPlan
from app.protocol.backend import Backend
from app.settings import UserSettings
from app.ui.workers import WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadJob:
    """What to load: a local model's ``plan`` (``app.backends.BackendPlan``: the file, its load settings, the
    model's engine options and the prefix-cache options; ``job_for`` makes it from the settings), or a remote."""

    path: str
    plan: BackendPlan | None = None
    remote: str = ""  # an OpenAI base URL: a RemoteEngine named ``path`` (the Hearth service), nothing loaded here
    remote_model: str | None = None
    api_key: str | None = field(default=None, repr=False)


class EngineController(QObject):
    """Signals: ``state_changed(state)`` with idle / loading / ready / failed (``loading``: the job being
    loaded while the state is loading); ``loaded(info)``; ``load_failed(exc)``; ``unloaded()``;
    ``about_to_change()`` before the engine goes away (stop chat)."""

    state_changed = Signal(str)
    loaded = Signal(dict)
    load_failed = Signal(object)
    unloaded = Signal()
    about_to_change = Signal()

    def __init__(self, pool: WorkerPool, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool = pool
        self.engine: Optional[Backend] = None
        self.job: LoadJob | None = None  # the job of ``engine``
        self.loading: LoadJob | None = None  # the job being loaded now
        self.state = "idle"
        self._pending: Any = None  # the engine being loaded
        self._aborted = False

    def current(self) -> Any:
        """The loaded engine, or None (thread-safe read for the HTTP port)."""
        return self.engine

    def _set_state(self, state: str) -> None:
        self.state = state
        self.state_changed.emit(state)

    # -- load ---------------------------------------------------------------------------------------------
    def load(self, job: LoadJob) -> None:
        """Inspect, then (if the file is usable) replace the loaded model by ``job``'s."""
        if self.state == "loading":
            return
        self._aborted = False
        self.loading = job
        self._set_state("loading")
        if job.remote:
            self._swap(job)
            return
        self.pool.run(_inspect, job.path, on_return=lambda _info: self._swap(job), on_error=self._failed)

    def connect_remote(self, name: str, url: str, model: str | None = None, api_key: str | None = None) -> None:
        """Use the OpenAI-compatible server at ``url`` (the Hearth service) as the engine, instead of loading a
        model in this process (``app.engine.remote.engine.RemoteEngine``; its ``load`` only asks ``/v1/models``)."""
        self.load(LoadJob(name, remote=url, remote_model=model, api_key=api_key))

    def _swap(self, job: LoadJob) -> None:
        self.about_to_change.emit()
        old, previous = self.engine, self.job
        self.engine = None
        self.unloaded.emit()
        self.pool.run(self._close_then_load, old, job, on_return=lambda info: self._ready(job, info),
                      on_error=lambda exc: self._failed(exc, previous if not self._aborted else None))

    def _close_then_load(self, old: Any, job: LoadJob) -> dict:
        """On the worker: close the old engine, then create and load the new one (``_pending`` while it loads,
        so that ``abort_load`` can kill it)."""
        from app.errors import Cancelled

        if old is not None:
            old.close()
        if job.plan is not None:  # a model file, or a remote engine of the settings
            self._pending = backends.build(job.plan)
        elif job.remote:  # the Hearth service found on the settings' port
            from app.engine.remote.engine import RemoteEngine

            self._pending = RemoteEngine(job.path, job.remote, model=job.remote_model, api_key=job.api_key)
        else:
            raise ValueError(f"LoadJob({job.path!r}) has no plan; make it with engine_ctl.job_for")
        if self._aborted:
            raise Cancelled("the load was aborted")
        return self._pending.load()

    def _ready(self, job: LoadJob, info: dict) -> None:
        engine, self._pending, self.loading = self._pending, None, None
        if self._aborted:  # aborted just as it finished
            self.pool.run(engine.close)
            self._set_state("idle")
            return
        self.engine, self.job = engine, job
        self._set_state("ready")
        self.loaded.emit(info)

    def _failed(self, exc: BaseException, previous: LoadJob | None = None) -> None:
        self._pending, self.loading = None, None
        if self._aborted:
            self._set_state("idle")
            return
        self._set_state("failed" if self.engine is None else "ready")
        self.load_failed.emit(exc)
        if previous is not None and self.engine is None:
            log.warning("loading failed (%s); loading the previous model again", exc)
            self.load(previous)

    def abort_load(self) -> None:
        """Stop a load in progress: the engine child is killed and its memory freed."""
        if self.state != "loading":
            return
        self._aborted = True
        pending = self._pending
        if pending is not None:
            pending.close()  # kills the loading child; the worker's load() then fails and returns

    # -- unload / reload ----------------------------------------------------------------------------------
    def unload(self) -> None:
        if self.engine is None:
            return
        self.about_to_change.emit()
        engine, self.engine, self.job = self.engine, None, None
        self._set_state("idle")
        self.unloaded.emit()
        self.pool.run(engine.close)

    def shutdown(self) -> None:
        """Close the engine (at exit). Blocks briefly: the window is going away."""
        self.abort_load()
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()


def job_for(settings: UserSettings, path: str, model_id: str | None = None) -> LoadJob:
    """The job that loads the model file at ``path`` as ``settings`` say (``app.backends.plan_file``: the saved
    load settings, the model's ``per_model`` entry incl. ``speculative`` / ``draft_model`` /
    ``thinking_markers``, the prefix cache). Raises ``InvalidRequest`` naming a bad setting."""
    return LoadJob(path, backends.plan_file(settings, path, model_id=model_id))


def remote_job(settings: UserSettings, name: str) -> LoadJob:
    """The job that connects to ``remotes[name]`` of ``settings`` (``app.backends.plan_remote``: its URL, model,
    context, slots and timeouts; the key is read when it connects). Raises ``InvalidRequest`` when there is no
    such remote."""
    plan, remote = backends.plan_remote(settings, name), settings.remotes[name]
    return LoadJob(name, plan, remote=remote.url, remote_model=remote.model)


def _inspect(path: str) -> Any:
    from app.catalog.gguf import inspect_model

    if not Path(path).exists():
        from app.errors import ModelLoadError

        raise ModelLoadError(f"{path}: no such file", path=path)
    return inspect_model(path, require_chat=True)

