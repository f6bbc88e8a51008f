"""Thinking on the real bundled model (Gemma 3 270M, a base model without thinking markers: a request with a
budget gets ``<think>`` prefilled, docs/reasoning.md): budget forcing, stop thinking mid-stream, and n samples
of one prompt sharing its prefill through a copy of the KV stream (app/engine/local/runtime.py)."""

from __future__ import annotations

import threading

import pytest

from app.engine.local.engine import Engine
from app.engine.local.layout import TAIL_SPLIT
from app.protocol.reasoning import resolve_budget
from app.protocol.types import ChatMessage, DecodingParams, Delta, GenerateRequest, LoadSettings, ReasoningRequest

pytestmark = pytest.mark.model

QUESTION = (ChatMessage("user", "What is 17 + 25? Think it through."),)


@pytest.fixture(scope="module")
def engine(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048, n_parallel=3))
    eng.load()
    yield eng
    eng.close()


def thinking(budget: int | None, max_tokens: int = 96, **kw) -> GenerateRequest:
    return GenerateRequest(messages=QUESTION, decoding=DecodingParams.make(temperature=0.0, max_tokens=max_tokens),
                           reasoning=ReasoningRequest(resolve_budget(budget_tokens=budget, **kw)))


def stream(gen, on_reasoning=None):
    reasoning, answer = [], []
    for ev in gen:
        if isinstance(ev, Delta):
            reasoning.append(ev.reasoning)
            answer.append(ev.text)
            if ev.reasoning and on_reasoning:
                on_reasoning(len([r for r in reasoning if r]))
    return "".join(reasoning), "".join(answer), gen.done


def test_budget_32_forces_the_end_of_thinking_and_keeps_it_apart(engine):
    reasoning, answer, done = stream(engine.generate(thinking(32)))
    m = done.metrics
    assert engine.load()["thinking"]["family"] == "prefill"
    assert m.reasoning_budget == 32 and m.reasoning_forced and m.reasoning_stopped_by == "budget"
    assert m.reasoning_tokens == 32  # the 32nd thinking token is the last one sampled inside thinking
    assert m.reasoning_tokens + m.answer_tokens == m.completion_tokens
    assert reasoning and done.reasoning == reasoning and "<think>" not in reasoning
    assert answer == done.text and answer.startswith("Answer:")  # the inserted line, then the model's answer
    assert "</think>" not in answer and reasoning not in answer
    assert m.ttfat_s is not None and m.ttfat_s > m.ttft_s  # the first answer text comes after the thinking


def test_stop_thinking_mid_stream_ends_thinking_and_the_answer_follows(engine):
    gen = engine.generate(thinking(400, max_tokens=200))
    said = []

    def after(n: int) -> None:
        if n == 6 and not said:
            said.append(gen.stop_thinking())

    reasoning, answer, done = stream(gen, after)
    m = done.metrics
    assert said == [True]
    assert m.reasoning_stopped_by == "user" and m.reasoning_forced
    assert m.reasoning_tokens < 40  # stopped within a few tokens of the request, far below the 400 allowed
    assert answer.startswith("Answer:")
    assert gen.stop_thinking() is False  # finished


def test_budget_none_means_no_thinking_on_a_model_that_thinks_only_when_prefilled(engine):
    done = engine.complete(thinking(0))
    assert done.reasoning == "" and done.metrics.reasoning_tokens == 0
    plain = engine.complete(GenerateRequest(messages=QUESTION, decoding=DecodingParams.make(temperature=0.0,
                                                                                            max_tokens=96)))
    assert done.text == plain.text and plain.metrics.reasoning_budget is None


def test_a_final_assistant_message_is_continued_and_a_prefilled_think_opens_thinking(engine):
    msgs = QUESTION + (ChatMessage("assistant", "<think>\n17 + 25: 17 + 20 = 37, 37 + 5 ="),)
    done = engine.complete(GenerateRequest(messages=msgs, decoding=DecodingParams.make(temperature=0.0,
                                                                                       max_tokens=60)))
    assert engine.render(GenerateRequest(messages=msgs)).text.endswith("37 + 5 =")
    assert done.metrics.reasoning_budget is not None and done.reasoning  # began inside thinking


LONG = (ChatMessage("user", "The harbour master's notes on the tides, the boats and the weather this week. " * 12
                    + "What did the harbour master write about the boats?"),)


def test_samples_started_after_the_first_copy_its_prompt_instead_of_prefilling(engine):
    sampled = DecodingParams.make(temperature=0.8, max_tokens=24, seed=1)
    first = engine.generate(GenerateRequest(messages=LONG, decoding=sampled))
    it = iter(first)
    next(it)  # the first event: the prompt is in the first sample's KV
    others: list = []

    def run(seed: int) -> None:
        others.append(engine.complete(GenerateRequest(messages=LONG, decoding=sampled.updated(seed=seed))))

    threads = [threading.Thread(target=run, args=(s,)) for s in (2, 3)]
    for t in threads:
        t.start()
    for _ in it:
        pass
    for t in threads:
        t.join(120)
    L = first.done.metrics.prompt_tokens
    # the first sample prefills (reusing at most an earlier test's prompt up to a cut of the layout: the
    # transcript's preamble, which names the Assistant), it copies from no slot
    assert L > 100 and first.done.metrics.cached_tokens < L - 1
    assert "copied from slot" not in first.done.metrics.cache_reuse_reason
    for d in others:
        # all of the prompt but its last token, or but the short tail after the answer's turn break that goes
        # in with it (layout.TAIL_SPLIT)
        assert d.metrics.prompt_tokens == L and 0 < L - d.metrics.cached_tokens <= TAIL_SPLIT, d.metrics
        assert d.metrics.cached_tokens > 100
        assert "copied from slot" in d.metrics.cache_reuse_reason and d.metrics.cache_reuse == "exact"
        assert d.metrics.completion_tokens > 0
