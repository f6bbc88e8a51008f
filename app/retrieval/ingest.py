"""Index files and folders into the documents store: one file at a time, one transaction per file.

For each file (folders are walked, hidden entries skipped):

- same size and mtime as stored → unchanged, not even read; otherwise its sha256 decides: same content →
  unchanged (the new mtime is remembered);
- content already indexed under a path that no longer exists → a rename: the document moves to the new path
  with its chunks and evidence IDs; under a path that still exists → a duplicate, recorded but not indexed
  twice;
- otherwise extract → chunk → embed → write, replacing the file's previous chunks (a modified file);
- any ``IngestError`` (unsupported type, empty, binary, password-protected, scanned, corrupt) is recorded as
  ``failed`` with its reason, and the batch goes on. Only ``indexed`` files have chunks.

Documents under a given folder (or a given file) that are gone from disk are removed with their chunks and
vectors; if an identical copy still exists elsewhere, the document moves there instead. Because every file is
its own transaction and unchanged files are skipped by hash, a killed run leaves every finished file intact
and a new run continues with the rest.

Given paths are remembered as roots; ``rescan()`` walks them again (on demand) and ``watch()`` does it in a
polling loop (cheap: unchanged files cost one ``stat``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from app.errors import HearthError, IngestError
from app.retrieval.chunking import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_OVERLAP_TOKENS,
    ApproxTokenCounter,
    TokenCounter,
    chunk_text,
)
from app.retrieval.extract import MAX_FILE_BYTES, PAGE_SEPARATOR, Extracted, extract, kind_of
from app.retrieval.store import DocumentRow, DocumentStore, NewChunk
from app.retrieval.types import (
    STATUS_DUPLICATE,
    STATUS_FAILED,
    STATUS_INDEXED,
    STATUS_REMOVED,
    STATUS_RENAMED,
    STATUS_SKIPPED,
    STATUS_UNCHANGED,
    FileStatus,
    IngestReport,
    Progress,
)

log = logging.getLogger(__name__)

ProgressCallback = Callable[[Progress], None]


class Ingester:
    """Indexes files into ``store``. ``embedder`` (an ``Embedder``, optional) computes vectors and counts
    tokens; without it chunks are sized by ``ApproxTokenCounter`` and search is BM25 only.
    ``max_tokens`` / ``overlap_tokens``: chunk size (special tokens included) and overlap, in tokens."""

    def __init__(self, store: DocumentStore, embedder=None, *, counter: TokenCounter | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, overlap_tokens: int = DEFAULT_OVERLAP_TOKENS) -> None:
        self.store = store
        self.embedder = embedder
        self.counter: TokenCounter = counter or embedder or ApproxTokenCounter()
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self._embed_failed: str | None = None

    # ------------------------------------------------------------------------------------------ public API

    def ingest(self, paths: Iterable[Path | str], progress: ProgressCallback | None = None,
               remember: bool = True) -> IngestReport:
        """Index files and folders (see the module docstring). ``progress`` is called after each file."""
        started = time.monotonic()
        roots = [_abs(p) for p in paths]
        if remember:
            for root in roots:
                if root.exists():
                    self.store.add_root(str(root))
        files = _collect(roots)
        named = {str(r) for r in roots if r.is_file()}
        state = Progress(files_total=len(files))
        report = IngestReport()
        for path in files:
            if str(path) not in named and kind_of(path) is None:
                # Found in a folder, not named by the person: an image or binary is skipped, not a failure.
                why = f"unsupported type ({path.suffix.lower() or 'no extension'})"
                status = FileStatus(str(path), STATUS_SKIPPED, why)
                report.files.append(status)
                self._advance(state, status, path, started, progress)
                continue
            status = self._ingest_one(path)
            report.files.append(status)
            self._advance(state, status, path, started, progress)
        for status in self._remove_missing(roots, set(map(str, files))):
            report.files.append(status)
            state.counts[status.status] = state.counts.get(status.status, 0) + 1
        if self.embedder is not None and not self._embed_failed:
            self.embed_missing()
        report.elapsed_s = time.monotonic() - started
        return report

    def rescan(self, progress: ProgressCallback | None = None) -> IngestReport:
        """Walk every remembered root again: new, modified, renamed and deleted files are handled."""
        roots = self.store.roots()
        report = self.ingest(roots, progress, remember=False)
        for root in roots:
            if not Path(root).exists():  # its documents were removed by the ingest above
                self.store.remove_root(root)
        return report

    def watch(self, stop: threading.Event, interval_s: float = 5.0,
              on_report: Callable[[IngestReport], None] | None = None) -> None:
        """Poll the remembered roots every ``interval_s`` seconds until ``stop`` is set; ``on_report`` gets
        each report that changed something. Run it on a worker thread with its own store."""
        while not stop.is_set():
            report = self.rescan()
            changed = [f for f in report.files
                       if f.status in (STATUS_INDEXED, STATUS_RENAMED, STATUS_REMOVED, STATUS_DUPLICATE)]
            if changed and on_report is not None:
                on_report(report)
            stop.wait(interval_s)

    def embed_missing(self, batch: int = 64) -> int:
        """Embed chunks that have no vector for the current model (indexed before the model was installed, or
        when the engine failed). Returns how many were embedded."""
        if self.embedder is None:
            return 0
        done = 0
        while True:
            todo = self.store.chunks_without_vectors(self.embedder.model_id, limit=batch)
            if not todo:
                return done
            try:
                vectors = self.embedder.embed([t for _, t in todo])
            except HearthError as exc:
                log.warning("embedding failed; %d chunks stay keyword-only: %s", len(todo), exc)
                self._embed_failed = str(exc)
                return done
            self.store.add_vectors(self.embedder.model_id, [cid for cid, _ in todo], vectors)
            done += len(todo)

    # ------------------------------------------------------------------------------------------- per file

    def _ingest_one(self, path: Path) -> FileStatus:
        key = str(path)
        try:
            st = path.stat()
        except OSError as exc:
            return self._fail(key, f"cannot read ({exc.strerror or exc})", None)
        row = self.store.document(key)
        kind = kind_of(path)
        if kind is None:
            return self._fail(key, f"unsupported type ({path.suffix.lower() or 'no extension'})", row,
                              size=st.st_size, mtime_ns=st.st_mtime_ns, type=path.suffix.lower() or None)
        if st.st_size > MAX_FILE_BYTES:
            return self._fail(key, f"too large ({st.st_size / 2**20:.0f} MiB > {MAX_FILE_BYTES >> 20} MiB)", row)
        if row and row.sha256 and row.size == st.st_size and row.mtime_ns == st.st_mtime_ns \
                and row.status != STATUS_DUPLICATE:
            return _unchanged(row)
        try:
            data = path.read_bytes()
        except OSError as exc:
            return self._fail(key, f"cannot read ({exc.strerror or exc})", row)
        sha = hashlib.sha256(data).hexdigest()
        if row and row.sha256 == sha and row.status != STATUS_DUPLICATE:
            if row.mtime_ns != st.st_mtime_ns:
                self.store.touch(row.id, st.st_mtime_ns)
            return _unchanged(row)
        moved = self._rename_or_duplicate(key, sha, st, row)
        if moved is not None:
            return moved
        return self._index(path, data, sha, st, kind, row)

    def _rename_or_duplicate(self, key: str, sha: str, st: os.stat_result,
                             row: DocumentRow | None) -> FileStatus | None:
        """Content already indexed elsewhere: a rename when that path is gone (the document moves here), a
        duplicate when it still exists; None when this content is not indexed anywhere else (index it)."""
        same = [d for d in self.store.documents_with_hash(sha) if d.path != key and d.status == STATUS_INDEXED]
        for doc in same:
            if not Path(doc.path).exists():
                self.store.move_document(doc.id, key, st.st_mtime_ns)
                return FileStatus(key, STATUS_RENAMED, f"renamed from {doc.path}", doc.chunk_count,
                                  doc.page_count)
        if not same:
            return None
        reason = f"same content as {same[0].path}"
        if not (row and row.status == STATUS_DUPLICATE and row.sha256 == sha and row.error == reason
                and row.mtime_ns == st.st_mtime_ns):
            self.store.record_status(key, status=STATUS_DUPLICATE, error=reason, sha256=sha, size=st.st_size,
                                     mtime_ns=st.st_mtime_ns, type=same[0].type)
        return FileStatus(key, STATUS_DUPLICATE, reason)

    def _index(self, path: Path, data: bytes, sha: str, st: os.stat_result, kind: str,
               row: DocumentRow | None) -> FileStatus:
        key = str(path)
        try:
            extracted = extract(path, data)
            chunks = self._chunks_or_fallback(extracted)
            if not chunks:
                raise IngestError(key, "no text")
        except IngestError as exc:
            return self._fail(key, exc.reason, row, sha256=sha, size=st.st_size, mtime_ns=st.st_mtime_ns,
                              type=kind)
        vectors, note = self._vectors(chunks)
        self.store.write_document(
            key, sha256=sha, size=st.st_size, mtime_ns=st.st_mtime_ns, type=extracted.kind,
            page_count=len(extracted.pages) if extracted.paged else None, chunks=chunks, vectors=vectors,
            model=self.embedder.model_id if vectors is not None else None, tokenizer=self.counter.name)
        return FileStatus(key, STATUS_INDEXED, note, len(chunks), len(extracted.pages))

    def _chunks_or_fallback(self, extracted: Extracted) -> list[NewChunk]:
        """Chunks sized by the embedder's tokenizer; if the embedding engine fails, by the approximate counter
        (and the rest of the run is keyword-only)."""
        try:
            return self._chunks(extracted)
        except IngestError:
            raise
        except HearthError as exc:
            if self.counter is not self.embedder:
                raise
            log.warning("embedding engine failed; sizing chunks approximately, keyword search only: %s", exc)
            self._embed_failed = str(exc)
            self.counter = ApproxTokenCounter()
            return self._chunks(extracted)

    def _chunks(self, extracted: Extracted) -> list[NewChunk]:
        out: list[NewChunk] = []
        offset = 0
        for number, page in enumerate(extracted.pages, start=1):
            for c in chunk_text(page, self.counter, self.max_tokens, self.overlap_tokens):
                out.append(NewChunk(c.text, number if extracted.paged else None, offset + c.start,
                                    offset + c.end, c.token_count))
            offset += len(page) + len(PAGE_SEPARATOR)
        return out

    def _vectors(self, chunks: list[NewChunk]) -> tuple[np.ndarray | None, str | None]:
        """Vectors for the chunks (re-using stored ones for unchanged passages), or ``(None, reason)``."""
        if self.embedder is None:
            return None, None
        if self._embed_failed:
            return None, f"indexed for keyword search only (embedding failed: {self._embed_failed})"
        model = self.embedder.model_id
        texts = [c.text for c in chunks]
        known = self.store.vectors_for_texts(model, texts)
        shas = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
        missing = [i for i, s in enumerate(shas) if s not in known]
        try:
            fresh = self.embedder.embed([texts[i] for i in missing]) if missing else None
        except HearthError as exc:
            log.warning("embedding failed; indexing for keyword search only: %s", exc)
            self._embed_failed = str(exc)
            return None, f"indexed for keyword search only (embedding failed: {exc})"
        dim = fresh.shape[1] if fresh is not None else len(next(iter(known.values()))) // 4
        out = np.zeros((len(chunks), dim), dtype=np.float32)
        for i, s in enumerate(shas):
            if s in known:
                out[i] = np.frombuffer(known[s], dtype=np.float32)
        if fresh is not None:
            out[missing] = fresh
        return out, None

    def _fail(self, key: str, reason: str, row: DocumentRow | None, **fields) -> FileStatus:
        if not (row and row.status == STATUS_FAILED and row.error == reason
                and all(getattr(row, k) == v for k, v in fields.items() if k in ("sha256", "size"))):
            self.store.record_status(key, status=STATUS_FAILED, error=reason, **fields)
        return FileStatus(key, STATUS_FAILED, reason)

    # -------------------------------------------------------------------------------------------- removal

    def _remove_missing(self, roots: list[Path], seen: set[str]) -> list[FileStatus]:
        out: list[FileStatus] = []
        for root in roots:
            docs = self.store.documents_under(str(root))
            if not docs and not root.exists():
                out.append(FileStatus(str(root), STATUS_FAILED, "no such file or folder"))
            for doc in docs:
                if doc.path in seen or Path(doc.path).exists():
                    continue
                out.append(self._remove(doc))
        return out

    def _remove(self, doc: DocumentRow) -> FileStatus:
        """A document whose file is gone: move it to an identical copy that still exists, else delete it."""
        if doc.status == STATUS_INDEXED and doc.sha256:
            for dup in self.store.documents_with_hash(doc.sha256):
                if dup.status == STATUS_DUPLICATE and Path(dup.path).exists():
                    self.store.move_document(doc.id, dup.path, dup.mtime_ns)
                    return FileStatus(dup.path, STATUS_RENAMED, f"{doc.path} was deleted; kept this copy",
                                      doc.chunk_count, doc.page_count)
        self.store.delete_document(doc.id)
        return FileStatus(doc.path, STATUS_REMOVED, "file no longer exists")

    @staticmethod
    def _advance(state: Progress, status: FileStatus, path: Path, started: float,
                 progress: ProgressCallback | None) -> None:
        state.files_done += 1
        state.counts[status.status] = state.counts.get(status.status, 0) + 1
        if status.status == STATUS_INDEXED:
            state.chunks += status.chunks
            state.pages += status.pages or 1
        try:
            state.bytes_read += path.stat().st_size
        except OSError:
            pass
        state.elapsed_s = time.monotonic() - started
        state.last = status
        if progress is not None:
            progress(state)


def _unchanged(row: DocumentRow) -> FileStatus:
    if row.status == STATUS_INDEXED:
        return FileStatus(row.path, STATUS_UNCHANGED, None, row.chunk_count, row.page_count)
    if row.status == STATUS_DUPLICATE:
        return FileStatus(row.path, STATUS_DUPLICATE, row.error)
    return FileStatus(row.path, STATUS_FAILED, row.error)


def _abs(p: Path | str) -> Path:
    """Absolute path with ``..`` resolved; symlinks kept as given (the path a person knows)."""
    return Path(os.path.abspath(os.path.expanduser(str(p))))


def _collect(roots: list[Path]) -> list[Path]:
    """Files under the roots, sorted, without duplicates; hidden files and folders skipped."""
    files: dict[str, Path] = {}
    for root in roots:
        if root.is_file():
            files.setdefault(str(root), root)
        elif root.is_dir():
            for folder, dirs, names in os.walk(root):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if not name.startswith("."):
                        p = Path(folder, name)
                        files.setdefault(str(p), p)
    return list(files.values())


def open_default(with_embedder: bool = True):
    """The default store and, when an embedding model is installed, an ``Embedder`` on it (else None)."""
    from app.retrieval.embed_model import find_embedding_model

    store = DocumentStore()
    embedder = None
    if with_embedder:
        model = find_embedding_model()
        if model is not None:
            from app.retrieval.embedder import Embedder

            embedder = Embedder(model)
    return store, embedder
