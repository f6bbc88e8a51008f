"""The conversation sidebar: new chat and new project, full-text search over what was said, projects with their
chats, then the other conversations grouped by date.

A project's header opens a menu: *New chat in project* (it starts with the project's preset and documents),
*Preset* (the project's), *Use the checked documents* (the Documents panel's checks become the project's),
*Rename…*, *Delete project…* (its chats stay, outside any project). A conversation's menu has *Move to
project*.

Search runs 200 ms after the last keystroke (``Store.search``: SQLite FTS5 over original messages, a few
milliseconds, so it stays on the GUI thread); clearing the box shows the conversations again.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QModelIndex, QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.errors import InvalidRequest
from app.ui import theme
from app.ui.models import ConversationListModel, IdRole, KindRole, MessageIdRole, ProjectRole


class Sidebar(QWidget):
    """Emits ``selected(conversation_id, message_id or "")`` and ``new_chat()``; renames and deletes itself
    through ``store`` and emits ``changed()`` / ``deleted(id)``."""

    selected = Signal(str, str)
    new_chat = Signal()
    new_chat_in = Signal(str)  # a project id
    project_changed = Signal(str)  # a project id (renamed, its preset or documents changed, deleted)
    project_documents = Signal(str)  # "use the checked documents" for this project
    deleted = Signal(str)

    def __init__(self, store: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.model = ConversationListModel(self)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(theme.SPACE[1], theme.SPACE[1], theme.SPACE[1], theme.SPACE[1])
        lay.setSpacing(theme.SPACE[1])
        self.new_btn = QPushButton("+ New chat", toolTip="New chat (Ctrl+N)")
        self.new_btn.setObjectName("newChat")
        self.new_btn.setAccessibleName("New chat")
        self.new_btn.clicked.connect(self.new_chat.emit)
        self.new_project_btn = QPushButton("+ New project", toolTip="A folder of chats with its own preset and "
                                                                     "documents")
        self.new_project_btn.setAccessibleName("New project")
        self.new_project_btn.clicked.connect(lambda: self.create_project())
        self.search = QLineEdit(placeholderText="Search messages (Ctrl+F)", clearButtonEnabled=True)
        self.search.setAccessibleName("Search chats")
        self._debounce = QTimer(self, interval=200, singleShot=True)
        self._debounce.timeout.connect(self.refresh)
        self.search.textChanged.connect(lambda _t: self._debounce.start())
        self.view = QListView()
        self.view.setAccessibleName("Chats")
        self.view.setModel(self.model)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._menu)
        self.view.clicked.connect(self._clicked)
        top = QHBoxLayout()
        top.addWidget(self.new_btn, 1)
        top.addWidget(self.new_project_btn)
        lay.addLayout(top)
        for w in (self.search, self.view):
            lay.addWidget(w)

    def refresh(self) -> None:
        query = self.search.text().strip()
        if query:
            self.model.set_hits(query, self.store.search(query, limit=50))
        else:
            self.model.set_conversations(self.store.list_conversations(), projects=self.store.projects())

    def select(self, conversation_id: str | None) -> None:
        row = self.model.row_of(conversation_id) if conversation_id else -1
        if row >= 0:
            self.view.setCurrentIndex(self.model.index(row))
        else:
            self.view.clearSelection()

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _clicked(self, index: QModelIndex) -> None:
        cid = index.data(IdRole)
        if cid:
            self.selected.emit(cid, index.data(MessageIdRole) or "")
        elif index.data(KindRole) == "project":
            self._menu(self.view.visualRect(index).bottomLeft())

    def _menu(self, pos: QPoint) -> None:
        index = self.view.indexAt(pos)
        kind = index.data(KindRole)
        if kind not in ("conversation", "project"):
            return
        menu = QMenu(self)
        if kind == "project":
            self._project_menu(menu, index.data(ProjectRole))
        else:
            cid = index.data(IdRole)
            menu.addAction("Rename…", lambda: self.rename(cid))
            move = menu.addMenu("Move to project")
            move.addAction("(no project)", lambda: self.move_to(cid, None))
            for p in self.store.projects():
                move.addAction(p.name, lambda pid=p.id: self.move_to(cid, pid))
            menu.addAction("Delete…", lambda: self.delete(cid))
        menu.exec(self.view.viewport().mapToGlobal(pos))

    def _project_menu(self, menu: QMenu, pid: str) -> None:
        menu.addAction("New chat in project", lambda: self.new_chat_in.emit(pid))
        presets = menu.addMenu("Preset")
        current = self.store.project(pid).preset_id
        for name, preset_id in [("(defaults)", None)] + [(p.name, p.id) for p in self.store.presets()]:
            act = presets.addAction(name, lambda x=preset_id: self.set_project_preset(pid, x))
            act.setCheckable(True)
            act.setChecked(preset_id == current)
        menu.addAction("Use the checked documents", lambda: self.project_documents.emit(pid))
        menu.addAction("Rename…", lambda: self.rename_project(pid))
        menu.addAction("Delete project…", lambda: self.delete_project(pid))

    # -- projects -----------------------------------------------------------------------------------------
    def create_project(self, name: str | None = None) -> str | None:
        """Ask for a name (unless given) and create the project; returns its id (None: cancelled or refused)."""
        if name is None:
            name, ok = QInputDialog.getText(self, "New project", "Name:")
            if not ok:
                return None
        try:
            pid = self.store.create_project(name).id
        except InvalidRequest as exc:
            QMessageBox.warning(self, "New project", str(exc))
            return None
        self.refresh()
        return pid

    def move_to(self, cid: str, project_id: str | None) -> None:
        self.store.set_conversation_project(cid, project_id)
        self.refresh()
        self.project_changed.emit(project_id or "")

    def set_project_preset(self, pid: str, preset_id: str | None) -> None:
        self.store.update_project(pid, preset_id=preset_id)
        self.project_changed.emit(pid)

    def rename_project(self, pid: str, name: str | None = None) -> None:
        if name is None:
            name, ok = QInputDialog.getText(self, "Rename project", "Name:", text=self.store.project(pid).name)
            if not ok:
                return
        try:
            self.store.update_project(pid, name=name)
        except InvalidRequest as exc:
            QMessageBox.warning(self, "Rename project", str(exc))
            return
        self.refresh()
        self.project_changed.emit(pid)

    def delete_project(self, pid: str, confirm: bool = True) -> None:
        if confirm and QMessageBox.question(self, "Delete project", "Delete this project? Its chats are kept, "
                                            "outside any project.") != QMessageBox.StandardButton.Yes:
            return
        self.store.delete_project(pid)
        self.refresh()
        self.project_changed.emit(pid)

    def rename(self, cid: str, title: str | None = None) -> bool:
        """Give chat ``cid`` the title ``title`` (None: ask for it). A blank title is refused, the old one
        kept (asked: the dialog says why and asks again). Returns whether the chat was renamed."""
        prompt = "Title:"
        while title is None:
            current = self.store.get_conversation(cid).title
            title, ok = QInputDialog.getText(self, "Rename chat", prompt, text=current)
            if not ok:
                return False
            if not title.strip():
                title, prompt = None, "A title cannot be empty or only spaces. Title:"
        if not title.strip():
            return False
        self.store.rename(cid, title.strip())
        self.refresh()
        return True

    def delete(self, cid: str, confirm: bool = True) -> None:
        if confirm and QMessageBox.question(self, "Delete chat", delete_question(
                self.store.get_conversation(cid).title)) != QMessageBox.StandardButton.Yes:
            return
        self.store.delete(cid)
        self.refresh()
        self.deleted.emit(cid)


def delete_question(title: str | None) -> str:
    """The confirmation asked before deleting a chat, naming it (``title`` cut at 60 characters)."""
    name = (title or "New chat").strip() or "New chat"
    if len(name) > 60:
        name = name[:59] + "…"
    return f"Delete the chat “{name}” and all its messages? This cannot be undone."
