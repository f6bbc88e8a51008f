"""Settings → MCP servers: edit ``mcp.json`` (servers, their command / arguments / environment or URL /
headers), see each server's status (ready with its tools, or failed with the reason), switch tools on and off.

The reasoning: docs/ui.md, 'app/ui/mcp_page.py'.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.errors import InvalidRequest
from app.settings import TOOL_LIMITS, ToolSettings
from app.ui.flow import FlowLayout
from app.ui.labels import fit_width

_ALWAYS_ROLE = Qt.ItemDataRole.UserRole + 1  # a tool item's data: allowed without asking
_LAUNCH_KEYS = ("command", "args", "env", "cwd", "url", "headers", "disabled", "type")


def lines(text: str) -> list[str]:
    """Non-empty lines of a text box, stripped."""
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def parse_pairs(text: str, sep: str, where: str) -> dict[str, str]:
    """``KEY<sep>value`` lines → a dict; ``InvalidRequest`` naming ``where`` and the line for a bad one."""
    out: dict[str, str] = {}
    for n, ln in enumerate(lines(text), 1):
        key, found, value = ln.partition(sep)
        if not found or not key.strip():
            raise InvalidRequest(f"{where}: line {n} must be KEY{sep}value, got {ln!r}", param=where)
        out[key.strip()] = value.strip()
    return out


def pairs_text(values: dict, sep: str) -> str:
    """The inverse of ``parse_pairs``."""
    return "\n".join(f"{k}{sep}{v}" for k, v in values.items())


def status_line(status: Any) -> str:
    """One line for a server's ``ServerStatus`` (None: not started)."""
    if status is None or status.state == "stopped":
        return "disabled (not started)" if status is not None and status.disabled else "not running"
    if status.state == "ready":
        n = len(status.tools)
        return f"ready · {n} tool" + ("" if n == 1 else "s")
    if status.state == "failed":
        return f"failed: {status.error}"
    return status.state + "…"


