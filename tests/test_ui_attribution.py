"""Sentence attribution in the desktop window (offscreen, pytest-qt, the shared fake engine as the model): an
answer that cites nothing but states a wrong time gets the sentence underlined and "⚠ <reason>" written right
after it, from the attributions stored with the answer, so a reopened conversation shows the same mark. The
check is the real one (``app.retrieval.attribution``), word overlap and facts: no embedding model here."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCharFormat

from app.ui.chat_view import MessageWidget, attributed_sentences
from tests.fakes import FakeEngine
from tests.test_ui_citations import last_answer, underline_at

pytestmark = pytest.mark.gui

TURN_MS = 20_000
FERRY = "Ferry timetable.\n\nThe ferry to Lindholm island leaves at 7:45 every morning from pier 4.\n"
WRONG = "The ferry to Lindholm island leaves at 9:35 every morning"
RIGHT = "It goes from pier 4"
REASON = "9:35 is not in the passage; it says 7:45"


def uncited(req) -> str:
    """What the bundled base model does: an answer from the passage with no ``[E:id]``, one time wrong."""
    return f"{WRONG}. {RIGHT}." if "[E:" in req.messages[-1].content else "No passage was given."


@pytest.fixture
def window(qtbot, tmp_path):
    from app.assistant import DocumentSource
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    (tmp_path / "ferries.txt").write_text(FERRY, encoding="utf-8")
    store = DocumentStore(tmp_path / "documents.db")
    Ingester(store).ingest([str(tmp_path / "ferries.txt")])
    docs = DocumentSource(store, owns_store=True)  # no embedder: word overlap and facts
    ctx = AppContext()
    w = MainWindow(ctx, autoload=False)
    qtbot.addWidget(w)
    w.show()
    ctx.engine.engine = FakeEngine(n_ctx=2048, reply=uncited)
    ctx.engine._set_state("ready")
    ctx.chat.documents = lambda: docs
    w.attach_documents([str(tmp_path / "ferries.txt")])
    yield w
    w.close()
    docs.close()
    assert ctx.pool.pool.activeThreadCount() == 0 and ctx.pool.active == 0
    assert not [t for t in threading.enumerate() if t.name == "hearth-tool-call" and t.is_alive()]


def test_an_uncited_wrong_time_is_marked_inline_with_the_reason_also_after_reopening(qtbot, window):
    w = window
    w.chat.composer.setPlainText("When does the ferry to Lindholm leave?")
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy and last_answer(w).row.id is not None, timeout=TURN_MS)
    cid = w.conversation_id
    for reopened in (False, True):  # as answered, then reopened from the store
        if reopened:
            w.new_chat()
            w.open_conversation(cid)
            qtbot.waitUntil(lambda: bool(last_answer(w).row.attributions), timeout=2_000)
        msg = last_answer(w)
        assert msg.row.citations == []  # nothing cited: the citation check had nothing to check
        wrong, right = msg.row.attributions
        assert (wrong["supported"], right["supported"]) == (False, True)
        shown = msg.body.document().toPlainText()
        assert f"{WRONG}. ⚠ {REASON} {RIGHT}." in shown  # the mark right after the sentence
        fmt = underline_at(msg.body.document(), WRONG)
        assert fmt.underlineStyle() == QTextCharFormat.UnderlineStyle.WaveUnderline
        assert fmt.toolTip() == f"Not supported by the passages given: {REASON}"
        plain = underline_at(msg.body.document(), RIGHT)
        assert plain.underlineStyle() == QTextCharFormat.UnderlineStyle.NoUnderline
        assert shown.count("⚠") == 1


def test_a_sentence_the_citation_check_covered_is_judged_by_its_citation():
    content = "It leaves at 9:35 [E:ab12]. It costs £14."
    cited = {"supported": True, "sentence_start": 0, "sentence_end": content.index(" [E:")}
    attrs = [{"supported": False, "sentence_start": 0, "sentence_end": content.index("."),
              "support": {"reason": "9:35 is not in the passage; it says 7:45"}},
             {"supported": False, "sentence_start": content.index("It costs"), "sentence_end": len(content),
              "support": {"reason": "£14 is not in the passage; it says £12"}}]
    assert attributed_sentences(content, [cited], attrs) == [("It costs £14.", "£14 is not in the passage; "
                                                                                "it says £12")]
    assert len(attributed_sentences(content, [], attrs)) == 2


def test_a_message_without_attributions_is_not_marked(qtbot):
    from app.ui.models import ChatRow

    widget = MessageWidget(ChatRow("m1", "assistant", "It leaves at 9:35."))
    qtbot.addWidget(widget)
    assert "⚠" not in widget.body.document().toPlainText()
