"""Hybrid search: BM25 (FTS5) and vector (cosine) rankings fused by reciprocal rank fusion.

RRF (Cormack, Clarke and Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and individual rank learning
methods", SIGIR 2009): ``score(d) = sum over rankings r of 1 / (k + rank_r(d))`` with ranks from 1 and
``k = 60``, the constant of the paper. It needs no score calibration between BM25 and cosine similarity, which
live on unrelated scales. Each ranking contributes its top ``candidates`` results.

Without an embedding model (or with no vectors for it yet, or when the embedding engine fails) the search is
BM25 alone, and the result says so: ``SearchResults.mode == "bm25"`` with a ``notice`` for the person.

The query is embedded on a worker thread while BM25 runs on the calling thread (the embedding engine is
another process), so a hybrid search costs about max(embedding, BM25) + vector search + fusion.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from app.errors import HearthError, InvalidRequest
from app.retrieval.store import DocumentStore
from app.retrieval.types import MODE_BM25, MODE_HYBRID, MODE_VECTOR, SearchResults

log = logging.getLogger(__name__)

RRF_K = 60  # Cormack et al. 2009
DEFAULT_CANDIDATES = 50  # results taken from each ranking before fusion
MAX_K = 1000


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Fuse rankings (lists of ids, best first) by reciprocal rank fusion; ``(id, score)`` best first. Ties
    keep the order of first appearance (earlier rankings first)."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


def check_k(k: object, *, limit: int = MAX_K, param: str = "k") -> int:
    """``k`` when it is an integer from 1 to ``limit``; else ``InvalidRequest`` naming ``param``."""
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= limit:
        raise InvalidRequest(f"{param} must be an integer from 1 to {limit}, got {k!r}", param=param)
    return k


def check_search_args(k: object, mode: object) -> None:
    """``InvalidRequest`` naming the parameter unless ``k`` is an integer in 1..MAX_K and ``mode`` is None,
    ``"hybrid"``, ``"bm25"`` or ``"vector"``."""
    check_k(k)
    if mode not in (None, MODE_HYBRID, MODE_BM25, MODE_VECTOR):
        raise InvalidRequest(f"mode must be hybrid, bm25 or vector, got {mode!r}", param="mode")


class Retriever:
    """Searches a ``DocumentStore``; ``embedder`` (an ``Embedder`` or None) embeds queries.

    ``rrf_k``: the RRF constant; ``candidates``: results per ranking before fusion."""

    def __init__(self, store: DocumentStore, embedder=None, *, rrf_k: int = RRF_K,
                 candidates: int = DEFAULT_CANDIDATES) -> None:
        self.store = store
        self.embedder = embedder
        self.rrf_k = rrf_k
        self.candidates = candidates
        self._pool: ThreadPoolExecutor | None = None

    def search(self, query: str, k: int = 5, mode: str | None = None) -> SearchResults:
        """The ``k`` best passages for ``query``. ``mode``: None (hybrid when possible), ``"hybrid"``,
        ``"bm25"`` or ``"vector"``."""
        check_search_args(k, mode)
        started = time.perf_counter()
        n = max(self.candidates, k)
        pending = self._start_query_embedding(query) if mode != MODE_BM25 else None
        lexical = self.store.bm25(query, n) if mode != MODE_VECTOR else []  # meanwhile, in this thread
        vector, embed_s, notice = self._vector_ranking(pending, n) if mode != MODE_BM25 else ([], 0.0, None)
        if mode == MODE_BM25 or (vector is None and mode != MODE_VECTOR):
            used, scored = MODE_BM25, lexical[:k]
        elif mode == MODE_VECTOR:
            used, scored = MODE_VECTOR, (vector or [])[:k]
        else:
            used = MODE_HYBRID
            scored = rrf([[i for i, _ in lexical], [i for i, _ in vector]], self.rrf_k)[:k]
        return SearchResults(self.store.evidence(scored), mode=used, notice=notice, query_embed_s=embed_s,
                             total_s=time.perf_counter() - started)

    def close(self) -> None:
        """Stop the worker thread (the store and the embedder belong to the caller)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _start_query_embedding(self, query: str):
        """Embed the query on a worker thread (the engine is another process, so BM25 runs at the same time).
        Returns a future of ``(vector, seconds)``, or a notice (str) when no vector search is possible."""
        if self.embedder is None:
            return "no embedding model installed: keyword search (BM25) only; run `hearth setup`"
        if not self.store.has_vectors(self.embedder.model_id):
            return (f"no vectors for {self.embedder.model_id} yet: keyword search (BM25) only; "
                    "run `hearth ingest`")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hearth-query-embed")
        return self._pool.submit(_timed_embed, self.embedder, query)

    def _vector_ranking(self, pending, n: int) -> tuple[list[tuple[int, float]] | None, float, str | None]:
        """``(ranking or None, seconds spent embedding, notice)``; None means "no vector search possible"."""
        if isinstance(pending, str):
            return None, 0.0, pending
        try:
            qvec, embed_s = pending.result()
        except HearthError as exc:
            log.warning("query embedding failed: %s", exc)
            return None, 0.0, f"embedding engine failed ({exc}): keyword search (BM25) only"
        return self.store.vector_search(self.embedder.model_id, qvec, n), embed_s, None


def _timed_embed(embedder, query: str):
    t0 = time.perf_counter()
    vector = embedder.embed([query])[0]
    return vector, time.perf_counter() - t0


def search(query: str, k: int = 5) -> SearchResults:
    """Search the default collection (``documents.db`` of the data directory), hybrid when an embedding
    model is installed. Starts and stops an embedding engine: for repeated searches keep a ``Retriever``."""
    from app.retrieval.ingest import open_default

    store, embedder = open_default()
    retriever = Retriever(store, embedder)
    try:
        return retriever.search(query, k)
    finally:
        retriever.close()
        if embedder is not None:
            embedder.close()
        store.close()
