"""Ollama's native API (``/api/*``) on the same port and the same models, pool and metrics as ``/v1``.

docs/server.md, 'app/server/ollama.py'.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI


def routes(app: FastAPI, st: Any) -> None:
    """Ollama's ``/api/*`` routes on ``app`` (``st``: the app's ``State``)."""
