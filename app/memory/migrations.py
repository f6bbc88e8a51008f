"""The conversation store's schema: named, forward-only migrations (sqlite-utils ``Migrations``), applied in
order by ``Store()``, each in its own transaction. Never edit one that has shipped; add ``m00N_...``
(docs/memory.md "Store")."""

from __future__ import annotations

from sqlite_utils import Database, Migrations

migrations = Migrations("hearth.memory")


@migrations()
def m001_conversations_messages(db: Database) -> None:
    db.execute("""
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            settings TEXT NOT NULL DEFAULT '{}',
            created TEXT NOT NULL,
            updated TEXT NOT NULL,
            current_message_id TEXT
        )""")
    db.execute("""
        CREATE TABLE messages (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            parent_id TEXT REFERENCES messages(id),
            role TEXT NOT NULL,
            content TEXT NOT NULL DEFAULT '',
            reasoning TEXT,
            token_count INTEGER,
            created TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'complete' CHECK (status IN ('complete', 'incomplete', 'error')),
            meta TEXT NOT NULL DEFAULT '{}'
        )""")
    db.execute("CREATE INDEX messages_conversation ON messages(conversation_id, seq)")
    db.execute("CREATE INDEX messages_parent ON messages(parent_id)")
    # History is append-only: once a message is finished, what was said (and by whom, after what) is frozen.
    db.execute("""
        CREATE TRIGGER messages_immutable
        BEFORE UPDATE OF id, conversation_id, parent_id, role, content, reasoning, status ON messages
        WHEN old.status != 'incomplete'
        BEGIN
            SELECT RAISE(ABORT, 'hearth: a finished message cannot be changed (history is append-only)');
        END""")


@migrations()
def m002_summaries_citations(db: Database) -> None:
    db.execute("""
        CREATE TABLE summaries (
            id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            text TEXT NOT NULL,
            first_message_id TEXT NOT NULL REFERENCES messages(id),
            last_message_id TEXT NOT NULL REFERENCES messages(id),
            model TEXT NOT NULL DEFAULT '',
            settings TEXT NOT NULL DEFAULT '{}',
            created TEXT NOT NULL
        )""")
    db.execute("CREATE INDEX summaries_conversation ON summaries(conversation_id, created)")
    db.execute("""
        CREATE TABLE citations (
            id INTEGER PRIMARY KEY,
            message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            evidence_id TEXT NOT NULL,
            path TEXT,
            page INTEGER,
            quote TEXT
        )""")
    db.execute("CREATE INDEX citations_message ON citations(message_id)")


@migrations()
def m003_messages_fts(db: Database) -> None:
    db.execute("""
        CREATE VIRTUAL TABLE messages_fts USING fts5(
            content, content='messages', content_rowid='seq',
            tokenize='porter unicode61 remove_diacritics 2'
        )""")
    db.execute("""
        CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts(rowid, content) VALUES (new.seq, new.content);
        END""")
    db.execute("""
        CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.seq, old.content);
        END""")
    db.execute("""
        CREATE TRIGGER messages_fts_au AFTER UPDATE OF content ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.seq, old.content);
            INSERT INTO messages_fts(rowid, content) VALUES (new.seq, new.content);
        END""")
    db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")  # index rows that predate it


@migrations()
def m004_tool_messages(db: Database) -> None:
    db.execute("ALTER TABLE messages ADD COLUMN tool_calls TEXT")  # JSON [{id, name, arguments}]; NULL: none
    db.execute("ALTER TABLE messages ADD COLUMN tool_call_id TEXT")  # a tool message: the call it answers
    db.execute("ALTER TABLE messages ADD COLUMN tool_name TEXT")
    # The same rule as m001's trigger, now also over the tool columns (a trigger cannot be altered in place).
    db.execute("DROP TRIGGER messages_immutable")
    db.execute("""
        CREATE TRIGGER messages_immutable
        BEFORE UPDATE OF id, conversation_id, parent_id, role, content, reasoning, status, tool_calls,
                         tool_call_id, tool_name ON messages
        WHEN old.status != 'incomplete'
        BEGIN
            SELECT RAISE(ABORT, 'hearth: a finished message cannot be changed (history is append-only)');
        END""")


