"""Issue 27, "the desktop app, finished: a first hour without a defect": each defect found in a first hour with
the window, with the check that failed before its fix. Offscreen, with the fake engine (no model)."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtWidgets import QApplication

from tests.fakes import FakeEngine

pytestmark = pytest.mark.gui

LONG = "reused 50/67 prompt tokens (memory) " + "x" * 2000


def open_window(qtbot, autoload: bool = False):
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    w = MainWindow(ctx, autoload=autoload)
    qtbot.addWidget(w)
    w.show()
    return w


def close_window(w) -> None:
    ctx = w.ctx
    w.close()
    assert ctx.pool.pool.activeThreadCount() == 0 and ctx.pool.active == 0
    assert not [t for t in threading.enumerate() if t.name == "hearth-tool-call" and t.is_alive()]


@pytest.fixture
def window(qtbot):
    w = open_window(qtbot)
    w.ctx.engine.engine = FakeEngine(n_ctx=2048)
    w.ctx.engine._set_state("ready")
    yield w
    close_window(w)


def settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
        qtbot.wait(20)


# -- 1: the window never widens itself ---------------------------------------------------------------------
@pytest.mark.parametrize("where", ["status", "reused", "chat_error", "notice", "model_error", "details",
                                   "download", "port", "documents"])
def test_a_long_status_or_error_line_never_widens_the_window(qtbot, window, where):
    w = window
    settle(qtbot)
    width = w.width()
    show = {"status": lambda: w.status.show_model(LONG), "reused": lambda: w.status.reused.setText(LONG),
            "chat_error": lambda: (w.error.setText("E" * 2000), w.error.setVisible(True)),
            "notice": lambda: (w.notice.setText(LONG), w.notice.setVisible(True)),
            "model_error": lambda: w.models.show_error(RuntimeError("E" * 2000)),
            "details": lambda: w.models.details.setText("D" * 2000),
            "download": lambda: w.models.dl_label.setText("ConnectError: " + "N" * 2000),
            "port": lambda: w.port.state.setText("S" * 2000),
            "documents": lambda: w.documents.state.setText("S" * 2000)}
    show[where]()
    settle(qtbot)
    assert w.width() == width and w.minimumSizeHint().width() <= width


def test_a_cut_status_line_keeps_its_whole_text_in_the_tooltip(qtbot, window):
    w = window
    w.status.show_model(LONG)
    settle(qtbot)
    assert w.status.model.text() == LONG and w.status.model.toolTip() == LONG
    w.status.show_model("Model: short")
    settle(qtbot)
    assert w.status.model.toolTip() == ""
