"""The conversation store: SQLite (``hearth.db``) through sqlite-utils, append-only and content-addressed. A
message's id hashes its parent, role and content; only a streaming (``incomplete``) message changes in place.
Its schema is ``app.memory.migrations``; summaries, citations and attributions are ``app.memory.annotations``,
presets and projects ``app.memory.library`` (mixins). The design decisions it holds: docs/memory.md "Store"."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sqlite3
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from app.errors import InvalidRequest, StoreError, open_store_db, store_error
from app.memory import transfer
from app.memory.annotations import (
    INSERT_ATTRIBUTION,
    INSERT_CITATION,
    SummariesCitations,
    attribution_values,
    citation_values,
)
from app.memory.library import PresetsProjects
from app.memory.migrations import migrations
from app.memory.records import (
    STATUSES,
    Conversation,
    ConversationData,
    Message,
    Reasoning,
    SearchHit,
    check_reasoning_info,
    dumps_calls,
    dumps_json,
    loads_calls,
    loads_json,
    message_id,
    now,
    provisional_id,
)
from app.protocol.reasoning import ReasoningSettings
from app.protocol.tools import ToolCall

log = logging.getLogger(__name__)


def _fts_query(query: str) -> str:
    """User text → an FTS5 query that cannot be a syntax error: every word becomes a quoted phrase (AND-ed);
    a trailing ``*`` on a word keeps prefix matching. Operators typed by a person are searched as words."""
    terms = []
    for word in query.split():
        prefix = word.endswith("*")
        word = word.rstrip("*")
        if not re.search(r"\w", word):
            continue
        terms.append('"' + word.replace('"', '""') + '"' + ("*" if prefix else ""))
    return " ".join(terms)


# --------------------------------------------------------------------------------------------------------------
# The store


class Store(SummariesCitations, PresetsProjects):
    """The conversation database. Thread-safe (one connection behind a lock): the UI's workers and the server
    thread may share one ``Store``. ``path`` defaults to ``app.paths.conversations_db()``; ``":memory:"``
    gives a throwaway store (no WAL)."""

    def __init__(self, path: str | Path | None = None) -> None:
        if path is None:
            from app.paths import conversations_db

            path = conversations_db()
        self.path = str(path)
        self._lock = threading.RLock()
        conn = open_store_db(self.path, "conversation store")  # a damaged or empty file: StoreDamaged
        try:
            self.db = Database(conn, execute_plugins=False)
            if self.path != ":memory:":
                self.db.enable_wal()
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            migrations.apply(self.db)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise store_error(exc, self.path, "cannot open the conversation store") from exc

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[Database]:
        """One write transaction (a savepoint inside ``transaction``), with database errors turned into
        ``StoreError`` (``DiskFull``, ``StoreDamaged``: ``store_error``)."""
        with self._lock:
            try:
                with self.db.atomic():
                    yield self.db
            except sqlite3.IntegrityError as exc:
                raise StoreError(f"conversation store refused a write: {exc}") from exc
            except (sqlite3.DatabaseError, OSError) as exc:
                raise store_error(exc, self.path, "conversation store") from exc

    def transaction(self) -> contextlib.AbstractContextManager[Database]:
        """Everything the store writes inside ``with store.transaction():`` is one transaction: all of it or,
        when anything raises, none (a new conversation and its first message: no empty conversation is left
        by a failed turn). Other threads' calls wait until it ends."""
        return self._tx()

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict]:
        with self._lock:
            try:
                cur = self.db.conn.execute(sql, list(params))
                keys = [d[0] for d in cur.description]
                return [dict(zip(keys, row)) for row in cur.fetchall()]
            except sqlite3.DatabaseError as exc:
                raise store_error(exc, self.path, "conversation store") from exc

    # ---- conversations ---------------------------------------------------------------------------------------

    def create_conversation(self, title: str = "", model: str = "", settings: dict | None = None,
                            *, conversation_id: str | None = None) -> str:
        """Create an empty conversation; return its id (a uuid4 hex unless given)."""
        cid = conversation_id or uuid.uuid4().hex
        ts = now()
        with self._tx() as db:
            db.execute("INSERT INTO conversations (id, title, model, settings, created, updated) "
                       "VALUES (?, ?, ?, ?, ?, ?)", [cid, title, model, dumps_json(settings), ts, ts])
        return cid

    def _conversation_from_row(self, row: dict, warnings: list[str] | None = None) -> Conversation:
        settings = loads_json(row["settings"], f"conversation {row['id']}: settings", warnings)
        return Conversation(id=row["id"], title=row["title"] or "", model=row["model"] or "", settings=settings,
                            created=row["created"], updated=row["updated"],
                            current_message_id=row["current_message_id"],
                            message_count=row.get("message_count") or 0)

    def get_conversation(self, conversation_id: str, warnings: list[str] | None = None) -> Conversation:
        """The conversation, or ``StoreError`` if there is none with this id."""
        rows = self._rows("SELECT * FROM conversations WHERE id = ?", [conversation_id])
        if not rows:
            raise StoreError(f"no conversation with id {conversation_id!r}")
        return self._conversation_from_row(rows[0], warnings)

    def list_conversations(self, limit: int | None = None) -> list[Conversation]:
        """Conversations, most recently updated first, with ``message_count``."""
        sql = ("SELECT c.*, (SELECT count(*) FROM messages m WHERE m.conversation_id = c.id) AS message_count "
               "FROM conversations c ORDER BY c.updated DESC, c.rowid DESC")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [self._conversation_from_row(r) for r in self._rows(sql)]

    def resolve_conversation_id(self, prefix: str) -> str:
        """The id of the one conversation whose id starts with ``prefix`` (for the CLI); ``StoreError``
        when none or several match."""
        rows = self._rows("SELECT id FROM conversations WHERE id = ? OR id LIKE ? ESCAPE '\\' LIMIT 3",
                          [prefix, prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"])
        ids = sorted({r["id"] for r in rows})
        if prefix in ids:
            return prefix
        if len(ids) != 1:
            raise StoreError(f"no conversation with id {prefix!r}" if not ids
                             else f"conversation id {prefix!r} is ambiguous; give more characters")
        return ids[0]

    def rename(self, conversation_id: str, title: str) -> None:
        """Give the conversation ``title``. Its ``updated`` time (the sidebar's order: last activity) stays, so
        a renamed chat keeps its place. Raises ``StoreError`` for an unknown id."""
        self.get_conversation(conversation_id)
        with self._tx() as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", [title, conversation_id])

    def update_conversation(self, conversation_id: str, *, model: str | None = None,
                            settings: dict | None = None) -> None:
        """Change the conversation's current model and/or settings (messages keep what they were made with)."""
        sets, params = ["updated = ?"], [now()]
        if model is not None:
            sets.append("model = ?")
            params.append(model)
        if settings is not None:
            sets.append("settings = ?")
            params.append(dumps_json(settings))
        with self._tx() as db:
            db.execute(f"UPDATE conversations SET {', '.join(sets)} WHERE id = ?", [*params, conversation_id])

    def reasoning_settings(self, conversation_id: str) -> ReasoningSettings:
        """The conversation's reasoning layer (``settings["reasoning"]``; unset fields None). A stored value
        that no longer validates (edited by hand) loads as unset, with a logged warning."""
        raw = self.get_conversation(conversation_id).settings.get("reasoning")
        try:
            if raw is not None and not isinstance(raw, dict):
                raise InvalidRequest("not a JSON object", param="reasoning")
            return ReasoningSettings.from_mapping(raw, "conversation")
        except InvalidRequest as exc:
            log.warning("conversation %s: its reasoning setting is not valid (%s); used as unset",
                        conversation_id, exc)
            return ReasoningSettings()

    def set_reasoning_settings(self, conversation_id: str,
                               value: ReasoningSettings | dict[str, Any] | None) -> ReasoningSettings:
        """Store the conversation's reasoning layer: a ``ReasoningSettings`` or a mapping with
        ``reasoning_effort`` / ``reasoning_budget`` / ``reasoning_deadline_s`` (None, or all unset: the
        conversation does not say, and the model's default applies). ``InvalidRequest`` names a bad field.
        Returns what was stored."""
        if isinstance(value, ReasoningSettings):
            rs = value.validate("conversation")
        else:
            rs = ReasoningSettings.from_mapping(value, "conversation")
        stored = {k: v for k, v in (("reasoning_effort", rs.effort), ("reasoning_budget", rs.budget_tokens),
                                    ("reasoning_deadline_s", rs.deadline_s)) if v is not None}
        conv = self.get_conversation(conversation_id)
        settings = {k: v for k, v in conv.settings.items() if k != "reasoning"}
        if stored:
            settings["reasoning"] = stored
        self.update_conversation(conversation_id, settings=settings)
        return rs

    def delete(self, conversation_id: str) -> None:
        """Delete a conversation with its messages, summaries and citations (the one way history goes away:
        a person asks for it)."""
        self.get_conversation(conversation_id)
        with self._tx() as db:
            db.execute("DELETE FROM citations WHERE message_id IN "
                       "(SELECT id FROM messages WHERE conversation_id = ?)", [conversation_id])
            db.execute("DELETE FROM attributions WHERE message_id IN "
                       "(SELECT id FROM messages WHERE conversation_id = ?)", [conversation_id])
            db.execute("DELETE FROM message_reasoning WHERE message_id IN "
                       "(SELECT id FROM messages WHERE conversation_id = ?)", [conversation_id])
            db.execute("DELETE FROM summaries WHERE conversation_id = ?", [conversation_id])
            db.execute("DELETE FROM messages WHERE conversation_id = ?", [conversation_id])
            db.execute("DELETE FROM conversations WHERE id = ?", [conversation_id])

    def set_current(self, conversation_id: str, message_id: str | None) -> None:
        """Move the conversation's tip (the branch the next message continues) to ``message_id``."""
        if message_id is not None:
            self._require_message(message_id, conversation_id)
        with self._tx() as db:
            db.execute("UPDATE conversations SET current_message_id = ?, updated = ? WHERE id = ?",
                       [message_id, now(), conversation_id])

    # ---- messages --------------------------------------------------------------------------------------------

    def _require_message(self, mid: str, conversation_id: str | None = None) -> dict:
        rows = self._rows("SELECT * FROM messages WHERE id = ?", [mid])
        if not rows:
            raise StoreError(f"no message with id {mid!r}")
        if conversation_id is not None and rows[0]["conversation_id"] != conversation_id:
            raise InvalidRequest(f"message {mid!r} belongs to another conversation", param="parent_id")
        return rows[0]

    def _check_new(self, conversation_id: str, role: str, parent_id: str | None, status: str) -> None:
        if not isinstance(role, str) or not role:
            raise InvalidRequest(f"role must be a non-empty string, got {role!r}", param="role")
        if status not in STATUSES:
            raise InvalidRequest(f"status must be one of {', '.join(STATUSES)}, got {status!r}", param="status")
        self.get_conversation(conversation_id)
        if parent_id is not None:
            self._require_message(parent_id, conversation_id)

    def _insert_message(self, db: Database, row: dict) -> None:
        # reasoning lives in message_reasoning (m005); the m001 column keeps only what older rows had
        row = {"tool_calls": None, "tool_call_id": None, "tool_name": None, **row, "reasoning": None}
        db.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, reasoning, token_count, "
                   "created, status, meta, tool_calls, tool_call_id, tool_name) VALUES (:id, :conversation_id, "
                   ":parent_id, :role, :content, :reasoning, :token_count, :created, :status, :meta, :tool_calls, "
                   ":tool_call_id, :tool_name)", row)

    def append_message(self, conversation_id: str, role: str, content: str, parent_id: str | None = None, *,
                       reasoning: str | None = None, token_count: int | None = None, status: str = "complete",
                       meta: dict | None = None, set_current: bool = True, tool_calls: Sequence[ToolCall] = (),
                       tool_call_id: str | None = None, name: str | None = None,
                       reasoning_info: dict | None = None) -> str:
        """Append a finished message under ``parent_id`` (None: a first message); return its content id.

        The same role, content and tool fields under the same parent return the existing id and change nothing
        (the first writer's token_count/meta/reasoning stay). ``token_count`` in tokens. ``set_current`` moves
        the tip to it. ``tool_calls``: the calls an assistant message makes; a ``tool`` message (a result)
        names the call it answers with ``tool_call_id`` and the tool's ``name``. ``reasoning``: thinking text,
        stored apart (``Reasoning``) with ``reasoning_info`` (its ``REASONING_INFO_KEYS``)."""
        info = self._check_info(reasoning_info)
        if not isinstance(content, str):
            raise InvalidRequest("content must be text", param="content")
        if status == "incomplete":
            raise InvalidRequest("use begin_streaming_message for an incomplete message", param="status")
        self._check_new(conversation_id, role, parent_id, status)
        calls = tuple(tool_calls)
        mid = message_id(role, content, parent_id, conversation_id, calls, tool_call_id, name)
        ts = now()
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM messages WHERE id = ?", [mid]).fetchone():
                self._insert_message(db, dict(id=mid, conversation_id=conversation_id, parent_id=parent_id,
                                              role=role, content=content, reasoning=reasoning,
                                              token_count=token_count, created=ts, status=status,
                                              meta=dumps_json(meta), tool_calls=dumps_calls(calls),
                                              tool_call_id=tool_call_id, tool_name=name))
                if reasoning is not None or info:
                    self._put_reasoning(db, mid, reasoning, info)
            self._touch(db, conversation_id, mid if set_current else None, ts)
        return mid

    @staticmethod
    def _check_info(info: dict | None) -> dict:
        try:
            return check_reasoning_info(info)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="reasoning_info") from None

    def _put_reasoning(self, db: Database, mid: str, text: str | None, info: dict) -> None:
        """Insert or update (while its message streams) the reasoning row of ``mid``: ``text`` None keeps the
        text, keys absent from ``info`` keep their values."""
        row = {"text": text, **{k: info.get(k) for k in ("tokens", "budget", "effort", "stopped_by", "thinking_s")},
               "forced": info.get("forced"), "unclosed": info.get("unclosed")}
        sets = ", ".join(f"{k} = coalesce(:{k}, {k})" for k in row)
        db.execute(f"INSERT INTO message_reasoning (message_id, text, tokens, budget, effort, forced, stopped_by, "
                   f"unclosed, thinking_s, created) VALUES (:mid, coalesce(:text, ''), :tokens, :budget, :effort, "
                   f"coalesce(:forced, 0), :stopped_by, coalesce(:unclosed, 0), :thinking_s, :created) "
                   f"ON CONFLICT(message_id) DO UPDATE SET {sets}", {**row, "mid": mid, "created": now()})

    def _touch(self, db: Database, conversation_id: str, current: str | None, ts: str) -> None:
        if current is None:
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", [ts, conversation_id])
        else:
            db.execute("UPDATE conversations SET updated = ?, current_message_id = ? WHERE id = ?",
                       [ts, current, conversation_id])

    def begin_streaming_message(self, conversation_id: str, parent_id: str | None, role: str = "assistant", *,
                                meta: dict | None = None, set_current: bool = True) -> str:
        """Store an empty ``incomplete`` message under ``parent_id`` and return its provisional id; feed it
        with ``update_streaming_message`` and end it with ``finish_message``."""
        self._check_new(conversation_id, role, parent_id, "incomplete")
        mid = provisional_id(role, parent_id, conversation_id)
        ts = now()
        with self._tx() as db:
            self._insert_message(db, dict(id=mid, conversation_id=conversation_id, parent_id=parent_id, role=role,
                                          content="", reasoning=None, token_count=None, created=ts,
                                          status="incomplete", meta=dumps_json(meta)))
            self._touch(db, conversation_id, mid if set_current else None, ts)
        return mid

    def update_streaming_message(self, message_id: str, content: str, reasoning: str | None = None) -> None:
        """Replace the text so far of an ``incomplete`` message (the only in-place change the store allows),
        and its reasoning so far when given (stored apart). Each call is one committed transaction, so a
        killed process keeps the last text written."""
        with self._tx() as db:
            cur = db.execute("UPDATE messages SET content = ? WHERE id = ? AND status = 'incomplete'",
                             [content, message_id])
            if cur.rowcount != 1:
                raise StoreError(f"message {message_id!r} is not being streamed (missing or already finished)")
            if reasoning is not None:
                self._put_reasoning(db, message_id, reasoning, {})

    def finish_message(self, message_id: str, status: str = "complete", *, content: str | None = None,
                       reasoning: str | None = None, token_count: int | None = None,
                       meta: dict | None = None, tool_calls: Sequence[ToolCall] | None = None,
                       reasoning_info: dict | None = None) -> str:
        """End a streamed message with ``status`` complete or error; ``content`` replaces the text if given,
        ``meta`` is merged into its meta, ``tool_calls`` (if given) are the calls the answer made;
        ``reasoning`` (text) and ``reasoning_info`` (its ``REASONING_INFO_KEYS``) are stored apart, given or
        not the reasoning streamed so far stays. Returns the final id: for ``complete`` the content hash (the
        provisional row is re-keyed; a repeat of an existing sibling's text gets a ``variant`` id), else the same
        id; the reasoning follows it."""
        if status not in ("complete", "error"):
            raise InvalidRequest(f"status must be complete or error, got {status!r}", param="status")
        info = self._check_info(reasoning_info)
        with self._tx() as db:
            row = self._require_message(message_id)
            if row["status"] != "incomplete":
                raise StoreError(f"message {message_id!r} is already finished ({row['status']})")
            if reasoning is not None or info:
                self._put_reasoning(db, message_id, reasoning, info)  # before the message is frozen
            merged = {**loads_json(row["meta"], f"message {message_id}: meta", None), **(meta or {})}
            final = dict(row, content=row["content"] if content is None else content,
                         token_count=row["token_count"] if token_count is None else token_count,
                         status=status, meta=dumps_json(merged),
                         tool_calls=row["tool_calls"] if tool_calls is None else dumps_calls(tuple(tool_calls)))
            final.pop("seq")
            new_id = message_id
            if status == "complete" and not self._has_dependents(db, message_id):
                new_id = self._rekey(db, final)
            if new_id == message_id:
                db.execute("UPDATE messages SET content = :content, "
                           "token_count = :token_count, meta = :meta, tool_calls = :tool_calls, status = :status "
                           "WHERE id = :id", final)
            cur = db.execute("SELECT current_message_id FROM conversations WHERE id = ?",
                             [row["conversation_id"]]).fetchone()
            self._touch(db, row["conversation_id"], new_id if cur and cur[0] == message_id else None, now())
        return new_id

    def _has_dependents(self, db: Database, mid: str) -> bool:
        return bool(db.execute("SELECT 1 FROM messages WHERE parent_id = ? UNION ALL SELECT 1 FROM summaries "
                               "WHERE first_message_id = ? OR last_message_id = ? LIMIT 1",
                               [mid, mid, mid]).fetchone())

    def _rekey(self, db: Database, final: dict) -> str:
        """Move a finished streamed message to its content address. When an earlier answer under the same
        parent has the same text (a regeneration that repeated it), this one is a version of its own, keyed
        with the first free ``variant`` (``records.message_id``) and marked so in its meta."""
        old = final["id"]
        calls = loads_calls(final["tool_calls"], "tool_calls", None)
        variant = 1
        while True:
            new = message_id(final["role"], final["content"], final["parent_id"], final["conversation_id"],
                             calls, final["tool_call_id"], final["tool_name"], variant=variant)
            if new == old or not db.execute("SELECT 1 FROM messages WHERE id = ?", [new]).fetchone():
                break
            variant += 1
        if new == old:
            return old
        if variant > 1:
            final = dict(final, meta=dumps_json({**loads_json(final["meta"], "meta", None), "variant": variant}))
        self._insert_message(db, dict(final, id=new))
        db.execute("UPDATE citations SET message_id = ? WHERE message_id = ?", [new, old])
        db.execute("UPDATE attributions SET message_id = ? WHERE message_id = ?", [new, old])
        db.execute("UPDATE message_reasoning SET message_id = ? WHERE message_id = ?", [new, old])
        db.execute("DELETE FROM messages WHERE id = ?", [old])
        return new

    def _message_from_row(self, row: dict, warnings: list[str] | None = None,
                          reasoning: dict[str, Reasoning] | None = None) -> Message:
        status = row["status"] if row["status"] in STATUSES else "error"
        if reasoning is None:
            reasoning = self._reasoning_of([row["id"]])
        r = reasoning.get(row["id"])
        return Message(id=row["id"], conversation_id=row["conversation_id"], parent_id=row["parent_id"],
                       role=row["role"], content=row["content"] if isinstance(row["content"], str) else "",
                       reasoning=r.text if r is not None else None, token_count=row["token_count"],
                       created=row["created"],
                       status=status, meta=loads_json(row["meta"], f"message {row['id']}: meta", warnings),
                       tool_calls=loads_calls(row["tool_calls"], f"message {row['id']}: tool_calls", warnings),
                       tool_call_id=row["tool_call_id"], name=row["tool_name"])

    def _messages_from_rows(self, rows: list[dict], warnings: list[str] | None = None) -> list[Message]:
        reasoning = self._reasoning_of([r["id"] for r in rows])
        return [self._message_from_row(r, warnings, reasoning) for r in rows]

    def _reasoning_of(self, ids: Sequence[str]) -> dict[str, Reasoning]:
        out: dict[str, Reasoning] = {}
        for i in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            part = list(ids[i:i + 500])
            rows = self._rows(f"SELECT * FROM message_reasoning WHERE message_id IN ({','.join('?' * len(part))})",
                              part)
            for r in rows:
                out[r["message_id"]] = Reasoning(r["message_id"], r["text"] or "", r["tokens"], r["budget"],
                                                 r["effort"], bool(r["forced"]), r["stopped_by"],
                                                 bool(r["unclosed"]), r["thinking_s"], r["created"])
        return out

    def reasoning_for(self, message_id: str) -> Reasoning | None:
        """The reasoning stored apart with ``message_id`` (None: it has none)."""
        return self._reasoning_of([message_id]).get(message_id)

    def set_reasoning(self, message_id: str, text: str | None, **info: Any) -> None:
        """Store reasoning apart with a message (``text`` None keeps the text so far; ``info``:
        ``REASONING_INFO_KEYS``). A streaming message's reasoning may change; a finished message may get
        reasoning once, and ``StoreError`` refuses any change after that."""
        checked = self._check_info(info)
        with self._tx() as db:
            self._require_message(message_id)
            self._put_reasoning(db, message_id, text, checked)

    def get_message(self, message_id: str) -> Message:
        return self._message_from_row(self._require_message(message_id))

    def messages(self, conversation_id: str) -> list[Message]:
        """All messages of a conversation, every branch, in the order they were stored."""
        rows = self._rows("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq", [conversation_id])
        return self._messages_from_rows(rows)

    def path_to(self, message_id: str) -> list[Message]:
        """The branch from the conversation's first message down to ``message_id`` (inclusive)."""
        self._require_message(message_id)
        rows = self._rows("""
            WITH RECURSIVE chain(id, depth) AS (
                SELECT ?, 0
                UNION ALL
                SELECT m.parent_id, chain.depth + 1 FROM messages m JOIN chain ON m.id = chain.id
                WHERE m.parent_id IS NOT NULL AND chain.depth < 1000000
            )
            SELECT m.* FROM chain JOIN messages m ON m.id = chain.id ORDER BY chain.depth DESC""", [message_id])
        return self._messages_from_rows(rows)

    def children(self, message_id: str | None, conversation_id: str | None = None) -> list[Message]:
        """Direct replies to ``message_id`` (its branches), oldest first. ``message_id=None`` with a
        ``conversation_id``: the conversation's first messages."""
        if message_id is None:
            if conversation_id is None:
                raise InvalidRequest("give message_id or conversation_id", param="message_id")
            rows = self._rows("SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS NULL "
                              "ORDER BY seq", [conversation_id])
        else:
            rows = self._rows("SELECT * FROM messages WHERE parent_id = ? ORDER BY seq", [message_id])
        return self._messages_from_rows(rows)

    # ---- reading a whole conversation, search ----------------------------------------------------------------

    def load_conversation(self, conversation_id: str) -> ConversationData:
        """Everything stored for a conversation. Rows with unreadable JSON fields load with those fields empty;
        each such problem is logged and listed in ``warnings``."""
        warnings: list[str] = []
        conv = self.get_conversation(conversation_id, warnings)
        rows = self._rows("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq", [conversation_id])
        reasoning = self._reasoning_of([r["id"] for r in rows])
        msgs = [self._message_from_row(r, warnings, reasoning) for r in rows]
        return ConversationData(conv, msgs, self.summaries_for(conversation_id, warnings),
                                self._citations_of(conversation_id, warnings), warnings, reasoning,
                                self._attributions_of(conversation_id, warnings))

    def search(self, query: str, limit: int = 20, conversation_id: str | None = None) -> list[SearchHit]:
        """Full-text search (FTS5, porter stemming) over the original text of every message, best first. Any
        text is a valid query: words are matched as words, never as FTS operators."""
        fts = _fts_query(query)
        if not fts:
            return []
        sql = ("SELECT m.id, m.conversation_id, c.title, m.role, m.status, m.created, "
               "snippet(messages_fts, 0, '[', ']', '…', 12) AS snip "
               "FROM messages_fts JOIN messages m ON m.seq = messages_fts.rowid "
               "JOIN conversations c ON c.id = m.conversation_id WHERE messages_fts MATCH ?")
        params: list[Any] = [fts]
        if conversation_id is not None:
            sql += " AND m.conversation_id = ?"
            params.append(conversation_id)
        sql += " ORDER BY rank LIMIT ?"
        params.append(int(limit))
        rows = self._rows(sql, params)  # a failure: StoreError
        return [SearchHit(r["id"], r["conversation_id"], r["title"] or "", r["role"], r["status"], r["created"],
                          r["snip"] or "") for r in rows]

    # ---- export / import -------------------------------------------------------------------------------------

    def export_conversation(self, conversation_id: str, format: str = "json") -> str:
        """The conversation as text: ``json`` (the canonical, lossless form) or ``md`` (readable Markdown that
        also imports back without loss while unedited; see app.memory.transfer)."""
        data = self.load_conversation(conversation_id)
        if format == "json":
            return json.dumps(transfer.to_dict(data), ensure_ascii=False, indent=2) + "\n"
        if format == "md":
            return transfer.to_markdown(data)
        raise InvalidRequest(f"format must be md or json, got {format!r}", param="format")

    def import_conversation(self, data: str | dict, *, as_new: bool = False) -> str:
        """Import an export (JSON text, a parsed dict, or Markdown text); return the conversation id.

        Ids, contents, statuses, summaries with their ranges and citations are kept exactly. If a conversation
        with the same id exists, ``StoreError`` unless ``as_new``: then it gets a new id and every message id
        is recomputed for its new chain (summaries and citations follow)."""
        doc = transfer.parse(data)
        if as_new:
            doc = transfer.renumber(doc, uuid.uuid4().hex)
        conv = doc["conversation"]
        if self._rows("SELECT 1 FROM conversations WHERE id = ?", [conv["id"]]):
            raise StoreError(f"conversation {conv['id']} already exists; delete it first or import as new")
        with self._tx() as db:
            self._import_rows(db, doc)
        return conv["id"]

    def _import_rows(self, db: Database, doc: dict) -> None:
        conv = doc["conversation"]
        db.execute("INSERT INTO conversations (id, title, model, settings, created, updated, current_message_id) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [conv["id"], conv.get("title") or "", conv.get("model") or "", dumps_json(conv.get("settings")),
                    conv["created"], conv["updated"], conv.get("current_message_id")])
        for m in doc["messages"]:
            self._insert_message(db, dict(id=m["id"], conversation_id=conv["id"], parent_id=m.get("parent_id"),
                                          role=m["role"], content=m["content"], reasoning=m.get("reasoning"),
                                          token_count=m.get("token_count"), created=m["created"],
                                          status=m.get("status", "complete"), meta=dumps_json(m.get("meta")),
                                          tool_calls=dumps_calls(m.get("tool_calls") or ()),
                                          tool_call_id=m.get("tool_call_id"), tool_name=m.get("name")))
            if m.get("reasoning") is not None or m.get("reasoning_info"):
                self._put_reasoning(db, m["id"], m.get("reasoning"), m.get("reasoning_info") or {})
        for s in doc["summaries"]:
            db.execute("INSERT INTO summaries (id, conversation_id, text, first_message_id, last_message_id, "
                       "model, settings, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [s["id"], conv["id"], s["text"], s["first_message_id"], s["last_message_id"],
                        s.get("model") or "", dumps_json(s.get("settings")), s["created"]])
        for c in doc["citations"]:
            db.execute(INSERT_CITATION, [c["message_id"], *citation_values(c)])
        for a in doc.get("attributions") or []:
            db.execute(INSERT_ATTRIBUTION, [a["message_id"], *attribution_values(a)])
