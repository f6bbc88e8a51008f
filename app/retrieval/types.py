"""Value types of the retrieval layer: evidence (a stored passage), per-file ingest status and progress.

All are plain, picklable dataclasses so that they can cross a process or thread boundary (UI workers, the
server) unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

# Search modes (``SearchResults.mode``): which rankings produced the result.
MODE_HYBRID = "hybrid"  # BM25 and vector rankings fused by reciprocal rank fusion
MODE_BM25 = "bm25"  # full-text only: no embedding model, or no vectors for this model yet
MODE_VECTOR = "vector"  # vector only (benchmarks)


@dataclass(frozen=True)
class Evidence:
    """One retrieved passage, stored verbatim.

    evidence_id: stable ID (12 hex digits) derived from the document's content sha256 and the chunk's ordinal,
    so it survives a rename and a re-index of unchanged content. path: the document's current path. page:
    1-based page number for paged formats (PDF), else None. score: the ranking score (RRF score in hybrid
    mode, ``-bm25()`` in BM25 mode, cosine similarity in vector mode; larger is better, comparable only within
    one result list). text: the passage, exactly as extracted. char_start / char_end: the passage's span, in
    characters (Python ``str`` indices), in the document's extracted text (pages joined by ``PAGE_SEPARATOR``),
    so that ``extracted[char_start:char_end] == text``. heading_path: titles of the headings that enclose the
    passage in its document, outermost first (Markdown/HTML/DOCX/PDF headings, code definitions; empty when
    there are none, or when the document was indexed before issue 16 and not changed since).
    """

    evidence_id: str
    path: str
    page: int | None
    score: float
    text: str
    char_start: int
    char_end: int
    heading_path: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SearchResults(list):
    """A ``list[Evidence]``, best first, that also says how it was ranked.

    mode: ``"hybrid"``, ``"bm25"`` or ``"vector"``. notice: a sentence for a person when the mode is degraded
    (e.g. "no embedding model: keyword search only"), else None. query_embed_s: seconds spent embedding the
    query (0.0 when none); total_s: seconds for the whole search, embedding included. relevance: in hybrid
    mode, each result's margin-keeping relevance by evidence ID (``fusion.relevance``: normalised score fusion
    of the same two rankings, 0 … 1), which a chat turn's relevance floor compares; else empty.
    """

    def __init__(self, items=(), *, mode: str = MODE_HYBRID, notice: str | None = None,
                 query_embed_s: float = 0.0, total_s: float = 0.0,
                 relevance: dict[str, float] | None = None) -> None:
        super().__init__(items)
        self.mode = mode
        self.notice = notice
        self.query_embed_s = query_embed_s
        self.total_s = total_s
        self.relevance = relevance or {}


# Per-file ingest outcomes.
STATUS_INDEXED = "indexed"  # new or modified content, chunks written
STATUS_UNCHANGED = "unchanged"  # same content hash as the stored copy: skipped
STATUS_RENAMED = "renamed"  # same content as a document whose old path is gone: path moved, chunks kept
STATUS_DUPLICATE = "duplicate"  # same content as another indexed document that still exists: not indexed twice
STATUS_FAILED = "failed"  # could not be indexed; ``reason`` says why
STATUS_REMOVED = "removed"  # the file is gone: its document and chunks were deleted
STATUS_SKIPPED = "skipped"  # found while walking a folder, of a type Hearth does not index (images, binaries)


@dataclass(frozen=True)
class FileStatus:
    """What happened to one file in an ingest run. ``chunks``: chunks written (0 unless indexed).
    ``reason``: why it failed / was skipped, for a person (None when indexed)."""

    path: str
    status: str
    reason: str | None = None
    chunks: int = 0
    pages: int | None = None

    @property
    def ok(self) -> bool:
        return self.status != STATUS_FAILED


@dataclass
class Progress:
    """Progress of an ingest run, reported after each file (``event == "file"``) and after each batch of
    embeddings (``event == "embed"``), always on the ingest thread.

    files_done / files_total: files handled so far / found by the scan. chunks: chunks written so far.
    pages: pages (PDF) or documents (other formats count as one page each) indexed so far. bytes_read: bytes of
    the files handled; bytes_total: bytes of every file found. elapsed_s: seconds since the run started. last:
    the status of the file just handled (``event == "file"``). counts: files per status so far.
    current: the file being read and chunked (None when the run is over). chunks_embedded / tokens_embedded:
    chunks and embedding-model tokens (special tokens included; the chunks' leads' tokens too) embedded so far
    in this run;
    chunks_pending: chunks read and waiting for vectors. in_flight: for each file whose chunks are being
    embedded, ``(chunks embedded, chunks to embed)`` — the window's per-file progress.
    """

    files_total: int
    files_done: int = 0
    chunks: int = 0
    pages: int = 0
    bytes_read: int = 0
    elapsed_s: float = 0.0
    last: FileStatus | None = None
    counts: dict[str, int] = field(default_factory=dict)
    bytes_total: int = 0
    current: str | None = None
    event: str = "file"
    chunks_embedded: int = 0
    tokens_embedded: int = 0
    chunks_pending: int = 0
    in_flight: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Embedding throughput of this run so far (tokens per second of wall time)."""
        return self.tokens_embedded / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def fraction(self) -> float:
        """Work done, 0.0-1.0: bytes of the files finished."""
        if self.bytes_total <= 0:
            return self.files_done / self.files_total if self.files_total else 1.0
        return min(1.0, self.bytes_read / self.bytes_total)

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (by bytes of finished files); None before the first file is done."""
        f = self.fraction
        if f <= 0 or self.elapsed_s <= 0:
            return None
        return self.elapsed_s * (1 - f) / f

    def snapshot(self) -> Progress:
        """A copy that later updates do not change (to hand to another thread, e.g. a Qt signal)."""
        return replace(self, counts=dict(self.counts), in_flight=dict(self.in_flight))

    @property
    def files_per_s(self) -> float:
        return self.files_done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass
class IngestReport:
    """The outcome of an ingest run: one ``FileStatus`` per file (and per removed document) plus totals."""

    files: list[FileStatus] = field(default_factory=list)
    elapsed_s: float = 0.0

    def count(self, status: str) -> int:
        return sum(1 for f in self.files if f.status == status)

    @property
    def chunks(self) -> int:
        """Chunks written in this run (files indexed now; unchanged files report their stored count)."""
        return sum(f.chunks for f in self.files if f.status == STATUS_INDEXED)

    @property
    def failed(self) -> list[FileStatus]:
        return [f for f in self.files if f.status == STATUS_FAILED]

    def by_path(self) -> dict[str, FileStatus]:
        return {f.path: f for f in self.files}
