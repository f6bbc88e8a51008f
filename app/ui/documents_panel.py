"""The documents panel: drop files or folders to index them, remove, rescan; the checks choose which documents
the current conversation uses. When ``app.retrieval`` is not in this build the panel says so instead of
pretending.

While a run indexes, the panel draws the controller's ``IngestRun`` (``app.retrieval.progress``, where the
text and figures are computed without Qt, the same figures as the CLI's bar): the overall bar (bytes of
finished files) with files and chunks done of total and the embedding rate, the ETA with what it estimates,
one row per file being read or embedded with its own bar, and the run's finished files with their chunks or
reason (failed and skipped files are listed and marked, and stay listed after the run). **Cancel** stops after
the document being written. The document list above is the index itself (``file_done`` per file, reloaded at
the end)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QIcon, QPixmap
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListView,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.ui.labels import ElidedLabel, fit_width
from app.ui.models import DocumentListModel, IdRole

_BAR_STEPS = 1000  # the overall bar's range: its value is the fraction done in thousandths


class FileProgress(QWidget):
    """One file being read (a busy bar: no measure yet) or embedded (chunks embedded of its chunks)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.label = ElidedLabel()
        self.bar = QProgressBar(maximumWidth=120, textVisible=False)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.bar)

    def show_row(self, row: Any) -> None:
        self.label.setText(row.text())
        self.setToolTip(row.path)
        fraction = row.fraction
        if fraction is None:
            self.bar.setRange(0, 0)
        else:
            self.bar.setRange(0, max(row.to_embed, 1))
            self.bar.setValue(row.embedded)


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
        self.docs.run_changed.connect(self.show_run)
        self.docs.file_done.connect(self.model.update_status)
        self.docs.report.connect(lambda _r: self.refresh())
        self.model.selection_changed.connect(lambda: self.selection_changed.emit(self.model.selected_paths()))
        self._add_embedding_box()

    def _add_embedding_box(self) -> None:
        """The embedding model box (``app.ui.embedding_box``) under the list; an interrupted re-embed resumes
        once the window is up."""
        from PySide6.QtCore import QTimer

        from app.ui.embedding_box import EmbeddingBox

        self.embedding = EmbeddingBox(self.ctx)
        self.layout().addWidget(self.embedding)
        self.docs.embedding.switched.connect(self.refresh)
        QTimer.singleShot(0, self.resume_embedding)

    def resume_embedding(self) -> None:
        """Bring the library to the embedding model the settings name (resuming a re-embed left part-way)."""
        from app.retrieval.embed_switch import desired_ref

        self.docs.embedding.resume(desired_ref(getattr(self.ctx, "settings", None)))

    def _build(self) -> None:
        lay = QVBoxLayout(self)
        self.notice = fit_width(QLabel())
        self.hint = QLabel("Drop files or folders here. Checked documents are used to answer in this chat.",
                           wordWrap=True)
        self.view = QListView()
        self.view.setAccessibleName("Documents")
        self.view.setModel(self.model)
        self.bar = QProgressBar(visible=False)
        self.cancel_btn = QPushButton("Cancel", visible=False,
                                      toolTip="Stop after the document being written; the next run goes on")
        self.cancel_btn.setAccessibleName("Cancel indexing")
        self.cancel_btn.clicked.connect(self.docs.cancel)
        self.state = fit_width(QLabel())
        self.eta = fit_width(QLabel(visible=False))
        self.active_box = QWidget()
        self.active_lay = QVBoxLayout(self.active_box)
        self.active_lay.setContentsMargins(0, 0, 0, 0)
        self.active_rows: list[FileProgress] = []
        self.run_list = QListWidget(visible=False, maximumHeight=160)  # this run's finished files
        self.run_list.setAccessibleName("Files indexed in this run")
        side = self.style().pixelMetric(QStyle.PixelMetric.PM_SmallIconSize)
        self.run_list.setIconSize(QSize(side, side))
        self._shown_run: Any = None
        self._shown_paths: list[str] = []
        row = QHBoxLayout()
        self.add_btn, self.folder_btn = QPushButton("Add files…"), QPushButton("Add folder…")
        self.remove_btn, self.rescan_btn = QPushButton("Remove"), QPushButton("Rescan")
        self.add_btn.clicked.connect(self._add_files)
        self.folder_btn.clicked.connect(self._add_folder)
        self.remove_btn.clicked.connect(self._remove)
        self.rescan_btn.clicked.connect(self.docs.rescan)
        for b in (self.add_btn, self.folder_btn, self.remove_btn, self.rescan_btn):
            row.addWidget(b)
        overall = QHBoxLayout()
        overall.addWidget(self.bar, 1)
        overall.addWidget(self.cancel_btn)
        for w in (self.notice, self.hint, self.view):
            lay.addWidget(w)
        lay.addLayout(overall)
        for w in (self.state, self.eta, self.active_box, self.run_list):
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
        return self.docs.ingest(paths)

    def _busy(self, busy: bool) -> None:
        for b in (self.add_btn, self.folder_btn, self.rescan_btn):
            b.setEnabled(not busy)
        self.cancel_btn.setVisible(busy)

    # -- an ingest run (DocumentsController.run_changed, throttled) -----------------------------------------
    def show_run(self, run: Any) -> None:
        f = run.figures
        self.bar.setVisible(not run.done)
        if f is None:
            self.bar.setRange(0, 0)  # scanning: no total yet
        else:
            self.bar.setRange(0, _BAR_STEPS)
            self.bar.setValue(int(f.fraction * _BAR_STEPS))
            self.bar.setFormat(f"{f.percent}%")
        self.state.setText(run.status_text())
        eta = run.eta_text()
        self.eta.setText(eta)
        self.eta.setVisible(bool(eta))
        self.cancel_btn.setEnabled(not run.done and not run.cancelling)
        self._show_active(run.active)
        self._show_listed(run)

    def _show_active(self, rows: list[Any]) -> None:
        while len(self.active_rows) < len(rows):
            self.active_rows.append(FileProgress(self.active_box))
            self.active_lay.addWidget(self.active_rows[-1])
        for i, w in enumerate(self.active_rows):
            if i < len(rows):
                w.show_row(rows[i])
            w.setVisible(i < len(rows))

    def _show_listed(self, run: Any) -> None:
        """Append the files finished since the last draw (the whole list again for a new run or a reorder)."""
        rows = run.listed
        paths = [r.path for r in rows]
        if run is not self._shown_run or paths[:len(self._shown_paths)] != self._shown_paths:
            self.run_list.clear()
            self._shown_run, self._shown_paths = run, []
        warn = self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning)
        blank = QPixmap(self.run_list.iconSize())
        blank.fill(Qt.GlobalColor.transparent)  # keeps the names of the other rows aligned with the marked ones
        for r in rows[len(self._shown_paths):]:
            item = QListWidgetItem(r.text())
            item.setToolTip(r.path + (f"\n{r.reason}" if r.reason else ""))
            item.setData(Qt.ItemDataRole.UserRole, r.state)
            item.setIcon(warn if r.problem else QIcon(blank))
            self.run_list.addItem(item)
        self._shown_paths = paths
        self.run_list.setVisible(bool(rows))
        if rows and not run.done:
            self.run_list.scrollToBottom()

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
