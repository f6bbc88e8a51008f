"""Extractors: how one sample's text is reduced to a short answer for the vote (``last_number``,
``final_line``, a regex group, a JSON field), and the canonical form of numbers, so that "1,234", "1234.0"
and "+1234" vote together (docs/reasoning.md, "Extractors")."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Union

from app.engine.policies.regex_gate import MAX_SCAN_CHARS, RegexBudget, _gate, regex_gate
from app.errors import InvalidRequest

PARAM = "hearth.self_consistency"
MAX_NUMBER_DIGITS = 60
MAX_JSON_PATH = 16


_NUMBER = re.compile(r"""
    (?<![\w.,])                   # not inside a word (x2, v1.2) nor after a decimal point or a comma
    ([-+\u2212]?)                 # sign, the Unicode minus too
    (\d{1,3}(?:,\d{3})+|\d+)      # integer part, thousands commas allowed
    (?:\.(\d+))?                  # decimals
    (?:/(\d+))?                   # a fraction's denominator
    (?!\d|[.,/]\d)                # not followed by more of a number
""", re.X | re.ASCII)


def canonical_number(sign: str, whole: str, decimals: str | None = None, denominator: str | None = None) -> str:
    """The canonical text of a number's parts (docs/reasoning.md, Extractors): ``("-", "3", "50")`` → ``"-3.5"``,
    ``("", "1,234")`` → ``"1234"``, ``("", "6", None, "8")`` → ``"0.75"``, ``("", "2", None, "6")`` → ``"1/3"``."""
    whole = whole.replace(",", "")
    negative = sign in ("-", "\u2212")
    too_long = len(whole) + len(decimals or "") + len(denominator or "") > MAX_NUMBER_DIGITS
    if too_long or (denominator is not None and int(denominator) == 0):  # kept as written
        return ("-" if negative else "") + whole + (f".{decimals}" if decimals else "") \
            + (f"/{denominator}" if denominator is not None else "")
    value = Fraction(int(whole + (decimals or "")), 10 ** len(decimals or ""))
    if denominator is not None:
        value /= int(denominator)
    return _format_fraction(-value if negative else value)


def _format_fraction(value: Fraction) -> str:
    den = value.denominator
    if den == 1:
        return str(value.numerator)
    twos = fives = 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den != 1:  # no exact decimal
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    digits = str(scaled).rjust(places + 1, "0")
    text = (digits[:-places] + "." + digits[-places:]).rstrip("0").rstrip(".")
    return ("-" if value < 0 else "") + text


def numbers_in(text: str) -> list[str]:
    """Every number in ``text`` in canonical form, in order (``"3 boxes of 1,200.50"`` → ``["3", "1200.5"]``)."""
    return [canonical_number(*m.groups()) for m in _NUMBER.finditer(text)]


@dataclass(frozen=True)
class LastNumber:
    """``"last_number"``: the last number in the text, canonical (``canonical_number``); None when there is none.
    Scientific notation is not read ("1e3" gives "3")."""

    def extract(self, text: str) -> str | None:
        found = None
        for found in _NUMBER.finditer(text[-MAX_SCAN_CHARS:]):
            pass
        return canonical_number(*found.groups()) if found else None

    def to_api(self) -> Any:
        return "last_number"


@dataclass(frozen=True)
class FinalLine:
    """``"final_line"``: the last non-empty line, stripped of surrounding whitespace; None for blank text."""

    def extract(self, text: str) -> str | None:
        for line in reversed(text.splitlines()):
            if line.strip():
                return line.strip()
        return None

    def to_api(self) -> Any:
        return "final_line"


@dataclass(frozen=True)
class RegexExtract:
    """``{"regex": pattern, "group": 1}``: ``group`` (a number or a name; default 1, or 0 when the pattern
    has no group) of the *last* match, stripped; None when nothing matches or the group did not take part.
    Only the last ``budget.search_window`` characters of the text are searched (``regex_gate``)."""

    pattern: str
    group: Union[int, str] = 1

    @property
    def budget(self) -> RegexBudget:
        return _gate(self.pattern, PARAM + ".extract", "extract.regex")[1]

    def extract(self, text: str) -> str | None:
        compiled, budget = _gate(self.pattern, PARAM + ".extract", "extract.regex")
        last = None
        for last in compiled.finditer(text[-budget.search_window:]):
            pass
        value = last.group(self.group) if last else None
        return value.strip() if value is not None else None

    def to_api(self) -> Any:
        return {"regex": self.pattern, "group": self.group}


@dataclass(frozen=True)
class JsonField:
    """``{"json_field": "a.b.0"}``: the value at a dotted path (a number segment indexes a list) in the last
    top-level JSON object of the text (fenced or not; only the last ``MAX_SCAN_CHARS`` characters are read).
    Strings are returned as they are, numbers canonical (4.0 → "4"), true/false as "true"/"false", objects
    and lists as compact JSON with sorted keys; null, a missing key or no object → None. Keys containing
    dots cannot be named."""

    path: str

    def extract(self, text: str) -> str | None:
        node = last_json_object(text)
        for key in self.path.split("."):
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isascii() and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return None
        return json_answer(node)

    def to_api(self) -> Any:
        return {"json_field": self.path}


def json_answer(value: Any) -> str | None:
    """A JSON value as answer text (``JsonField``'s rules)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def last_json_object(text: str) -> Any:
    """The last top-level JSON object (a dict) in the last ``MAX_SCAN_CHARS`` characters of ``text``, or None.
    Objects are found left to right with ``json.JSONDecoder.raw_decode`` from each ``{``, skipping the inside
    of each object found, so an object nested in a later one is never taken for the last."""
    text = text[-MAX_SCAN_CHARS:]
    decoder = json.JSONDecoder()
    found, at = None, text.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict):
            found = value
        at = text.find("{", end)
    return found


