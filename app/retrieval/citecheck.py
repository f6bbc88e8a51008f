"""Citation check: does the cited passage support the sentence that cites it?

The question is whether the *source* says what the sentence claims, not whether the prose reads well. Each
sentence of an answer that carries ``[E:<id>]`` markers (``app.retrieval.rag``) is checked against each
passage it cites, in two steps:

The reasoning: docs/retrieval.md, 'app/retrieval/citecheck.py'.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_THRESHOLD = 0.58  # all-MiniLM-L6-v2: chosen on the dev half of benchmarks/citation_check.py

MONTHS = ("january february march april may june july august september october november december "
          "jan feb mar apr jun jul aug sep sept oct nov dec").split()
WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
_MONTH_WORDS = frozenset(MONTHS) - {"may"}  # "may" is a verb far more often than a month: ``_date_word``
_DAY_WORDS = frozenset(WEEKDAYS)

# Unit aliases → one canonical spelling. Units are matched right after a number (an optional space between).
_UNIT_ALIASES = {
    "°c": "°c", "ºc": "°c", "degrees": "°", "degree": "°", "°": "°", "°f": "°f", "c": "°c",
    "l": "l", "litre": "l", "litres": "l", "liter": "l", "liters": "l",
    "ml": "ml", "millilitres": "ml", "milliliters": "ml",
    "g": "g", "gram": "g", "grams": "g", "kg": "kg", "kilograms": "kg", "kilos": "kg",
    "mm": "mm", "millimetres": "mm", "millimeters": "mm", "cm": "cm", "centimetres": "cm", "centimeters": "cm",
    "m": "m", "metre": "m", "metres": "m", "meter": "m", "meters": "m", "km": "km", "kilometres": "km",
    "kilometers": "km", "mile": "mile", "miles": "mile",
    "nm": "nm", "psi": "psi", "v": "v", "volts": "v", "w": "w", "watts": "w", "db": "db", "mg": "mg",
    "%": "%", "percent": "%", "per cent": "%",
    "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "min": "min", "mins": "min", "minute": "min", "minutes": "min",
    "h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "day": "day", "days": "day", "week": "week", "weeks": "week", "month": "month", "months": "month",
    "year": "year", "years": "year", "night": "night", "nights": "night",
    "mb": "mb", "gb": "gb", "kb": "kb", "x": "x", "×": "x", "bar": "bar", "mph": "mph", "rpm": "rpm",
    "kwh": "kwh", "kw": "kw", "hz": "hz", "khz": "khz", "mhz": "mhz", "ghz": "ghz", "p": "p", "pence": "p",
}
# Currencies → their sign, written before the number ("£12", "EUR 12") or after it ("12 euros", "12 €").
# "pounds" is read as money: a weight in pounds is rarer in what people ask about (docs/retrieval.md).
_CURRENCY = {"£": "£", "€": "€", "$": "$", "¥": "¥", "gbp": "£", "eur": "€", "usd": "$", "jpy": "¥"}
_CURRENCY_AFTER = {**_CURRENCY, "pound": "£", "pounds": "£", "euro": "€", "euros": "€", "dollar": "$",
                   "dollars": "$", "yen": "¥"}
_UNIT_RE = "|".join(sorted((re.escape(u) for u in [*_UNIT_ALIASES, *_CURRENCY_AFTER]), key=len, reverse=True))
_NUMBER = re.compile(  # a sign only where it cannot be a range or a date's dash ("5-10", "2024-03-05")
    r"(?:(?P<cur>[£€$¥])|\b(?P<code>gbp|eur|usd|jpy)\s)?\s?(?:(?<![\w.-])(?P<sign>-)(?=\d))?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    r"(?:\s?(?P<unit>" + _UNIT_RE + r")(?![\w°]))?", re.IGNORECASE)
# "May" is a month only where a month is expected: after in/on/of/by/until/since/before/after, or next to a
# day number ("3 May", "May 3rd"); elsewhere it is the verb far more often.
_MAY_BEFORE = re.compile(r"(?:\b(?:in|on|of|by|until|since|before|after)|\b\d{1,2}(?:st|nd|rd|th)?)\s+$",
                         re.IGNORECASE)
_MAY_AFTER = re.compile(r"^\s+\d{1,2}(?:st|nd|rd|th)?\b(?![:.]\d)", re.IGNORECASE)
_CODE = re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z][\w]*(?:-\w+)*\b")
# Numbers that are one fact only whole: a time or ratio (17:02), a date (2024-05-03, 12/05/2024), a version
# (3.2.1), a code of three or more dash-joined numbers (4-17-31). Their parts alone prove nothing: "30:02" is
# not supported by a passage with "02:30". A two-number dash run ("5-10") stays a range of two numbers.
_COMPOUND = re.compile(r"(?<![\w.:/-])(?:\d+(?:[:/]\d+)+|\d{4}-\d{1,2}-\d{1,2}|\d+(?:-\d+){2,}|\d+(?:\.\d+){2,})"
                       r"(?![\w:/]|[-.]\d)")
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_MARKER = re.compile(r"\[\s*E\s*:[^\]]*\]", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True)
class Fact:
    """One checkable item of a sentence. ``kind``: ``"number"`` (``value`` normalised, ``unit`` canonical or
    None, ``currency`` or None), ``"date"`` (a month or weekday name, lower-case) or ``"code"`` (lower-case).
    ``text``: as written in the sentence."""

    kind: str
    value: str
    text: str
    unit: str | None = None
    currency: str | None = None


@dataclass(frozen=True)
class SupportCheck:
    """The verdict on one (sentence, cited passage) pair.

    ``supported``: True when no fact is missing and (when an embedding was used) ``similarity >=
    threshold``. ``missing``: the facts of the sentence not found in the passage, as written. ``similarity``:
    cosine similarity in [-1, 1] with the passage's closest sentence span, None when not measured.
    ``threshold``: the bar used (None without embeddings). ``reason``: one sentence for a person."""

    supported: bool
    missing: tuple[str, ...]
    similarity: float | None
    threshold: float | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``missing`` as a list."""
        return {**asdict(self), "missing": list(self.missing)}


