"""``/v1/messages`` (Anthropic's Messages API) through the official ``anthropic`` client: the fake engine for
shapes, blocks, events, tools, errors and the key; the real bundled model for the issue's "Must show"
(``anthropic.Anthropic(base_url=...).messages.create(...)``, streamed and not)."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from fakes import FakeEngine

from app.engine.local.engine import Engine
from app.protocol.types import LoadSettings
from app.server import ServerThread, create_app
from app.server.models import ModelCatalog
from app.settings import ServerSettings

CATALOG = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_TEXT = 'Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}'
HI = [{"role": "user", "content": "hi"}]


def client(srv, key="unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def fake():
    replies: dict = {}

    def reply(req):
        if req.tools and replies.get("call"):
            return replies["call"]
        return replies.get("text") or "echo: " + req.messages[-1].content

    eng = FakeEngine(n_ctx=4096, reply=reply)
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        yield eng, srv, replies


def test_message_system_blocks_and_usage(fake):
    eng, srv, _ = fake
    m = client(srv).messages.create(model="fake-model", max_tokens=64, system=[{"type": "text", "text": "be kind"}],
                                    messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == "fake-model"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == "echo: hello"
    assert m.stop_reason == "end_turn" and m.usage.output_tokens == len("echo: hello") and m.usage.input_tokens > 0
    assert [(x.role, x.content) for x in eng.seen[-1].messages] == [("system", "be kind"), ("user", "hello")]
    m = client(srv).messages.create(model="fake-model", max_tokens=3, messages=HI)
    assert m.stop_reason == "max_tokens" and m.content[0].text == "ech"


def test_stream_events(fake):
    _eng, srv, _ = fake
    with client(srv).messages.stream(model="fake-model", max_tokens=64, messages=HI) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert final.content[0].text == "echo: hi" and final.stop_reason == "end_turn"
    raw = list(client(srv).messages.create(model="fake-model", max_tokens=64, messages=HI, stream=True))
    assert "".join(e.delta.text for e in raw if e.type == "content_block_delta") == "echo: hi"


def test_tool_use_and_tool_result(fake):
    eng, srv, replies = fake
    c = client(srv)
    replies["call"] = CALL_TEXT
    try:
        m = c.messages.create(model="fake-model", max_tokens=200, tools=[WEATHER],
                              messages=[{"role": "user", "content": "Weather in Paris?"}])
        (use,) = m.content
        assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
        assert m.stop_reason == "tool_use"
        with c.messages.stream(model="fake-model", max_tokens=200, tools=[WEATHER],
                               messages=[{"role": "user", "content": "Weather in Paris?"}]) as s:
            events = list(s)
            final = s.get_final_message()
        assert final.content[0].type == "tool_use" and final.content[0].input == {"city": "Paris"}
        assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
        forced = c.messages.create(model="fake-model", max_tokens=200, tools=[WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"}, messages=HI)
        assert forced.stop_reason == "tool_use" and eng.seen[-1].tool_choice.mode != "auto"
    finally:
        replies["call"] = None
    m = c.messages.create(model="fake-model", max_tokens=200, tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C"}]}])
    msgs = eng.seen[-1].messages
    assert [x.role for x in msgs] == ["user", "assistant", "tool"]
    assert msgs[1].content == "Let me look." and msgs[1].tool_calls[0].id == use.id and msgs[2].content == "18C"
    assert m.content[0].text == "echo: 18C"


def test_thinking_block(fake):
    _eng, srv, replies = fake
    replies["text"] = "<think>plan</think>answer"
    try:
        m = client(srv).messages.create(model="fake-model", max_tokens=200, messages=HI,
                                        thinking={"type": "enabled", "budget_tokens": 64})
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == "plan" and m.content[1].text == "answer"
    finally:
        replies["text"] = None


@pytest.mark.parametrize("body,status,kind", [
    ({"messages": HI}, 400, "invalid_request_error"),  # no max_tokens
    ({"max_tokens": 0, "messages": HI}, 400, "invalid_request_error"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error"),
    ({"max_tokens": 8, "messages": HI, "model": "claude-3-opus"}, 404, "not_found_error"),
    ({"max_tokens": "8", "messages": HI}, 400, "invalid_request_error"),  # a string is not coerced
    ({"max_tokens": 8, "messages": HI, "thinking": {"type": "enabled"}}, 400, "invalid_request_error"),
    ({"max_tokens": 8, "messages": HI, "thinking": {"type": "enabled", "budget_tokens": -1}}, 400,
     "invalid_request_error"),
])
def test_errors_in_anthropic_shape(fake, body, status, kind):
    _eng, srv, _ = fake
    r = httpx.post(f"{srv.url}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == status, r.text
    j = r.json()
    assert j["type"] == "error" and j["error"]["type"] == kind and j["error"]["message"]
    if body.get("max_tokens") is None or isinstance(body.get("max_tokens"), str):
        assert "max_tokens" in j["error"]["message"]
    if "thinking" in body:
        assert "thinking.budget_tokens" in j["error"]["message"]


def test_x_api_key_is_accepted_like_the_bearer_key():
    eng = FakeEngine()
    with ServerThread(create_app(eng, ServerSettings(api_key="sekrit"), catalog=CATALOG)) as srv:
        assert client(srv, "sekrit").messages.create(model="fake-model", max_tokens=8, messages=HI).content
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(srv, "wrong").messages.create(model="fake-model", max_tokens=8, messages=HI)
        assert e.value.body["error"]["type"] == "authentication_error"
        r = httpx.get(f"{srv.url}/v1/models", headers={"x-api-key": "sekrit"})
        assert r.status_code == 200


# -- the real bundled model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048), max_queue=4)
    eng.load()
    with ServerThread(create_app(eng, ServerSettings())) as srv:
        yield srv
    eng.close()


@pytest.mark.model
def test_real_messages_create_and_stream(real):
    c = anthropic.Anthropic(base_url=real.url, api_key="unused", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    m = c.messages.create(model="gemma-3-270m-q4_k_m", max_tokens=12, messages=ask,
                          extra_body={"temperature": 0})  # this client version has no temperature argument
    assert "Paris" in m.content[0].text and m.stop_reason in ("end_turn", "max_tokens")
    with c.messages.stream(model="gemma-3-270m-q4_k_m", max_tokens=12, messages=ask,
                           extra_body={"temperature": 0}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.usage.output_tokens == m.usage.output_tokens
