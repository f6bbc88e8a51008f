"""Markdown in the chat (app.ui.markdown, chat_view.MarkdownView): Pygments colours in the theme's style, a
copy link per closed code block that puts the block's exact code on the clipboard."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication, QTextCursor

from app.ui import theme
from app.ui.markdown import code_blocks, highlight_spans, with_copy_links

pytestmark = pytest.mark.gui

CODE = "def add(a, b):\n    return a + b  # sum  \n"
ANSWER = f"Here:\n\n```python\n{CODE}```\n\nand a shell line:\n\n```sh\necho 'hi'\n```\n"


def test_highlight_spans_cover_keywords_in_the_style():
    spans = highlight_spans(CODE, "python", "friendly")
    assert spans and all(s.start + s.length <= len(CODE) for s in spans)
    words = {CODE[s.start:s.start + s.length]: s for s in spans}
    assert words["def"].color and words["def"].bold
    assert "# sum" in "".join(CODE[s.start:s.start + s.length] for s in spans if s.italic)
    assert highlight_spans(CODE, "python", "github-dark") != spans  # the dark theme's colours
    assert highlight_spans(CODE, None, "friendly") == [] and highlight_spans(CODE, "nosuchlang", "friendly") == []


def test_copy_links_follow_closed_blocks_only():
    md, blocks = with_copy_links(ANSWER)
    assert blocks == [CODE.rstrip("\n"), "echo 'hi'"]
    assert md.count("hearth-copy:") == 2
    assert code_blocks("```python\nstill streaming") == []


def _char_color(view, text: str) -> str:
    doc = view.document()
    pos = doc.toPlainText().index(text)
    cur = QTextCursor(doc)
    cur.setPosition(pos + 1)
    return cur.charFormat().foreground().color().name()


def test_view_highlights_and_copy_puts_the_exact_code_on_the_clipboard(qtbot, qapp):
    from app.ui.chat_view import MarkdownView

    theme.manager().set_mode("light")
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_content(ANSWER)
    plain = _char_color(view, "Here")
    assert _char_color(view, "def") != plain and _char_color(view, "return") != plain
    assert "Copy code" in view.document().toPlainText()
    QGuiApplication.clipboard().clear()
    view._anchor(QUrl("hearth-copy:0"))
    assert QGuiApplication.clipboard().text() == CODE.rstrip("\n")  # trailing spaces and indentation kept
    view._anchor(QUrl("hearth-copy:1"))
    assert QGuiApplication.clipboard().text() == "echo 'hi'"
    seen: list[str] = []
    view.link_activated.connect(seen.append)
    view._anchor(QUrl("cite:0"))
    assert seen == ["cite:0"]


def test_user_text_is_plain(qtbot):
    from app.ui.chat_view import MessageWidget
    from app.ui.models import ChatRow

    w = MessageWidget(ChatRow("u", "user", "**not bold** `x`"))
    qtbot.addWidget(w)
    assert w.body.document().toPlainText() == "**not bold** `x`"
