"""The keyboard help sheet (F1): every shortcut of the window, in a table a screen reader reads row by row."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)


def window_shortcuts(actions: list[Any]) -> list[tuple[str, str]]:
    """Every keyboard shortcut of the window as ``(keys, what it does)``: its ``actions`` (``QAction``: the
    pages' Ctrl+1…6 among them) and the chat's own keys."""
    rows = [(a.shortcut().toString(QKeySequence.SequenceFormat.NativeText), a.text()) for a in actions
            if not a.shortcut().isEmpty()]
    rows += [("Enter", "Send the message"),
             ("Shift+Enter", "New line in the message"), ("Esc", "Cancel an edit, stop the answer or a load"),
             ("Tab / Shift+Tab", "Move between controls")]
    return rows


class ShortcutsDialog(QDialog):
    """``rows``: ``(keys, what they do)`` pairs (``MainWindow.shortcuts``)."""

    def __init__(self, rows: list[tuple[str, str]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.table = QTableWidget(len(rows), 2)
        self.table.setAccessibleName("Keyboard shortcuts")
        self.table.setHorizontalHeaderLabels(["Keys", "Does"])
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        for i, (keys, does) in enumerate(rows):
            self.table.setItem(i, 0, QTableWidgetItem(keys))
            self.table.setItem(i, 1, QTableWidgetItem(does))
        self.table.resizeColumnToContents(0)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.table)
        lay.addWidget(buttons)
        self.resize(520, 460)
