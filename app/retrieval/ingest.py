"""``Ingester``: index files and folders into the documents store, one transaction per file.

Unchanged files are skipped by size, mtime and then sha256; renames, duplicates and deleted files are
handled; a failing file is recorded with its reason and the batch goes on. Chunks are embedded in groups
across documents on a worker thread (``embed_pipeline``) while the next files are read, and each document is
committed alone, so a killed run keeps every finished file. docs/retrieval.md, 'Ingestion'.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from app.errors import HearthError, IngestError
from app.retrieval import ocr
from app.retrieval.chunking import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_OVERLAP_TOKENS,
    ApproxTokenCounter,
    TokenCounter,
    chunk_document,
    has_lead,
    lead_text,
    page_of,
)
from app.retrieval.embed_pipeline import _assemble, _assemble_leads, _Pipeline, _Prepared
from app.retrieval.extract import MAX_FILE_BYTES, Extracted, extract, kind_of
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

DEFAULT_EMBED_GROUP_TOKENS = 8192  # tokens per background embedding group (~4 decodes of 2,048 tokens)

class Ingester:
    """Indexes files into ``store``. ``embedder`` (an ``Embedder``, optional) computes vectors and counts
    tokens; without it chunks are sized by ``ApproxTokenCounter`` and search is BM25 only.
    ``max_tokens`` / ``overlap_tokens``: chunk size (special tokens included) and overlap, in tokens.
    ``embed_group_tokens``: tokens of chunks gathered across documents before they are embedded together
    (0: each document alone); ``background``: embed on a worker thread while the next files are read
    (docs/retrieval.md, 'Ingestion'); ``leads``: also embed each chunk's lead (``chunking.lead_text``,
    embedded with the chunk's group; False: one vector per chunk, what Hearth did before, for
    ``benchmarks.retrieval_perf``)."""

    def __init__(self, store: DocumentStore, embedder=None, *, counter: TokenCounter | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
                 embed_group_tokens: int = DEFAULT_EMBED_GROUP_TOKENS, background: bool = True,
                 leads: bool = True) -> None:
        self.store = store
        self.embedder = embedder
        self.counter: TokenCounter = counter or embedder or ApproxTokenCounter()
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self.embed_group_tokens = embed_group_tokens
        self.background = background
        self.leads = leads
        self._embed_failed: str | None = None
        self._pipe: _Pipeline | None = None
        self._ocr_retried: dict[str, tuple[str | None, str]] = {}  # path -> OCR setup it was last retried with

    # ------------------------------------------------------------------------------------------ public API

    def ingest(self, paths: Iterable[Path | str], progress: ProgressCallback | None = None,
               remember: bool = True, retry_failed: bool = True) -> IngestReport:
        """Index files and folders (docs/retrieval.md, 'Ingestion'). ``progress`` is called after each file.
        ``retry_failed``: read again every file recorded as failed, even unchanged (a person naming a path
        asks for it); False: only failures that depend on this machine's OCR setup (``ocr.depends_on_setup``),
        once per setup (``ocr.setup_key``) in this ``Ingester``, so a watch does not re-read them each poll."""
        started = time.monotonic()
        roots = [_abs(p) for p in paths]
        if remember:
            for root in roots:
                if root.exists():
                    self.store.add_root(str(root))
        files = _collect(roots)
        named = {str(r) for r in roots if r.is_file()}
        state = Progress(files_total=len(files), bytes_total=_total_bytes(files))
        results: list[FileStatus | None] = [None] * len(files)

        def finished(index: int, status: FileStatus) -> None:
            results[index] = status
            self._advance(state, status, files[index], started, progress)

        self._pipe = pipe = _Pipeline(self, state, started, progress, finished)
        try:
            for index, path in enumerate(files):
                state.current = str(path)
                if str(path) not in named and kind_of(path) is None:
                    # Found in a folder, not named by the person: an image or binary is skipped, not a failure.
                    why = f"unsupported type ({path.suffix.lower() or 'no extension'})"
                    finished(index, FileStatus(str(path), STATUS_SKIPPED, why))
                    continue
                outcome = self._ingest_one(path, index, retry_failed)
                if isinstance(outcome, _Prepared):
                    pipe.add(outcome)
                else:
                    finished(index, outcome)
                pipe.poll()
            pipe.finish()
        finally:
            pipe.close()
            self._pipe = None
        state.current = None
        report = IngestReport(files=[r for r in results if r is not None])
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
        report = self.ingest(roots, progress, remember=False, retry_failed=False)
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

    def embed_missing(self, batch: int = 256) -> int:
        """Embed chunks that have no vector for the current model (indexed before the model was installed, or
        when the engine failed), then the leads of chunks that have a vector but no lead vector (a store
        indexed before m009, or leads of another ``LEAD_RECIPE``). Returns how many chunks were embedded."""
        if self.embedder is None:
            return 0
        store = self.store
        done = self._embed_missing(store.chunks_without_vectors,
                                   lambda model, ids, _texts, vectors: store.add_vectors(model, ids, vectors), batch)
        if self.leads and not self._embed_failed:
            self._embed_missing(store.chunks_without_leads, store.add_lead_vectors, batch)
        return done

    def _embed_missing(self, find, add, batch: int) -> int:
        """Embed what ``find(model, limit=)`` lists, ``(chunk id, text)``, batch by batch, and ``add(model,
        ids, texts, vectors)`` it; stops at the first embedding failure."""
        model, done = self.embedder.model_id, 0
        while True:
            todo = find(model, limit=batch)
            if not todo:
                return done
            try:
                vectors = self.embedder.embed([t for _, t in todo])
            except HearthError as exc:
                log.warning("embedding failed; %d chunks stay without vectors: %s", len(todo), exc)
                self._embed_failed = str(exc)
                return done
            add(model, [cid for cid, _ in todo], [t for _, t in todo], vectors)
            done += len(todo)

    # ------------------------------------------------------------------------------------------- per file

    def _ingest_one(self, path: Path, index: int = 0, retry_failed: bool = True) -> FileStatus | _Prepared:
        key = str(path)
        try:
            st = path.stat()
        except OSError as exc:
            return self._fail(key, f"cannot read ({exc.strerror or exc})", None)
        row = self.store.document(key)
        if not stat.S_ISREG(st.st_mode):  # a named pipe would block the read forever; a socket or device too
            return self._fail(key, "not a regular file (a named pipe, socket or device)", row)
        kind = kind_of(path)
        if kind is None:
            return self._fail(key, f"unsupported type ({path.suffix.lower() or 'no extension'})", row,
                              size=st.st_size, mtime_ns=st.st_mtime_ns, type=path.suffix.lower() or None)
        if st.st_size > MAX_FILE_BYTES:
            return self._fail(key, f"too large ({st.st_size / 2**20:.0f} MiB > {MAX_FILE_BYTES >> 20} MiB)", row)
        retry = row is not None and row.status == STATUS_FAILED and self._retry(row, retry_failed)
        if row and row.sha256 and row.size == st.st_size and row.mtime_ns == st.st_mtime_ns \
                and row.status != STATUS_DUPLICATE and not retry:
            return _unchanged(row)
        try:
            data = path.read_bytes()
        except OSError as exc:
            return self._fail(key, f"cannot read ({exc.strerror or exc})", row)
        sha = hashlib.sha256(data).hexdigest()
        if row and row.sha256 == sha and row.status != STATUS_DUPLICATE and not retry:
            if row.mtime_ns != st.st_mtime_ns:
                self.store.touch(row.id, st.st_mtime_ns)
            return _unchanged(row)
        if self._pipe is not None and self._pipe.waiting(sha):
            self._pipe.finish()  # the same content waits for its vectors: write it first, then compare
            row = self.store.document(key)
        moved = self._rename_or_duplicate(key, sha, st, row)
        if moved is not None:
            return moved
        return self._prepare(path, index, data, sha, st, kind, row)

    def _retry(self, row: DocumentRow, always: bool) -> bool:
        """Whether to read a file recorded as failed again although it did not change: ``always``, or its
        reason depends on the OCR setup and that setup differs from the one it was last retried with here."""
        if always:
            return True
        if not ocr.depends_on_setup(row.error):
            return False
        setup = ocr.setup_key()
        if self._ocr_retried.get(row.path) == setup:
            return False
        self._ocr_retried[row.path] = setup
        return True

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

    def _prepare(self, path: Path, index: int, data: bytes, sha: str, st: os.stat_result, kind: str,
                 row: DocumentRow | None) -> FileStatus | _Prepared:
        """Extract and chunk; find which chunks need vectors. A failure is recorded at once."""
        key = str(path)
        try:
            extracted = extract(path, data)
            chunks = self._chunks_or_fallback(extracted)
            if not chunks:
                raise IngestError(key, "no text")
        except IngestError as exc:
            return self._fail(key, exc.reason, row, sha256=sha, size=st.st_size, mtime_ns=st.st_mtime_ns,
                              type=kind)
        prep = _Prepared(index, path, sha, st, extracted, chunks)
        if self.embedder is not None and not self._embed_failed:
            model = self.embedder.model_id
            known = self.store.vectors_for_texts(model, [c.text for c in chunks])
            prep.todo, prep.known = _todo_known([c.text for c in chunks], known)
            if self.leads:
                prep.leads = [lead_text(c.text, c.heading_path) if has_lead(c.token_count) else None
                              for c in chunks]
                known = self.store.lead_vectors_for(model, [t for t in prep.leads if t is not None])
                prep.lead_todo, prep.lead_known = _todo_known(prep.leads, known)
        return prep

    def _write(self, prep: _Prepared) -> FileStatus:
        """One transaction: the document, its chunks and (when there are) their vectors."""
        key = str(prep.path)
        vectors, leads = prep.vectors, prep.lead_vectors
        note = prep.note
        if vectors is None and self.embedder is not None and not prep.todo and prep.known:
            vectors = _assemble(len(prep.chunks), None, prep.known)
        if leads is None and vectors is not None and prep.leads and not prep.lead_todo:
            leads = _assemble_leads(prep, None)
        if vectors is None and self.embedder is not None and note is None and self._embed_failed:
            note = f"indexed for keyword search only (embedding failed: {self._embed_failed})"
        notes = "; ".join(n for n in (prep.extracted.note, note) if n) or None
        ex = prep.extracted
        self.store.write_document(
            key, sha256=prep.sha, size=prep.st.st_size, mtime_ns=prep.st.st_mtime_ns, type=ex.kind,
            page_count=len(ex.pages) if ex.paged else None, chunks=prep.chunks, vectors=vectors,
            model=self.embedder.model_id if vectors is not None else None, tokenizer=self.counter.name,
            lead_vectors=leads if vectors is not None else None)
        return FileStatus(key, STATUS_INDEXED, notes, len(prep.chunks), len(ex.pages))

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
        """Chunks of the whole document by structure (headings, paragraphs, sentences; no chunk crosses a
        page), with 1-based pages for paged formats."""
        starts = extracted.page_starts
        out: list[NewChunk] = []
        for c in chunk_document(extracted.text, self.counter, self.max_tokens, self.overlap_tokens,
                                headings=extracted.headings, breaks=starts[1:], fmt=extracted.fmt):
            page = page_of(c.start, starts) if extracted.paged else None
            out.append(NewChunk(c.text, page, c.start, c.end, c.token_count, c.heading_path))
        return out

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
        state.event = "file"
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


def _todo_known(texts: list[str | None], stored: dict[str, bytes]) -> tuple[list[int], dict[int, bytes]]:
    """Indices of ``texts`` without a stored vector (by text sha256), and the stored vectors of the rest;
    None entries are neither."""
    todo, known = [], {}
    for i, text in enumerate(texts):
        if text is None:
            continue
        blob = stored.get(_sha(text))
        if blob is None:
            todo.append(i)
        else:
            known[i] = blob
    return todo, known


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _total_bytes(files: list[Path]) -> int:
    total = 0
    for f in files:
        try:
            total += f.stat().st_size
        except OSError:
            pass
    return total


def _unchanged(row: DocumentRow) -> FileStatus:
    if row.status == STATUS_INDEXED:
        return FileStatus(row.path, STATUS_UNCHANGED, None, row.chunk_count, row.page_count)
    if row.status == STATUS_DUPLICATE:
        return FileStatus(row.path, STATUS_DUPLICATE, row.error)
    return FileStatus(row.path, STATUS_FAILED, row.error)


def _abs(p: Path | str) -> Path:
    """Absolute path with ``..`` resolved; symlinks kept as given (the path a person knows)."""
    return Path(os.path.abspath(os.path.expanduser(str(p))))


def document_paths(paths: Iterable[Path | str]) -> list[str]:
    """The document paths ``Ingester.ingest(paths)`` indexes (files named, and the files under folders named,
    hidden ones skipped), as the store records them: what a drop attaches to a chat."""
    return [str(p) for p in _collect([_abs(p) for p in paths])]


def _collect(roots: list[Path]) -> list[Path]:
    """Files under the roots, sorted, without duplicates; hidden files and folders skipped."""
    files: dict[str, Path] = {}
    for root in roots:
        if root.exists() and not root.is_dir():  # a file, or a pipe/socket/device: reported, never read
            files.setdefault(str(root), root)
        elif root.is_dir():
            for folder, dirs, names in os.walk(root):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if not name.startswith("."):
                        p = Path(folder, name)
                        files.setdefault(str(p), p)
    return list(files.values())


def open_default(with_embedder: bool = True, workers: int | None = None):
    """The default store and, when an embedding model is installed, an ``Embedder`` on the model search uses
    (``embed_switch.active_ref``: the store's active model, the one its vectors are of, even while the library
    is being re-embedded into another; else the bundled default), or None, with ``workers`` embedding
    processes (None: ``embedder.default_workers``, 2 on a 2-core machine; the second starts with the first
    bulk embedding and runs at the lowest CPU priority)."""
    from app.retrieval.embed_switch import active_ref, embedder_for

    store = DocumentStore()
    embedder = embedder_for(active_ref(store), workers=workers) if with_embedder else None
    return store, embedder
