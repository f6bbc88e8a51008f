"""Issue 30 in the window: a new chat after a restart reuses the preamble it shares with an earlier chat (the
system prompt), restored from the disk prefix cache, and the status strip says how many prompt tokens it
reused. Real bundled model, offscreen window, two window lifetimes (two engine processes)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.settings import load_user_settings, save_user_settings
from tests.test_ui_window import ANSWER_MS, ask, close_window, home_with_model, open_window  # noqa: F401

pytestmark = [pytest.mark.model, pytest.mark.gui]

SYSTEM = ("You answer questions about the harbour ledger in one short sentence. The ledger lists every ship "
          "that came in this spring, with its cargo, its fee and the day it left. ") * 10  # ~400 tokens


def answer(qtbot, w, text: str) -> dict:
    ask(qtbot, w, text)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    assert w.chat_model.items()[-1].status == "complete"
    return w.status._last[0]  # the metrics the strip shows


def test_a_new_chat_after_a_restart_shows_its_reused_prompt_tokens(qtbot, home_with_model):  # noqa: F811
    save_user_settings(replace(load_user_settings(), system_prompt=SYSTEM))
    w = open_window(qtbot)
    try:
        first = answer(qtbot, w, "Which ship came in first?")
        assert first["cache_source"] == "none"
    finally:
        close_window(w)  # the engine saves the chat's chunks as it closes
    w = open_window(qtbot)
    try:
        w.new_chat()
        m = answer(qtbot, w, "What did the Heron carry?")
        assert m["cache_source"] == "disk" and m["cached_tokens"] >= 256, m.get("cache_reuse_reason")
        assert f"reused {m['cached_tokens']}/{m['prompt_tokens']} prompt tokens (disk)" in w.status.reused.text()
    finally:
        close_window(w)
