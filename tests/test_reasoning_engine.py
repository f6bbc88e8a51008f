"""Thinking through the real scheduler and Engine over the scripted runtime (tests/fakes.py): thinking text
apart from the answer, budget forcing, stop thinking, stop strings on the answer only, metrics."""

from __future__ import annotations

import pytest
from fakes import FakeEngine

from app.protocol.reasoning import resolve_budget
from app.protocol.types import ChatMessage, DecodingParams, Delta, GenerateRequest, ReasoningRequest

HI = (ChatMessage("user", "hi"),)


def asked(budget=None, stop=(), answer_now=None, deadline_s=None) -> GenerateRequest:
    return GenerateRequest(messages=HI, decoding=DecodingParams.make(max_tokens=200, stop=list(stop)),
                           reasoning=ReasoningRequest(resolve_budget(budget_tokens=budget, deadline_s=deadline_s),
                                                      answer_now))


@pytest.fixture
def engine():
    eng = FakeEngine(reply=lambda r: "<think>" + "step " * 20 + "\n\ndone</think>The answer.\n\nMore.",
                     token_delay_s=0.002)
    yield eng
    eng.close()


def run(gen):
    deltas = [ev for ev in gen if isinstance(ev, Delta)]
    return "".join(d.reasoning for d in deltas), "".join(d.text for d in deltas), gen.done


def test_thinking_is_apart_and_stop_strings_apply_to_the_answer_only(engine):
    reasoning, answer, done = run(engine.generate(asked(stop=["\n\n"])))
    assert reasoning == "step " * 20 + "\n\ndone" == done.reasoning  # the blank line inside thinking stays
    assert answer == "The answer." == done.text  # the answer's blank line stopped it
    m = done.metrics
    assert m.reasoning_tokens + m.answer_tokens == m.completion_tokens and m.reasoning_tokens > 100
    assert not m.reasoning_forced and m.ttfat_s is not None and m.ttfat_s > m.ttft_s


def test_budget_forcing_ends_thinking_after_the_budget(engine):
    reasoning, answer, done = run(engine.generate(asked(budget=7, answer_now="Final: ")))
    assert reasoning == "step st" and done.metrics.reasoning_stopped_by == "budget"
    assert answer.startswith("Final: The answer.")
    assert done.metrics.reasoning_budget == 7


def test_stop_thinking_answers_true_while_thinking_then_false(engine):
    gen = engine.generate(asked())
    answers = []
    for ev in gen:
        if isinstance(ev, Delta) and ev.reasoning and not answers:
            answers.append(gen.stop_thinking())
            answers.append(gen.stop_thinking())  # asked already: the forced end is on its way
        elif isinstance(ev, Delta) and ev.text and len(answers) == 2:
            answers.append(gen.stop_thinking())  # thinking ended: the answer is streaming
    assert answers == [True, False, False]
    assert gen.done.metrics.reasoning_stopped_by == "user" and gen.done.text.startswith("The answer.")
    assert gen.stop_thinking() is False


def test_a_request_without_reasoning_has_no_thinking_split(engine):
    done = engine.complete(GenerateRequest(messages=HI, decoding=DecodingParams.make(max_tokens=200)))
    assert done.text.startswith("<think>") and done.reasoning == "" and done.metrics.reasoning_budget is None