def _fold(text: str) -> str:
    """NFKC, dashes and minus signs as ``-``, non-breaking and thin spaces as spaces."""
    text = unicodedata.normalize("NFKC", text)
    return re.sub(r"[\u2010-\u2015\u2212]", "-", text).replace("\u00a0", " ").replace("\u202f", " ")


def _num(raw: str) -> str:
    """``1,250`` → ``1250``; ``3.50`` → ``3.5``; ``07`` → ``7``."""
    s = raw.replace(",", "")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s.lstrip("0") or "0"


def facts(sentence: str) -> list[Fact]:
    """The checkable facts of ``sentence`` (markers ``[E:...]`` ignored), in order: codes (a word mixing
    letters and digits, e.g. ``E24``), compound numbers taken whole (``compound``: a time ``17:02``, a date
    ``2024-05-03``, a version ``3.2.1``; ``_COMPOUND``), numbers with their unit and currency, month/weekday
    names."""
    text = _fold(_MARKER.sub(" ", sentence))
    out: list[Fact] = []
    seen = set()
    for m in _CODE.finditer(text):
        if m.group(0).lower() not in seen:
            seen.add(m.group(0).lower())
            out.append(Fact("code", m.group(0).lower(), m.group(0)))
    spans = []
    for m in _COMPOUND.finditer(text):
        spans.append((m.start(), m.end()))
        out.append(Fact("compound", _compound(m.group(0)), m.group(0)))
    for m in _NUMBER.finditer(text):
        if _inside_code(text, m.start("num"), m.end("num")) or any(a <= m.start("num") < b for a, b in spans):
            continue
        unit, currency = _unit_and_currency(m)
        out.append(Fact("number", _signed(m), m.group(0).strip(), unit, currency))
    for m in _WORD.finditer(text):
        value = _date_word(text, m)
        if value is not None:
            out.append(Fact("date", value, m.group(0)))
    return out


