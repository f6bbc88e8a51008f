"""Hearth's OpenAI-compatible HTTP port: a thin adapter over the engine (see docs/server.md).

``create_app(engine_provider, settings)`` builds the FastAPI app; ``ServerThread`` runs it in a background
thread (desktop app, tests); ``serve`` runs it in the foreground (``hearth serve``).
"""

from app.server.app import create_app
from app.server.run import ServerThread, serve

__all__ = ["create_app", "ServerThread", "serve"]
