"""Evidence for a turn and citations out of its answer, written once for every adapter.

The reasoning: docs/memory.md, 'app/assistant/evidence.py'.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.memory.context import EvidenceText
from app.retrieval.rag import evidence_header, format_passage, parse_citations
from app.retrieval.types import MODE_HYBRID, Evidence

log = logging.getLogger(__name__)

SEARCH_K = 24  # candidates searched before filtering by a conversation's chosen documents
MAX_K = 20  # passages one turn may ask for (``--k``, ``hearth.k``)
CITATION_KEYS = ("evidence_id", "path", "page", "quote")
SEARCH_CACHE = 256  # searches remembered per source (a stateless chat re-grounds every earlier question)
# A hybrid passage whose relevance is under this share of the best passage's is not given to the model
# (``DocumentSource.search``); chosen on the benchmark's dev halves (``python -m benchmarks.evidence_floor``).
RELEVANCE_FLOOR = 0.5


@dataclass(frozen=True)
class Found:
    """The passages a search returned, best first, and ``notice``: a sentence when search was degraded (no
    embedding model: keyword search only) or found nothing to search, else None."""

    evidence: tuple[Evidence, ...]
    notice: str | None = None


class DocumentSource:
    """Searchable documents for turns (RAG).

    ``store``: a ``DocumentStore``; ``embedder``: an ``Embedder`` or None (BM25 only). ``owns_store`` /
    ``owns_embedder``: close them with ``close()``. Thread-safe: searches run one at a time."""

    def __init__(self, store: Any, embedder: Any = None, *, owns_store: bool = False,
                 owns_embedder: bool = False) -> None:
        from app.retrieval.search import Retriever

        self.store, self.embedder = store, embedder
        self._owns = (owns_store, owns_embedder)
        self._retriever = Retriever(store, embedder)
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, tuple[tuple[int, int], Found]] = OrderedDict()
        self._checker: Any = None
        self._checker_lock = threading.Lock()
        self._own_check_embedder: Any = None  # all-MiniLM-L6-v2 for ``checker`` when search uses another model

    @classmethod
    def open_default(cls, embedder: Any = None) -> "DocumentSource":
        """The data directory's index (``documents.db``) searched with ``embedder`` (kept open on close: its
        owner shares it, e.g. the desktop's ingest) or, when None, with an ``Embedder`` of its own on the
        installed embedding model (none installed: BM25 only). An ``embedder`` on another model than the one the
        library's vectors are of (``embed_switch.active_ref``: after the user chose another model) is not shared:
        the source starts its own on the active model, so the query and the vectors always come from one model."""
        from app.retrieval.embed_switch import active_ref
        from app.retrieval.ingest import open_default

        if embedder is not None:
            store, _ = open_default(with_embedder=False)
            active = active_ref(store)
            if active is not None and getattr(embedder, "model_id", None) == active.model_id:
                return cls(store, embedder, owns_store=True, owns_embedder=False)
            store.close()
        store, own = open_default(with_embedder=True)
        return cls(store, own, owns_store=True, owns_embedder=True)

    def search(self, query: str, k: int, paths: Sequence[str] | None = None, mode: str | None = None,
               floor: float = RELEVANCE_FLOOR) -> Found:
        """The ``k`` best passages for ``query``, limited to ``paths`` when given (an empty list: nothing).
        ``mode``: None (hybrid when an embedding model is there), ``"hybrid"``, ``"bm25"`` or ``"vector"``
        (``app.retrieval.search.Retriever``). ``floor``: a hybrid search gives only passages at least this
        share of the best one's relevance (``above_floor``; the default is a chat turn's, 0 gives all ``k``:
        ``hearth search``). Raises ``InvalidRequest`` for an empty query, a bad ``k`` or ``mode``."""
        from app.errors import InvalidRequest
        from app.retrieval.search import check_search_args

        check_search_args(k, mode)
        if not query.strip():
            raise InvalidRequest("the search query is empty", param="query")
        if paths is not None and not paths:
            return Found(())
        key = (query, k, None if paths is None else tuple(paths), mode, floor)
        with self._lock:
            version = self._version()
            hit = self._cache.get(key)
            if hit is not None and hit[0] == version:
                self._cache.move_to_end(key)
                return hit[1]
            found = self._search(query, k, paths, mode, floor)
            self._cache[key] = (version, found)
            while len(self._cache) > SEARCH_CACHE:
                self._cache.popitem(last=False)
        return found

    def _search(self, query: str, k: int, paths: Sequence[str] | None, mode: str | None, floor: float) -> Found:
        if not self.store.stats()["chunks"]:
            return Found((), "no documents are indexed yet (add some with `hearth ingest PATH` or the "
                             "Documents panel)")
        results = self._retriever.search(query, max(k, SEARCH_K) if paths is not None else k, mode)
        chosen = set(paths) if paths is not None else None
        kept = [e for e in results if chosen is None or e.path in chosen][:k]
        if results.mode == MODE_HYBRID and floor > 0:
            kept = above_floor(kept, results.relevance, floor)
        return Found(tuple(kept), results.notice)

    def _version(self) -> tuple[int, int]:
        """Changes whenever the index may have: SQLite's ``data_version`` (another connection committed)
        and this connection's ``total_changes`` (it wrote). A remembered search is reused only while equal:
        the same question then gets the same passages, which a re-grounded earlier turn relies on."""
        conn = self.store.db.conn
        return conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes

    def checker(self) -> Any:
        """The ``citecheck.CitationChecker`` the citation check and the attribution use. Their bars
        (``citecheck.DEFAULT_THRESHOLD``, ``attribution.ATTRIBUTION_THRESHOLD``) were chosen on all-MiniLM-L6-v2,
        so it embeds with that model whatever model search uses: this source's embedder when it is the
        installed default (``embed_model.find_embedding_model``), else an ``Embedder`` of its own on that file
        (started on the first call, closed by ``close``); without the default installed, or when it cannot be
        started, none: facts and word overlap only (docs/retrieval.md, "Attribution")."""
        with self._checker_lock:
            if self._checker is None:
                from app.retrieval.citecheck import CitationChecker

                embedder = self._check_embedder()
                self._checker = CitationChecker(embedder.embed if embedder is not None else None)
            return self._checker

    def _check_embedder(self) -> Any:
        """The all-MiniLM-L6-v2 embedder for ``checker``: this source's when it is that model, else one of its
        own (``self._own_check_embedder``), else None."""
        from app.retrieval.embed_model import find_embedding_model

        path = find_embedding_model()
        if path is None:
            return None
        from app.retrieval.embedder import Embedder, model_id_for

        if self.embedder is not None and getattr(self.embedder, "model_id", None) == model_id_for(path):
            return self.embedder
        try:
            self._own_check_embedder = Embedder(path)
        except Exception:  # noqa: BLE001 - the check still runs on facts and word overlap
            log.warning("citation check: could not start %s; checking facts and word overlap only", path,
                        exc_info=True)
            return None
        return self._own_check_embedder

    def close(self) -> None:
        """Stop the search thread; close the store and the embedder this source owns (and the check's own)."""
        self._retriever.close()
        owns_store, owns_embedder = self._owns
        if owns_embedder and self.embedder is not None:
            self.embedder.close()
        if self._own_check_embedder is not None:
            self._own_check_embedder.close()
            self._own_check_embedder = None
        if owns_store:
            self.store.close()


def above_floor(evidence: Sequence[Evidence], relevance: Mapping[str, float],
                floor: float = RELEVANCE_FLOOR) -> list[Evidence]:
    """The passages of a hybrid result (best first) whose relevance (``relevance[evidence_id]``:
    ``SearchResults.relevance``, normalised score fusion, 0 … 1) is at least ``floor`` times the best
    relevance among them; the first passage always. Normalised scores put a passage that matched neither the
    question's words nor its meaning well far below one that did; given to the model anyway it is noise a
    small model may quote, and prompt tokens every later turn carries. A passage without a relevance is kept.
    Measured on both benchmark sets (``python -m benchmarks.evidence_floor``, docs/retrieval.md "Relevance
    floor"): at 0.5 no relevant passage of either set's top 4 is left out."""
    scores = [relevance.get(e.evidence_id) for e in evidence]
    best = max((s for s in scores if s is not None), default=0.0)
    if best <= 0:
        return list(evidence)
    return [e for i, (e, s) in enumerate(zip(evidence, scores)) if i == 0 or s is None or s >= floor * best]


def check_k(k: object, param: str = "k") -> int:
    """``k`` (passages per turn) when it is an integer from 1 to ``MAX_K``; else ``InvalidRequest`` naming
    ``param`` (the search's own check, with the turn's smaller bound)."""
    from app.retrieval.search import check_k as check_search_k

    return check_search_k(k, limit=MAX_K, param=param)


def dropped_notice(dropped: int) -> str | None:
    """The sentence saying that ``dropped`` passages matched but did not fit the context (None for 0)."""
    if not dropped:
        return None
    return (f"{dropped} matching passage{'s' if dropped > 1 else ''} left out: no room in the context window "
            "(a larger n_ctx, a smaller max_tokens or a shorter history makes room)")


def join_notices(*notices: str | None) -> str | None:
    """The notices that are set, joined into one sentence list (None when none is)."""
    kept = [n for n in notices if n]
    return "; ".join(kept) if kept else None


LATER_HEADER = "More evidence (cite it the same way):"  # a later turn's header: the instructions are above


def evidence_text(evidence: Sequence[Evidence], repeated: Sequence[Evidence] = (), *,
                  instructions: bool = True) -> EvidenceText | None:
    """``evidence`` as prompt text (None for none): the citation instructions once, then each passage.
    ``repeated``: passages that also match but are already in the prompt from an earlier turn; they are
    named by ID in one last line (``Also relevant, given above: [E:<id>], ...``; their paths are in the
    earlier turn) instead of being given again. ``instructions`` False: a short ``LATER_HEADER`` instead of
    the instructions, for a turn whose prompt already holds them (~70 tokens a turn saved)."""
    if not evidence and not repeated:
        return None
    passages = [format_passage(e) for e in evidence]
    if repeated:
        passages.append("Also relevant, given above: " + ", ".join(f"[E:{e.evidence_id}]" for e in repeated))
    header = evidence_header(list(evidence) or list(repeated)) if instructions else LATER_HEADER
    return EvidenceText(header, tuple(passages))


def citations(answer: str, evidence: Sequence[Evidence]) -> list[dict]:
    """The passages ``answer`` cites by ``[E:<id>]``, as dicts with ``CITATION_KEYS`` (quote: the quoted span,
    else the passage), in answer order; [] when it cites none (IDs the model made up produce nothing)."""
    if not evidence:
        return []
    return [{key: getattr(c, key) for key in CITATION_KEYS} for c in parse_citations(answer, list(evidence))]


def checked_citations(answer: str, evidence: Sequence[Evidence], checker: Any = None) -> list[dict]:
    """``citations`` with the citation check (``app.retrieval.citecheck``), for the window and the API to mark
    unsupported sentences: each dict has ``CITATION_KEYS`` plus

    - ``supported``: bool, whether the cited passage supports the sentence that cites it (its numbers,
      dates, units and codes are in the passage, and, with embeddings, its meaning is close enough:
      ``citecheck.DEFAULT_THRESHOLD``); the API's ``hearth.citations[].supported``;
    - ``sentence_start`` / ``sentence_end``: the citing sentence's span in ``answer`` (str indices, the
      marker excluded), what the window underlines when unsupported;
    - ``support``: ``SupportCheck.to_dict()``: ``missing`` (facts not in the passage, as written),
      ``similarity`` (cosine or None), ``threshold``, ``reason`` (a sentence for a person).

    ``checker``: a ``CitationChecker`` (``DocumentSource.checker()``, with embeddings when the source has an
    embedder); None: facts only. Costs one embedding call per answer (~0.2 s per citation on the loaded
    2-core dev machine, docs/retrieval.md); when that call fails (the embedding process crashed), the facts
    check alone is returned (``similarity`` None)."""
    if not evidence:
        return []
    from app.retrieval.rag import check_citations

    cites = parse_citations(answer, list(evidence))
    try:
        checked = check_citations(answer, cites, list(evidence), checker)
    except Exception:  # noqa: BLE001 - the embedding process failed: the answer still gets the facts check
        if checker is None:
            raise
        log.warning("citation check: embedding failed; checked facts only", exc_info=True)
        checked = check_citations(answer, cites, list(evidence), None)
    return [{**{key: getattr(c, key) for key in CITATION_KEYS}, "supported": c.supported,
             "sentence_start": c.sentence_start, "sentence_end": c.sentence_end, "support": c.support}
            for c in checked]


def attributions(answer: str, evidence: Sequence[Evidence], checker: Any = None) -> list[dict]:
    """Each claim sentence of ``answer`` attributed to the passage of ``evidence`` that best supports it, or
    to none, with its facts checked (``app.retrieval.attribution.attribute``), whether or not the answer
    cites: ``SentenceAttribution.to_dict()`` dicts (``sentence_start`` / ``sentence_end`` str indices into
    ``answer``, ``evidence_id`` / ``path`` / ``page`` or None, ``supported`` True / False / None, ``support``:
    ``{missing, similarity, threshold, overlap, reason}``), in answer order; [] without evidence. What
    ``hearth.attributions`` carries and the store keeps. ``checker``: as ``checked_citations`` (its embedder
    measures similarity; None or a failing one: word overlap)."""
    if not evidence:
        return []
    from app.retrieval.attribution import attribute

    return [a.to_dict() for a in attribute(answer, list(evidence), checker)]


def given(evidence: Sequence[Evidence]) -> list[dict]:
    """What the model was given: ``evidence_id``, ``path``, ``page``, ``text`` per passage, in prompt order."""
    return [{"evidence_id": e.evidence_id, "path": e.path, "page": e.page, "text": e.text} for e in evidence]


def prune_stale_citations(memory_store: Any = None, doc_store: Any = None) -> int:
    """After documents were re-indexed, renamed or deleted: drop stored citations whose evidence is gone and
    move the rest to their document's current path. Opens the default stores when none are given. Returns the
    number of citations removed."""
    from app.memory import Store
    from app.retrieval.store import DocumentStore

    mem = memory_store or Store()
    docs = doc_store or DocumentStore()
    try:
        return mem.prune_citations(docs.resolve)
    finally:
        if memory_store is None:
            mem.close()
        if doc_store is None:
            docs.close()
