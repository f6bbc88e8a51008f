"""The chat view: message bubbles bound to a ``ChatModel``, and the composer.

The reasoning: docs/ui.md, 'app/ui/chat_view.py'.
"""

from __future__ import annotations

import re
from typing import Any

from PySide6.QtCore import QModelIndex, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QGuiApplication,
    QKeyEvent,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui import theme
from app.ui.a11y import is_tab_stop
from app.ui.formatting import file_name, thinking_label
from app.ui.markdown import copy_index, highlight_spans, with_copy_links
from app.ui.models import ChatModel, ChatRow
from app.ui.tool_view import ToolCallWidget

RENDER_INTERVAL_MS = 50
EFFORTS = (("auto (model default)", ""), ("none", "none"), ("low", "low"), ("medium", "medium"), ("high", "high"))


class MarkdownView(QTextBrowser):
    """Read-only rich text that grows to fit its content (no inner scroll bar)."""

    link_activated = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.blocks: list[str] = []
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.anchorClicked.connect(self._anchor)

    def set_content(self, text: str, markdown: bool = True) -> None:
        """Show ``text`` as Markdown (code blocks highlighted in the theme's colours, a copy link under each
        closed one) or as plain text."""
        if markdown:
            md, self.blocks = with_copy_links(text)
            self.setMarkdown(md)
            paint_code(self.document(), theme.current())
        else:
            self.setPlainText(text)
        self._fit()

    def _fit(self, *_: Any) -> None:
        self.document().setTextWidth(self.viewport().width())
        self.setFixedHeight(int(self.document().size().height()) + 4)

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        self._fit()

    def _anchor(self, url: QUrl) -> None:
        n = copy_index(url.toString())
        if n is not None and n < len(self.blocks):
            QGuiApplication.clipboard().setText(self.blocks[n])
        else:
            self.link_activated.emit(url.toString())


def search_terms(query: str) -> list[str]:
    """The words of a sidebar search (``Store.search``'s FTS5 query) to highlight: quotes, ``*``, parentheses
    and the operators AND / OR / NOT / NEAR dropped."""
    words = re.findall(r"[^\s\"()*^:]+", query)
    return [w for w in words if w not in ("AND", "OR", "NOT", "NEAR")]


def highlight_terms(view: QTextBrowser, terms: list[str]) -> int:
    """Mark every case-insensitive occurrence of ``terms`` in ``view`` (extra selections in the theme's
    accent colours, the document untouched); returns how many were marked."""
    c = theme.PALETTES[theme.current()]
    fmt = QTextCharFormat()
    fmt.setBackground(QColor(c.accent))
    fmt.setForeground(QColor(c.accent_text))
    marks = []
    doc = view.document()
    for term in terms:
        cursor = doc.find(term, 0)
        while not cursor.isNull():
            sel = QTextEdit.ExtraSelection()
            sel.cursor, sel.format = cursor, fmt
            marks.append(sel)
            cursor = doc.find(term, cursor)
    view.setExtraSelections(marks)
    return len(marks)


def _code_runs(doc: QTextDocument) -> list[list[Any]]:
    """Runs of consecutive code blocks (Qt marks a fenced block's lines with ``BlockCodeFence``)."""
    runs: list[list[Any]] = []
    block, last_code = doc.begin(), False
    while block.isValid():
        fmt = block.blockFormat()
        code = fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines()
        if code:
            if not last_code:
                runs.append([])
            runs[-1].append(block)
        last_code = code
        block = block.next()
    return runs


