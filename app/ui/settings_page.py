"""Settings, as a page of the window (sections: Appearance, Answers, Model loading, Remote engines).

What is safe to change under a loaded model applies at once (the theme, the decoding defaults, the system
prompt: ``applied(settings, False)``); what the model is built from (n_ctx, GPU layers, KV types, flash
attention, threads, batch, parallel requests, the prefix cache) waits for **Apply**, and the page says a
reload is needed (``applied(settings, True)``: the window reloads the model when its plan changed). "For this
model only" stores the load settings as the model's override (``UserSettings.per_model``). Values are validated
by the core's own types (``LoadSettings.validate``, ``DecodingParams.make``) and an error names the field.

The reasoning: docs/ui.md, 'app/ui/settings_page.py'.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractButton,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.errors import HearthError, InvalidRequest
from app.protocol.types import KV_TYPES, MAX_PARALLEL, DecodingParams, LoadSettings
from app.settings import UserSettings
from app.ui.labels import fit_width, scrolled

LIVE_DELAY_MS = 400  # typing in a live field applies after this pause (one save per pause, not per key)


def _spin(lo: int, hi: int, special: str | None = None) -> QSpinBox:
    w = QSpinBox(minimum=lo, maximum=hi)
    if special:
        w.setSpecialValueText(special)
    return w


def _dspin(lo: float, hi: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    return QDoubleSpinBox(minimum=lo, maximum=hi, singleStep=step, decimals=decimals)


def _form(rows: list[tuple[str, QWidget]]) -> tuple[QWidget, QFormLayout]:
    page = QWidget()
    f = QFormLayout(page)
    f.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)  # labels above their fields when narrow
    for label, w in rows:
        f.addRow(label, w)
        if label:
            w.setAccessibleName(label)
    return page, f


class SettingsPage(QWidget):
    """The Settings page. ``applied(UserSettings, bool)``: settings to save (and, with ``True``, to reload
    the model with when its plan changed); ``theme_chosen(str)``: a theme to show and save at once.
    ``new_settings`` / ``new_theme``: what the last ``apply`` gave."""

    applied = Signal(object, bool)
    theme_chosen = Signal(str)

    def __init__(self, settings: UserSettings, model_id: str | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings, self.model_id = settings, model_id
        self.new_settings: UserSettings | None = None
        self.new_theme = ""
        self._showing = False
        self._timer = QTimer(self, singleShot=True, interval=LIVE_DELAY_MS)
        self._timer.timeout.connect(self._apply_live)
        self.sections = QListWidget()
        self.sections.setObjectName("settingsSections")
        self.sections.setAccessibleName("Settings sections")
        self.sections.setFixedWidth(150)
        self.pages = QStackedWidget()
        from app.ui.remotes_page import RemotesPage

        self.remotes = RemotesPage(getattr(settings, "remotes", {}) or {})
        for name, page in (("Appearance", self._appearance()), ("Answers", self._answers()),
                           ("Model loading", self._loading()), ("Remote engines", self._remotes_section())):
            self.sections.addItem(name)
            self.pages.addWidget(scrolled(page))
        self.sections.currentRowChanged.connect(self.pages.setCurrentIndex)
        self.sections.setCurrentRow(0)
        body = QHBoxLayout()
        body.addWidget(self.sections)
        body.addWidget(self.pages, 1)
        self.note = fit_width(QLabel(objectName="noticeText"))
        self.error = fit_width(QLabel(objectName="errorText"))
        self.revert_btn = QPushButton("Revert", toolTip="Show the saved settings again")
        self.revert_btn.clicked.connect(lambda: self.show_settings(self.settings))
        self.apply_btn = QPushButton("Apply", enabled=False)
        self.apply_btn.setObjectName("applySettings")
        self.apply_btn.clicked.connect(self.apply)
        bar = QHBoxLayout()
        bar.addWidget(self.note, 1)
        bar.addWidget(self.revert_btn)
        bar.addWidget(self.apply_btn)
        outer = QVBoxLayout(self)
        outer.addLayout(body, 1)
        outer.addWidget(self.error)
        outer.addLayout(bar)
        self.show_settings(settings)
        self._watch()

    # -- sections -------------------------------------------------------------------------------------------
    def _appearance(self) -> QWidget:
        from app.ui.prefs import THEMES, load_prefs

        self.theme = QComboBox(toolTip="System follows the light or dark setting of your desktop, live")
        self.theme.setObjectName("themePicker")
        for mode in THEMES:
            self.theme.addItem(mode.capitalize(), mode)
        self.theme.setCurrentIndex(max(self.theme.findData(load_prefs().theme), 0))
        self.theme.currentIndexChanged.connect(lambda _i: self._theme(self.theme.currentData()))
        page, _f = _form([("Theme", self.theme)])
        return page

    def _answers(self) -> QWidget:
        self.temperature, self.top_p = _dspin(0, 5, 0.05), _dspin(0.01, 1, 0.01)
        self.top_k, self.min_p = _spin(0, 1000, "off"), _dspin(0, 1, 0.01)
        self.repeat_penalty = _dspin(0.5, 2, 0.05)
        self.seed = _spin(-1, 2**31 - 1, "random")
        self.max_tokens = _spin(1, 1 << 20)
        self.system_prompt = QPlainTextEdit(placeholderText="Optional instructions for every chat",
                                            tabChangesFocus=True)
        page, f = _form([("Temperature", self.temperature), ("Top p", self.top_p), ("Top k", self.top_k),
                         ("Min p", self.min_p), ("Repeat penalty", self.repeat_penalty), ("Seed", self.seed),
                         ("Max answer tokens", self.max_tokens), ("System prompt", self.system_prompt)])
        f.insertRow(0, fit_width(QLabel("These apply at once, to the next answer.", objectName="chatHeaderNote")))
        return page

    def _loading(self) -> QWidget:
        self.n_ctx = _spin(256, 1 << 20)
        self.n_ctx.setSingleStep(1024)
        self.n_gpu_layers = _spin(-1, 1000, "all layers (-1)")
        self.type_k, self.type_v = QComboBox(), QComboBox()
        self.type_k.addItems(KV_TYPES)
        self.type_v.addItems(KV_TYPES)
        self.flash_attn, self.offload_kqv = QCheckBox("Flash attention"), QCheckBox("Keep the KV cache on the GPU")
        self.n_threads = _spin(0, 256, "automatic")
        self.n_batch = _spin(16, 8192)
        self.n_parallel = _spin(0, MAX_PARALLEL, "auto")
        self.n_parallel.setToolTip("Requests answered at once (this window and the local port). Each has its "
                                   "own context of KV cache memory; auto: 4 where the memory estimate fits.")
        self.prefix_cache = QCheckBox("Reuse prompts from the prefix cache on disk")
        self.cache_budget = _spin(0, 1 << 20)
        self.cache_budget.setSuffix(" MiB")
        self.per_model = QCheckBox("For this model only")
        self._per_model_for(self.model_id)
        page, f = _form([("Context (n_ctx, tokens)", self.n_ctx), ("GPU layers", self.n_gpu_layers),
                         ("KV type K", self.type_k), ("KV type V", self.type_v), ("", self.flash_attn),
                         ("", self.offload_kqv), ("Threads", self.n_threads), ("Batch (tokens)", self.n_batch),
                         ("Parallel requests", self.n_parallel), ("", self.prefix_cache),
                         ("Cache budget", self.cache_budget), ("", self.per_model)])
        f.insertRow(0, fit_width(QLabel("These apply when the model reloads: press Apply.",
                                        objectName="chatHeaderNote")))
        return page

    def _remotes_section(self) -> QWidget:
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.remotes)
        return page

    def _watch(self) -> None:
        """Live fields apply after a pause; loading fields and remote engines wait for Apply."""
        live = (self.temperature, self.top_p, self.top_k, self.min_p, self.repeat_penalty, self.seed,
                self.max_tokens)
        for w in live:
            w.valueChanged.connect(lambda *_: self._edited(live=True))
        self.system_prompt.textChanged.connect(lambda: self._edited(live=True))
        for w in self._loading_fields():
            signal = (w.toggled if isinstance(w, QAbstractButton) else w.currentIndexChanged
                      if isinstance(w, QComboBox) else w.valueChanged)
            signal.connect(lambda *_: self._edited(live=False))
        self.remotes.list.model().rowsInserted.connect(lambda *_: self._edited(live=False))
        self.remotes.list.model().rowsRemoved.connect(lambda *_: self._edited(live=False))

    def _loading_fields(self) -> list[QWidget]:
        return [self.n_ctx, self.n_gpu_layers, self.type_k, self.type_v, self.flash_attn, self.offload_kqv,
                self.n_threads, self.n_batch, self.n_parallel, self.prefix_cache, self.cache_budget,
                self.per_model]

    # -- showing and applying ---------------------------------------------------------------------------------
    def show_for(self, settings: UserSettings, model_id: str | None) -> None:
        """Show ``settings`` for the model ``model_id`` (None: none loaded), e.g. when the page is opened."""
        self.model_id = model_id
        self._per_model_for(model_id)
        self.show_settings(settings)

    def _per_model_for(self, model_id: str | None) -> None:
        """The per-model box names the model in its tooltip (a long id never widens the page)."""
        self.per_model.setEnabled(bool(model_id))
        self.per_model.setToolTip(f"Store these loading settings for {model_id} only, not as the defaults"
                                  if model_id else "Load a model to give it settings of its own")

    def show_settings(self, s: UserSettings) -> None:
        """Fill every field from ``s`` (which becomes the settings in force); nothing is applied."""
        self._showing = True
        self.settings = s
        load = s.load_for(self.model_id)
        self.per_model.setChecked(bool(self.model_id and s.per_model.get(self.model_id)))
        self.n_ctx.setValue(load.n_ctx)
        self.n_gpu_layers.setValue(load.n_gpu_layers)
        self.type_k.setCurrentText(load.type_k)
        self.type_v.setCurrentText(load.type_v)
        self.flash_attn.setChecked(load.flash_attn)
        self.offload_kqv.setChecked(load.offload_kqv)
        self.n_threads.setValue(load.n_threads or 0)
        self.n_batch.setValue(load.n_batch)
        self.n_parallel.setValue(load.n_parallel or 0)
        self.prefix_cache.setChecked(s.prefix_cache)
        self.cache_budget.setValue(int(s.cache_budget_mb))
        d = s.decoding
        self.temperature.setValue(d.temperature)
        self.top_p.setValue(d.top_p)
        self.top_k.setValue(d.top_k)
        self.min_p.setValue(d.min_p)
        self.repeat_penalty.setValue(d.repeat_penalty)
        self.seed.setValue(-1 if d.seed is None else d.seed)
        self.max_tokens.setValue(d.max_tokens or 256)
        self.system_prompt.setPlainText(s.system_prompt)
        self.remotes.remotes = dict(getattr(s, "remotes", {}) or {})
        self.remotes.keys_to_store.clear()
        self.remotes._fill()
        self._showing = False
        self._timer.stop()
        self.error.setText("")
        self.note.setText("")
        self.apply_btn.setEnabled(False)

    def _load(self) -> LoadSettings:
        batch = self.n_batch.value()
        return replace(self.settings.load_for(self.model_id), n_ctx=self.n_ctx.value(),
                       n_gpu_layers=self.n_gpu_layers.value(), type_k=self.type_k.currentText(),
                       type_v=self.type_v.currentText(), flash_attn=self.flash_attn.isChecked(),
                       offload_kqv=self.offload_kqv.isChecked(), n_threads=self.n_threads.value() or None,
                       n_batch=batch,  # n_ubatch stays as set: it may exceed n_batch (two chunks a pass)
                       n_parallel=self.n_parallel.value() or None).validate()

    def _decoding(self) -> DecodingParams:
        seed = self.seed.value()
        return replace(self.settings.decoding, temperature=self.temperature.value(), top_p=self.top_p.value(),
                       top_k=self.top_k.value(), min_p=self.min_p.value(), repeat_penalty=self.repeat_penalty.value(),
                       seed=None if seed < 0 else seed, max_tokens=self.max_tokens.value()).validate()

    def result_settings(self) -> UserSettings:
        """The edited settings, every field; raises ``InvalidRequest`` naming a bad field."""
        load, s = self._load(), self.settings
        per_model = dict(s.per_model)
        if self.per_model.isChecked() and self.model_id:
            per_model[self.model_id] = {k: v for k, v in load.to_dict().items() if v != s.load.to_dict()[k]}
        else:
            per_model.pop(self.model_id or "", None)
            s = replace(s, load=load)
        return replace(s, decoding=self._decoding(), system_prompt=self.system_prompt.toPlainText(),
                       prefix_cache=self.prefix_cache.isChecked(), cache_budget_mb=float(self.cache_budget.value()),
                       per_model=per_model, remotes=self.remotes.result_remotes())

    def _edited(self, live: bool) -> None:
        if self._showing:
            return
        if live:
            self._timer.start()
        else:
            self.apply_btn.setEnabled(True)
            self.note.setText("Model loading and remote engine changes wait for Apply; the model reloads "
                              "when what it is built from changed (context, KV type, …).")

    def _apply_live(self) -> None:
        """Apply the decoding defaults and the system prompt at once (a bad value is named, nothing saved)."""
        try:
            live = replace(self.settings, decoding=self._decoding(), system_prompt=self.system_prompt.toPlainText())
        except InvalidRequest as exc:
            self.error.setText(str(exc))
            return
        self.error.setText("")
        if live != self.settings:
            self.settings = self.new_settings = live
            self.applied.emit(live, False)

    def apply(self) -> bool:
        """Apply every field (the Apply button): ``applied(settings, True)``. False, with the bad field named in
        ``error``, when a value is invalid or the keyring refuses a remote engine's key."""
        self._timer.stop()
        self.new_theme = str(self.theme.currentData())
        try:
            new = self.result_settings()
        except InvalidRequest as exc:
            self.error.setText(str(exc))
            return False
        try:
            self.remotes.store_keys()
        except HearthError as exc:  # the keyring refused: say so, keep what was typed
            self.sections.setCurrentRow(3)
            self.error.setText(f"Remote engines: {exc}")
            return False
        self.error.setText("")
        self.note.setText("")
        self.apply_btn.setEnabled(False)
        self.settings = self.new_settings = new
        self.applied.emit(new, True)
        return True

    def _theme(self, mode: str) -> None:
        """A theme choice is shown and saved at once."""
        self.new_theme = mode
        self.theme_chosen.emit(mode)

