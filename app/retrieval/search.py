"""Hybrid search: a BM25 (FTS5) ranking and a vector (cosine) ranking fused into one, optionally reranked.

The reasoning: docs/retrieval.md, 'app/retrieval/search.py'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from app.errors import HearthError, InvalidRequest
from app.retrieval.fusion import DEFAULT_FUSION, RRF_K, FusionConfig, fuse, relevance, weighted_rrf
from app.retrieval.query import bm25_ranking
from app.retrieval.store import DocumentStore
from app.retrieval.types import MODE_BM25, MODE_HYBRID, MODE_VECTOR, SearchResults

log = logging.getLogger(__name__)

DEFAULT_CANDIDATES = 50  # results taken from each ranking before fusion
MAX_K = 1000


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Fuse rankings (lists of ids, best first) by reciprocal rank fusion (Cormack et al. 2009, equal
    weights); ``(id, score)`` best first. Ties keep the order of first appearance (earlier rankings first).
    ``fusion.weighted_rrf`` takes weights."""
    return weighted_rrf(rankings, None, k)


@dataclass(frozen=True)
class Rankings:
    """The two rankings of one query before fusion. ``lexical``: BM25 ``(chunk id, score)`` best first;
    ``vector``: cosine ``(chunk id, score)`` best first, or None when no vector search was possible
    (``notice`` says why); ``embed_s``: seconds spent embedding the query."""

    lexical: list[tuple[int, float]]
    vector: list[tuple[int, float]] | None
    embed_s: float = 0.0
    notice: str | None = None


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

    ``fusion``: how the two rankings are fused (``FusionConfig``; default ``fusion.DEFAULT_FUSION``);
    ``candidates``: results per ranking before fusion; ``reranker``: an ``app.retrieval.rerank.Reranker``
    applied to the fused top passages in hybrid mode, or None (the default: no reranking)."""

    def __init__(self, store: DocumentStore, embedder=None, *, fusion: FusionConfig = DEFAULT_FUSION,
                 candidates: int = DEFAULT_CANDIDATES, reranker=None) -> None:
        self.store = store
        self.embedder = embedder
        self.fusion = fusion.validate()
        self.candidates = candidates
        self.reranker = reranker
        self._pool: ThreadPoolExecutor | None = None

    def search(self, query: str, k: int = 5, mode: str | None = None) -> SearchResults:
        """The ``k`` best passages for ``query``. ``mode``: None (hybrid when possible), ``"hybrid"``,
        ``"bm25"`` or ``"vector"``. Raises ``InvalidRequest`` for a bad ``k`` or ``mode``, ``StoreError``
        for a broken index."""
        check_search_args(k, mode)
        started = time.perf_counter()
        r = self.rankings(query, max(self.candidates, k), mode)
        by_id: dict[str, float] = {}
        if mode == MODE_BM25 or (r.vector is None and mode != MODE_VECTOR):
            used, evidence = MODE_BM25, self.store.evidence(r.lexical[:k])
        elif mode == MODE_VECTOR:
            used, evidence = MODE_VECTOR, self.store.evidence((r.vector or [])[:k])
        else:
            used, fused = MODE_HYBRID, fuse(r.lexical, r.vector, self.fusion)
            depth = max(k, self.reranker.depth) if self.reranker is not None else k
            found = self.store.evidence_by_chunk(fused[:depth])
            rel = relevance(r.lexical, r.vector or [], self.fusion)
            by_id = {e.evidence_id: rel.get(cid, 0.0) for cid, e in found}
            evidence = [e for _cid, e in found]
            if self.reranker is not None:
                evidence = self.reranker.rerank(query, evidence)[:k]
        return SearchResults(evidence, mode=used, notice=r.notice, query_embed_s=r.embed_s,
                             total_s=time.perf_counter() - started, relevance=by_id)

    def rankings(self, query: str, n: int, mode: str | None = None) -> Rankings:
        """Both rankings of ``query`` (``n`` results each) before fusion; ``mode`` ``"bm25"`` skips the
        vector side and ``"vector"`` the BM25 side. The benchmark fuses these under many settings."""
        pending = self._start_query_embedding(query) if mode != MODE_BM25 else None
        lexical = bm25_ranking(self.store, query, n) if mode != MODE_VECTOR else []  # meanwhile, here
        vector, embed_s, notice = self._vector_ranking(pending, n) if mode != MODE_BM25 else (None, 0.0, None)
        return Rankings(lexical, vector, embed_s, notice)

    def close(self) -> None:
        """Stop the worker thread (the store and the embedder belong to the caller)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _start_query_embedding(self, query: str):
        """Embed the query on a worker thread (the engine is another process, so BM25 runs at the same time).
        Returns a future of ``(vector, seconds)``, or a notice (str) when no vector search is possible."""
        if self.embedder is None:
            from app.retrieval.embed_switch import no_model_notice

            return no_model_notice(self.store)
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
