"""Settings: load settings (n_ctx, GPU layers, KV types, flash attention, KV offload, threads, batch, parallel
requests: 0 shown as "auto" = ``n_parallel`` None, chosen from the memory estimate on load), the
prefix-cache budget, sampling defaults, the system prompt. "For this model only" stores the load settings as
the model's override (``UserSettings.per_model``) instead of changing the defaults. The values are validated by
the core's own types (``LoadSettings.validate``, ``DecodingParams.make``) and an error names the field; saving
is atomic (``app.settings.save_user_settings``). The window reloads the model when load settings changed.

The reasoning: docs/ui.md, 'app/ui/settings_dialog.py'.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from PySide6.QtCore import QSize
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.errors import HearthError, InvalidRequest
from app.protocol.types import KV_TYPES, MAX_PARALLEL, DecodingParams, LoadSettings
from app.settings import UserSettings

FIT = QSize(960, 680)  # the dialog's largest size: fits a 1024×700 screen with room for its frame


def _scrolled(page: QWidget) -> QScrollArea:
    """``page`` in a frameless scroll area (a page taller or wider than the dialog scrolls)."""
    area = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
    area.setWidget(page)
    return area


def _spin(lo: int, hi: int, special: str | None = None) -> QSpinBox:
    w = QSpinBox(minimum=lo, maximum=hi)
    if special:
        w.setSpecialValueText(special)
    return w


def _dspin(lo: float, hi: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    return QDoubleSpinBox(minimum=lo, maximum=hi, singleStep=step, decimals=decimals)


class SettingsDialog(QDialog):
    """``result_settings()`` after ``accept``: the new ``UserSettings`` (``new_settings``); ``new_mcp``: the
    edited MCP config, or None. ``tools``: the ``ToolsController`` (None: no MCP page)."""

    def __init__(self, settings: UserSettings, model_id: str | None, parent: QWidget | None = None,
                 tools: Any = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.settings, self.model_id = settings, model_id
        self.new_mcp: Any = None
        general = QWidget()
        lay = QHBoxLayout(general)
        lay.addWidget(self._load_box())
        right = QVBoxLayout()
        right.addWidget(self._appearance_box())
        right.addWidget(self._sampling_box(), 1)
        lay.addLayout(right)
        self.pages = QTabWidget()
        self.pages.addTab(_scrolled(general), "General")
        self.mcp = None
        if tools is not None:
            from app.ui.mcp_page import McpPage

            self.mcp = McpPage(tools.config, tools.statuses(), tools.config_error, limits=settings.tools)
            tools.status_changed.connect(self.mcp.update_status)
            self.pages.addTab(_scrolled(self.mcp), "MCP servers")
        self.tools = tools
        from app.ui.remotes_page import RemotesPage

        self.remotes = RemotesPage(getattr(settings, "remotes", {}) or {})
        self.pages.addTab(_scrolled(self.remotes), "Remote engines")
        outer = QVBoxLayout(self)
        outer.addWidget(self.pages)
        self.error = QLabel(wordWrap=True, objectName="errorText")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        outer.addWidget(self.error)
        outer.addWidget(buttons)
        self.show_settings(settings)
        self._fit_screen()

    def _load_box(self) -> QGroupBox:
        box = QGroupBox("Model loading (applied by reloading the model)")
        f = QFormLayout(box)
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
        self.per_model = QCheckBox(f"For this model only ({self.model_id})" if self.model_id
                                   else "For this model only")
        self.per_model.setEnabled(bool(self.model_id))
        for label, w in (("Context (n_ctx, tokens)", self.n_ctx), ("GPU layers", self.n_gpu_layers),
                         ("KV type K", self.type_k), ("KV type V", self.type_v), ("", self.flash_attn),
                         ("", self.offload_kqv), ("Threads", self.n_threads), ("Batch (tokens)", self.n_batch),
                         ("Parallel requests", self.n_parallel),
                         ("", self.prefix_cache), ("Cache budget", self.cache_budget), ("", self.per_model)):
            f.addRow(label, w)
        return box

    def _appearance_box(self) -> QGroupBox:
        from app.ui.prefs import THEMES, load_prefs

        box = QGroupBox("Appearance")
        f = QFormLayout(box)
        self.theme = QComboBox(toolTip="System follows the light or dark setting of your desktop, live")
        self.theme.setObjectName("themePicker")
        for mode in THEMES:
            self.theme.addItem(mode.capitalize(), mode)
        self.theme.setCurrentIndex(max(self.theme.findData(load_prefs().theme), 0))
        self.theme_at_open = self.theme.currentData()  # shown again on Cancel: a choice is previewed at once
        self.theme.currentIndexChanged.connect(lambda _i: self._preview_theme(self.theme.currentData()))
        f.addRow("Theme", self.theme)
        return box

    def _sampling_box(self) -> QGroupBox:
        box = QGroupBox("Answers")
        f = QFormLayout(box)
        self.temperature, self.top_p = _dspin(0, 5, 0.05), _dspin(0.01, 1, 0.01)
        self.top_k, self.min_p = _spin(0, 1000, "off"), _dspin(0, 1, 0.01)
        self.repeat_penalty = _dspin(0.5, 2, 0.05)
        self.seed = _spin(-1, 2**31 - 1, "random")
        self.max_tokens = _spin(1, 1 << 20)
        self.system_prompt = QPlainTextEdit(placeholderText="Optional instructions for every chat")
        for label, w in (("Temperature", self.temperature), ("Top p", self.top_p), ("Top k", self.top_k),
                         ("Min p", self.min_p), ("Repeat penalty", self.repeat_penalty), ("Seed", self.seed),
                         ("Max answer tokens", self.max_tokens), ("System prompt", self.system_prompt)):
            f.addRow(label, w)
        return box

    def show_settings(self, s: UserSettings) -> None:
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

    def _load(self) -> LoadSettings:
        batch = self.n_batch.value()
        return replace(self.settings.load_for(self.model_id), n_ctx=self.n_ctx.value(),
                       n_gpu_layers=self.n_gpu_layers.value(), type_k=self.type_k.currentText(),
                       type_v=self.type_v.currentText(), flash_attn=self.flash_attn.isChecked(),
                       offload_kqv=self.offload_kqv.isChecked(), n_threads=self.n_threads.value() or None,
                       n_batch=batch, n_ubatch=min(batch, self.settings.load.n_ubatch),
                       n_parallel=self.n_parallel.value() or None).validate()

    def _decoding(self) -> DecodingParams:
        seed = self.seed.value()
        return replace(self.settings.decoding, temperature=self.temperature.value(), top_p=self.top_p.value(),
                       top_k=self.top_k.value(), min_p=self.min_p.value(), repeat_penalty=self.repeat_penalty.value(),
                       seed=None if seed < 0 else seed, max_tokens=self.max_tokens.value()).validate()

    def result_settings(self) -> UserSettings:
        """The edited settings; raises ``InvalidRequest`` naming a bad field."""
        load, s = self._load(), self.settings
        per_model = dict(s.per_model)
        if self.per_model.isChecked() and self.model_id:
            per_model[self.model_id] = {k: v for k, v in load.to_dict().items() if v != s.load.to_dict()[k]}
        else:
            per_model.pop(self.model_id or "", None)
            s = replace(s, load=load)
        if self.mcp is not None:
            s = replace(s, tools=self.mcp.result_limits())
        return replace(s, decoding=self._decoding(), system_prompt=self.system_prompt.toPlainText(),
                       prefix_cache=self.prefix_cache.isChecked(), cache_budget_mb=float(self.cache_budget.value()),
                       per_model=per_model, remotes=self.remotes.result_remotes())

    def accept(self) -> None:
        self.new_theme = str(self.theme.currentData())
        try:
            self.new_settings = self.result_settings()
        except InvalidRequest as exc:
            self.pages.setCurrentIndex(0)
            self.error.setText(str(exc))
            return
        if self.mcp is not None:
            try:
                cfg = self.mcp.result_config()
            except InvalidRequest as exc:
                self._show_page(self.mcp)
                self.error.setText(f"MCP servers: {exc}")
                return
            tools = self.tools
            self.new_mcp = None if tools is not None and cfg == tools.config and not tools.config_error else cfg
        try:
            self.remotes.store_keys()
        except HearthError as exc:  # the keyring refused: say so, keep the dialog open
            self._show_page(self.remotes)
            self.error.setText(f"Remote engines: {exc}")
            return
        super().accept()

    def _show_page(self, page: QWidget) -> None:
        for i in range(self.pages.count()):
            area = self.pages.widget(i)
            if isinstance(area, QScrollArea) and area.widget() is page:
                self.pages.setCurrentIndex(i)

    def _preview_theme(self, mode: str) -> None:
        from app.ui import theme

        theme.manager().set_mode(mode)

    def _fit_screen(self) -> None:
        """At most 960×680 and within the screen (the pages scroll): the dialog fits a 1024×700 screen."""
        screen = (self.parent().screen() if isinstance(self.parent(), QWidget) else None) or self.screen()
        room = screen.availableGeometry().size() if screen is not None else QSize(1024, 700)
        self.resize(min(FIT.width(), room.width() - 24), min(FIT.height(), room.height() - 24))

    def done(self, result: int) -> None:
        """Qt's end of the dialog: stop following the hub's status first; Cancel shows the theme of before."""
        if result != QDialog.DialogCode.Accepted and self.theme.currentData() != self.theme_at_open:
            self._preview_theme(self.theme_at_open)
        if self.mcp is not None and self.tools is not None:
            self.tools.status_changed.disconnect(self.mcp.update_status)
            self.tools = None
        super().done(result)
