"""Split extracted text into chunks (evidence passages) that fit the embedding model.

Sizes are in tokens of the embedding model. With an embedding model loaded, tokens are counted by that model's
own tokenizer through llama.cpp (``Embedder.count_tokens``). Without one, ``ApproxTokenCounter`` estimates
WordPiece tokens; it is built to over-estimate English text (by ~10-40%), so chunks made with it still fit a
WordPiece model later.

The reasoning: docs/retrieval.md, 'app/retrieval/chunking.py'.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence
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
    """A passage: ``text == source[start:end]`` (``source`` being the text given to ``chunk_text`` /
    ``chunk_document``); ``token_count`` without special tokens; ``heading_path``: titles of the headings
    that enclose it, outermost first (empty when the text has none, and always from ``chunk_text``)."""

    text: str
    start: int
    end: int
    token_count: int
    heading_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Heading:
    """A heading in a document's text: ``text[start:end]`` is the whole heading line (or block), ``level``
    1 (outermost) to 6+, ``title`` the heading's words for display (markup stripped)."""

    start: int
    end: int
    level: int
    title: str


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


_PROSE_SPLITTERS = (_SPLITTERS[1], _SPLITTERS[0], _SPLITTERS[2])  # PDF: sentences before layout lines


def chunk_text(text: str, counter: TokenCounter, max_tokens: int = DEFAULT_MAX_TOKENS,
               overlap_tokens: int = DEFAULT_OVERLAP_TOKENS) -> list[Chunk]:
    """Chunks of one page of text (see the module docstring). ``max_tokens`` includes the special tokens.
    Raises ``ValueError`` when ``max_tokens`` < 10."""
    return _chunk_span(text, 0, len(text), counter, _budget(max_tokens), overlap_tokens, "text", ())


def _budget(max_tokens: int) -> int:
    budget = max_tokens - SPECIAL_TOKENS
    if budget < 8:
        raise ValueError(f"max_tokens must be >= {8 + SPECIAL_TOKENS}, got {max_tokens}")
    return budget


