"""Self-consistency and verification: answer extraction, verifiers, the vote and its cost (issue 14).

Self-consistency (Wang et al. 2023, "Self-Consistency Improves Chain of Thought Reasoning", ICLR) samples
``n`` answers to one prompt, reduces each to a short *answer* (``Extractor``) and returns the majority
answer. A *verifier* (``Verifier``) may accept or reject each candidate; the vote then takes the majority
among the accepted ones. Everything here is pure Python on finished texts: the scheduling of the ``n``
samples belongs to the engine and the server (see docs/reasoning.md, "Self-consistency and verification").

The API object ``hearth.self_consistency: {n, extract, verifier}`` is read by ``parse_self_consistency``
into a ``SelfConsistencySpec``; a bad value raises ``InvalidRequest`` whose ``param`` names the field
(``hearth.self_consistency.n`` / ``.extract`` / ``.verifier``). Then, per finished sample,
``judge(spec, text, tokens, seconds)`` gives a ``Candidate`` and ``vote(candidates)`` a ``Vote``.

Three design decisions this module holds:

1. **Regexes are budgeted, not timed.** Python's ``re`` has no timeout, holds the GIL while it matches (a
   runaway match freezes every thread of the server) and backtracks. ``regex_gate`` therefore (a) refuses
   patterns over ``MAX_REGEX_CHARS``; (b) refuses the shapes that backtrack exponentially: a repeat that can
   vary in length inside another repeat (``(a+)+``, ``(\\d{1,3},?)*``) and alternation inside a repeat
   (``(ab|a)*``); (c) counts what is left: ``d`` unbounded repeats (``*``, ``+``, ``{n,}``, or more than
   ``LONG_REPEAT`` choices, or an exact repeat spanning more than ``LONG_REPEAT`` items, like ``a{100}``) and
   ``c`` the product of the small choices (``\\d{1,3}`` is 3, ``a|b`` is 2). A search then costs at most
   about ``c·W^(d+1)`` steps over ``W`` characters, so each pattern scans only the last ``W`` characters of a
   text with ``c·W^(d+1) <= REGEX_STEP_BUDGET`` (2·10^7; measured here, the worst cases at their windows:
   ``.*x`` over 4,472 characters 0.014 s, ``.*.*x`` over 271 0.006 s). Patterns with ``d > 2`` are refused.
2. **The Python check is interpreted, never ``eval``'d.** ``PythonCheck`` parses the expression with
   ``ast`` and walks it with its own small evaluator over a whitelist of nodes, names and string methods;
   numbers and strings are size-checked *before* each operation, so ``9**9**9`` or ``'a'*10**9`` is refused
   rather than computed.
3. **A verifier never raises into the vote.** ``verify_safely`` turns any error into a rejection whose
   ``reason`` says what went wrong; the vote sees only ``Verdict``s.

Numbers (``last_number``) are put in one canonical form so that "1,234", "1234.0" and "+1234" vote together:
thousands commas removed, trailing decimal zeros dropped ("-3.50" → "-3.5"), fractions reduced and written
as a decimal when that decimal is exact ("3/4" → "0.75", "6/8" → "0.75") and as "p/q" otherwise
("2/6" → "1/3"); "x/0" and numbers longer than ``MAX_NUMBER_DIGITS`` digits are kept as written.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import re
import signal
import subprocess
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, Hashable, Mapping, Sequence, Union

from app.engine.structured.schema_check import check_schema
from app.errors import InvalidRequest

try:  # the parser behind re.compile: Python 3.11+ names it re._parser, 3.10 sre_parse
    from re import _parser as _sre
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]

log = logging.getLogger(__name__)

PARAM = "hearth.self_consistency"
MAX_N = 16
MAX_REGEX_CHARS = 200
LONG_REPEAT = 16  # a repeat with more choices than this counts as unbounded
MAX_LONG_REPEATS = 2
MAX_REGEX_CHOICES = 1024
REGEX_STEP_BUDGET = 2 * 10**7  # bounds c·W^(d+1); the worst cases take 0.006-0.014 s here (docstring)
MAX_SCAN_CHARS = 16_000  # no text is scanned past its last 16,000 characters
MAX_NUMBER_DIGITS = 60
MAX_JSON_PATH = 16
MAX_EXPR_CHARS = 500
MAX_INT_BITS = 4096
MAX_STR_CHARS = 100_000
MAX_COMMAND_TIMEOUT_S = 60.0
COMMAND_OUTPUT_TAIL = 2000  # bytes of a command's output kept for its reason


# --- regex gate ------------------------------------------------------------------------------------------

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
    ``MAX_REGEX_CHARS``, not a valid regex, or a shape that backtracks without bound (module docstring, 1)."""
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


