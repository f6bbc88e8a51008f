"""Render every page of the window (Chats, Documents, Models, Tools, Port, Settings) at 1280×800, 1440×900,
900×700 and HiDPI (1280×800 at scale factor 2), in the light and dark themes: ``{page}-{size}-{theme}.png``,
then ``manifest.json`` next to them. The real window (xcb platform on Xvfb, not offscreen), the bundled Gemma 3
270M answering a real question, captured from the X screen (``QScreen.grabWindow``), saved with a 256-colour
palette (Pillow) to keep the repository small.

    flock /tmp/hearth-cpu.lock .venv/bin/python docs/screenshots/render_window.py

Starts ``Xvfb :98`` itself and uses a temporary HEARTH_HOME (nothing of the person's data is read, and the
temporary path never shows: the window names models by id). It makes a preset *Brief* and projects *Trip to
Paris* and *Garden*, indexes one short document, configures the MCP test server, starts a chat in the project,
asks "What is the capital of France?", then grabs each page at each size in each theme. HiDPI runs in a second
Xvfb with ``QT_SCALE_FACTOR=2`` (a 2560×1600 window; ``--scale 1`` skips it).

``manifest.json`` records the SHA-256 of the UI's source (``ui_source_hash``: every ``app/ui/*.py`` but
``main.py``, which does not draw the window) and of each PNG; ``tests/test_ui_theme.py``
fails when the UI code changed since the screenshots were rendered, or a page, size or theme is missing: run
this script again and commit the PNGs with the manifest.
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
PAGES = ("chats", "documents", "models", "tools", "port", "settings")
THEMES = ("light", "dark")
SIZES = {1: (("1280x800", 1280, 800), ("1440x900", 1440, 900), ("900x700", 900, 700)),
         2: (("hidpi", 1280, 800),)}  # scale factor → (name, width, height) in logical px
DOCUMENT = """# Island ferries

The ferry to Lindholm island leaves at 7:45 every morning from pier 4 and returns at 18:30.
Tickets cost 12 euros; bicycles travel free.
"""
QUESTION = "What is the capital of France?"
NOT_DRAWING = {"main.py"}  # the window's look does not depend on it
sys.path.insert(0, str(OUT))
from shots import add_mcp_server, pause, setup_home, spin, xvfb  # noqa: E402 - after the path


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


def save_png(pixmap: object, path: Path) -> None:
    """``pixmap`` (a ``QPixmap``) as a 256-colour PNG at ``path``."""
    from PIL import Image

    raw = path.with_suffix(".raw.png")
    pixmap.save(str(raw))
    with Image.open(raw) as img:
        img.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)
    raw.unlink()


def render(scale: int) -> dict:
    """Every page at every size of ``scale`` in both themes; returns what the window showed."""
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
    w.resize(*SIZES[scale][0][1:])
    w.show()
    spin(app, lambda: ctx.engine.state == "ready")
    doc = Path(os.environ["HEARTH_HOME"]) / "island-ferries.md"
    doc.write_text(DOCUMENT, encoding="utf-8")
    w.documents.ingest([str(doc)])
    spin(app, lambda: not ctx.docs.busy and w.documents.model.rowCount() > 0)
    w.new_chat_in(trip.id)
    w.send(QUESTION)
    spin(app, lambda: ctx.chat.busy)
    spin(app, lambda: not ctx.chat.busy)
    ctx.store.rename(w.conversation_id, "Capital of France")
    w.sidebar.refresh()
    w.sidebar.select(w.conversation_id)
    w.show_header()
    w.settings_page.sections.setCurrentRow(1)  # Answers: the decoding settings
    files = []
    for size, width, height in SIZES[scale]:
        w.resize(width, height)
        pause(app, 0.5)
        for page in PAGES:
            w.show_page(page)
            for mode in THEMES:
                theme.manager().set_mode(mode)
                pause(app, 0.4)
                name = f"{page}-{size}-{mode}.png"
                save_png(app.primaryScreen().grabWindow(w.winId()), OUT / name)
                files.append(name)
        theme.manager().set_mode("light")
    w.show_page("chats")
    answer = [r for r in w.chat_model.items() if r.role == "assistant"][-1].content
    info = {"files": files, "answer": answer, "status": w.status.model.text(), "context": w.status.context.text(),
            "ttft": w.status.ttft.text()}
    w.close()
    return info


def run_in_xvfb(scale: int) -> dict:
    """This script's ``--child`` under a fresh Xvfb at ``scale`` (its JSON report)."""
    size = f"{1460 * scale}x{920 * scale}x24"
    with xvfb(DISPLAY, size), tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, DISPLAY=DISPLAY, QT_QPA_PLATFORM="xcb", HEARTH_HOME=home,
                   QT_SCALE_FACTOR=str(scale))
        out = subprocess.run([sys.executable, __file__, "--child", str(scale)], env=env, check=True,
                             capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=int, default=2, help="render the hidpi shots at this scale factor too "
                                                        "(1: not at all)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    if args.child is not None:  # inside Xvfb
        setup_home(32)
        add_mcp_server()
        print(json.dumps(render(args.child)))
        return 0
    for old in OUT.glob("*-*-*.png"):  # never keep a shot rendered from older code
        if old.stem.split("-")[0] in PAGES:
            old.unlink()
    info = run_in_xvfb(1)
    files = info.pop("files")
    if args.scale > 1:
        files += run_in_xvfb(args.scale)["files"]
    manifest = {"ui_source_hash": ui_source_hash(), "ui_sources": [p.name for p in ui_sources()],
                "pages": list(PAGES), "themes": list(THEMES),
                "sizes": [name for sizes in SIZES.values() for name, _w, _h in sizes],
                "files": {f: file_hash(OUT / f) for f in files}, "question": QUESTION, **info,
                "regenerate": "flock /tmp/hearth-cpu.lock .venv/bin/python docs/screenshots/render_window.py"}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(info, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
