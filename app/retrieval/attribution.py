"""Sentence attribution: every claim of an answer that had evidence is tied to the passage that best supports
it (or to none) and its numbers, dates, times and units are checked against that passage, whether or not the
answer wrote ``[E:id]`` markers. It reuses the citation check's pieces (``app.retrieval.citecheck``: the
sentence splitter, ``facts``, ``missing_facts``, ``CitationChecker.similarities``).

The reasoning: docs/retrieval.md, "Attribution".
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.retrieval.citecheck import CitationChecker, Fact, claim_text, facts, missing_facts, sentence_spans, spans
from app.retrieval.query import FUNCTION_WORDS
from app.retrieval.types import Evidence

log = logging.getLogger(__name__)

# all-MiniLM-L6-v2 cosine with the passage's closest span: below it a sentence is about none of the passages.
# Lower than the citation check's bar (0.58): that one asks "does the passage say this", this one "is the
# sentence about this passage" (the facts check then asks whether it says it right). docs/retrieval.md.
ATTRIBUTION_THRESHOLD = 0.40
LEXICAL_THRESHOLD = 0.5  # without embeddings: the share of the sentence's content words found in the passage
SIM_TIE = 0.05  # passages this close in similarity are a tie: fewer missing facts, then word overlap, decide
LEX_TIE = 0.1  # the same without embeddings, in word-overlap share
MIN_CLAIM_WORDS = 4  # a sentence with no fact and fewer words makes no claim ("Sure!", "See above.")
MIN_CONTEXT_WORDS = 3  # fewer content words: too little to compare meaning ("At 9:35."), matched by facts
_WORDS = re.compile(r"[^\W\d_]+", re.UNICODE)
_NO_CLAIM = re.compile(r"^\W*(?:hi|hello|hey|thanks|thank you|you're welcome|sure|of course|certainly|great|"
                       r"i hope (?:this|that) helps|let me know|feel free|happy to help|glad to help)\b",
                       re.IGNORECASE)
_MONTHS = frozenset("jan feb mar apr may jun jul aug sep oct nov dec".split())


@dataclass(frozen=True)
class SentenceAttribution:
    """One claim sentence of an answer and the passage it is attributed to.

    ``sentence_start`` / ``sentence_end``: the sentence's str indices in the answer. ``evidence_id``, ``path``,
    ``page``: the passage (None: attributed to none). ``supported``: True when attributed and every fact of the
    sentence is in the passage; False when a fact is not (in the attributed passage, or, attributed to none,
    in any passage given); None when attributed to none and there is no fact to check. ``similarity``: cosine
    with the passage's closest span (None without embeddings); ``overlap``: share of the sentence's content
    words in the passage (0 … 1); ``missing``: the facts not found, as written; ``reason``: one sentence for a
    person ("9:35 is not in the passage; it says 9:15")."""

    sentence_start: int
    sentence_end: int
    evidence_id: str | None
    path: str | None
    page: int | None
    supported: bool | None
    similarity: float | None
    overlap: float
    missing: tuple[str, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The shape of ``hearth.attributions`` items and of the stored rows: the citation check's
        (``sentence_start``, ``sentence_end``, ``evidence_id``, ``path``, ``page``, ``supported``) with
        ``support``: ``{missing, similarity, threshold, overlap, reason}``."""
        threshold = ATTRIBUTION_THRESHOLD if self.similarity is not None else None
        return {"sentence_start": self.sentence_start, "sentence_end": self.sentence_end,
                "evidence_id": self.evidence_id, "path": self.path, "page": self.page, "supported": self.supported,
                "support": {"missing": list(self.missing), "similarity": self.similarity, "threshold": threshold,
                            "overlap": self.overlap, "reason": self.reason}}


def content_words(text: str) -> set[str]:
    """The content words of ``text`` (``query.FUNCTION_WORDS`` dropped), lower-cased and cut to 5 letters so
    that "leaves" meets "leaving"."""
    return {w.lower()[:5] for w in _WORDS.findall(text) if len(w) > 1 and w.lower() not in FUNCTION_WORDS}


def is_claim(sentence: str) -> bool:
    """False for a sentence that states nothing checkable: empty, a question, a greeting or sign-off ("Sure!",
    "I hope this helps."), or under ``MIN_CLAIM_WORDS`` words with no fact. A sentence with a fact (a number,
    date, time, unit, code) is a claim however short ("At 9:35.")."""
    text = claim_text(sentence).strip(" \t*_#>-")
    if not text or text.endswith("?"):
        return False
    if facts(text):
        return True
    words = _WORDS.findall(text)
    return len(words) >= MIN_CLAIM_WORDS and not (_NO_CLAIM.match(text) and len(words) < 8) and bool(
        content_words(text))