# --- extractors ------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"""
    (?<![\w.,])                   # not inside a word (x2, v1.2) nor after a decimal point or a comma
    ([-+\u2212]?)                 # sign, the Unicode minus too
    (\d{1,3}(?:,\d{3})+|\d+)      # integer part, thousands commas allowed
    (?:\.(\d+))?                  # decimals
    (?:/(\d+))?                   # a fraction's denominator
    (?!\d|[.,/]\d)                # not followed by more of a number
""", re.X | re.ASCII)


def canonical_number(sign: str, whole: str, decimals: str | None = None, denominator: str | None = None) -> str:
    """The canonical text of a number's parts (module docstring): ``("-", "3", "50")`` → ``"-3.5"``,
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
    """``"last_number"``: the last number in the text, canonical (module docstring); None when there is none.
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
    Only the last ``budget.search_window`` characters of the text are searched (module docstring, 1)."""

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


# --- verifiers -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement of one candidate. ``reason``: a short line for a person (why it was rejected,
    or what accepted it)."""

    accepted: bool
    reason: str


NO_ANSWER = Verdict(False, "no extractable answer")
TARGETS = ("answer", "text")


@dataclass(frozen=True)
class RegexCheck:
    """``{"regex": pattern, "on": "answer" | "text"}``: accepted iff the pattern matches the *whole* answer
    (default) or the whole text. A target longer than the pattern's ``match_window`` is rejected unread."""

    pattern: str
    on: str = "answer"

    def verify(self, answer: str | None, text: str) -> Verdict:
        target = answer if self.on == "answer" else text
        if target is None:
            return NO_ANSWER
        compiled, budget = _gate(self.pattern, PARAM + ".verifier", "verifier.regex")
        if len(target) > budget.match_window:
            return Verdict(False, f"the {self.on} is {len(target)} characters, longer than the "
                                  f"{budget.match_window} this regex may scan")
        if compiled.fullmatch(target):
            return Verdict(True, f"the {self.on} matches the regex")
        return Verdict(False, f"the {self.on} does not match the regex")

    def to_api(self) -> dict:
        return {"regex": self.pattern, "on": self.on}


@dataclass(frozen=True)
class JsonSchemaCheck:
    """``{"json_schema": {...}, "on": "answer" | "text"}``: the answer parsed as JSON (an answer that is not
    JSON is taken as a JSON string), or the last JSON object of the text, validated with ``jsonschema``
    (the schema's own dialect). Schema ``pattern``s pass ``regex_gate``; an instance longer than the
    tightest pattern window is rejected unread."""

    schema: dict
    on: str = "answer"
    max_chars: int = MAX_SCAN_CHARS

    def verify(self, answer: str | None, text: str) -> Verdict:
        if self.on == "answer":
            if answer is None:
                return NO_ANSWER
            instance = _as_json(answer)
        else:
            instance = last_json_object(text)
            if instance is None:
                return Verdict(False, "the text holds no JSON object")
        if len(json.dumps(instance)) > self.max_chars:
            return Verdict(False, f"the {self.on} is longer than the {self.max_chars} characters the schema's "
                                  "patterns may scan")
        import jsonschema

        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(self.schema)(self.schema).iter_errors(instance))
        if error is None:
            return Verdict(True, "valid against the JSON schema")
        where = "/".join(str(p) for p in error.absolute_path)
        return Verdict(False, f"not valid against the JSON schema{' at ' + where if where else ''}: "
                              f"{error.message[:200]}")

    def to_api(self) -> dict:
        return {"json_schema": self.schema, "on": self.on}


