"""Which messages the chat shows: one branch of the conversation tree (app.memory keeps every edit and
regeneration as a sibling branch), as ``ChatRow`` values. No Qt; reads the ``Store`` only."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.ui.formatting import agreement_text, reasoning_note
from app.ui.models import ChatRow


def descend(store: Any, message_id: str) -> str:
    """The newest leaf under ``message_id`` (following the latest reply at each step)."""
    while True:
        kids = store.children(message_id)
        if not kids:
            return message_id
        message_id = kids[-1].id


def branch_rows(store: Any, conversation_id: str, tip: str | None) -> list[ChatRow]:
    """The rows from the first message down to ``tip`` (None: the conversation's current tip)."""
    if tip is None:
        tip = store.get_conversation(conversation_id).current_message_id
    if tip is None:
        return []
    rows = []
    calls: dict[str, Any] = {}
    for m in store.path_to(tip):
        sibs = store.children(m.parent_id, conversation_id)
        ids = tuple(s.id for s in sibs) or (m.id,)
        pos = ids.index(m.id) + 1 if m.id in ids else 1
        cites = [c.to_dict() for c in store.citations_for(m.id)]
        given = m.meta.get("evidence") if m.role == "assistant" else None
        attrs = [a.to_dict() for a in store.attributions_for(m.id)] if m.role == "assistant" else []
        row = ChatRow(m.id, m.role, m.content, m.status, m.reasoning or "", m.parent_id, (pos, len(ids)), ids,
                      cites, tool_calls=m.tool_calls, retrieved=_passages(given), attributions=attrs)
        if m.reasoning:
            row = thinking_row(row, store.reasoning_for(m.id))
        if m.meta.get("self_consistency"):
            row = replace(row, agreement=agreement_text(m.meta["self_consistency"]))
        calls.update((c.id, c) for c in m.tool_calls)
        rows.append(tool_row(row, m, calls.get(m.tool_call_id or "")) if m.role == "tool" else row)
    return rows


def _passages(given: Any) -> list[dict]:
    """The passages an answer was given, from its meta's ``evidence`` (``evidence.given`` dicts, stored with
    the answer); a hand-edited or foreign value gives none."""
    if not isinstance(given, list):
        return []
    keys = ("evidence_id", "path", "page", "text")
    return [{k: p.get(k) for k in keys} for p in given
            if isinstance(p, dict) and isinstance(p.get("evidence_id"), str) and isinstance(p.get("path"), str)]


def thinking_row(row: ChatRow, r: Any) -> ChatRow:
    """``row`` with its stored thinking's token count and why it ended (``r``: ``Store.reasoning_for``)."""
    tokens = r.tokens if r is not None else None
    note = reasoning_note(r.stopped_by, r.unclosed) if r is not None else ""
    return replace(row, reasoning_tokens=tokens, reasoning_note=note)


def tool_row(row: ChatRow, m: Any, call: Any) -> ChatRow:
    """A stored ``tool`` message as the row of its call: the call's arguments and how it went (its meta)."""
    meta = m.meta
    return replace(row, call_id=m.tool_call_id, tool_name=m.name or "", server=str(meta.get("server") or ""),
                   tool=str(meta.get("tool") or m.name or ""), arguments=call.arguments if call else "",
                   tool_state=str(meta.get("outcome") or "ok"), notice=meta.get("error"),
                   size_bytes=int(meta.get("size_bytes") or len(m.content.encode("utf-8"))))


def turn_start(store: Any, message_id: str) -> str:
    """The person's message that began the turn ``message_id`` belongs to (itself for a user message): the
    message a regeneration answers again, tool calls and all."""
    path = store.path_to(message_id)
    return next((m.id for m in reversed(path) if m.role == "user"), message_id)


def sibling_tip(store: Any, row: ChatRow, step: int) -> str | None:
    """The tip to show after moving ``step`` (-1 / +1) among ``row``'s siblings, or None at either end."""
    pos = row.siblings[0] - 1 + step
    if not 0 <= pos < len(row.sibling_ids):
        return None
    return descend(store, row.sibling_ids[pos])


def last_answer_stats(rows: list[ChatRow], store: Any) -> tuple[dict, dict]:
    """(metrics, context breakdown) stored with the last answer on the branch, for the status strip."""
    for r in reversed(rows):
        if r.role == "assistant" and r.id:
            meta = store.get_message(r.id).meta
            return dict(meta.get("metrics") or {}), dict(meta.get("context") or {})
    return {}, {}
