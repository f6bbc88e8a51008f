"""Render docs/screenshots/reasoning.png: a real xcb window under Xvfb, the bundled model answering with its
thinking collapsed above the answer, captured from the X screen (``QScreen.grabWindow``).

    .venv/bin/python docs/screenshots/render_reasoning.py

Starts ``Xvfb :99`` itself (the ``xvfb`` package; Qt's xcb plugin needs libxcb-cursor0 and friends) and uses a
temporary HEARTH_HOME. Gemma 3 270M is a base model without thinking markers: with a budget the engine
prefills ``<think>`` and ends the thinking at the budget (``Answer:`` follows). The conversation's effort is
set to *low* in the picker; *max answer tokens* is 96, and thinking gets at most half of it (48 tokens). The
first answer stays collapsed; a second turn's thinking is expanded to show it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
DISPLAY = ":99"
sys.path.insert(0, str(REPO))


def spin(app, cond, timeout_s: float = 180) -> None:
    from PySide6.QtCore import QEventLoop

    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)


def pause(app, seconds: float) -> None:
    end = time.monotonic() + seconds
    spin(app, lambda: time.monotonic() > end)


def setup_home() -> None:
    from app import paths
    from app.engine.types import DecodingParams, LoadSettings
    from app.settings import UserSettings, save_user_settings
    from app.setup_model import ensure_bundled_model

    paths.bundled_model_path().symlink_to(ensure_bundled_model(REPO / ".cache/models/gemma-3-270m-q4_k_m.gguf"))
    save_user_settings(UserSettings(load=LoadSettings(n_ctx=2048),
                                    decoding=DecodingParams(temperature=0.0, max_tokens=96)))


def answers(w) -> list:
    from app.ui.chat_view import MessageWidget

    return [x for x in w.chat.widgets if isinstance(x, MessageWidget) and x.row.role == "assistant"]


def render() -> None:
    from PySide6.QtWidgets import QApplication

    from app.ui.theme import apply_theme

    app = QApplication.instance() or QApplication([])
    apply_theme(app)
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    w = MainWindow(ctx)
    w.resize(1360, 820)
    w.show()
    spin(app, lambda: ctx.engine.state == "ready")
    i = w.chat.effort.findData("low")
    w.chat.effort.setCurrentIndex(i)
    w.chat.effort.activated.emit(i)
    for question in ("What is 12 + 30?", "And what is 7 times 6?"):
        w.send(question)
        spin(app, lambda: ctx.chat.busy)
        spin(app, lambda: not ctx.chat.busy)
        pause(app, 0.3)
    answers(w)[-1].thinking.click()
    pause(app, 0.5)
    app.primaryScreen().grabWindow(w.winId()).save(str(OUT / "reasoning.png"))
    for a in answers(w):
        r = a.row
        print(f"answer {r.content!r} | thinking ({r.reasoning_tokens} tokens, {r.reasoning_note or 'model ended it'})"
              f" {r.reasoning!r}")
    print("strip:", w.status.thinking.text(), "|", w.status.ttft.text())
    w.close()


def main() -> int:
    xvfb = subprocess.Popen(["Xvfb", DISPLAY, "-screen", "0", "1400x860x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        os.environ.update(DISPLAY=DISPLAY, QT_QPA_PLATFORM="xcb")
        with tempfile.TemporaryDirectory() as home:
            os.environ["HEARTH_HOME"] = home
            setup_home()
            render()
    finally:
        xvfb.terminate()
        xvfb.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
