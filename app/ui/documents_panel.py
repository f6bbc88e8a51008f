"""The documents panel: drop files or folders to index them (per-file status as each one is handled), remove,
rescan; the checks choose which documents the current conversation uses. When ``app.retrieval`` is not in this
build the panel says so instead of pretending."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QListView, QProgressBar, QPushButton, QVBoxLayout,
                               QWidget)

from app.ui.models import DocumentListModel, IdRole


class DocumentsPanel(QWidget):
    """Emits ``selection_changed(paths or None)`` when the person changes the conversation's documents."""

    selection_changed = Signal(object)

    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.docs = ctx.docs
        self.model = DocumentListModel(self)
        self.setAcceptDrops(True)
        self._build()
        if not self.docs.available:
            self._unavailable()
            return
        self.docs.busy_changed.connect(self._busy)
        self.docs.progress.connect(self._progress)
        self.docs.file_done.connect(self.model.update_status)
        self.docs.report.connect(lambda _r: self.refresh())
        self.docs.failed.connect(lambda exc: self.state.setText(f"Indexing failed: {exc}"))
        self.model.selection_changed.connect(lambda: self.selection_changed.emit(self.model.selected_paths()))

    def _build(self) -> None:
        lay = QVBoxLayout(self)
        self.notice = QLabel(wordWrap=True)
        self.hint = QLabel("Drop files or folders here. Checked documents are used to answer in this chat.",
                           wordWrap=True)
        self.view = QListView()
        self.view.setModel(self.model)
        self.bar = QProgressBar(visible=False)
        self.state = QLabel(wordWrap=True)
        row = QHBoxLayout()
        self.add_btn, self.folder_btn = QPushButton("Add files…"), QPushButton("Add folder…")
        self.remove_btn, self.rescan_btn = QPushButton("Remove"), QPushButton("Rescan")
        self.add_btn.clicked.connect(self._add_files)
        self.folder_btn.clicked.connect(self._add_folder)
        self.remove_btn.clicked.connect(self._remove)
        self.rescan_btn.clicked.connect(self.docs.rescan)
        for b in (self.add_btn, self.folder_btn, self.remove_btn, self.rescan_btn):
            row.addWidget(b)
        for w in (self.notice, self.hint, self.view, self.bar, self.state):
            lay.addWidget(w)
        lay.addLayout(row)

    def _unavailable(self) -> None:
        self.notice.setText("<b>Document search is not available in this build</b> (app.retrieval is missing).")
        for w in (self.add_btn, self.folder_btn, self.remove_btn, self.rescan_btn, self.view):
            w.setEnabled(False)
        self.setAcceptDrops(False)

    def refresh(self) -> None:
        if not self.docs.available:
            return
        self.model.set_documents(self.docs.documents())
        self.notice.setText(self.docs.search_notice())

    def show_selection(self, paths: list[str] | None) -> None:
        self.model.set_selection(paths)

    def ingest(self, paths: list[str]) -> bool:
        if not paths:
            return False
        self.state.setText(f"Indexing {len(paths)} item(s)…")
        return self.docs.ingest(paths)

    def _busy(self, busy: bool) -> None:
        self.bar.setVisible(busy)
        self.bar.setRange(0, 0)
        for b in (self.add_btn, self.folder_btn, self.rescan_btn):
            b.setEnabled(not busy)
        if not busy:
            self.state.setText("Index up to date.")

    def _progress(self, done: int, total: int) -> None:
        self.bar.setRange(0, max(total, 1))
        self.bar.setValue(done)
        self.state.setText(f"Indexed {done} of {total} file(s)…")

    def _add_files(self) -> None:
        files, _ = QFileDialog.getOpenFileNames(self, "Add documents")
        self.ingest(files)

    def _add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of documents")
        if folder:
            self.ingest([folder])

    def _remove(self) -> None:
        path = self.view.currentIndex().data(IdRole)
        if path:
            self.docs.remove(path)
            self.refresh()

    def dragEnterEvent(self, e: Any) -> None:  # noqa: N802 - Qt API
        if e.mimeData().hasUrls():
            e.acceptProposedAction()

    def dropEvent(self, e: Any) -> None:  # noqa: N802 - Qt API
        self.ingest([u.toLocalFile() for u in e.mimeData().urls() if u.isLocalFile()])
        e.setDropAction(Qt.DropAction.CopyAction)
        e.accept()
