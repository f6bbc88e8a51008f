"""The documents store's schema: named forward-only migrations ``m001``-``m010`` (``sqlite_utils.Migrations``,
as in simonw/llm ``llm/embeddings_migrations.py``), applied by ``DocumentStore``'s constructor, each once, in
a transaction, in order. Never edit an applied one; add ``m0NN_...`` instead (docs/retrieval.md, 'Store')."""

from __future__ import annotations

import sqlite_utils
from sqlite_utils import Migrations

FTS_TOKENIZE = "porter unicode61 remove_diacritics 2"

migrations = Migrations("hearth.retrieval")


@migrations()
def m001_create_documents(db: sqlite_utils.Database) -> None:
    db.execute("""
        CREATE TABLE documents (
            id INTEGER PRIMARY KEY,
            path TEXT NOT NULL UNIQUE,      -- absolute path, resolved
            sha256 TEXT,                    -- of the file's bytes; NULL when not read (unsupported type)
            size INTEGER,                   -- bytes
            mtime_ns INTEGER,               -- st_mtime_ns when indexed
            type TEXT,                      -- text, html, pdf, docx, or the unsupported suffix
            status TEXT NOT NULL,           -- indexed, failed, duplicate
            error TEXT,                     -- reason when failed / duplicate
            page_count INTEGER,
            chunk_count INTEGER NOT NULL DEFAULT 0,
            tokenizer TEXT,                 -- token counter used for chunking
            indexed_at REAL                 -- unix time (s)
        )""")
    db.execute("CREATE INDEX documents_sha256 ON documents(sha256)")


@migrations()
def m002_create_chunks(db: sqlite_utils.Database) -> None:
    db.execute("""
        CREATE TABLE chunks (
            id INTEGER PRIMARY KEY,
            evidence_id TEXT NOT NULL UNIQUE,
            document_id INTEGER NOT NULL REFERENCES documents(id),
            ordinal INTEGER NOT NULL,       -- 0-based position in the document
            text TEXT NOT NULL,             -- verbatim passage
            text_sha256 TEXT NOT NULL,      -- lets a re-index reuse the embedding of an unchanged passage
            page INTEGER,                   -- 1-based page (PDF), NULL otherwise
            char_start INTEGER NOT NULL,    -- span in the extracted text (str indices)
            char_end INTEGER NOT NULL,
            token_count INTEGER NOT NULL    -- embedding-model tokens, special tokens excluded
        )""")
    db.execute("CREATE INDEX chunks_document ON chunks(document_id, ordinal)")
    db.execute("CREATE INDEX chunks_text_sha256 ON chunks(text_sha256)")


@migrations()
def m003_create_chunks_fts(db: sqlite_utils.Database) -> None:
    # External-content FTS5 kept in step by triggers (the shape sqlite-utils' enable_fts creates; written out
    # because enable_fts uses executescript, which would commit the migration's transaction half-way).
    db.execute(f"CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunks', content_rowid='id', "
               f"tokenize='{FTS_TOKENIZE}')")
    db.execute("CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN "
               "INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text); END")
    db.execute("CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN "
               "INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); END")
    db.execute("CREATE TRIGGER chunks_au AFTER UPDATE ON chunks BEGIN "
               "INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); "
               "INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text); END")


@migrations()
def m004_create_embeddings(db: sqlite_utils.Database) -> None:
    db.execute("""
        CREATE TABLE embeddings (
            chunk_id INTEGER NOT NULL REFERENCES chunks(id),
            model TEXT NOT NULL,            -- embedding model id (Embedder.model_id)
            vector BLOB NOT NULL,           -- float32, little-endian, L2-normalised
            PRIMARY KEY (chunk_id, model)
        )""")
    db.execute("CREATE INDEX embeddings_model ON embeddings(model)")


@migrations()
def m005_create_meta(db: sqlite_utils.Database) -> None:
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    db.execute("INSERT INTO meta(key, value) VALUES ('embeddings_version', 0)")


@migrations()
def m006_create_roots(db: sqlite_utils.Database) -> None:
    db.execute("""
        CREATE TABLE roots (
            path TEXT PRIMARY KEY,          -- a file or folder given to `ingest`: what `rescan` walks again
            added_at REAL NOT NULL          -- unix time (s)
        )""")


