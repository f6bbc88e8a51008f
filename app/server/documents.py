"""RAG over the HTTP API: ``"hearth": {"documents": true, "k": 4}`` on /v1/chat/completions.

A thin adapter over ``app.assistant.grounding.ground``: the evidence is placed and trimmed exactly as in a
stored chat turn (the last user message is the query; the evidence goes into that turn, before the question,
so the prompt up to it stays a cacheable prefix). The provider is an ``app.assistant.DocumentSource`` (thread-
safe; ``hearth serve --documents`` and the desktop's port pass one), or None: such requests get a 400.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from starlette.concurrency import run_in_threadpool

from app.assistant.turn import DEFAULT_K
from app.protocol.backend import Backend
from app.server.convert import Plan
from app.server.errors import DocumentsUnavailable
from app.server.openai_schema import HearthOptions


class Documents:
    """The server's documents provider (a ``DocumentSource``, or None)."""

    def __init__(self, provider: Any = None) -> None:
        self.provider = provider

    async def ground(self, plan: Plan, options: Optional[HearthOptions], engine: Backend) -> Plan:
        """``plan`` with the evidence in its messages and ``plan.grounding`` set; unchanged without
        ``hearth.documents``. Raises ``DocumentsUnavailable`` (no provider) and ``InvalidRequest`` (no user
        message, or an empty one)."""
        if options is None or not options.documents:
            return plan
        if self.provider is None:
            raise DocumentsUnavailable("this server has no document index: hearth.documents needs "
                                       "`hearth serve --documents` (or the desktop app's port)")
        return await run_in_threadpool(self._ground, plan, options.k or DEFAULT_K, engine)

    def _ground(self, plan: Plan, k: int, engine: Backend) -> Plan:
        from app.assistant.grounding import ground

        first = plan.requests[0]
        messages, grounding = ground(engine, self.provider, first.messages or (), k=k,
                                     max_tokens=first.decoding.max_tokens)
        requests = tuple(replace(r, messages=messages) for r in plan.requests)
        return replace(plan, requests=requests, grounding=grounding)