def paint_code(doc: QTextDocument, theme_name: str) -> None:
    """Give each code block of ``doc`` the theme's code background, a monospace font and Pygments colours for
    its fence's language (``highlight_spans``)."""
    style, background = theme.code_colors(theme_name)
    mono = QFont("monospace")
    mono.setStyleHint(QFont.StyleHint.Monospace)
    for run in _code_runs(doc):
        cursor = QTextCursor(doc)
        for block in run:
            cursor.setPosition(block.position())
            fmt = block.blockFormat()
            fmt.setBackground(QColor(background))
            fmt.setLeftMargin(theme.SPACE[1])
            cursor.setBlockFormat(fmt)
        start = run[0].position()
        language = run[0].blockFormat().property(QTextFormat.Property.BlockCodeLanguage)
        code = "\n".join(b.text() for b in run)
        for span in highlight_spans(code, str(language) if language else None, style):
            cursor.setPosition(start + span.start)
            cursor.setPosition(start + span.start + span.length, QTextCursor.MoveMode.KeepAnchor)
            cf = QTextCharFormat()
            if span.color:
                cf.setForeground(QColor(span.color))
            if span.bold:
                cf.setFontWeight(QFont.Weight.Bold)
            if span.italic:
                cf.setFontItalic(True)
            cursor.mergeCharFormat(cf)


