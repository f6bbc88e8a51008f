"""Grounding: evidence for a request that carries its own history (the HTTP port's
``"hearth": {"documents": true}``), placed so that the next request's prompt begins with this one's. The
stored chat (``Assistant.turn``: the window, ``hearth chat``) grounds the prompt its ``ContextBuilder`` plans
with the same ``ground`` (``ContextBuilder.build(ground=...)``), so both place evidence one way.

The reasoning: docs/memory.md, 'app/assistant/grounding.py'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.assistant import evidence as ev
from app.assistant.budget import DEFAULT_MAX_TOKENS, prompt_tokens
from app.errors import InvalidRequest
from app.memory.context import ContextBuilder, with_evidence
from app.protocol.backend import Backend
from app.protocol.types import ChatMessage
from app.retrieval.types import Evidence


@dataclass(frozen=True)
class Grounding:
    """The evidence one request was given: ``evidence`` (every passage in the prompt, in prompt order: the
    earlier turns' first, the last question's at the end), ``notice`` (search degraded, passages left out),
    ``tokens`` (the evidence blocks' size, all turns; 0 when nothing matched or nothing fitted), ``source``:
    the ``DocumentSource`` searched (its ``checker()`` checks citations)."""

    evidence: tuple[Evidence, ...]
    notice: str | None
    tokens: int
    source: Any = None

    def given(self) -> dict[str, Any]:
        """What the model was given (the same for every choice)."""
        return {"evidence": ev.given(self.evidence), "search_notice": self.notice}

    def citations(self, answer: str) -> list[dict]:
        """The passages ``answer`` cites (``evidence.citations``)."""
        return ev.citations(answer, self.evidence)

    def checked_citations(self, answer: str) -> list[dict]:
        """The passages ``answer`` cites, each with ``supported``, the citing sentence's span and ``support``
        (``evidence.checked_citations`` with the source's checker): what ``hearth.citations`` should carry."""
        checker = self.source.checker() if self.source is not None else None
        return ev.checked_citations(answer, self.evidence, checker)

    def attributions(self, answer: str) -> list[dict]:
        """Each claim sentence of ``answer`` attributed to a passage given (or none), its facts checked
        (``evidence.attributions`` with the source's checker): what ``hearth.attributions`` should carry."""
        checker = self.source.checker() if self.source is not None else None
        return ev.attributions(answer, self.evidence, checker)


@dataclass
class _Turn:
    """One user message's evidence: its index in the messages, the prompt block, its tokens, the passages
    given in it, and ``covered``: how many of its search's passages the prompt holds (given here or above)."""

    index: int
    block: str
    tokens: int
    given: tuple[Evidence, ...]
    covered: int = 0


def last_user(messages: tuple[ChatMessage, ...]) -> int:
    """Index of the last user message; ``InvalidRequest`` (param ``messages``) when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return i
    raise InvalidRequest("hearth.documents needs a user message to search for", param="messages")


def ground(engine: Backend, documents: ev.DocumentSource, messages: tuple[ChatMessage, ...], *, k: int,
           max_tokens: int | None) -> tuple[tuple[ChatMessage, ...], Grounding]:
    """``messages`` with evidence in each user message (module docstring), and what was given. ``k``:
    passages searched per question; ``max_tokens``: the answer's reserve (tokens; None:
    ``DEFAULT_MAX_TOKENS``). Raises ``InvalidRequest`` for no user message or an empty last one."""
    last = last_user(messages)
    if not messages[last].content.strip():
        raise InvalidRequest("hearth.documents needs a question to search for: the last user message is empty",
                             param=f"messages[{last}].content")
    n_ctx = engine.settings.n_ctx
    reserve = min(max_tokens or DEFAULT_MAX_TOKENS, max(1, n_ctx // 2))
    builder = ContextBuilder(engine.count_tokens, n_ctx, reserve)
    base = prompt_tokens(engine, messages)
    questions = [i for i, m in enumerate(messages[:last]) if m.role == "user" and m.content.strip()] + [last]
    alone = _last_kept(_plan(documents, messages, [last], k, builder, base)[0], last)
    while True:
        turns, notices = _plan(documents, messages, questions, k, builder, base)
        fits = base + sum(t.tokens for t in turns) <= builder.available
        if len(questions) == 1 or (fits and _last_kept(turns, last) >= alone):
            break
        questions = questions[1:]  # the oldest question loses its evidence (whole turns, never half a block)
    notice = ev.join_notices(*notices)
    if not turns:
        return messages, Grounding((), notice, 0, documents)
    blocks = {t.index: t.block for t in turns}
    out = tuple(ChatMessage("user", with_evidence(blocks[j], m.content)) if j in blocks else m
                for j, m in enumerate(messages))
    return out, Grounding(tuple(e for t in turns for e in t.given), notice, sum(t.tokens for t in turns), documents)


FOLLOW_UP_WORDS = frozenset("it its that this these those they them one ones there".split())
FOLLOW_UP_STARTS = ("and ", "also ", "what about ", "how about ", "then ", "so ")
MAX_FOLLOW_UP_WORDS = 3  # content words (``query.keyword_query``) of a question too thin to search alone


def is_follow_up(question: str) -> bool:
    """True for an elliptical follow-up: at most ``MAX_FOLLOW_UP_WORDS`` content words, and it starts like a
    continuation ("and ...", "what about ...") or points back ("it", "that", "them", ...)."""
    from app.retrieval.query import keyword_query

    q = question.strip().lower()
    words = set(re.findall(r"\w+", q))
    thin = len(keyword_query(question).words) <= MAX_FOLLOW_UP_WORDS
    return thin and (q.startswith(FOLLOW_UP_STARTS) or bool(words & FOLLOW_UP_WORDS))


def search_query(messages: tuple[ChatMessage, ...], i: int) -> str:
    """What user message ``i`` is searched with: its text; for an elliptical follow-up (``is_follow_up``:
    "and the least I can put in?", "can I use vinegar for that?"), the previous user message's text and its
    own: alone it would find passages about anything, with the question before it the topic being
    discussed (mostly passages the prompt already holds, given once, so the prompt also grows less). A
    question that can stand alone is searched alone (with the previous one, that question's passages would
    crowd out its own). Depends only on ``messages[:i + 1]``: the same turn is searched the same way on
    every later request."""
    text = messages[i].content
    prev = next((messages[j].content for j in range(i - 1, -1, -1)
                 if messages[j].role == "user" and messages[j].content.strip()), None)
    return f"{prev}\n{text}" if prev is not None and is_follow_up(text) else text


def _last_kept(turns: list[_Turn], last: int) -> int:
    """How many of the last question's passages the prompt holds (given in its turn or above)."""
    return sum(t.covered for t in turns if t.index == last)


def _plan(documents: ev.DocumentSource, messages: tuple[ChatMessage, ...], questions: list[int], k: int,
          builder: ContextBuilder, base: int) -> tuple[list[_Turn], list[str | None]]:
    """The evidence block of each of ``questions`` (indices of user messages, the last one last), each
    passage given once (later turns name repeats), and the last question's notices."""
    last = questions[-1]
    turns: list[_Turn] = []
    seen: dict[str, Evidence] = {}
    notices: list[str | None] = []
    for i in questions:
        found = documents.search(search_query(messages, i), k)
        new = [e for e in found.evidence if e.evidence_id not in seen]
        text = ev.evidence_text(new, [seen[e.evidence_id] for e in found.evidence if e.evidence_id in seen],
                                instructions=not turns)
        if i == last:
            notices.append(found.notice)
        if text is None:
            continue
        room = builder.evidence_room(base + sum(t.tokens for t in turns)) if i == last else builder.evidence_room(0)
        block, tokens, kept = builder.fit_evidence(text, room)
        given = tuple(new[j] for j in kept if j < len(new))
        if i == last:
            notices.append(ev.dropped_notice(len(new) - len(given)))
        if block:
            repeats = len(found.evidence) - len(new)
            turns.append(_Turn(i, block, tokens, given, len(given) + repeats))
            seen.update((e.evidence_id, e) for e in given)
    return turns, notices
