"""Issue 29, "nothing one request can do takes Hearth down": the limits a request meets before anything
expensive runs (docs/server.md, "Limits"). ``FakeEngine`` behind a real ``ServerThread`` on 127.0.0.1, and the
``openai`` client where it is natural."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from fakes import FakeEngine

from app.errors import QueueFull
from app.server import ServerThread, create_app
from app.server.models import ModelCatalog
from app.settings import ServerSettings

CATALOG = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
USER = [{"role": "user", "content": "hi"}]
HUGE = "^[a-z]{0,100000000}$"  # 205 bytes of request that froze the server for 9.3 s and grew it to 2.9 GB


@pytest.fixture(scope="module")
def srv():
    with ServerThread(create_app(FakeEngine(), ServerSettings(), catalog=CATALOG)) as s:
        yield s


def post(srv, path: str, body, **kw) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, timeout=60, **kw)


def schema(pattern: str = HUGE) -> dict:
    return {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}, "required": ["x"]}


def rf(s: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": s, "strict": True}}


# -- 1. grammar-size drivers are bounded before a grammar is built --------------------------------------------
def test_huge_pattern_in_response_format_is_a_quick_400_naming_the_field(srv):
    c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    t0 = time.monotonic()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="fake-model", messages=USER, response_format=rf(schema()))
    assert time.monotonic() - t0 < 2.0
    err = e.value.body
    assert err["param"] == "response_format" and err["code"] == "invalid_value"
    assert ("response_format.json_schema.schema.properties.x.pattern: a repetition bound of 100000000 is over "
            "the limit of 256") in err["message"]


@pytest.mark.parametrize("where", ["tools", "responses", "anthropic_format", "anthropic_tool", "ollama"])
def test_huge_pattern_is_refused_at_every_schema_entry_point(srv, where):
    s = schema()
    tool = {"type": "function", "function": {"name": "f", "parameters": s}}
    path, body = {
        "tools": ("/v1/chat/completions", {"messages": USER, "tools": [tool], "tool_choice": "required"}),
        "responses": ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "r",
                                                                          "schema": s}}}),
        "anthropic_format": ("/v1/messages", {"max_tokens": 10, "messages": USER,
                                              "output_config": {"format": {"type": "json_schema", "schema": s}}}),
        "anthropic_tool": ("/v1/messages", {"max_tokens": 10, "messages": USER, "tool_choice": {"type": "any"},
                                            "tools": [{"name": "f", "input_schema": s}]}),
        "ollama": ("/api/chat", {"model": "fake-model", "messages": USER, "format": s, "stream": False}),
    }[where]
    t0 = time.monotonic()
    r = post(srv, path, body)
    assert time.monotonic() - t0 < 2.0
    assert r.status_code == 400, r.text
    assert "a repetition bound of 100000000 is over the limit of 256" in r.text


@pytest.mark.parametrize("bad", [{"type": "string", "maxLength": 10**9}, {"type": "array", "minItems": 100000},
                                 {"type": "string", "pattern": "^(ab){3,}x{2}[a-z]{1000}$"}])
def test_other_repetition_bounds_are_refused(srv, bad):
    s = {"type": "object", "properties": {"x": bad}}
    r = post(srv, "/v1/chat/completions", {"messages": USER, "response_format": rf(s)})
    assert r.status_code == 400 and "over the limit of 256" in r.json()["error"]["message"], r.text


def test_bounds_adding_up_are_refused_and_small_ones_pass(srv):
    many = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 200} for i in range(40)}}
    r = post(srv, "/v1/chat/completions", {"messages": USER, "response_format": rf(many)})
    assert r.status_code == 400 and "over the limit of 4096" in r.json()["error"]["message"], r.text
    ok = schema(r"^\d{3}-[a-z]{2,8}\{1000000\}[{]$")  # escaped and bracketed braces are no quantifiers
    r = post(srv, "/v1/chat/completions", {"messages": USER, "response_format": rf(ok)})
    assert r.status_code != 400 or "repetition" not in r.text, r.text


# -- 3. admission: a burst gets n_parallel + max_queue places ----------------------------------------------------
def test_a_burst_gets_the_sum_of_slots_and_queue_places():
    # No request admitted by the scheduler yet (a burst): n_parallel may start and max_queue may wait.
    eng = FakeEngine(n_parallel=4, max_queue=2)
    try:
        for _ in range(6):
            eng._enter()
        with pytest.raises(QueueFull):
            eng._enter()
    finally:
        eng.close()
