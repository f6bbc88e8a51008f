"""A rule-based router: answer a request on the fast path (no thinking) or the reasoning path (issue 14).

``route(messages_or_text, setting)`` returns a ``Route`` (``path``, the thinking ``budget``, ``reasons``,
``seconds``). The decision this module holds: **rules, not a model**, read from the last user message.

The reasoning: docs/reasoning.md, 'Routing'.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from app.errors import InvalidRequest
from app.protocol.reasoning import EFFORT_TOKENS, ReasoningBudget, resolve_budget

PARAM = "hearth.route"
SETTINGS = ("auto", "fast", "reasoning")
REASONING_SCORE = 2

# Phrases that ask for working, not recall. Matched case-insensitively on word boundaries.
KEYWORDS = ("prove", "proof", "derive", "calculate", "compute", "solve", "step by step", "step-by-step",
            "how many", "how much", "show your work", "work out", "explain why", "reason about", "puzzle",
            "riddle", "equation", "integral", "derivative", "probability", "algorithm", "optimize", "optimise",
            "debug", "what is the sum", "what is the product", "what is the total", "what is the difference")
_KEYWORDS = re.compile(r"\b(" + "|".join(re.escape(k) for k in KEYWORDS) + r")\b", re.IGNORECASE)
# Starts only at a number's first digit (the lookbehind), so a search is linear in the text's length.
_EXPRESSION = re.compile(r"(?<![\d.,])\d[\d.,]*\s*[-+*/×÷^%=]\s*\(?\s*-?\d")
_DATE_TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}:\d{2}\b")  # 2025-01-31, 14:05: not arithmetic
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")
_WORD = re.compile(r"\S+")
MAX_READ_CHARS = 20_000  # the rules read at most the last 20,000 characters: routing stays microseconds


@dataclass(frozen=True)
class RouterConfig:
    """The router's knobs. ``fast_tokens`` / ``reasoning_tokens``: thinking tokens per path (0: none);
    ``long_words``: a request of this many words or more counts as a weak signal for reasoning."""

    fast_tokens: int = 0
    reasoning_tokens: int = EFFORT_TOKENS["low"]
    long_words: int = 150


@dataclass(frozen=True)
class Route:
    """The router's decision. ``path``: "fast" or "reasoning"; ``budget``: the thinking budget to run it with;
    ``reasons``: the rules that fired, in words (the setting, each signal and its points, the score);
    ``score``: the points (0 when the setting decided); ``seconds``: time spent routing (perf_counter)."""

    path: str
    budget: ReasoningBudget
    reasons: list[str] = field(default_factory=list)
    score: int = 0
    seconds: float = 0.0

    def to_api(self) -> dict:
        return {"path": self.path, "budget_tokens": self.budget.tokens, "reasons": list(self.reasons),
                "score": self.score, "seconds": round(self.seconds, 6)}


def check_setting(setting: Any) -> str:
    """``setting`` if it is one of ``SETTINGS``; else ``InvalidRequest(param="hearth.route")``."""
    if setting not in SETTINGS:
        raise InvalidRequest(f"{PARAM} must be one of {', '.join(SETTINGS)}, got {setting!r}"[:300], param=PARAM)
    return setting


def request_text(messages_or_text: Any) -> str:
    """The text the rules read: a string as it is; for messages (``ChatMessage`` or dicts with ``role`` and
    ``content``), the last user message's content (the last message's when none is a user's). Raises
    ``InvalidRequest(param="messages")`` for anything else."""
    if isinstance(messages_or_text, str):
        return messages_or_text
    if isinstance(messages_or_text, Sequence) and messages_or_text:
        pairs = [(_get(m, "role"), _get(m, "content")) for m in messages_or_text]
        user = [c for r, c in pairs if r == "user"]
        text = user[-1] if user else pairs[-1][1]
        if isinstance(text, str):
            return text
    raise InvalidRequest("route needs a text or a non-empty list of messages with text content", param="messages")


def _get(m: Any, key: str) -> Any:
    return m.get(key) if isinstance(m, dict) else getattr(m, key, None)


def signals(text: str, config: RouterConfig = RouterConfig()) -> list[tuple[str, int]]:
    """The rules that fire on ``text``: (reason, points) pairs (docs/reasoning.md, 'Routing')."""
    text = text[-MAX_READ_CHARS:]
    out: list[tuple[str, int]] = []
    keywords = sorted({m.group(1).lower() for m in _KEYWORDS.finditer(text)})
    if keywords:
        out.append((f"keyword {', '.join(repr(k) for k in keywords)}", 2))
    expr = _EXPRESSION.search(_DATE_TIME.sub(" ", text))
    if expr:
        out.append((f"arithmetic expression {expr.group(0)!r}", 2))
    numbers = len(_NUMBER.findall(text))
    if numbers >= 3:
        out.append((f"{numbers} numbers", 1))
    words = len(_WORD.findall(text))
    if words >= config.long_words:
        out.append((f"long request ({words} words)", 1))
    if "```" in text:
        out.append(("code block", 1))
    return out


def route(messages_or_text: Any, setting: str = "auto", config: RouterConfig = RouterConfig()) -> Route:
    """Choose the fast or the reasoning path for one request (docs/reasoning.md, 'Routing').

    ``messages_or_text``: the prompt text or the chat messages (``request_text``); ``setting``: the person's
    choice, "auto" / "fast" / "reasoning". Returns a ``Route`` whose ``seconds`` is the time this call took.
    Raises ``InvalidRequest`` naming ``hearth.route`` (a bad setting) or ``messages`` (no text)."""
    t0 = time.perf_counter()
    check_setting(setting)
    text = request_text(messages_or_text)
    if setting != "auto":
        path, reasons, score = setting, [f"setting {setting!r}"], 0
    else:
        fired = signals(text, config)
        score = sum(p for _, p in fired)
        path = "reasoning" if score >= REASONING_SCORE else "fast"
        reasons = [f"{r} (+{p})" for r, p in fired] + [f"score {score} {'>=' if path == 'reasoning' else '<'} "
                                                        f"{REASONING_SCORE}: {path}"]
    tokens = config.reasoning_tokens if path == "reasoning" else config.fast_tokens
    budget = resolve_budget(budget_tokens=tokens)
    return Route(path, budget, reasons, score, time.perf_counter() - t0)
