"""Export and import of one conversation: JSON (canonical) and Markdown (readable, and parseable back).

Works on documents and records only (``app.memory.records``); the store calls it, and it never imports the store.

The reasoning: docs/memory.md, 'app/memory/transfer.py'.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.errors import InvalidRequest
from app.memory.records import (
    EXPORT_FORMAT,
    EXPORT_VERSION,
    STATUSES,
    ConversationData,
    calls_from_list,
    calls_to_list,
    check_reasoning_info,
    flagged_sentences,
    message_id,
    provisional_id,
    summary_id,
)

_MARKER = re.compile(r"^<!-- hearth:(conversation|message|summary) (\{.*\}) -->$", re.MULTILINE)
_MESSAGE_FIELDS = ("id", "parent_id", "role", "content", "reasoning", "token_count", "created", "status", "meta",
                   "tool_calls", "tool_call_id", "name", "reasoning_info")
_SUMMARY_FIELDS = ("id", "text", "first_message_id", "last_message_id", "model", "settings", "created")


def to_dict(data: ConversationData) -> dict[str, Any]:
    """The JSON export document of a loaded conversation."""
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "conversation": data.conversation.to_dict(),
        "messages": [{k: d[k] for k in _MESSAGE_FIELDS} for d in (_message_dict(data, m) for m in data.messages)],
        "summaries": [{k: getattr(s, k) for k in _SUMMARY_FIELDS} for s in data.summaries],
        "citations": [c.to_dict() for c in data.citations],
        "attributions": [a.to_dict() for a in data.attributions],
    }


def _message_dict(data: ConversationData, m: Any) -> dict[str, Any]:
    r = data.reasoning.get(m.id)
    return {**m.to_dict(), "reasoning_info": r.info() if r is not None else None}


def _comment(kind: str, obj: dict) -> str:
    text = json.dumps(obj, ensure_ascii=False, sort_keys=True).replace(">", "\\u003e")
    return f"<!-- hearth:{kind} {text} -->"


def to_markdown(data: ConversationData) -> str:
    """Readable Markdown that ``parse`` turns back into the same document."""
    doc = to_dict(data)
    conv = doc["conversation"]
    title = " ".join((conv["title"] or "Untitled conversation").split())
    out = [f"# {title}\n\n", _comment("conversation", {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                                                       **conv}), "\n\n"]
    cites: dict[str, list[dict]] = {}
    for c in doc["citations"]:
        cites.setdefault(c["message_id"], []).append(c)
    attrs: dict[str, list[dict]] = {}
    for a in doc["attributions"]:
        attrs.setdefault(a["message_id"], []).append({k: v for k, v in a.items() if k != "message_id"})
    for m in doc["messages"]:
        head = m["role"].capitalize() + (f" ({m['name']})" if m.get("name") else "")
        head += "" if m["status"] == "complete" else f" ({m['status']})"
        meta = {k: m[k] for k in _MESSAGE_FIELDS if k != "content"}
        meta["citations"] = [{k: v for k, v in c.items() if k != "message_id"} for c in cites.get(m["id"], [])]
        if attrs.get(m["id"]):
            meta["attributions"] = attrs[m["id"]]
        meta["length"] = len(m["content"])
        out += [f"## {head}\n\n", _comment("message", meta), "\n", m["content"], "\n\n"]
        for call in m.get("tool_calls") or ():
            out.append(f"- calls `{call['name']}` with `{call['arguments']}`\n")
        if m.get("tool_calls"):
            out.append("\n")
        for c in meta["citations"]:
            page = f", page {c['page']}" if c.get("page") is not None else ""
            out.append(f"- source: {c.get('path') or c['evidence_id']}{page}\n")
        if meta["citations"]:
            out.append("\n")
        out += _unsupported_lines(m["content"], attrs.get(m["id"], []))
    if doc["summaries"]:
        out.append("---\n\n# Summaries (kept apart; the messages above are the originals)\n\n")
    for s in doc["summaries"]:
        meta = {k: s[k] for k in _SUMMARY_FIELDS if k != "text"}
        meta["length"] = len(s["text"])
        out += [f"## Summary of {s['first_message_id'][:8]} … {s['last_message_id'][:8]}\n\n",
                _comment("summary", meta), "\n", s["text"], "\n\n"]
    return "".join(out)


def _unsupported_lines(content: str, attributions: list[dict]) -> list[str]:
    """The readable lines under an answer for its unsupported sentences: ``- ⚠ "<sentence>": <reason>``."""
    out = [f"- ⚠ \"{sentence}\": {reason}\n" for sentence, reason in flagged_sentences(content, attributions)]
    return out + ["\n"] if out else []


def _bad(msg: str) -> InvalidRequest:
    return InvalidRequest(f"not a Hearth conversation export: {msg}", param="data")


def _from_markdown(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"messages": [], "summaries": [], "citations": [], "attributions": []}
    pos = 0
    while (m := _MARKER.search(text, pos)) is not None:
        kind, obj = m.group(1), json.loads(m.group(2))
        pos = m.end()
        if kind == "conversation":
            doc["format"], doc["version"] = obj.pop("format", None), obj.pop("version", None)
            doc["conversation"] = obj
            continue
        length = obj.pop("length", None)
        if not isinstance(length, int) or text[pos:pos + 1] != "\n" or len(text) < pos + 1 + length:
            raise _bad(f"a {kind} block near character {m.start()} is damaged (was the text edited?)")
        body = text[pos + 1:pos + 1 + length]
        pos = pos + 1 + length
        if text[pos:pos + 2] not in ("\n\n", "\n", ""):
            raise _bad(f"the text of a {kind} near character {m.start()} was edited (its length changed)")
        if kind == "message":
            for c in obj.pop("citations", []):
                doc["citations"].append({"message_id": obj["id"], **c})
            for a in obj.pop("attributions", []):
                doc["attributions"].append({"message_id": obj["id"], **a})
            doc["messages"].append({**obj, "content": body})
        else:
            doc["summaries"].append({**obj, "text": body})
    if "conversation" not in doc:
        raise _bad("no <!-- hearth:conversation --> block")
    return doc


def _order_parents_first(messages: list[dict]) -> list[dict]:
    """Keep the export's order, deferring only a message listed before its parent."""
    done: set[str] = set()
    ordered: list[dict] = []
    pending = list(messages)
    while pending:
        rest = []
        for m in pending:
            if m.get("parent_id") is None or m["parent_id"] in done:
                done.add(m["id"])
                ordered.append(m)
            else:
                rest.append(m)
        if len(rest) == len(pending):
            raise _bad("a message's parent_id names no message of this conversation")
        pending = rest
    return ordered


