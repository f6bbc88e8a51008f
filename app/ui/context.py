"""``AppContext``: what one window works with — user settings, the conversation store, the worker pool and
the controllers (MCP tools included). Built once per window; ``close()`` stops everything in order (chat,
downloads, ingest, port, engine, the pool, then the MCP servers) so that no worker thread or child process
outlives the window."""

from __future__ import annotations

import logging
from dataclasses import replace

from PySide6.QtCore import QObject

from app.catalog.hub import HubClient
from app.catalog.registry import BUNDLED_MODEL_ID
from app.settings import UserSettings, load_user_settings, save_user_settings
from app.ui.chat_ctl import ChatController
from app.ui.docs_ctl import DocumentsController
from app.ui.download_ctl import DownloadController
from app.ui.engine_ctl import EngineController, LoadJob, job_for
from app.ui.server_ctl import ServerController
from app.ui.tools_ctl import ToolsController
from app.ui.workers import WorkerPool

log = logging.getLogger(__name__)


class AppContext(QObject):
    """``hub``: a ``HubClient`` to use (tests inject one with a fake API)."""

    def __init__(self, hub: HubClient | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        _preload()
        from app.memory.store import Store

        self.settings: UserSettings = load_user_settings()
        self.store = Store()
        self.pool = WorkerPool(max_threads=6, parent=self)
        self.engine = EngineController(self.pool, self)
        self.docs = DocumentsController(self.pool, self)
        self.tools = ToolsController(parent=self, settings=self.settings.tools)
        self.chat = ChatController(self.pool, self.store, self.engine, lambda: self.settings,
                                   documents=self.docs.source, tools=self.tools, parent=self)
        self.server = ServerController(self.pool, self.engine.current, documents=self.docs.source,
                                       embedder=self.docs.embedder, parent=self)
        self.downloads = DownloadController(self.pool, hub, self)
        self.engine.about_to_change.connect(self.chat.stop)
        self._remember: tuple[str, str] | None = None  # the model to save as the startup one once it loads
        self.engine.loaded.connect(self._loaded)
        self.engine.load_failed.connect(self._forget_load)

    # -- settings -----------------------------------------------------------------------------------------
    def save_settings(self, settings: UserSettings) -> None:
        """Persist (atomically) and remember ``settings`` (new tool limits go to the tools controller)."""
        save_user_settings(settings)
        if settings.tools != self.settings.tools:
            self.tools.use_settings(settings.tools)
        self.settings = settings

    def job_for(self, path: str, model_id: str) -> LoadJob:
        """The job loading ``path`` with the current settings and the model's own (``engine_ctl.job_for``)."""
        return job_for(self.settings, path, model_id)

    def load_model(self, path: str, model_id: str, remember: bool = True) -> None:
        """Load the model file ``path``; with ``remember`` it becomes the startup model once it has loaded (a
        file that fails to load is never saved as the startup model)."""
        self._remember = (path, model_id) if remember else None
        self.engine.load(self.job_for(path, model_id))

    def _forget_load(self, _exc: BaseException) -> None:
        self._remember = None

    def _loaded(self, _info: dict) -> None:
        """A model loaded: save it as the startup model when the person chose it, and remember it in ui.json as
        the last model that worked (``app.ui.startup`` falls back to it)."""
        from app.ui.prefs import load_prefs, save_prefs

        job, (remember, self._remember) = self.engine.job, (self._remember, None)
        if job is None or job.remote:
            return
        if remember is not None and remember[0] == job.path:
            self.save_settings(replace(self.settings, model=None if remember[1] == BUNDLED_MODEL_ID else job.path))
        prefs = load_prefs()
        if prefs.last_model != job.path:
            try:
                save_prefs(replace(prefs, last_model=job.path))
            except OSError as exc:
                log.warning("cannot save ui.json: %s", exc)

    # -- the documents chosen for a conversation (turns search only these; None: all) ---------------------
    def conversation_documents(self, conversation_id: str) -> list[str] | None:
        conv = self.store.get_conversation(conversation_id)
        docs = conv.settings.get("documents")
        return None if docs is None else list(docs)

    def set_conversation_documents(self, conversation_id: str, paths: list[str] | None) -> None:
        conv = self.store.get_conversation(conversation_id)
        settings = {k: v for k, v in conv.settings.items() if k != "documents"}
        if paths is not None:
            settings["documents"] = list(paths)
        self.store.update_conversation(conversation_id, settings=settings)

    # -- projects -----------------------------------------------------------------------------------------
    def create_conversation(self, project_id: str | None = None, preset_id: str | None = None,
                            system_prompt: str | None = None) -> str:
        """A new, empty conversation: in ``project_id`` (starting with the project's documents), with its own
        preset and system prompt when given."""
        settings: dict = {}
        if project_id:
            settings["project"] = project_id
            docs = self.store.project(project_id).documents
            if docs is not None:
                settings["documents"] = list(docs)
        if preset_id:
            settings["preset"] = preset_id
        if system_prompt is not None:
            settings["system_prompt"] = system_prompt
        return self.store.create_conversation(model="", settings=settings)

    def close(self) -> None:
        self.chat.stop()
        self.downloads.cancel()
        self.server.shutdown()
        self.engine.shutdown()
        if not self.pool.shutdown(20000):
            log.warning("workers still running at exit")
        self.tools.close()
        self.docs.shutdown()
        self.store.close()


def _preload() -> None:
    """Import the modules workers and slots need now, at start-up: a first import later (tens of ms, holding
    the GIL) would stall the GUI thread in the middle of a model load or the first answer."""
    import app.engine.local.engine  # noqa: F401
    import app.ui.chat_view  # noqa: F401

    try:
        import app.assistant  # noqa: F401  (the turn pipeline, with memory and retrieval)
    except ImportError:  # a build without retrieval: the documents panel says so
        pass
