"""The check after generation on the port (issue 26): an answer that breaks its ``response_format`` schema where
the grammar could not enforce it is a 422 naming ``response_format``, the place, the keyword and the value, in
each API's error shape; never returned silently. Over ``FakeEngine``, whose scripted answers ignore the
grammar, so they can break the schema the way a real model could break a keyword the grammar leaves out.
"""

from __future__ import annotations

import json

import openai
import pytest
from fakes import FakeEngine
from pydantic import BaseModel, Field
from starlette.testclient import TestClient

from app.server import ServerThread, create_app
from app.server.convert import chat_plan
from app.server.models import ModelCatalog
from app.server.openai_schema import ChatCompletionRequest
from app.settings import ServerSettings

CATALOG = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
WIDE = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 1000}},
        "required": ["n"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": WIDE, "strict": True}}
USER = [{"role": "user", "content": "A number, please."}]
TOOL = {"type": "function", "function": {"name": "pick", "strict": True, "parameters": {
    "type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"], "additionalProperties": False}}}
AFTER = USER + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "pick", "arguments": '{"k": "a"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "7"}]
BAD = "answer.n: 5000 is greater than the maximum of 1000 (keyword 'maximum', value 5000)"


class Share(BaseModel):
    fraction: float = Field(ge=0.0, le=1.0)


@pytest.fixture(scope="module")
def port():
    replies = {"answer": '{"n": 5000}'}
    eng = FakeEngine(reply=lambda req: replies["answer"])
    c = TestClient(create_app(eng, ServerSettings(), catalog=CATALOG), base_url="http://127.0.0.1:8765",
                   raise_server_exceptions=False)
    yield c, replies
    eng.close()


def error_of(r, status=422) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_a_bound_the_grammar_leaves_out_is_checked_whole_422_naming_field_and_bound(port):
    c, replies = port
    replies["answer"] = '{"n": 5000}'
    e = error_of(c.post("/v1/chat/completions", json={"messages": USER, "response_format": FORMAT}))
    assert e["param"] == "response_format" and e["code"] == "answer_schema_mismatch"
    assert e["type"] == "invalid_request_error" and BAD in e["message"]
    replies["answer"] = '{"n": 999}'
    r = c.post("/v1/chat/completions", json={"messages": USER, "response_format": FORMAT})
    assert r.status_code == 200 and json.loads(r.json()["choices"][0]["message"]["content"]) == {"n": 999}


def test_text_completions_are_checked_too(port):
    c, replies = port
    replies["answer"] = '{"n": -1}'
    e = error_of(c.post("/v1/completions", json={"prompt": "n:", "response_format": FORMAT}))
    assert "answer.n: -1 is less than the minimum of 0" in e["message"]


def test_responses_api_answers_422_in_openai_shape(port):
    c, replies = port
    replies["answer"] = '{"n": 5000}'
    fmt = {"format": {"type": "json_schema", "name": "w", "schema": WIDE, "strict": True}}
    e = error_of(c.post("/v1/responses", json={"input": "A number.", "text": fmt}))
    assert e["param"] == "response_format" and BAD in e["message"]
    replies["answer"] = '{"n": 3}'
    r = c.post("/v1/responses", json={"input": "A number.", "text": fmt})
    assert r.status_code == 200 and json.loads(r.json()["output"][0]["content"][0]["text"]) == {"n": 3}


def test_ollama_answers_422_in_its_shape(port):
    c, replies = port
    replies["answer"] = '{"n": 5000}'
    r = c.post("/api/chat", json={"model": "fake-model", "messages": USER, "format": WIDE, "stream": False})
    assert r.status_code == 422 and BAD in r.json()["error"]


def test_a_stream_ends_with_the_error_in_band(port):
    c, replies = port
    replies["answer"] = '{"n": 5000}'
    with c.stream("POST", "/v1/chat/completions",
                  json={"messages": USER, "response_format": FORMAT, "stream": True}) as r:
        assert r.status_code == 200
        lines = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert lines[-1]["error"]["param"] == "response_format" and BAD in lines[-1]["error"]["message"]
    assert not any(ch.get("finish_reason") for x in lines[:-1] for ch in x.get("choices", []))


def test_a_cut_off_answer_keeps_its_finish_reason_length(port):
    c, replies = port
    replies["answer"] = '{"n": 5000}'
    r = c.post("/v1/chat/completions", json={"messages": USER, "response_format": FORMAT, "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_a_forced_call_is_not_an_answer_in_the_format_and_the_answer_after_it_is(port):
    c, replies = port
    replies["answer"] = 'Tool call: {"name": "pick", "arguments": {"k": "a"}}'
    body = {"messages": USER, "tools": [TOOL], "tool_choice": "required", "response_format": FORMAT}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"
    replies["answer"] = '{"n": 5000}'
    e = error_of(c.post("/v1/chat/completions", json={**body, "messages": AFTER}))
    assert BAD in e["message"]


def test_only_what_the_grammar_leaves_out_is_checked():
    """A schema the grammar enforces whole (a small range is listed as values) needs no check after
    generation; a wide one does; a forced call's turn has no format to check."""
    def plan(fmt, **kw):
        return chat_plan(ChatCompletionRequest.model_validate({"messages": USER, "response_format": fmt, **kw}),
                         "fake-model")
    small = {"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}}}}}
    assert plan(small).answer_format is None and plan({"type": "json_object"}).answer_format is None
    assert plan(FORMAT).answer_format is not None
    assert plan(FORMAT, tools=[TOOL], tool_choice="required").answer_format is None


def test_the_openai_client_raises_unprocessable_and_parses_a_valid_answer():
    """Through the ``openai`` client, with a pydantic model whose ``Field(ge=0.0, le=1.0)`` bounds a number
    (strict: accepted now that the port checks it, a 400 before)."""
    replies = {"answer": '{"fraction": 1.5}'}
    eng = FakeEngine(reply=lambda req: replies["answer"])
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.UnprocessableEntityError) as ei:
            client.chat.completions.parse(model="fake-model", messages=USER, response_format=Share)
        assert ei.value.param == "response_format" and "answer.fraction: 1.5 is greater than the maximum of 1.0" \
            in ei.value.message
        replies["answer"] = '{"fraction": 0.25}'
        r = client.chat.completions.parse(model="fake-model", messages=USER, response_format=Share)
        assert r.choices[0].message.parsed == Share(fraction=0.25)
    eng.close()
