"""Where Hearth keeps its data.

``HEARTH_HOME`` overrides everything (tests always set it to a temporary folder); otherwise the per-user data
directory from ``platformdirs`` (e.g. ``~/.local/share/hearth`` on Linux). Layout (see docs/architecture.md):

The reasoning: docs/architecture.md, 'app/paths.py'.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

BUNDLED_MODEL_FILENAME = "gemma-3-270m-q4_k_m.gguf"


def home() -> Path:
    """The data directory (created if missing)."""
    env = os.environ.get("HEARTH_HOME")
    base = Path(env).expanduser() if env else Path(platformdirs.user_data_dir("hearth", appauthor=False))
    base.mkdir(parents=True, exist_ok=True)
    return base


def _sub(name: str) -> Path:
    p = home() / name
    p.mkdir(parents=True, exist_ok=True)
    return p


def models_dir() -> Path:
    """Folder of GGUF model files."""
    return _sub("models")


def kv_cache_dir() -> Path:
    """Folder of the persistent prefix cache."""
    return _sub("kv-cache")


def logs_dir() -> Path:
    """Folder of log files."""
    return _sub("logs")


def conversations_db() -> Path:
    """SQLite file of conversations (app.memory)."""
    return home() / "hearth.db"


def documents_db() -> Path:
    """SQLite file of documents and chunks (app.retrieval)."""
    return home() / "documents.db"


def settings_file() -> Path:
    """JSON file of user settings."""
    return home() / "settings.json"


def bundled_model_path() -> Path:
    """Where the bundled default model is assembled (it may not exist yet; see ``app.catalog.bundled``)."""
    return models_dir() / BUNDLED_MODEL_FILENAME
