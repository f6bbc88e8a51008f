"""User settings, persisted atomically as JSON in the data directory (``settings.json``).

Layers (STYLE.md §9): ``LoadSettings`` (how a model is loaded), decoding defaults, server settings and app
options are separate typed values; unknown keys in the file are ignored with a warning, a corrupt file is
moved aside (``settings.json.corrupt-<time>``) and defaults are used, so the app always starts.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from app import paths
from app.engine.types import DecodingParams, LoadSettings
from app.errors import InvalidRequest

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765  # not Ollama (11434), LM Studio (1234) nor llama-server (8080)


@dataclass
class ServerSettings:
    """The local OpenAI-compatible port."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    allow_hosts: list[str] = field(default_factory=list)  # extra Host names accepted (DNS-rebinding guard)
    max_queue: int = 16


@dataclass
class UserSettings:
    """Everything the app remembers. ``model``: the model id or path last chosen (None: bundled).
    ``cache_budget_mb``: byte budget of the on-disk prefix cache in MiB. ``per_model``: overrides of
    ``load`` fields keyed by model id."""

    model: str | None = None
    load: LoadSettings = field(default_factory=LoadSettings)
    decoding: DecodingParams = field(default_factory=DecodingParams)
    system_prompt: str = ""
    prefix_cache: bool = True
    cache_budget_mb: float = 4096.0
    server: ServerSettings = field(default_factory=ServerSettings)
    per_model: dict[str, dict[str, Any]] = field(default_factory=dict)

    def load_for(self, model_id: str | None) -> LoadSettings:
        """Load settings for ``model_id`` with its remembered overrides applied."""
        over = self.per_model.get(model_id or "", {})
        known = {f.name for f in fields(LoadSettings)}
        return replace(self.load, **{k: v for k, v in over.items() if k in known}).validate()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["decoding"]["stop"] = list(self.decoding.stop)
        d["decoding"]["logit_bias"] = {str(k): v for k, v in self.decoding.logit_bias}
        return d


def _build(cls, data: Any):
    if not isinstance(data, dict):
        return cls()
    known = {f.name for f in fields(cls)}
    extra = set(data) - known
    if extra:
        log.warning("settings: ignoring unknown keys %s", sorted(extra))
    return cls(**{k: v for k, v in data.items() if k in known})


def from_dict(data: dict[str, Any]) -> UserSettings:
    """Parse a settings dict; raises ``InvalidRequest`` naming a bad value."""
    data = dict(data)
    load = _build(LoadSettings, data.pop("load", {})).validate()
    dec_raw = data.pop("decoding", {}) or {}
    dec = DecodingParams.make(**{k: v for k, v in dec_raw.items() if k in {f.name for f in fields(DecodingParams)}})
    server = _build(ServerSettings, data.pop("server", {}))
    base = _build(UserSettings, data)
    return replace(base, load=load, decoding=dec, server=server)


def load_user_settings() -> UserSettings:
    """The saved settings, or defaults. Never raises for a bad file (it is moved aside and logged)."""
    path = paths.settings_file()
    if not path.exists():
        return UserSettings()
    try:
        return from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError, InvalidRequest) as exc:
        aside = path.with_name(f"settings.json.corrupt-{int(time.time())}")
        log.warning("settings file %s is unreadable (%s); moved to %s, using defaults", path, exc, aside)
        try:
            path.replace(aside)
        except OSError:
            pass
        return UserSettings()


def save_user_settings(s: UserSettings) -> None:
    """Write atomically: a temp file in the same folder, fsync, rename over the old file."""
    path = paths.settings_file()
    text = json.dumps(s.to_dict(), indent=2, sort_keys=True)
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".settings-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
