"""What an ingest run's ``Progress`` means to a person: computed once here, drawn by every adapter.

The reasoning: docs/retrieval.md, 'app/retrieval/progress.py'.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath

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

READING = "reading"  # the file being read and chunked (``Progress.current``)
EMBEDDING = "embedding"  # a file whose chunks are in the embedding group in flight

_KINDS = (STATUS_INDEXED, STATUS_UNCHANGED, STATUS_RENAMED, STATUS_DUPLICATE, STATUS_REMOVED, STATUS_SKIPPED,
          STATUS_FAILED)


class IngestCancelled(Exception):
    """Raised by a ``stop_after_document`` callback to end an ingest run between documents."""


def stop_after_document(progress: Callable[[Progress], None] | None,
                        stop: threading.Event) -> Callable[[Progress], None]:
    """``progress``, then ``IngestCancelled`` after the first finished file once ``stop`` is set (see the module
    docstring for why nothing committed is lost)."""

    def callback(p: Progress) -> None:
        if progress is not None:
            progress(p)
        if p.event == "file" and stop.is_set():
            raise IngestCancelled(f"cancelled after {p.files_done} of {p.files_total} files")

    return callback


# ---------------------------------------------------------------------------------------------- figures

@dataclass(frozen=True)
class Figures:
    """One ``Progress`` as shown. ``fraction``/``percent``: bytes of finished files (``percent`` is rounded down,
    so 100 means done); ``tokens_per_s`` None until a token is embedded; ``eta_s`` None before there is a rate
    and once every file is done."""

    fraction: float
    files_done: int
    files_total: int
    chunks_done: int
    chunks_total: int
    tokens_per_s: float | None
    eta_s: float | None

    @property
    def percent(self) -> int:
        done = int(min(1.0, self.fraction) * 100 + 1e-9)
        return done if self.finished else min(done, 99)  # a file that grew while read: not done until it is

    @property
    def finished(self) -> bool:
        return self.files_done >= self.files_total


def figures(p: Progress) -> Figures:
    finished = p.files_done >= p.files_total
    embedded_unwritten = sum(done for done, _total in p.in_flight.values())
    total = p.chunks + p.chunks_pending
    return Figures(fraction=p.fraction, files_done=p.files_done, files_total=p.files_total,
                   chunks_done=min(total, p.chunks + embedded_unwritten), chunks_total=total,
                   tokens_per_s=p.tokens_per_s if p.tokens_embedded else None,
                   eta_s=None if finished else p.eta_s)


def format_duration(seconds: float) -> str:
    """45 → "45s", 90 → "1m30s", 7300 → "2h01m"."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def summary_text(f: Figures) -> str:
    """"12 of 30 files · 340 of 420 chunks · 3,000 tok/s" (chunks "of" only while some wait for vectors)."""
    chunks = f"{f.chunks_done:,} of {f.chunks_total:,}" if f.chunks_total > f.chunks_done else f"{f.chunks_done:,}"
    parts = [f"{f.files_done:,} of {f.files_total:,} files", f"{chunks} chunk{'s' if f.chunks_total != 1 else ''}"]
    if f.tokens_per_s is not None:
        parts.append(f"{f.tokens_per_s:,.0f} tok/s")
    return " · ".join(parts)


def eta_text(f: Figures) -> str:
    """What the ETA estimates, in words; "" once every file is done."""
    if f.finished:
        return ""
    if f.eta_s is None or not math.isfinite(f.eta_s):
        return "Estimating the time left (after the first file)…"
    if f.eta_s < 1:  # the bytes are read but files are still being embedded or written (or grew while read)
        return f"Finishing: {f.files_total - f.files_done:,} file(s) still being indexed"
    return (f"ETA {format_duration(f.eta_s)}: time until all {f.files_total:,} files are indexed, "
            f"at the rate measured so far")


# ------------------------------------------------------------------------------------------ per-file rows

@dataclass(frozen=True)
class FileRow:
    """One file of a run. ``state``: ``READING``, ``EMBEDDING`` or a ``FileStatus.status``. ``chunks``: chunks
    written (indexed) or kept (unchanged, renamed); ``embedded`` of ``to_embed``: chunk progress while
    embedding; ``reason``: why it failed or was skipped (or a note on an indexed file)."""

    path: str
    state: str
    reason: str | None = None
    chunks: int = 0
    embedded: int = 0
    to_embed: int = 0

    @property
    def active(self) -> bool:
        return self.state in (READING, EMBEDDING)

    @property
    def fraction(self) -> float | None:
        """Chunk progress while embedding; None while reading (no measure) and once finished."""
        if self.state != EMBEDDING:
            return None
        return self.embedded / self.to_embed if self.to_embed else 0.0

    @property
    def problem(self) -> bool:
        return self.state in (STATUS_FAILED, STATUS_SKIPPED)

    @property
    def name(self) -> str:
        return PurePath(self.path).name or self.path

    def text(self) -> str:
        """"report.pdf — embedding 12 of 40 chunks", "scan.pdf — failed: no text layer (scanned?)"."""
        if self.state == READING:
            detail = "reading"
        elif self.state == EMBEDDING:
            detail = f"embedding {self.embedded:,} of {self.to_embed:,} chunks"
        elif self.state in (STATUS_INDEXED, STATUS_UNCHANGED):
            detail = f"{self.state}, {self.chunks:,} chunk{'s' if self.chunks != 1 else ''}"
            if self.reason:
                detail += f" ({self.reason})"
        else:
            detail = self.state + (f": {self.reason}" if self.reason else "")
        return f"{self.name} — {detail}"


