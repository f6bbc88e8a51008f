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
from app.fileio import atomic_write_text

log = logging.getLogger(__name__)

THEMES = ("system", "light", "dark")


@dataclass(frozen=True)
class UiPrefs:
    """``theme``: system (follow the OS), light or dark."""

    theme: str = "system"


def prefs_file() -> Path:
    """Where the window's preferences live."""
    return paths.home() / "ui.json"


def load_prefs() -> UiPrefs:
    """The saved preferences, or defaults (never raises for a bad file)."""
    path = prefs_file()
    if not path.exists():
        return UiPrefs()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        log.warning("ui.json is unreadable (%s); using defaults", exc)
        return UiPrefs()
    theme = data.get("theme", "system") if isinstance(data, dict) else "system"
    if theme not in THEMES:
        log.warning("ui.json: theme=%r is not one of %s; using system", theme, ", ".join(THEMES))
        theme = "system"
    return UiPrefs(theme=theme)


def save_prefs(prefs: UiPrefs) -> None:
    """Write ``ui.json`` atomically (``OSError`` when the folder is not writable; the old file stays)."""
    if prefs.theme not in THEMES:
        raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {prefs.theme!r}")
    atomic_write_text(prefs_file(), json.dumps(asdict(prefs), indent=2), prefix=".ui-")
