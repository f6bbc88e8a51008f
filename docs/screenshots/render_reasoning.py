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

import functools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
DISPLAY = ":99"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(OUT))
import shots  # noqa: E402 - after the path
from shots import in_xvfb, pause, setup_home  # noqa: E402

spin = functools.partial(shots.spin, timeout_s=180)


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
    with in_xvfb(DISPLAY, "1400x860x24"):
        setup_home(96)
        render()
    return 0


if __name__ == "__main__":
    sys.exit(main())
