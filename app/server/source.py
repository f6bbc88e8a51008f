"""Where a request's model comes from: one engine (the desktop window's) or a pool of many (``hearth serve``).

Every handler asks its ``ModelSource`` for the model the request's ``model`` field names and gets a ``Held``:
the engine, the id to answer with, and ``release()``, called once when the answer has been sent (a stream
included) or its client has gone. Two sources:

The reasoning: docs/server.md, 'app/server/source.py'.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from app.errors import HearthError, InvalidRequest, ModelNotFound
from app.protocol.backend import Backend
from app.server.errors import ModelNotLoaded, NoModelLoaded
from app.server.models import ModelCatalog, loaded_id

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$", re.I)
_UNIT_S = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_KEEP_ALIVE_S = 10 * 365 * 86400.0


def parse_keep_alive(value: Any, param: str = "keep_alive") -> Optional[float]:
    """Seconds (None: not given; 0: unload right after; negative: -1, never unload idle). Raises
    ``InvalidRequest`` naming ``param`` for anything but a finite number or a duration string."""
    if value is None:
        return None
    seconds: Optional[float] = None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            seconds = float(m.group(1)) * _UNIT_S[(m.group(2) or "").lower() or None]
    if seconds is None or seconds > MAX_KEEP_ALIVE_S:
        raise InvalidRequest(f'{param} must be seconds (a number, or a duration such as "5m", "90s", "1h"; 0 '
                             f"unloads after the request, -1 keeps the model loaded), got {value!r:.80}", param=param)
    return -1.0 if seconds < 0 else seconds


def keep_alive_of(body: Any) -> Optional[float]:
    """A request's ``keep_alive``: the top-level field, else ``hearth.keep_alive`` (both checked)."""
    top = parse_keep_alive(getattr(body, "keep_alive", None))
    h = getattr(body, "hearth", None)
    inner = parse_keep_alive(getattr(h, "keep_alive", None), "hearth.keep_alive") if h is not None else None
    return top if top is not None else inner


@dataclass
class Held:
    """A model held for one answer: its ``engine``, the ``model`` id the answer names, and ``release``."""

    engine: Backend
    model: str
    release: Callable[[], None] = lambda: None


class EngineSource:
    """The engine ``provider()`` returns now (None while none is loaded: 503 ``no_model_loaded``)."""

    def __init__(self, provider: Callable[[], Any], catalog: ModelCatalog) -> None:
        self.provider, self.catalog = provider, catalog

    def current(self) -> Any:
        """The engine now (None: none loaded); for /health and /metrics."""
        return self.provider()

    def acquire(self, requested: Optional[str], keep_alive_s: Optional[float], embedder: Any = None) -> Held:
        """Blocking (the catalog may list the models folder): the engine for ``requested``."""
        eng = self.provider()
        if eng is None:
            raise NoModelLoaded("no chat model is loaded yet; try again in a moment")
        return Held(eng, self.catalog.check_chat(requested, eng, embedder))

    def listing(self, embedder: Any) -> list[dict[str, Any]]:
        """``/v1/models``' ``data``."""
        return self.catalog.listing(self.provider(), embedder)

    def pool_status(self) -> Optional[dict[str, Any]]:
        """None: there is no pool."""
        return None


