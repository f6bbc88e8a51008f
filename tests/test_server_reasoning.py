"""Thinking, budgets, stop thinking, self-consistency and speculative fields on the port (issue 14), over
``FakeEngine`` (``tests/fakes.py``: a request with ``reasoning`` set reads ``<think>…</think>`` in its scripted
reply as thinking, through the real ``BudgetForcer``).

What is checked: each bad field is a 400 naming it; the fields reach ``GenerateRequest`` (the model default
as the last layer); ``reasoning_content`` apart from ``content`` in whole and streamed answers (chat and
completions) and in usage; the tool-call reader sees answer text only; the stop_thinking endpoint (200 true /
false, 404 in OpenAI's shape, the key); the registry of running requests empty after an answer, an error and a
disconnect; self-consistency's vote, candidates and usage. No model, 127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from fakes import FakeEngine
from fastapi.testclient import TestClient

from app.errors import QueueFull
from app.server import ServerThread, create_app
from app.server.models import ModelCatalog
from app.settings import ServerSettings

CATALOG = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
USER = [{"role": "user", "content": "hi"}]
THOUGHT = "<think>plan the answer</think>the answer"
CALL_TEXT = 'Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def make(reply=None, **kw):
    eng = FakeEngine(reply=reply or (lambda r: THOUGHT), token_delay_s=kw.pop("token_delay_s", 0.0))
    app = create_app(eng, kw.pop("settings", None) or ServerSettings(), catalog=CATALOG, **kw)
    return eng, app, TestClient(app, base_url="http://127.0.0.1:8765", raise_server_exceptions=False)


@pytest.fixture(scope="module")
def fake():
    return make()


def running(app) -> list[str]:
    return app.state.hearth.service.running.ids()


def events(raw: bytes) -> list[dict]:
    frames = raw.decode("utf-8")[:-2].split("\n\n")
    assert frames[-1] == "data: [DONE]"
    return [json.loads(f[6:]) for f in frames[:-1]]


def err(r: httpx.Response, status: int, param=None, code=None) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) >= {"message", "type", "param", "code"}
    if param is not None:
        assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code
    return e


# -- parsing ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,param", [
    ({"reasoning_effort": "huge"}, "reasoning_effort"),
    ({"reasoning_effort": 5}, "reasoning_effort"),
    ({"reasoning_effort": ["low"]}, "reasoning_effort"),
    ({"hearth": {"reasoning_budget": -1}}, "hearth.reasoning_budget"),
    ({"hearth": {"reasoning_budget": "32"}}, "hearth.reasoning_budget"),
    ({"hearth": {"reasoning_budget": True}}, "hearth.reasoning_budget"),
    ({"hearth": {"reasoning_budget": 2**21}}, "hearth.reasoning_budget"),
    ({"hearth": {"reasoning_deadline_s": 0}}, "hearth.reasoning_deadline_s"),
    ({"hearth": {"reasoning_deadline_s": "1"}}, "hearth.reasoning_deadline_s"),
    ({"hearth": {"answer_now": 5}}, "hearth.answer_now"),
    ({"hearth": {"answer_now": "x" * 201}}, "hearth.answer_now"),
    ({"hearth": {"speculative": "fast"}}, "hearth.speculative"),
    ({"hearth": {"reasoning_bugdet": 3}}, "hearth.reasoning_bugdet"),
    ({"hearth": {"self_consistency": 3}}, "hearth.self_consistency"),
    ({"hearth": {"self_consistency": {"n": 0}}}, "hearth.self_consistency.n"),
    ({"hearth": {"self_consistency": {"n": 3, "samples": 2}}}, "hearth.self_consistency.samples"),
    ({"hearth": {"self_consistency": {"n": 3, "extract": "first"}}}, "hearth.self_consistency.extract"),
    ({"hearth": {"self_consistency": {"n": 3, "verifier": {"command": ["true"]}}}},
     "hearth.self_consistency.verifier"),
    ({"n": 2, "hearth": {"self_consistency": {"n": 3}}}, "n"),
    ({"stream": True, "hearth": {"self_consistency": {"n": 3}}}, "stream"),
    ({"temperature": 0, "hearth": {"self_consistency": {"n": 3}}}, "temperature"),
    ({"logprobs": True, "hearth": {"self_consistency": {"n": 3}}}, "logprobs"),
    ({"tools": [WEATHER], "hearth": {"self_consistency": {"n": 3}}}, "tools"),
])
def test_bad_fields_are_400_naming_them(fake, extra, param):
    _eng, _app, c = fake
    err(c.post("/v1/chat/completions", json={"messages": USER, **extra}), 400, param, "invalid_value")


@pytest.mark.parametrize("extra,param", [
    ({"reasoning_effort": "max"}, "reasoning_effort"),
    ({"hearth": {"reasoning_budget": 1.5}}, "hearth.reasoning_budget"),
    ({"hearth": {"speculative": True}}, "hearth.speculative"),
    ({"prompt": ["a", "b"], "hearth": {"self_consistency": {"n": 2}}}, "prompt"),
])
def test_bad_fields_on_completions(fake, extra, param):
    _eng, _app, c = fake
    err(c.post("/v1/completions", json={"prompt": "x", **extra}), 400, param)


def test_a_bad_model_default_names_the_field_and_the_layer():
    _eng, _app, c = make(reasoning_defaults={"reasoning_effort": "lots"})
    e = err(c.post("/v1/chat/completions", json={"messages": USER}), 400, "reasoning_effort")
    assert "model" in e["message"]


def test_fields_reach_the_engine(fake):
    eng, _app, c = fake
    c.post("/v1/chat/completions", json={"messages": USER, "hearth": {
        "reasoning_budget": 32, "reasoning_deadline_s": 5, "answer_now": "Final answer:",
        "speculative": "prompt_lookup"}})
    req = eng.seen[-1]
    assert req.reasoning.budget.tokens == 32 and req.reasoning.budget.source == "request"
    assert req.reasoning.budget.deadline_s == 5 and req.reasoning.answer_now == "Final answer:"
    assert req.speculative == "prompt_lookup"
    c.post("/v1/chat/completions", json={"messages": USER, "reasoning_effort": "low"})
    assert eng.seen[-1].reasoning.budget.tokens == 256 and eng.seen[-1].reasoning.budget.effort == "low"
    c.post("/v1/completions", json={"prompt": "x", "reasoning_effort": "none"})
    assert eng.seen[-1].reasoning.budget.off
    c.post("/v1/chat/completions", json={"messages": USER, "reasoning_effort": None})
    assert eng.seen[-1].reasoning is None and eng.seen[-1].speculative is None


def test_model_default_is_the_last_layer():
    asked = []

    def defaults(model_id):
        asked.append(model_id)
        return {"reasoning_effort": "medium", "reasoning_deadline_s": 9}

    eng, _app, c = make(reasoning_defaults=defaults)
    c.post("/v1/chat/completions", json={"messages": USER})
    b = eng.seen[-1].reasoning.budget
    assert (b.tokens, b.source, b.deadline_s) == (1024, "model", 9) and asked == ["fake-model"]
    c.post("/v1/chat/completions", json={"messages": USER, "hearth": {"reasoning_budget": 7}})
    b = eng.seen[-1].reasoning.budget
    assert (b.tokens, b.source, b.deadline_s) == (7, "request", 9)


def test_model_default_from_settings_per_model():
    from app.server.app import settings_reasoning_defaults
    from app.settings import UserSettings

    lookup = settings_reasoning_defaults(UserSettings(per_model={"fake-model": {"reasoning_budget": 12,
                                                                                "n_ctx": 2048}}))
    assert lookup("fake-model") == {"reasoning_budget": 12} and lookup("other-model") is None
    eng, _app, c = make(reasoning_defaults=lookup)
    c.post("/v1/chat/completions", json={"messages": USER})
    assert (eng.seen[-1].reasoning.budget.tokens, eng.seen[-1].reasoning.budget.source) == (12, "model")


# -- answers ------------------------------------------------------------------------------------------------
def test_whole_answer_keeps_reasoning_apart(fake):
    _eng, app, c = fake
    j = c.post("/v1/chat/completions", json={"messages": USER, "reasoning_effort": "low"}).json()
    msg = j["choices"][0]["message"]
    assert msg["reasoning_content"] == "plan the answer" and msg["content"] == "the answer"
    u = j["usage"]
    reasoning = u["completion_tokens_details"]["reasoning_tokens"]
    assert reasoning == len("<think>plan the answer</think>") and u["completion_tokens"] == len(THOUGHT)
    m = j["hearth"]["metrics"]
    assert m["reasoning_tokens"] == reasoning and m["answer_tokens"] == len("the answer")
    assert m["ttfat_s"] is not None and m["ttfat_s"] >= 0 and m["reasoning_forced"] is False
    assert 0 < m["reasoning_budget"] <= 256 and m["reasoning_stopped_by"] is None  # fitted to the context
    assert {"thinking_s", "reasoning_unclosed", "spec_mode", "spec_drafted", "spec_accepted", "spec_steps",
            "acceptance_rate"} <= set(m)
    assert running(app) == []


def test_no_thinking_leaves_the_field_out(fake):
    _eng, _app, c = fake
    j = c.post("/v1/chat/completions", json={"messages": USER}).json()  # no reasoning asked: text as is
    assert "reasoning_content" not in j["choices"][0]["message"]
    assert j["choices"][0]["message"]["content"] == THOUGHT
    assert j["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert j["hearth"]["metrics"]["reasoning_tokens"] == 0


def test_budget_forcing_caps_thinking():
    _eng, _app, c = make(reply=lambda r: "<think>" + "x" * 100 + "</think>done")
    j = c.post("/v1/chat/completions", json={"messages": USER, "hearth": {"reasoning_budget": 5}}).json()
    m = j["hearth"]["metrics"]
    assert m["reasoning_forced"] is True and m["reasoning_stopped_by"] == "budget"
    assert m["reasoning_tokens"] <= 5 + len("<think>")
    msg = j["choices"][0]["message"]
    assert msg["content"] == "done" and len(msg["reasoning_content"]) <= 5


def test_stream_sends_reasoning_in_its_own_chunks(fake):
    _eng, app, c = fake
    r = c.post("/v1/chat/completions", json={"messages": USER, "stream": True, "reasoning_effort": "low",
                                              "stream_options": {"include_usage": True}})
    ev = events(r.content)
    ids = {e["id"] for e in ev}
    assert len(ids) == 1 and ev[0]["id"].startswith("chatcmpl-")
    deltas = [e["choices"][0]["delta"] for e in ev if e["choices"]]
    thinking = [d for d in deltas if "reasoning_content" in d]
    answer = [d for d in deltas[1:] if d.get("content")]
    assert thinking and answer and not any("content" in d for d in thinking)
    assert not any("reasoning_content" in d for d in answer)
    assert "".join(d["reasoning_content"] for d in thinking) == "plan the answer"
    assert "".join(d["content"] for d in answer) == "the answer"
    last = deltas.index(answer[0])
    assert all("reasoning_content" not in d for d in deltas[last:])  # thinking came first
    assert ev[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == len("<think>plan the answer</think>")
    assert running(app) == []


def test_completions_reasoning_whole_and_streamed(fake):
    _eng, _app, c = fake
    body = {"prompt": "Q:", "hearth": {"reasoning_budget": 64}}
    ch = c.post("/v1/completions", json=body).json()["choices"][0]
    assert ch["text"] == "the answer" and ch["reasoning_content"] == "plan the answer"
    ev = events(c.post("/v1/completions", json={**body, "stream": True}).content)
    assert "".join(e["choices"][0].get("reasoning_content", "") for e in ev) == "plan the answer"
    assert "".join(e["choices"][0]["text"] for e in ev) == "the answer"


def test_tool_reader_sees_the_answer_only():
    _eng, _app, c = make(reply=lambda r: f"<think>{CALL_TEXT}</think>No call.")
    j = c.post("/v1/chat/completions", json={"messages": USER, "tools": [WEATHER], "reasoning_effort": "low"}).json()
    ch = j["choices"][0]
    assert ch["finish_reason"] == "stop" and "tool_calls" not in ch["message"]
    assert ch["message"]["content"] == "No call." and ch["message"]["reasoning_content"] == CALL_TEXT
    _eng, _app, c = make(reply=lambda r: f"<think>Let me look it up.</think>{CALL_TEXT}")
    for stream in (False, True):
        r = c.post("/v1/chat/completions", json={"messages": USER, "tools": [WEATHER], "reasoning_effort": "low",
                                                  "stream": stream})
        if stream:
            ev = events(r.content)
            calls = [tc for e in ev for tc in e["choices"][0]["delta"].get("tool_calls", [])]
            assert calls[0]["function"]["name"] == "get_weather" and ev[-1]["choices"][0]["finish_reason"] == \
                "tool_calls"
        else:
            msg = r.json()["choices"][0]["message"]
            assert msg["tool_calls"][0]["function"]["name"] == "get_weather"
            assert msg["reasoning_content"] == "Let me look it up."


def test_openai_client_reads_reasoning_content():
    eng = FakeEngine(reply=lambda r: THOUGHT)
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        oai = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=30)
        r = oai.chat.completions.create(model="fake-model", messages=USER, reasoning_effort="low")
        assert r.choices[0].message.model_extra["reasoning_content"] == "plan the answer"
        assert r.usage.completion_tokens_details.reasoning_tokens == len("<think>plan the answer</think>")
        thinking = answer = ""
        for ch in oai.chat.completions.create(model="fake-model", messages=USER, stream=True,
                                              extra_body={"hearth": {"reasoning_budget": 100}}):
            thinking += (ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            answer += ch.choices[0].delta.content or ""
        assert (thinking, answer) == ("plan the answer", "the answer")


# -- stop thinking and the registry --------------------------------------------------------------------------
LONG = "<think>" + "t" * 1500 + "</think>" + "a" * 20  # fits n_ctx 4096; a budget fitted to it is ~2000


@pytest.fixture(scope="module")
def slow():
    eng = FakeEngine(n_ctx=4096, token_delay_s=0.005,
                     reply=lambda r: LONG if r.messages[-1].content == "think" else "x" * 2000)
    app = create_app(eng, ServerSettings(), catalog=CATALOG)
    with ServerThread(app) as srv:
        yield eng, app, srv


def _stream(url: str, content: str, **extra):
    body = {"messages": [{"role": "user", "content": content}], "stream": True, **extra}
    return httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30, json=body)


def _wait_empty(app, timeout_s: float = 5.0) -> None:
    deadline = time.time() + timeout_s
    while running(app) and time.time() < deadline:
        time.sleep(0.02)
    assert running(app) == []


def test_stop_thinking_mid_stream(slow):
    _eng, app, srv = slow
    thinking, answer, rid, stopped = "", "", None, None
    with _stream(srv.url, "think", hearth={"reasoning_budget": 100000}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            e = json.loads(line[6:])
            rid = rid or e["id"]
            d = e["choices"][0]["delta"]
            thinking += d.get("reasoning_content") or ""
            answer += d.get("content") or ""
            if stopped is None and len(thinking) >= 20:
                assert rid in running(app)
                s = httpx.post(f"{srv.url}/v1/hearth/requests/{rid}/stop_thinking", timeout=10)
                assert s.status_code == 200, s.text
                stopped = s.json()
                at_stop = len(thinking)
    assert stopped == {"id": rid, "object": "hearth.stop_thinking", "stopped": True}
    assert answer == "a" * 20
    assert at_stop <= len(thinking) < at_stop + 100  # a few tokens in flight, then the answer: not 3000
    _wait_empty(app)
    err(httpx.post(f"{srv.url}/v1/hearth/requests/{rid}/stop_thinking", timeout=10), 404, "id", "request_not_found")


def test_stop_thinking_after_thinking_ended_is_false(slow):
    _eng, app, srv = slow
    with _stream(srv.url, "plain", max_tokens=1500) as r:  # no reasoning asked: nothing to stop
        for line in r.iter_lines():
            if line.startswith("data: {"):
                rid = json.loads(line[6:])["id"]
                s = httpx.post(f"{srv.url}/v1/hearth/requests/{rid}/stop_thinking", timeout=10)
                assert s.status_code == 200 and s.json()["stopped"] is False
                break
    _wait_empty(app)


def test_stop_thinking_unknown_id_and_key():
    eng, app, c = make(settings=ServerSettings(api_key="k"))
    err(c.post("/v1/hearth/requests/chatcmpl-nope/stop_thinking"), 401)
    e = err(c.post("/v1/hearth/requests/chatcmpl-nope/stop_thinking", headers={"Authorization": "Bearer k"}),
            404, "id", "request_not_found")
    assert "chatcmpl-nope" in e["message"]
    err(c.get("/v1/hearth/requests/chatcmpl-nope/stop_thinking", headers={"Authorization": "Bearer k"}), 405)


def test_registry_is_empty_after_errors_and_a_disconnect(slow):
    eng, app, srv = slow
    eng.fail_next = QueueFull(1, 1.0)
    with _stream(srv.url, "think") as r:
        assert r.status_code == 429
    _wait_empty(app)
    before = eng.stats.cancelled
    with _stream(srv.url, "think", reasoning_effort="high") as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                assert len(running(app)) == 1
                break
    _wait_empty(app)
    deadline = time.time() + 5
    while eng.stats.cancelled == before and time.time() < deadline:
        time.sleep(0.02)
    assert eng.stats.cancelled > before


def test_stop_thinking_after_waiting_for_the_slot(slow):
    """A request that waited behind another is stopped like any other once it thinks."""
    eng, app, srv = slow
    out: dict = {}

    def first():
        with _stream(srv.url, "plain", max_tokens=150) as r:
            r.read()

    t = threading.Thread(target=first)
    t.start()
    assert eng.started.wait(5)
    with _stream(srv.url, "think", reasoning_effort="high") as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                e = json.loads(line[6:])
                d = e["choices"][0]["delta"]
                out["thinking"] = out.get("thinking", "") + (d.get("reasoning_content") or "")
                if "stopped" not in out and d.get("reasoning_content"):
                    out["stopped"] = httpx.post(f"{srv.url}/v1/hearth/requests/{e['id']}/stop_thinking").json()
                out["answer"] = out.get("answer", "") + (d.get("content") or "")
    t.join(10)
    assert out["stopped"]["stopped"] is True and out["answer"] == "a" * 20 and len(out["thinking"]) < 200
    _wait_empty(app)


# -- self-consistency ---------------------------------------------------------------------------------------
def _by_seed(req):
    seed = req.decoding.seed
    return "<think>work</think>The answer is 5." if seed in (11, 13) else "<think>hm</think>The answer is 7."


def test_self_consistency_votes_and_reports_every_sample():
    eng, app, c = make(reply=_by_seed)
    body = {"messages": USER, "seed": 11, "temperature": 0.7, "reasoning_effort": "low",
            "hearth": {"self_consistency": {"n": 3, "verifier": {"regex": "[0-9]+"}}}}
    j = c.post("/v1/chat/completions", json=body).json()
    msg = j["choices"][0]["message"]
    assert msg["content"] == "The answer is 5." and msg["reasoning_content"] == "work"
    sc = j["hearth"]["self_consistency"]
    assert sc["answer"] == "5" and sc["counts"] == {"5": 2, "7": 1} and sc["chosen_index"] == 0
    assert sc["pool"] == "accepted" and len(sc["candidates"]) == 3
    assert [cd["answer"] for cd in sc["candidates"]] == ["5", "7", "5"]
    assert all(cd["accepted"] is True for cd in sc["candidates"])
    assert sorted(r.decoding.seed for r in eng.seen[-3:]) == [11, 12, 13]
    each = [len(_by_seed(r)) for r in eng.seen[-3:]]
    assert j["usage"]["completion_tokens"] == sum(each) == sc["completion_tokens"]
    assert j["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2 * len("<think>work</think>") + len(
        "<think>hm</think>")
    assert running(app) == []


def test_self_consistency_on_completions_and_command_verifier_behind_a_setting():
    _eng, _app, c = make(reply=_by_seed, allow_command_verifier=True)
    body = {"prompt": "Q: 2+3?\nA:", "seed": 12, "temperature": 0.7,
            "hearth": {"self_consistency": {"n": 2, "verifier": {"command": ["true"]}}}}
    j = c.post("/v1/completions", json=body).json()
    assert j["choices"][0]["text"] == "<think>hm</think>The answer is 7."  # no reasoning asked: text as is
    sc = j["hearth"]["self_consistency"]
    assert (sc["n"], sc["accepted"], sc["tie"], sc["answer"]) == (2, 2, True, "7")


def test_self_consistency_samples_are_registered_stopped_and_cancelled_with_the_client():
    eng = FakeEngine(n_ctx=4096, token_delay_s=0.005, n_parallel=2, reply=lambda r: LONG)
    app = create_app(eng, ServerSettings(), catalog=CATALOG)
    body = {"messages": USER, "temperature": 0.7, "seed": 1, "reasoning_effort": "high",
            "hearth": {"self_consistency": {"n": 2}}}
    with ServerThread(app) as srv:
        out: dict = {}

        def ask():
            out["r"] = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30)

        t = threading.Thread(target=ask)
        t.start()
        deadline = time.time() + 5
        while (not running(app) or len(app.state.hearth.service.running.get(running(app)[0]).generations()) < 2) \
                and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # both samples thinking
        rid = running(app)[0]
        s = httpx.post(f"{srv.url}/v1/hearth/requests/{rid}/stop_thinking", timeout=10).json()
        t.join(30)
        assert s["stopped"] is True
        j = out["r"].json()
        assert j["id"] == rid and j["choices"][0]["message"]["content"] == "a" * 20
        assert all(cd["tokens"] < 1000 for cd in j["hearth"]["self_consistency"]["candidates"])
        assert running(app) == []
        before = eng.stats.cancelled
        with pytest.raises(httpx.ReadTimeout):  # the client gives up: every sample is cancelled
            httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=0.5)
        _wait_empty(app)
        deadline = time.time() + 5
        while eng.stats.cancelled < before + 2 and time.time() < deadline:
            time.sleep(0.02)
        assert eng.stats.cancelled >= before + 2
