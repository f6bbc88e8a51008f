"""A cited passage, with **Open document**: the document opens in the desktop's viewer for its type (at its page,
for viewers that honour ``#page=``). When it cannot be opened (the file was moved or deleted, or no program
handles its type) the dialog says so instead of doing nothing (issue 27)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.ui.formatting import file_name
from app.ui.labels import ElidedLabel, fit_width


def open_document(path: str, page: int | None = None,
                  opener: Callable[[QUrl], bool] = QDesktopServices.openUrl) -> str:
    """Open ``path`` (at ``page``) with the desktop's program for it; returns "" or why it could not be."""
    if not path or not Path(path).is_file():
        return f"Cannot open {file_name(path) or 'the document'}: the file is not there any more ({path})."
    url = QUrl.fromLocalFile(path)
    if page:
        url.setFragment(f"page={page}")
    if not opener(url):
        return f"Cannot open {file_name(path)}: no program on this computer opens this kind of file."
    return ""


class PassageDialog(QDialog):
    """A cited passage (``cite``: its ``path``, ``page``, ``quote`` or ``text``) and the Open document button."""

    def __init__(self, cite: dict, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path, self.page = str(cite.get("path", "")), cite.get("page")
        self.setWindowTitle(file_name(self.path) + (f" — page {self.page}" if self.page else ""))
        lay = QVBoxLayout(self)
        text = QTextBrowser()
        text.setPlainText(str(cite.get("quote") or cite.get("text") or ""))
        self.error = fit_width(QLabel(visible=False, objectName="errorText"))
        lay.addWidget(ElidedLabel(self.path))
        lay.addWidget(text)
        lay.addWidget(self.error)
        row = QHBoxLayout()
        self.open_btn = QPushButton("Open document")
        self.open_btn.clicked.connect(self.open_document)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        row.addWidget(self.open_btn)
        row.addStretch(1)
        row.addWidget(close)
        lay.addLayout(row)
        self.resize(560, 360)

    def open_document(self) -> None:
        """Open the document; an error line says why when it cannot be opened."""
        why = open_document(self.path, self.page)
        self.error.setText(why)
        self.error.setVisible(bool(why))
