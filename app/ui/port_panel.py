"""The local port panel: on/off, port, API key (generate / copy), CORS origins, the base URL and a curl example
to copy, and the live request count (polled from the server's metrics every second). Changes are saved with
the settings and applied by restarting the port."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.catalog import registry
from app.ui import theme
from app.ui.labels import fit_width
from app.ui.server_ctl import base_url, curl_example, new_api_key


class PortPanel(QWidget):
    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx, self.server = ctx, ctx.server
        lay = QVBoxLayout(self)
        self.state = fit_width(QLabel())
        lay.addWidget(self.state)
        if not self.server.available:
            self.state.setText("<b>The local port is not available in this build</b> (app.server is missing).")
            lay.addStretch(1)
            return
        lay.addLayout(self._form())
        lay.addStretch(1)
        self._timer = QTimer(self, interval=1000)
        self._timer.timeout.connect(self._count)
        self._timer.start()
        self.server.running_changed.connect(self._running)
        self.server.failed.connect(self._failed)
        self.show_settings(ctx.settings.server)

    def _form(self) -> QFormLayout:
        form = QFormLayout()
        self.enabled = QCheckBox("Serve the OpenAI-compatible API on this machine")
        self.port = QSpinBox(minimum=1, maximum=65535)
        self.key = QLineEdit(readOnly=True, placeholderText="none: any local program may call the port")
        self.key.setAccessibleName("API key")  # its row holds the buttons too: the form's label names the row
        self.cors = QLineEdit(placeholderText="e.g. http://localhost:5173, comma-separated")
        self.url = QLineEdit(readOnly=True)
        self.curl = QPlainTextEdit(readOnly=True, maximumHeight=90)
        self.requests = QLabel("0 requests", toolTip="Health checks (/health) are not counted: the window itself "
                                                     "asks one every 5 s")
        keys = QHBoxLayout()
        gen, copy_key, clear = QPushButton("Generate"), QPushButton("Copy"), QPushButton("Clear")
        for b, name in ((gen, "Generate an API key"), (copy_key, "Copy the API key"), (clear, "Clear the API key")):
            b.setAccessibleName(name)
        gen.clicked.connect(lambda: self._set_key(new_api_key()))
        clear.clicked.connect(lambda: self._set_key(None))
        copy_key.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.key.text()))
        for w in (self.key, gen, copy_key, clear):
            keys.addWidget(w)
        copy_url, copy_curl = QPushButton("Copy base URL"), QPushButton("Copy curl example")
        copy_url.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.url.text()))
        copy_curl.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.curl.toPlainText()))
        self.apply_btn = QPushButton("Apply")
        self.apply_btn.clicked.connect(self.apply)
        self.enabled.toggled.connect(lambda _on: self.apply())
        for label, w in (("", self.enabled), ("Port", self.port), ("API key", keys), ("CORS origins", self.cors),
                         ("Base URL", self.url), ("", copy_url), ("Example", self.curl), ("", copy_curl),
                         ("Requests", self.requests), ("", self.apply_btn)):
            form.addRow(label, w)
        return form

    def _failed(self, exc: object) -> None:
        colour = theme.PALETTES[theme.current()].error  # the theme's: a fixed red was 3.0:1 on the dark window
        self.state.setText(f"<span style='color:{colour}'>Could not start the port: {exc}</span>")

    def show_settings(self, s: Any) -> None:
        self.enabled.blockSignals(True)
        self.enabled.setChecked(s.enabled)
        self.enabled.blockSignals(False)
        self.port.setValue(s.port)
        self.key.setText(s.api_key or "")
        self.cors.setText(", ".join(s.cors_origins))
        self._examples(s)

    def current(self) -> Any:
        origins = [o.strip() for o in self.cors.text().split(",") if o.strip()]
        return replace(self.ctx.settings.server, enabled=self.enabled.isChecked(), port=self.port.value(),
                       api_key=self.key.text() or None, cors_origins=origins)

    def _set_key(self, key: str | None) -> None:
        self.key.setText(key or "")
        self._examples(self.current())

    def _examples(self, s: Any) -> None:
        self.url.setText(base_url(s))
        job = self.ctx.engine.job
        self.curl.setPlainText(curl_example(s, registry.model_id(job.path) if job else ""))

    def apply(self) -> None:
        s = self.current()
        self.ctx.save_settings(replace(self.ctx.settings, server=s))
        self._examples(s)
        self.state.setText("Starting…" if s.enabled else "Stopping…")
        self.server.apply(s)

    def _running(self, running: bool, url: str) -> None:
        self.state.setText(f"<b>Serving</b> on {url}/v1" if running else "The port is off.")

    def _count(self) -> None:
        done, in_flight = self.server.requests_served()
        self.requests.setText(f"{done} request(s) answered, {in_flight} in progress")
