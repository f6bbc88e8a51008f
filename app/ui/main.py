"""``run_app(argv) -> int``: start the desktop app (``hearth``, ``hearth gui``)."""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hearth gui", description="The Hearth desktop app.")
    p.add_argument("--model", default=None, help="model id or path to load at start (default: the last one)")
    p.add_argument("--port", type=int, default=None, help="serve the local API on this port at start")
    return p.parse_args(argv)


def run_app(argv: list[str] | None = None) -> int:
    """Open the main window and run the Qt event loop; returns the exit code."""
    args = parse_args(list(argv or []))
    from dataclasses import replace

    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from app.catalog.recommended import resources_dir
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow
    from app.ui.theme import follow_system

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "hearth"])
    app.setApplicationName("Hearth")
    app.setDesktopFileName("hearth")
    app.setWindowIcon(QIcon(str(resources_dir() / "hearth.png")))
    follow_system(app)
    ctx = AppContext()
    if args.model:
        ctx.settings = replace(ctx.settings, model=args.model)
    if args.port is not None:
        ctx.settings = replace(ctx.settings, server=replace(ctx.settings.server, enabled=True, port=args.port))
    window = MainWindow(ctx)
    window.show()
    return int(app.exec())
