"""Model ids for ``/v1/models`` and the rule for a request's ``model`` field.

Ids come from the registry (``app.catalog.registry.list_models``: file name without ``.gguf``), plus the
loaded model when it lives elsewhere and the embedding model when one is served.

The reasoning: docs/server.md, 'app/server/models.py'.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from app.errors import HearthError, InvalidRequest, ModelNotFound
from app.protocol.backend import Backend
from app.server.errors import CannotEmbed, ModelNotLoaded

log = logging.getLogger(__name__)

Entry = tuple[str, str, str]  # (id, path, kind: "chat" | "embedding")


def _registry_entries() -> list[Entry]:
    from app.catalog.registry import list_models

    out = []
    for e in list_models():
        if e.error is None:
            kind = "embedding" if e.info is not None and e.info.is_embedding_model else "chat"
            out.append((e.id, str(e.path), kind))
    return out


def loaded_id(engine: Backend) -> str:
    """The loaded model's id: ``registry.model_id`` of its file (the id ``/v1/models`` lists)."""
    from app.catalog.registry import model_id

    return model_id(str(engine.model_path))


def _aliases(path: str, mid: str) -> set[str]:
    """The strings a request's ``model`` may give for the model at ``path``: its id, file name, stem, path."""
    from app.catalog.registry import model_id

    return {mid, Path(path).name, model_id(path), path}


class ModelCatalog:
    """``entries``: a callable listing ``(id, path, kind)`` (default: the registry). ``load_for(model_id)``:
    the ``LoadSettings`` a model would load with (default: ``LoadSettings()``), for its memory estimate."""

    def __init__(self, entries: Optional[Callable[[], Iterable[Entry]]] = None,
                 load_for: Optional[Callable[[str], Any]] = None) -> None:
        self._entries = entries or _registry_entries
        self._load_for = load_for
        self._infos: dict[str, tuple[tuple, Any]] = {}  # path -> (file stamp, ModelInfo | None)

    def entries(self, engine: Optional[Backend], embedder: Any, extra_paths: Iterable[str] = (),
                remotes: Iterable[str] = ()) -> list[Entry]:
        """The models to list, the served one first: the loaded ``engine``'s (else the first of
        ``extra_paths``, the default model's file), then the registry's, the other ``extra_paths`` when they
        live elsewhere, the remote engines ``remotes`` (path ``""``) and the served ``embedder``'s (its
        ``model_path``; ``""`` for one without)."""
        try:
            found = list(self._entries())
        except Exception:  # noqa: BLE001 - a broken models folder must not break /v1/models
            log.exception("listing models failed")
            found = []
        paths = [str(engine.model_path)] if engine is not None else []
        for path in [*paths, *extra_paths]:
            if not any(_same(p, path) for _, p, _ in found):
                from app.catalog.registry import model_id

                # its id means this file in a request (an alias of the served model): listed once, as it
                found = [e for e in found if e[0] != model_id(path)] + [(model_id(path), path, "chat")]
        first = next(iter([*paths, *extra_paths]), None)
        if first is not None:  # clients pick the first model listed: the one an absent ``model`` means
            found.sort(key=lambda e: not _same(e[1], first))
        found += [(name, "", "chat") for name in remotes if not any(e[0] == name for e in found)]
        if embedder is not None:  # its file (when it has one) gives its size, details and mtime like any model's
            path = str(getattr(embedder, "model_path", "") or "")
            found = [e for e in found if e[0] != _stem(embedder.model_id) and not _same(e[1], path)]
            found.append((embedder.model_id, path, "embedding"))
        return found

    def listing(self, engine: Optional[Backend], embedder: Any, pool: Optional[dict[str, dict[str, Any]]] = None,
                extra_paths: Iterable[str] = (), remotes: Iterable[str] = ()) -> list[dict[str, Any]]:
        """``/v1/models``' ``data``, in ``entries``' order. ``pool``: a ``ModelPool.status()`` (then ``loaded``,
        ``state`` and the pool's figures come from it); ``engine``: the window's engine (its model is loaded
        too), or None; ``extra_paths``, ``remotes``: as ``entries``. A remote's ``hearth.remote`` is true."""
        now = int(time.time())
        loaded = str(engine.model_path) if engine is not None else None
        remotes = tuple(remotes)
        out = []
        for mid, path, kind in self.entries(engine, embedder, extra_paths, remotes):
            try:
                created = int(Path(path).stat().st_mtime) if path else now
            except OSError:
                created = now
            slot = (pool or {}).get(mid)
            if kind == "embedding":
                is_loaded = embedder is not None
            else:
                is_loaded = bool(slot and slot["loaded"]) or (loaded is not None and path == loaded)
            meta = {"kind": kind, "loaded": is_loaded, "file": Path(path).name if path else None,
                    **self.describe(mid, path, kind)}
            if pool is not None and kind == "chat":
                meta["pool"] = slot or {"state": "unloaded", "loaded": False}
            if not path and mid in remotes:
                meta["remote"] = True
            out.append({"id": mid, "object": "model", "created": created, "owned_by": "hearth", "hearth": meta})
        return out

    def describe(self, mid: str, path: str, kind: str) -> dict[str, Any]:
        """``memory_estimate_bytes``, ``capabilities``, ``tool_format`` and ``thinking`` of one model
        (docs/server.md, 'app/server/models.py'); a file that cannot be read gives what its kind alone says."""
        info = self.info(path) if path else None
        if kind == "embedding":
            return {"memory_estimate_bytes": self._estimate(mid, info), "capabilities": ["embeddings"]}
        out = {"memory_estimate_bytes": self._estimate(mid, info), **chat_capabilities(info)}
        return out

    def info(self, path: str) -> Any:
        """The file's ``ModelInfo`` (None when it cannot be read), read once per size and mtime."""
        from app.catalog.gguf import inspect_model
        from app.engine.pool import file_stamp

        stamp = file_stamp(path)
        got = self._infos.get(path)
        if got is not None and got[0] == stamp:
            return got[1]
        try:
            info = inspect_model(Path(path)) if stamp[0] is not None else None
        except HearthError:
            info = None
        self._infos[path] = (stamp, info)
        return info

    def is_embedding(self, name: str) -> bool:
        """Whether the installed model ``name`` names is an embedding model (False when unknown: the pool
        answers that with its 404)."""
        from app.catalog.registry import resolve_model

        try:
            path = resolve_model(name, allow_paths="/" in name or "\\" in name)
        except HearthError:
            return False
        info = self.info(str(path))
        return bool(info is not None and info.is_embedding_model)

    def _estimate(self, mid: str, info: Any) -> Optional[int]:
        if info is None:
            return None
        from app.catalog.memory_estimate import estimate_memory, resolve_parallel
        from app.protocol.types import LoadSettings

        try:
            settings = self._load_for(mid) if self._load_for is not None else LoadSettings()
            return estimate_memory(info, resolve_parallel(info, settings), detect_ram=False).total_bytes
        except HearthError:
            return None

    def check_chat(self, requested: Optional[str], engine: Backend, embedder: Any = None) -> str:
        """The id to answer with, or ``ModelNotLoaded`` / ``ModelNotFound``."""
        loaded = loaded_id(engine)
        if not requested or requested in _aliases(str(engine.model_path), loaded):
            return loaded
        entries = self.entries(engine, embedder)
        for mid, path, kind in entries:
            names = _aliases(path, mid) if path else {mid, _stem(mid)}
            if requested not in names:
                continue
            if kind == "embedding":
                raise InvalidRequest(f"model {requested!r} is an embedding model; use /v1/embeddings, or "
                                     f"model {loaded!r} here", param="model")
            raise ModelNotLoaded(requested, loaded)
        raise ModelNotFound(requested, [e[0] for e in entries])

    def check_embedding(self, requested: Optional[str], engine: Optional[Backend], embedder: Any) -> str:
        if embedder is None:
            raise CannotEmbed("the loaded model cannot embed; this server has no embedding model (start it with "
                              "`hearth serve --embeddings`)")
        mid = embedder.model_id
        if not requested or requested in (mid, _stem(mid)):
            return mid
        if engine is not None and requested in _aliases(str(engine.model_path), loaded_id(engine)):
            raise CannotEmbed(f"model {requested!r} is a chat model and cannot embed; use {mid!r}")
        raise ModelNotFound(requested, [mid])