def _validate(doc: dict[str, Any]) -> dict[str, Any]:
    if doc.get("format") != EXPORT_FORMAT:
        raise _bad(f"format is {doc.get('format')!r}, expected {EXPORT_FORMAT!r}")
    if not isinstance(doc.get("version"), int) or doc["version"] > EXPORT_VERSION:
        raise _bad(f"version {doc.get('version')!r} is not supported (this Hearth reads up to {EXPORT_VERSION})")
    conv = doc.get("conversation")
    if not isinstance(conv, dict) or not all(isinstance(conv.get(k), str) for k in ("id", "created", "updated")):
        raise _bad("conversation needs id, created and updated")
    msgs = [dict(m) if isinstance(m, dict) else m for m in doc.get("messages") or []]
    for m in msgs:
        if not isinstance(m, dict):
            raise _bad("every message must be an object")
        if not all(isinstance(m.get(k), str) for k in ("id", "role", "content", "created")):
            raise _bad("every message needs id, role, content and created as text")
        if m.get("status", "complete") not in STATUSES:
            raise _bad(f"message {m['id']}: status {m.get('status')!r}")
        try:
            m["tool_calls"] = calls_to_list(calls_from_list(m.get("tool_calls"), f"message {m['id']}: tool_calls"))
        except ValueError as exc:
            raise _bad(str(exc)) from None
        for k in ("tool_call_id", "name", "reasoning"):
            if m.get(k) is not None and not isinstance(m[k], str):
                raise _bad(f"message {m['id']}: {k} must be text")
        try:
            m["reasoning_info"] = check_reasoning_info(m.get("reasoning_info"), f"message {m['id']}: reasoning_info")
        except ValueError as exc:
            raise _bad(str(exc)) from None
    ids = {m["id"] for m in msgs}
    for s in doc.get("summaries") or []:
        if s.get("first_message_id") not in ids or s.get("last_message_id") not in ids:
            raise _bad(f"summary {s.get('id')}: its range names messages that are not in the export")
    for c in doc.get("citations") or []:
        if c.get("message_id") not in ids:
            raise _bad("a citation names a message that is not in the export")
    for a in doc.get("attributions") or []:
        if not isinstance(a, dict) or a.get("message_id") not in ids:
            raise _bad("an attribution names a message that is not in the export")
    return {"format": doc["format"], "version": doc["version"], "conversation": conv,
            "messages": _order_parents_first(msgs), "summaries": list(doc.get("summaries") or []),
            "citations": list(doc.get("citations") or []), "attributions": list(doc.get("attributions") or [])}


