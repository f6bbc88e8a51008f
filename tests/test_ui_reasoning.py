"""Thinking in the desktop window (offscreen, pytest-qt), with the shared fake engine as the model (it treats
``<think>…</think>`` in its scripted reply as thinking when the request has ``reasoning``; these claims are
about the wiring; the bundled model's own thinking is tested through the turn pipeline in
tests/test_turn_pipeline.py).

The answer's thinking shows collapsed above it behind "Thinking… (N tokens)", counting up while it streams;
**Stop thinking** is shown only while thinking streams and ends it through the engine (the answer follows);
the status strip shows thinking tokens, answer tokens and TTFAT with its clock named; the effort picker is
stored per conversation and shown again when a conversation is reopened. Every test ends with no worker
left.
"""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from tests.fakes import FakeEngine

pytestmark = pytest.mark.gui

TURN_MS = 20_000
THINKING = "<think>" + "step by step " * 12 + "</think>The answer is 4."  # within max_tokens 256


def open_window(qtbot, reply, token_delay_s: float = 0.0):
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    w = MainWindow(ctx, autoload=False)
    qtbot.addWidget(w)
    w.show()
    ctx.engine.engine = FakeEngine(n_ctx=2048, reply=reply, token_delay_s=token_delay_s)
    ctx.engine._set_state("ready")
    return w


def close_window(w) -> None:
    ctx = w.ctx
    w.close()
    assert ctx.pool.pool.activeThreadCount() == 0 and ctx.pool.active == 0
    assert not [t for t in threading.enumerate() if t.name == "hearth-tool-call" and t.is_alive()]


def send(qtbot, w, text: str) -> None:
    w.chat.composer.setPlainText(text)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_Return)


def pick_effort(w, value: str) -> None:
    i = w.chat.effort.findData(value)
    w.chat.effort.setCurrentIndex(i)
    w.chat.effort.activated.emit(i)


def last_answer(w):
    from app.ui.chat_view import MessageWidget

    return [x for x in w.chat.widgets if isinstance(x, MessageWidget) and x.row.role == "assistant"][-1]


def idle(w) -> bool:
    return not w.ctx.chat.busy


@pytest.fixture
def window(qtbot):
    w = open_window(qtbot, lambda req: THINKING if req.reasoning is not None else "no thinking asked")
    yield w
    close_window(w)


def test_thinking_is_shown_collapsed_above_the_answer_and_the_strip_shows_its_metrics(qtbot, window) -> None:
    w = window
    pick_effort(w, "low")
    send(qtbot, w, "What is 2 + 2?")
    qtbot.waitUntil(lambda: idle(w) and last_answer(w).row.id is not None, timeout=TURN_MS)
    msg = last_answer(w)
    assert msg.row.content == "The answer is 4." and msg.body.toPlainText() == "The answer is 4."
    assert not msg.thinking.isHidden() and msg.reasoning.isHidden()  # collapsed
    tokens = msg.row.reasoning_tokens
    assert tokens and msg.thinking.text() == f"Thinking · {tokens} tokens ▸"
    msg.thinking.click()
    assert not msg.reasoning.isHidden() and "step by step" in msg.reasoning.toPlainText()
    assert msg.thinking.text().endswith("▾")
    stored = w.ctx.store.get_message(msg.row.id)
    assert stored.content == "The answer is 4." and w.ctx.store.reasoning_for(stored.id).tokens == tokens
    assert w.ctx.engine.engine.seen[-1].reasoning.budget.effort == "low"
    strip = w.status.thinking
    assert not strip.isHidden()
    assert strip.text().startswith(f"thinking {tokens} tok · answer {len('The answer is 4.')} tok · TTFAT ")
    assert "time to first answer token" in strip.toolTip()
    assert w.chat.stop_thinking_btn.isHidden()


def test_stop_thinking_is_shown_while_thinking_streams_and_ends_it(qtbot) -> None:
    w = open_window(qtbot, lambda req: THINKING, token_delay_s=0.01)
    try:
        pick_effort(w, "high")
        send(qtbot, w, "Think hard")
        qtbot.waitUntil(lambda: not w.chat.stop_thinking_btn.isHidden(), timeout=TURN_MS)
        qtbot.waitUntil(lambda: last_answer(w).thinking.text().startswith("Thinking… ("), timeout=TURN_MS)
        assert last_answer(w).row.content == "" and last_answer(w).reasoning.isHidden()
        qtbot.mouseClick(w.chat.stop_thinking_btn, Qt.MouseButton.LeftButton)
        assert w.chat.stop_thinking_btn.isHidden()
        qtbot.waitUntil(lambda: idle(w) and last_answer(w).row.id is not None, timeout=TURN_MS)
        msg = last_answer(w)
        assert msg.row.content == "The answer is 4."
        assert len(msg.row.reasoning) < len("step by step " * 12) - 20  # ended well before the script's end
        assert msg.row.reasoning_note == "stopped by you" and "stopped by you" in msg.thinking.text()
        r = w.ctx.store.reasoning_for(msg.row.id)
        assert (r.stopped_by, r.forced) == ("user", True)
        assert w.chat.stop_thinking_btn.isHidden()
    finally:
        close_window(w)


