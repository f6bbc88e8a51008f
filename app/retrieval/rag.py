"""Evidence in the prompt, citations out of the answer: pure functions, no model, no store.

``format_evidence_block(evidence)`` renders retrieved passages as a prompt block that asks the model to cite
evidence IDs as ``[E:<id>]``. The context builder places it after the stable part of the prompt (system prompt,
summaries, history), right before the user's message, so the token prefix of the stable part (and so the prefix
cache) is the same on the next turn.

The reasoning: docs/retrieval.md, 'app/retrieval/rag.py'.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import PurePath
from typing import Any

from app.retrieval.types import Evidence

_MARKER = re.compile(r"\[\s*E\s*:\s*([0-9a-f]{4,64}(?:\s*[,;]\s*(?:E\s*:\s*)?[0-9a-f]{4,64})*)\s*\]",
                     re.IGNORECASE)
_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{4,64}(?![0-9a-f])", re.IGNORECASE)
_QUOTE = re.compile(r"[\"“”«»„]([^\"“”«»„]{8,})[\"“”«»„]")
_SENTENCE_END = re.compile(r"[.!?](?=\s)|\n")
MIN_PREFIX = 8

INSTRUCTIONS = (
    "Answer from the evidence below. After each statement that uses a passage, cite it by its ID in square "
    "brackets, exactly as written, e.g. [E:{example}]. Quote the exact words you rely on in double quotes. "
    "If the evidence does not contain the answer, say so; do not cite passages you did not use."
)


def evidence_header(evidence: Iterable[Evidence]) -> str:
    """The instructions that go before the passages (one header for the whole block): answer from the
    evidence, cite ``[E:<id>]`` (the example is the first passage's ID), quote the words relied on."""
    items = list(evidence)
    example = items[0].evidence_id if items else "0123456789ab"
    return INSTRUCTIONS.format(example=example) + "\n\nEvidence:"


def format_passage(e: Evidence) -> str:
    """One passage as the model sees it: ``[E:<id>] <file name> (page N)``, then its text verbatim. The file
    name, not the whole path: the ID already names the passage exactly (citations map it back to the path,
    page and offsets), and a folder path costs 10-30 tokens a passage that tell the model nothing."""
    where = PurePath(e.path).name + (f" (page {e.page})" if e.page is not None else "")
    return f"[E:{e.evidence_id}] {where}\n{e.text.strip()}"


def format_evidence_block(evidence: Iterable[Evidence], max_chars: int | None = None) -> str:
    """A prompt block: ``evidence_header``, then each passage (``format_passage``), best first.

    ``max_chars``: stop adding passages once the block would exceed this many characters (a coarse guard for
    callers without a tokenizer; chat turns are trimmed in tokens by ``app.memory.context.ContextBuilder``)."""
    items = list(evidence)
    head = evidence_header(items)
    entries: list[str] = []
    size = len(head)
    for e in items:
        entry = format_passage(e)
        if max_chars is not None and entries and size + len(entry) + 2 > max_chars:
            break
        entries.append(entry)
        size += len(entry) + 2
    return head + "\n\n" + "\n\n".join(entries) + "\n"


@dataclass(frozen=True)
class Citation:
    """One cited passage. ``quote``: the cited span's text; ``char_start``/``char_end``: its offsets in the
    document's extracted text; ``marker_start``/``marker_end``: where the ``[E:...]`` marker is in the
    answer (str indices); ``quoted``: True when ``quote`` is a quotation found in the answer, False when it
    is the whole passage."""

    evidence_id: str
    path: str
    page: int | None
    quote: str
    char_start: int
    char_end: int
    marker_start: int
    marker_end: int
    quoted: bool
    sentence_start: int = 0
    sentence_end: int = 0
    supported: bool | None = None
    support: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cited_ids(answer: str) -> list[str]:
    """Every ID written in an ``[E:...]`` marker, lower-cased, in order of first appearance."""
    out: list[str] = []
    for m in _MARKER.finditer(answer):
        for raw in _ID.findall(m.group(1)):
            if raw.lower() not in out:
                out.append(raw.lower())
    return out


def parse_citations(answer: str, evidence: Iterable[Evidence] | Mapping[str, Evidence]) -> list[Citation]:
    """Citations of ``answer`` that resolve to the given evidence, in answer order, one per (marker, ID)."""
    pool = list(evidence.values()) if isinstance(evidence, Mapping) else list(evidence)
    out: list[Citation] = []
    for m in _MARKER.finditer(answer):
        start, end = _claim_span(answer, m)
        for raw in _ID.findall(m.group(1)):
            ev = _lookup(raw.lower(), pool)
            if ev is not None:
                c = _citation(ev, answer[start:end], m.start(), m.end())
                out.append(replace(c, sentence_start=start, sentence_end=end))
    return out


def _claim_span(answer: str, m: re.Match) -> tuple[int, int]:
    """The span of the sentence marker ``m`` cites (str indices, markers excluded): the sentence before it,
    ending before the first of a run of markers ("claim [E:a] [E:b]"); when nothing is before it (a marker
    that opens its sentence, "[E:a] The jug holds 1.7 litres."), the sentence after it."""
    start = _sentence_start(answer, m.start())
    end = m.start()
    while True:
        head = answer[start:end].rstrip()
        prev = next((p for p in _MARKER.finditer(answer, start, start + len(head))
                     if p.end() == start + len(head)), None)
        if prev is None:
            break
        end = prev.start()
    if answer[start:end].strip():
        return start, end
    after = m.end()
    nxt = _MARKER.search(answer, after)
    while nxt is not None and not answer[after:nxt.start()].strip():  # "[E:a] [E:b] The claim."
        after = nxt.end()
        nxt = _MARKER.search(answer, after)
    while after < len(answer) and answer[after] in " \t\n":
        after += 1
    stop = _SENTENCE_END.search(answer, after)
    end = stop.end() if stop is not None and answer[stop.start()] != "\n" else (stop.start() if stop else len(answer))
    if nxt is not None:
        end = min(end, nxt.start())
    return (after, end) if answer[after:end].strip() else (start, start)


def check_citations(answer: str, citations: Sequence[Citation], evidence: Iterable[Evidence],
                    checker: Any = None) -> list[Citation]:
    """``citations`` (of ``answer``, from ``parse_citations``) with ``supported`` and ``support`` set: each
    citing sentence checked against its cited passage's full text by ``checker`` (an
    ``app.retrieval.citecheck.CitationChecker``; None: one without embeddings, facts only). One embedding
    call for the whole answer. A marker with no sentence next to it (a bare ``[E:id]``) is not supported:
    it claims nothing that could be checked."""
    from app.retrieval.citecheck import CitationChecker

    checker = checker or CitationChecker(None)
    texts = {e.evidence_id: e.text for e in evidence}
    from app.retrieval.citecheck import SupportCheck

    pairs = [(answer[c.sentence_start:c.sentence_end], texts.get(c.evidence_id, c.quote)) for c in citations]
    claims = [i for i, (sentence, _p) in enumerate(pairs) if _MARKER.sub("", sentence).strip()]
    verdicts: list = [SupportCheck(False, (), None, None, "no sentence next to the marker to check")] * len(pairs)
    for i, v in zip(claims, checker.check_many([pairs[i] for i in claims]) if claims else ()):
        verdicts[i] = v
    return [replace(c, supported=v.supported, support=v.to_dict()) for c, v in zip(citations, verdicts)]


def _lookup(ident: str, pool: list[Evidence]) -> Evidence | None:
    exact = [e for e in pool if e.evidence_id.lower() == ident]
    if exact:
        return exact[0]
    if len(ident) >= MIN_PREFIX:
        matches = [e for e in pool if e.evidence_id.lower().startswith(ident)]
        if len(matches) == 1:
            return matches[0]
    return None


def _sentence_start(answer: str, pos: int) -> int:
    """Where the sentence a marker at ``pos`` belongs to starts: back to the previous sentence end or marker
    (a marker may stand just before or just after its sentence's final punctuation); leading spaces
    skipped."""
    head = answer[:pos].rstrip(" \t.!?")
    cut = max((m.end() for m in _SENTENCE_END.finditer(head)), default=0)
    prev_marker = max((m.end() for m in _MARKER.finditer(head)), default=0)
    start = max(cut, prev_marker)
    while start < pos and answer[start] in " \t\n.!?":
        start += 1
    if start == pos and prev_marker and prev_marker > cut:  # "claim [E:a] [E:b]": b cites the same claim
        before = max(m.start() for m in _MARKER.finditer(head) if m.end() == prev_marker)
        return _sentence_start(answer, before)
    return start


def _citation(ev: Evidence, sentence: str, m_start: int, m_end: int) -> Citation:
    for q in _QUOTE.findall(sentence):
        idx = _find_loose(ev.text, q.strip())
        if idx is not None:
            a, b = idx
            return Citation(ev.evidence_id, ev.path, ev.page, ev.text[a:b], ev.char_start + a, ev.char_start + b,
                            m_start, m_end, True)
    return Citation(ev.evidence_id, ev.path, ev.page, ev.text, ev.char_start, ev.char_end, m_start, m_end, False)


def _find_loose(text: str, quote: str) -> tuple[int, int] | None:
    """Span of ``quote`` in ``text``, ignoring case and differences in whitespace; None when absent."""
    words = quote.split()
    if not words:
        return None
    pattern = r"\s+".join(re.escape(w) for w in words)
    m = re.search(pattern, text, flags=re.IGNORECASE)
    return (m.start(), m.end()) if m else None
