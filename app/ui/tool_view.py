"""A tool call in the chat: which tool, with which arguments, the person's answer, then the result, collapsed.

``ToolCallWidget`` draws one ``tool`` row of the ``ChatModel`` (``app.ui.models.ChatRow``): the header names
the server and the tool, the arguments are shown as compact JSON, and while the turn waits for the person
(``tool_state == "asking"``) three buttons answer it: **Allow once**, **Always allow** (saved as the tool's
``alwaysAllow`` in mcp.json) and **Deny**. The result is behind a collapsed **Result ▸** toggle; a large one is
shown only in part in the widget (the whole result stays in the store and in exports). Failures and denials
show their notice in red. Pure helpers (``arguments_text``, ``state_text``, ``result_preview``) carry the
wording so it is tested without a window.
"""

from __future__ import annotations

import json

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.models import ChatRow

PREVIEW_CHARS = 100_000  # characters of a result the widget holds (a 1 MB result would make Qt's layout crawl)
ARGS_CHARS = 600
RESULT_MAX_PX = 220
_STATES = {"asking": "asks for your permission", "running": "running…", "ok": "done",
           "error": "the tool reported an error", "denied": "denied", "failed": "failed"}


def arguments_text(arguments: str) -> str:
    """The call's arguments as one line of compact JSON (as the model wrote them when they are not JSON),
    shortened to ``ARGS_CHARS``."""
    try:
        text = json.dumps(json.loads(arguments or "{}"), ensure_ascii=False, separators=(", ", ": "))
    except ValueError:
        text = arguments
    return text if len(text) <= ARGS_CHARS else text[:ARGS_CHARS - 1] + "…"


def state_text(row: ChatRow) -> str:
    """What the header says about the call."""
    return _STATES.get(row.tool_state, row.tool_state)


def size_text(n: int) -> str:
    """A byte count for people: 5 bytes, 12.3 KB, 1.0 MB (1000-based, as file managers show)."""
    if n < 1000:
        return f"{n} byte" + ("" if n == 1 else "s")
    return f"{n / 1000:.1f} KB" if n < 1_000_000 else f"{n / 1_000_000:.1f} MB"


def result_preview(text: str) -> str:
    """The result as the widget shows it: whole up to ``PREVIEW_CHARS``, else its beginning and a note."""
    if len(text) <= PREVIEW_CHARS:
        return text
    return (text[:PREVIEW_CHARS] + f"\n\n[shown here: the first {PREVIEW_CHARS:,} characters of "
            f"{len(text):,}; the whole result is kept in the conversation]")


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class ToolCallWidget(QFrame):
    """One tool call. Emits ``action(name, row)``: ``allow_once``, ``allow_always`` or ``deny``."""

    action = Signal(str, object)

    def __init__(self, row: ChatRow, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.row = row
        self.setObjectName("toolCall")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        self.header = QLabel(textFormat=Qt.TextFormat.RichText, wordWrap=True)
        self.args = QLabel(wordWrap=True, textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse)
        self.args.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.notice = QLabel(wordWrap=True, objectName="errorText")
        self.toggle = QToolButton(checkable=True, autoRaise=True)
        self.toggle.toggled.connect(self._toggle)
        self.result = QPlainTextEdit(readOnly=True, visible=False)
        self.result.setAccessibleName("Tool result")
        self.result.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.result.setMaximumHeight(RESULT_MAX_PX)
        for w in (self.header, self.args):
            lay.addWidget(w)
        lay.addLayout(self._asking_bar())
        for w in (self.notice, self.toggle, self.result):
            lay.addWidget(w)
        self.render()

    def _asking_bar(self) -> QHBoxLayout:
        h = QHBoxLayout()
        self.ask_label = QLabel("Allow this call?")
        h.addWidget(self.ask_label)
        self.buttons: dict[str, QPushButton] = {}
        for name, text in (("allow_once", "Allow once"), ("allow_always", "Always allow"), ("deny", "Deny")):
            b = QPushButton(text)
            b.clicked.connect(lambda _=False, n=name: self.action.emit(n, self.row))
            h.addWidget(b)
            self.buttons[name] = b
        h.addStretch(1)
        return h

    def _toggle(self, on: bool) -> None:
        self.result.setVisible(on)
        if on and not self.result.toPlainText():
            self._fill()
        self._toggle_text()

    def _fill(self) -> None:
        """The result into its box, which is as tall as its lines up to ``RESULT_MAX_PX``."""
        text = result_preview(self.row.content)
        self.result.setPlainText(text)
        n = min(text.count("\n") + 1 + len(text) // 100, 40)
        self.result.setFixedHeight(min(RESULT_MAX_PX, self.result.fontMetrics().lineSpacing() * n + 14))

    def _toggle_text(self) -> None:
        arrow = "▾" if self.toggle.isChecked() else "▸"
        note = " · cut in the prompt" if self.row.prompt_note else ""
        self.toggle.setText(f"Result {arrow} ({size_text(self.row.size_bytes)}{note})")
        self.toggle.setAccessibleName(f"Result ({size_text(self.row.size_bytes)}{note})")  # the arrow: its state
        self.toggle.setToolTip(self.row.prompt_note or "")

    def set_row(self, row: ChatRow) -> None:
        """Show ``row`` (the same call, further along), keeping the result expanded if it was."""
        if row.content != self.row.content:
            self.result.clear()
        self.row = row
        self.render()
        if self.toggle.isChecked() and not self.result.toPlainText():
            self._fill()

    def render(self) -> None:
        """Draw the row: header, arguments, the permission bar while asking, the notice, the result toggle."""
        r = self.row
        where = f"{_esc(r.server)} › {_esc(r.tool)}" if r.server else _esc(r.tool or r.tool_name)
        self.header.setText(f"<b>Tool</b> <code>{where}</code> <i>— {_esc(state_text(r))}</i>")
        self.args.setText(arguments_text(r.arguments))
        asking = r.tool_state == "asking"
        self.ask_label.setVisible(asking)
        for b in self.buttons.values():
            b.setVisible(asking)
        self.notice.setText(r.notice or "")
        self.notice.setVisible(bool(r.notice) and r.tool_state in ("error", "denied", "failed"))
        done = r.tool_state not in ("asking", "running")
        self.toggle.setVisible(done)
        self._toggle_text()