def _chunk_span(text: str, a: int, b: int, counter: TokenCounter, budget: int, overlap_tokens: int, fmt: str,
                path: tuple[str, ...]) -> list[Chunk]:
    paragraphs = pdf_paragraphs(text, a, b) if fmt == "pdf" else _spans(text, a, b, _PARA_BREAK)
    splitters = _PROSE_SPLITTERS if fmt == "pdf" else _SPLITTERS
    pieces = _fit(text, paragraphs, counter, budget, splitters)
    chunks = _pack(text, pieces, budget, min(overlap_tokens, budget // 2))
    out = _verify(text, chunks, counter, budget)
    return [Chunk(c.text, c.start, c.end, c.token_count, path) for c in out] if path else out


def chunk_document(text: str, counter: TokenCounter, max_tokens: int = DEFAULT_MAX_TOKENS,
                   overlap_tokens: int = DEFAULT_OVERLAP_TOKENS, *, headings: Sequence[Heading] = (),
                   breaks: Sequence[int] = (), fmt: str = "text") -> list[Chunk]:
    """Chunks of a whole document by structure (see the module docstring): cut at ``headings`` (spans of
    ``text``, any order) and at ``breaks`` (offsets no chunk may cross, e.g. page starts), then chunked like
    ``chunk_text`` inside each section. ``fmt``: ``"pdf"`` for PDF paragraph and sentence rules, else
    anything. Offsets are into ``text``. Raises ``ValueError`` when ``max_tokens`` < 10."""
    budget = _budget(max_tokens)
    out: list[Chunk] = []
    for a, b, path in sections(text, headings, breaks):
        out.extend(_chunk_span(text, a, b, counter, budget, overlap_tokens, fmt, path))
    return out


def sections(text: str, headings: Sequence[Heading] = (), breaks: Sequence[int] = ()
             ) -> list[tuple[int, int, tuple[str, ...]]]:
    """``(start, end, heading_path)`` spans covering ``text`` in order, cut at each heading's start and at each
    break; a section that holds only its heading is merged into the next one (their path is the next one's)."""
    hs = sorted((h for h in headings if 0 <= h.start < h.end <= len(text)), key=lambda h: h.start)
    cuts = sorted({0, len(text), *(h.start for h in hs), *(x for x in breaks if 0 < x < len(text))})
    hard = set(breaks)
    by_start = {h.start: h for h in hs}
    stack: list[Heading] = []
    out: list[tuple[int, int, tuple[str, ...]]] = []
    start = 0
    for a, b in zip(cuts, cuts[1:]):
        h = by_start.get(a)
        if h is not None:
            while stack and stack[-1].level >= h.level:
                stack.pop()
            stack.append(h)
        only_heading = h is not None and not text[h.end:b].strip()
        if only_heading and b not in hard and b != len(text):
            continue  # a bare heading: keep it with what follows
        out.append((start, b, tuple(x.title for x in stack)))
        start = b
    return [s for s in out if text[s[0]:s[1]].strip()]


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


def _fit(text: str, paragraphs: list[tuple[int, int]], counter: TokenCounter, budget: int,
         splitters: tuple[re.Pattern, ...] = _SPLITTERS) -> list[_Piece]:
    """Pieces no larger than ``budget`` tokens, in text order; paragraphs that fit stay whole."""
    counts = counter.count_tokens([text[a:b] for a, b in paragraphs])
    pieces: list[_Piece] = []
    for para, ((a, b), n) in enumerate(zip(paragraphs, counts)):
        if n <= budget:
            pieces.append(_Piece(a, b, n, para, True))
        else:
            pieces.extend(_Piece(s, e, k, para, False)
                          for s, e, k in _split(text, a, b, counter, budget, 0, splitters))
    return pieces


def _split(text: str, a: int, b: int, counter: TokenCounter, budget: int, level: int,
           splitters: tuple[re.Pattern, ...] = _SPLITTERS) -> list[tuple[int, int, int]]:
    """Split ``text[a:b]`` (over budget) into spans that fit, trying each splitter from ``level`` on."""
    spans: list[tuple[int, int]] = []
    while level < len(splitters) and len(spans) < 2:
        spans = _spans(text, a, b, splitters[level])
        level += 1
    if len(spans) < 2:  # no separator left: cut in the middle
        mid = (a + b) // 2
        spans, level = [(a, mid), (mid, b)], len(splitters)
    out: list[tuple[int, int, int]] = []
    for (s, e), n in zip(spans, counter.count_tokens([text[s:e] for s, e in spans])):
        if n <= budget or e - s <= 1:
            out.append((s, e, n))
        else:
            out.extend(_split(text, s, e, counter, budget, level, splitters))
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


# ----------------------------------------------------------------------------------------------- structure

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd"})
RST_SUFFIXES = frozenset({".rst"})
CODE_SUFFIXES = frozenset(
    ".py .pyi .pyx .js .mjs .ts .tsx .jsx .c .h .cc .cpp .cxx .hpp .hh .java .kt .kts .scala .go .rs .rb .php "
    ".swift .cs .dart .lua .jl .r .m .mm .ex .exs .zig .nim .vue .svelte".split())

_LINE = re.compile(r"[^\n]*\n?")
_ATX = re.compile(r" {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*$")
_RST_ADORN = re.compile(r"([=\-~^\"'`#*+_:.])\1{2,}[ \t]*$")


SIGNATURE_LEVEL = 7  # below <h6>: a signature section nests in the document's headings
_SIGNATURE = re.compile(r"[ \t]*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\((?:[^()]|\([^()]*\))*\)[ \t]*(?:->[^\n]*)?$")


def _signature(text: str, lines: list[tuple[int, int]], i: int) -> Heading | None:
    """Line ``i`` as a signature heading: it opens a paragraph (first line or after a blank one), is at most
    200 characters of ``name(...)`` and the next line holds its description."""
    a, b = lines[i]
    if b - a > 200 or i + 1 >= len(lines) or not text[lines[i + 1][0]:lines[i + 1][1]].strip():
        return None
    if i > 0 and text[lines[i - 1][0]:lines[i - 1][1]].strip():
        return None
    m = _SIGNATURE.match(text, a, b)
    return Heading(a, b, SIGNATURE_LEVEL, m.group(1)) if m else None


def _text_headings(text: str) -> list[Heading]:
    lines = _lines(text)
    return [h for i in range(len(lines)) if (h := _signature(text, lines, i)) is not None]


def format_of(suffix: str) -> str:
    """The structure rules for a file suffix: ``markdown``, ``rst``, ``python``, ``code`` or ``text``."""
    suffix = suffix.lower()
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix in RST_SUFFIXES:
        return "rst"
    if suffix in (".py", ".pyi", ".pyx"):
        return "python"
    if suffix in CODE_SUFFIXES:
        return "code"
    return "text"


def find_headings(text: str, fmt: str) -> list[Heading]:
    """Headings of ``text`` under the rules of ``fmt`` (``format_of``; ``pdf`` for one PDF page's text), as
    spans of ``text``; for plain text only signature lines."""
    finder = {"markdown": _markdown_headings, "rst": _rst_headings, "python": _python_headings,
              "code": _code_headings, "pdf": _pdf_headings, "text": _text_headings}.get(fmt)
    return finder(text) if finder else []


def _lines(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each line, the newline excluded."""
    out, pos = [], 0
    for line in text.split("\n"):
        out.append((pos, pos + len(line)))
        pos += len(line) + 1
    return out


def _markdown_headings(text: str) -> list[Heading]:
    out: list[Heading] = []
    lines = _lines(text)
    fence: str | None = None
    for i, (a, b) in enumerate(lines):
        line = text[a:b]
        m = _FENCE.match(line)
        if m:
            mark = m.group(1)[0]
            fence = None if fence == mark else (fence or mark)
            continue
        if fence:
            continue
        m = _ATX.match(line)
        if m:
            out.append(Heading(a, b, len(m.group(1)), m.group(2).strip()))
            continue
        sig = _signature(text, lines, i)
        if sig is not None:
            out.append(sig)
            continue
        if i + 1 < len(lines) and line.strip() and (i == 0 or not text[lines[i - 1][0]:lines[i - 1][1]].strip()):
            nxt = text[lines[i + 1][0]:lines[i + 1][1]]
            m = _SETEXT.match(nxt)
            if m and not line.lstrip().startswith(("-", "*", "+", ">", "|")):
                out.append(Heading(a, lines[i + 1][1], 1 if m.group(1)[0] == "=" else 2, line.strip()))
    return out


def _rst_headings(text: str) -> list[Heading]:
    out: list[Heading] = []
    levels: list[tuple[str, bool]] = []  # (character, overlined) in order of first use
    lines = _lines(text)
    i = 0
    while i + 1 < len(lines):
        (a, b), (c, d) = lines[i], lines[i + 1]
        line, nxt = text[a:b], text[c:d]
        over = bool(_RST_ADORN.match(line)) and i + 2 < len(lines) and \
            bool(_RST_ADORN.match(text[lines[i + 2][0]:lines[i + 2][1]]))
        if over and nxt.strip():
            style, title, end, step = (line.strip()[0], True), nxt.strip(), lines[i + 2][1], 3
        elif line.strip() and not line[0].isspace() and _RST_ADORN.match(nxt) and len(nxt.rstrip()) >= len(
                line.rstrip()) and not _RST_ADORN.match(line):
            style, title, end, step = (nxt.strip()[0], False), line.strip(), d, 2
        else:
            i += 1
            continue
        if style not in levels:
            levels.append(style)
        out.append(Heading(a, end, levels.index(style) + 1, title))
        i += step
    return out


_PY_DEF = re.compile(r"([ \t]*)(?:async[ \t]+)?(def|class)[ \t]+(\w+)")


def _python_headings(text: str) -> list[Heading]:
    """Each ``def``/``class`` (decorators above it included) is a section; nesting by indentation."""
    out: list[Heading] = []
    indents: list[int] = []
    lines = _lines(text)
    for i, (a, b) in enumerate(lines):
        m = _PY_DEF.match(text, a, b)
        if not m:
            continue
        indent = len(m.group(1).expandtabs(4))
        while indents and indents[-1] >= indent:
            indents.pop()
        indents.append(indent)
        start = a
        j = i - 1
        while j >= 0 and text[lines[j][0]:lines[j][1]].lstrip().startswith("@"):
            start = lines[j][0]
            j -= 1
        out.append(Heading(start, b, len(indents), m.group(3)))
    return out


_CODE_DEF = re.compile(
    r"(?:export[ \t]+)?(?:default[ \t]+)?(?:pub(?:\([\w:]+\))?[ \t]+)?(?:public[ \t]+|private[ \t]+|protected[ \t]+"
    r"|static[ \t]+|abstract[ \t]+|final[ \t]+|async[ \t]+|unsafe[ \t]+)*"
    r"(?:function\*?|class|interface|struct|enum|trait|impl|fn|func|def|defmodule|defp?|module|object|type"
    r"|namespace)[ \t]+(?:\([^)]*\)[ \t]*)?([A-Za-z_$][\w$]*)")


def _code_headings(text: str) -> list[Heading]:
    """Definitions that start a line with no indentation (top level) or one level in (methods)."""
    out: list[Heading] = []
    for a, b in _lines(text):
        line = text[a:b]
        indent = len(line) - len(line.lstrip())
        if indent > 4:
            continue
        m = _CODE_DEF.match(line, indent)
        if m:
            out.append(Heading(a, b, 1 if indent == 0 else 2, m.group(1)))
    return out


_PDF_NUMBERED = re.compile(r"((?:\d{1,2}\.){0,4}\d{1,2})\.?[ \t]+([A-Z][^\n]*)$")
_SENTENCE_END = ".!?:;\"'\u201d)"


def _pdf_headings(text: str) -> list[Heading]:
    out: list[Heading] = []
    for a, b in _lines(text):
        line = text[a:b].strip()
        if not 2 < len(line) <= 80 or line[-1] in _SENTENCE_END + ",":
            continue
        m = _PDF_NUMBERED.match(line)
        if m and len(m.group(2).split()) <= 10:
            out.append(Heading(a, b, m.group(1).count(".") + 1, line))
        elif line.isupper() and 1 <= len(line.split()) <= 8 and sum(c.isalpha() for c in line) >= 4:
            out.append(Heading(a, b, 1, line))
    return out


def pdf_paragraphs(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """Paragraph spans of a PDF page's text between ``a`` and ``b``: a blank line ends one, and so does a line
    that ends a sentence while being clearly shorter (< 3/4) than the page's long lines (a paragraph's last
    line)."""
    lines = [(x + a, y + a) for x, y in _lines(text[a:b])]
    lengths = sorted(y - x for x, y in lines if y > x)
    if not lengths:
        return []
    full = lengths[min(len(lengths) - 1, int(len(lengths) * 0.9))]
    out: list[tuple[int, int]] = []
    start = None
    for x, y in lines:
        line = text[x:y].rstrip()
        if not line.strip():
            if start is not None:
                out.append((start, x))
                start = None
            continue
        if start is None:
            start = x
        if line[-1] in _SENTENCE_END and len(line) < 0.75 * full:
            out.append((start, y))
            start = None
    if start is not None:
        out.append((start, lines[-1][1]))
    return [s for s in (_strip(text, p, q) for p, q in out) if s[1] > s[0]]


def page_of(offset: int, page_starts: Sequence[int]) -> int:
    """1-based page number of a document offset, given the sorted start offsets of its pages."""
    return bisect.bisect_right(page_starts, offset)


# ------------------------------------------------------------------------------------------------ leads

LEAD_RECIPE = "lead1"  # names how ``lead_text`` builds a lead; stored with each lead vector (store.m009)
LEAD_MAX_CHARS = 300
# A chunk of at most this many tokens gets no lead: it is hardly longer than its lead would be (measured on the
# benchmark sets: the same rankings with and without their leads; a third of the stdlib set's chunks).
LEAD_MIN_TOKENS = 32
_LEAD_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")


def has_lead(token_count: int) -> bool:
    """Whether a chunk of ``token_count`` tokens (special tokens excluded) gets a lead vector."""
    return token_count > LEAD_MIN_TOKENS


def lead_text(text: str, heading_path: Sequence[str] = ()) -> str:
    """A chunk's *lead*: its heading path (outermost first, joined by " > ") and its first sentence, e.g.
    ``"shutil > shutil.which: Given a command, mode, and a PATH string, return the path which conforms to the
    given mode on the PATH, or None if there is no such file."``. A first line that is only a call signature
    (a signature section's own heading) is skipped; the sentence is cut at ``LEAD_MAX_CHARS`` characters.

    The lead gets a vector of its own besides the chunk's (docs/retrieval.md, "Search"): all-MiniLM-L6-v2
    mean-pools over every token, so a chunk whose first line says what it is about and whose rest is detail
    (parameters, examples, caveats) gets a vector closer to the detail than to that line. Change the recipe
    only with a new ``LEAD_RECIPE``: stored leads of another recipe are then ignored and embedded again."""
    body = text.strip()
    first, _, rest = body.partition("\n")
    if rest.strip() and _SIGNATURE.match(first) and len(first) <= 200:
        body = rest.strip()
    sentence = _LEAD_SENTENCE_END.split(body, maxsplit=1)[0][:LEAD_MAX_CHARS]
    title = " > ".join(heading_path)
    return f"{title}: {sentence}" if title else sentence