def subject_words(sentence: str) -> set[str]:
    """What ``sentence`` is about: its content words (``content_words``) other than those of its facts
    (a month or weekday name, a currency or unit word: "May", "dollars")."""
    text = claim_text(sentence)
    return content_words(text) - {w for f in facts(text) for w in content_words(f.text)}


def overlap(sentence: str, passage: str) -> float:
    """The share (0 … 1) of ``sentence``'s subject words (``subject_words``) found in ``passage`` (0 for a
    sentence with none)."""
    mine = subject_words(sentence)
    return len(mine & content_words(passage)) / len(mine) if mine else 0.0


def attribute(answer: str, passages: Sequence[Evidence],
              checker: CitationChecker | None = None) -> list[SentenceAttribution]:
    """A ``SentenceAttribution`` for each claim sentence of ``answer`` (``is_claim``; split with
    ``citecheck.sentence_spans``), in answer order; [] without passages. ``passages``: what the model was
    given. ``checker``: a ``CitationChecker`` with ``embed`` for similarity (one embedding call for the whole
    answer; when it fails, word overlap alone is used and a warning logged); None or no ``embed``: word
    overlap only. Raises nothing for odd text: an answer with no claim gives []."""
    if not passages:
        return []
    claims = [(a, b) for a, b in sentence_spans(answer) if is_claim(answer[a:b])]
    if not claims:
        return []
    sims = _similarities([answer[a:b] for a, b in claims], passages, checker)
    pool = "\n".join(p.text for p in passages)
    return [_attribute_one(answer[a:b], a, b, passages, sims[i] if sims is not None else None, pool)
            for i, (a, b) in enumerate(claims)]


def _similarities(sentences: list[str], passages: Sequence[Evidence],
                  checker: CitationChecker | None) -> list[list[float]] | None:
    """Sentence × passage cosines in one embedding call; None without embeddings or when the call fails."""
    if checker is None or checker.embed is None:
        return None
    pairs = [(s, p.text) for s in sentences for p in passages]
    try:
        flat = checker.similarities(pairs)
    except Exception:  # noqa: BLE001 - the embedding process failed: attribute by word overlap instead
        log.warning("attribution: embedding failed; attributing by word overlap", exc_info=True)
        return None
    n = len(passages)
    return [[x if math.isfinite(x) else -1.0 for x in flat[i * n:(i + 1) * n]] for i in range(len(sentences))]


@dataclass(frozen=True)
class _Candidate:
    index: int
    similarity: float | None
    overlap: float
    missing: tuple[str, ...]

    @property
    def score(self) -> float:
        return self.similarity if self.similarity is not None else self.overlap


def _attribute_one(sentence: str, a: int, b: int, passages: Sequence[Evidence], sims: list[float] | None,
                   pool: str) -> SentenceAttribution:
    cands = [_Candidate(j, sims[j] if sims is not None else None, overlap(sentence, p.text),
                        tuple(missing_facts(sentence, p.text))) for j, p in enumerate(passages)]
    best = _choose(sentence, cands, passages)
    if best is None:
        missing = tuple(missing_facts(sentence, pool))
        reason = (f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} in none of the passages given"
                  if missing else "about none of the passages given; nothing to check")
        return SentenceAttribution(a, b, None, None, None, False if missing else None, None, 0.0, missing, reason)
    p = passages[best.index]
    reason = explain(sentence, p.text, best.missing) if best.missing else _supported_reason(sentence, best)
    return SentenceAttribution(a, b, p.evidence_id, p.path, p.page, not best.missing, best.similarity,
                               round(best.overlap, 3), best.missing, reason)


def _choose(sentence: str, cands: list[_Candidate], passages: Sequence[Evidence]) -> _Candidate | None:
    """The passage that best supports the sentence. Its subject decides before its facts do (a wrong fact
    that another passage happens to hold must not move the sentence there): the most similar above the bar,
    within ``SIM_TIE`` / ``LEX_TIE`` of it the most subject overlap (within ``LEX_TIE``), then fewer missing
    facts. A sentence too short to compare by meaning (under ``MIN_CONTEXT_WORDS`` content words, with
    facts) goes to the passages sharing most of its subject words (fewer missing facts deciding among
    them); with none, to a passage holding all its facts, else to one holding a fact it could misstate
    (``_alternative``). A longer one below the bar goes to a passage holding all its facts. None: no
    passage."""
    has_facts = bool(facts(sentence))
    embedded = cands[0].similarity is not None
    bar, tie = (ATTRIBUTION_THRESHOLD, SIM_TIE) if embedded else (LEXICAL_THRESHOLD, LEX_TIE)
    if has_facts and len(content_words(claim_text(sentence))) < MIN_CONTEXT_WORDS:
        most = max(c.overlap for c in cands)
        near = [c for c in cands if most > 0 and c.overlap >= most - LEX_TIE]
        near = near or [c for c in cands if not c.missing] or [
            c for c in cands if _misstates(sentence, passages[c.index].text)]
        return min(near, key=lambda c: (len(c.missing), -c.overlap, c.index)) if near else None
    near = [c for c in cands if c.score >= bar] or [c for c in cands if has_facts and not c.missing]
    if not near:
        return None
    top = max(c.score for c in near)
    tied = [c for c in near if c.score >= top - tie]
    most = max(c.overlap for c in tied)
    tied = [c for c in tied if c.overlap >= most - LEX_TIE]
    return min(tied, key=lambda c: (len(c.missing), -c.overlap, -c.score, c.index))


