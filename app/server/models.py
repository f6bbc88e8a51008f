"""Model ids for ``/v1/models`` and the rule for a request's ``model`` field.

Ids come from the registry (``app.engine.registry.list_models``: file name without ``.gguf``), plus the
loaded model when it lives elsewhere and the embedding model when one is served.

The ``model`` a request names is matched by plain string comparison (never looked up on disk, so a client
cannot probe the file system): the loaded model's id, its file name or its full path are the loaded model;
an absent ``model`` means the loaded one. Another installed model is a 400 ``model_not_loaded`` naming the
loaded one: the API never switches models silently and never swaps them either (the desktop UI owns that
choice; a headless server is started with ``--model``). Anything else is a 404 ``model_not_found`` listing
the valid ids.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from app.errors import InvalidRequest, ModelNotFound
from app.server.errors import CannotEmbed, ModelNotLoaded

log = logging.getLogger(__name__)

Entry = tuple[str, str, str]  # (id, path, kind: "chat" | "embedding")


def _registry_entries() -> list[Entry]:
    from app.engine.registry import list_models

    out = []
    for e in list_models():
        if e.error is None:
            kind = "embedding" if e.info is not None and e.info.is_embedding_model else "chat"
            out.append((e.id, str(e.path), kind))
    return out


def loaded_id(engine: Any) -> str:
    """The loaded model's id: ``registry.model_id`` of its file (the id ``/v1/models`` lists)."""
    from app.engine.registry import model_id

    return model_id(str(engine.model_path))


def _aliases(path: str, mid: str) -> set[str]:
    """The strings a request's ``model`` may give for the model at ``path``: its id, file name, stem, path."""
    from app.engine.registry import model_id

    return {mid, Path(path).name, model_id(path), path}


class ModelCatalog:
    """``entries``: a callable listing ``(id, path, kind)`` (default: the registry)."""

    def __init__(self, entries: Optional[Callable[[], Iterable[Entry]]] = None) -> None:
        self._entries = entries or _registry_entries

    def entries(self, engine: Any, embedder: Any) -> list[Entry]:
        try:
            found = list(self._entries())
        except Exception:  # noqa: BLE001 - a broken models folder must not break /v1/models
            log.exception("listing models failed")
            found = []
        if engine is not None and not any(Path(p) == Path(str(engine.model_path)) for _, p, _ in found):
            found.insert(0, (loaded_id(engine), str(engine.model_path), "chat"))
        if embedder is not None:
            found = [e for e in found if e[0] != _stem(embedder.model_id)]
            found.append((embedder.model_id, "", "embedding"))
        return found

    def listing(self, engine: Any, embedder: Any) -> list[dict[str, Any]]:
        now = int(time.time())
        loaded = str(engine.model_path) if engine is not None else None
        out = []
        for mid, path, kind in self.entries(engine, embedder):
            try:
                created = int(Path(path).stat().st_mtime) if path else now
            except OSError:
                created = now
            is_loaded = (path == loaded) if kind == "chat" else embedder is not None
            out.append({"id": mid, "object": "model", "created": created, "owned_by": "hearth",
                        "hearth": {"kind": kind, "loaded": is_loaded, "file": Path(path).name if path else None}})
        return out

    def check_chat(self, requested: Optional[str], engine: Any, embedder: Any = None) -> str:
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

    def check_embedding(self, requested: Optional[str], engine: Any, embedder: Any) -> str:
        if embedder is None:
            raise CannotEmbed("the loaded model cannot embed; this server has no embedding model (start it with "
                              "`hearth serve --embeddings`)")
        mid = embedder.model_id
        if not requested or requested in (mid, _stem(mid)):
            return mid
        if engine is not None and requested in _aliases(str(engine.model_path), loaded_id(engine)):
            raise CannotEmbed(f"model {requested!r} is a chat model and cannot embed; use {mid!r}")
        raise ModelNotFound(requested, [mid])


def _stem(model_id: str) -> str:
    """``all-MiniLM-L6-v2@0123abcd`` → ``all-MiniLM-L6-v2`` (the embedder's id carries a content hash)."""
    return model_id.split("@", 1)[0]