def chat_capabilities(info: Any) -> dict[str, Any]:
    """``capabilities``, ``tool_format`` and ``thinking`` of a chat model from its ``ModelInfo`` (None: the
    file could not be read; then only ``chat`` is claimed)."""
    if info is None:
        return {"capabilities": ["chat"], "tool_format": None, "thinking": None}
    from app.engine.chat.templates import choose_template_name, tool_format
    from app.engine.chat.thinking import markers_for

    template = choose_template_name(info)
    markers = markers_for(template, info.chat_template, info.architecture)
    native = not markers.prefill_start
    caps = ["chat", "tools"] + (["thinking"] if native else [])
    return {"capabilities": caps, "tool_format": tool_format(template, info.architecture, info.chat_template).name,
            "thinking": {"family": markers.family, "native": native}}


def anthropic_model(m: dict[str, Any]) -> dict[str, Any]:
    """One ``/v1/models`` entry in Anthropic's shape (``ModelInfo``: ``type``, ``id``, ``display_name``,
    ``created_at`` as RFC 3339 UTC); the ``hearth`` object stays."""
    from datetime import datetime, timezone

    created = datetime.fromtimestamp(m["created"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "model", "id": m["id"], "display_name": m["id"], "created_at": created, "hearth": m["hearth"]}


def anthropic_page(data: list[dict[str, Any]], limit: Any = None, after_id: Optional[str] = None,
                   before_id: Optional[str] = None) -> dict[str, Any]:
    """``GET /v1/models`` in Anthropic's shape: ``data`` (``anthropic_model`` each, in ``data``'s order),
    ``has_more``, ``first_id``, ``last_id``; ``limit`` (1-1000, default 20), ``after_id`` / ``before_id``
    page through it as Anthropic's API does. Raises ``InvalidRequest`` for a bad limit or an unknown id."""
    try:
        n = 20 if limit is None else int(limit)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= 1000:
        raise InvalidRequest(f"limit must be a whole number from 1 to 1000, got {limit!r:.40}", param="limit")
    ids = [m["id"] for m in data]
    for name, at in (("after_id", after_id), ("before_id", before_id)):
        if at is not None and at not in ids:
            raise InvalidRequest(f"{name} {at!r:.80} is not a listed model id", param=name)
    if after_id is not None:
        page = data[ids.index(after_id) + 1:]
        more = len(page) > n
        page = page[:n]
    elif before_id is not None:
        head = data[:ids.index(before_id)]
        page, more = head[-n:], len(head) > n
    else:
        page, more = data[:n], len(data) > n
    out = [anthropic_model(m) for m in page]
    return {"data": out, "has_more": more, "first_id": out[0]["id"] if out else None,
            "last_id": out[-1]["id"] if out else None}


def _same(a: str, b: str) -> bool:
    """Whether two model paths name one file (as written: nothing is looked up on disk)."""
    return bool(a) and bool(b) and Path(a) == Path(b)


def _stem(model_id: str) -> str:
    """``all-MiniLM-L6-v2@0123abcd`` → ``all-MiniLM-L6-v2`` (the embedder's id carries a content hash)."""
    return model_id.split("@", 1)[0]
