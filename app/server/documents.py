"""RAG over the HTTP API: ``"hearth": {"documents": true, "k": 4}`` on /v1/chat/completions.

The last user message is the query. The evidence block goes into that user turn, before the question, so it
comes after the system prompt and the history: the prompt up to that turn is exactly what the client sent and
stays a cacheable prefix on the next turn (the placement ``app.memory.context`` uses). It is a preamble of the
turn rather than a message of its own because some chat templates insist that roles alternate.

The provider is an object with ``app.chat_service.DocumentContext``'s interface: ``evidence_for(query, k)
-> (block | None, [Evidence])``, ``notice`` (set by the last search) and ``citations(answer, evidence) ->
[dict]``. Its search state (``notice``, the store's connection) is shared by every request, so searches run
one at a time under a lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from starlette.concurrency import run_in_threadpool

from app.engine.types import ChatMessage
from app.errors import InvalidRequest
from app.server.convert import Plan
from app.server.errors import DocumentsUnavailable
from app.server.openai_schema import HearthOptions


@dataclass(frozen=True)
class Grounding:
    """The evidence one request was given. ``tokens``: the evidence block's size (0 when nothing matched)."""

    evidence: tuple[Any, ...]
    notice: Optional[str]
    tokens: int
    cite: Callable[[str, list[Any]], list[dict]]

    def given(self) -> dict[str, Any]:
        """What the model was given (the same for every choice)."""
        return {"evidence": [{"evidence_id": e.evidence_id, "path": e.path, "page": e.page, "text": e.text}
                             for e in self.evidence],
                "search_notice": self.notice}

    def citations(self, answer: str) -> list[dict]:
        """The passages ``answer`` cites by ID: evidence_id, path, page, quote ([] when it cites none)."""
        if not self.evidence:
            return []
        return [{k: c[k] for k in ("evidence_id", "path", "page", "quote")}
                for c in self.cite(answer, list(self.evidence))]


class Documents:
    """The server's documents provider (or None: requests asking for documents get a 400)."""

    def __init__(self, provider: Any = None) -> None:
        self.provider = provider
        self._lock = threading.Lock()

    async def ground(self, plan: Plan, options: Optional[HearthOptions], engine: Any) -> Plan:
        """``plan`` with the evidence in its messages and ``plan.grounding`` set; unchanged without
        ``hearth.documents``."""
        if options is None or not options.documents:
            return plan
        if self.provider is None:
            raise DocumentsUnavailable("this server has no document index: hearth.documents needs "
                                       "`hearth serve --documents` (or the desktop app's port)")
        messages = plan.requests[0].messages or ()
        i = _last_user(messages)
        if not messages[i].content.strip():
            raise InvalidRequest("hearth.documents needs a question to search for: the last user message is "
                                 "empty", param=f"messages[{i}].content")
        return await run_in_threadpool(self._ground, plan, messages[i].content, options.k, engine)

    def _ground(self, plan: Plan, query: str, k: Optional[int], engine: Any) -> Plan:
        block, evidence, notice = self._search(query, k)
        tokens = engine.count_tokens(block) if block else 0
        requests = plan.requests
        if block:
            requests = tuple(replace(r, messages=with_evidence(r.messages, block)) for r in requests)
        return replace(plan, requests=requests,
                       grounding=Grounding(tuple(evidence), notice, tokens, self.provider.citations))

    def _search(self, query: str, k: Optional[int]) -> tuple[Optional[str], list[Any], Optional[str]]:
        p = self.provider
        with self._lock:
            block, evidence = p.evidence_for(query, k)
            return block, list(evidence), p.notice


def with_evidence(messages: tuple[ChatMessage, ...], block: str) -> tuple[ChatMessage, ...]:
    """``messages`` with ``block`` as the preamble of the last user turn (everything else unchanged)."""
    i = _last_user(messages)
    turn = ChatMessage("user", block.rstrip("\n") + "\n\n" + messages[i].content)
    return (*messages[:i], turn, *messages[i + 1:])


def _last_user(messages: tuple[ChatMessage, ...]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return i
    raise InvalidRequest("hearth.documents needs a user message to search for", param="messages")
