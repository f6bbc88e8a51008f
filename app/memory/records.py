"""The values of conversation memory and how they are addressed, apart from any storage.

Dataclasses, content addresses, the JSON field codec and the export format's name and version; both the
store and ``app.memory.transfer`` build on this module, and it imports neither.

The reasoning: docs/memory.md, 'app/memory/records.py'.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from app.protocol.tools import ToolCall

log = logging.getLogger(__name__)

STATUSES = ("complete", "incomplete", "error")
EXPORT_FORMAT = "hearth.conversation"
EXPORT_VERSION = 3  # 2: messages carry tool_calls, tool_call_id and name; 3: reasoning_info (1 and 2 still import)
STOPPED_BY = ("budget", "deadline", "user")  # why Hearth ended thinking (app.protocol.reasoning.STOPPED_BY)


# --------------------------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class Conversation:
    """One conversation. ``current_message_id``: the tip of the branch last written to (None when empty).
    ``message_count`` is filled by ``list_conversations`` only."""

    id: str
    title: str
    model: str
    settings: dict
    created: str
    updated: str
    current_message_id: str | None = None
    message_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("message_count")
        return d


@dataclass(frozen=True)
class Message:
    """One stored message. ``token_count`` in tokens of the model that was loaded when it was stored (None if
    unknown). ``reasoning``: the thinking text stored apart with it (``Reasoning``; None: none).
    ``status``: complete | incomplete (streaming, or the process died mid-answer) | error.
    ``tool_calls``: the calls an assistant message made; ``tool_call_id`` and ``name``: which call a ``tool``
    message answers (its ``content`` is the whole result, never cut)."""

    id: str
    conversation_id: str
    parent_id: str | None
    role: str
    content: str
    reasoning: str | None = None
    token_count: int | None = None
    created: str = ""
    status: str = "complete"
    meta: dict = field(default_factory=dict)
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tool_calls"] = calls_to_list(self.tool_calls)
        return d


@dataclass(frozen=True)
class Reasoning:
    """The thinking behind one assistant message, stored apart from it (table ``message_reasoning``).

    ``text``: the thinking (markers removed); ``tokens``: thinking tokens sampled (None: unknown);
    ``budget``: thinking tokens allowed after fitting to the context (None: no limit / unknown); ``effort``:
    the effort that set the budget (none / low / medium / high; None when tokens were explicit or unset);
    ``forced``: Hearth ended thinking, ``stopped_by`` why (budget / deadline / user); ``unclosed``: the answer
    ended with thinking still open; ``thinking_s``: seconds of thinking (engine clock)."""

    message_id: str
    text: str
    tokens: int | None = None
    budget: int | None = None
    effort: str | None = None
    forced: bool = False
    stopped_by: str | None = None
    unclosed: bool = False
    thinking_s: float | None = None
    created: str = ""

    def info(self) -> dict[str, Any]:
        """Everything but the message id, the text and the time (the export's ``reasoning_info``)."""
        d = asdict(self)
        del d["message_id"], d["text"], d["created"]
        return d


REASONING_INFO_KEYS = ("tokens", "budget", "effort", "forced", "stopped_by", "unclosed", "thinking_s")


def reasoning_info_from(metrics: dict[str, Any], effort: str | None = None) -> dict[str, Any]:
    """``Reasoning`` fields from an answer's engine ``Metrics`` dict (``reasoning_tokens``,
    ``reasoning_budget``, ``reasoning_forced``, ``reasoning_stopped_by``, ``reasoning_unclosed``,
    ``thinking_s``) and the request's ``effort``."""
    return {"tokens": metrics.get("reasoning_tokens"), "budget": metrics.get("reasoning_budget"), "effort": effort,
            "forced": bool(metrics.get("reasoning_forced")), "stopped_by": metrics.get("reasoning_stopped_by"),
            "unclosed": bool(metrics.get("reasoning_unclosed")), "thinking_s": metrics.get("thinking_s")}


def check_reasoning_info(info: dict[str, Any] | None, what: str = "reasoning_info") -> dict[str, Any]:
    """``info`` with only ``REASONING_INFO_KEYS`` and values of the right types; ``ValueError`` naming the
    field otherwise (an unknown key too). None is ``{}``."""
    out: dict[str, Any] = {}
    for k, v in (info or {}).items():
        if k not in REASONING_INFO_KEYS:
            raise ValueError(f"{what} has an unknown key {k!r}; known: {', '.join(REASONING_INFO_KEYS)}")
        if v is None:
            out[k] = None
        elif k in ("tokens", "budget"):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{what}.{k} must be an integer >= 0 (tokens) or null, got {v!r}")
            out[k] = v
        elif k in ("forced", "unclosed"):
            if not isinstance(v, bool):
                raise ValueError(f"{what}.{k} must be true or false, got {v!r}")
            out[k] = v
        elif k == "stopped_by":
            if v not in STOPPED_BY:
                raise ValueError(f"{what}.stopped_by must be one of {', '.join(STOPPED_BY)} or null, got {v!r}")
            out[k] = v
        elif k == "thinking_s":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{what}.thinking_s must be a number >= 0 (seconds) or null, got {v!r}")
            out[k] = float(v)
        else:
            if not isinstance(v, str):
                raise ValueError(f"{what}.effort must be text or null, got {v!r}")
            out[k] = v
    return out


@dataclass(frozen=True)
class Summary:
    """A summary of the messages ``first_message_id`` .. ``last_message_id`` (inclusive) on one branch, written
    by ``model`` with ``settings``. The messages it covers stay in the store unchanged."""

    id: str
    conversation_id: str
    text: str
    first_message_id: str
    last_message_id: str
    model: str = ""
    settings: dict = field(default_factory=dict)
    created: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


CHECK_KEYS = ("supported", "sentence_start", "sentence_end", "support")  # the citation check's fields (m007)


@dataclass(frozen=True)
class Citation:
    """An assistant message citing retrieval evidence: ``evidence_id`` (app.retrieval's chunk id), the
    document ``path``, its ``page`` (1-based, None when the format has none) and the ``quote`` used.

    The citation check (``app.retrieval.citecheck``, stored since m007): ``supported`` (does the passage
    support the sentence citing it; None: not checked, e.g. stored before the check existed),
    ``sentence_start`` / ``sentence_end`` (the citing sentence's str indices in the message's content) and
    ``support`` (``SupportCheck.to_dict()``: ``missing``, ``similarity``, ``threshold``, ``reason``)."""

    message_id: str
    evidence_id: str
    path: str | None = None
    page: int | None = None
    quote: str | None = None
    supported: bool | None = None
    sentence_start: int | None = None
    sentence_end: int | None = None
    support: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict; without ``CHECK_KEYS`` when the citation was not checked (an unchecked
        citation exports as it did before m007)."""
        d = asdict(self)
        return d if self.supported is not None else {k: v for k, v in d.items() if k not in CHECK_KEYS}


@dataclass(frozen=True)
class Attribution:
    """One claim sentence of an assistant message tied to the passage that best supports it
    (``app.retrieval.attribution``, stored since m008): ``sentence_start`` / ``sentence_end`` (str indices in
    the message's content), ``evidence_id`` / ``path`` / ``page`` (None: attributed to none), ``supported``
    (True: its facts are in the passage; False: one is not; None: attributed to none, nothing to check) and
    ``support`` (``{missing, similarity, threshold, overlap, reason}``)."""

    message_id: str
    sentence_start: int
    sentence_end: int
    evidence_id: str | None = None
    path: str | None = None
    page: int | None = None
    supported: bool | None = None
    support: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def flagged_sentences(content: str, attributions: list[dict]) -> list[tuple[str, str]]:
    """``(sentence, reason)`` for each attribution of ``content`` marked unsupported (``supported`` False), the
    sentence with its whitespace folded, in answer order; a span outside ``content`` is skipped. What the
    exports and ``hearth history show`` / ``hearth chat`` print under an answer."""
    out = []
    for a in attributions:
        start, end = a.get("sentence_start"), a.get("sentence_end")
        if a.get("supported") is False and isinstance(start, int) and isinstance(end, int) \
                and 0 <= start < end <= len(content):
            out.append((" ".join(content[start:end].split()),
                        str((a.get("support") or {}).get("reason") or "not supported")))
    return out


@dataclass(frozen=True)
class SearchHit:
    """A message matching a search. ``snippet`` marks matches with [ and ]."""

    message_id: str
    conversation_id: str
    conversation_title: str
    role: str
    status: str
    created: str
    snippet: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ConversationData:
    """Everything stored for one conversation: all messages of all branches (in insertion order), summaries,
    citations, ``warnings`` about rows that could only be loaded in part, ``reasoning`` by message id and
    ``attributions`` (every message's, in message then answer order)."""

    conversation: Conversation
    messages: list[Message]
    summaries: list[Summary]
    citations: list[Citation]
    warnings: list[str] = field(default_factory=list)
    reasoning: dict[str, Reasoning] = field(default_factory=dict)
    attributions: list[Attribution] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------------------
# Helpers


def now() -> str:
    """The current time as an ISO 8601 UTC string with microseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def parent_key(parent_id: str | None, conversation_id: str) -> str:
    """What a message's id chains to: its parent's id, or ``"conversation:<id>"`` for a first message."""
    return parent_id if parent_id else f"conversation:{conversation_id}"


def message_id(role: str, content: str, parent_id: str | None, conversation_id: str,
               tool_calls: tuple[ToolCall, ...] | list = (), tool_call_id: str | None = None,
               name: str | None = None, variant: int = 1) -> str:
    """The content address of a message: sha256 hex over ``[parent key, role, content]`` (JSON, UTF-8), with
    ``{"tool_calls", "tool_call_id", "name"}`` appended when the message has any of them, then
    ``{"variant": variant}`` when ``variant`` > 1: the k-th generated answer with the same text under the same
    parent (a regeneration that repeated an earlier one is a version of its own; its meta keeps ``variant``)."""
    parts: list[Any] = [parent_key(parent_id, conversation_id), role, content]
    if tool_calls or tool_call_id is not None or name is not None:
        parts.append({"tool_calls": calls_to_list(tool_calls), "tool_call_id": tool_call_id, "name": name})
    if variant > 1:
        parts.append({"variant": variant})
    payload = json.dumps(parts, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def provisional_id(role: str, parent_id: str | None, conversation_id: str) -> str:
    """A random id for a message that has no final content yet (streaming, error): sha256 hex over its parent
    key, role and 16 random bytes, so it never collides with a content address."""
    payload = json.dumps([parent_key(parent_id, conversation_id), role, None, secrets.token_hex(16)])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def summary_id(conversation_id: str, first: str, last: str, text: str) -> str:
    """The content address of a summary: sha256 hex over its conversation, range and text."""
    payload = json.dumps(["summary", conversation_id, first, last, text], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def dumps_json(value: dict | None) -> str:
    """A JSON object field as stored: sorted keys, UTF-8 kept; None is ``{}``."""
    return json.dumps(value or {}, ensure_ascii=False, sort_keys=True)


def loads_json(raw: Any, what: str, warnings: list[str] | None) -> dict:
    """Parse a JSON object field; on failure log, record a warning and return {} (the row still loads)."""
    if raw is None or raw == "":
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as exc:
        msg = f"{what} is not valid JSON ({exc}); loaded as empty"
    else:
        if isinstance(value, dict):
            return value
        msg = f"{what} is not a JSON object; loaded as empty"
    log.warning("%s", msg)
    if warnings is not None:
        warnings.append(msg)
    return {}


def calls_to_list(calls: tuple[ToolCall, ...] | list) -> list[dict[str, str]]:
    """Tool calls as JSON-ready dicts ``{id, name, arguments}`` (dicts pass through as those three keys)."""
    out = []
    for c in calls:
        d = c if isinstance(c, dict) else {"id": c.id, "name": c.name, "arguments": c.arguments}
        out.append({"id": d["id"], "name": d["name"], "arguments": d["arguments"]})
    return out


def calls_from_list(raw: Any, what: str) -> tuple[ToolCall, ...]:
    """``[{id, name, arguments}, ...]`` → ``ToolCall``s; ``ValueError`` naming ``what`` when malformed."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{what} must be a list of {{id, name, arguments}}")
    calls = []
    for i, c in enumerate(raw):
        if not isinstance(c, dict) or not all(isinstance(c.get(k), str) for k in ("id", "name", "arguments")):
            raise ValueError(f"{what}[{i}] needs id, name and arguments as text")
        calls.append(ToolCall(c["id"], c["name"], c["arguments"]))
    return tuple(calls)


def dumps_calls(calls: tuple[ToolCall, ...] | list) -> str | None:
    """A message's tool calls as stored: a JSON array, or None when it made none."""
    return json.dumps(calls_to_list(calls), ensure_ascii=False) if calls else None


def loads_calls(raw: Any, what: str, warnings: list[str] | None) -> tuple[ToolCall, ...]:
    """Parse a stored tool-calls field; on failure log, record a warning and return () (the row still loads)."""
    if raw is None or raw == "":
        return ()
    try:
        return calls_from_list(json.loads(raw), what)
    except (TypeError, ValueError) as exc:
        msg = f"{what} is not a valid list of tool calls ({exc}); loaded as none"
    log.warning("%s", msg)
    if warnings is not None:
        warnings.append(msg)
    return ()
