"""The model manager: installed models (bundled + models folder + dropped files, linked in place), their
metadata and memory estimate before loading, load / unload / abort with progress, the curated models as cards
sized to this machine (``model_cards``), and Hugging Face search (cancellable) + download (progress, cancel,
resume). Listing (which reads every GGUF header) and estimating run on workers.

The page reads at 640 px: labels wrap (``labels.fit_width``), list rows carry their whole text as a tooltip."""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.catalog.files import link_model
from app.catalog.recommended import Recommendation, for_machine, load_catalog
from app.ui import theme
from app.ui.engine_ctl import remote_job
from app.ui.formatting import human_bytes
from app.ui.labels import fit_width
from app.ui.model_cards import RecommendationList
from app.ui.models import ItemRole, ModelListModel

log = logging.getLogger(__name__)
VERDICT_TOKENS = {"fits": "text", "tight": "notice", "won't fit": "error", "unknown": "muted"}  # theme colours


REMOTE = "remote:"  # the path of a remote engine's row (the pool's name for it too: app.engine.pool)


def list_models_job(remotes: dict | None = None) -> list:
    """The installed GGUF files (``registry.list_models``), then one row per remote engine of the settings
    (``remotes``: name → ``RemoteSettings``; docs/remote.md), whose path is ``remote:<name>``."""
    from app.catalog.registry import ModelEntry, list_models

    rows = list_models()
    for name, r in sorted((remotes or {}).items()):
        rows.append(ModelEntry(name, REMOTE + name, 0, architecture="remote", has_chat_template=True,
                               quantization=r.model or None))
    return rows


def remote_html(name: str, r: Any) -> str:
    """The details of a remote engine's row."""
    model = f" (model {_esc(r.model)})" if r.model else ""
    return (f"<b>{_esc(name)}</b> — remote engine at {_esc(r.url)}{model}<br>It runs on that machine: its "
            "memory, its prefix cache. Conversations, documents and citations stay here. TTFT and ITL are "
            "measured at Hearth's side of the connection (docs/remote.md).")


def estimate_job(entry: Any, settings: Any) -> Any:
    """The ``MemoryEstimate`` of ``entry`` under ``settings``, with ``n_parallel`` auto (None) resolved as the
    engine resolves it on load (``choose_parallel``), so the KV of every sequence is counted. Returns
    ``(estimate, n_parallel)``."""
    from app.catalog.memory_estimate import available_vram_bytes, estimate_memory, resolve_parallel

    settings = resolve_parallel(entry.info, settings)
    est = estimate_memory(entry.info, settings, available_vram_bytes=available_vram_bytes())
    return est, settings.n_parallel


def details_html(entry: Any, est: Any = None, n_parallel: int = 1) -> str:
    """Metadata and the memory verdict of one model, as rich text (``n_parallel``: the sequences ``est``
    counts, each with its own n_ctx of KV)."""
    if entry.error:
        return f"<b>{entry.id}</b><br><span style='color:{_colour('error')}'>{_esc(entry.error)}</span>"
    i = entry.info
    kind = "small base model for trying things out" if entry.bundled else (
        "chat (instruction-tuned)" if i.chat_template else "no chat template (base model?)")
    lines = [f"<b>{entry.id}</b> — {kind}",
             f"{i.architecture} · {i.parameter_count / 1e6:,.0f} M parameters · {i.quantization} · "
             f"{human_bytes(i.size_bytes)} · trained context {i.context_length or '?'} tokens"]
    if est is not None:
        colour = _colour(VERDICT_TOKENS.get(est.verdict, "muted"))
        avail = human_bytes(est.available_ram_bytes) if est.available_ram_bytes else "unknown"
        kv = human_bytes(est.kv_bytes) + (f" = {n_parallel} × {human_bytes(est.kv_bytes // n_parallel)}"
                                          if n_parallel > 1 else "")
        lines.append(f"Memory at n_ctx {est.n_ctx}, {n_parallel} parallel request{'s' if n_parallel > 1 else ''}: "
                     f"{human_bytes(est.total_bytes)} (weights {human_bytes(est.weights_bytes)}, KV {kv}, compute "
                     f"{human_bytes(est.compute_bytes)}); available RAM {avail} → "
                     f"<b style='color:{colour}'>{est.verdict}</b>")
    return "<br>".join(lines)


