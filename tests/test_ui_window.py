"""The real window (offscreen) with the real bundled model: streaming, Stop, a truncated GGUF, a dropped
document, settings across a restart. Kept few and lean: the model is small and each test loads it once
(about a second). Every test ends with no worker thread running and no engine process left."""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app import paths
from app.protocol.types import DecodingParams, LoadSettings
from app.settings import UserSettings, load_user_settings, save_user_settings

pytestmark = [pytest.mark.model, pytest.mark.gui]
LOAD_MS = 60_000
ANSWER_MS = 120_000


@pytest.fixture
def home_with_model(bundled_model: Path, embedding_model: Path) -> Path:
    """HEARTH_HOME with the bundled model and the embedding model linked in (not assembled again) and greedy,
    short answers."""
    from app.retrieval.embed_model import default_embedding_model_path

    link = paths.bundled_model_path()
    if not link.exists():
        link.symlink_to(bundled_model)
    emb = default_embedding_model_path()
    emb.parent.mkdir(parents=True, exist_ok=True)
    if not emb.exists():
        emb.symlink_to(embedding_model)
    save_user_settings(UserSettings(load=LoadSettings(n_ctx=2048),
                                    decoding=DecodingParams(temperature=0.0, max_tokens=48)))
    return paths.home()


def open_window(qtbot):
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    w = MainWindow(ctx)
    w.show()
    qtbot.waitUntil(lambda: ctx.engine.state == "ready", timeout=LOAD_MS)
    return w


def close_window(w) -> None:
    ctx = w.ctx
    w.close()
    assert ctx.pool.pool.activeThreadCount() == 0 and ctx.pool.active == 0
    assert not [p for p in multiprocessing.active_children() if p.name in ("hearth-engine", "hearth-embedder")]
    assert not [t for t in threading.enumerate() if t.name == "hearth-http"]


@pytest.fixture
def window(qtbot, home_with_model):
    w = open_window(qtbot)
    yield w
    close_window(w)


def ask(qtbot, w, text: str) -> None:
    """Type ``text`` and press Enter, as a person would."""
    w.chat.composer.setFocus()
    qtbot.keyClicks(w.chat.composer, text)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_Return)


