"""Markdown helpers for the chat view (pure, no Qt).

Qt renders Markdown itself (``QTextDocument.setMarkdown``, CommonMark + GitHub tables); what it lacks is
syntax highlighting and a "copy" button per code block. ``highlight_spans`` colours a block's code with
Pygments (the style is the theme's, ``app.ui.theme.code_colors``); the view paints the spans onto the block
Qt made (it keeps the fence's language as ``QTextFormat.BlockCodeLanguage``). ``with_copy_links`` appends a
link ``hearth-copy:N`` after each *closed* fenced code block and returns the blocks' code, so the view copies
block N, exactly as written, when the link is clicked. An unclosed fence (an answer still streaming) gets no
link until it closes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COPY_SCHEME = "hearth-copy"
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")


def code_blocks(md: str) -> list[tuple[int, int, str]]:
    """Closed fenced code blocks as ``(first line index, closing line index, code)``."""
    lines = md.split("\n")
    blocks: list[tuple[int, int, str]] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or (m.group("fence")[0] == "`" and "`" in m.group("info")):
            i += 1
            continue
        fence = m.group("fence")
        for j in range(i + 1, len(lines)):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and set(close) == {fence[0]}:
                blocks.append((i, j, "\n".join(lines[i + 1:j])))
                i = j
                break
        else:
            return blocks  # unclosed: still streaming
        i += 1
    return blocks


def with_copy_links(md: str) -> tuple[str, list[str]]:
    """``md`` with a "Copy code" link after each closed code block, and the blocks' code in order."""
    blocks = code_blocks(md)
    if not blocks:
        return md, []
    lines = md.split("\n")
    for n, (_, end, _) in reversed(list(enumerate(blocks))):
        lines.insert(end + 1, f"\n[⧉ Copy code]({COPY_SCHEME}:{n})\n")
    return "\n".join(lines), [code for _, _, code in blocks]


def copy_index(url: str) -> int | None:
    """The block number of a copy link (``hearth-copy:3`` → 3), else None."""
    if not url.startswith(COPY_SCHEME + ":"):
        return None
    try:
        return int(url.split(":", 1)[1])
    except ValueError:
        return None


@dataclass(frozen=True)
class Span:
    """A run of highlighted code: ``start``/``length`` in characters of the code, its colour (``#rrggbb`` or
    None: the text colour), bold and italic."""

    start: int
    length: int
    color: str | None
    bold: bool = False
    italic: bool = False


def highlight_spans(code: str, language: str | None, style: str) -> list[Span]:
    """Pygments' colouring of ``code`` in ``language`` (a fence's info word: ``python``, ``js``...) with the
    Pygments style ``style``, as spans over ``code``. No language, an unknown one, or no Pygments: ``[]`` (the
    code is shown plain; guessing a lexer costs milliseconds per block and guesses wrong on short snippets)."""
    lexer = _lexer(language)
    if lexer is None or not code:
        return []
    from pygments.styles import get_style_by_name
    from pygments.util import ClassNotFound

    try:
        st = get_style_by_name(style)
    except ClassNotFound:
        return []
    spans: list[Span] = []
    pos = 0
    for ttype, value in lexer.get_tokens(code):
        d = st.style_for_token(ttype)
        if value and (d["color"] or d["bold"] or d["italic"]):
            spans.append(Span(pos, len(value), f"#{d['color']}" if d["color"] else None, bool(d["bold"]),
                              bool(d["italic"])))
        pos += len(value)
    return spans


def _lexer(language: str | None):
    if not language:
        return None
    try:
        from pygments.lexers import get_lexer_by_name
        from pygments.util import ClassNotFound
    except ImportError:  # Pygments missing: code is shown unhighlighted
        return None
    try:
        # ensurenl/stripnl off: token offsets must match the code exactly
        return get_lexer_by_name(language.split()[0].lower(), ensurenl=False, stripnl=False, stripall=False)
    except ClassNotFound:
        return None
