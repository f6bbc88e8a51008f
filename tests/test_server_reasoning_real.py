"""Issue 14's "Must show" on the port, against the real bundled model (Gemma 3 270M base: the prefill family,
so a budget makes Hearth open ``<think>`` and the budget or a stop closes it) through the official ``openai``
client, server on 127.0.0.1 and a free port.

Two requests, greedy and short (n_ctx 1024, max_tokens ≤ 80): ``hearth.reasoning_budget: 32`` gives at most
32 thinking tokens plus the markers, ``reasoning_content`` apart from ``content``, ``reasoning_tokens`` in usage
and a time to first answer token; a stream with a large budget stopped through
``POST /v1/hearth/requests/{id}/stop_thinking`` after a few thinking chunks goes on with its answer."""

from __future__ import annotations

import httpx
import openai
import pytest

from app.engine.local.engine import Engine
from app.protocol.types import LoadSettings
from app.server import ServerThread, create_app
from app.settings import ServerSettings

pytestmark = pytest.mark.model
MODEL = "gemma-3-270m-q4_k_m"
ASK = [{"role": "user", "content": "What is 12 + 7?"}]
MARKER_TOKENS = 4  # "<think>\n" and "\n</think>\n\n" take a few tokens; none are sampled thinking


@pytest.fixture(scope="module")
def server(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=1024), max_queue=4)
    eng.load()
    with ServerThread(create_app(eng, ServerSettings())) as srv:
        yield srv
    eng.close()


def oai(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_budget_32_keeps_thinking_apart_and_reports_it(server):
    r = oai(server).chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=64,
                                            extra_body={"hearth": {"reasoning_budget": 32}})
    msg = r.choices[0].message
    thinking = msg.model_extra.get("reasoning_content")
    assert thinking and "<think>" not in thinking and "</think>" not in thinking
    assert isinstance(msg.content, str) and "<think>" not in msg.content and "</think>" not in msg.content
    reasoning = r.usage.completion_tokens_details.reasoning_tokens
    assert 0 < reasoning <= 32 + MARKER_TOKENS
    m = r.model_extra["hearth"]["metrics"]
    assert m["reasoning_tokens"] == reasoning and m["reasoning_budget"] == 32
    assert m["reasoning_forced"] is True and m["reasoning_stopped_by"] == "budget"
    assert m["reasoning_tokens"] + m["answer_tokens"] == r.usage.completion_tokens
    if msg.content:
        assert m["ttfat_s"] is not None and m["ttft_s"] <= m["ttfat_s"] <= m["total_s"]


def test_stop_thinking_mid_stream(server):
    stream = oai(server).chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=80,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"hearth": {"reasoning_budget": 400}})
    chunks, thinking, answer, stopped, at_stop = [], [], "", None, 0
    for ch in stream:
        chunks.append(ch)
        if not ch.choices:
            continue
        delta = ch.choices[0].delta
        piece = (delta.model_extra or {}).get("reasoning_content")
        if piece:
            thinking.append(piece)
            assert not delta.content
        answer += delta.content or ""
        if stopped is None and len(thinking) >= 4:
            r = httpx.post(f"{server.url}/v1/hearth/requests/{ch.id}/stop_thinking", timeout=10)
            assert r.status_code == 200, r.text
            stopped, at_stop = r.json(), len(thinking)
    assert stopped == {"id": chunks[0].id, "object": "hearth.stop_thinking", "stopped": True}
    # The stop lands while the client still reads chunks the server already sent (on a loaded 2-core runner, 4
    # more were in flight): a few more thinking chunks, then the answer. Without the stop the thinking would run
    # to max_tokens (budget 400 > 80) and the answer would be empty.
    assert len(thinking) <= at_stop + 16
    assert answer.strip()
    hearth = next(ch.model_extra["hearth"] for ch in chunks if ch.choices and ch.choices[0].finish_reason)
    assert hearth["metrics"]["reasoning_stopped_by"] == "user" and hearth["metrics"]["ttfat_s"] is not None
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens < 400
    r = httpx.post(f"{server.url}/v1/hearth/requests/{chunks[0].id}/stop_thinking", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "request_not_found"