def drop(widget, files: list[Path]) -> None:
    """Drag ``files`` onto ``widget`` and drop them (Qt delivers a drop only after an accepted drag-enter)."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(f)) for f in files])
    action, button, mods = Qt.DropAction.CopyAction, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(QPoint(10, 10), action, mime, button, mods)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted()
    QApplication.sendEvent(widget, QDropEvent(QPointF(10, 10), action, mime, button, mods))


def test_send_streams_the_answer(qtbot, window):
    w, deltas = window, []
    w.ctx.chat.delta.connect(deltas.append)
    ask(qtbot, w, "What is the capital of France?")
    assert w.ctx.chat.busy and w.chat_model.item(1).streaming
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    rows = w.chat_model.items()
    assert [r.role for r in rows] == ["user", "assistant"] and rows[1].status == "complete"
    assert len(deltas) >= 2 and "".join(deltas).strip() == rows[1].content.strip()
    assert "Paris" in rows[1].content
    assert "Paris" in w.chat.widgets[1].body.toPlainText()  # rendered in the bubble
    assert w.status.ttft.text().startswith("TTFT ") and "ms" in w.status.ttft.text()
    assert w.status.context.value() > 0 and "Your message" in w.status.context.toolTip()
    stored = w.ctx.store.list_conversations()
    assert len(stored) == 1 and stored[0].title.startswith("What is the capital")


def test_stop_mid_answer_then_chat_again(qtbot, window):
    w = window
    w.ctx.settings = replace(w.ctx.settings, decoding=replace(w.ctx.settings.decoding, max_tokens=400))
    first: list[str] = []
    w.ctx.chat.delta.connect(first.append)
    ask(qtbot, w, "Count from 1 to 300, separated by commas: 1, 2, 3,")
    qtbot.waitUntil(lambda: len(first) >= 3, timeout=ANSWER_MS)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_Escape)  # Esc stops
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=10_000)
    answer = w.chat_model.items()[-1]
    assert answer.status == "error" and answer.content  # kept, marked stopped
    assert "stopped" in w.chat.widgets[-1].status.text()
    assert w.ctx.engine.engine.stats.cancelled >= 1
    ask(qtbot, w, "What is the capital of France?")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    assert w.chat_model.items()[-1].status == "complete" and "Paris" in w.chat_model.items()[-1].content


def test_truncated_gguf_shows_its_error_and_chat_still_works(qtbot, window, bundled_model, tmp_path):
    w = window
    broken = tmp_path / "broken-model.gguf"
    with open(bundled_model, "rb") as src:
        broken.write_bytes(src.read(5_000_000))
    drop(w.models, [broken])  # a dropped file is linked into the models folder, not copied
    link = paths.models_dir() / "broken-model.gguf"
    assert link.is_symlink()
    qtbot.waitUntil(lambda: w.models.model.row_of_path(str(link)) >= 0, timeout=10_000)
    w.models.select_path(str(link))
    assert "truncated" in w.models.details.text()  # shown before loading
    w.models.load_btn.click()
    qtbot.waitUntil(lambda: not w.models.error.isHidden(), timeout=LOAD_MS)
    assert "truncated" in w.models.error.text() and "broken-model.gguf" in w.models.error.text()
    assert w.ctx.engine.state == "ready" and Path(w.ctx.engine.job.path).name == bundled_model.name
    ask(qtbot, w, "What is the capital of France?")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    assert "Paris" in w.chat_model.items()[-1].content


def test_a_truncated_gguf_is_not_the_next_start_model(qtbot, home_with_model, bundled_model, tmp_path):
    """Issue 27: a failed load was saved as the startup model, and every later start had no model."""
    w = open_window(qtbot)
    broken = tmp_path / "broken-model.gguf"
    with open(bundled_model, "rb") as src:
        broken.write_bytes(src.read(5_000_000))
    w.ctx.load_model(str(broken), "broken-model")
    qtbot.waitUntil(lambda: not w.models.error.isHidden() and w.ctx.engine.state == "ready", timeout=LOAD_MS)
    close_window(w)
    assert load_user_settings().model is None  # still the bundled one
    w = open_window(qtbot)  # "restart"
    try:
        assert Path(w.ctx.engine.job.path).name == bundled_model.name and w.chat.send_btn.isEnabled()
    finally:
        close_window(w)


def test_dropped_text_file_is_indexed_and_used(qtbot, window, tmp_path):
    w = window
    if not w.ctx.docs.available:
        pytest.skip("app.retrieval is not in this build")
    doc = tmp_path / "ferries.txt"
    doc.write_text("Ferry timetable.\n\nThe ferry to Lindholm island leaves at 7:45 every morning from pier 4.\n")
    drop(w, [doc])  # onto the chat: indexed, and attached to this chat only
    qtbot.waitUntil(lambda: w.documents.model.row_of(str(doc)) >= 0 and not w.ctx.docs.busy, timeout=60_000)
    row = w.documents.model.item(w.documents.model.row_of(str(doc)))
    assert row.status == "indexed" and row.chunks >= 1
    assert "indexed" in w.documents.model.index(w.documents.model.row_of(str(doc))).data()
    assert w.header.documents.text() == "▤ Documents: 1" and "ferries.txt" in w.header.documents.toolTip()
    ask(qtbot, w, "When does the ferry to Lindholm leave?")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    answer = w.chat_model.items()[-1]
    assert answer.citations or answer.retrieved  # the passage went to the model and is listed under the answer
    qtbot.waitUntil(lambda: "ferries.txt" in w.chat.widgets[-1].citations.text(), timeout=2_000)  # rendered
    assert w.ctx.conversation_documents(w.conversation_id) == [str(doc)]
    # Another chat is not given it (every indexed document went into every new chat: issue 27)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert not w.header.documents.isVisibleTo(w) and w.documents.model.selected_paths() == []
    ask(qtbot, w, "Tell me a story about a dragon.")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    other = w.chat_model.items()[-1]
    assert not other.citations and not other.retrieved and w.ctx.conversation_documents(w.conversation_id) == []
    # A drop onto the documents page adds to the library only
    doc2 = tmp_path / "cake.txt"
    doc2.write_text("Lemon cake.\n\nBeat the butter and sugar, then fold in the lemon zest.\n")
    drop(w.documents, [doc2])
    qtbot.waitUntil(lambda: w.documents.model.row_of(str(doc2)) >= 0 and not w.ctx.docs.busy, timeout=60_000)
    assert w.ctx.conversation_documents(w.conversation_id) == []


def test_setting_survives_a_restart_and_reloads_the_engine(qtbot, home_with_model):
    w = open_window(qtbot)
    w.open_settings()
    page = w.settings_page
    assert w.current_page() == "settings"
    page.n_ctx.setValue(1024)
    page.temperature.setValue(0.5)
    page.system_prompt.setPlainText("Answer in one word.")
    qtbot.waitUntil(lambda: w.ctx.settings.decoding.temperature == 0.5
                    and w.ctx.settings.system_prompt == "Answer in one word.", timeout=5_000)  # live
    assert w.ctx.engine.engine.settings.n_ctx != 1024 and "reload" in page.note.text()  # waits for Apply
    qtbot.mouseClick(page.apply_btn, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready" and w.ctx.engine.engine is not None
                    and w.ctx.engine.engine.settings.n_ctx == 1024, timeout=LOAD_MS)  # applied = reloaded
    close_window(w)
    saved = load_user_settings()
    assert saved.load.n_ctx == 1024 and saved.decoding.temperature == 0.5
    w2 = open_window(qtbot)  # "relaunch"
    try:
        assert w2.ctx.engine.engine.settings.n_ctx == 1024

        w2.open_settings()
        dlg = w2.settings_page
        assert dlg.n_ctx.value() == 1024 and dlg.temperature.value() == 0.5
        assert dlg.system_prompt.toPlainText() == "Answer in one word."
    finally:
        close_window(w2)


def test_port_panel_serves_the_loaded_model(qtbot, window):
    import socket

    import httpx

    w = window
    if not w.ctx.server.available:
        pytest.skip("app.server is not in this build")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w.port.port.setValue(port)
    w.port._set_key("test-key-123")
    w.port.enabled.setChecked(True)  # applies: saved and started on a worker
    qtbot.waitUntil(lambda: w.ctx.server.running, timeout=20_000)
    assert w.port.url.text() == f"http://127.0.0.1:{port}/v1" and "Bearer test-key-123" in w.port.curl.toPlainText()
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8,
            "temperature": 0}
    answers: list = []
    w.ctx.pool.run(lambda: httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60,
                                      headers={"Authorization": "Bearer test-key-123"}), on_return=answers.append)
    qtbot.waitUntil(lambda: bool(answers), timeout=ANSWER_MS)
    assert answers[0].status_code == 200 and "Paris" in answers[0].json()["choices"][0]["message"]["content"]
    qtbot.waitUntil(lambda: w.port.requests.text().startswith("1 request"), timeout=5_000)
    # the window's documents and embedding model, as `hearth serve --documents --embeddings` serves them
    grounded = {**body, "hearth": {"documents": True}}
    embed = {"input": ["a ferry timetable"]}
    for path, payload in (("chat/completions", grounded), ("embeddings", embed)):
        w.ctx.pool.run(lambda p=path, b=payload: httpx.post(f"http://127.0.0.1:{port}/v1/{p}", json=b, timeout=60,
                                                            headers={"Authorization": "Bearer test-key-123"}),
                       on_return=answers.append)
    qtbot.waitUntil(lambda: len(answers) == 3, timeout=ANSWER_MS)
    by_path = {r.request.url.path: r for r in answers[1:]}
    chat_r, embed_r = by_path["/v1/chat/completions"], by_path["/v1/embeddings"]
    assert chat_r.status_code == 200 and chat_r.json()["hearth"]["evidence"] == []
    assert "no documents are indexed yet" in chat_r.json()["hearth"]["search_notice"]
    assert embed_r.status_code == 200 and len(embed_r.json()["data"][0]["embedding"]) == 384
    assert load_user_settings().server.enabled and load_user_settings().server.api_key == "test-key-123"


def test_edit_makes_a_branch_and_keys_work(qtbot, window):
    w = window
    ask(qtbot, w, "What is the capital of France?")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    user_row = w.chat_model.item(0)
    w.chat.widgets[0].buttons["edit"].click()  # Edit: the text goes back into the box
    assert w.chat.composer.toPlainText() == user_row.content and w.chat.edit_bar.isVisible()
    w.chat.composer.clear()
    ask(qtbot, w, "What is the capital of Italy?")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    rows = w.chat_model.items()
    assert len(rows) == 2 and rows[0].content.endswith("Italy?") and rows[0].siblings == (2, 2)
    assert "Rome" in rows[1].content
    w.chat.widgets[0].prev_btn.click()  # back to the first branch, nothing was overwritten
    rows = w.chat_model.items()
    assert rows[0].content.endswith("France?") and rows[0].siblings == (1, 2) and "Paris" in rows[1].content
    first_answer = w.chat_model.items()[-1].content
    w.chat.widgets[1].buttons["regenerate"].click()
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    answer = w.chat_model.items()[-1]
    assert answer.status == "complete"
    # The scripted engine answers the same text again: that is a second version, shown (it jumped back to the
    # first one and added none: issue 27).
    assert answer.content == first_answer and answer.siblings == (2, 2)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)  # Ctrl+N: new chat
    assert w.conversation_id is None and w.chat_model.rowCount() == 0
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)  # Ctrl+F: search
    assert w.sidebar.search.hasFocus()


def test_a_search_hit_opens_its_chat_at_the_match_highlighted(qtbot, window):
    w = window
    ask(qtbot, w, "What is the capital of France?")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    w.sidebar.search.setText("capital")
    qtbot.waitUntil(lambda: "result" in (w.sidebar.model.index(0).data() or ""), timeout=5_000)
    hit = w.sidebar.model.index(1)
    assert hit.data().startswith("What is the [capital]") and "\n   in " in hit.data()
    w.sidebar.view.clicked.emit(hit)
    question = w.chat.widgets[0]
    # the match is marked in the message (it was only in a tooltip: issue 27)
    qtbot.waitUntil(lambda: len(question.body.extraSelections()) == 1, timeout=5_000)
    mark = question.body.extraSelections()[0]
    assert mark.cursor.selectedText() == "capital"
    qtbot.waitUntil(lambda: not w.sidebar._debounce.isActive(), timeout=2000)  # none fires after the store closes


def test_esc_during_a_load_aborts_it_and_frees_the_process(qtbot, window):
    w = window
    job = w.ctx.engine.job
    w.ctx.engine.unload()
    qtbot.waitUntil(lambda: w.ctx.pool.active == 0, timeout=10_000)
    w.ctx.engine.load(job)
    qtbot.waitUntil(lambda: w.ctx.engine._pending is not None, timeout=10_000)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "idle" and w.ctx.pool.active == 0, timeout=10_000)
    assert w.ctx.engine.engine is None and not not w.models.error.isHidden()  # an abort is not an error
    assert not [p for p in multiprocessing.active_children() if p.name == "hearth-engine"]
