"""The Documents page's embedding model box: the model search uses, a picker (the recommended models with size,
vector size, languages and fit; any GGUF file), the re-embed's progress and a failure's reason. The work is
``EmbeddingController``'s (``app.ui.embed_ctl``); a recommended model not yet on disk is fetched with the
app's download feature (``DownloadController``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

from app.errors import HearthError
from app.ui.labels import ElidedComboBox, fit_width

_FILE = "file"  # the picker's "Choose a file…" entry
_STEPS = 1000
POOLINGS = (("the model's own pooling", None), ("mean pooling", "mean"), ("CLS pooling", "cls"),
            ("last-token pooling", "last"))


class EmbeddingBox(QGroupBox):
    """``ctx``: the ``AppContext`` (``docs.embedding``: the controller; ``downloads``, when there is one;
    ``settings`` and ``save_settings`` for the ``embedding_model`` setting). ``catalog``: the recommended models
    (``app.catalog.embedding_models.for_machine()`` when None)."""

    def __init__(self, ctx: Any, catalog: list | None = None, parent: Any = None) -> None:
        super().__init__("Embedding model", parent)
        self.ctx, self.ctl = ctx, ctx.docs.embedding
        self._wanted: str | None = None  # the file a download started from here will write
        self.downloads = getattr(ctx, "downloads", None)  # none: installed models and files only
        lay = QVBoxLayout(self)
        self.current = fit_width(QLabel())
        self.picker = ElidedComboBox()  # a long entry is cut with "…": it never widens the page (issue 27)
        self.picker.setAccessibleName("Embedding model to use")
        self.pooling = ElidedComboBox(toolTip="How token vectors become one vector; a chat model's GGUF needs one")
        self.pooling.setAccessibleName("Pooling")
        for combo, letters in ((self.picker, 16), (self.pooling, 23)):  # the poolings whole
            combo.setMinimumContentsLength(letters)
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        for text, value in POOLINGS:
            self.pooling.addItem(text, value)
        self.use_btn = QPushButton("Use")
        self.use_btn.clicked.connect(self._use)
        self.picker.currentIndexChanged.connect(self._picked)
        row = QHBoxLayout()
        row.addWidget(self.picker, 1)
        row.addWidget(self.pooling)
        row.addWidget(self.use_btn)
        self.bar = QProgressBar(visible=False, textVisible=False)
        self.status = fit_width(QLabel(wordWrap=True, visible=False))
        lay.addWidget(self.current)
        lay.addLayout(row)
        lay.addWidget(self.bar)
        lay.addWidget(self.status)
        self.set_catalog(catalog)
        self.ctl.changed.connect(self.show_view)
        if self.downloads is not None:
            self.downloads.downloaded.connect(self._downloaded)

    def set_catalog(self, catalog: list | None = None) -> None:
        """Fill the picker: each recommended model's line (installed or to download), then "Choose a file…"."""
        if catalog is None:
            from app.catalog.embedding_models import for_machine

            catalog = for_machine()
        self.picker.blockSignals(True)
        self.picker.clear()
        for m in catalog:
            self.picker.addItem(m.label(), m)
        self.picker.addItem("Choose a GGUF file…", _FILE)
        self.picker.blockSignals(False)
        self._picked()

    def _picked(self) -> None:
        m = self.picker.currentData()
        downloadable = (m is not _FILE and m is not None and m.path is None and not m.bundled
                        and self.downloads is not None)
        self.use_btn.setText("Download" if downloadable else "Use")
        self.use_btn.setEnabled(m is not None and (m is _FILE or m.path is not None or downloadable))

    def show_view(self, v: Any) -> None:
        """Draw an ``EmbeddingView``: the model search uses, a re-embed's progress, a failure's reason."""
        self.current.setText(f"Search uses: <b>{v.active or 'no embedding model (keyword search only)'}</b>")
        p = v.progress
        self.bar.setVisible(v.running)
        if v.running:
            frac = v.fraction
            self.bar.setRange(0, 0 if frac is None else _STEPS)
            self.bar.setValue(int((frac or 0) * _STEPS))
        text = p.text() if p is not None else (f"Re-embedding for {v.pending} is waiting to resume."
                                               if v.pending else "")
        if p is None and v.failed:
            text = f"The last re-embed failed ({v.failed}); search stays on the current model."
        failed = (p is not None and p.phase == "failed") or (p is None and bool(v.failed))
        self.status.setText(("⚠ " if failed else "") + text)
        self.status.setVisible(bool(text))

    def refresh(self) -> None:
        self.show_view(self.ctl.view())

    def _use(self) -> None:
        m = self.picker.currentData()
        if m is _FILE:
            path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF embedding model", "", "GGUF models (*.gguf)")
            if path:
                self.choose(path)
        elif m.path is None:
            self._wanted = m.file
            self.downloads.download(m.repo, m.file)
            self.status.setText(f"Downloading {m.file} ({m.repo}); it is used once it is complete.")
            self.status.setVisible(True)
        else:
            self.choose(m.path)

    def choose(self, path: str) -> bool:
        """Use the file ``path`` with the chosen pooling; a bad file is refused with the reason (a dialog)."""
        try:
            self.ctl.choose(path, self.pooling.currentData(), self._save)
        except HearthError as exc:
            QMessageBox.warning(self, "Not an embedding model", str(exc))
            return False
        return True

    def _save(self, path: str | None, pooling: str | None) -> None:
        from dataclasses import replace

        self.ctx.save_settings(replace(self.ctx.settings, embedding_model=path, embedding_pooling=pooling))

    def _downloaded(self, path: str) -> None:
        if self._wanted is not None and Path(path).name == self._wanted:
            self._wanted = None
            self.set_catalog()
            self.choose(path)
