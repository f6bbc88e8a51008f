"""The window's Stop thinking button on the real bundled model (issue 14): Gemma 3 270M has no thinking markers,
so a thinking effort gets ``<think>`` prefilled by the engine; the button ends the thinking through the engine
and the answer follows. Offscreen, pytest-qt; the window and its engine process end whatever happens."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.protocol.types import DecodingParams, LoadSettings
from app.settings import UserSettings, save_user_settings
from tests.test_ui_reasoning import last_answer, pick_effort
from tests.test_ui_window import ANSWER_MS, ask, close_window, home_with_model, open_window  # noqa: F401

pytestmark = [pytest.mark.model, pytest.mark.gui]


def test_stop_thinking_button_ends_the_real_models_thinking(qtbot, home_with_model):  # noqa: F811
    save_user_settings(UserSettings(load=LoadSettings(n_ctx=2048),
                                    decoding=DecodingParams(temperature=0.0, max_tokens=400)))
    w = open_window(qtbot)
    try:
        pick_effort(w, "high")  # 4096 tokens, fitted to half of max_tokens: 200
        ask(qtbot, w, "What is 17 + 25?")
        qtbot.waitUntil(lambda: not w.chat.stop_thinking_btn.isHidden(), timeout=ANSWER_MS)
        qtbot.mouseClick(w.chat.stop_thinking_btn, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not w.ctx.chat.busy and last_answer(w).row.id is not None, timeout=ANSWER_MS)
        msg = last_answer(w)
        r = w.ctx.store.reasoning_for(msg.row.id)
        assert (r.stopped_by, r.forced) == ("user", True)
        assert 0 < r.tokens < 100  # far below the 200 allowed: the click ended it
        assert msg.row.content.startswith("Answer:") and "<think>" not in msg.row.content
        assert r.text and r.text not in msg.row.content
    finally:
        close_window(w)
