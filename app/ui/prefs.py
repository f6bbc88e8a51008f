"""The window's own preferences (``ui.json`` in the data folder): what only the desktop app reads.

Kept apart from ``settings.json`` because that file is shared with ``hearth serve`` and the CLI, and its
loader drops keys it does not know; the look of the window is nobody else's business. Written atomically
(``app.fileio``); a missing or unreadable file, or a bad value, gives the default with a warning, so the window
always opens.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from app import paths
from app.fileio import atomic_write_text, read_json_file

log = logging.getLogger(__name__)

THEMES = ("system", "light", "dark")


@dataclass(frozen=True)
class UiPrefs:
    """``theme``: system (follow the OS), light or dark. ``last_model``: the file of the last model that loaded
    in the window (the start falls back to it when the saved model cannot be loaded)."""

    theme: str = "system"
    last_model: str | None = None


def prefs_file() -> Path:
    """Where the window's preferences live."""
    return paths.home() / "ui.json"


def load_prefs() -> UiPrefs:
    """The saved preferences, or defaults (never raises for a bad file)."""
    path = prefs_file()
    if not path.exists():
        return UiPrefs()
    try:
        data = read_json_file(path)  # the shared reader: a file nested 100,000 deep is a ValueError here
    except (OSError, ValueError) as exc:
        log.warning("ui.json is unreadable (%s); using defaults", exc)
        return UiPrefs()
    theme = data.get("theme", "system") if isinstance(data, dict) else "system"
    if theme not in THEMES:
        log.warning("ui.json: theme=%r is not one of %s; using system", theme, ", ".join(THEMES))
        theme = "system"
    last = data.get("last_model") if isinstance(data, dict) else None
    return UiPrefs(theme=theme, last_model=last if isinstance(last, str) and last else None)


def save_prefs(prefs: UiPrefs) -> None:
    """Write ``ui.json`` atomically (``OSError`` when the folder is not writable; the old file stays)."""
    if prefs.theme not in THEMES:
        raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {prefs.theme!r}")
    data = {k: v for k, v in asdict(prefs).items() if v is not None}
    atomic_write_text(prefs_file(), json.dumps(data, indent=2), prefix=".ui-")
