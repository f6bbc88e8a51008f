"""Render docs/screenshots/tool-call.png: a real xcb window under Xvfb, the bundled model
calling the ``add`` tool of the MCP test server (``tests/mcp_servers/tool_server.py``), captured from the X
screen (``QScreen.grabWindow``).

    .venv/bin/python docs/screenshots/render_tools.py

Starts ``Xvfb :99`` itself (the ``xvfb`` package; Qt's xcb plugin needs libxcb-cursor0 and friends) and uses a
temporary HEARTH_HOME. The bundled model is a small base model that would rarely call a tool on its own, so the
window's first step is forced to call ``add`` (a named ``tool_choice``: the grammar makes the call valid), and
the second step answers after the result. The permission row is answered "Allow once" by the script, the
result row expanded, then the window is captured (the Tools page is among render_window.py's shots).
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
from shots import add_mcp_server, in_xvfb, pause, setup_home  # noqa: E402

spin = functools.partial(shots.spin, timeout_s=180)


def render() -> None:
    from PySide6.QtWidgets import QApplication

    from app.protocol.tools import ToolChoice
    from app.ui.theme import apply_theme

    app = QApplication.instance() or QApplication([])
    apply_theme(app)
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow
    from app.ui.tool_view import ToolCallWidget

    ctx = AppContext()
    ctx.tools.tool_choice, ctx.tools.max_steps = ToolChoice("function", "calc__add"), 2
    w = MainWindow(ctx)
    w.resize(1360, 820)
    w.show()
    spin(app, lambda: ctx.engine.state == "ready" and ctx.tools.statuses()["calc"].state == "ready")
    w.send("What is 2 + 3? Use the add tool.")

    def row() -> ToolCallWidget | None:
        found = [x for x in w.chat.widgets if isinstance(x, ToolCallWidget)]
        return found[-1] if found else None

    spin(app, lambda: row() is not None and row().row.tool_state == "asking")
    pause(app, 0.3)
    row().buttons["allow_once"].click()
    spin(app, lambda: not ctx.chat.busy)
    pause(app, 0.3)
    row().toggle.click()
    pause(app, 0.5)
    shot = app.primaryScreen().grabWindow(w.winId())
    shot.save(str(OUT / "tool-call.png"))
    print("tool call:", row().row.arguments, "->", row().row.content, "| answer:", w.chat_model.items()[-1].content)
    w.close()


def main() -> int:
    with in_xvfb(DISPLAY, "1400x860x24"):
        setup_home(40)
        add_mcp_server()
        render()
    return 0


if __name__ == "__main__":
    sys.exit(main())
