"""The values of conversation memory and how they are addressed, apart from any storage.

The dataclasses a store hands out (``Conversation``, ``Message``, ``Summary``, ``Citation``, ``SearchHit``,
``ConversationData``), the content addresses (``message_id``, ``summary_id``; ``provisional_id`` for a message
still streaming), the JSON field codec (``dumps_json``, ``loads_json``: a field that does not parse loads as
``{}`` with a warning) and the export format's name and version. Both ``app.memory.store`` (SQLite) and
``app.memory.transfer`` (export/import) build on this module; it imports neither, so the two never need each
other's private names. Times are ISO 8601 UTC strings (microseconds), which sort as text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger(__name__)

STATUSES = ("complete", "incomplete", "error")
EXPORT_FORMAT = "hearth.conversation"
EXPORT_VERSION = 1


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
    unknown). ``status``: complete | incomplete (streaming, or the process died mid-answer) | error."""

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


@dataclass(frozen=True)
class Citation:
    """An assistant message citing retrieval evidence: ``evidence_id`` (app.retrieval's chunk id), the
    document ``path``, its ``page`` (1-based, None when the format has none) and the ``quote`` used."""

    message_id: str
    evidence_id: str
    path: str | None = None
    page: int | None = None
    quote: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    citations, and ``warnings`` about rows that could only be loaded in part."""

    conversation: Conversation
    messages: list[Message]
    summaries: list[Summary]
    citations: list[Citation]
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------------------
# Helpers


def now() -> str:
    """The current time as an ISO 8601 UTC string with microseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def parent_key(parent_id: str | None, conversation_id: str) -> str:
    """What a message's id chains to: its parent's id, or ``"conversation:<id>"`` for a first message."""
    return parent_id if parent_id else f"conversation:{conversation_id}"


def message_id(role: str, content: str, parent_id: str | None, conversation_id: str) -> str:
    """The content address of a message: sha256 hex over ``[parent key, role, content]`` (JSON, UTF-8)."""
    payload = json.dumps([parent_key(parent_id, conversation_id), role, content], ensure_ascii=False)
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