def _row(status: FileStatus) -> FileRow:
    return FileRow(status.path, status.status, status.reason, status.chunks)


class IngestRun:
    """The window's view of one ingest run, folded from ``Progress`` snapshots (``update``) and the final report
    (``finish``). ``active``: rows being read or embedded now; ``listed``: finished files in the order they
    finished, unchanged ones left out (``counts`` has them); ``figures``: the latest ``Figures``."""

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.figures: Figures | None = None
        self.active: list[FileRow] = []
        self.counts: dict[str, int] = {}
        self.elapsed_s = 0.0
        self.done = False
        self.cancelling = False
        self.cancelled = False
        self.error: str | None = None
        self._finished: dict[str, FileStatus] = {}
        self._chunks_done = 0

    @property
    def listed(self) -> list[FileRow]:
        return [_row(s) for s in self._finished.values() if s.status != STATUS_UNCHANGED]

    @property
    def problems(self) -> list[FileRow]:
        """Failed and skipped files with their reasons."""
        return [r for r in self.listed if r.problem]

    def update(self, p: Progress) -> None:
        if p.event == "file" and p.last is not None:
            self._add(p.last)
        f = figures(p)
        # a group's chunks count as done once embedded, but the event that ends its flight comes just before
        # its documents are written (``in_flight`` empty, not yet in ``chunks``): never step back there
        self._chunks_done = max(self._chunks_done, f.chunks_done)
        self.figures = Figures(f.fraction, f.files_done, f.files_total, min(self._chunks_done, f.chunks_total),
                               f.chunks_total, f.tokens_per_s, f.eta_s)
        self.elapsed_s = p.elapsed_s
        self.counts = dict(p.counts)
        self.active = self._active(p)

    def _add(self, status: FileStatus) -> None:
        self._finished.pop(status.path, None)  # re-handled (moved to the end)
        self._finished[status.path] = status

    def _active(self, p: Progress) -> list[FileRow]:
        rows = [FileRow(path, EMBEDDING, embedded=done, to_embed=total)
                for path, (done, total) in p.in_flight.items() if path not in self._finished]
        if p.current and p.current not in self._finished and p.current not in p.in_flight \
                and p.files_done < p.files_total:
            rows.insert(0, FileRow(p.current, READING))
        return rows

    def finish(self, report: IngestReport | None, *, cancelled: bool = False, error: str | None = None) -> None:
        """The run is over: ``report`` adds what came without a progress event (removed documents)."""
        for status in report.files if report is not None else ():
            if status.path not in self._finished:
                self._add(status)
                self.counts[status.status] = self.counts.get(status.status, 0) + 1
        if report is not None:
            self.elapsed_s = report.elapsed_s or self.elapsed_s
        self.active, self.done, self.cancelled, self.error = [], True, cancelled, error

    def report(self) -> IngestReport:
        """The files finished so far, as a report (a cancelled run has no other)."""
        return IngestReport(files=list(self._finished.values()), elapsed_s=self.elapsed_s)

    def status_text(self) -> str:
        """The line under the bar: figures while running, the outcome once done."""
        if self.done:
            return self._outcome()
        if self.cancelling:
            return "Cancelling: stopping after the document being written…"
        if self.figures is None:
            return f"Indexing {self.label}…" if self.label else "Indexing…"
        return summary_text(self.figures)

    def eta_text(self) -> str:
        return "" if self.done or self.cancelling or self.figures is None else eta_text(self.figures)

    def _outcome(self) -> str:
        counts = ", ".join(f"{self.counts[k]:,} {k}" for k in _KINDS if self.counts.get(k))
        if self.error:
            return f"Indexing failed: {self.error}" + (f" ({counts} before it)" if counts else "")
        if self.cancelled:
            done = f"{self.figures.files_done:,} of {self.figures.files_total:,} files" if self.figures else "0 files"
            return (f"Cancelled after {done} ({counts or 'nothing indexed'}). Finished documents are kept; "
                    f"adding the same files again or Rescan goes on with the rest.")
        return f"Done in {self.elapsed_s:.1f} s: {counts or 'nothing to do'}."