def parse(data: str | dict) -> dict[str, Any]:
    """An export (JSON text, a dict, or Markdown text) → a validated document (messages parents first)."""
    if isinstance(data, dict):
        return _validate(data)
    if not isinstance(data, str):
        raise _bad("expected text or a dict")
    stripped = data.lstrip()
    if stripped.startswith("{"):
        try:
            return _validate(json.loads(stripped))
        except json.JSONDecodeError as exc:
            raise _bad(f"invalid JSON ({exc})") from None
    try:
        return _validate(_from_markdown(data))
    except json.JSONDecodeError as exc:
        raise _bad(f"a hearth comment holds invalid JSON ({exc})") from None


def renumber(doc: dict[str, Any], new_conversation_id: str) -> dict[str, Any]:
    """The same conversation under a new id: message ids are recomputed along their new chains (finished
    messages by content hash, others get new provisional ids); summaries, citations and attributions follow."""
    idmap: dict[str, str] = {}
    messages = []
    for m in doc["messages"]:
        parent = idmap.get(m["parent_id"]) if m.get("parent_id") else None
        if m.get("status", "complete") == "complete":
            new = message_id(m["role"], m["content"], parent, new_conversation_id, m.get("tool_calls") or (),
                             m.get("tool_call_id"), m.get("name"), variant=_variant(m))
        else:
            new = provisional_id(m["role"], parent, new_conversation_id)
        idmap[m["id"]] = new
        messages.append({**m, "id": new, "parent_id": parent})
    conv = dict(doc["conversation"], id=new_conversation_id,
                current_message_id=idmap.get(doc["conversation"].get("current_message_id") or ""))
    summaries = []
    for s in doc["summaries"]:
        first, last = idmap[s["first_message_id"]], idmap[s["last_message_id"]]
        summaries.append(dict(s, first_message_id=first, last_message_id=last,
                              id=summary_id(new_conversation_id, first, last, s["text"])))
    citations = [dict(c, message_id=idmap[c["message_id"]]) for c in doc["citations"]]
    attributions = [dict(a, message_id=idmap[a["message_id"]]) for a in doc.get("attributions") or []]
    return {**doc, "conversation": conv, "messages": messages, "summaries": summaries, "citations": citations,
            "attributions": attributions}


def _variant(m: dict[str, Any]) -> int:
    """The ``variant`` of an exported message (its meta's, ``records.message_id``; 1 when absent or bad)."""
    meta = m.get("meta")
    v = meta.get("variant", 1) if isinstance(meta, dict) else 1
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 1 else 1
