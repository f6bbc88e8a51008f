"""The window honours a model's own settings (issue 25): ``per_model.<id>.speculative`` in settings.json makes
the window's engine speculate (docs/speculative.md), the answer's metrics and the status strip say so, and
taking the setting away in the settings reloads the model without it. Real bundled model, offscreen window."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.catalog.registry import BUNDLED_MODEL_ID
from app.settings import load_user_settings, save_user_settings
from tests.test_ui_window import ANSWER_MS, LOAD_MS, ask, close_window, home_with_model, open_window  # noqa: F401

pytestmark = [pytest.mark.model, pytest.mark.gui]

COPY = "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog."


def answer(qtbot, w) -> dict:
    ask(qtbot, w, COPY)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=ANSWER_MS)
    assert w.chat_model.items()[-1].status == "complete"
    return w.status._last[0]  # the metrics the strip shows


def test_the_models_speculative_setting_reaches_the_windows_engine(qtbot, home_with_model):  # noqa: F811
    user = load_user_settings()
    save_user_settings(replace(user, per_model={BUNDLED_MODEL_ID: {"speculative": "prompt_lookup"}}))
    w = open_window(qtbot)
    try:
        assert w.ctx.engine.job.plan.speculative == "prompt_lookup"
        metrics = answer(qtbot, w)
        assert metrics["spec_mode"] == "prompt_lookup" and metrics["spec_steps"] > 0
        assert "Speculative decoding: prompt lookup" in w.status.decode.toolTip()
        w.apply_settings(replace(w.ctx.settings, per_model={}), BUNDLED_MODEL_ID)  # reloads without it
        qtbot.waitUntil(lambda: w.ctx.engine.state == "ready" and w.ctx.engine.job.plan.speculative is None,
                        timeout=LOAD_MS)
        metrics = answer(qtbot, w)  # the default now: adaptive prompt lookup ("auto"), not the setting's mode
        assert metrics.get("spec_mode") != "prompt_lookup" and "prompt lookup" not in w.status.decode.toolTip()
    finally:
        close_window(w)
