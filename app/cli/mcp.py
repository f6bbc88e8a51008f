"""``hearth mcp``: Hearth as an MCP server over stdio, for MCP clients (Claude Desktop, editors, agents) that
start it as a child process. The tools are ``app.server.mcp_server``'s over the default collection and the
stored conversations; the document index, its embedding model and the chat model open on first use, so
listing tools is quick. Nothing but the protocol is written to stdout (the SDK points fd 1 at stderr while
serving, so a child process's output cannot corrupt it).
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from app.cli._engine_args import add_load_args


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``hearth mcp`` to the CLI's subcommands."""
    p = sub.add_parser(
        "mcp", help="serve your documents and conversations to MCP clients (stdio)",
        description="Serve Hearth as an MCP server over stdin/stdout: tools search_documents, read_passage, "
                    "list_documents, search_conversations, read_conversation and ask (an answer from your "
                    "documents by the local model, citations checked). Read-only unless --allow-writes. "
                    "For an MCP client's config: {\"command\": \"hearth\", \"args\": [\"mcp\"]}. Over HTTP the "
                    "same tools are at /mcp on `hearth serve`'s port.")
    p.add_argument("--allow-writes", action="store_true",
                   help="offer the ingest tool (index a file or folder); each call still asks you to confirm "
                        "through the client, and a client that cannot ask (no MCP elicitation) is refused")
    add_load_args(p)  # the model `ask` loads on its first call
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve the MCP tools over stdio until the client closes stdin; the index and the model are closed
    afterwards. Returns 0."""
    from app.server.mcp_library import Library
    from app.server.mcp_server import build_server

    opened = _Opened(args)
    try:
        server = build_server(Library(opened.documents, engine=opened.hold, allow_writes=args.allow_writes))
        server.run("stdio")
    finally:
        opened.close()
    return 0


class _Opened:
    """The document index and the chat model, each opened by the first tool that needs it (from any of the
    SDK's worker threads) and closed at exit."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._lock = threading.Lock()
        self._docs: Any = None
        self._engine: Any = None

    def documents(self) -> Any:
        """The default collection's ``DocumentSource``, opened on first use."""
        with self._lock:
            if self._docs is None:
                from app.assistant import DocumentSource

                self._docs = DocumentSource.open_default()
            return self._docs

    def hold(self) -> Any:
        """The chat model (``--model`` and the engine flags), loaded on first use, as a ``Held``."""
        from app.server.source import Held

        with self._lock:
            if self._engine is None:
                from app.cli._engine_args import make_engine

                self._engine = make_engine(self.args)
            eng = self._engine
        from app.server.models import loaded_id

        return Held(eng, loaded_id(eng))

    def close(self) -> None:
        """Close whatever was opened."""
        with self._lock:
            if self._engine is not None:
                self._engine.close()
            if self._docs is not None:
                self._docs.close()
