"""Split extracted text into chunks (evidence passages) that fit the embedding model.

Sizes are in tokens of the embedding model. With an embedding model loaded, tokens are counted by that model's
own tokenizer through llama.cpp (``Embedder.count_tokens``). Without one, ``ApproxTokenCounter`` estimates
WordPiece tokens; it is built to over-estimate English text (by ~10-40%), so chunks made with it still fit a
WordPiece model later.

Rules, in order:

1. Chunks never cross a page (PDF) and end on a paragraph boundary (a blank line) when they can: paragraphs
   that fit are packed whole, in order, until the next one would overflow ``max_tokens``.
2. A paragraph larger than ``max_tokens`` is split into lines, then sentences, then words, then halves (a
   20,000-character string with no whitespace ends as character windows), and its pieces are packed with an
   overlap of about ``overlap_tokens``: each chunk after the first repeats the trailing pieces of the previous
   one. Overlap only happens inside such a paragraph, since a paragraph boundary is a natural break.
3. Every chunk is counted once more as a whole, and split again if it is still over budget (sub-word effects
   when words were cut), so every chunk fits: ``token_count + special tokens <= max_tokens``.

Offsets are ``str`` indices in the page text; the caller adds the page's offset in the whole document.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Protocol

DEFAULT_MAX_TOKENS = 256  # per chunk, special tokens included; all-MiniLM-L6-v2 was trained on <= 256
DEFAULT_OVERLAP_TOKENS = 32
SPECIAL_TOKENS = 2  # [CLS] ... [SEP] that the embedder adds around each chunk


class TokenCounter(Protocol):
    """Counts tokens of texts, without the model's special tokens. ``name`` identifies the tokenizer."""

    name: str

    def count_tokens(self, texts: list[str]) -> list[int]: ...