class PoolSource:
    """Models from ``pool`` (``ModelPool``) by name; ``default``: the model an absent ``model`` means (a name
    or path the pool resolves; None: the bundled model)."""

    def __init__(self, pool: Any, catalog: ModelCatalog, default: Optional[str] = None) -> None:
        self.pool, self.catalog, self.default = pool, catalog, default

    def current(self) -> Any:
        """The default model's engine when it is loaded (for /health and /metrics), else None."""
        try:
            return self.pool.engine_if_loaded(self.default)
        except Exception:  # noqa: BLE001 - /health must answer whatever the models folder holds
            return None

    def acquire(self, requested: Optional[str], keep_alive_s: Optional[float], embedder: Any = None) -> Held:
        """Blocking (a load takes seconds): the lease of the model ``requested`` names (module docstring)."""
        name = self._name(requested)
        self._refuse_embedding(requested, name, embedder)
        lease = self.pool.acquire(name, keep_alive_s=keep_alive_s)
        return Held(lease.engine, lease.model_id, lease.release)

    def _name(self, requested: Optional[str]) -> Optional[str]:
        if not requested:
            return self.default
        if self.default and requested in _aliases(self.default):
            return self.default
        if "/" in requested or "\\" in requested:  # a path: never looked up on disk for a client
            raise ModelNotFound(requested, self._ids())
        return requested

    def _refuse_embedding(self, requested: Optional[str], name: Optional[str], embedder: Any) -> None:
        if embedder is not None and requested and requested in (embedder.model_id, embedder.model_id.split("@")[0]):
            raise InvalidRequest(f"model {requested!r} is an embedding model; use /v1/embeddings", param="model")
        if name and self.catalog.is_embedding(name):
            raise InvalidRequest(f"model {requested!r} is an embedding model; use /v1/embeddings (or a chat "
                                 "model here)", param="model")

    def _ids(self) -> list[str]:
        return [m[0] for m in self.catalog.entries(None, None, self._defaults(), _remotes(self.pool))
                if m[2] == "chat"]

    def _defaults(self) -> list[str]:
        return [self.default] if self.default else []

    def listing(self, embedder: Any) -> list[dict[str, Any]]:
        """``/v1/models``' ``data``: the default model first (``hearth serve --model FILE``'s file, listed even
        outside the models folder), every installed model and every remote engine, ``loaded`` from the pool."""
        return self.catalog.listing(None, embedder, self.pool.status(), self._defaults(), _remotes(self.pool))

    def pool_status(self) -> Optional[dict[str, Any]]:
        """The pool's ``status()``, its budget and what it uses; ``load_errors`` (``ModelPool.load_errors``:
        per model whose last load failed, the message and when it is tried again) and ``default_load_error``
        (the default model's, or None) when the pool reports them."""
        out = {"budget_bytes": self.pool.budget_bytes, "used_bytes": self.pool.used_bytes(),
               "ttl_s": self.pool.ttl_s, "models": self.pool.status()}
        if hasattr(self.pool, "load_errors"):
            out["load_errors"] = self.pool.load_errors()
            try:
                err = self.pool.load_error(self.default)
            except HearthError:  # the default names no model the pool knows
                err = None
            out["default_load_error"] = None if err is None else str(err)
        return out


class WindowSource(EngineSource):
    """The desktop app's port: the window's engine for its own model (or no ``model``), and ``pool`` for every
    other installed model or remote engine, loaded on demand within the pool's budget, as ``hearth serve``
    does (``PoolSource``). The pool never loads a second copy of the window's model, and the window's engine
    is never unloaded by the pool. The pool's budget is taken from the RAM available when the port starts,
    which the window's model already uses."""

    def __init__(self, provider: Callable[[], Any], pool: Any, catalog: ModelCatalog) -> None:
        super().__init__(provider, catalog)
        self.pooled = PoolSource(pool, catalog, None)

    def acquire(self, requested: Optional[str], keep_alive_s: Optional[float], embedder: Any = None) -> Held:
        """Blocking: the window's engine for its model, else a lease from the pool."""
        eng = self.provider()
        if eng is None and not requested:
            raise NoModelLoaded("no chat model is loaded yet; try again in a moment")
        if eng is not None:
            try:
                return Held(eng, self.catalog.check_chat(requested, eng, embedder))
            except ModelNotLoaded:
                pass  # another installed model: the pool loads it
            except ModelNotFound:
                if not (requested and requested in getattr(self.pooled.pool, "remote_names", ())):
                    raise
        return self.pooled.acquire(requested, keep_alive_s, embedder)

    def listing(self, embedder: Any) -> list[dict[str, Any]]:
        """``/v1/models``: the window's model first, every installed model and remote engine; ``loaded`` for
        the window's and the pool's."""
        pool = self.pooled.pool
        return self.catalog.listing(self.provider(), embedder, pool.status(), remotes=_remotes(pool))

    def pool_status(self) -> Optional[dict[str, Any]]:
        return self.pooled.pool_status()


def _remotes(pool: Any) -> tuple[str, ...]:
    """The names of the remote engines ``pool`` serves (``local_pool``'s ``remote_names``; none for others)."""
    return tuple(getattr(pool, "remote_names", ()))


def _aliases(default: str) -> set[str]:
    """The names that mean the default model: its path, file name and id."""
    p = Path(default)
    return {default, p.name, p.stem} if p.suffix.lower() == ".gguf" else {default}


def source_for(engine_provider: Any, pool: Any, catalog: ModelCatalog, default_model: Optional[str]) -> Any:
    """The source ``create_app`` serves from: both an engine provider and a pool → ``WindowSource`` (the
    desktop app); the pool alone → ``PoolSource`` (``hearth serve``); else the engine provider (a callable, or
    an ``Engine``-like object served as is)."""
    provider = engine_provider if callable(engine_provider) else (lambda: engine_provider)
    if pool is not None and engine_provider is not None:
        return WindowSource(provider, pool, catalog)
    if pool is not None:
        return PoolSource(pool, catalog, default_model)
    return EngineSource(provider, catalog)


__all__ = ["EngineSource", "Held", "PoolSource", "WindowSource", "keep_alive_of", "loaded_id", "parse_keep_alive",
           "source_for"]