Extractor = Union[LastNumber, FinalLine, RegexExtract, JsonField]


def parse_extractor(raw: Any, param: str = PARAM + ".extract") -> Extractor:
    """``"last_number"`` | ``"final_line"`` | ``{"regex": str, "group": int | str}`` | ``{"json_field": str}``
    → an ``Extractor``; anything else raises ``InvalidRequest(param=param)``."""
    if raw == "last_number":
        return LastNumber()
    if raw == "final_line":
        return FinalLine()
    if not isinstance(raw, dict) or len(set(raw) & {"regex", "json_field"}) != 1:
        raise InvalidRequest('extract must be "last_number", "final_line", {"regex": ..., "group": ...} or '
                             f'{{"json_field": "a.b"}}, got {raw!r}', param=param)
    if "json_field" in raw:
        _only(raw, {"json_field"}, param)
        return JsonField(_json_path(raw["json_field"], param))
    _only(raw, {"regex", "group"}, param)
    compiled, _ = regex_gate(raw["regex"], param, "extract.regex")
    return RegexExtract(raw["regex"], _group(compiled, raw.get("group"), param))


def _group(compiled: re.Pattern, group: Any, param: str) -> Union[int, str]:
    if group is None:
        return 1 if compiled.groups else 0
    if isinstance(group, str) and group in compiled.groupindex:
        return group
    if isinstance(group, int) and not isinstance(group, bool) and 0 <= group <= compiled.groups:
        return group
    raise InvalidRequest(f"extract.group must be a group of the regex (0..{compiled.groups} or one of its "
                         f"names), got {group!r}", param=param)


def _json_path(path: Any, param: str) -> str:
    if not isinstance(path, str) or not path or len(path) > 200 or "" in path.split(".") \
            or len(path.split(".")) > MAX_JSON_PATH:
        raise InvalidRequest(f"extract.json_field must be a dotted path like \"answer\" or \"result.value\" "
                             f"(at most {MAX_JSON_PATH} keys), got {path!r}", param=param)
    return path


def _only(raw: dict, allowed: set, param: str) -> None:
    extra = sorted(set(raw) - allowed)
    if extra:
        raise InvalidRequest(f"unknown field(s) {', '.join(map(repr, extra))}; allowed: "
                             f"{', '.join(sorted(allowed))}", param=param)
