"""The rule-based router (app/engine/policies/router.py): the person's setting, the signals and their points,
the budgets
of each path, which message is read, errors, and the cost of routing."""

from __future__ import annotations

import time

import pytest

from app.engine.policies.router import KEYWORDS, MAX_READ_CHARS, Route, RouterConfig, request_text, route, signals
from app.errors import InvalidRequest
from app.protocol.types import ChatMessage
from benchmarks.reasoning_items import default_items


@pytest.mark.parametrize("text", ["hi there", "Thanks!", "Translate 'good morning' into French.",
                                  "Write a haiku about the sea.", "What is the capital of Peru?",
                                  "Which is larger, 12 or 30?", "Meet me on 2025-01-31 at 14:05."])
def test_plain_requests_take_the_fast_path(text):
    r = route(text)
    assert r.path == "fast" and r.budget.tokens == 0 and r.budget.off
    assert r.reasons[-1].endswith(": fast") and r.score < 2


@pytest.mark.parametrize("text, reason", [
    ("Prove that the square root of 2 is irrational.", "keyword 'prove'"),
    ("Explain step by step how to reverse a list.", "keyword 'step by step'"),
    ("how many r's are in strawberry", "keyword 'how many'"),
    ("Calculate the area of a 3 m by 4 m room.", "keyword 'calculate'"),
    ("12 * 7", "arithmetic expression '12 * 7'"),
    ("what's 3/4 + 1?", "arithmetic expression '3/4'"),
    ("x = 2.5 - (-3)", "arithmetic expression '2.5 - (-3'"),
])
def test_a_strong_signal_takes_the_reasoning_path(text, reason):
    r = route(text)
    assert r.path == "reasoning" and r.budget.tokens == 256 and r.budget.source == "request"
    assert any(x.startswith(reason) and x.endswith("(+2)") for x in r.reasons), r.reasons
    assert r.reasons[-1].endswith(": reasoning")


def test_two_weak_signals_make_reasoning_one_does_not():
    assert route("I paid 4 dollars, 9 dollars and 12 dollars.").path == "fast"  # 3 numbers: +1
    long_text = "word " * 150
    assert route(long_text).path == "fast"
    r = route(long_text + " 4 then 9 then 12")
    assert r.path == "reasoning" and r.score == 2
    assert [x.split(" (+")[0] for x in r.reasons[:-1]] == ["3 numbers", "long request (155 words)"]
    assert route("Why does this fail?\n```\nx = f()\n```\n" + "word " * 150).path == "reasoning"


def test_every_arithmetic_item_routes_to_reasoning():
    assert all(route(item.question).path == "reasoning" for item in default_items())


def test_the_setting_wins_and_is_checked():
    assert route("hi", "reasoning").path == "reasoning"
    r = route("Prove it step by step: 2 + 2", "fast")
    assert (r.path, r.reasons, r.score, r.budget.tokens) == ("fast", ["setting 'fast'"], 0, 0)
    for bad in ("slow", "", None, "AUTO"):
        with pytest.raises(InvalidRequest) as err:
            route("hi", bad)
        assert err.value.param == "hearth.route"


def test_budgets_come_from_the_config():
    cfg = RouterConfig(fast_tokens=16, reasoning_tokens=128, long_words=5)
    assert route("hello", config=cfg).budget.tokens == 16
    r = route("one two three four five, 1 2 3", config=cfg)
    assert r.path == "reasoning" and r.budget.tokens == 128


def test_messages_read_the_last_user_message():
    msgs = [ChatMessage("system", "Solve every equation step by step."), ChatMessage("user", "How many legs?"),
            ChatMessage("assistant", "Four."), ChatMessage("user", "thanks!")]
    assert request_text(msgs) == "thanks!" and route(msgs).path == "fast"
    assert route([{"role": "user", "content": "compute 17 * 3"}]).path == "reasoning"
    assert request_text([{"role": "system", "content": "only me"}]) == "only me"
    for bad in ([], 5, [{"role": "user", "content": None}]):
        with pytest.raises(InvalidRequest) as err:
            route(bad)
        assert err.value.param == "messages"


def test_keywords_match_whole_words_case_insensitively():
    assert "how many" in KEYWORDS
    assert route("HOW MANY apples?").path == "reasoning"
    assert route("He is a provest of the college.").path == "fast"  # 'prove' inside a word
    assert signals("") == []


def _best_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def test_routing_cost_is_measured_and_stays_linear_even_for_hostile_text():
    t0 = time.perf_counter()
    r = route("What is 2 + 2?")
    outside = time.perf_counter() - t0
    assert isinstance(r, Route) and 0 < r.seconds <= outside  # the call's own time, measured inside it
    assert r.to_api()["path"] == "reasoning" and r.to_api()["budget_tokens"] == 256
    hostile = ("1" * 1_000_000, "1." * 500_000, "1 " * 500_000 + "+", "a" * 1_000_000)
    benign = "Please tell me a story. " * (1_000_000 // 24)  # prose of the same size
    for text in hostile:  # the rules read only the last MAX_READ_CHARS characters ...
        assert signals(text) == signals(text[-MAX_READ_CHARS:])
    # ... in linear time: the hostile texts cost about what prose of their size costs (a ratio in one run).
    hostile_s = _best_of(3, lambda: [route(text) for text in hostile])
    benign_s = _best_of(3, lambda: [route(benign) for _ in hostile])
    assert hostile_s < 20 * benign_s + 0.05, (hostile_s, benign_s)
