"""Render docs/screenshots/window-light.png and window-dark.png: the real window (xcb platform on Xvfb, not
offscreen) at 1280×800, the bundled Gemma 3 270M answering a real question, captured from the X screen
(``QScreen.grabWindow``), then ``manifest.json`` next to them.

    flock /tmp/hearth-cpu.lock .venv/bin/python docs/screenshots/render_window.py

Starts ``Xvfb :98`` itself and uses a temporary HEARTH_HOME (nothing of the person's data is read, and the
temporary path never shows: the window names models by id). It makes a preset *Brief* and a project *Trip*,
starts a chat in the project, asks "What is the capital of France?", shows the system prompt editor, grabs the
light theme, switches to dark (Settings → Appearance does the same) and grabs again. Then, in a second Xvfb,
``window-hidpi.png`` with ``QT_SCALE_FACTOR=2`` (a 2560×1600 screen) shows the same layout on HiDPI
(``--scale 1`` skips it).

``manifest.json`` records the SHA-256 of the UI's source (``ui_source_hash``: every ``app/ui/*.py`` but
``recommend.py`` and ``main.py``, which do not draw the window) and of each PNG; ``tests/test_ui_theme.py``
fails when the UI code changed since the screenshots were rendered: run this script again and commit the PNGs
with the manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
DISPLAY = ":98"
SHOTS = ("window-light.png", "window-dark.png")
QUESTION = "What is the capital of France?"
NOT_DRAWING = {"recommend.py", "main.py"}  # the window's look does not depend on these
sys.path.insert(0, str(OUT))
from shots import pause, setup_home, spin, xvfb  # noqa: E402 - after the path


def ui_sources() -> list[Path]:
    """The UI source files the screenshots depend on, in a fixed order."""
    return sorted(p for p in (REPO / "app" / "ui").glob("*.py") if p.name not in NOT_DRAWING)


def ui_source_hash() -> str:
    """SHA-256 over each UI source file's name and bytes."""
    h = hashlib.sha256()
    for p in ui_sources():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def render(names: tuple[str, ...]) -> dict:
    from PySide6.QtWidgets import QApplication

    from app.ui import theme

    app = QApplication.instance() or QApplication([])
    theme.manager().set_mode("light")
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    brief = ctx.store.create_preset("Brief", "Answer in a few words.", {"temperature": 0.0, "max_tokens": 32})
    ctx.store.create_preset("Creative", "Write freely.", {"temperature": 1.0})
    trip = ctx.store.create_project("Trip to Paris", preset_id=brief.id)
    ctx.store.create_project("Garden")
    w = MainWindow(ctx)
    w.resize(1280, 800)
    w.show()
    spin(app, lambda: ctx.engine.state == "ready")
    w.new_chat_in(trip.id)
    w.send(QUESTION)
    spin(app, lambda: ctx.chat.busy)
    spin(app, lambda: not ctx.chat.busy)
    ctx.store.rename(w.conversation_id, "Capital of France")
    w.sidebar.refresh()
    w.sidebar.select(w.conversation_id)
    w.show_header()
    w.header.toggle.setChecked(True)
    pause(app, 0.5)
    answer = [r for r in w.chat_model.items() if r.role == "assistant"][-1].content
    for name, mode in zip(names, ("light", "dark")):
        theme.manager().set_mode(mode)
        pause(app, 0.6)
        app.primaryScreen().grabWindow(w.winId()).save(str(OUT / name))
    info = {"answer": answer, "status": w.status.model.text(), "context": w.status.context.text(),
            "ttft": w.status.ttft.text()}
    w.close()
    return info


def run_in_xvfb(scale: int) -> dict:
    """This script's ``--child`` under a fresh Xvfb at ``scale`` (its JSON report)."""
    size = f"{1300 * scale}x{820 * scale}x24"
    with xvfb(DISPLAY, size), tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, DISPLAY=DISPLAY, QT_QPA_PLATFORM="xcb", HEARTH_HOME=home,
                   QT_SCALE_FACTOR=str(scale))
        out = subprocess.run([sys.executable, __file__, "--child", str(scale)], env=env, check=True,
                             capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=int, default=2, help="render window-hidpi.png at this scale factor too "
                                                        "(1: not at all)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    if args.child is not None:  # inside Xvfb
        setup_home(32)
        names = SHOTS if args.child == 1 else ("window-hidpi.png",)
        print(json.dumps(render(names)))
        return 0
    info = run_in_xvfb(1)
    files = list(SHOTS)
    if args.scale > 1:
        run_in_xvfb(args.scale)
        files.append("window-hidpi.png")
    else:
        (OUT / "window-hidpi.png").unlink(missing_ok=True)  # never keep one rendered from older code
    manifest = {"ui_source_hash": ui_source_hash(), "ui_sources": [p.name for p in ui_sources()],
                "files": {f: file_hash(OUT / f) for f in files}, "question": QUESTION, **info,
                "regenerate": "flock /tmp/hearth-cpu.lock .venv/bin/python docs/screenshots/render_window.py"}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(info, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
