"""Embedding in the background while the next files are read (issue 16): ``_Prepared`` (a document read and
chunked, waiting for its vectors) and ``_Pipeline`` (groups them across documents, embeds a group on a worker
thread, writes its documents in order on the ingest thread). docs/retrieval.md, 'Ingestion'."""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from app.errors import EngineCrashed, HearthError
from app.retrieval.extract import Extracted
from app.retrieval.store import NewChunk
from app.retrieval.types import FileStatus, Progress

if TYPE_CHECKING:
    from app.retrieval.ingest import Ingester, ProgressCallback

log = logging.getLogger(__name__)


@dataclass
class _Prepared:
    """A document read and chunked, waiting for its vectors: its place in the report, what to write, and
    which chunks need embedding (``todo``: chunk indices) or reuse a stored vector (``known``); the same for
    the chunks' leads (``leads``: their texts, ``chunking.lead_text``; None for a chunk without a lead)."""

    index: int
    path: Path
    sha: str
    st: os.stat_result
    extracted: Extracted
    chunks: list[NewChunk]
    todo: list[int] = field(default_factory=list)
    known: dict[int, bytes] = field(default_factory=dict)
    vectors: np.ndarray | None = None
    note: str | None = None
    done: int = 0  # chunks of ``todo`` embedded so far (progress)
    leads: list[str | None] = field(default_factory=list)
    lead_todo: list[int] = field(default_factory=list)
    lead_known: dict[int, bytes] = field(default_factory=dict)
    lead_vectors: list[np.ndarray | None] | None = None

    @property
    def tokens(self) -> int:
        return sum(self.chunks[i].token_count + 2 for i in self.todo)