def _as_json(answer: str) -> Any:
    try:
        return json.loads(answer)
    except ValueError:
        return answer


def _schema_patterns(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), dict):
            out += list(node["patternProperties"])
        return out + [p for v in node.values() for p in _schema_patterns(v)]
    if isinstance(node, list):
        return [p for v in node for p in _schema_patterns(v)]
    return []


# The Python check: nodes, names, functions and string methods it may use.
_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
          ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Compare, ast.Eq, ast.NotEq,
          ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.IfExp, ast.Constant, ast.Name, ast.Load,
          ast.Call, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List)
_FUNCS: dict[str, Any] = {"int": int, "float": float, "str": str, "len": len, "abs": abs, "round": round,
                          "min": min, "max": max, "bool": bool}
_METHODS = frozenset({"startswith", "endswith", "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum",
                      "isspace", "islower", "isupper", "strip", "lstrip", "rstrip", "lower", "upper", "casefold",
                      "count", "find", "rfind", "split", "rsplit", "splitlines"})
_VARIABLES = ("answer", "text")
_VALUES = (int, float, str, bool, list, tuple, type(None))


class _Unsafe(ValueError):
    pass


def check_expression(source: Any, param: str) -> ast.Expression:
    """Parse a Python check or raise ``InvalidRequest(param=param)``: at most ``MAX_EXPR_CHARS`` characters,
    one expression, only whitelisted nodes; names only ``answer``, ``text`` and the functions
    ``int float str len abs round min max bool`` (called, never passed); attributes only the string methods
    in ``_METHODS``, called; no keyword arguments, no ``*args``."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidRequest(f"verifier.python must be a non-empty expression, got {source!r}", param=param)
    if len(source) > MAX_EXPR_CHARS:
        raise InvalidRequest(f"verifier.python is {len(source)} characters; at most {MAX_EXPR_CHARS}", param=param)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise InvalidRequest(f"verifier.python is not a Python expression: {exc}", param=param) from None
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        problem = _node_problem(node, id(node) in called)
        if problem:
            raise InvalidRequest(f"verifier.python: {problem}", param=param)
    return tree


def _node_problem(node: ast.AST, called: bool) -> str | None:
    if not isinstance(node, _NODES):
        return f"{type(node).__name__} is not allowed"
    if isinstance(node, ast.Name) and node.id not in _VARIABLES and not (called and node.id in _FUNCS):
        return (f"the name {node.id!r} is not allowed here (use answer, text, and call {', '.join(_FUNCS)})")
    if isinstance(node, ast.Attribute) and (node.attr not in _METHODS or not called):
        return (f"the attribute {node.attr!r} is not allowed (call a string method: "
                f"{', '.join(sorted(_METHODS))})")
    if isinstance(node, ast.Call):
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            return "keyword and * arguments are not allowed"
        if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS or isinstance(node.func, ast.Attribute)):
            return "only the allowed functions and string methods may be called"
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
        return f"the constant {node.value!r} is not allowed"
    return None


@dataclass(frozen=True)
class PythonCheck:
    """``{"python": "int(answer) % 2 == 0"}``: accepted iff the expression is true for ``answer`` (str) and
    ``text`` (str). Evaluated by ``_Eval``, never ``eval`` (module docstring, 2). A candidate without an answer
    is rejected when the expression uses ``answer``; any error (``int('x')``, a too-large number) rejects."""

    source: str

    def verify(self, answer: str | None, text: str) -> Verdict:
        tree = check_expression(self.source, PARAM + ".verifier")
        uses_answer = any(isinstance(n, ast.Name) and n.id == "answer" for n in ast.walk(tree))
        if answer is None and uses_answer:
            return NO_ANSWER
        value = _Eval({"answer": answer, "text": text}).run(tree.body)
        return Verdict(True, "the python check is true") if value else Verdict(False, "the python check is false")

    def to_api(self) -> dict:
        return {"python": self.source}


class _Eval:
    """A tiny evaluator for checked expressions. Every value is a plain int, float, str, bool, None, list or
    tuple; ints stay under ``MAX_INT_BITS`` bits and strings under ``MAX_STR_CHARS`` characters, checked before
    the operation that would make them (so nothing large is ever computed)."""

    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names

    def run(self, node: ast.AST) -> Any:
        value = getattr(self, "_" + type(node).__name__)(node)
        if not isinstance(value, _VALUES):
            raise _Unsafe(f"a value of type {type(value).__name__} is not allowed")
        if isinstance(value, str) and len(value) > MAX_STR_CHARS:
            raise _Unsafe(f"a string over {MAX_STR_CHARS} characters")
        return value

    def _Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _Name(self, node: ast.Name) -> Any:
        if node.id not in self.names:
            raise _Unsafe(f"{node.id} can only be called")
        return self.names[node.id]

    def _Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.run(e) for e in node.elts)

    def _List(self, node: ast.List) -> Any:
        return [self.run(e) for e in node.elts]

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        value: Any = None
        for operand in node.values:
            value = self.run(operand)
            if isinstance(node.op, ast.And) != bool(value):  # short-circuit as Python does
                return value
        return value

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.run(node.operand)
        if isinstance(node.op, ast.Not):
            return not value
        _need_number(value)
        return -value if isinstance(node.op, ast.USub) else +value

    def _IfExp(self, node: ast.IfExp) -> Any:
        return self.run(node.body) if self.run(node.test) else self.run(node.orelse)

    def _Compare(self, node: ast.Compare) -> Any:
        left = self.run(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.run(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _BinOp(self, node: ast.BinOp) -> Any:
        return _binop(node.op, self.run(node.left), self.run(node.right))

    def _Subscript(self, node: ast.Subscript) -> Any:
        target = self.run(node.value)
        if not isinstance(target, (str, list, tuple)):
            raise _Unsafe("only strings and lists can be indexed")
        index = self._Slice(node.slice) if isinstance(node.slice, ast.Slice) else self.run(node.slice)
        return target[index]

    def _Slice(self, node: ast.Slice) -> Any:
        parts = [self.run(p) if p is not None else None for p in (node.lower, node.upper, node.step)]
        if any(p is not None and (not isinstance(p, int) or isinstance(p, bool)) for p in parts):
            raise _Unsafe("slice bounds must be integers")
        return slice(*parts)

    def _Call(self, node: ast.Call) -> Any:
        args = [self.run(a) for a in node.args]
        if len(args) > 3:
            raise _Unsafe("at most 3 arguments")
        if isinstance(node.func, ast.Attribute):
            target = self.run(node.func.value)
            if type(target) is not str or node.func.attr not in _METHODS:
                raise _Unsafe(f".{node.func.attr}() is only allowed on strings")
            return getattr(target, node.func.attr)(*args)
        name = node.func.id  # check_expression allowed only _FUNCS here
        if name == "round" and len(args) > 1 and not (isinstance(args[1], int) and abs(args[1]) <= 64):
            raise _Unsafe("round()'s digits must be an integer from -64 to 64")  # round(n, -10**9): 10**10**9
        return _FUNCS[name](*args)


def _need_number(*values: Any) -> None:
    for v in values:
        if not isinstance(v, (int, float)):
            raise _Unsafe(f"arithmetic needs numbers, got {type(v).__name__}")


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    if isinstance(op, ast.Add) and isinstance(a, str) and isinstance(b, str):
        return a + b
    if isinstance(op, ast.Mult) and (isinstance(a, str) or isinstance(b, str)):
        text, times = (a, b) if isinstance(a, str) else (b, a)
        if not isinstance(times, int) or isinstance(times, bool) or len(text) * max(times, 0) > MAX_STR_CHARS:
            raise _Unsafe(f"a repeated string must stay under {MAX_STR_CHARS} characters")
        return text * times
    _need_number(a, b)
    if isinstance(a, int) and isinstance(b, int):
        _check_int_growth(op, a, b)
    result = _ARITH[type(op)](a, b)
    if isinstance(result, complex):
        raise _Unsafe("a complex result")
    return result


def _check_int_growth(op: ast.operator, a: int, b: int) -> None:
    bits = abs(a).bit_length()
    if isinstance(op, ast.Pow) and b > 0 and bits > 1 and b * bits > MAX_INT_BITS:
        raise _Unsafe(f"{a} ** {b} would have more than {MAX_INT_BITS} bits")
    if isinstance(op, ast.Mult) and bits + abs(b).bit_length() > MAX_INT_BITS:
        raise _Unsafe(f"a product over {MAX_INT_BITS} bits")


_ARITH: dict[type, Any] = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
                           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
                           ast.Pow: lambda a, b: a ** b}
_COMPARE: dict[type, Any] = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
                             ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
                             ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
                             ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


@dataclass(frozen=True)
class CommandCheck:
    """``{"command": [argv...], "timeout_s": 10, "on": "answer" | "text"}``: runs ``argv`` (no shell) in a
    fresh temporary directory with the answer (default) or the text on stdin, UTF-8; accepted iff it exits 0
    within ``timeout_s`` seconds. The command runs in its own process group (session), killed as a whole
    (SIGKILL) at the timeout and after it exits, so a forked child cannot outlive the check (one that starts
    its own session can). Output is read as it comes and only its last ``COMMAND_OUTPUT_TAIL`` bytes are kept
    for the reason. This is *not* a sandbox: the command, and any model code it runs, has the person's
    rights; the API refuses it unless the caller allows commands (``parse_self_consistency``)."""

    argv: tuple[str, ...]
    timeout_s: float = 10.0
    on: str = "answer"

    def verify(self, answer: str | None, text: str) -> Verdict:
        target = answer if self.on == "answer" else text
        if target is None:
            return NO_ANSWER
        with tempfile.TemporaryDirectory(prefix="hearth-verify-") as cwd:
            return _run_command(self.argv, target.encode("utf-8"), cwd, self.timeout_s)

    def to_api(self) -> dict:
        return {"command": list(self.argv), "timeout_s": self.timeout_s, "on": self.on}


def _run_command(argv: Sequence[str], stdin: bytes, cwd: str, timeout_s: float) -> Verdict:
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=os.name == "posix")
    except OSError as exc:
        return Verdict(False, f"cannot run {argv[0]!r}: {exc.strerror or exc}")
    tail: deque[bytes] = deque()
    threads = [threading.Thread(target=_feed, args=(proc, stdin), daemon=True),
               threading.Thread(target=_drain, args=(proc, tail), daemon=True)]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _kill_group(proc)
        for t in threads:
            t.join(timeout=2.0)
    output = b"".join(tail)[-COMMAND_OUTPUT_TAIL:].decode("utf-8", "replace").strip()
    said = f": {output[-300:]}" if output else ""
    if code is None:
        return Verdict(False, f"the command timed out after {timeout_s:g} s (killed){said}")
    if code == 0:
        return Verdict(True, f"the command exited 0{said}")
    how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
    return Verdict(False, f"the command {how}{said}")


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:  # it exited (or closed stdin) without reading everything
        pass


def _drain(proc: subprocess.Popen, tail: deque) -> None:
    kept = 0
    for chunk in iter(lambda: proc.stdout.read1(4096), b""):
        tail.append(chunk)
        kept += len(chunk)
        while kept - len(tail[0]) >= COMMAND_OUTPUT_TAIL:
            kept -= len(tail.popleft())
    proc.stdout.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)  # the session's group: its pgid is the leader's pid
        else:  # pragma: no cover - Windows
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


Verifier = Union[RegexCheck, JsonSchemaCheck, PythonCheck, CommandCheck]
_KINDS = ("regex", "json_schema", "python", "command")
_FIELDS = {"regex": {"regex", "on"}, "json_schema": {"json_schema", "on"}, "python": {"python"},
           "command": {"command", "timeout_s", "on"}}


def parse_verifier(raw: Any, param: str = PARAM + ".verifier", *, allow_command: bool = False) -> Verifier | None:
    """``None`` | ``{"regex": str, "on"}`` | ``{"json_schema": {...}, "on"}`` | ``{"python": str}`` |
    ``{"command": [argv...], "timeout_s": float, "on"}`` → a ``Verifier`` (or None); ``on`` is "answer"
    (default) or "text". Raise ``InvalidRequest(param=param)`` for anything else, and for a command unless
    ``allow_command`` (a command verifier runs programs: only a caller the person trusts may ask for one)."""
    if raw is None:
        return None
    kinds = [k for k in _KINDS if isinstance(raw, dict) and k in raw]
    if len(kinds) != 1:
        raise InvalidRequest("verifier must be null or an object with exactly one of "
                             f"{', '.join(_KINDS)}, got {raw!r}"[:300], param=param)
    kind = kinds[0]
    _only(raw, _FIELDS[kind], param)
    on = raw.get("on", "answer")
    if on not in TARGETS:
        raise InvalidRequest(f"verifier.on must be \"answer\" or \"text\", got {on!r}", param=param)
    if kind == "regex":
        regex_gate(raw["regex"], param, "verifier.regex")
        return RegexCheck(raw["regex"], on)
    if kind == "json_schema":
        return _parse_schema_check(raw["json_schema"], on, param)
    if kind == "python":
        check_expression(raw["python"], param)
        return PythonCheck(raw["python"])
    return _parse_command(raw, on, param, allow_command)


def _parse_schema_check(schema: Any, on: str, param: str) -> JsonSchemaCheck:
    check_schema(schema, param=param, where="verifier.json_schema")
    windows = [regex_gate(p, param, "a json_schema pattern")[1].search_window for p in _schema_patterns(schema)]
    return JsonSchemaCheck(schema, on, min(windows, default=MAX_SCAN_CHARS))


def _parse_command(raw: dict, on: str, param: str, allow_command: bool) -> CommandCheck:
    if not allow_command:
        raise InvalidRequest("command verifiers are turned off here (they run programs on this computer); "
                             "use regex, json_schema or python", param=param)
    argv = raw["command"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a and "\0" not in a for a in argv):
        raise InvalidRequest(f"verifier.command must be a non-empty list of strings (argv), got {argv!r}",
                             param=param)
    timeout_s = raw.get("timeout_s", 10.0)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
            or not 0 < timeout_s <= MAX_COMMAND_TIMEOUT_S:
        raise InvalidRequest(f"verifier.timeout_s must be > 0 and <= {MAX_COMMAND_TIMEOUT_S:g} seconds, "
                             f"got {timeout_s!r}", param=param)
    return CommandCheck(tuple(argv), float(timeout_s), on)


def verify_safely(verifier: Verifier, answer: str | None, text: str) -> Verdict:
    """``verifier.verify(answer, text)``, with any error turned into a rejection that names it (decision 3)."""
    try:
        return verifier.verify(answer, text)
    except _Unsafe as exc:
        return Verdict(False, f"the python check was refused: {exc}")
    except Exception as exc:  # a verifier must never break the vote  # noqa: BLE001
        log.debug("verifier %s failed", type(verifier).__name__, exc_info=True)
        return Verdict(False, f"the verifier failed: {type(exc).__name__}: {str(exc)[:200]}")


# --- the spec --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SelfConsistencySpec:
    """``hearth.self_consistency``: ``n`` samples (1..``MAX_N``), how to ``extract`` each answer, an optional
    ``verifier``."""

    n: int
    extract: Extractor = field(default_factory=LastNumber)
    verifier: Verifier | None = None

    def to_api(self) -> dict:
        return {"n": self.n, "extract": self.extract.to_api(),
                "verifier": self.verifier.to_api() if self.verifier else None}


def parse_self_consistency(raw: Any, *, allow_command: bool = False, param: str = PARAM) -> SelfConsistencySpec:
    """Validate the API object ``{"n": 1..16, "extract": ... = "last_number", "verifier": ... = null}``.

    Raises ``InvalidRequest`` with ``param`` = ``hearth.self_consistency`` (not an object, unknown field),
    ``….n``, ``….extract`` or ``….verifier`` (``parse_extractor``, ``parse_verifier``)."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{param} must be an object {{n, extract, verifier}}, got {raw!r}"[:300], param=param)
    unknown = sorted(set(raw) - {"n", "extract", "verifier"})
    if unknown:
        raise InvalidRequest(f"{param}: unknown field {unknown[0]!r} (allowed: n, extract, verifier)",
                             param=f"{param}.{unknown[0]}")
    n = raw.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise InvalidRequest(f"{param}.n must be an integer >= 1 and <= {MAX_N}, got {n!r}", param=f"{param}.n")
    return SelfConsistencySpec(n, parse_extractor(raw.get("extract", "last_number"), f"{param}.extract"),
                               parse_verifier(raw.get("verifier"), f"{param}.verifier", allow_command=allow_command))


