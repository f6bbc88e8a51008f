"""Function calling on the port (issue 13) through the official ``openai`` client.

Two tiers. Fake: the server over ``FakeEngine`` with a scripted answer, for the OpenAI shapes (whole and
streamed), the invalid-call fallback and the 400s (no model). Real (``model`` marker): the bundled Gemma 3
270M base model behind a Hearth server on 127.0.0.1 and a free port, greedy and short: a forced call
(``required`` and a named function) validates against its schema, the streamed call accumulates to the
whole one, a round trip ends in a text answer, two tools with parallel calls, and each bad input is a 400
naming its field, the context overflow by the tools included.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from fakes import FakeEngine

from app.engine.local.engine import Engine
from app.protocol.types import LoadSettings
from app.server import ServerThread, create_app
from app.server.models import ModelCatalog
from app.settings import ServerSettings

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                  "additionalProperties": False}
STOCK_PARAMS = {"type": "object", "properties": {"symbol": {"type": "string"}}, "required": ["symbol"],
                "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": WEATHER_PARAMS, "strict": True}}
STOCK = {"type": "function", "function": {"name": "get_stock_price", "description": "Latest price of a stock",
                                          "parameters": STOCK_PARAMS, "strict": True}}
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_stock_price": STOCK_PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TEXT = 'Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}'


def oai(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)


def accumulate(stream) -> tuple[str, list[dict], str, list]:
    """Join a streamed answer the way clients do: content, tool calls by index, the finish reason."""
    chunks = list(stream)
    text, calls, finish = "", {}, None
    for ch in chunks:
        if not ch.choices:
            continue
        c = ch.choices[0]
        text += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            got = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                got["id"], got["name"] = tc.id, tc.function.name
            got["arguments"] += tc.function.arguments or ""
        finish = c.finish_reason or finish
    return text, [calls[i] for i in sorted(calls)], finish, chunks


def whole_calls(message) -> list[dict]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in message.tool_calls or []]


# -- fake engine: shapes --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake():
    replies = {"answer": CALL_TEXT}
    eng = FakeEngine(reply=lambda req: replies["answer"] if req.tools else "plain")
    catalog = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
    with ServerThread(create_app(eng, ServerSettings(), catalog=catalog)) as srv:
        yield eng, srv, replies


def test_fake_call_whole_and_streamed_in_openai_shapes(fake):
    eng, srv, replies = fake
    replies["answer"] = CALL_TEXT
    c = oai(srv)
    r = c.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER, STOCK])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) == 29
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert eng.seen[-1].tools[0].name == "get_weather" and eng.seen[-1].tool_choice.mode == "auto"
    text, calls, finish, chunks = accumulate(c.chat.completions.create(
        model="fake-model", messages=ASK, tools=[WEATHER], stream=True))
    assert (text, finish) == ("", "tool_calls")
    assert [(x["name"], x["arguments"]) for x in calls] == [("get_weather", call.function.arguments)]
    first = next(ch.choices[0].delta.tool_calls[0] for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls)
    assert first.function.arguments == "" and first.type == "function" and first.index == 0
    later = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []][1:]
    assert later and all(tc.id is None and tc.function.name is None for tc in later)


def test_fake_text_around_a_call_and_tool_choice_none(fake):
    eng, srv, replies = fake
    replies["answer"] = "Checking. " + CALL_TEXT
    c = oai(srv)
    r = c.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER])
    assert r.choices[0].message.content == "Checking." and r.choices[0].finish_reason == "tool_calls"
    r = c.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.content == replies["answer"] and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_fake_invalid_call_is_text_with_the_reason(fake, stream):
    eng, srv, replies = fake
    replies["answer"] = 'Tool call: {"name": "get_weather", "arguments": {"town": "Paris"}}'
    c = oai(srv)
    kw = dict(model="fake-model", messages=ASK, tools=[WEATHER])
    if stream:
        text, calls, finish, chunks = accumulate(c.chat.completions.create(**kw, stream=True))
        hearth = chunks[-1].model_extra["hearth"]
    else:
        r = c.chat.completions.create(**kw)
        ch = r.choices[0]
        text, calls, finish = ch.message.content, whole_calls(ch.message), ch.finish_reason
        hearth = r.model_extra["hearth"]
    assert (text, calls, finish) == (replies["answer"], [], "stop")
    err = hearth["tool_call_error"]
    assert "'city' is a required property" in err["message"] and err["errors"][0]["name"] == "get_weather"


def test_fake_history_with_calls_and_results_reaches_the_engine(fake):
    eng, srv, replies = fake
    c = oai(srv)
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    c.chat.completions.create(model="fake-model", messages=msgs, tools=[WEATHER], parallel_tool_calls=False)
    req = eng.seen[-1]
    assert [m.role for m in req.messages] == ["user", "assistant", "tool"] and not req.parallel_tool_calls
    assert req.messages[1].tool_calls[0].arguments == '{"city": "Paris"}' and req.messages[1].content == ""
    assert req.messages[2].tool_call_id == "call_1" and req.messages[2].content == "18 C, sunny"


BAD = [
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "fly"}}), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[WEATHER, WEATHER]), "tools[1].function.name"),
    (dict(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]), "tools"),
    (dict(messages=ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "18"}]), "messages[1].tool_call_id"),
    (dict(messages=ASK + [{"role": "tool", "content": "18"}]), "messages[1].tool_call_id"),
    (dict(messages=ASK + [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]}]),
     "messages[1].tool_calls[0]"),
    (dict(functions=[{"name": "f"}]), "functions"),
]


@pytest.mark.parametrize("kw,param", BAD)
def test_fake_bad_tool_inputs_are_400_naming_the_field(fake, kw, param):
    _eng, srv, _replies = fake
    kw = {"messages": ASK, **kw}
    extra = {"functions": kw.pop("functions")} if "functions" in kw else None
    with pytest.raises(openai.BadRequestError) as ei:
        oai(srv).chat.completions.create(model="fake-model", extra_body=extra, **kw)
    assert ei.value.param == param, ei.value.message


# -- the real bundled model -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048), max_queue=8)
    eng.load()
    with ServerThread(create_app(eng, ServerSettings())) as srv:
        yield eng, srv
    eng.close()


GREEDY = dict(model="gemma-3-270m-q4_k_m", temperature=0, seed=7, max_tokens=40)


def check_calls(calls: list[dict]) -> None:
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


@pytest.mark.model
def test_real_required_and_named_calls_validate_and_stream_the_same(real):
    _eng, srv = real
    c = oai(srv)
    kw = dict(GREEDY, messages=ASK, tools=[WEATHER, STOCK], tool_choice="required")
    r = c.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls", r.model_extra["hearth"].get("tool_call_error")
    calls = whole_calls(r.choices[0].message)
    print("required:", calls)
    assert len(calls) == 1 and r.choices[0].message.content is None
    check_calls(calls)
    text, streamed, finish, _ = accumulate(c.chat.completions.create(**kw, stream=True))
    assert finish == "tool_calls" and not text
    assert [(x["name"], x["arguments"]) for x in streamed] == [(x["name"], x["arguments"]) for x in calls]
    assert r.model_extra["hearth"]["context"]["tools"] > 100  # the definitions are counted in the prompt
    # a named function is decoded even where the question asks for the other one
    named = {"type": "function", "function": {"name": "get_stock_price"}}
    r = c.chat.completions.create(**dict(kw, tool_choice=named, parallel_tool_calls=False))
    calls = whole_calls(r.choices[0].message)
    assert r.choices[0].finish_reason == "tool_calls" and [x["name"] for x in calls] == ["get_stock_price"]
    check_calls(calls)


@pytest.mark.model
def test_real_round_trip_ends_in_a_text_answer(real):
    _eng, srv = real
    c = oai(srv)
    first = c.chat.completions.create(**GREEDY, messages=ASK, tools=[WEATHER], tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'}]
    r = c.chat.completions.create(**GREEDY, messages=msgs, tools=[WEATHER])
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and not ch.message.tool_calls and ch.message.content.strip()
    print("round trip answer:", repr(ch.message.content))


@pytest.mark.model
def test_real_parallel_calls_with_two_tools(real):
    _eng, srv = real
    ask = [{"role": "user", "content": "Call both tools: get_weather for Paris, then get_stock_price for AAPL."}]
    r = oai(srv).chat.completions.create(**dict(GREEDY, max_tokens=80), messages=ask, tools=[WEATHER, STOCK],
                                         tool_choice="required", parallel_tool_calls=True)
    calls = whole_calls(r.choices[0].message)
    print("parallel calls:", calls)
    assert r.choices[0].finish_reason == "tool_calls"
    assert sorted(c["name"] for c in calls) == ["get_stock_price", "get_weather"]  # measured: both, in order
    check_calls(calls)
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.model
@pytest.mark.parametrize("kw,param", BAD[:5])
def test_real_bad_inputs_are_400(real, kw, param):
    _eng, srv = real
    with pytest.raises(openai.BadRequestError) as ei:
        oai(srv).chat.completions.create(**{**GREEDY, "messages": ASK, **kw})
    assert ei.value.param == param


@pytest.mark.model
def test_real_tools_that_overflow_the_context_name_tools(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=512, n_parallel=1), max_queue=2)
    eng.load()
    big = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 10,
                                             "parameters": WEATHER_PARAMS}} for i in range(12)]
    try:
        with ServerThread(create_app(eng, ServerSettings())) as srv:
            with pytest.raises(openai.BadRequestError) as ei:
                oai(srv).chat.completions.create(**GREEDY, messages=ASK, tools=big)
            assert ei.value.param == "tools" and ei.value.code == "context_length_exceeded"
            assert ei.value.body["tools_tokens"] > 0
    finally:
        eng.close()
