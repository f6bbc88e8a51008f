"""``hearth gui``: the desktop app (the same as ``hearth`` with a display)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gui", help="open the desktop app",
                       description="Open Hearth's desktop window: chat, models, documents and the local port.")
    p.add_argument("--model", default=None, help="model id or path to load at start (default: the last one)")
    p.add_argument("--port", type=int, default=None, help="serve the local API on this port at start")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.ui.main import run_app

    argv = (["--model", args.model] if args.model else []) + (["--port", str(args.port)] if args.port else [])
    return run_app(argv)