class McpPage(QWidget):
    """``config``: the ``McpConfig`` running now; ``statuses``: its servers' ``ServerStatus`` by name;
    ``error``: why mcp.json could not be read (shown at the top; saving replaces the file); ``limits``: the
    ``ToolSettings`` shown in the Tool calls box (None: the defaults)."""

    def __init__(self, config: Any, statuses: dict[str, Any], error: str | None = None,
                 parent: QWidget | None = None, limits: ToolSettings | None = None) -> None:
        super().__init__(parent)
        self.config, self.statuses = config, dict(statuses)
        # a draft: "name", "entry" (its JSON), "revoked" (tools taken out of alwaysAllow), "raw" (text boxes)
        self.drafts: list[dict[str, Any]] = [{"name": s.name, "entry": s.to_json(), "revoked": set()}
                                             for s in config.servers]
        self.current = -1
        self._build(error)
        self.show_limits(limits or ToolSettings())
        for d in self.drafts:
            self.servers.addItem(self._item_text(d["name"]))
        self.servers.currentRowChanged.connect(self._select)
        if self.drafts:
            self.servers.setCurrentRow(0)
        self._enable()

    # -- layout -------------------------------------------------------------------------------------------
    def _build(self, error: str | None) -> None:
        outer = QVBoxLayout(self)
        self.file_error = QLabel(error or "", wordWrap=True, visible=bool(error), objectName="errorText")
        outer.addWidget(self.file_error)
        split = QSplitter()
        left = QWidget()
        col = QVBoxLayout(left)
        col.setContentsMargins(0, 0, 0, 0)
        self.servers = QListWidget()
        self.servers.setAccessibleName("MCP servers")
        self.add_btn, self.remove_btn = QPushButton("Add server"), QPushButton("Remove")
        self.remove_btn.setAccessibleName("Remove server")
        self.add_btn.clicked.connect(self.add_server)
        self.remove_btn.clicked.connect(self.remove_server)
        row = QHBoxLayout()
        row.addWidget(self.add_btn)
        row.addWidget(self.remove_btn)
        col.addWidget(self.servers, 1)
        col.addLayout(row)
        split.addWidget(left)
        split.addWidget(self._editor())
        split.setSizes([200, 520])
        outer.addWidget(split, 1)
        outer.addWidget(self._limits_box())
        self.error = QLabel(wordWrap=True, objectName="errorText")
        outer.addWidget(self.error)

    def _limits_box(self) -> QGroupBox:
        box = QGroupBox("Tool calls (every server)")
        row = FlowLayout(box)  # the three limits wrap at 640 px instead of scrolling the page sideways
        self.limits: dict[str, QSpinBox] = {}
        for name, label, suffix, tip in (
                ("max_steps", "Steps per answer", "", "Generations per turn; the last one may not call a tool"),
                ("call_timeout_s", "Call timeout", " s", "Seconds one tool call may take"),
                ("start_timeout_s", "Server start timeout", " s",
                 "Seconds a server has to start (servers started after the change)")):
            lo, hi = TOOL_LIMITS[name]
            spin = QSpinBox(minimum=lo, maximum=hi, suffix=suffix, toolTip=tip)
            self.limits[name] = spin
            pair = QWidget()  # a label stays beside its spin box when the row wraps
            both = QHBoxLayout(pair)
            both.setContentsMargins(0, 0, 0, 0)
            both.addWidget(QLabel(label, buddy=spin))  # the spin box's name (else: the group box's title)
            both.addWidget(spin)
            row.addWidget(pair)
        return box

    def _editor(self) -> QWidget:
        self.editor = QWidget()
        f = QFormLayout(self.editor)
        self.name = QLineEdit()
        self.stdio, self.http = QRadioButton("Local program (stdio)"), QRadioButton("HTTP server (streamable HTTP)")
        group = QButtonGroup(self.editor)
        for b in (self.stdio, self.http):
            group.addButton(b)
            b.toggled.connect(self._transport_changed)
        kind = QVBoxLayout()  # one above the other: side by side they cut "(streamable HTTP)" at 640 px
        kind.addWidget(self.stdio)
        kind.addWidget(self.http)
        self.command, self.cwd, self.url = QLineEdit(), QLineEdit(), QLineEdit(placeholderText="http://127.0.0.1:9000/mcp")
        self.args = QPlainTextEdit(placeholderText="one argument per line", tabChangesFocus=True)
        self.env = QPlainTextEdit(placeholderText="KEY=value, one per line", tabChangesFocus=True)
        self.headers = QPlainTextEdit(placeholderText="Authorization: Bearer …, one per line",
                                      tabChangesFocus=True)
        for box in (self.args, self.env, self.headers):
            box.setFixedHeight(52)
        self.disabled = QCheckBox("Disabled (listed, not started)")
        self.status = QLabel(wordWrap=True, textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse)
        self.tools = QListWidget()
        self.tools.setAccessibleName("Tools of this server")
        self.tools.setMinimumHeight(150)
        self.tools.itemChanged.connect(self._tool_switched)
        self.tools.currentItemChanged.connect(lambda *_: self._enable_ask_again())
        self.tools.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.tools.customContextMenuRequested.connect(self._tool_menu)
        self.ask_again_btn = QPushButton("Ask every time", enabled=False,
                                         toolTip="Take back \"Always allow\": the next call of this tool asks first")
        self.ask_again_btn.clicked.connect(lambda: self.ask_every_time(self.tools.currentItem()))
        for label, w in (("Name", self.name), ("Kind", kind), ("Command", self.command), ("Arguments", self.args),
                         ("Environment", self.env), ("Working folder", self.cwd), ("URL", self.url),
                         ("Headers", self.headers), ("", self.disabled), ("Status", self.status)):
            f.addRow(label, w)
        f.addRow(fit_width(QLabel("Tools (unchecked: hidden from the model)")))
        f.addRow(self.tools)
        f.addRow(self.ask_again_btn)
        return self.editor

    # -- servers ------------------------------------------------------------------------------------------
    def _item_text(self, name: str) -> str:
        return f"{name} — {status_line(self.statuses.get(name))}"

    def _enable(self) -> None:
        has = self.current >= 0
        self.editor.setEnabled(has)
        self.remove_btn.setEnabled(has)

    def add_server(self) -> None:
        """A new stdio entry (to be filled in), selected."""
        self._commit()
        names = {d["name"] for d in self.drafts}
        name = next(f"server{i}" for i in range(1, 1000) if f"server{i}" not in names)
        self.drafts.append({"name": name, "entry": {"command": ""}, "revoked": set()})
        self.servers.addItem(self._item_text(name))
        self.servers.setCurrentRow(len(self.drafts) - 1)

    def remove_server(self) -> None:
        """Drop the selected entry (its process stops when the settings are saved)."""
        i = self.current
        if i < 0:
            return
        self.current = -1  # nothing to commit: the entry goes
        del self.drafts[i]
        self.servers.takeItem(i)
        self._select(self.servers.currentRow())

    def _select(self, i: int) -> None:
        if self.current >= 0 and self.current != i:
            self._commit()
        self.current = i
        self._enable()
        if 0 <= i < len(self.drafts):
            self._show(self.drafts[i])

    def _show(self, d: dict[str, Any]) -> None:
        e = d["entry"]
        self.name.setText(d["name"])
        (self.http if "url" in e else self.stdio).setChecked(True)
        self.command.setText(str(e.get("command") or ""))
        self.args.setPlainText("\n".join(str(a) for a in e.get("args") or []))
        self.env.setPlainText(pairs_text(dict(e.get("env") or {}), "="))
        self.cwd.setText(str(e.get("cwd") or ""))
        self.url.setText(str(e.get("url") or ""))
        self.headers.setPlainText(pairs_text(dict(e.get("headers") or {}), ": "))
        self.disabled.setChecked(bool(e.get("disabled")))
        self._show_status(d)

    def _show_status(self, d: dict[str, Any]) -> None:
        st = self.statuses.get(d["name"])
        self.status.setText(status_line(st))
        self.status.setObjectName("errorText" if st is not None and st.state == "failed" else "")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)
        e = d["entry"]
        off, always = set(e.get("disabledTools") or []), set(e.get("alwaysAllow") or []) - d["revoked"]
        known = [(t.name, t.description) for t in (st.tools if st is not None else ())]
        known += [(n, "") for n in sorted(off) if n not in {k for k, _ in known}]
        self.tools.blockSignals(True)
        self.tools.clear()
        for name, desc in known:
            text = name + (f" — {desc.splitlines()[0][:80]}" if desc else "") + (" (always allowed)"
                                                                                  if name in always else "")
            item = QListWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setData(_ALWAYS_ROLE, name in always)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Unchecked if name in off else Qt.CheckState.Checked)
            self.tools.addItem(item)
        self.tools.blockSignals(False)
        self._enable_ask_again()

    def _enable_ask_again(self) -> None:
        item = self.tools.currentItem()
        self.ask_again_btn.setEnabled(item is not None and bool(item.data(_ALWAYS_ROLE)))

    def _tool_menu(self, pos: Any) -> None:
        item = self.tools.itemAt(pos)
        if item is None or not item.data(_ALWAYS_ROLE):
            return
        menu = QMenu(self.tools)
        menu.addAction("Ask every time", lambda: self.ask_every_time(item))
        menu.exec(self.tools.viewport().mapToGlobal(pos))

    def ask_every_time(self, item: QListWidgetItem | None) -> None:
        """Take back "Always allow" for ``item``'s tool (saved with the Tools page; its next call asks first)."""
        if item is None or not item.data(_ALWAYS_ROLE) or not 0 <= self.current < len(self.drafts):
            return
        d = self.drafts[self.current]
        d["revoked"].add(item.data(Qt.ItemDataRole.UserRole))
        self._show_status(d)

    def _transport_changed(self) -> None:
        stdio = self.stdio.isChecked()
        for w in (self.command, self.args, self.env, self.cwd):
            w.setEnabled(stdio)
        for w in (self.url, self.headers):
            w.setEnabled(not stdio)

    def _tool_switched(self, item: QListWidgetItem) -> None:
        if not 0 <= self.current < len(self.drafts):
            return
        e = self.drafts[self.current]["entry"]
        off = set(e.get("disabledTools") or [])
        name = item.data(Qt.ItemDataRole.UserRole)
        (off.discard if item.checkState() == Qt.CheckState.Checked else off.add)(name)
        if off:
            e["disabledTools"] = sorted(off)
        else:
            e.pop("disabledTools", None)

    def _commit(self) -> None:
        """The editor's fields into the selected draft (kept as typed; checked by ``result_config``)."""
        if not 0 <= self.current < len(self.drafts):
            return
        d = self.drafts[self.current]
        d["name"] = self.name.text().strip()
        d["raw"] = {"args": self.args.toPlainText(), "env": self.env.toPlainText(),
                    "headers": self.headers.toPlainText()}
        e = {k: v for k, v in d["entry"].items() if k not in _LAUNCH_KEYS}
        if self.stdio.isChecked():
            e.update(command=self.command.text().strip(), args=lines(self.args.toPlainText()))
            if self.cwd.text().strip():
                e["cwd"] = self.cwd.text().strip()
        else:
            e["url"] = self.url.text().strip()
        if self.disabled.isChecked():
            e["disabled"] = True
        d["entry"] = e
        self.servers.item(self.current).setText(self._item_text(d["name"]))

    def _entry(self, d: dict[str, Any]) -> dict[str, Any]:
        """A draft's entry with its environment / headers text parsed."""
        e, raw, where = dict(d["entry"]), d.get("raw"), f"mcpServers.{d['name']}"
        if raw is not None:
            if "command" in e:
                env = parse_pairs(raw["env"], "=", f"{where}.env")
                e.update({"env": env} if env else {})
            else:
                headers = parse_pairs(raw["headers"], ":", f"{where}.headers")
                e.update({"headers": headers} if headers else {})
            if not e.get("args"):
                e.pop("args", None)
        return e

    # -- results ------------------------------------------------------------------------------------------
    def result_config(self) -> Any:
        """The edited ``McpConfig``; raises ``InvalidRequest`` (``McpConfigError``) naming the bad field."""
        from app.mcp import McpConfig
        from app.mcp.config import parse_server

        self._commit()
        servers = tuple(parse_server(d["name"], self._entry(d)) for d in self.drafts)
        cfg = McpConfig(servers=servers, extra=dict(self.config.extra))
        for d in self.drafts:
            for tool in sorted(d["revoked"]):
                cfg = cfg.with_always_allow(d["name"], tool, allow=False)
        return cfg

    def show_limits(self, limits: ToolSettings) -> None:
        """Show ``limits`` in the Tool calls box."""
        for name, spin in self.limits.items():
            spin.setValue(int(getattr(limits, name)))

    def result_limits(self) -> ToolSettings:
        """The Tool calls box as ``ToolSettings`` (the spin boxes keep each value in range)."""
        return ToolSettings(**{name: spin.value() for name, spin in self.limits.items()}).validate()

    def update_status(self, status: Any) -> None:
        """A server's new ``ServerStatus`` (from the hub, on the GUI thread)."""
        self.statuses[status.name] = status
        for i, d in enumerate(self.drafts):
            if d["name"] == status.name:
                self.servers.item(i).setText(self._item_text(d["name"]))
                if i == self.current:
                    self._show_status(d)

    def show_error(self, text: str) -> None:
        """Show ``text`` under the editor (red)."""
        self.error.setText(text)
