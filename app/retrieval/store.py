"""``DocumentStore``: the documents database (``documents.db``): documents, chunks (evidence), an FTS5 index
and embeddings, over SQLite in WAL mode with the schema of ``app.retrieval.schema``.

Each document is written in one transaction (``write_document``), so a killed ingest leaves every finished
file intact; evidence IDs depend on content and position only. Why, with the search helpers (BM25, cached
vector matrix): docs/retrieval.md, 'Store' and 'Search'.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sqlite_utils

from app import paths
from app.errors import open_store_db, store_error
from app.retrieval.chunking import LEAD_MIN_TOKENS, LEAD_RECIPE, lead_text
from app.retrieval.schema import migrations
from app.retrieval.types import Evidence

log = logging.getLogger(__name__)

EVIDENCE_ID_HEX = 12
MAX_BM25_POSTINGS = 8000  # chunks scored per BM25 query before common words are left out (see ``bm25``)


def evidence_id(document_sha256: str, ordinal: int) -> str:
    """The stable evidence ID of chunk ``ordinal`` (0-based) of the document with this content hash."""
    return hashlib.sha256(f"{document_sha256}:{ordinal}".encode()).hexdigest()[:EVIDENCE_ID_HEX]


@dataclass(frozen=True)
class DocumentRow:
    id: int
    path: str
    sha256: str | None
    size: int | None
    mtime_ns: int | None
    type: str | None
    status: str
    error: str | None
    page_count: int | None
    chunk_count: int
    tokenizer: str | None = None
    indexed_at: float | None = None


@dataclass(frozen=True)
class NewChunk:
    """A chunk to write: ``page`` 1-based or None; offsets in the document's extracted text;
    ``heading_path``: titles of its enclosing headings, outermost first."""

    text: str
    page: int | None
    char_start: int
    char_end: int
    token_count: int
    heading_path: tuple[str, ...] = ()


class DocumentStore:
    """The documents database. Open one per thread (sqlite3 connections are not shared across threads).

    ``path``: the SQLite file (default: ``paths.documents_db()``)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path else paths.documents_db()
        conn = open_store_db(self.path, "documents database")  # a damaged or empty file: StoreDamaged
        try:
            self.db = sqlite_utils.Database(conn)
            self.db.enable_wal()
            self.db.execute("PRAGMA synchronous=NORMAL")  # safe with WAL: a crash loses no committed doc
            migrations.apply(self.db)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise store_error(exc, self.path, "cannot open the documents database") from exc
        self._matrix_lock = threading.Lock()
        # model -> (version, ids, chunk vectors, lead vectors or None)
        self._matrix: dict[str, tuple[int, np.ndarray, np.ndarray, np.ndarray | None]] = {}

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> DocumentStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- documents

    def document(self, path: str) -> DocumentRow | None:
        rows = self._documents("path = ?", [path])
        return rows[0] if rows else None

    def documents(self, where: str | None = None, params: list | None = None) -> list[DocumentRow]:
        return self._documents(where, params or [])

    def documents_under(self, root: str) -> list[DocumentRow]:
        """Documents whose path is ``root`` or inside the folder ``root``."""
        prefix = root if root.endswith(os.sep) else root + os.sep
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return self._documents("path = ? OR path LIKE ? ESCAPE '\\'", [root, escaped + "%"])

    def documents_with_hash(self, sha256: str) -> list[DocumentRow]:
        return self._documents("sha256 = ?", [sha256])

    def _documents(self, where: str | None, params: list) -> list[DocumentRow]:
        sql = "SELECT * FROM documents" + (f" WHERE {where}" if where else "") + " ORDER BY path"
        return [DocumentRow(**dict(r)) for r in self._query(sql, params)]

    def write_document(self, path: str, *, sha256: str, size: int, mtime_ns: int, type: str,
                       page_count: int | None, chunks: list[NewChunk], vectors: np.ndarray | None = None,
                       model: str | None = None, tokenizer: str | None = None,
                       lead_vectors: list[np.ndarray | None] | None = None) -> int:
        """Replace whatever is stored for ``path`` by this document and its chunks (and their vectors for
        ``model``, and the vectors of their leads, ``chunking.lead_text``: one per chunk, None for a chunk
        without a lead, ``chunking.has_lead``), in one transaction. Returns the document id."""
        if vectors is not None and (model is None or len(vectors) != len(chunks)):
            raise ValueError("vectors need a model id and one row per chunk")
        if lead_vectors is not None and (vectors is None or len(lead_vectors) != len(chunks)):
            raise ValueError("lead vectors need the chunks' vectors and one row per chunk")
        with self._atomic():
            self._delete_path(path)
            doc_id = self.db["documents"].insert({
                "path": path, "sha256": sha256, "size": size, "mtime_ns": mtime_ns, "type": type,
                "status": "indexed", "error": None, "page_count": page_count, "chunk_count": len(chunks),
                "tokenizer": tokenizer, "indexed_at": time.time()}).last_pk
            rows = [{"evidence_id": evidence_id(sha256, i), "document_id": doc_id, "ordinal": i, "text": c.text,
                     "text_sha256": _sha(c.text), "page": c.page, "char_start": c.char_start,
                     "char_end": c.char_end, "token_count": c.token_count,
                     "heading_path": _path_json(c.heading_path)} for i, c in enumerate(chunks)]
            self.db["chunks"].insert_all(rows, batch_size=500)
            if vectors is not None and len(chunks):
                ids = [r[0] for r in self._query("SELECT id FROM chunks WHERE document_id = ? ORDER BY ordinal",
                                                 [doc_id])]
                self._insert_vectors(model, ids, vectors)
                if lead_vectors is not None:
                    have = [i for i, v in enumerate(lead_vectors) if v is not None]
                    self._insert_lead_vectors(model, [ids[i] for i in have],
                                              [lead_text(chunks[i].text, chunks[i].heading_path) for i in have],
                                              [lead_vectors[i] for i in have])
        return int(doc_id)

    def record_status(self, path: str, *, status: str, error: str | None, sha256: str | None = None,
                      size: int | None = None, mtime_ns: int | None = None, type: str | None = None) -> None:
        """Record a document that is not indexed (failed / duplicate): its old chunks, if any, are removed,
        since they no longer describe the file."""
        with self._atomic():
            self._delete_path(path)
            self.db["documents"].insert({
                "path": path, "sha256": sha256, "size": size, "mtime_ns": mtime_ns, "type": type,
                "status": status, "error": error, "page_count": None, "chunk_count": 0, "tokenizer": None,
                "indexed_at": time.time()})

    def move_document(self, doc_id: int, new_path: str, mtime_ns: int | None = None) -> None:
        """A rename: the document and its chunks (and evidence IDs) now live at ``new_path``."""
        with self._atomic():
            self._delete_path(new_path)
            self.db.execute("UPDATE documents SET path = ?, mtime_ns = COALESCE(?, mtime_ns) WHERE id = ?",
                            [new_path, mtime_ns, doc_id])

    def touch(self, doc_id: int, mtime_ns: int) -> None:
        """Same content, new mtime: remember it so the next scan skips the file without hashing it."""
        with self._atomic():
            self.db.execute("UPDATE documents SET mtime_ns = ? WHERE id = ?", [mtime_ns, doc_id])

    def delete_document(self, doc_id: int) -> None:
        with self._atomic():
            self._delete_ids([doc_id])

    def _delete_path(self, path: str) -> None:
        ids = [r[0] for r in self._query("SELECT id FROM documents WHERE path = ?", [path])]
        self._delete_ids(ids)

    def _delete_ids(self, doc_ids: list[int]) -> None:
        for doc_id in doc_ids:
            n = self.db.execute("DELETE FROM embeddings WHERE chunk_id IN "
                                "(SELECT id FROM chunks WHERE document_id = ?)", [doc_id]).rowcount
            n += self.db.execute("DELETE FROM lead_vectors WHERE chunk_id IN "
                                 "(SELECT id FROM chunks WHERE document_id = ?)", [doc_id]).rowcount
            self.db.execute("DELETE FROM chunks WHERE document_id = ?", [doc_id])
            self.db.execute("DELETE FROM documents WHERE id = ?", [doc_id])
            if n:
                self._bump_embeddings_version()

    # -------------------------------------------------------------------------------------------- roots

    def add_root(self, path: str) -> None:
        """Remember a file or folder given to ``ingest``, so that ``rescan()`` walks it again."""
        with self._atomic():
            self.db.execute("INSERT OR IGNORE INTO roots(path, added_at) VALUES (?, ?)", [path, time.time()])

    def remove_root(self, path: str) -> None:
        with self._atomic():
            self.db.execute("DELETE FROM roots WHERE path = ?", [path])

    def roots(self) -> list[str]:
        return [r[0] for r in self._query("SELECT path FROM roots ORDER BY path")]

    # --------------------------------------------------------------------------------------- embeddings

    def vectors_for_texts(self, model: str, texts: list[str]) -> dict[str, bytes]:
        """Stored vectors (raw float32 bytes) of passages with exactly these texts, by text sha256: a
        modified document re-uses the vectors of its unchanged passages."""
        shas = sorted({_sha(t) for t in texts})
        out: dict[str, bytes] = {}
        for i in range(0, len(shas), 500):
            part = shas[i:i + 500]
            marks = ",".join("?" * len(part))
            for sha, blob in self._query(
                    f"SELECT c.text_sha256, e.vector FROM chunks c JOIN embeddings e ON e.chunk_id = c.id "
                    f"WHERE e.model = ? AND c.text_sha256 IN ({marks})", [model, *part]):
                out[sha] = blob
        return out

    def chunks_without_vectors(self, model: str, limit: int = 256) -> list[tuple[int, str]]:
        """``(chunk id, text)`` of chunks that have no vector for ``model`` yet."""
        return [(r[0], r[1]) for r in self._query(
            "SELECT c.id, c.text FROM chunks c WHERE NOT EXISTS "
            "(SELECT 1 FROM embeddings e WHERE e.chunk_id = c.id AND e.model = ?) ORDER BY c.id LIMIT ?",
            [model, limit])]

    def add_vectors(self, model: str, chunk_ids: list[int], vectors: np.ndarray) -> None:
        with self._atomic():
            self._insert_vectors(model, chunk_ids, vectors)

    def _insert_vectors(self, model: str, chunk_ids: list[int], vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        self.db.conn.executemany(
            "INSERT OR REPLACE INTO embeddings(chunk_id, model, vector) VALUES (?, ?, ?)",
            [(int(cid), model, v.tobytes()) for cid, v in zip(chunk_ids, vectors)])
        self._bump_embeddings_version()

    def lead_vectors_for(self, model: str, leads: list[str]) -> dict[str, bytes]:
        """Stored lead vectors (raw float32 bytes) of leads with exactly these texts (``LEAD_RECIPE``), by
        their sha256, like ``vectors_for_texts``."""
        shas = sorted({_sha(t) for t in leads})
        out: dict[str, bytes] = {}
        for i in range(0, len(shas), 500):
            part = shas[i:i + 500]
            marks = ",".join("?" * len(part))
            for sha, blob in self._query(
                    f"SELECT lead_sha256, vector FROM lead_vectors WHERE model = ? AND recipe = ? "
                    f"AND lead_sha256 IN ({marks})", [model, LEAD_RECIPE, *part]):
                out[sha] = blob
        return out

    def chunks_without_leads(self, model: str, limit: int = 256) -> list[tuple[int, str]]:
        """``(chunk id, lead text)`` of chunks that have a vector for ``model`` and should have a lead
        (``chunking.has_lead``) but have no lead vector of the current ``LEAD_RECIPE`` (indexed before m009, or
        with another recipe)."""
        rows = self._query(
            "SELECT c.id, c.text, c.heading_path FROM chunks c JOIN embeddings e ON e.chunk_id = c.id "
            "AND e.model = ? WHERE c.token_count > ? AND NOT EXISTS (SELECT 1 FROM lead_vectors l "
            "WHERE l.chunk_id = c.id AND l.model = ? AND l.recipe = ?) ORDER BY c.id LIMIT ?",
            [model, LEAD_MIN_TOKENS, model, LEAD_RECIPE, limit])
        return [(r[0], lead_text(r[1], _path_tuple(r[2]))) for r in rows]

    def lead_counts(self, model: str) -> tuple[int, int]:
        """``(done, total)``: chunks with a vector of ``model`` that should have a lead (``chunking.has_lead``),
        and how many of them have a lead vector of the current ``LEAD_RECIPE``: a re-embed's second phase."""
        row = self._query(
            "SELECT COUNT(l.chunk_id), COUNT(*) FROM chunks c JOIN embeddings e ON e.chunk_id = c.id "
            "AND e.model = ? LEFT JOIN lead_vectors l ON l.chunk_id = c.id AND l.model = ? AND l.recipe = ? "
            "WHERE c.token_count > ?", [model, model, LEAD_RECIPE, LEAD_MIN_TOKENS])[0]
        return row[0], row[1]

    def add_lead_vectors(self, model: str, chunk_ids: list[int], leads: list[str], vectors: np.ndarray) -> None:
        """Lead vectors of the current recipe for these chunks; rows of older recipes are dropped."""
        with self._atomic():
            self.db.execute("DELETE FROM lead_vectors WHERE model = ? AND recipe != ?", [model, LEAD_RECIPE])
            self._insert_lead_vectors(model, chunk_ids, leads, vectors)

    def _insert_lead_vectors(self, model: str, chunk_ids: list[int], leads: list[str], vectors) -> None:
        self.db.conn.executemany(
            "INSERT OR REPLACE INTO lead_vectors(chunk_id, model, recipe, lead_sha256, vector) "
            "VALUES (?, ?, ?, ?, ?)",
            [(int(cid), model, LEAD_RECIPE, _sha(t), np.asarray(v, dtype=np.float32).tobytes())
             for cid, t, v in zip(chunk_ids, leads, vectors)])
        self._bump_embeddings_version()

    def _bump_embeddings_version(self) -> None:
        self.db.execute("UPDATE meta SET value = value + 1 WHERE key = 'embeddings_version'")

    def has_vectors(self, model: str) -> bool:
        return bool(self._query("SELECT 1 FROM embeddings WHERE model = ? LIMIT 1", [model]))

    def vector_count(self, model: str) -> int:
        return self._query("SELECT COUNT(*) FROM embeddings WHERE model = ?", [model])[0][0]

    # ------------------------------------------------------------------- embedding models (m010, switching)

    def embedding_roles(self) -> dict[str, dict]:
        """Rows of ``embedding_models`` by role (``active``, ``pending``, ``failed``): dicts with ``model``,
        ``path``, ``pooling``, ``reason``, ``at``."""
        return {r["role"]: dict(r) for r in self._query("SELECT * FROM embedding_models")}

    def set_embedding_role(self, role: str, model: str, path: str | None, pooling: str | None = None,
                           reason: str | None = None) -> None:
        """Record ``model`` in ``role`` (replacing the role's model)."""
        with self._atomic():
            self.db.execute("INSERT OR REPLACE INTO embedding_models(role, model, path, pooling, reason, at) "
                            "VALUES (?, ?, ?, ?, ?, ?)", [role, model, path, pooling, reason, time.time()])

    def clear_embedding_role(self, role: str) -> None:
        with self._atomic():
            self.db.execute("DELETE FROM embedding_models WHERE role = ?", [role])

    def drop_vectors_except(self, keep: list[str]) -> int:
        """Delete the chunk and lead vectors of every model not in ``keep``; returns the chunk vectors deleted."""
        with self._atomic():
            return self._drop_vectors_except(keep)

    def _drop_vectors_except(self, keep: list[str]) -> int:
        marks = ",".join("?" * len(keep)) or "''"
        n = self.db.execute(f"DELETE FROM embeddings WHERE model NOT IN ({marks})", keep).rowcount
        if n + self.db.execute(f"DELETE FROM lead_vectors WHERE model NOT IN ({marks})", keep).rowcount:
            self._bump_embeddings_version()
        return n

    def missing_vectors(self, model: str) -> int:
        """Chunks without a vector of ``model``."""
        return self._query("SELECT COUNT(*) FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM embeddings e "
                           "WHERE e.chunk_id = c.id AND e.model = ?)", [model])[0][0]

    def switch_active(self, model: str) -> bool:
        """In one transaction: when every chunk has a vector of the pending ``model``, make it the active one
        (its ``pending`` row becomes ``active``) and delete every other model's vectors; True when switched.
        False (nothing changed) when a chunk still lacks one, e.g. a document written meanwhile. Raises
        ``ValueError`` when ``model`` is not the pending one."""
        with self._atomic():
            self._bump_embeddings_version()  # a write first: the transaction holds the write lock from here
            pending = self._query("SELECT * FROM embedding_models WHERE role = 'pending'")
            if not pending or pending[0]["model"] != model:
                raise ValueError(f"{model} is not the pending embedding model")
            if self.missing_vectors(model):
                return False
            self.db.execute("DELETE FROM embedding_models WHERE role IN ('active', 'failed')")
            self.db.execute("UPDATE embedding_models SET role = 'active', at = ? WHERE role = 'pending'",
                            [time.time()])
            self._drop_vectors_except([model])
        return True

    # ------------------------------------------------------------------------------------------- search

    def bm25(self, query: str, limit: int, max_postings: int = MAX_BM25_POSTINGS) -> list[tuple[int, float]]:
        """``(chunk id, score)`` best first; score = ``-bm25(chunks_fts)`` (larger is better). The query is
        free text: its words are OR-ed (each quoted, so FTS5 syntax in it is inert).

        Latency bound: FTS5 scores every chunk that matches any word (~1.4 ms per 1,000 on the dev CPU), so
        when the words together match more than ``max_postings`` chunks, the most frequent words are left out
        (rarest first, at least one kept). They are the words with the lowest IDF, i.e. the least weight in
        BM25; collections under ``max_postings`` chunks always get the exact ranking."""
        words = query_terms(query)
        if len(words) > 1 and max_postings:
            words = self._prune_common(words, max_postings)
        if not words:
            return []
        rows = self._query("SELECT rowid, -bm25(chunks_fts) AS s FROM chunks_fts WHERE chunks_fts MATCH ? "
                           "ORDER BY bm25(chunks_fts) LIMIT ?", [_or_match(words), limit])
        return [(int(r[0]), float(r[1])) for r in rows]

    def _prune_common(self, words: list[str], max_postings: int) -> list[str]:
        counts = {w: self._query("SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH ?",
                                 [_or_match([w])])[0][0] for w in words}
        if sum(counts.values()) <= max_postings:
            return words
        kept, total = [], 0
        for w in sorted(words, key=lambda w: counts[w]):
            if kept and total + counts[w] > max_postings:
                break
            kept.append(w)
            total += counts[w]
        return [w for w in words if w in kept]

    def vector_search(self, model: str, query_vector: np.ndarray, limit: int) -> list[tuple[int, float]]:
        """``(chunk id, score)`` best first over every chunk with a vector of ``model``; a chunk's score is
        the larger of the cosine similarities of its vector and of its lead's (``max_similarity``; the
        chunk's alone when it has no lead vector yet)."""
        ids, matrix, leads = self._vector_matrix(model)
        if not len(ids):
            return []
        with _single_blas_thread():
            scores = max_similarity(np.asarray(query_vector, dtype=np.float32).reshape(-1), matrix, leads)
        k = min(limit, len(ids))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top])]
        return [(int(ids[i]), float(scores[i])) for i in top]

    def _vector_matrix(self, model: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Chunk ids, their vectors, and their lead vectors row for row (a chunk without one repeats its own
        vector; None when no chunk has one), cached until ``embeddings_version`` changes."""
        version = self._query("SELECT value FROM meta WHERE key = 'embeddings_version'")[0][0]
        with self._matrix_lock:
            cached = self._matrix.get(model)
            if cached and cached[0] == version:
                return cached[1], cached[2], cached[3]
            rows = self._query("SELECT e.chunk_id, e.vector, l.vector FROM embeddings e LEFT JOIN lead_vectors l "
                               "ON l.chunk_id = e.chunk_id AND l.model = e.model AND l.recipe = ? "
                               "WHERE e.model = ? ORDER BY e.chunk_id", [LEAD_RECIPE, model])
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            matrix = (np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
                      if rows else np.zeros((0, 0), dtype=np.float32))
            leads = None
            if any(r[2] is not None for r in rows):
                leads = np.frombuffer(b"".join(r[2] if r[2] is not None else r[1] for r in rows),
                                      dtype=np.float32).reshape(len(rows), -1)
            self._matrix[model] = (version, ids, matrix, leads)
            return ids, matrix, leads

    def evidence(self, scored: list[tuple[int, float]]) -> list[Evidence]:
        """Evidence for ``(chunk id, score)`` pairs, in the given order (unknown ids are dropped)."""
        return [e for _cid, e in self.evidence_by_chunk(scored)]

    def evidence_by_chunk(self, scored: list[tuple[int, float]]) -> list[tuple[int, Evidence]]:
        """``(chunk id, Evidence)`` for ``(chunk id, score)`` pairs, in the given order (unknown ids are
        dropped): ``evidence`` with the chunk each passage came from."""
        if not scored:
            return []
        marks = ",".join("?" * len(scored))
        rows = {r["id"]: r for r in self._query(
            f"SELECT c.id, c.evidence_id, d.path, c.page, c.text, c.char_start, c.char_end, c.heading_path "
            f"FROM chunks c JOIN documents d ON d.id = c.document_id WHERE c.id IN ({marks})",
            [cid for cid, _ in scored])}
        return [(cid, Evidence(evidence_id=r["evidence_id"], path=r["path"], page=r["page"], score=score,
                               text=r["text"], char_start=r["char_start"], char_end=r["char_end"],
                               heading_path=_path_tuple(r["heading_path"])))
                for cid, score in scored if (r := rows.get(cid)) is not None]

    def resolve(self, evidence_ids: list[str]) -> dict[str, Evidence]:
        """Evidence by ID (score 0.0); IDs of deleted or changed content are absent."""
        if not evidence_ids:
            return {}
        marks = ",".join("?" * len(evidence_ids))
        ids = [(r[0], 0.0) for r in self._query(f"SELECT id FROM chunks WHERE evidence_id IN ({marks})",
                                                list(evidence_ids))]
        return {e.evidence_id: e for e in self.evidence(ids)}

    def check(self) -> list[str]:
        """Problems found in the database, empty when it is consistent: ``PRAGMA integrity_check``, FTS5's
        ``integrity-check`` of ``chunks_fts`` against ``chunks``, chunks or vectors without their parent row,
        indexed documents whose ``chunk_count`` differs from their chunks, and chunks of documents that are
        not indexed. Raises ``StoreError`` only when the database cannot be read at all."""
        problems = [r[0] for r in self._query("PRAGMA integrity_check") if r[0] != "ok"]
        try:
            self.db.conn.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('integrity-check')")
        except sqlite3.DatabaseError as exc:
            problems.append(f"chunks_fts: {exc}")
        checks = {
            "chunks without a document": "SELECT COUNT(*) FROM chunks WHERE document_id NOT IN "
                                         "(SELECT id FROM documents)",
            "vectors without a chunk": "SELECT COUNT(*) FROM embeddings WHERE chunk_id NOT IN "
                                       "(SELECT id FROM chunks)",
            "lead vectors without a chunk": "SELECT COUNT(*) FROM lead_vectors WHERE chunk_id NOT IN "
                                            "(SELECT id FROM chunks)",
            "documents whose chunk_count is wrong": "SELECT COUNT(*) FROM documents d WHERE status = 'indexed' AND "
                                                    "chunk_count != (SELECT COUNT(*) FROM chunks c "
                                                    "WHERE c.document_id = d.id)",
            "chunks of documents that are not indexed": "SELECT COUNT(*) FROM chunks c JOIN documents d ON "
                                                        "d.id = c.document_id WHERE d.status != 'indexed'",
        }
        for what, sql in checks.items():
            n = self._query(sql)[0][0]
            if n:
                problems.append(f"{n} {what}")
        return problems

    def stats(self) -> dict[str, int]:
        q = self._query
        return {"documents": q("SELECT COUNT(*) FROM documents WHERE status = 'indexed'")[0][0],
                "failed": q("SELECT COUNT(*) FROM documents WHERE status = 'failed'")[0][0],
                "chunks": q("SELECT COUNT(*) FROM chunks")[0][0],
                "embeddings": q("SELECT COUNT(*) FROM embeddings")[0][0],
                "lead_vectors": q("SELECT COUNT(*) FROM lead_vectors")[0][0]}

    # ---------------------------------------------------------------------------------------- internals

    def _query(self, sql: str, params: list | None = None) -> list[sqlite3.Row]:
        try:
            cur = self.db.conn.execute(sql, params or [])
            cur.row_factory = sqlite3.Row
            return cur.fetchall()
        except sqlite3.DatabaseError as exc:
            raise store_error(exc, self.path, "documents database") from exc

    def _atomic(self):
        return _Atomic(self.db, self.path)


class _Atomic:
    """``db.atomic()`` that turns SQLite errors into ``StoreError`` (after the rollback): ``DiskFull`` /
    ``StoreDamaged`` where that is what happened (``app.errors.store_error``)."""

    def __init__(self, db: sqlite_utils.Database, path: Path) -> None:
        self._cm, self._path = db.atomic(), path

    def __enter__(self):
        try:
            return self._cm.__enter__()
        except sqlite3.DatabaseError as exc:
            raise store_error(exc, self._path, "documents database") from exc

    def __exit__(self, exc_type, exc, tb):
        try:
            handled = self._cm.__exit__(exc_type, exc, tb)
        except sqlite3.DatabaseError as err:
            raise store_error(err, self._path, "documents database") from err
        if isinstance(exc, sqlite3.DatabaseError) and not handled:  # a write inside failed: rolled back
            raise store_error(exc, self._path, "documents database") from exc
        return handled


_BLAS = None


def _single_blas_thread():
    """Run a matrix-vector product on one BLAS thread. It is memory-bound (50,000 x 384 float32 = 77 MB per
    query); measured on the dev machine with other work running, OpenBLAS's default 2 threads took 8.0 ms
    (P50), one thread 3.2-5.1 ms: a second thread only waits for a busy core. Needs ``threadpoolctl``;
    without it, a no-op."""
    global _BLAS
    if _BLAS is None:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS = ThreadpoolController()
        except ImportError:
            _BLAS = False
    if _BLAS is False:
        return contextlib.nullcontext()
    return _BLAS.limit(limits=1, user_api="blas")


def max_similarity(query: np.ndarray, matrix: np.ndarray, leads: np.ndarray | None = None) -> np.ndarray:
    """Per row: the larger of the dot products of ``query`` with ``matrix``'s row and with ``leads``' row
    (L2-normalised vectors: cosines), the row's own when ``leads`` is None. The max-sim of multi-vector
    retrieval (one document, several vectors, scored by its best match), with two vectors per chunk."""
    scores = matrix @ query
    if leads is not None:
        np.maximum(scores, leads @ query, out=scores)
    return scores


def _path_json(path: tuple[str, ...]) -> str | None:
    return json.dumps(list(path), ensure_ascii=False) if path else None


def _path_tuple(raw: str | None) -> tuple[str, ...]:
    return tuple(json.loads(raw)) if raw else ()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_WORD = re.compile(r"\w+", re.UNICODE)
# Very common English words dropped from keyword queries when other words remain: they add nothing to the
# ranking (BM25 gives them ~0 weight) but cost time on large indexes (long posting lists).
STOPWORDS = frozenset(
    "a an and are as at be by for from has have how i in is it its of on or that the this to was were what "
    "when where which who why will with do does did can you your".split()
)


def query_terms(text: str) -> list[str]:
    """The words of a free-text query, lower-cased, unique, in order; stopwords dropped when others remain."""
    words = [w.lower() for w in _WORD.findall(text)]
    kept = [w for w in words if w not in STOPWORDS] or words
    return list(dict.fromkeys(kept))


def _or_match(words: list[str]) -> str:
    return " OR ".join(f'"{w}"' for w in words)


def fts_query(text: str) -> str:
    """An FTS5 MATCH expression for free text: its words (``query_terms``), each double-quoted, OR-ed.
    Empty when the text has no word characters."""
    return _or_match(query_terms(text))