def _supported_reason(sentence: str, best: _Candidate) -> str:
    """The reason of a supported attribution: the similarity against its bar; under the bar (a sentence too
    short to compare by meaning, or matched by its facts), the facts that carried it."""
    sim = best.similarity
    if sim is None:
        return "supported by the passage"
    if sim >= ATTRIBUTION_THRESHOLD:
        return f"supported by the passage (similarity {sim:.2f} ≥ {ATTRIBUTION_THRESHOLD:.2f})"
    found = [f.text for f in facts(sentence)]
    return (f"supported by its facts: {', '.join(found)} {'is' if len(found) == 1 else 'are'} in the passage "
            f"(similarity {sim:.2f}, under the {ATTRIBUTION_THRESHOLD:.2f} bar for meaning alone)")


def _misstates(sentence: str, passage: str) -> bool:
    """True when ``passage`` has a fact that one of ``sentence``'s facts could misstate (``_alternative``)."""
    mine = facts(sentence)
    theirs = facts(passage)
    stated = {f.value for f in mine}
    return any(_alternative(f, theirs, stated) is not None for f in mine)


def explain(sentence: str, passage: str, missing: Sequence[str]) -> str:
    """Why ``sentence`` is not supported by ``passage``, as a person reads it: for each of ``missing`` (facts
    as written in the sentence, ``missing_facts``), "<fact> is not in the passage; it says <the passage's
    fact of the same kind>" when the passage has one (the one in the passage sentence sharing most words
    with ``sentence``; a fact the sentence also states is not offered), else "<fact> is not in the passage";
    joined with "; "."""
    mine = {f.text: f for f in facts(sentence)}
    stated = {f.value for f in mine.values()}
    theirs = _passage_facts_by_span(sentence, passage)
    parts = []
    for text in missing:
        f = mine.get(text)
        alt = _alternative(f, theirs, stated) if f is not None else None
        parts.append(f"{text} is not in the passage" + (f"; it says {alt.text}" if alt is not None else ""))
    return "; ".join(parts)


def _passage_facts_by_span(sentence: str, passage: str) -> list[Fact]:
    """The facts of ``passage``, those of its sentences sharing most words with ``sentence`` first (passage
    order within equal overlap)."""
    words = content_words(claim_text(sentence))
    pieces = spans(passage, window=1)
    ranked = sorted(range(len(pieces)), key=lambda i: (-len(words & content_words(pieces[i])), i))
    return [f for i in ranked for f in facts(pieces[i])]


def _alternative(f: Fact, theirs: list[Fact], stated: set[str]) -> Fact | None:
    """The passage's fact that ``f`` most likely misstates: the same number with another unit or currency (a
    wrong unit), else one with the same digits written another way ("9.15" for "9:15"), else the first of
    the same kind (``_kind``) that the sentence does not state itself."""
    if f.kind == "number" and (f.unit or f.currency):
        same_value = [g for g in theirs if g.kind == "number" and g.value == f.value
                      and (g.unit, g.currency) != (f.unit, f.currency)]
        if same_value:
            return same_value[0]
    if f.kind in ("number", "compound"):
        same_digits = [g for g in theirs if g.kind in ("number", "compound") and g.value not in stated
                       and _digits(g.value) == _digits(f.value)]
        if same_digits:
            return same_digits[0]
    return next((g for g in theirs if _kind(g) == _kind(f) and g.value not in stated), None)


def _digits(value: str) -> str:
    """The digits of a fact's value, separators dropped: "9.15" and "9:15" both give "915"."""
    return re.sub(r"\D", "", value)


def _kind(f: Fact) -> tuple:
    """What makes two facts comparable: a time with a time (``9:15``), a date with a date of the same shape, a
    number with a number of the same unit, an amount of money with one in any currency, a month with a
    month, a weekday with a weekday."""
    if f.kind == "compound":
        return ("compound", re.sub(r"\d+", "9", f.value))
    if f.kind == "number":
        return ("money",) if f.currency else ("number", f.unit)
    if f.kind == "date":
        return ("date", f.value in _MONTHS)
    return (f.kind,)
