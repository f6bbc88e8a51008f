"""The conversation sidebar: new chat, full-text search over what was said, conversations grouped by date.

Search runs 200 ms after the last keystroke (``Store.search``: SQLite FTS5 over original messages, a few
milliseconds, so it stays on the GUI thread); clearing the box shows the conversations again.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QModelIndex, QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import (QInputDialog, QLineEdit, QListView, QMenu, QMessageBox, QPushButton, QVBoxLayout,
                               QWidget)

from app.ui.models import ConversationListModel, IdRole, KindRole, MessageIdRole


class Sidebar(QWidget):
    """Emits ``selected(conversation_id, message_id or "")`` and ``new_chat()``; renames and deletes itself
    through ``store`` and emits ``changed()`` / ``deleted(id)``."""

    selected = Signal(str, str)
    new_chat = Signal()
    deleted = Signal(str)

    def __init__(self, store: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.model = ConversationListModel(self)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.new_btn = QPushButton("+ New chat", toolTip="New chat (Ctrl+N)")
        self.new_btn.clicked.connect(self.new_chat.emit)
        self.search = QLineEdit(placeholderText="Search messages (Ctrl+F)", clearButtonEnabled=True)
        self._debounce = QTimer(self, interval=200, singleShot=True)
        self._debounce.timeout.connect(self.refresh)
        self.search.textChanged.connect(lambda _t: self._debounce.start())
        self.view = QListView()
        self.view.setModel(self.model)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._menu)
        self.view.clicked.connect(self._clicked)
        for w in (self.new_btn, self.search, self.view):
            lay.addWidget(w)

    def refresh(self) -> None:
        query = self.search.text().strip()
        if query:
            self.model.set_hits(query, self.store.search(query, limit=50))
        else:
            self.model.set_conversations(self.store.list_conversations())

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

    def _menu(self, pos: QPoint) -> None:
        index = self.view.indexAt(pos)
        if index.data(KindRole) != "conversation":
            return
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename(index.data(IdRole)))
        menu.addAction("Delete…", lambda: self.delete(index.data(IdRole)))
        menu.exec(self.view.viewport().mapToGlobal(pos))

    def rename(self, cid: str, title: str | None = None) -> None:
        if title is None:
            current = self.store.get_conversation(cid).title
            title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=current)
            if not ok:
                return
        self.store.rename(cid, title.strip())
        self.refresh()

    def delete(self, cid: str, confirm: bool = True) -> None:
        if confirm and QMessageBox.question(self, "Delete chat", "Delete this chat and all its messages? "
                                            "This cannot be undone.") != QMessageBox.StandardButton.Yes:
            return
        self.store.delete(cid)
        self.refresh()
        self.deleted.emit(cid)