def _colour(token: str) -> str:
    """The theme's colour ``token`` (``theme.Colors``) in the theme shown now: rich text holds 4.5:1 there."""
    return getattr(theme.PALETTES[theme.current()], token)


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class ModelPanel(QWidget):
    """Emits ``status(text)`` for the status strip."""

    status = Signal(str)

    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.model = ModelListModel(self)
        self.estimate: Any = None
        lay = QVBoxLayout(self)
        lay.addWidget(self._installed_box(), 2)
        lay.addWidget(self._recommended_box(), 3)  # room for two or three cards at 800 px high
        lay.addWidget(self._hub_box(), 2)
        self._name_controls()
        self.setAcceptDrops(True)
        self._wire()
        theme.manager().changed.connect(self._restyle)

    # -- building -------------------------------------------------------------------------------------
    def _installed_box(self) -> QGroupBox:
        box = QGroupBox("Installed models (drop a .gguf file here to add it)")
        lay = QVBoxLayout(box)
        self.view = QListView(wordWrap=True)  # a long name wraps: it never scrolls the list sideways (issue 27)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.view.setModel(self.model)
        self.view.selectionModel().currentChanged.connect(lambda cur, _prev: self._selected(cur.row()))
        self.details = QLabel("Select a model to see its details.", wordWrap=True,
                              textFormat=Qt.TextFormat.RichText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.load_bar = QProgressBar(visible=False, textVisible=False, maximumHeight=8)
        self.load_bar.setRange(0, 0)
        self.error = QLabel(wordWrap=True, visible=False, objectName="errorText")
        self.error.setObjectName("modelError")
        row = QHBoxLayout()
        self.add_btn, self.refresh_btn = QPushButton("Add file…"), QPushButton("Refresh")
        self.load_btn, self.unload_btn = QPushButton("Load"), QPushButton("Unload")
        self.abort_btn = QPushButton("Abort", visible=False)
        for b in (self.add_btn, self.refresh_btn, self.load_btn, self.unload_btn, self.abort_btn):
            row.addWidget(b)
        for w in (self.view, self.details, self.load_bar, self.error):
            lay.addWidget(w)
        fit_width(self.details)
        fit_width(self.error)
        lay.addLayout(row)
        return box

    def _recommended_box(self) -> QGroupBox:
        box = QGroupBox("Recommended for this machine")  # a short title: the page must fit a 640-px window
        box.setToolTip("Instruction-tuned chat models: those that fit this machine first, those too large last")
        lay = QVBoxLayout(box)
        self.recommended = RecommendationList()
        self.recommended.setAccessibleName("Recommended models")
        lay.addWidget(self.recommended)
        return box

    def _hub_box(self) -> QGroupBox:
        box = QGroupBox("Hugging Face")
        lay = QVBoxLayout(box)
        row = QHBoxLayout()
        self.query = QLineEdit(placeholderText="Search GGUF models, e.g. qwen3 instruct gguf")
        self.search_btn = QPushButton("Search")
        self.search_cancel_btn = QPushButton("Cancel", visible=False)
        self.search_cancel_btn.setToolTip("Stop waiting for this search")
        row.addWidget(self.query, 1)
        row.addWidget(self.search_btn)
        row.addWidget(self.search_cancel_btn)
        self.results, self.files = QListWidget(), QListWidget()
        lists = QHBoxLayout()
        lists.addWidget(self.results)
        lists.addWidget(self.files)
        prog = QHBoxLayout()
        self.dl_bar = QProgressBar(visible=False)
        self.dl_label = fit_width(QLabel())  # a long error wraps on a line of its own, never widens the window
        self.dl_btn, self.cancel_btn = QPushButton("Download file"), QPushButton("Cancel", visible=False)
        for w in (self.dl_bar, self.dl_btn, self.cancel_btn):
            prog.addWidget(w)
        lay.addLayout(row)
        lay.addLayout(lists)
        lay.addLayout(prog)
        lay.addWidget(self.dl_label)
        return box

    def _name_controls(self) -> None:
        """Accessible names for every control of the page (the cards name their own buttons)."""
        for w, name in ((self.view, "Installed models"), (self.add_btn, "Add a model file"),
                        (self.refresh_btn, "Refresh installed models"), (self.load_btn, "Load the selected model"),
                        (self.unload_btn, "Unload the model"), (self.abort_btn, "Abort loading"),
                        (self.query, "Search Hugging Face"), (self.search_btn, "Search"),
                        (self.search_cancel_btn, "Cancel search"), (self.results, "Repositories found"),
                        (self.files, "GGUF files of the repository"), (self.dl_btn, "Download the selected file"),
                        (self.cancel_btn, "Cancel download"), (self.details, "Model details"),
                        (self.dl_label, "Search and download status")):
            w.setAccessibleName(name)

    def _wire(self) -> None:
        eng, dl = self.ctx.engine, self.ctx.downloads
        self.add_btn.clicked.connect(self._add_dialog)
        self.refresh_btn.clicked.connect(self.refresh)
        self.load_btn.clicked.connect(self.load_selected)
        self.unload_btn.clicked.connect(eng.unload)
        self.abort_btn.clicked.connect(eng.abort_load)
        eng.state_changed.connect(self._engine_state)
        eng.load_failed.connect(self.show_error)
        eng.loaded.connect(self._loaded)
        self.recommended.requested.connect(self._download_recommended)
        self.search_btn.clicked.connect(lambda: dl.search(self.query.text()))
        self.search_cancel_btn.clicked.connect(self._cancel_search)
        self.query.returnPressed.connect(lambda: dl.search(self.query.text()))
        self.results.currentTextChanged.connect(lambda repo: repo and dl.list_files(repo.split("  ")[0]))
        self.dl_btn.clicked.connect(self._download_file)
        self.cancel_btn.clicked.connect(dl.cancel)
        dl.results.connect(self._show_results)
        dl.files.connect(self._show_files)
        dl.progress.connect(self._progress)
        dl.busy_changed.connect(self._download_busy)
        dl.downloaded.connect(self._downloaded)
        dl.failed.connect(lambda exc: self.dl_label.setText(str(exc)))
        dl.searching.connect(self._searching)

    # -- installed models ---------------------------------------------------------------------------------
    def refresh(self) -> None:
        self.ctx.pool.run(list_models_job, dict(getattr(self.ctx.settings, "remotes", {}) or {}),
                          on_return=self._entries)

    def _entries(self, entries: list) -> None:
        self.model.set_entries(entries)
        job = self.ctx.engine.job
        self.model.set_loaded((REMOTE + job.path if job.remote else job.path) if job else None)
        if job is not None and not job.remote and self._listed_missing(job.path, absent=False):
            self.refresh()  # listed before the loaded model's file was written (the bundled one, assembled)

    def _loaded(self, _info: dict) -> None:
        """A model loaded: mark it, and list again if the list has it as not installed, or not at all (on a
        first start the list is built before the bundled model is assembled)."""
        job = self.ctx.engine.job
        self.model.set_loaded(job.path if job else None)
        if job is not None and not job.remote and self._listed_missing(job.path, absent=True):
            self.refresh()

    def _listed_missing(self, path: str, absent: bool) -> bool:
        """Whether the row of ``path`` says "not installed" (or, with ``absent``, there is no row) while the file
        is there."""
        from pathlib import Path

        row = self.model.row_of_path(path)
        entry = self.model.item(row) if row >= 0 else None
        missing = (entry is None and absent) or (entry is not None and not entry.installed)
        return missing and Path(path).exists()

    def _restyle(self, _name: str) -> None:
        """The theme changed: the details are rich text with the theme's colours in them, shown again."""
        self._selected(self.view.currentIndex().row())

    def _selected(self, row: int) -> None:
        entry = self.model.item(row)
        if entry is None:
            return
        remote = self._remote(entry)
        if remote is not None:
            self.details.setText(remote_html(entry.id, remote))
            return
        self.details.setText(details_html(entry))
        if entry.info is not None:
            settings = self.ctx.settings.load_for(entry.id)
            self.ctx.pool.run(estimate_job, entry, settings,
                              on_return=lambda got, e=entry: self._estimated(e, *got))

    def _estimated(self, entry: Any, est: Any, n_parallel: int = 1) -> None:
        if self.model.item(self.view.currentIndex().row()) is entry:
            self.estimate = est
            self.details.setText(details_html(entry, est, n_parallel))

    def select_path(self, path: str) -> None:
        row = self.model.row_of_path(path)
        if row >= 0:
            self.view.setCurrentIndex(self.model.index(row))

    def load_selected(self) -> None:
        entry = self.view.currentIndex().data(ItemRole)
        if entry is None:
            return
        self.error.setVisible(False)
        remote = self._remote(entry)
        if remote is None:
            self.ctx.load_model(entry.path, entry.id)
            return
        from app import secrets
        from app.errors import HearthError

        try:  # read here too, so that a missing key is named before the loaded model goes away
            secrets.api_key_for(entry.id, remote)
        except HearthError as exc:  # the key's variable is unset, the keyring has none: say which
            self.show_error(exc)
            return
        self.ctx.engine.load(remote_job(self.ctx.settings, entry.id))

    def _remote(self, entry: Any) -> Any:
        """The ``RemoteSettings`` of a remote engine's row, else None."""
        if not str(entry.path).startswith(REMOTE):
            return None
        return (getattr(self.ctx.settings, "remotes", {}) or {}).get(entry.id)

    def show_error(self, exc: BaseException) -> None:
        self.error.setText(f"Could not load the model: {exc}")
        self.error.setVisible(True)

    def _engine_state(self, state: str) -> None:
        loading = state == "loading"
        self.load_bar.setVisible(loading)
        self.abort_btn.setVisible(loading)
        self.load_btn.setEnabled(not loading)
        if loading or state in ("idle", "failed"):  # a file listed as missing reads "preparing…" while it loads
            job = self.ctx.engine.loading if loading else None
            self.model.set_preparing(job.path if job is not None and not job.remote else None)
        if state == "idle":
            self.model.set_loaded(None)

    def add_files(self, paths: list[str]) -> list[str]:
        """Link ``.gguf`` files into the models folder; returns the links made. Errors show in the panel."""
        made = []
        for p in paths:
            try:
                made.append(str(link_model(p)))
            except Exception as exc:  # noqa: BLE001 - one line for the person
                self.error.setText(str(exc))
                self.error.setVisible(True)
        self.refresh()
        return made

    def _add_dialog(self) -> None:
        files, _ = QFileDialog.getOpenFileNames(self, "Add GGUF models", "", "GGUF models (*.gguf)")
        if files:
            self.add_files(files)

    def dragEnterEvent(self, e: Any) -> None:  # noqa: N802 - Qt API
        if any(u.toLocalFile().lower().endswith(".gguf") for u in e.mimeData().urls()):
            e.acceptProposedAction()

    def dropEvent(self, e: Any) -> None:  # noqa: N802 - Qt API
        self.add_files([u.toLocalFile() for u in e.mimeData().urls() if u.toLocalFile().lower().endswith(".gguf")])
        e.acceptProposedAction()

    # -- recommendations and downloads ------------------------------------------------------------------
    def show_recommendations(self, ram: int | None, vram: int | None) -> None:
        """One card per curated model judged on this machine (``ram`` available, ``vram`` free, bytes; None:
        unknown / no GPU): those that fit first, those too large last and marked so. Nothing is selected."""
        self.recommended.set_recommendations(for_machine(load_catalog(), ram, vram))
        self.recommended.chain_after(self.abort_btn)  # Tab goes from the installed models' buttons to the cards

    def _download_recommended(self, r: Recommendation) -> None:
        self.ctx.downloads.download(r.repo, r.file)

    def _searching(self, busy: bool) -> None:
        """A search runs: the button says so and waits, Cancel shows (and takes the focus from the search
        field); the results, the reason or "Search cancelled" replace the line."""
        focused = any(w.hasFocus() for w in (self.query, self.search_btn, self.search_cancel_btn))
        self.search_btn.setEnabled(not busy)
        self.query.setEnabled(not busy)
        self.search_btn.setText("Searching…" if busy else "Search")
        self.search_cancel_btn.setVisible(busy)
        if busy:
            self.dl_label.setText("Searching Hugging Face…")
        if focused:
            (self.search_cancel_btn if busy else self.query).setFocus()

    def _cancel_search(self) -> None:
        """Back to idle at once; the search's answer, when it comes, is dropped (``cancel_search``)."""
        if self.ctx.downloads.cancel_search():
            self.dl_label.setText("Search cancelled")

    def _show_results(self, hits: list) -> None:
        self.results.clear()
        self.files.clear()
        for h in hits:
            self.results.addItem(_row(f"{h.repo}  ({h.downloads:,} downloads)"))
        self.dl_label.setText(f"{len(hits)} repositories found." if hits else "No GGUF repositories found.")

    def _show_files(self, files: list) -> None:
        self.files.clear()
        for f in files:
            item = _row(f"{f.path}  {human_bytes(f.size_bytes) if f.size_bytes else ''}")
            item.setData(Qt.ItemDataRole.UserRole, f)
            self.files.addItem(item)

    def _download_file(self) -> None:
        item = self.files.currentItem()
        if item is not None:
            f = item.data(Qt.ItemDataRole.UserRole)
            self.ctx.downloads.download(f.repo, f.path)

    def _progress(self, done: int, total: int) -> None:
        if total:
            self.dl_bar.setRange(0, 1000)
            self.dl_bar.setValue(int(1000 * done / total))
        self.dl_label.setText(f"{human_bytes(done)} / {human_bytes(total) if total else '?'}")

    def _download_busy(self, busy: bool) -> None:
        self.dl_bar.setVisible(busy)
        self.cancel_btn.setVisible(busy)
        self.dl_btn.setEnabled(not busy)
        self.recommended.set_busy(busy, self.ctx.downloads.current)
        if busy and self.ctx.downloads.current:
            self.dl_label.setText(f"Downloading {self.ctx.downloads.current[1]}…")

    def _downloaded(self, path: str) -> None:
        self.dl_label.setText(f"Downloaded {path}")
        self.refresh()


def _row(text: str) -> QListWidgetItem:
    """A list row whose whole text is also its tooltip (a narrow list cuts it)."""
    item = QListWidgetItem(text)
    item.setToolTip(text.strip())
    return item
