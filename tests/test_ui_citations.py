"""The citation check in the desktop window (offscreen, pytest-qt, the shared fake engine as the model): an
answer's Sources list marks each cited passage (✓, "⚠ not supported: <reason>", or "not
checked" for a citation stored before the check), the unsupported sentence is underlined in the answer, and
a reopened conversation shows the same marks (they are stored with the citations). The check itself is the
real one (``app.retrieval.citecheck``), facts only: the documents here have no embedding model."""

from __future__ import annotations

import re
import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCharFormat, QTextCursor, QTextDocument

from app.ui.chat_view import MessageWidget, citations_html, unsupported_sentences
from app.ui.models import ChatRow
from tests.fakes import FakeEngine

pytestmark = pytest.mark.gui

TURN_MS = 20_000
FERRY = "Ferry timetable.\n\nThe ferry to Lindholm island leaves at 7:45 every morning from pier 4.\n"
SUPPORTED = "The ferry leaves from pier 4"
UNSUPPORTED = "It leaves at 9:15 on Sunday"


def cite_wrongly(req) -> str:
    """One sentence the passage supports and one with a time and a day it does not have, both citing it."""
    ids = re.findall(r"\[E:([0-9a-f]+)\]", req.messages[-1].content)
    if not ids:
        return "No passage was given."
    return f"{SUPPORTED} [E:{ids[0]}]. {UNSUPPORTED} [E:{ids[0]}]."


@pytest.fixture
def docs(tmp_path):
    from app.assistant import DocumentSource
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore

    (tmp_path / "ferries.txt").write_text(FERRY, encoding="utf-8")
    store = DocumentStore(tmp_path / "documents.db")
    Ingester(store).ingest([str(tmp_path / "ferries.txt")])
    source = DocumentSource(store, owns_store=True)  # no embedder: the facts check only
    yield source
    source.close()


@pytest.fixture
def window(qtbot, docs, tmp_path):
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    w = MainWindow(ctx, autoload=False)
    qtbot.addWidget(w)
    w.show()
    ctx.engine.engine = FakeEngine(n_ctx=2048, reply=cite_wrongly)
    ctx.engine._set_state("ready")
    ctx.chat.documents = lambda: docs  # the window's turns search these documents
    w.attach_documents([str(tmp_path / "ferries.txt")])  # as a drop on the chat does: this chat uses it
    yield w
    w.close()
    assert ctx.pool.pool.activeThreadCount() == 0 and ctx.pool.active == 0
    assert not [t for t in threading.enumerate() if t.name == "hearth-tool-call" and t.is_alive()]


def last_answer(w) -> MessageWidget:
    return [x for x in w.chat.widgets if isinstance(x, MessageWidget) and x.row.role == "assistant"][-1]


def underline_at(doc: QTextDocument, text: str) -> QTextCharFormat:
    """The character format in the middle of ``text`` as ``doc`` shows it."""
    cursor = doc.find(text)
    assert not cursor.isNull(), text
    mid = QTextCursor(doc)
    mid.setPosition((cursor.selectionStart() + cursor.selectionEnd()) // 2)
    return mid.charFormat()


def test_an_unsupported_sentence_is_marked_in_the_sources_and_the_answer_and_after_reopening(qtbot, window):
    w = window
    w.chat.composer.setPlainText("When does the ferry to Lindholm leave?")
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy and last_answer(w).row.id is not None, timeout=TURN_MS)
    cid = w.conversation_id
    for reopened in (False, True):  # as answered, then reopened from the store
        if reopened:
            w.new_chat()
            w.open_conversation(cid)
            qtbot.waitUntil(lambda: bool(last_answer(w).row.citations), timeout=2_000)
        msg = last_answer(w)
        good, bad = msg.row.citations
        assert (good["supported"], bad["supported"]) == (True, False)
        assert bad["support"]["reason"] == "not in the cited passage: 9:15, Sunday"
        html = msg.citations.text()
        assert "✓" in html and "⚠ not supported: not in the cited passage: 9:15, Sunday" in html
        fmt = underline_at(msg.body.document(), UNSUPPORTED)
        assert fmt.underlineStyle() == QTextCharFormat.UnderlineStyle.WaveUnderline
        assert "9:15, Sunday" in fmt.toolTip()
        plain = underline_at(msg.body.document(), SUPPORTED)
        assert plain.underlineStyle() == QTextCharFormat.UnderlineStyle.NoUnderline


def test_citations_stored_before_the_check_show_as_not_checked(qtbot):
    old = {"evidence_id": "ab12", "path": "/d/a.txt", "page": None, "quote": "It is 25 °C."}
    row = ChatRow("m1", "assistant", "It is 25 °C [E:ab12].", citations=[old])
    assert "not checked" in citations_html(row) and "⚠" not in citations_html(row)
    assert unsupported_sentences(row.content, row.citations) == []
    widget = MessageWidget(row)
    qtbot.addWidget(widget)
    fmt = underline_at(widget.body.document(), "It is 25")
    assert fmt.underlineStyle() == QTextCharFormat.UnderlineStyle.NoUnderline


def test_unsupported_sentences_as_the_markdown_shows_them():
    content = "Intro.\n\n- **Store** below 30 °C [E:a]. Fine [E:b]."
    bad = {"supported": False, "sentence_start": content.index("- **"), "sentence_end": content.index(" [E:a]"),
           "support": {"reason": "not in the cited passage: 30 °C"}}
    twice = {**bad, "support": {"reason": "another"}}
    good = {"supported": True, "sentence_start": content.index("Fine"), "sentence_end": content.index(" [E:b]")}
    assert unsupported_sentences(content, [bad, twice, good]) == [
        ("Store below 30 °C", "not in the cited passage: 30 °C; another")]
    assert unsupported_sentences(content, [{**bad, "sentence_end": 999}]) == []  # a span past the text: skipped


def test_passages_stay_under_every_answer_after_later_turns_and_reopening(qtbot, window):
    # Answers that cite nothing show the passages they were given; those vanished one turn later and after
    # reopening (only the newest answer had them: issue 27). They are stored with each answer now.
    w = window
    w.ctx.engine.engine.runtime.reply = lambda req: "No citation here."
    for question in ("When does the ferry to Lindholm leave?", "From which pier does the ferry leave?"):
        w.chat.composer.setPlainText(question)
        qtbot.keyClick(w.chat.composer, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: not w.ctx.chat.busy and last_answer(w).row.id is not None, timeout=TURN_MS)
    cid = w.conversation_id
    for reopened in (False, True):
        if reopened:
            w.new_chat()
            w.open_conversation(cid)
        answers = [x for x in w.chat.widgets if isinstance(x, MessageWidget) and x.row.role == "assistant"]
        assert len(answers) == 2
        for a in answers:
            assert a.row.retrieved and a.row.retrieved[0]["path"].endswith("ferries.txt")
            assert "pier 4" in a.row.retrieved[0]["text"] and "Passages given to the model" in a.citations.text()
    stored = w.ctx.store.get_message(answers[0].row.id).meta["evidence"]
    assert [p["evidence_id"] for p in stored] == [p["evidence_id"] for p in answers[0].row.retrieved]