class MessageWidget(QFrame):
    """One message: who, the text, thinking (collapsed), citations, and its actions."""

    action = Signal(str, object)  # (action name, ChatRow): copy, edit, regenerate, prev, next, cite:<n>

    def __init__(self, row: ChatRow, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.row = row
        self.setObjectName("assistantMessage" if row.role == "assistant" else "userMessage")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(theme.SPACE[3], theme.SPACE[1], theme.SPACE[3], theme.SPACE[0])
        lay.setSpacing(theme.SPACE[0])
        lay.addLayout(self._header())
        self.thinking = QToolButton(text="Thinking ▸", checkable=True, autoRaise=True)
        self.thinking.setObjectName("thinkingToggle")
        self.reasoning = MarkdownView()
        self.reasoning.setObjectName("reasoningText")
        self.reasoning.setAccessibleName("Thinking")
        # set apart from the answer: greyed behind a rule (QTextBrowser#reasoningText in app.ui.theme's sheet)
        self.reasoning.setVisible(False)
        self.thinking.toggled.connect(self._toggle_thinking)
        self.body = MarkdownView()
        self.body.setAccessibleName("Your message" if row.role == "user" else "Hearth's answer")
        self.body.link_activated.connect(lambda url: self.action.emit(url, self.row))
        self.citations = QLabel(wordWrap=True, textFormat=Qt.TextFormat.RichText)
        self.citations.linkActivated.connect(lambda url: self.action.emit(url, self.row))
        self.agreement = QLabel(wordWrap=True)
        self.agreement.setObjectName("agreement")
        for w in (self.thinking, self.reasoning, self.body, self.agreement, self.citations):
            lay.addWidget(w)
        lay.addWidget(self._actions())
        self.render()

    def _header(self) -> QHBoxLayout:
        h = QHBoxLayout()
        who = QLabel("You" if self.row.role == "user" else "Hearth")
        who.setObjectName("messageAuthor")
        self.status = QLabel()
        self.status.setObjectName("messageStatus")
        self.prev_btn = QToolButton(text="‹", autoRaise=True, toolTip="Previous branch")
        self.branch = QLabel()
        self.next_btn = QToolButton(text="›", autoRaise=True, toolTip="Next branch")
        self.prev_btn.setAccessibleName("Previous branch")
        self.next_btn.setAccessibleName("Next branch")
        self.prev_btn.clicked.connect(lambda: self.action.emit("prev", self.row))
        self.next_btn.clicked.connect(lambda: self.action.emit("next", self.row))
        for w in (who, self.status):
            h.addWidget(w)
        h.addStretch(1)
        for w in (self.prev_btn, self.branch, self.next_btn):
            h.addWidget(w)
        return h

    def _actions(self) -> QFrame:
        bar = QFrame()
        bar.setObjectName("messageActions")
        h = QHBoxLayout(bar)
        h.setContentsMargins(0, 0, 0, 0)
        h.addStretch(1)
        names = ["copy"] + (["edit"] if self.row.role == "user" else ["regenerate"])
        self.buttons = {}
        for name in names:
            b = QToolButton(text=name.capitalize(), autoRaise=True)
            b.clicked.connect(lambda _=False, n=name: self._act(n))
            h.addWidget(b)
            self.buttons[name] = b
        return bar

    def _act(self, name: str) -> None:
        if name == "copy":
            QGuiApplication.clipboard().setText(self.row.content)
        self.action.emit(name, self.row)

    def _toggle_thinking(self, on: bool) -> None:
        self.reasoning.setVisible(on)
        self._label_thinking()
        if on:
            self.reasoning.set_content(self.row.reasoning)

    def _label_thinking(self) -> None:
        r = self.row
        self.thinking.setText(thinking_label(r.reasoning_tokens, r.thinking and r.streaming,
                                             self.thinking.isChecked(), r.reasoning_note))
        self.thinking.setAccessibleName(self.thinking.text().rstrip(" ▸▾"))  # open or not: its checked state

    def set_row(self, row: ChatRow) -> None:
        self.row = row
        self.render()

    def render(self) -> None:
        r = self.row
        self.body.set_content(r.content or ("…" if r.streaming else ""), markdown=r.role == "assistant")
        if (r.citations or r.attributions) and not r.streaming:
            notice = theme.PALETTES[theme.current()].notice
            mark_unsupported(self.body.document(), unsupported_sentences(r.content, r.citations), notice)
            mark_unsupported(self.body.document(), attributed_sentences(r.content, r.citations, r.attributions),
                             notice, inline=True, tip="Not supported by the passages given")
        self.body.setVisible(bool(r.content or r.streaming or not r.tool_calls))
        self.thinking.setVisible(bool(r.reasoning))
        self._label_thinking()
        if r.reasoning and self.thinking.isChecked():  # collapsed thinking is laid out only when opened
            self.reasoning.set_content(r.reasoning)
        self.agreement.setText(r.agreement)
        self.agreement.setVisible(bool(r.agreement))
        self.status.setText(_status_text(r))
        pos, count = r.siblings
        for w in (self.prev_btn, self.branch, self.next_btn):
            w.setVisible(count > 1)
        self.branch.setText(f"{pos}/{count}")
        self.citations.clear()  # the same text set again keeps the links' colour of the theme before
        self.citations.setText(citations_html(r))
        self.citations.setVisible(bool(r.citations or r.retrieved))
        for b in self.buttons.values():
            b.setEnabled(not r.streaming and r.id is not None)


def _status_text(r: ChatRow) -> str:
    if r.streaming:
        return "<i>thinking…</i>" if r.thinking else "<i>writing…</i>"
    if r.tool_calls:
        n = len(r.tool_calls)
        return "<i>calls a tool</i>" if n == 1 else f"<i>calls {n} tools</i>"
    if r.status == "error":
        return "<i>stopped</i>" if r.content else "<i>no answer</i>"
    if r.status == "incomplete":
        return "<i>interrupted</i>"
    return ""


def citations_html(r: ChatRow) -> str:
    """The citation list under an answer: cited passages, else the passages the model was given. Each cited
    passage carries the citation check's mark (``citation_mark``)."""
    items, title = (r.citations, "Sources") if r.citations else (r.retrieved, "Passages given to the model "
                                                                           "(not cited)")
    if not items:
        return ""
    parts = []
    for n, c in enumerate(items):
        name = file_name(str(c.get("path", "")))
        page = f", page {c['page']}" if c.get("page") else ""
        quote = " ".join(str(c.get("quote") or c.get("text") or "").split())
        quote = quote if len(quote) <= 90 else quote[:89] + "…"
        mark = citation_mark(c) if r.citations else ""
        parts.append(f'<a href="cite:{n}">[{n + 1}] {name}{page}</a> — “{_esc(quote)}”{mark}')
    return f"<small><b>{title}</b><br>" + "<br>".join(parts) + "</small>"


def citation_mark(c: dict) -> str:
    """The citation check's mark after a source (rich text): ``supported`` True ``✓``; False, on a line of its
    own in the theme's notice colour, ``⚠ not supported: <reason>`` (each reason says what the cited passage
    lacks); absent or None (stored before the check existed) a muted "not checked"."""
    colors = theme.PALETTES[theme.current()]
    supported = c.get("supported")
    if supported is None:
        return f' <span style="color:{colors.muted}">· not checked</span>'
    if supported:
        return f' <span style="color:{colors.muted}">✓</span>'
    reason = str((c.get("support") or {}).get("reason") or "no reason recorded")
    return f'<br>&nbsp;&nbsp;<span style="color:{colors.notice}">⚠ not supported: {_esc(reason)}</span>'


def unsupported_sentences(content: str, citations: list[dict]) -> list[tuple[str, str]]:
    """``(text, reason)`` for each sentence of ``content`` that a citation marks unsupported, the text as the
    rendered Markdown shows it (its last line, emphasis and code marks dropped), once per sentence."""
    out: dict[str, str] = {}
    for c in citations:
        start, end = c.get("sentence_start"), c.get("sentence_end")
        if c.get("supported") is not False or start is None or end is None or not 0 <= start < end <= len(content):
            continue
        text = _shown(content[start:end])
        reason = str((c.get("support") or {}).get("reason") or "")
        if text and text not in out:
            out[text] = reason
        elif text and reason not in out[text]:
            out[text] += "; " + reason
    return list(out.items())


def attributed_sentences(content: str, citations: list[dict], attributions: list[dict]) -> list[tuple[str, str]]:
    """``(text, reason)`` for each sentence the attribution check marks unsupported (``supported`` False), as
    ``unsupported_sentences`` gives them, except a sentence the citation check covered: the passage the model
    named is the one its claim is judged by (docs/retrieval.md, "Attribution")."""
    checked = [(c["sentence_start"], c["sentence_end"]) for c in citations
               if c.get("supported") is not None and c.get("sentence_start") is not None]
    kept = [a for a in attributions if not any(a.get("sentence_start", 0) < e and s < a.get("sentence_end", 0)
                                                for s, e in checked)]
    return unsupported_sentences(content, kept)


def _shown(raw: str) -> str:
    """A sentence of the Markdown source as the rendered text shows it: its last line, emphasis and code marks
    and a list bullet dropped."""
    text = raw.strip().splitlines()[-1] if raw.strip() else ""
    return _MD_MARKS.sub("", text).strip().lstrip("-*+ ").strip()


_MD_MARKS = re.compile(r"\*\*|__|\*|`")


def mark_unsupported(doc: QTextDocument, sentences: list[tuple[str, str]], color: str, *, inline: bool = False,
                     tip: str = "Not supported by the cited passage") -> int:
    """Underline (wavy, ``color``) each of ``sentences`` (``unsupported_sentences``) where ``doc`` shows it,
    with ``tip: reason`` as the tooltip; ``inline``: also write "⚠ <reason>" in ``color`` right after it. A
    sentence the rendering changed beyond finding is left as it is. Returns how many were marked."""
    marked = 0
    for text, reason in sentences:
        cursor = doc.find(text, 0, QTextDocument.FindFlag.FindCaseSensitively)
        if cursor.isNull():
            continue
        cf = QTextCharFormat()
        cf.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
        cf.setUnderlineColor(QColor(color))
        cf.setToolTip(f"{tip}: {reason}")
        cursor.mergeCharFormat(cf)
        if inline:
            note = QTextCharFormat()
            note.setForeground(QColor(color))
            note.setToolTip(f"{tip}: {reason}")
            after = QTextCursor(doc)
            after.setPosition(cursor.selectionEnd())
            after.insertText(f" ⚠ {reason}", note)
        marked += 1
    return marked


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def tab_stops(widget: QWidget) -> list[QWidget]:
    """The widgets under ``widget`` that Tab stops at, in the order they were laid out (a text view's own
    parts, e.g. its viewport, left out)."""
    found: list[QWidget] = []
    for w in widget.findChildren(QWidget):  # depth first: a view comes before its parts
        if is_tab_stop(w) and not any(s.isAncestorOf(w) for s in found):
            found.append(w)
    return found


class Composer(QPlainTextEdit):
    """The message box: Enter sends, Shift+Enter starts a new line."""

    submit = Signal()

    def keyPressEvent(self, e: QKeyEvent) -> None:  # noqa: N802 - Qt API
        enter = e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not (e.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self.submit.emit()
            return
        super().keyPressEvent(e)


class ChatView(QWidget):
    """Bubbles for the rows of ``model`` plus the composer. Emits ``send(text)``, ``stop()`` and
    ``message_action(name, ChatRow)``."""

    send = Signal(str)
    stop = Signal()
    stop_thinking = Signal()
    effort_changed = Signal(str)
    samples_changed = Signal(int)
    message_action = Signal(str, object)

    def __init__(self, model: ChatModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.widgets: list[MessageWidget | ToolCallWidget] = []
        self._dirty: set[int] = set()
        self._timer = QTimer(self, interval=RENDER_INTERVAL_MS, singleShot=True)
        self._timer.timeout.connect(self._render_dirty)
        self._end_timer = QTimer(self, interval=0, singleShot=True)
        self._end_timer.timeout.connect(self._jump_to_end)
        self._build()
        theme.manager().changed.connect(self._restyle)
        model.modelReset.connect(self._rebuild)
        model.rowsInserted.connect(self._inserted)
        model.dataChanged.connect(self._changed)

    def _build(self) -> None:
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(theme.SPACE[1])
        self.scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.scroll.setObjectName("chatScroll")
        self.scroll.setAccessibleName("Conversation")  # a Tab stop: the arrow keys scroll the messages
        self.container = QWidget()
        self.container.setObjectName("chatColumn")
        self.column = QVBoxLayout(self.container)
        self.column.setContentsMargins(theme.SPACE[1], theme.SPACE[1], theme.SPACE[1], theme.SPACE[1])
        self.column.setSpacing(theme.SPACE[2])
        self.column.addStretch(1)
        self.scroll.setWidget(self.container)
        lay.addWidget(self.scroll, 1)
        self.edit_bar = QLabel(visible=False)
        lay.addWidget(self.edit_bar)
        row = QHBoxLayout()
        self.composer = Composer(placeholderText="Message Hearth (Enter sends, Shift+Enter new line)",
                                 tabChangesFocus=True)
        self.composer.setObjectName("composer")
        self.composer.setAccessibleName("Message to the model")
        self.composer.setFixedHeight(76)
        self.composer.submit.connect(self._submit)
        self.send_btn = QPushButton("Send")
        self.send_btn.setObjectName("sendButton")
        self.send_btn.clicked.connect(self._submit)
        self.stop_btn = QPushButton("Stop", enabled=False, toolTip="Stop the answer (Esc)")
        self.stop_btn.clicked.connect(self.stop.emit)
        self.stop_thinking_btn = QPushButton("Stop thinking", visible=False,
                                             toolTip="End the thinking now: the model answers at once")
        self.stop_thinking_btn.setObjectName("stopThinking")
        self.stop_thinking_btn.clicked.connect(self.stop_thinking.emit)
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        for b in (self.send_btn, self.stop_btn, self.stop_thinking_btn):
            buttons.addWidget(b)
        row.addLayout(buttons)
        self._options()
        lay.addLayout(row)

    def _options(self) -> None:
        """The conversation's thinking effort and the self-consistency samples: the view keeps their state and
        signals; the window lays them out in the chat panel (``app.ui.chat_panel``)."""
        self.effort = QComboBox(toolTip="How much the model may think before it answers, for this conversation "
                                        "(auto: the model's default from settings.json)")
        self.effort.setObjectName("effortPicker")
        for label, value in EFFORTS:
            self.effort.addItem(label, value)
        self.effort.activated.connect(lambda i: self.effort_changed.emit(self.effort.itemData(i) or ""))
        self.samples = QComboBox(toolTip="Self-consistency: answer several times and keep the answer most "
                                         "samples agree on")
        self.samples.setObjectName("samplesPicker")
        for n in (1, 3, 5):
            self.samples.addItem(f"{n} sample" + ("" if n == 1 else "s"), n)
        self.samples.activated.connect(lambda i: self.samples_changed.emit(int(self.samples.itemData(i))))

    def show_effort(self, effort: str | None, budget_tokens: int | None = None) -> None:
        """Show a conversation's setting in the picker: an effort, an explicit token budget (an extra item),
        or neither (auto)."""
        i = self.effort.findData(effort or "")
        if effort is None and budget_tokens is not None:
            label = f"{budget_tokens} tokens"
            i = self.effort.findText(label)
            if i < 0:
                self.effort.addItem(label, f"tokens:{budget_tokens}")
                i = self.effort.count() - 1
        self.effort.setCurrentIndex(max(i, 0))

    def set_thinking(self, on: bool) -> None:
        """Thinking streams now: show Stop thinking (hidden again once the answer begins or the turn ends)."""
        self.stop_thinking_btn.setVisible(on)
        self.stop_thinking_btn.setEnabled(on)

    def _submit(self) -> None:
        text = self.composer.toPlainText().strip()
        if text and self.send_btn.isEnabled():
            self.send.emit(text)

    def set_busy(self, busy: bool) -> None:
        self.send_btn.setEnabled(not busy)
        self.stop_btn.setEnabled(busy)
        if not busy:
            self.set_thinking(False)

    def set_editing(self, text: str | None) -> None:
        """Show (or hide, with None) the "editing a message" note and put the text in the composer."""
        self.edit_bar.setVisible(text is not None)
        if text is not None:
            self.edit_bar.setText("<i>Editing a message: sending makes a new branch (Esc cancels)</i>")
            self.composer.setPlainText(text)
            self.composer.setFocus()

    def _restyle(self, _name: str) -> None:
        """The theme changed: render every message again (code colours are painted into the documents)."""
        for w in self.widgets:
            w.set_row(w.row)

    # -- model → widgets ----------------------------------------------------------------------------------
    def _rebuild(self) -> None:
        for w in self.widgets:
            self.column.removeWidget(w)
            w.deleteLater()
        self.widgets = []
        self._dirty.clear()
        for i in range(self.model.rowCount()):
            self._add(i)
        self._order_tabs(0, len(self.widgets))
        self._scroll_to_end()

    def _inserted(self, _parent: QModelIndex, first: int, last: int) -> None:
        for i in range(first, last + 1):
            self._add(i)
        self._order_tabs(first, last + 1)
        self._scroll_to_end()

    def _order_tabs(self, start: int, end: int) -> None:
        """Tab reads the chat in order: the scroll area, each message's stops top to bottom, then the composer
        (a message is made after the composer, so Tab would otherwise reach it last, after the panel). Puts
        the stops of messages ``start``..``end - 1`` after those of the messages before them."""
        before = (tab_stops(w) for w in reversed(self.widgets[:start]))
        prev: QWidget = next((stops[-1] for stops in before if stops), self.scroll)
        for w in self.widgets[start:end]:
            for stop in tab_stops(w):
                QWidget.setTabOrder(prev, stop)
                prev = stop

    def _add(self, i: int) -> None:
        row = self.model.item(i)
        w = (ToolCallWidget if row.role == "tool" else MessageWidget)(row, self.container)
        w.action.connect(self.message_action.emit)
        self.column.insertWidget(self.column.count() - 1, w)
        self.widgets.insert(i, w)

    def _changed(self, top: QModelIndex, bottom: QModelIndex, *_: Any) -> None:
        self._dirty.update(range(top.row(), bottom.row() + 1))
        if not self._timer.isActive():
            self._timer.start()

    def _render_dirty(self) -> None:
        bar = self.scroll.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 40
        for i in sorted(self._dirty):
            if i < len(self.widgets):
                self.widgets[i].set_row(self.model.item(i))
        self._dirty.clear()
        if at_end:
            self._scroll_to_end()

    def show_match(self, message_id: str, query: str) -> bool:
        """Scroll to the message ``message_id`` and highlight each word of the search ``query`` in it
        (case-insensitive; FTS syntax such as quotes and ``*`` dropped). False when it is not shown."""
        widget = next((w for w in self.widgets if getattr(w, "row", None) is not None and w.row.id == message_id
                       and hasattr(w, "body")), None)
        if widget is None:
            return False
        highlight_terms(widget.body, search_terms(query))
        self.scroll.ensureWidgetVisible(widget)
        return True

    def _scroll_to_end(self) -> None:
        self._end_timer.start()  # after the layout has taken the new sizes

    def _jump_to_end(self) -> None:
        bar = self.scroll.verticalScrollBar()
        bar.setValue(bar.maximum())
