"""The canonical prefill layout: where a prompt's chunks begin and end (pure logic, no llama.cpp).

Every prompt is prefilled in one layout that depends on its tokens alone (cuts at turn breaks, after an
answer, every ``chunk`` tokens, and at L−1 when the tail after the last cut is long), and only a prefix that ends
at a cut both layouts share, with the same cuts below it, is reused (or, where the kernels allow it, one that
ends inside the next chunk: ``usable_within``), so reused KV is bit for bit a cold prefill's.

The reasoning: docs/prefix-cache.md, 'Exactness: the canonical prefill layout' and 'The answer, laid out
again while idle'.
"""

from __future__ import annotations

import bisect
from typing import Callable, Iterable

# A tail (the tokens after the prompt's last cut) at least this long ends in a cut at L−1 and the last token is
# evaluated alone, so a repeat of the prompt reuses all but that token; a shorter tail goes in with the last
# token in one ``llama_decode`` (one weight pass fewer on the first token's path: ~20 ms on 2 cores for the
# bundled model, about what re-evaluating a tail this short costs a repeat). docs/prefix-cache.md.
TAIL_SPLIT = 64


def common_prefix(have: list[int], tokens: list[int], limit: int | None = None) -> int:
    """How many leading tokens ``have`` and ``tokens`` share, counting at most ``limit`` (None: the shorter
    length; ``limit`` must not exceed it)."""
    top = min(len(have), len(tokens)) if limit is None else limit
    n = 0
    while n < top and have[n] == tokens[n]:
        n += 1
    return n