@migrations()
def m005_message_reasoning(db: Database) -> None:
    db.execute("""
        CREATE TABLE message_reasoning (
            message_id TEXT PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
            text TEXT NOT NULL DEFAULT '',
            tokens INTEGER,
            budget INTEGER,
            effort TEXT,
            forced INTEGER NOT NULL DEFAULT 0,
            stopped_by TEXT CHECK (stopped_by IS NULL OR stopped_by IN ('budget', 'deadline', 'user')),
            unclosed INTEGER NOT NULL DEFAULT 0,
            thinking_s REAL,
            created TEXT NOT NULL
        )""")
    # Like the message: while it streams its reasoning grows in place; once it is finished, it is frozen.
    db.execute("""
        CREATE TRIGGER message_reasoning_immutable
        BEFORE UPDATE ON message_reasoning
        WHEN (SELECT status FROM messages WHERE id = old.message_id) != 'incomplete'
        BEGIN
            SELECT RAISE(ABORT, 'hearth: the reasoning of a finished message cannot be changed');
        END""")
    # m001's column held reasoning inside the message row; copy it out (the message rows stay as they are).
    db.execute("INSERT INTO message_reasoning (message_id, text, created) SELECT id, reasoning, created "
               "FROM messages WHERE reasoning IS NOT NULL AND reasoning != ''")


@migrations()
def m006_presets_projects(db: Database) -> None:
    # Presets and projects (app.memory.library). A conversation names its project, preset and own system prompt
    # in its settings (``project``, ``preset``, ``system_prompt``), so exports of conversations are unchanged.
    db.execute("""
        CREATE TABLE presets (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE COLLATE NOCASE,
            system_prompt TEXT NOT NULL DEFAULT '',
            decoding TEXT NOT NULL DEFAULT '{}',
            model TEXT,
            created TEXT NOT NULL,
            updated TEXT NOT NULL
        )""")
    db.execute("""
        CREATE TABLE projects (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE COLLATE NOCASE,
            preset_id TEXT REFERENCES presets(id) ON DELETE SET NULL,
            documents TEXT,
            created TEXT NOT NULL,
            updated TEXT NOT NULL
        )""")


@migrations()
def m007_citation_check(db: Database) -> None:
    # The citation check (app.retrieval.citecheck) stored with each citation, so a reopened conversation still
    # shows which sentences its passages do not support. NULL supported: not checked (rows from before).
    db.execute("ALTER TABLE citations ADD COLUMN supported INTEGER")  # 1 / 0 / NULL
    db.execute("ALTER TABLE citations ADD COLUMN sentence_start INTEGER")  # str indices in the message content
    db.execute("ALTER TABLE citations ADD COLUMN sentence_end INTEGER")
    db.execute("ALTER TABLE citations ADD COLUMN support TEXT")  # JSON {missing, similarity, threshold, reason}


@migrations()
def m008_attributions(db: Database) -> None:
    # Sentence attribution (app.retrieval.attribution): each claim sentence of an answer that had evidence, the
    # passage it was attributed to (or none) and the facts check against it; a table of its own, so message
    # rows are never rewritten for it, and a reopened conversation shows the same marks.
    db.execute("""
        CREATE TABLE attributions (
            id INTEGER PRIMARY KEY,
            message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            sentence_start INTEGER NOT NULL,
            sentence_end INTEGER NOT NULL,
            evidence_id TEXT,
            path TEXT,
            page INTEGER,
            supported INTEGER,
            support TEXT NOT NULL DEFAULT '{}'
        )""")  # evidence_id NULL: attributed to none; supported 1 / 0 / NULL (nothing to check); support: JSON
    db.execute("CREATE INDEX attributions_message ON attributions(message_id)")
