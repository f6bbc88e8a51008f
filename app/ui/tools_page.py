"""The Tools page: the MCP servers (``app.ui.mcp_page.McpPage``: add, edit, remove, each tool on or off, the
always-allowed tools taken back) and the tool-call limits, with **Save** and **Revert**.

``saved(config_or_None, ToolSettings)``: the edited ``McpConfig`` to write as mcp.json (None when it did not
change) and the limits to save with the settings. ``show_current()`` shows the running config again;
``refresh()`` does when it changed, keeping unsaved edits otherwise.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.errors import InvalidRequest
from app.ui.labels import fit_width, scrolled
from app.ui.mcp_page import McpPage


class ToolsPage(QWidget):
    """``tools``: the ``ToolsController``; ``limits``: the ``ToolSettings`` in force. ``new_mcp``: the config
    the last ``save`` gave (None: unchanged)."""

    saved = Signal(object, object)

    def __init__(self, tools: Any, limits: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tools, self.limits = tools, limits
        self.new_mcp: Any = None
        self.mcp: McpPage | None = None
        lay = QVBoxLayout(self)
        self.area = scrolled(QWidget())  # the servers scroll; the error line and Save / Revert stay in view
        lay.addWidget(self.area, 1)
        self.error = fit_width(QLabel(objectName="errorText"))
        self.revert_btn = QPushButton("Revert", toolTip="Show the servers that run now again")
        self.revert_btn.clicked.connect(self.show_current)
        self.save_btn = QPushButton("Save", toolTip="Write mcp.json and restart the servers that changed")
        self.save_btn.setObjectName("saveTools")
        self.save_btn.clicked.connect(self.save)
        bar = QHBoxLayout()
        bar.addWidget(self.error, 1)
        bar.addWidget(self.revert_btn)
        bar.addWidget(self.save_btn)
        lay.addLayout(bar)
        tools.status_changed.connect(self._status)
        self.show_current()

    def show_current(self, limits: Any = None) -> None:
        """Show the running MCP config and ``limits`` (None: the last ones), dropping unsaved edits."""
        if limits is not None:
            self.limits = limits
        if self.mcp is not None:
            self.area.takeWidget()
            self.mcp.setParent(None)  # gone from the page now (deleteLater waits for the event loop's turn)
            self.mcp.deleteLater()
        t = self.tools
        self.mcp = McpPage(t.config, t.statuses(), t.config_error, limits=self.limits)
        self.area.setWidget(self.mcp)
        self.error.setText("")

    def refresh(self, limits: Any) -> None:
        """Show the running config when it changed since the page was built (else keep the edits on it)."""
        if self.mcp is None or self.mcp.config is not self.tools.config or limits != self.limits:
            self.show_current(limits)

    def _status(self, status: Any) -> None:
        if self.mcp is not None:
            self.mcp.update_status(status)

    def save(self) -> bool:
        """Check and hand over the edits (``saved``). False, with the bad field named, when one is invalid."""
        if self.mcp is None:
            return False
        try:
            cfg = self.mcp.result_config()
            limits = self.mcp.result_limits()
        except InvalidRequest as exc:
            self.error.setText(f"MCP servers: {exc}")
            return False
        t = self.tools
        self.new_mcp = None if cfg == t.config and not t.config_error else cfg
        self.limits = limits
        self.error.setText("")
        self.saved.emit(self.new_mcp, limits)
        return True