class _Pipeline:
    """Groups prepared documents, embeds each group (on a worker thread when ``background``) while the next
    is gathered, and writes a group's documents once its vectors are back (docs/retrieval.md, 'Ingestion').
    All store writes and progress callbacks happen on the ingest thread; the worker only calls the embedder
    and posts its progress on a queue."""

    def __init__(self, ingester: Ingester, state: Progress, started: float, progress: ProgressCallback | None,
                 finished: Callable[[int, FileStatus], None]) -> None:
        self.ing, self.state, self.started, self.progress, self.finished = ingester, state, started, progress, \
            finished
        self.group: list[_Prepared] = []
        self.group_tokens = 0
        self.flight: tuple[list[_Prepared], Future | None] | None = None
        self.events: queue.Queue = queue.Queue()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="hearth-embed") if ingester.background else None
        # per unique text of the group in flight: (document, chunk index, is the chunk's lead)
        self._owners: list[list[tuple[_Prepared, int, bool]]] = []
        self._base_chunks = self._base_tokens = self._flight_tokens = 0

    def waiting(self, sha: str) -> bool:
        """Whether a document with this content hash waits for its vectors."""
        flying = self.flight[0] if self.flight else []
        return any(p.sha == sha for p in (*self.group, *flying))

    def add(self, prep: _Prepared) -> None:
        self.group.append(prep)
        self.group_tokens += prep.tokens
        self.state.chunks_pending += len(prep.todo)
        if self.group_tokens >= self.ing.embed_group_tokens:
            self._launch()

    def poll(self) -> None:
        """Report embedding progress that arrived while the caller read files."""
        self._drain(block=False)

    def finish(self) -> None:
        """Embed and write everything still waiting."""
        if self.group:
            self._launch()
        self._land()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------------------------------ internals

    def _launch(self) -> None:
        self._land()
        group, self.group, self.group_tokens = self.group, [], 0
        texts, owners = self._texts(group)
        self.flight = (group, None)
        self._owners, self._flight_tokens = owners, 0
        if not texts:
            return
        if self.pool is not None:
            future: Future = self.pool.submit(self._embed, texts)
        else:
            future = Future()
            try:
                future.set_result(self._embed(texts, inline=True))
            except HearthError as exc:
                future.set_exception(exc)
        self.flight = (group, future)

    def _texts(self, group: list[_Prepared]) -> tuple[list[str], list[list[tuple[_Prepared, int, bool]]]]:
        """The unique texts to embed (per document its chunks, then their leads) and, per text, the
        (document, chunk index, lead?) that get its vector."""
        if self.ing.embedder is None or self.ing._embed_failed:
            return [], []
        index: dict[str, int] = {}
        texts: list[str] = []
        owners: list[list[tuple[_Prepared, int, bool]]] = []
        for prep in group:
            wanted = [(prep.chunks[i].text, i, False) for i in prep.todo]
            wanted += [(prep.leads[i], i, True) for i in prep.lead_todo]
            for text, i, lead in wanted:
                if text not in index:
                    index[text] = len(texts)
                    texts.append(text)
                    owners.append([])
                owners[index[text]].append((prep, i, lead))
        return texts, owners

    def _embed(self, texts: list[str], inline: bool = False) -> np.ndarray:
        """The group's vectors. When the embedding engine dies meanwhile, the group is embedded once more: the
        next request restarts the engine (one crash does not leave the rest of the ingest keyword-only)."""
        reported = [0]

        def report(n_texts: int, n_tokens: int) -> None:
            if n_texts <= reported[0]:  # the group again, after a crash: its progress is known up to here
                return
            reported[0] = n_texts
            self.events.put((n_texts, n_tokens))
            if inline:
                self._drain(block=False)

        try:
            return self.ing.embedder.embed(texts, progress=report)
        except EngineCrashed as exc:
            log.warning("the embedding engine died; embedding the group of %d texts again: %s", len(texts), exc)
            return self.ing.embedder.embed(texts, progress=report)

    def _land(self) -> None:
        """Wait for the group in flight (reporting its progress), then write its documents in order."""
        if self.flight is None:
            return
        group, future = self.flight
        vectors, note = None, None
        if future is not None:
            while not future.done():
                self._drain(block=True)
            try:
                vectors = future.result()
            except HearthError as exc:
                log.warning("embedding failed; indexing for keyword search only: %s", exc)
                self.ing._embed_failed = str(exc)
                note = f"indexed for keyword search only (embedding failed: {exc})"
            self._drain(block=False)
            if vectors is not None:
                self._landed()
        self.flight = None
        if vectors is not None:
            fresh: dict[tuple[int, bool], dict[int, np.ndarray]] = {}
            for row, owners in zip(vectors, self._owners):
                for prep, i, lead in owners:
                    fresh.setdefault((id(prep), lead), {})[i] = row
        for prep in group:
            self.state.chunks_pending -= len(prep.todo)
            if vectors is not None and (prep.todo or prep.known):
                n = len(prep.chunks)
                prep.vectors = _assemble(n, fresh.get((id(prep), False)), prep.known)
                if prep.leads:
                    prep.lead_vectors = _assemble_leads(prep, fresh.get((id(prep), True)))
            elif note and prep.todo:
                prep.note = note
            self.finished(prep.index, self.ing._write(prep))

    def _drain(self, block: bool) -> None:
        latest = None
        try:
            latest = self.events.get(timeout=0.1) if block else self.events.get_nowait()
            while True:
                latest = self.events.get_nowait()
        except queue.Empty:
            pass
        if latest is not None and self.flight is not None:
            self._in_flight(*latest)

    def _in_flight(self, texts_done: int, tokens_done: int) -> None:
        """Progress of the group in flight: its first ``texts_done`` unique texts have vectors."""
        st, group = self.state, self.flight[0]
        done: dict[int, int] = {}
        for owners in self._owners[:texts_done]:
            for prep, _i, lead in owners:
                if not lead:
                    done[id(prep)] = done.get(id(prep), 0) + 1
        st.chunks_embedded = self._base_chunks + sum(done.values())
        st.tokens_embedded = self._base_tokens + tokens_done
        self._flight_tokens = tokens_done
        st.in_flight = {str(p.path): (done.get(id(p), 0), len(p.todo)) for p in group if p.todo}
        self._emit()

    def _landed(self) -> None:
        st = self.state
        chunks = sum(1 for owners in self._owners for _p, _i, lead in owners if not lead)
        st.chunks_embedded = self._base_chunks = self._base_chunks + chunks
        st.tokens_embedded = self._base_tokens = self._base_tokens + self._flight_tokens
        self._flight_tokens = 0
        st.in_flight = {}
        self._emit()

    def _emit(self) -> None:
        self.state.elapsed_s = time.monotonic() - self.started
        self.state.event = "embed"
        if self.progress is not None:
            self.progress(self.state)


def _assemble(n: int, fresh: dict[int, np.ndarray] | None, known: dict[int, bytes]) -> np.ndarray | None:
    """One row per chunk (``n``): fresh vectors, else stored ones for known texts (None if any is missing)."""
    fresh = fresh or {}
    rows: list[np.ndarray] = []
    for i in range(n):
        if i in fresh:
            rows.append(np.asarray(fresh[i], dtype=np.float32))
        elif i in known:
            rows.append(np.frombuffer(known[i], dtype=np.float32))
        else:
            return None
    return np.vstack(rows) if rows else None


def _assemble_leads(prep: _Prepared, fresh: dict[int, np.ndarray] | None) -> list[np.ndarray | None] | None:
    """One entry per chunk: its lead's vector (fresh, else stored), None for a chunk without a lead; None
    when a lead's vector is missing."""
    fresh = fresh or {}
    out: list[np.ndarray | None] = []
    for i, lead in enumerate(prep.leads):
        if lead is None:
            out.append(None)
        elif i in fresh:
            out.append(np.asarray(fresh[i], dtype=np.float32))
        elif i in prep.lead_known:
            out.append(np.frombuffer(prep.lead_known[i], dtype=np.float32))
        else:
            return None
    return out