_APPROX_WORD = re.compile(r"[^\W_]+|[^\w\s]|_", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


class ApproxTokenCounter:
    """A WordPiece-like estimate for when no embedding model is available.

    Like BERT's pre-tokenizer it splits on whitespace and makes every punctuation character a token; each CJK
    character counts as one token; a word counts ``ceil(len / 4)`` tokens (at least one), which over-estimates
    English WordPiece (most words are one token) and stays near it for rare words and numbers.
    """

    name = "approx-wordpiece"

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [self._count(t) for t in texts]

    @staticmethod
    def _count(text: str) -> int:
        n = len(_CJK.findall(text))
        for word in _APPROX_WORD.findall(_CJK.sub(" ", text)):
            n += max(1, math.ceil(len(word) / 4))
        return n


@dataclass(frozen=True)
class Chunk:
    """A passage of one page: ``text == page_text[start:end]``; ``token_count`` without special tokens."""

    text: str
    start: int
    end: int
    token_count: int


@dataclass(frozen=True)
class _Piece:
    start: int
    end: int
    tokens: int
    para: int  # index of the paragraph it came from
    whole: bool  # the whole paragraph (packed without overlap)


_PARA_BREAK = re.compile(r"\n[ \t]*\n\s*")
# Finer and finer splits of a span too large for one chunk.
_SPLITTERS = (
    re.compile(r"\n+"),  # lines (code, lists)
    re.compile(r"(?<=[.!?;:])\s+"),  # sentences
    re.compile(r"\s+"),  # words
)


def chunk_text(text: str, counter: TokenCounter, max_tokens: int = DEFAULT_MAX_TOKENS,
               overlap_tokens: int = DEFAULT_OVERLAP_TOKENS) -> list[Chunk]:
    """Chunks of one page of text (see the module docstring). ``max_tokens`` includes the special tokens."""
    budget = max_tokens - SPECIAL_TOKENS
    if budget < 8:
        raise ValueError(f"max_tokens must be >= {8 + SPECIAL_TOKENS}, got {max_tokens}")
    paragraphs = _spans(text, 0, len(text), _PARA_BREAK)
    pieces = _fit(text, paragraphs, counter, budget)
    chunks = _pack(text, pieces, budget, min(overlap_tokens, budget // 2))
    return _verify(text, chunks, counter, budget)


def _spans(text: str, start: int, end: int, sep: re.Pattern) -> list[tuple[int, int]]:
    """Non-blank spans of ``text[start:end]`` between matches of ``sep``, stripped of outer whitespace."""
    out, pos = [], start
    for m in sep.finditer(text, start, end):
        out.append((pos, m.start()))
        pos = m.end()
    out.append((pos, end))
    return [s for s in (_strip(text, a, b) for a, b in out) if s[1] > s[0]]


def _strip(text: str, a: int, b: int) -> tuple[int, int]:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b


def _fit(text: str, paragraphs: list[tuple[int, int]], counter: TokenCounter, budget: int) -> list[_Piece]:
    """Pieces no larger than ``budget`` tokens, in text order; paragraphs that fit stay whole."""
    counts = counter.count_tokens([text[a:b] for a, b in paragraphs])
    pieces: list[_Piece] = []
    for para, ((a, b), n) in enumerate(zip(paragraphs, counts)):
        if n <= budget:
            pieces.append(_Piece(a, b, n, para, True))
        else:
            pieces.extend(_Piece(s, e, k, para, False) for s, e, k in _split(text, a, b, counter, budget, 0))
    return pieces


def _split(text: str, a: int, b: int, counter: TokenCounter, budget: int,
           level: int) -> list[tuple[int, int, int]]:
    """Split ``text[a:b]`` (over budget) into spans that fit, trying each splitter from ``level`` on."""
    spans: list[tuple[int, int]] = []
    while level < len(_SPLITTERS) and len(spans) < 2:
        spans = _spans(text, a, b, _SPLITTERS[level])
        level += 1
    if len(spans) < 2:  # no separator left: cut in the middle
        mid = (a + b) // 2
        spans, level = [(a, mid), (mid, b)], len(_SPLITTERS)
    out: list[tuple[int, int, int]] = []
    for (s, e), n in zip(spans, counter.count_tokens([text[s:e] for s, e in spans])):
        if n <= budget or e - s <= 1:
            out.append((s, e, n))
        else:
            out.extend(_split(text, s, e, counter, budget, level))
    return out


def _pack(text: str, pieces: list[_Piece], budget: int, overlap: int) -> list[Chunk]:
    chunks: list[Chunk] = []
    current: list[_Piece] = []
    total = 0
    for piece in pieces:
        if current and total + piece.tokens > budget:
            chunks.append(_make(text, current, total))
            current = _overlap_tail(current, piece, overlap)
            total = sum(p.tokens for p in current)
            if total + piece.tokens > budget:  # the overlap itself does not leave room
                current, total = [], 0
        current.append(piece)
        total += piece.tokens
    if current:
        chunks.append(_make(text, current, total))
    return chunks


def _overlap_tail(previous: list[_Piece], nxt: _Piece, overlap: int) -> list[_Piece]:
    """Trailing pieces of the previous chunk to repeat: only within one split paragraph (``nxt`` continues
    the paragraph of the previous chunk's last piece) and at most ``overlap`` tokens."""
    last = previous[-1]
    if overlap <= 0 or nxt.whole or last.whole or last.para != nxt.para:
        return []
    tail: list[_Piece] = []
    used = 0
    for p in reversed(previous):
        if p.para != nxt.para or used + p.tokens > overlap:
            break
        tail.insert(0, p)
        used += p.tokens
    return tail


def _make(text: str, pieces: list[_Piece], tokens: int) -> Chunk:
    start, end = pieces[0].start, pieces[-1].end
    return Chunk(text[start:end], start, end, tokens)


def _verify(text: str, chunks: list[Chunk], counter: TokenCounter, budget: int) -> list[Chunk]:
    """Recount each chunk as a whole; split the ones still over budget (words cut in the middle can count more
    as a whole than as pieces)."""
    counts = counter.count_tokens([c.text for c in chunks])
    out: list[Chunk] = []
    for c, n in zip(chunks, counts):
        if n <= budget or c.end - c.start <= 1:
            out.append(Chunk(c.text, c.start, c.end, n))
            continue
        mid = _split_point(text, c.start, c.end)
        halves = [Chunk(text[c.start:mid], c.start, mid, 0), Chunk(text[mid:c.end], mid, c.end, 0)]
        out.extend(_verify(text, halves, counter, budget))
    return out


def _split_point(text: str, a: int, b: int) -> int:
    """A whitespace position near the middle of ``text[a:b]``, else the middle itself."""
    mid = (a + b) // 2
    for d in range((b - a) // 4):
        for pos in (mid - d, mid + d):
            if a < pos < b and text[pos].isspace():
                return pos
    return mid