def layout_bounds(tokens: list[int], chunk: int, breaks: Iterable[int] = (),
                  tail_split: int = TAIL_SPLIT) -> list[int]:
    """The positions (sorted) where the canonical chunks of ``tokens`` (L tokens) end: every turn break's
    position up to L−1 (a chunk never spans one), every ``chunk`` tokens after a cut, then L−1 when at least
    ``tail_split`` tokens follow the last of those cuts (the last token then goes alone), else L (the tail and
    the last token in one chunk, at most ``chunk`` tokens); nothing more when the last cut is at L−1 already.
    [] when L ≤ 1 (the only token goes alone). ``chunk``: tokens per chunk at most (>= 1). Raises
    ``ValueError`` for a chunk < 1."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 token, got {chunk}")
    end = len(tokens) - 1
    if end < 1:
        return []
    brk = frozenset(breaks)
    out: list[int] = []
    start = 0
    for p in range(1, end + 1):
        if tokens[p] in brk or p - start == chunk:
            out.append(p)
            start = p
    if start < end:  # the tail [start, L) holds at most ``chunk`` tokens: ``chunk`` after start would be a cut
        out.append(end if end - start >= tail_split else end + 1)
    return out


def next_bound(bounds: list[int], pos: int) -> int:
    """The first of ``bounds`` after ``pos`` (where the chunk starting at ``pos`` ends). Raises
    ``ValueError`` when none is: the prefill is complete."""
    i = bisect.bisect_right(bounds, pos)
    if i == len(bounds):
        raise ValueError(f"no chunk of this layout starts at token {pos}")
    return bounds[i]


def usable(bounds: list[int], n: int, have: set[int] | frozenset[int] | None = None) -> int:
    """The most tokens of a prompt whose layout ends chunks at ``bounds`` that a KV holding the same first
    ``n`` tokens gives back exactly: the largest bound b ≤ ``n`` such that the KV ends chunks at exactly the
    same positions up to b (``have``: the KV's own bounds, a ``Slot.bounds``; None: any bound ≤ ``n``). 0 when
    none."""
    i = bisect.bisect_right(bounds, n)
    if have is None:
        return bounds[i - 1] if i else 0
    own = sorted(h for h in have if h <= n)
    j = 0
    best = 0
    for b in bounds[:i]:  # the longest run of cuts both layouts share from the start
        if j < len(own) and own[j] == b:
            best, j = b, j + 1
        else:
            break
    return best


def usable_within(bounds: list[int], n: int, have: set[int] | frozenset[int], rows: int, align: int = 4) -> int:
    """``usable(bounds, n, have)``, extended into the chunk that starts there when llama.cpp's kernels give a
    token the same bits in any batch of at least ``rows`` tokens, except a batch's last (size mod ``align``)
    tokens (``rows`` > 0: measured by ``Runtime._probe_split``; 0: not, no extension).

    Let c be the shared cut, [c, e) the KV's own chunk from c (``have``: it was evaluated as one batch) and
    [c, b) the prompt's (``bounds``). When both hold at least ``rows`` tokens, every token in [c, e′) has a cold
    prefill's bits, e′ = c + ``align``·⌊(e − c)/``align``⌋ (the KV batch's last e − e′ tokens went through
    another kernel). The KV is reused up to m, the largest c + ``align``·k ≤ min(``n``, e′, b − ``rows``): the
    rest of the prompt's chunk, [m, b), is then one batch of at least ``rows`` tokens whose last
    (b − m) mod ``align`` = (b − c) mod ``align`` tokens are the ones a cold prefill also evaluates apart.
    Returns c when m would not pass it. An agent's next step (its previous prompt, the answer, a new turn) then
    reuses its previous prompt up to near its last token instead of up to the last whole chunk
    (docs/prefix-cache.md, "Reuse inside a chunk")."""
    c = usable(bounds, n, have)
    if rows <= 0:
        return c
    i = bisect.bisect_right(bounds, c)
    own = [h for h in have if h > c]
    if i == len(bounds) or not own:
        return c
    b, e = bounds[i], min(own)
    if b - c < rows or e - c < rows:
        return c
    top = min(n, c + (e - c) // align * align, b - rows)
    return c + max(0, top - c) // align * align


def merged_end(bounds: list[int], pos: int, last: int, rows: int, capacity: int, align: int = 4) -> int:
    """Where one ``llama_decode`` that starts at ``pos`` may end when it evaluates several consecutive chunks
    of the canonical layout (``bounds``) at once, so that every token still gets the bits of its own chunk's
    batch: ``next_bound(bounds, pos)`` extended by whole chunks while each chunk holds at least ``rows``
    tokens, every chunk but the group's last holds a multiple of ``align`` tokens, no chunk ends past ``last``
    (L − 1: the chunk that ends at L carries the last token and is sampled from) and the group stays within
    ``capacity`` tokens (one ubatch: one pass over the weights).

    Why this is exact: llama.cpp's CPU kernels give a token the same bits in any batch of ``rows`` tokens or
    more, wherever in the batch it sits, except the batch's last (size mod ``align``) tokens
    (``Runtime._probe_split`` measures it; docs/prefix-cache.md, "Reuse inside a chunk"); so a chunk of the
    group is computed as if alone. ``rows`` 0 (not measured, or not so): no merging. Raises ``ValueError``
    when no chunk starts at ``pos``."""
    end = next_bound(bounds, pos)
    if rows <= 0 or end - pos < rows or end > last:
        return end
    start = pos
    i = bisect.bisect_right(bounds, end)
    while i < len(bounds) and (end - start) % align == 0:
        nxt = bounds[i]
        if nxt > last or nxt - end < rows or nxt - pos > capacity:
            break
        start, end, i = end, nxt, i + 1
    return end


def turn_break_token(tokens_a: list[int], tokens_b: list[int], is_control: Callable[[int], bool],
                     is_blank: Callable[[int], bool]) -> int | None:
    """The token that opens the assistant's turn in a chat template, from the tokens of two one-user-message
    prompts with different messages, each rendered with the generation prompt (``tokens_a``, ``tokens_b``).
    Their common tail is the user turn's close and the generation prompt. In it: the control token
    (``is_control``) that also occurs earlier in ``tokens_a`` (it opens every turn: Gemma's
    ``<start_of_turn>``, ChatML's ``<|im_start|>``, Llama 3's ``<|start_header_id|>``); else the tail's first
    token that is not blank (``is_blank``: whitespace only), e.g. ``Assistant`` of a plain transcript. None
    when the tails share nothing (a template whose generation prompt is empty): the layout then cuts every
    ``chunk`` tokens only."""
    n = 0
    while n < min(len(tokens_a), len(tokens_b)) and tokens_a[-1 - n] == tokens_b[-1 - n]:
        n += 1
    if n == 0:
        return None
    tail_at = len(tokens_a) - n
    tail = tokens_a[tail_at:]
    before = set(tokens_a[:tail_at])
    for t in tail:
        if is_control(t) and t in before:
            return t
    return next((t for t in tail if not is_control(t) and not is_blank(t)), None)


def answer_end_token(tokens: list[int], answer_end: int, next_start: int, breaks: Iterable[int],
                     is_control: Callable[[int], bool], is_blank: Callable[[int], bool]) -> int | None:
    """The token that closes an assistant's turn, from the tokens of a rendered chat of a user message, an
    answer and a second user message: ``tokens[answer_end:next_start]`` lies between the answer's text and
    the second message's text (the answer's close and the user turn's opening). None when a token of
    ``breaks`` (the assistant-turn break, ``turn_break_token``) is already in it: that token opens every
    turn (Gemma, ChatML, Llama 3), so the user's turn already begins at a cut. Else its first control token
    (``is_control``: ``</s>`` of Mistral), or its first token that is not blank (``is_blank``: whitespace
    only): ``User`` of the plain transcript. None when the span is empty or blank."""
    span = tokens[max(0, answer_end):max(0, next_start)]
    brk = frozenset(breaks)
    if any(t in brk for t in span):
        return None
    control = next((t for t in span if is_control(t)), None)
    return control if control is not None else next((t for t in span if not is_blank(t)), None)