def test_no_thinking_no_expander_and_no_button(qtbot, window) -> None:
    w = window
    send(qtbot, w, "hello")  # auto, and no model default: the request asks for no thinking
    qtbot.waitUntil(lambda: idle(w) and last_answer(w).row.id is not None, timeout=TURN_MS)
    msg = last_answer(w)
    assert msg.row.content == "no thinking asked" and msg.thinking.isHidden()
    assert w.status.thinking.isHidden() and w.chat.stop_thinking_btn.isHidden()
    assert w.ctx.engine.engine.seen[-1].reasoning is None


def test_the_effort_is_stored_per_conversation_and_shown_again(qtbot, window) -> None:
    w = window
    pick_effort(w, "medium")
    send(qtbot, w, "first chat")
    qtbot.waitUntil(lambda: idle(w) and last_answer(w).row.id is not None, timeout=TURN_MS)
    first = w.conversation_id
    w.new_chat()
    assert w.chat.effort.currentData() == ""  # a new chat starts on the model's default
    pick_effort(w, "none")
    send(qtbot, w, "second chat")
    qtbot.waitUntil(lambda: idle(w) and last_answer(w).row.id is not None, timeout=TURN_MS)
    second = w.conversation_id
    assert w.ctx.engine.engine.seen[-1].reasoning.budget.off
    assert last_answer(w).thinking.isHidden()  # budget 0: the fake model's thinking is cut at once, none shown
    store = w.ctx.store
    assert store.reasoning_settings(first).effort == "medium" and store.reasoning_settings(second).effort == "none"
    w.open_conversation(first)
    assert w.chat.effort.currentData() == "medium"
    w.open_conversation(second)
    assert w.chat.effort.currentData() == "none"
    pick_effort(w, "")
    assert store.reasoning_settings(second).effort is None and "reasoning" not in store.get_conversation(
        second).settings
    store.set_reasoning_settings(first, {"reasoning_budget": 300})
    w.open_conversation(first)
    assert w.chat.effort.currentText() == "300 tokens"


def test_the_model_default_comes_from_settings(qtbot, window) -> None:
    from dataclasses import replace

    w = window
    model = "fake-model"
    w.ctx.settings = replace(w.ctx.settings, per_model={model: {"reasoning_effort": "low", "n_ctx": 2048}})
    send(qtbot, w, "default?")
    qtbot.waitUntil(lambda: idle(w) and last_answer(w).row.id is not None, timeout=TURN_MS)
    b = w.ctx.engine.engine.seen[-1].reasoning.budget
    assert (b.effort, b.source) == ("low", "model")
    assert not last_answer(w).thinking.isHidden()


def test_the_expander_and_note_texts() -> None:
    from app.ui.formatting import reasoning_note, thinking_label

    assert thinking_label(12, True, False) == "Thinking… (12 tokens)"
    assert thinking_label(None, True, False) == "Thinking…"
    assert thinking_label(1, False, False) == "Thinking · 1 token ▸"
    assert thinking_label(40, False, True, "budget reached") == "Thinking · 40 tokens · budget reached ▾"
    assert [reasoning_note(s) for s in ("budget", "deadline", "user", None)] == [
        "budget reached", "time limit reached", "stopped by you", ""]
    assert reasoning_note(None, unclosed=True) == "never closed"


def test_self_consistency_mode_shows_the_majority_and_its_agreement(qtbot) -> None:
    from dataclasses import replace

    w = open_window(qtbot, lambda req: f"The answer is {5 if req.decoding.seed % 3 == 0 else 4}.")
    try:
        s = w.ctx.settings
        w.ctx.settings = replace(s, decoding=s.decoding.updated(temperature=0.7, seed=10))  # seeds 10, 11, 12
        i = w.chat.samples.findData(3)
        w.chat.samples.setCurrentIndex(i)
        w.chat.samples.activated.emit(i)
        send(qtbot, w, "What is 2 + 2?")
        qtbot.waitUntil(lambda: idle(w) and last_answer(w).row.id is not None, timeout=TURN_MS)
        msg = last_answer(w)
        assert msg.row.content == "The answer is 4."
        assert msg.agreement.text() == "Self-consistency: 2 of 3 samples agree on 4 (agreement 67%)"
        assert not msg.agreement.isHidden()
        assert len(w.ctx.engine.engine.seen) == 3
        vote = w.ctx.store.get_message(msg.row.id).meta["self_consistency"]
        assert (vote["n"], vote["answer"], vote["counts"]) == (3, "4", {"4": 2, "5": 1})
        w.ctx.settings = replace(s, decoding=s.decoding.updated(temperature=0.0))
        send(qtbot, w, "again, greedy")
        qtbot.waitUntil(lambda: idle(w), timeout=TURN_MS)
        assert "temperature" in w.error.text()  # greedy samples would all be one answer: refused, named
    finally:
        close_window(w)
