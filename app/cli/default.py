"""``hearth`` with no command: the desktop app when a display is available, else the terminal chat.

Before Qt is imported, ``app.doctor.qt.startup_check`` tries to create the application in a child process
(about 0.7 s): Qt aborts the whole process when its platform plugin cannot load, and a person who typed
``hearth`` (or ``make run``) should get the reason, the fix and a working chat instead of "Aborted". When the
probe fails, doctor's message goes to stderr and the terminal chat starts. ``HEARTH_SKIP_QT_CHECK=1`` skips
the probe.
"""

from __future__ import annotations

import argparse
import os
import sys

FALLBACK_NOTE = ("hearth: starting the terminal chat instead (`hearth doctor` checks everything; "
                 "HEARTH_SKIP_QT_CHECK=1 skips this check).")


def _has_display() -> bool:
    if sys.platform in ("darwin", "win32"):
        return True
    qpa = os.environ.get("QT_QPA_PLATFORM", "")
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                or (qpa and qpa not in ("offscreen", "minimal")))


def gui_problem() -> str | None:
    """Doctor's message when Qt cannot open a window here, else None (also when the check is skipped)."""
    from app.doctor.qt import startup_check

    rep = startup_check()
    return None if rep is None or rep.ok else rep.message


def run_default(args: argparse.Namespace) -> int:
    """The window if Qt can open one, else the terminal chat (with the reason on stderr)."""
    if _has_display():
        problem = gui_problem()
        if problem is None:
            from app.ui.main import run_app

            return run_app([])
        print(problem, file=sys.stderr)
        print(FALLBACK_NOTE, file=sys.stderr, flush=True)
    from app.cli.chat import run_terminal_chat
    return run_terminal_chat(argparse.Namespace(**{**vars(args), "model": None}))
