"""Markdown helpers for the chat view (pure, no Qt).

Qt renders Markdown itself (``QTextDocument.setMarkdown``, CommonMark + GitHub tables); what it lacks is a
"copy" button per code block. ``with_copy_links`` appends a link ``hearth-copy:N`` after each *closed* fenced
code block and returns the blocks' code, so the view copies block N when the link is clicked. An unclosed fence
(an answer still streaming) gets no link until it closes.
"""

from __future__ import annotations

import re

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
