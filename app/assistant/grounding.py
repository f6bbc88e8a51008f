"""Stateless grounding: evidence for a request that carries its own history (the HTTP port's
``"hearth": {"documents": true}``), placed and trimmed exactly as a stored chat turn places it.

The last user message is the query. The evidence (``evidence.evidence_text``: one header, one passage each)
goes into that user turn before the question (``app.memory.context.with_evidence``), so it comes after the
system prompt and the history: the prompt up to that turn is exactly what the client sent and stays a
cacheable prefix on the next turn. Passages are kept from the best while they fit: at most the builder's
``evidence_fraction`` of the prompt budget, and never more than the client's messages leave after
``max_tokens`` (``ContextBuilder.evidence_room``, the rule a stored turn follows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.assistant import evidence as ev
from app.assistant.turn import DEFAULT_MAX_TOKENS, prompt_tokens
from app.engine.types import ChatMessage
from app.errors import InvalidRequest
from app.memory.context import ContextBuilder, with_evidence
from app.retrieval.types import Evidence


@dataclass(frozen=True)
class Grounding:
    """The evidence one request was given: ``evidence`` (best first), ``notice`` (search degraded), ``tokens``
    (the evidence block's size; 0 when nothing matched or nothing fitted)."""

    evidence: tuple[Evidence, ...]
    notice: str | None
    tokens: int

    def given(self) -> dict[str, Any]:
        """What the model was given (the same for every choice)."""
        return {"evidence": ev.given(self.evidence), "search_notice": self.notice}

    def citations(self, answer: str) -> list[dict]:
        """The passages ``answer`` cites (``evidence.citations``)."""
        return ev.citations(answer, self.evidence)


def last_user(messages: tuple[ChatMessage, ...]) -> int:
    """Index of the last user message; ``InvalidRequest`` (param ``messages``) when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return i
    raise InvalidRequest("hearth.documents needs a user message to search for", param="messages")


def ground(engine: Any, documents: ev.DocumentSource, messages: tuple[ChatMessage, ...], *, k: int,
           max_tokens: int | None) -> tuple[tuple[ChatMessage, ...], Grounding]:
    """``messages`` with evidence for their last user message, and what was given. ``k``: passages searched;
    ``max_tokens``: the answer's reserve (tokens; None: ``DEFAULT_MAX_TOKENS``). Raises ``InvalidRequest``
    for no user message or an empty one."""
    i = last_user(messages)
    query = messages[i].content
    if not query.strip():
        raise InvalidRequest("hearth.documents needs a question to search for: the last user message is empty",
                             param=f"messages[{i}].content")
    found = documents.search(query, k)
    text = ev.evidence_text(found.evidence)
    if text is None:
        return messages, Grounding((), found.notice, 0)
    n_ctx = engine.settings.n_ctx
    reserve = min(max_tokens or DEFAULT_MAX_TOKENS, max(1, n_ctx // 2))
    builder = ContextBuilder(engine.count_tokens, n_ctx, reserve)
    room = builder.evidence_room(prompt_tokens(engine, messages))
    block, tokens, kept = builder.fit_evidence(text, room)
    notice = ev.join_notices(found.notice, ev.dropped_notice(len(found.evidence) - len(kept)))
    if not kept:
        return messages, Grounding((), notice, 0)
    turn = ChatMessage("user", with_evidence(block, query))
    given = tuple(found.evidence[j] for j in kept)
    return (*messages[:i], turn, *messages[i + 1:]), Grounding(given, notice, tokens)
