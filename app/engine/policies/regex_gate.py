"""The regex gate: a pattern is compiled only when its backtracking is bounded, and then scans only the text
window its cost model allows (``c·W^(d+1)`` steps within ``REGEX_STEP_BUDGET``). Python's ``re`` has no timeout
and holds the GIL while it matches, so regexes are budgeted, not timed (docs/reasoning.md, "Regexes have a
budget, not a timeout")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from app.errors import InvalidRequest

try:  # the parser behind re.compile: Python 3.11+ names it re._parser, 3.10 sre_parse
    from re import _parser as _sre
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

MAX_REGEX_CHARS = 200
LONG_REPEAT = 16  # a repeat with more choices than this counts as unbounded
MAX_LONG_REPEATS = 2
MAX_REGEX_CHOICES = 1024
REGEX_STEP_BUDGET = 2 * 10**7  # bounds c·W^(d+1); the worst cases take 0.006-0.014 s here (docs/reasoning.md)
MAX_SCAN_CHARS = 16_000  # no text is scanned past its last 16,000 characters


class _Refused(ValueError):
    pass


@dataclass(frozen=True)
class RegexBudget:
    """What ``regex_gate`` found in a pattern. ``long``: unbounded repeats (d); ``choices``: product of the
    small choices (c); ``search_window`` / ``match_window``: characters a search / a full match may scan."""

    long: int
    choices: int
    search_window: int
    match_window: int


def regex_gate(pattern: str, param: str, what: str = "regex") -> tuple[re.Pattern, RegexBudget]:
    """Compile ``pattern`` or raise ``InvalidRequest(param=param)``: not a string, longer than
    ``MAX_REGEX_CHARS``, not a valid regex, or a shape that backtracks without bound (docs/reasoning.md)."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidRequest(f"{what} must be a non-empty string, got {pattern!r}", param=param)
    if len(pattern) > MAX_REGEX_CHARS:
        raise InvalidRequest(f"{what} is {len(pattern)} characters; at most {MAX_REGEX_CHARS} are allowed "
                             "(Python's re has no timeout)", param=param)
    return _gate(pattern, param, what)


@lru_cache(maxsize=256)
def _gate(pattern: str, param: str, what: str) -> tuple[re.Pattern, RegexBudget]:
    try:
        compiled = re.compile(pattern)
        long, choices = _cost(_sre.parse(pattern), False)
    except re.error as exc:
        raise InvalidRequest(f"{what} is not a valid regular expression: {exc}", param=param) from None
    except _Refused as exc:
        raise InvalidRequest(f"{what} {pattern!r} can backtrack without bound: {exc}", param=param) from None
    if long > MAX_LONG_REPEATS or choices > MAX_REGEX_CHOICES:
        raise InvalidRequest(
            f"{what} {pattern!r} has {long} unbounded repeats and {choices} choices; at most "
            f"{MAX_LONG_REPEATS} and {MAX_REGEX_CHOICES} are allowed (Python's re has no timeout)", param=param)
    return compiled, RegexBudget(long, choices, _window(long + 1, choices), _window(max(long, 1), choices))


def _window(degree: int, choices: int) -> int:
    return min(MAX_SCAN_CHARS, int((REGEX_STEP_BUDGET / choices) ** (1.0 / degree)))


_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _cost(items: Any, in_repeat: bool, scale: int = 1) -> tuple[int, int]:
    """(unbounded repeats, product of small choices) of a parsed pattern; raise ``_Refused`` for nesting.
    ``scale``: the product of the enclosing exact repeats' counts (``(?:a{16}){16}`` scans 256 characters,
    so its inner repeat counts as unbounded)."""
    long, choices = 0, 1
    for op, av in items:
        name = str(op)
        if name in _REPEATS:
            lo, hi, body = av
            varies = hi != lo
            if in_repeat and varies:
                raise _Refused("a repeat of varying length inside a repeat, like (a+)+")
            unbounded = hi - lo > LONG_REPEAT if varies else scale * hi > LONG_REPEAT
            if unbounded:
                long += 1
            elif varies:
                choices *= hi - lo + 1
            inner = 1 if unbounded else scale * hi  # an unbounded repeat's W already covers its body's scan
            sub_long, sub_choices = _cost(body, in_repeat or hi > 1, inner)
            long, choices = long + sub_long, choices * sub_choices
        elif name == "GROUPREF":
            # A backreference multiplies the search by the length of the text its group matched
            # ((a*)(a*)\1\2b: about W^3 steps, not the W^2 counted; 8 s on 4,400 characters): refused.
            raise _Refused(r"a backreference, like (a*)\1, multiplies the matching work")
        elif name == "BRANCH":
            if in_repeat:
                raise _Refused("alternation inside a repeat, like (ab|a)*")
            parts = [_cost(alt, in_repeat, scale) for alt in av[1]]
            long, choices = long + max(p[0] for p in parts), choices * sum(p[1] for p in parts)
        else:
            for sub in _subpatterns(name, av):
                sub_long, sub_choices = _cost(sub, in_repeat, scale)
                long, choices = long + sub_long, choices * sub_choices
    return long, choices


def _subpatterns(name: str, av: Any) -> list:
    if name == "SUBPATTERN":
        return [av[-1]]
    if name == "ATOMIC_GROUP":
        return [av]
    if name in ("ASSERT", "ASSERT_NOT"):
        return [av[1]]
    if name == "GROUPREF_EXISTS":
        return [p for p in av[1:] if p is not None]
    return []
