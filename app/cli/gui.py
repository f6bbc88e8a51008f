"""``hearth gui``: the desktop app (the same as ``hearth`` with a display). Asked for by name (the desktop entry
runs it), it does not fall back to the terminal chat: when Qt cannot open a window it prints doctor's message
and exits 1."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gui", help="open the desktop app",
                       description="Open Hearth's desktop window: chat, models, documents and the local port.")
    p.add_argument("--model", default=None, help="model id or path to load at start (default: the last one)")
    p.add_argument("--port", type=int, default=None, help="serve the local API on this port at start")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Open the window; when Qt cannot (checked first, see app.cli.default), print why and exit 1."""
    from app.cli.default import gui_problem

    problem = gui_problem()
    if problem is not None:
        print(problem, file=sys.stderr)
        print("hearth: the window cannot open here; `hearth chat` is the terminal chat.", file=sys.stderr)
        return 1
    from app.ui.main import run_app

    argv = (["--model", args.model] if args.model else []) + (["--port", str(args.port)] if args.port else [])
    return run_app(argv)