def sample_seeds(n: int, seed: int | None) -> list[int | None]:
    """Seeds for ``n`` samples: ``seed, seed+1, …`` (mod 2^32) so that a seeded request is reproducible and
    its samples differ; all None (random) without a seed."""
    return [None] * n if seed is None else [(seed + i) % 2**32 for i in range(n)]


# --- candidates and the vote -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """One sample. ``text``: its answer text (content, not reasoning); ``answer``: the extracted answer (None:
    none extractable); ``verdict``: the verifier's (None: no verifier); ``tokens``: completion tokens it cost
    (thinking included); ``seconds``: its wall time."""

    text: str
    answer: str | None
    verdict: Verdict | None = None
    tokens: int = 0
    seconds: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.verdict is not None and self.verdict.accepted


def judge(spec: SelfConsistencySpec, text: str, tokens: int = 0, seconds: float = 0.0) -> Candidate:
    """Extract ``text``'s answer and run the verifier on it: the ``Candidate`` for one finished sample."""
    answer = spec.extract.extract(text)
    verdict = verify_safely(spec.verifier, answer, text) if spec.verifier else None
    return Candidate(text, answer, verdict, tokens, seconds)


@dataclass(frozen=True)
class Vote:
    """The outcome of ``vote``.

    - ``answer``: the winning answer (None when no candidate had one: ``no_answer``).
    - ``agreement``: the share of *extractable* answers (of all candidates) equal to ``answer``, 0..1.
    - ``counts``: answer → candidates giving it, over all extractable answers, in order of first appearance.
    - ``pool``: what the majority was taken over: ``"accepted"`` (the verifier accepted some candidates with
      an answer), ``"unverified"`` (there was a verifier and it accepted none of them: majority among all,
      reported as such), ``"all"`` (no verifier), ``"none"`` (no extractable answer).
    - ``pool_counts``: the counts within the pool.
    - ``tie`` / ``tied``: more than one answer had the pool's top count / those answers. The tie is broken
      deterministically: the tied answer of the earliest candidate wins.
    - ``chosen_index``: the candidate whose text to return: the earliest in the pool giving ``answer``; with
      no answer, the first accepted candidate, else candidate 0; None for an empty list.
    - ``n``, ``extractable``, ``accepted``: candidates, those with an answer, those the verifier accepted.
    """

    answer: str | None
    agreement: float
    counts: dict[str, int]
    pool: str
    pool_counts: dict[str, int]
    tie: bool
    tied: tuple[str, ...]
    no_answer: bool
    chosen_index: int | None
    n: int
    extractable: int
    accepted: int

    def to_api(self) -> dict:
        """The JSON shape of ``hearth.self_consistency`` in a response (without the candidates)."""
        return {"answer": self.answer, "agreement": round(self.agreement, 4), "counts": dict(self.counts),
                "pool": self.pool, "pool_counts": dict(self.pool_counts), "tie": self.tie,
                "tied": list(self.tied), "no_answer": self.no_answer, "chosen_index": self.chosen_index,
                "n": self.n, "extractable": self.extractable, "accepted": self.accepted}


