"""The port's registry of running requests: response id → the engine generations answering it.

``POST /v1/hearth/requests/{id}/stop_thinking`` needs to reach a request that another HTTP connection is
streaming. The id is the answer's own ``id`` (``chatcmpl-…`` / ``cmpl-…``), which every chunk carries,
the first one included, so a client knows it as soon as anything arrives. No other id exists: a second one
would be a second name for the same request.

The reasoning: docs/server.md, 'app/server/running.py'.
"""

from __future__ import annotations

import threading
from typing import Any

from app.server.errors import RequestNotFound


class Entry:
    """One running answer's generations (docs/server.md, 'app/server/running.py')."""

    def __init__(self, registry: "Running", request_id: str) -> None:
        self.registry, self.id = registry, request_id
        self._gens: list[Any] = []

    def add(self, generation: Any) -> Any:
        """Record ``generation`` (an ``app.engine.local.engine.Generation``) as part of this answer; returns it."""
        with self.registry.lock:
            self._gens.append(generation)
        return generation

    def generations(self) -> list[Any]:
        """The generations recorded so far (a copy)."""
        with self.registry.lock:
            return list(self._gens)

    def close(self) -> None:
        """The answer has ended: forget it (idempotent)."""
        self.registry.close(self.id)


class Running:
    """Response id → ``Entry`` for every answer being computed by this server."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._entries: dict[str, Entry] = {}

    def open(self, request_id: str) -> Entry:
        """A new entry for ``request_id`` (an answer's id; ids are random, so never reused)."""
        entry = Entry(self, request_id)
        with self.lock:
            self._entries[request_id] = entry
        return entry

    def close(self, request_id: str) -> None:
        """Forget ``request_id`` (no-op when unknown)."""
        with self.lock:
            self._entries.pop(request_id, None)

    def ids(self) -> list[str]:
        """The ids of the answers running now."""
        with self.lock:
            return list(self._entries)

    def get(self, request_id: str) -> Entry:
        """The entry of ``request_id``; raises ``RequestNotFound`` (a 404) when none is running."""
        with self.lock:
            entry = self._entries.get(request_id)
        if entry is None:
            raise RequestNotFound(request_id)
        return entry

    def stop_thinking(self, request_id: str) -> bool:
        """Ask every generation of ``request_id`` to end its thinking now (blocking: run it off the event
        loop). True when at least one will; raises ``RequestNotFound``."""
        stopped = False
        for gen in self.get(request_id).generations():
            stopped = bool(gen.stop_thinking()) or stopped
        return stopped