def _unit_and_currency(m: re.Match) -> tuple[str | None, str | None]:
    """A ``_NUMBER`` match's canonical unit and currency sign (each None when absent): a currency written
    after the number ("12 euros") is its currency, not its unit."""
    unit = (m.group("unit") or "").lower()
    currency = _CURRENCY.get((m.group("cur") or m.group("code") or "").lower())
    if unit in _CURRENCY_AFTER:
        return None, currency or _CURRENCY_AFTER[unit]
    return _UNIT_ALIASES.get(unit) if unit else None, currency


def _date_word(text: str, m: re.Match) -> str | None:
    """The fact value of the word ``m`` of ``text`` when it names a month (its first three letters) or a
    weekday (singular: "Mondays" is "monday"), else None. "May" only where a month is expected (``_MAY_*``)."""
    lw = m.group(0).lower()
    if lw in _MONTH_WORDS:
        return lw[:3]
    if lw == "may":
        near = _MAY_BEFORE.search(text[max(0, m.start() - 12):m.start()]) or _MAY_AFTER.match(text[m.end():])
        return "may" if near else None
    if lw in _DAY_WORDS or (lw.endswith("s") and lw[:-1] in _DAY_WORDS):
        return lw.rstrip("s")
    return None


def _compound(raw: str) -> str:
    """A compound number with each part normalised (``02:30`` → ``2:30``, ``2024-05-03`` → ``2024-5-3``) and
    its separators kept."""
    return re.sub(r"\d+", lambda m: _num(m.group(0)), raw)


def _signed(m: re.Match) -> str:
    """A ``_NUMBER`` match's value with its sign: ``-18`` and ``18`` are different facts (a freezer at
    −18 °C is not one at 18 °C)."""
    n = _num(m.group("num"))
    return f"-{n}" if m.group("sign") and n != "0" else n


def _inside_code(text: str, a: int, b: int) -> bool:
    """True when ``text[a:b]`` (digits) is part of a letters-and-digits word such as ``E24``."""
    return (a > 0 and text[a - 1].isalpha()) or (b < len(text) and text[b].isalpha() and
                                                 not _unit_at(text, b))


def _unit_at(text: str, i: int) -> bool:
    m = re.match(r"(?:" + _UNIT_RE + r")(?![\w°])", text[i:], re.IGNORECASE)
    return m is not None


def _passage_facts(passage: str) -> tuple[set, set, set, set]:
    """(numbers, (number, unit) pairs, (currency, number) pairs, words) found in ``passage``."""
    text = _fold(passage)
    numbers, with_unit, with_cur = set(), set(), set()
    for m in _NUMBER.finditer(text):
        n = _signed(m)
        numbers.add(n)
        unit, currency = _unit_and_currency(m)
        if unit:
            with_unit.add((n, unit))
        if currency:
            with_cur.add((currency, n))
    words = {w.lower() for w in re.findall(r"\w+(?:-\w+)*", text)}
    words |= {v for m in _WORD.finditer(text) if (v := _date_word(text, m)) is not None}
    words |= {_compound(m.group(0)) for m in _COMPOUND.finditer(text)}
    return numbers, with_unit, with_cur, words


def missing_facts(sentence: str, passage: str) -> list[str]:
    """The facts of ``sentence`` (``facts``) that ``passage`` does not contain, as written in the sentence.
    A number must be in the passage; with a unit, the passage must have that number with that unit (or
    with no unit: "25" in a table); with a currency sign, with that sign."""
    numbers, with_unit, with_cur, words = _passage_facts(passage)
    units_of = {}
    for n, u in with_unit:
        units_of.setdefault(n, set()).add(u)
    out = []
    for f in facts(sentence):
        if f.kind == "number":
            ok = f.value in numbers
            if ok and f.unit and f.value in units_of and f.unit not in units_of[f.value]:
                ok = _compatible(f.unit, units_of[f.value])
            if ok and f.currency:
                ok = (f.currency, f.value) in with_cur
        else:
            ok = f.value in words
        if not ok:
            out.append(f.text)
    return out


def _compatible(unit: str, found: set) -> bool:
    """``°`` (the word "degrees") matches ``°c`` / ``°f``."""
    return unit == "°" and bool(found & {"°c", "°f"}) or "°" in found and unit in ("°c", "°f")


