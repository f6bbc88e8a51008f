"""``hearth`` with no command: the desktop app when a display is available, else the terminal chat."""

from __future__ import annotations

import argparse
import os
import sys


def _has_display() -> bool:
    if sys.platform in ("darwin", "win32"):
        return True
    qpa = os.environ.get("QT_QPA_PLATFORM", "")
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                or (qpa and qpa not in ("offscreen", "minimal")))


def run_default(args: argparse.Namespace) -> int:
    if _has_display():
        try:
            from app.ui.main import run_app  # noqa: F401  (the desktop app, when it exists)
        except ImportError:
            pass
        else:
            return run_app([])
    from app.cli.chat import run_terminal_chat
    return run_terminal_chat(argparse.Namespace(**{**vars(args), "model": None}))
