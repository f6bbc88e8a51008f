"""The keyword (BM25) side of a search: a question turned into an FTS5 query of its content words.

A question is mostly function words ("how do I get the ... of my ..."). FTS5 ``bm25()`` (Robertson &
Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009: idf·tf·(k1+1)/(tf+k1·(1−b+b·dl/avgdl)),
k1=1.2, b=0.75 in FTS5) gives common words a small but non-zero weight, and on a small collection words such
as "my" or "should" are rare enough to lift passages that merely share them. So the query keeps the content
words only:

The reasoning: docs/retrieval.md, 'app/retrieval/query.py'.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from app.errors import store_error

HEADING_WEIGHT = 0.5  # bm25() weight of the heading_path column, text = 1.0 (chosen on the benchmark's dev halves)
MAX_POSTINGS = 8000  # as ``app.retrieval.store.MAX_BM25_POSTINGS``: chunks scored before common words go

_WORD = re.compile(r"\w+", re.UNICODE)
# A run of word characters joined by - . / _ that holds a digit or an inner capital: an identifier or code.
_CODE = re.compile(r"\b\w+(?:[-./]\w+)+\b|\b(?=\w*\d)(?=\w*[A-Za-z])\w+\b")

FUNCTION_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing done down during each few for from further get gets getting got had has
have having he her here hers him his how i if in into is it its itself just let me might more most much must
my myself no nor not now of off on once only or other our ours out over own please same shall she should so
some such than that the their them then there these they this those through to too under until up us use used
using very want was way we were what when where whether which while who whom whose why will with would you
your yours yourself anything something someone thing things tell know need
""".split())


@dataclass(frozen=True)
class KeywordQuery:
    """A question as keyword terms. ``words``: content words, lower-cased, unique, in order; ``phrases``:
    codes kept whole (each a tuple of its lower-cased parts). ``match()`` is the FTS5 expression."""

    words: tuple[str, ...]
    phrases: tuple[tuple[str, ...], ...] = ()

    @property
    def terms(self) -> list[str]:
        """Each term as an FTS5 string literal: phrases first (their parts adjacent), then words."""
        return [_quote(" ".join(p)) for p in self.phrases] + [_quote(w) for w in self.words]

    def match(self) -> str:
        """The FTS5 MATCH expression (terms OR-ed); "" when the question has no word at all."""
        return " OR ".join(self.terms)


def keyword_query(question: str) -> KeywordQuery:
    """``question`` (free text, any length) as a ``KeywordQuery``: content words (``FUNCTION_WORDS`` dropped
    unless nothing else remains) and codes as phrases."""
    words = [w.lower() for w in _WORD.findall(question)]
    kept = [w for w in words if w not in FUNCTION_WORDS] or words
    phrases = []
    for m in _CODE.finditer(question):
        parts = tuple(w.lower() for w in _WORD.findall(m.group(0)))
        if len(parts) > 1 and parts not in phrases:
            phrases.append(parts)
    return KeywordQuery(tuple(dict.fromkeys(kept)), tuple(phrases))


def _quote(term: str) -> str:
    """An FTS5 string literal: double quotes around, a double quote inside doubled."""
    return '"' + term.replace('"', '""') + '"'


def bm25_ranking(store, question: str, limit: int, max_postings: int = MAX_POSTINGS,
                 heading_weight: float = HEADING_WEIGHT) -> list[tuple[int, float]]:
    """``(chunk id, -bm25 score)`` best first (larger is better) for ``question`` over ``store``'s
    ``chunks_fts`` (a ``DocumentStore``; read through its ``db.conn``), the heading path weighted
    ``heading_weight`` against the text's 1.0. ``limit``: results (>= 1). Raises ``StoreError`` on a
    database error. [] when the question has no words."""
    q = keyword_query(question)
    terms = q.terms
    if not terms:
        return []
    if len(terms) > 1 and max_postings:
        terms = _prune_common(store, terms, max_postings)
    w = float(heading_weight)
    rows = _rows(store, f"SELECT rowid, -bm25(chunks_fts, 1.0, {w!r}) FROM chunks_fts WHERE chunks_fts MATCH ? "
                        f"ORDER BY bm25(chunks_fts, 1.0, {w!r}) LIMIT ?", [" OR ".join(terms), limit])
    return [(int(r[0]), float(r[1])) for r in rows]


def _prune_common(store, terms: list[str], max_postings: int) -> list[str]:
    """Drop the terms with the longest posting lists (lowest IDF) until the rest match at most
    ``max_postings`` chunks together (at least one kept): bounds latency on big collections, a no-op on
    small ones."""
    counts = {t: _rows(store, "SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH ?", [t])[0][0]
              for t in terms}
    if sum(counts.values()) <= max_postings:
        return terms
    kept, total = [], 0
    for t in sorted(terms, key=lambda t: counts[t]):
        if kept and total + counts[t] > max_postings:
            break
        kept.append(t)
        total += counts[t]
    return [t for t in terms if t in kept]


def _rows(store, sql: str, params: list) -> list[tuple]:
    try:
        return store.db.conn.execute(sql, params).fetchall()
    except sqlite3.DatabaseError as exc:
        raise store_error(exc, store.path, "documents database") from exc