def spans(passage: str, window: int = 2) -> list[str]:
    """``passage`` as the pieces a sentence is compared with: each sentence (split at ``.!?`` + space and at
    line breaks; Markdown heading marks dropped) and each run of ``window`` adjacent sentences."""
    parts = [p.strip().lstrip("#").strip() for p in _SENTENCE.split(passage)]
    parts = [p for p in parts if len(p) > 2]
    out = list(parts)
    for w in range(2, window + 1):
        out += [" ".join(parts[i:i + w]) for i in range(len(parts) - w + 1)]
    return out or [passage]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` str indices of each sentence of ``text``, split as ``spans`` splits a passage (at
    ``.!?`` followed by space, and at line breaks); surrounding whitespace excluded, empty pieces dropped."""
    out, pos = [], 0
    for m in [*_SENTENCE.finditer(text), None]:
        end = m.start() if m is not None else len(text)
        piece = text[pos:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            out.append((pos + lead, pos + len(piece.rstrip())))
        if m is not None:
            pos = m.end()
    return out


def claim_text(sentence: str) -> str:
    """The sentence as compared: markers removed, whitespace folded."""
    return " ".join(_MARKER.sub(" ", sentence).split())


Embed = Callable[[list[str]], np.ndarray]  # texts -> (n, d) float32, L2-normalised rows


class CitationChecker:
    """Checks sentences against the passages they cite (docs/retrieval.md, 'app/retrieval/citecheck.py').

    ``embed``: texts → ``(n, d)`` L2-normalised float32 rows (``Embedder.embed``); None: facts only.
    ``threshold``: the similarity bar (cosine, [-1, 1]); ``window``: adjacent sentences joined per span."""

    def __init__(self, embed: Embed | None = None, threshold: float = DEFAULT_THRESHOLD, window: int = 2) -> None:
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be a cosine from -1 to 1, got {threshold!r}")
        self.embed, self.threshold, self.window = embed, threshold, window

    def similarity(self, sentence: str, passage: str) -> float:
        """Cosine similarity of ``claim_text(sentence)`` with the closest span of ``passage`` (``spans``).
        Needs ``embed``."""
        return self.similarities([(sentence, passage)])[0]

    def similarities(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """``similarity`` for many (sentence, passage) pairs with one ``embed`` call (passages split once)."""
        if self.embed is None:
            raise ValueError("similarity needs an embed function")
        split = {p: spans(p, self.window) for _, p in pairs}
        texts = list(dict.fromkeys([claim_text(s) for s, _ in pairs] + [x for v in split.values() for x in v]))
        vecs = np.asarray(self.embed(texts), dtype=np.float32)
        row = {t: vecs[i] for i, t in enumerate(texts)}
        out = []
        for s, p in pairs:
            q = row[claim_text(s)]
            out.append(float(max(float(row[x] @ q) for x in split[p])))
        return out

    def check(self, sentence: str, passage: str) -> SupportCheck:
        """The verdict for one pair (``check_many`` for several: one embedding call)."""
        return self.check_many([(sentence, passage)])[0]

    def check_many(self, pairs: Sequence[tuple[str, str]]) -> list[SupportCheck]:
        """A ``SupportCheck`` per (sentence, passage) pair, in order."""
        if not pairs:
            return []
        sims: list[float | None] = list(self.similarities(pairs)) if self.embed is not None else [None] * len(pairs)
        sims = [x if x is None or math.isfinite(x) else None for x in sims]  # a broken vector: facts only
        return [self._verdict(missing_facts(s, p), sim) for (s, p), sim in zip(pairs, sims)]

    def _verdict(self, missing: list[str], sim: float | None) -> SupportCheck:
        bar = self.threshold if sim is not None else None
        if missing:
            return SupportCheck(False, tuple(missing), sim, bar,
                                f"not in the cited passage: {', '.join(missing)}")
        if sim is not None and sim < self.threshold:
            return SupportCheck(False, (), sim, bar, f"the cited passage does not say this (similarity "
                                                     f"{sim:.2f} < {self.threshold:.2f})")
        why = "facts found in the cited passage" + (f", similarity {sim:.2f}" if sim is not None else "")
        return SupportCheck(True, (), sim, bar, why)