@migrations()
def m007_chunk_heading_path(db: sqlite_utils.Database) -> None:
    # Issue 16: chunks are cut by structure and carry the titles of their enclosing headings, outermost
    # first, as a JSON array of strings; NULL for chunks without headings (and for every chunk indexed
    # before this migration, until its file is re-indexed).
    db.execute("ALTER TABLE chunks ADD COLUMN heading_path TEXT")


@migrations()
def m008_fts_heading_path(db: sqlite_utils.Database) -> None:
    # The keyword index gets a second column, the chunk's heading_path (m007), so that a question naming a
    # section or document title ("the lease: notice period") matches chunks under that heading; queries weigh
    # it with bm25() column weights (app.retrieval.query.HEADING_WEIGHT). The table is recreated with both
    # columns and rebuilt from ``chunks`` ('rebuild' reads the content table), so an existing store keeps
    # its chunks and is searchable as soon as it is opened (~0.2 s per 1,000 chunks).
    for trigger in ("chunks_ai", "chunks_ad", "chunks_au"):
        db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    db.execute("DROP TABLE IF EXISTS chunks_fts")
    db.execute(f"CREATE VIRTUAL TABLE chunks_fts USING fts5(text, heading_path, content='chunks', "
               f"content_rowid='id', tokenize='{FTS_TOKENIZE}')")
    db.execute("CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN "
               "INSERT INTO chunks_fts(rowid, text, heading_path) VALUES (new.id, new.text, new.heading_path); END")
    db.execute("CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN "
               "INSERT INTO chunks_fts(chunks_fts, rowid, text, heading_path) "
               "VALUES ('delete', old.id, old.text, old.heading_path); END")
    db.execute("CREATE TRIGGER chunks_au AFTER UPDATE ON chunks BEGIN "
               "INSERT INTO chunks_fts(chunks_fts, rowid, text, heading_path) "
               "VALUES ('delete', old.id, old.text, old.heading_path); "
               "INSERT INTO chunks_fts(rowid, text, heading_path) VALUES (new.id, new.text, new.heading_path); END")
    db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild')")


@migrations()
def m009_lead_vectors(db: sqlite_utils.Database) -> None:
    # A second vector per chunk: its lead (heading path and first sentence, ``chunking.lead_text``); a
    # chunk's vector score is the larger of its two cosines (docs/retrieval.md, "Search"). A store indexed
    # before has none: it is searched by chunk vectors alone until ``Ingester.embed_missing`` (run at the end
    # of every ingest with an embedder) adds them. ``recipe`` is ``chunking.LEAD_RECIPE``: leads built another
    # way are ignored by searches and embedded again. ``lead_sha256`` lets a re-indexed document re-use the
    # vectors of unchanged leads.
    db.execute("""
        CREATE TABLE lead_vectors (
            chunk_id INTEGER NOT NULL REFERENCES chunks(id),
            model TEXT NOT NULL,            -- embedding model id (Embedder.model_id)
            recipe TEXT NOT NULL,           -- how the lead text was built (chunking.LEAD_RECIPE)
            lead_sha256 TEXT NOT NULL,      -- of the lead text
            vector BLOB NOT NULL,           -- float32, little-endian, L2-normalised
            PRIMARY KEY (chunk_id, model, recipe)
        )""")
    db.execute("CREATE INDEX lead_vectors_sha256 ON lead_vectors(lead_sha256)")


@migrations()
def m010_embedding_models(db: sqlite_utils.Database) -> None:
    # Which embedding model's vectors search uses, and the switch to another (docs/retrieval.md, "Embedding
    # models"): one row per role. ``active``: the model whose vectors (and query embeddings) search uses;
    # ``pending``: the model the library is being re-embedded into (its vectors are written beside the
    # active one's until every chunk has one, then the roles change in one transaction); ``failed``: the last
    # model whose re-embed failed, with the reason. A store without an ``active`` row (indexed before this
    # migration) takes the default model as active when it holds vectors of it.
    db.execute("""
        CREATE TABLE embedding_models (
            role TEXT PRIMARY KEY,          -- active, pending, failed
            model TEXT NOT NULL,            -- embedding model id (Embedder.model_id)
            path TEXT,                      -- the GGUF file
            pooling TEXT,                   -- pooling override (mean, cls, last) or NULL: the model's own
            reason TEXT,                    -- why it failed (role failed)
            at REAL NOT NULL                -- unix time (s) the row was written
        )""")
