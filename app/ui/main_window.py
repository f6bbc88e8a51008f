"""The main window: the navigation rail and its pages (Chats, Documents, Models, Tools, Port, Settings) over the
status strip.

It wires widgets to controllers and keeps the one piece of state the widgets share: which conversation and
branch is shown. Every slow step is a controller call that returns at once; results come back as signals.

The reasoning: docs/ui.md, 'app/ui/main_window.py'.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QMainWindow,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.assistant import Permission
from app.catalog import registry
from app.errors import Cancelled, HearthError
from app.ui import theme
from app.ui.branches import branch_rows, descend, last_answer_stats, sibling_tip, turn_start
from app.ui.chat_documents import ChatDocuments
from app.ui.chats_page import MIN_SIZE, ChatsPage, opening_size
from app.ui.documents_panel import DocumentsPanel
from app.ui.formatting import tools_indicator
from app.ui.labels import scrolled
from app.ui.model_notes import ModelNotes
from app.ui.model_panel import REMOTE, ModelPanel
from app.ui.models import ChatModel, ChatRow
from app.ui.nav_rail import PAGES, NavRail
from app.ui.passage_dialog import PassageDialog
from app.ui.port_panel import PortPanel
from app.ui.presets_dialog import PresetsDialog
from app.ui.service_ctl import ServiceController, service_text
from app.ui.settings_page import SettingsPage
from app.ui.startup import StartupLoader
from app.ui.status_strip import StatusStrip
from app.ui.stream_view import StreamView
from app.ui.tools_page import ToolsPage

log = logging.getLogger(__name__)

SERVICE_NAME = "hearth-service"  # the engine's name when the window chats through the running service

BASE_MODEL_NOTE = ("<b>{name}</b> is a small <i>base</i> model for trying things out: its answers are short and "
                   "often wrong. For real chat, <a href='models'>download an instruction-tuned model</a> "
                   "(recommended for this machine on the Models page).")


class MainWindow(QMainWindow):
    """``autoload``: load the last model at start (tests and benchmarks may load explicitly)."""

    def __init__(self, ctx: Any, autoload: bool = True) -> None:
        super().__init__()
        self.ctx = ctx
        self.conversation_id: str | None = None
        self.pending_effort = ""  # the picker's choice for a chat not stored yet ("": the model's default)
        self.pending_project: str | None = None  # a new chat's project, preset and system prompt until stored
        self.pending_preset: str | None = None
        self.pending_prompt: str | None = None
        self.editing: ChatRow | None = None
        self.chat_model = ChatModel(self)
        self.setWindowTitle("Hearth")
        self.resize(opening_size(self.screen()))
        self.setAcceptDrops(True)
        self._build()
        self._actions()
        self._wire()
        self.sidebar.refresh()
        self.models.refresh()
        self.documents.refresh()
        self.documents.show_selection([])  # the first chat, as every new one, uses no documents until attached
        self.ctx.pool.run(_machine_memory, on_return=lambda mem: self.models.show_recommendations(*mem))
        if ctx.settings.server.enabled:
            ctx.server.apply(ctx.settings.server)
        self._server_notes: dict[str, str] = {}
        ctx.tools.status_changed.connect(self._tools_status)
        if ctx.tools.config_error:
            self._server_notes[""] = f"mcp.json is not used: {ctx.tools.config_error}"
            self._show_notes()
        ctx.tools.config_changed.connect(self._show_tools)
        self._show_tools()
        ctx.tools.start()
        self.service = ServiceController(ctx.pool, lambda: ctx.settings,
                                         lambda: ctx.settings.server.port if ctx.server.running else None, self)
        self.service.status.connect(self._service_status)
        self.service.start()
        self.show_header()
        if autoload:
            self.load_startup_model()

    # -- layout -------------------------------------------------------------------------------------------
    def _build(self) -> None:
        """Rail | pages (Chats, Documents, Models, Tools, Port, Settings) over the status strip. The Chats page
        is the conversation list | the chat | the chat's settings panel."""
        self.rail = NavRail()
        self.chats = ChatsPage(self.ctx.store, self.chat_model)
        c = self.chats
        self.sidebar, self.header, self.chat, self.panel = c.sidebar, c.header, c.chat, c.panel
        self.banner, self.error, self.notice = c.banner, c.error, c.notice
        self.banner.linkActivated.connect(lambda _l: self.show_page("models"))
        self.models, self.documents, self.port = ModelPanel(self.ctx), DocumentsPanel(self.ctx), PortPanel(self.ctx)
        self.tools_page = ToolsPage(self.ctx.tools, self.ctx.settings.tools)
        self.settings_page = SettingsPage(self.ctx.settings, self._local_model_id())
        self.pages = QStackedWidget()
        self.page_of = {"chats": self.chats, "documents": self.documents, "models": self.models,
                        "tools": self.tools_page, "port": self.port, "settings": self.settings_page}
        # pages with their own scrolling parts and a button bar that must stay in view go in as they are
        self.stacked = {name: w if name in ("chats", "tools", "settings") else scrolled(w)
                        for name, w in self.page_of.items()}
        for w in self.stacked.values():
            self.pages.addWidget(w)
        self.status = StatusStrip()
        body = QWidget()
        grid = QVBoxLayout(body)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(0)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(self.rail)
        row.addWidget(self.pages, 1)
        grid.addLayout(row, 1)
        grid.addWidget(self.status)
        self.setCentralWidget(body)
        self.setMinimumSize(MIN_SIZE)

    def _actions(self) -> None:
        """Shortcuts (listed in the help sheet, F1): each one is a window action."""
        for text, key, slot in (("New chat", "Ctrl+N", self.new_chat),
                                ("Search chats", "Ctrl+F", self.search_chats),
                                ("Presets…", "Ctrl+Shift+P", self.open_presets),
                                ("Settings", "Ctrl+,", self.open_settings),
                                ("Show or hide the chat list", "Ctrl+Shift+L", self.toggle_list),
                                ("Show or hide this chat's settings panel", "Ctrl+Shift+S", self.toggle_panel),
                                ("Keyboard shortcuts", "F1", self.show_shortcuts)):
            act = QAction(text, self, shortcut=QKeySequence(key))
            act.triggered.connect(slot)
            self.addAction(act)
        for i, (name, _glyph, title) in enumerate(PAGES, start=1):
            act = QAction(f"{title} page", self, shortcut=QKeySequence(f"Ctrl+{i}"))
            act.triggered.connect(lambda _c=False, n=name: self.show_page(n))
            self.addAction(act)
        self.esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.escape)

    def show_shortcuts(self) -> None:
        """The help sheet: every shortcut, in a dialog."""
        from app.ui.shortcuts_dialog import ShortcutsDialog, window_shortcuts

        ShortcutsDialog(window_shortcuts(self.actions()), self).open()

    # -- pages ----------------------------------------------------------------------------------------------
    def show_page(self, name: str) -> None:
        """Show page ``name`` (``nav_rail.PAGES``); the Settings and Tools pages show what is in force."""
        if name == "settings":
            self.settings_page.show_for(self.ctx.settings, self._local_model_id())
        elif name == "tools":
            self.tools_page.refresh(self.ctx.settings.tools)
        elif name == "chats" and self.current_page() == "chats" and self.chats.mode != "wide":
            self.chats.toggle_list()  # a second press of Chats on a narrower window shows or hides the list
        self.rail.set_current(name)
        self.pages.setCurrentWidget(self.stacked[name])

    def current_page(self) -> str:
        """The name of the page shown."""
        return self.rail.current()

    def search_chats(self) -> None:
        """Ctrl+F: the Chats page with its list shown and the search box focused."""
        self.show_page("chats")
        self.chats.show_side("list", True)
        self.sidebar.focus_search()

    def toggle_list(self) -> None:
        """Ctrl+Shift+L: show or hide the conversation list."""
        if self.current_page() != "chats":
            self.show_page("chats")
        self.chats.toggle_list()

    def toggle_panel(self) -> None:
        """Ctrl+Shift+S: show or hide the chat's settings panel."""
        if self.current_page() != "chats":
            self.show_page("chats")
        self.chats.show_side("panel", not self.chats.open[self.chats.mode]["panel"])

    def resizeEvent(self, e: Any) -> None:  # noqa: N802 - Qt API
        """Collapse instead of clipping (``chats_page``): the rail shows glyphs below the compact width."""
        super().resizeEvent(e)
        self.rail.set_compact(self.chats.fit(e.size().width()) != "wide")

    def _wire(self) -> None:
        chat, eng = self.ctx.chat, self.ctx.engine
        self.chat.send.connect(self.send)
        self.chat.stop.connect(chat.stop)
        self.chat.stop_thinking.connect(self.stop_thinking)
        self.chat.effort_changed.connect(self.set_effort)
        self.chat.samples_changed.connect(lambda n: setattr(chat, "samples", n))
        self.chat.message_action.connect(self.message_action)
        self.sidebar.new_chat.connect(self.new_chat)
        self.sidebar.new_chat_in.connect(self.new_chat_in)
        self.sidebar.project_changed.connect(lambda _pid: self.show_header())
        self.sidebar.project_documents.connect(self.project_documents)
        self.panel.preset_chosen.connect(self.choose_preset)
        self.panel.system_prompt_saved.connect(self.save_system_prompt)
        self.panel.open_page.connect(self.show_page)
        self.header.set_models(self.models.model)
        self.header.model_chosen.connect(self.choose_model)
        self.models.model.modelReset.connect(self._show_picker)
        self.rail.page_chosen.connect(self.show_page)
        self.settings_page.applied.connect(self._settings_applied)
        self.settings_page.theme_chosen.connect(self.apply_theme)
        self.tools_page.saved.connect(self._tools_saved)
        self.status.connect_service.connect(self.connect_service)
        self.sidebar.selected.connect(self.open_conversation)
        self.sidebar.deleted.connect(lambda cid: cid == self.conversation_id and self.new_chat())
        chat.busy_changed.connect(self.chat.set_busy)
        self.stream = StreamView(self.chat_model, self.chat)
        self.chat_docs = ChatDocuments(self.ctx, self.documents, (self.header, self.panel),
                                       lambda: self.conversation_id, self._say)
        chat.delta.connect(self.stream.delta)
        chat.reasoning.connect(self.stream.reasoning)
        chat.tool_call.connect(self.stream.tool_call)
        chat.tool_result.connect(self.stream.tool_result)
        chat.tool_notice.connect(lambda text: self._say(text, False))
        chat.evidence.connect(self.stream.evidence)
        chat.finished.connect(self._turn_finished)
        chat.failed.connect(self._turn_failed)
        eng.state_changed.connect(self._engine_state)
        eng.loaded.connect(self._engine_loaded)
        self.notes = ModelNotes(eng, chat, self.status, self._say, self)

    # -- model --------------------------------------------------------------------------------------------
    def load_startup_model(self) -> None:
        """The saved model, else the last one that worked, else the bundled one (``app.ui.startup``); the
        status line says when a fallback was loaded, or that none could be."""
        self.startup = StartupLoader(self.ctx, self)
        self.startup.done.connect(self.notes.startup_done)
        self.startup.gave_up.connect(self.notes.gave_up)
        self.startup.start()

    def _engine_state(self, state: str) -> None:
        job = self.ctx.engine.job
        text = {"loading": "Loading model… (Esc aborts)", "idle": "No model loaded",
                "failed": "No model loaded (the last load failed)"}.get(state)
        if text:
            self.status.show_model(text)
        if state in ("idle", "failed"):
            self.status.set_n_ctx(None)
        self.chat.send_btn.setEnabled(state == "ready" and not self.ctx.chat.busy)
        if state == "ready" and job:
            self.status.show_model(f"Model: {registry.model_id(job.path)}")
        self._show_picker()

    def _engine_loaded(self, info: dict) -> None:
        name = registry.model_id(str(info.get("model_path") or info.get("model") or ""))
        self.status.show_model(f"Model: {name} · n_ctx {info.get('n_ctx')} · {info.get('n_parallel') or 1} "
                               f"parallel · template {info.get('template')} · "
                               f"loaded in {info.get('load_s', 0):.1f} s")
        self.banner.setText(BASE_MODEL_NOTE.format(name=name))
        self.banner.setVisible(name == registry.BUNDLED_MODEL_ID or info.get("template") == "transcript")
        self.models.model.set_loaded(info.get("model_path"))
        self.status.set_n_ctx(int(info.get("n_ctx") or 0) or None)
        self.chat.send_btn.setEnabled(not self.ctx.chat.busy)
        self._show_picker()

    def choose_model(self, row: int) -> None:
        """The header's model picker: load the model of the Models page's row ``row``."""
        self.models.view.setCurrentIndex(self.models.model.index(row))
        self.models.load_selected()
        self._show_picker()

    def _show_picker(self) -> None:
        """The picker shows the model in use (none: empty)."""
        job = self.ctx.engine.job
        path = (REMOTE + job.path if job.remote else job.path) if job else None
        self.header.show_model(self.models.model.row_of_path(path) if path else -1)

    def _local_model_id(self) -> str | None:
        """The id of the model loaded in this window (None: none, or a remote engine)."""
        job = self.ctx.engine.job
        return registry.model_id(job.path) if job and not job.remote else None

    def open_settings(self) -> None:
        """The Settings page (Ctrl+,)."""
        self.show_page("settings")

    def _settings_applied(self, new: Any, reload: bool) -> None:
        """The Settings page's ``applied``: save; with ``reload``, reload the model when its plan changed."""
        if reload:
            self.apply_settings(new, self._local_model_id())
        else:
            self.ctx.save_settings(new)
        self.show_header()

    def _tools_saved(self, cfg: Any, limits: Any) -> None:
        """The Tools page's ``saved``: write mcp.json (when it changed) and save the tool-call limits."""
        if cfg is not None:
            self.apply_mcp(cfg)
        if limits != self.ctx.settings.tools:
            self.ctx.save_settings(replace(self.ctx.settings, tools=limits))

    def apply_theme(self, mode: str) -> None:
        """Save and show theme ``mode`` (system / light / dark)."""
        from app.ui.prefs import load_prefs, save_prefs

        saved = load_prefs()
        if mode != saved.theme:
            try:
                save_prefs(replace(saved, theme=mode))
            except OSError as exc:
                log.warning("cannot save ui.json: %s", exc)
        theme.manager().set_mode(mode)

    def open_presets(self) -> None:
        dlg = PresetsDialog(self.ctx.store, self)
        dlg.exec()
        self.show_header()

    # -- presets, projects, the system prompt -------------------------------------------------------------
    def show_header(self) -> None:
        """The chat bar: title, project, the preset in force and the system prompt of the next turn."""
        store, cid = self.ctx.store, self.conversation_id
        setup = store.setup(cid, self.pending_project)
        if cid is None and (self.pending_preset or self.pending_prompt is not None):
            preset = store._maybe(store.preset, self.pending_preset)
            own = self.pending_prompt
            setup = replace(setup, preset=preset or setup.preset, preset_source="chat" if preset else
                            setup.preset_source, own_system_prompt=own is not None,
                            system_prompt=own if own is not None else (preset.system_prompt if preset else
                                                                       setup.system_prompt))
        title = store.get_conversation(cid).title if cid else ""
        self.header.show_chat(title, setup.project.name if setup.project else None)
        self.panel.show_setup(setup, store.presets(), self.ctx.settings.system_prompt)
        self.chat_docs.show(self.documents.model.selected_paths())

    def choose_preset(self, preset_id: str) -> None:
        """The header's picker: the chat's own preset ("" follows its project / the defaults); a preset that
        names a model loads it when another one is loaded."""
        if self.conversation_id is None:
            self.pending_preset = preset_id or None
        else:
            self.ctx.store.set_conversation_preset(self.conversation_id, preset_id or None)
        self.show_header()
        preset = self.ctx.store.setup(self.conversation_id, self.pending_project).preset
        if self.conversation_id is None and self.pending_preset:
            preset = self.ctx.store.preset(self.pending_preset)
        if preset is not None and preset.model:
            self._load_preset_model(preset.model)

    def _load_preset_model(self, model: str) -> None:
        job = self.ctx.engine.job
        try:
            path = registry.resolve_model(model)
        except Exception as exc:  # noqa: BLE001 - a preset naming a missing model must not break the chat
            self.error.setText(f"The preset's model {model!r} cannot be found: {exc}")
            self.error.setVisible(True)
            return
        if job is None or registry.model_id(job.path) != registry.model_id(path):
            self.ctx.load_model(str(path), registry.model_id(path))

    def save_system_prompt(self, text: str | None) -> None:
        """The header's editor: the chat's own system prompt (None: the preset's / the default again)."""
        if self.conversation_id is None:
            self.pending_prompt = text
        else:
            self.ctx.store.set_conversation_system_prompt(self.conversation_id, text)
        self.show_header()

    def new_chat_in(self, project_id: str) -> None:
        """A new chat in a project: its preset and documents are the project's."""
        self.new_chat()
        self.pending_project = project_id
        docs = self.ctx.store.project(project_id).documents  # None: none chosen for the project yet
        self.documents.show_selection(docs if docs is not None else [])  # nothing attached by default
        self.show_header()

    def project_documents(self, project_id: str) -> None:
        """The documents checked in the Documents panel become the project's (its new chats start with them)."""
        self.ctx.store.update_project(project_id, documents=self.documents.model.selected_paths())

    # -- the service ----------------------------------------------------------------------------------------
    def _service_status(self, health: Any) -> None:
        job = self.ctx.engine.job
        connected = job is not None and bool(job.remote)
        self.status.show_service(service_text(health, self.service.port, connected))

    def connect_service(self) -> None:
        """Chat through the running Hearth service instead of a model loaded in the window."""
        health = self.service.health or {}
        self.ctx.engine.connect_remote(SERVICE_NAME, self.service.url(), model=health.get("model"),
                                       api_key=self.ctx.settings.server.api_key)

    def apply_mcp(self, cfg: Any) -> None:
        """Save ``cfg`` as mcp.json and run it (servers restart in the background)."""
        try:
            self.ctx.tools.apply(cfg)
        except OSError as exc:
            self.error.setText(f"Cannot save mcp.json: {exc}")
            self.error.setVisible(True)
            return
        self._server_notes = {k: v for k, v in self._server_notes.items() if k in cfg.names()}
        self._show_notes()

    def apply_settings(self, new: Any, model_id: str | None) -> None:
        """Save ``new``; reload the model when what it is built from changed (load settings, the model's engine
        options, the cache options: ``app.backends.BackendPlan``)."""
        self.ctx.save_settings(new)
        job = self.ctx.engine.job
        if job is not None and not job.remote:
            fresh = self.ctx.job_for(job.path, model_id or "")
            if fresh.plan != job.plan:
                self.ctx.engine.load(fresh)

    # -- conversations ------------------------------------------------------------------------------------
    def new_chat(self) -> None:
        self.conversation_id = None
        self.pending_project = self.pending_preset = self.pending_prompt = None
        self.set_editing(None)
        self.chat_model.set_rows([])
        self.status.show_answer({}, {})
        self.pending_effort = ""
        self.chat.show_effort(None)
        self.sidebar.select(None)
        self.documents.show_selection([])  # a new chat uses no documents until some are attached
        self.show_header()
        self.chat.composer.setFocus()

    def open_conversation(self, cid: str, message_id: str = "") -> None:
        if self.ctx.chat.busy:
            return
        self.conversation_id = cid
        self.set_editing(None)
        tip = descend(self.ctx.store, message_id) if message_id else None
        self.show_branch(tip)
        if message_id:  # opened from a search hit: show the match, once the rows have their sizes
            query = self.sidebar.search.text().strip()
            QTimer.singleShot(0, lambda: self.chat.show_match(message_id, query))
        self.documents.show_selection(self.ctx.conversation_documents(cid))
        rs = self.ctx.store.reasoning_settings(cid)
        self.chat.show_effort(rs.effort, rs.budget_tokens)
        self.show_header()

    def set_effort(self, value: str) -> None:
        """The picker: ``value`` none / low / medium / high, or "" for the model's default, stored as this
        conversation's reasoning setting (a deadline it had stays; an explicit token budget item is kept)."""
        if value.startswith("tokens:"):
            return
        if self.conversation_id is None:
            self.pending_effort = value
            return
        old = self.ctx.store.reasoning_settings(self.conversation_id)
        self.ctx.store.set_reasoning_settings(self.conversation_id, {"reasoning_effort": value or None,
                                                                     "reasoning_deadline_s": old.deadline_s})

    def show_branch(self, tip: str | None = None) -> None:
        if self.conversation_id is None:
            return
        if tip is not None:
            self.ctx.store.set_current(self.conversation_id, tip)
        rows = branch_rows(self.ctx.store, self.conversation_id, tip)
        self.chat_model.set_rows(rows)
        self.status.show_answer(*last_answer_stats(rows, self.ctx.store))

    # -- a turn -------------------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        if self.ctx.engine.current() is None or self.ctx.chat.busy:
            return
        if self.conversation_id is None:
            self.conversation_id = self.ctx.create_conversation(self.pending_project, self.pending_preset,
                                                                self.pending_prompt)
            self.pending_project = self.pending_preset = self.pending_prompt = None
            self.chat_docs.chosen(self.documents.model.selected_paths())
            self.set_effort(self.pending_effort)
        edit, parent = self.editing, None
        if edit is not None:
            parent = edit.parent_id
            rows = self.chat_model.items()
            self.chat_model.set_rows(rows[:rows.index(edit)] if edit in rows else rows)
        self.set_editing(None)
        self.chat.composer.clear()
        self.error.setVisible(False)
        self._show_notes()
        self.chat_model.append(ChatRow(None, "user", text))
        self.chat_model.append(ChatRow(None, "assistant", "", streaming=True))
        self.ctx.chat.send(self.conversation_id, text, parent_id=parent, edit=edit is not None)

    def regenerate(self, row: ChatRow) -> None:
        """A new answer to the person's message that began ``row``'s turn (its tool calls are made again)."""
        if row.parent_id is None or self.conversation_id is None or self.ctx.chat.busy:
            return
        user = turn_start(self.ctx.store, row.parent_id)
        rows = self.chat_model.items()
        start = next((i for i, r in enumerate(rows) if r.id == user), None)
        self.chat_model.set_rows(rows[:start + 1] if start is not None else rows)
        self.chat_model.append(ChatRow(None, "assistant", "", streaming=True))
        self.ctx.chat.regenerate(self.conversation_id, user)

    def stop_thinking(self) -> None:
        """The Stop thinking button: the engine ends the thinking at its next token, the answer follows."""
        self.chat.set_thinking(False)
        if not self.ctx.chat.stop_thinking():
            log.info("stop thinking: the answer had already begun")

    def _say(self, text: str, error: bool) -> None:
        """A line under the chat: an error (red; "" hides it), else a notice ("": the MCP servers' notes again,
        which share the line)."""
        if not error and not text:
            self._show_notes()
            return
        label = self.error if error else self.notice
        label.setText(text)
        label.setVisible(bool(text))

    def answer_tool(self, row: ChatRow, permission: Permission) -> None:
        """The person's answer to the call of ``row`` (its buttons)."""
        if row.call_id is None or row.tool_state != "asking":
            return
        i = self.chat_model.row_of_call(row.call_id)
        if i >= 0:
            self.chat_model.update_row(i, tool_state="running")
        self.ctx.chat.answer(row.call_id, permission)

    def _tools_status(self, status: Any) -> None:
        """A server's ``ServerStatus``: a failure is named under the chat until it runs again; the header's
        tools note follows."""
        if status.state == "failed":
            self._server_notes[status.name] = f"MCP server {status.name!r} failed: {status.error}"
        elif status.state in ("ready", "stopped"):
            self._server_notes.pop(status.name, None)
        self._show_notes()
        self._show_tools()

    def _show_tools(self) -> None:
        """The chat header's note of the tools the model is offered (none configured: hidden)."""
        hub = self.ctx.tools.hub
        note = tools_indicator(hub.tools(), len(hub.config.servers))
        self.header.set_tools(*note)
        self.panel.set_tools(*note)

    def _show_notes(self) -> None:
        text = "\n".join(self._server_notes.values())
        self.notice.setText(text)
        self.notice.setVisible(bool(text))

    def _turn_finished(self, done: Any) -> None:
        """``done``: the turn's ``app.assistant.TurnDone``."""
        self.show_branch()
        result = done.result  # the branch shown again carries each answer's passages (stored in its meta)
        self.status.show_answer(result.metrics, result.context)
        self.sidebar.refresh()
        self.sidebar.select(self.conversation_id)
        self.show_header()

    def _turn_failed(self, exc: BaseException) -> None:
        self.show_branch()
        self.sidebar.refresh()
        self.sidebar.select(self.conversation_id)
        self.show_header()  # a new chat's first turn named it, failed or not: the header and the sidebar agree
        if isinstance(exc, Cancelled):
            return
        text = str(exc) if isinstance(exc, HearthError) else f"unexpected error: {type(exc).__name__}: {exc}"
        self.error.setText(f"The answer failed: {text}")
        self.error.setVisible(True)

    # -- message actions ----------------------------------------------------------------------------------
    def message_action(self, name: str, row: ChatRow) -> None:
        answers = {"allow_once": Permission.ONCE, "allow_always": Permission.ALWAYS, "deny": Permission.DENY}
        if name in answers:
            self.answer_tool(row, answers[name])
        elif name == "edit":
            self.set_editing(row)
        elif name == "regenerate":
            self.regenerate(row)
        elif name in ("prev", "next"):
            tip = sibling_tip(self.ctx.store, row, -1 if name == "prev" else 1)
            if tip is not None and not self.ctx.chat.busy:
                self.show_branch(tip)
        elif name.startswith("cite:"):
            items = row.citations or row.retrieved
            n = int(name.split(":", 1)[1])
            if n < len(items):
                PassageDialog(items[n], self).open()

    def set_editing(self, row: ChatRow | None) -> None:
        self.editing = row
        self.chat.set_editing(row.content if row is not None else None)

    def escape(self) -> None:
        """Esc: cancel an edit, else stop the answer, else abort a model load."""
        if self.editing is not None:
            self.set_editing(None)
            self.chat.composer.clear()
        elif self.ctx.chat.busy:
            self.ctx.chat.stop()
        elif self.ctx.engine.state == "loading":
            self.ctx.engine.abort_load()

    # -- documents ----------------------------------------------------------------------------------------
    def dragEnterEvent(self, e: Any) -> None:  # noqa: N802 - Qt API
        if e.mimeData().hasUrls():
            e.acceptProposedAction()

    def dropEvent(self, e: Any) -> None:  # noqa: N802 - Qt API
        paths = [u.toLocalFile() for u in e.mimeData().urls() if u.isLocalFile()]
        gguf = [p for p in paths if p.lower().endswith(".gguf")]
        if gguf:
            self.models.add_files(gguf)
            self.show_page("models")
        rest = [p for p in paths if p not in gguf]
        if rest:
            if self.current_page() == "chats":
                self.attach_documents(rest)
            self.documents.ingest(rest)
        e.acceptProposedAction()

    def attach_documents(self, paths: list[str]) -> None:
        """Files or folders dropped on the chat join this chat's documents (``ChatDocuments.attach``)."""
        self.chat_docs.attach(paths)

    def closeEvent(self, e: Any) -> None:  # noqa: N802 - Qt API
        self.service.stop()
        self.ctx.close()
        super().closeEvent(e)


def _machine_memory() -> tuple[int | None, int | None]:
    from app.catalog.memory_estimate import available_vram_bytes, detect_available_ram

    return detect_available_ram(), available_vram_bytes()

