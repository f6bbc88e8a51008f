"""Continuous batching seen from the adapters, over ``FakeEngine`` (the real scheduler on threads) and real
HTTP on 127.0.0.1: parallel streams and the 429 after the queue, ``hearth.deadline_s``, the slot gauges of
/metrics and /health, and the desktop window's priority over waiting API requests. No model."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from fakes import FakeEngine
from fastapi.testclient import TestClient

from app.assistant import Assistant, Caller
from app.server import ServerThread, create_app
from app.server.models import ModelCatalog
from app.settings import ServerSettings, UserSettings

CATALOG = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
USER = [{"role": "user", "content": "hi"}]


def wait_until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.time() + timeout_s
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.005)


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)


def gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# -- many at once, then 429 ---------------------------------------------------------------------------------
def test_two_streams_run_at_once_a_third_waits_a_fourth_gets_429():
    eng = FakeEngine(n_parallel=2, max_queue=1, token_delay_s=0.01, reply=lambda r: "z" * 150)
    finals: dict = {}

    def stream(tag: str) -> None:
        s = client_for(srv.url).chat.completions.create(model="fake-model", stream=True,
                                                        messages=[{"role": "user", "content": tag}])
        text = ""
        for ch in s:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                if ch.choices[0].finish_reason:
                    finals[tag] = (text, ch.choices[0].finish_reason, ch.model_extra["hearth"]["metrics"])

    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        threads = {t: threading.Thread(target=stream, args=(t,)) for t in "ABC"}
        threads["A"].start()
        threads["B"].start()
        wait_until(lambda: eng.active() == 2)
        threads["C"].start()
        wait_until(lambda: eng.queue_depth() == 1)
        assert eng.active() == 2  # C waits: both slots are busy
        assert gauge(srv.url, "hearth_active_requests") == 2 and gauge(srv.url, "hearth_parallel_slots") == 2
        assert gauge(srv.url, "hearth_queue_depth") == 1
        health = httpx.get(f"{srv.url}/health", timeout=5).json()
        assert (health["n_parallel"], health["active"], health["queue_depth"]) == (2, 2, 1)
        with pytest.raises(openai.RateLimitError) as refused:
            client_for(srv.url).chat.completions.create(model="fake-model", messages=USER)
        assert refused.value.code == "queue_full" and int(refused.value.response.headers["retry-after"]) >= 1
        for t in threads.values():
            t.join(30)
        assert gauge(srv.url, "hearth_active_requests") == 0
    assert {t: (text, fin) for t, (text, fin, _m) in finals.items()} == {t: ("z" * 150, "stop") for t in "ABC"}
    assert finals["A"][2]["batch_peak"] == 2 and finals["B"][2]["batch_peak"] == 2  # decoded together
    assert finals["C"][2]["queue_s"] > 0.1  # it waited for a slot
    assert all(m["stopped_by"] is None for _t, _f, m in finals.values())


# -- hearth.deadline_s ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, "5", True, 1e7, [1], {"s": 1}])
def test_bad_deadline_is_400_naming_it(value):
    c = TestClient(create_app(FakeEngine(), ServerSettings(), catalog=CATALOG), base_url="http://127.0.0.1:8765")
    for path, body in (("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "x"})):
        r = c.post(path, json={**body, "hearth": {"deadline_s": value}})
        assert r.status_code == 400, r.text
        e = r.json()["error"]
        assert e["param"] == "hearth.deadline_s" and "hearth.deadline_s" in e["message"]


def test_deadline_and_port_priority_reach_the_engine():
    eng = FakeEngine()
    c = TestClient(create_app(eng, ServerSettings(), catalog=CATALOG), base_url="http://127.0.0.1:8765")
    assert c.post("/v1/chat/completions", json={"messages": USER, "hearth": {"deadline_s": 2.5}}).status_code == 200
    assert (eng.seen[-1].deadline_s, eng.seen[-1].priority) == (2.5, Caller.PORT.priority)
    assert c.post("/v1/completions", json={"prompt": "x", "hearth": {"deadline_s": 7}}).status_code == 200
    assert eng.seen[-1].deadline_s == 7.0
    assert c.post("/v1/completions", json={"prompt": "x", "hearth": {"deadline_s": None}}).status_code == 200
    assert eng.seen[-1].deadline_s is None and eng.seen[-1].priority == 0


def test_a_deadline_ends_the_answer_with_length_and_says_so():
    eng = FakeEngine(token_delay_s=0.01, reply=lambda r: "y" * 400)
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        c = client_for(srv.url)
        r = c.chat.completions.create(model="fake-model", messages=USER, extra_body={"hearth": {"deadline_s": 0.3}})
        assert r.choices[0].finish_reason == "length" and 0 < len(r.choices[0].message.content) < 400
        h = r.model_extra["hearth"]
        assert h["metrics"]["stopped_by"] == "deadline" and h["metrics"]["completion_tokens"] < 400
        s = c.completions.create(model="fake-model", prompt="p", stream=True,
                                 extra_body={"hearth": {"deadline_s": 0.3}})
        last = [ch for ch in s if ch.choices and ch.choices[0].finish_reason][-1]
        assert last.choices[0].finish_reason == "length"
        assert last.model_extra["hearth"]["metrics"]["stopped_by"] == "deadline"
        whole = c.chat.completions.create(model="fake-model", messages=USER, max_tokens=5)
        assert whole.choices[0].finish_reason == "length"  # max_tokens, not the deadline:
        assert whole.model_extra["hearth"]["metrics"]["stopped_by"] is None


def test_a_deadline_that_passes_in_the_queue_answers_empty_with_length():
    eng = FakeEngine(token_delay_s=0.01, reply=lambda r: "w" * 150)
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        first = threading.Thread(target=lambda: client_for(srv.url).chat.completions.create(
            model="fake-model", messages=USER))
        first.start()
        wait_until(lambda: eng.active() == 1)
        r = client_for(srv.url).chat.completions.create(model="fake-model", messages=USER,
                                                        extra_body={"hearth": {"deadline_s": 0.2}})
        assert eng.active() == 1  # the first still runs: this one never got a slot
        first.join(30)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == ""
    m = r.model_extra["hearth"]["metrics"]
    assert m["stopped_by"] == "deadline" and m["completion_tokens"] == 0 and m["queue_s"] >= 0.2


# -- the window before waiting API requests --------------------------------------------------------------------
@pytest.mark.gui
def test_the_windows_turn_is_admitted_before_a_waiting_api_request(qtbot, memory_store):
    from app.ui.chat_ctl import ChatController
    from app.ui.workers import WorkerPool

    eng = FakeEngine(n_parallel=1, token_delay_s=0.01,
                     reply=lambda r: "a" * 200 if r.messages[-1].content == "api-1" else "ok")

    class Ctl:  # the engine controller's one method the chat controller uses
        current = staticmethod(lambda: eng)

    pool = WorkerPool()
    chat = ChatController(pool, memory_store, Ctl(), lambda: UserSettings())
    api: list = []

    def ask(tag: str) -> None:
        api.append(client_for(srv.url).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": tag}]).choices[0].message.content)

    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        running, waiting = (threading.Thread(target=ask, args=(t,)) for t in ("api-1", "api-2"))
        running.start()
        wait_until(lambda: eng.active() == 1)
        waiting.start()
        wait_until(lambda: eng.queue_depth() == 1)
        cid = memory_store.create_conversation("t")
        with qtbot.waitSignal(chat.finished, timeout=20000) as done:
            assert chat.send(cid, "window")
            wait_until(lambda: eng.queue_depth() == 2)  # both wait behind api-1
        running.join(30)
        waiting.join(30)
    assert pool.shutdown(5000)
    order = [(r.messages[-1].content, r.priority) for r in eng.seen]
    assert order == [("api-1", 0), ("window", 1), ("api-2", 0)], order
    assert done.args[0].result.text == "ok" and sorted(api) == ["a" * 200, "ok"]


def test_assistant_requests_carry_their_callers_priority(memory_store):
    eng = FakeEngine()
    for caller, priority in ((Caller.WINDOW, 1), (Caller.CLI, 0), (Caller.PORT, 0)):
        a = Assistant(eng, memory_store, caller=caller)
        a.send(a.new_conversation(), "hello")
        assert eng.seen[-1].priority == priority
    a = Assistant(eng, memory_store)  # no caller: a terminal's
    a.send(a.new_conversation(), "hello")
    assert eng.seen[-1].priority == 0