def vote(candidates: Sequence[Candidate]) -> Vote:
    """Majority vote over ``candidates`` preferring accepted ones (``Vote`` says how it was decided)."""
    answered = [(i, c) for i, c in enumerate(candidates) if c.answer is not None]
    accepted = sum(c.accepted for c in candidates)
    counts = _count(c.answer for _, c in answered)
    pool = [(i, c) for i, c in answered if c.accepted]
    kind = "accepted"
    if not pool:
        pool = answered
        kind = "unverified" if any(c.verdict is not None for c in candidates) else "all"
    if not pool:
        first = next((i for i, c in enumerate(candidates) if c.accepted), 0 if candidates else None)
        return Vote(None, 0.0, {}, "none", {}, False, (), True, first, len(candidates), 0, accepted)
    pool_counts = _count(c.answer for _, c in pool)
    top = max(pool_counts.values())
    tied = tuple(a for a, k in pool_counts.items() if k == top)  # first-appearance order: tied[0] is earliest
    winner = tied[0]
    chosen = next(i for i, c in pool if c.answer == winner)
    return Vote(winner, counts[winner] / len(answered), counts, kind, pool_counts, len(tied) > 1,
                tied if len(tied) > 1 else (), False, chosen, len(candidates), len(answered), accepted)


def _count(answers: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in answers:
        out[a] = out.get(a, 0) + 1
    return out


# --- cost accounting for the bench -----------------------------------------------------------------------

@dataclass(frozen=True)
class Cost:
    """All attempts' cost against the answers accepted. ``tokens`` / ``seconds``: summed over every candidate
    of every item; ``accepted``: items whose answer counts as accepted; ``*_per_accepted``: ``tokens`` /
    ``seconds`` ÷ ``accepted`` (None when nothing was accepted: the cost is unbounded)."""

    items: int
    attempts: int
    tokens: int
    seconds: float
    accepted: int
    tokens_per_accepted: float | None
    seconds_per_accepted: float | None


def cost_per_accepted(candidates_by_item: Mapping[Hashable, Sequence[Candidate]],
                      accepted: Mapping[Hashable, bool] | None = None) -> Cost:
    """Cost per accepted answer = all attempts' tokens and seconds ÷ accepted answers (issue 14).

    ``candidates_by_item``: item id → its candidates (all ``n`` samples, rejected ones included).
    ``accepted``: item id → whether its final answer counts (the bench passes "the voted answer is the known
    answer"); by default an item counts when its vote took an accepted candidate (``Vote.pool == "accepted"``),
    or, where no verifier ran, when it had an answer at all."""
    items = list(candidates_by_item.items())
    if accepted is None:
        accepted = {key: vote(c).pool in ("accepted", "all") for key, c in items}
    tokens = sum(c.tokens for _, cands in items for c in cands)
    seconds = sum(c.seconds for _, cands in items for c in cands)
    good = sum(bool(accepted.get(key, False)) for key, _ in items)
    return Cost(len(items), sum(len(c) for _, c in items), tokens, seconds, good,
                tokens / good if good else None, seconds / good if good else None)


@dataclass(frozen=True)
class BudgetPoint:
    """One row of the bench: at ``budget`` (n samples, or a thinking budget in tokens) the ``accuracy`` (0..1)
    and the mean ``tokens`` and ``seconds`` spent per item."""

    budget: float
    accuracy: float
    tokens: float
    seconds: float


@dataclass(frozen=True)
class MarginalGain:
    """From one budget to the next: accuracy gained (points of 0..1), extra tokens and seconds per item, and
    the gain per 1,000 extra tokens / per extra second (None when the step cost nothing more)."""

    from_budget: float
    to_budget: float
    accuracy_gain: float
    extra_tokens: float
    extra_seconds: float
    gain_per_1k_tokens: float | None
    gain_per_second: float | None


def marginal_gains(points: Sequence[BudgetPoint]) -> list[MarginalGain]:
    """The marginal gain of each step of budget, points sorted by budget. Raises ``ValueError`` for two points
    at one budget."""
    ordered = sorted(points, key=lambda p: p.budget)
    if len({p.budget for p in ordered}) != len(ordered):
        raise ValueError("two budget points share one budget")
    out = []
    for a, b in zip(ordered, ordered[1:]):
        gain, dt, ds = b.accuracy - a.accuracy, b.tokens - a.tokens, b.seconds - a.seconds
        out.append(MarginalGain(a.budget, b.budget, gain, dt, ds, gain / dt * 1000 if dt > 0 else None,
                                gain / ds if ds > 0 else None))
    return out
