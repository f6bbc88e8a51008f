"""The ``hearth`` command: thin entry points over the core.

Each subcommand lives in its own module of this package and exposes ``register(subparsers)``, which adds
its parser and sets ``func`` (called with the parsed ``argparse.Namespace``, returning an exit code).
Known errors (``HearthError``) print one line to stderr and exit 1; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from app.errors import HearthError

# Subcommand modules, in --help order. A module that fails to import is skipped with a warning, so one
# broken optional part never takes the whole CLI down.
_COMMANDS = ["setup", "generate", "chat", "models", "inspect", "serve", "mcp", "remote", "ingest", "search",
             "history", "bench", "gui", "doctor", "service", "launch"]

log = logging.getLogger("hearth")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hearth")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hearth",
        description="Hearth: chat with a local GGUF model (llama.cpp), index documents, serve an "
                    "OpenAI-compatible API on 127.0.0.1. Without a command: the desktop app if a display "
                    "is available, else the terminal chat.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages to stderr")
    parser.add_argument("--version", action="version", version=f"hearth {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            mod = importlib.import_module(f"app.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"app.cli.{name}":
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        from app.cli.default import run_default
        func = run_default
    else:
        func = args.func
    try:
        return int(func(args) or 0)
    except HearthError as exc:
        print(f"hearth: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `hearth search ... --json | head`: the reader left; not an error
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep the interpreter's final flush quiet
        except OSError:
            pass
        return 0
    except OSError as exc:  # a file or folder that cannot be read or written, a port in use...
        print(f"hearth: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""),
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hearth: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
