"""``/v1/responses`` (OpenAI's Responses API) through the official ``openai`` client: the fake engine for shapes,
events, items, chains and errors; the real bundled model for the issue's "Must show" (create, stream, a
multi-turn ``previous_response_id`` chain)."""

from __future__ import annotations

import json

import openai
import pytest
from fakes import FakeEngine

from app.engine.local.engine import Engine
from app.memory import Store
from app.protocol.types import LoadSettings
from app.server import ServerThread, create_app
from app.server.models import ModelCatalog
from app.settings import ServerSettings

CATALOG = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_TEXT = 'Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}'


def oai(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)


def prompt_of(req) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in req.messages]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("responses") / "hearth.db")
    replies: dict = {}

    def reply(req):
        if req.tools and replies.get("call"):
            return replies["call"]
        return replies.get("text") or "echo: " + req.messages[-1].content

    eng = FakeEngine(n_ctx=4096, reply=reply)
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG, responses_store=store)) as srv:
        yield eng, srv, store, replies
    store.close()


# -- fake engine ----------------------------------------------------------------------------------------------
def test_text_instructions_and_usage(fake):
    eng, srv, _store, _ = fake
    r = oai(srv).responses.create(model="fake-model", input="hello", instructions="be brief")
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert r.output_text == "echo: hello" and r.model == "fake-model"
    assert prompt_of(eng.seen[-1]) == [("system", "be brief"), ("user", "hello")]
    assert r.usage.output_tokens == len("echo: hello") and r.usage.total_tokens == r.usage.input_tokens + 11
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"


def test_stream_events_in_order(fake):
    _eng, srv, _store, _ = fake
    events = list(oai(srv).responses.create(model="fake-model", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert text == "echo: hi" == done.output_text and done.status == "completed"
    assert events[0].response.id == done.id and events[0].response.status == "in_progress"


def test_input_items_and_a_previous_response_chain(fake):
    eng, srv, store, _ = fake
    c = oai(srv)
    first = c.responses.create(model="fake-model", input=[{"role": "user", "content": "one"}], instructions="sys")
    second = c.responses.create(model="fake-model", input="two", previous_response_id=first.id)
    assert prompt_of(eng.seen[-1]) == [("user", "one"), ("assistant", "echo: one"), ("user", "two")]  # no "sys"
    third = c.responses.create(model="fake-model", input=[{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "three"}]}], previous_response_id=second.id, stream=True)
    done = [e for e in third if e.type == "response.completed"][0].response
    assert [m for m, _ in prompt_of(eng.seen[-1])] == ["user", "assistant", "user", "assistant", "user"]
    c.responses.create(model="fake-model", input="branch", previous_response_id=first.id)
    assert prompt_of(eng.seen[-1]) == [("user", "one"), ("assistant", "echo: one"), ("user", "branch")]
    conv = store.get_conversation(first.id[5:37])
    assert set(conv.settings["responses"]) >= {first.id, second.id, done.id}
    assert conv.settings["origin"] == "api.responses"


def test_store_false_keeps_nothing_and_is_404_later(fake):
    _eng, srv, store, _ = fake
    c = oai(srv)
    before = len(store.list_conversations())
    r = c.responses.create(model="fake-model", input="secret", store=False)
    assert r.store is False and len(store.list_conversations()) == before
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="fake-model", input="x", previous_response_id=r.id)
    err = e.value.body
    assert err["param"] == "previous_response_id" and err["code"] == "previous_response_not_found"
    assert r.id in err["message"]
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="fake-model", input="x", previous_response_id="resp_nope")
    with pytest.raises(openai.NotFoundError):  # an empty id names no response: not a new chain
        c.responses.create(model="fake-model", input="x", previous_response_id="")


def test_function_call_and_its_output(fake):
    eng, srv, _store, replies = fake
    c = oai(srv)
    replies["call"] = CALL_TEXT
    try:
        r = c.responses.create(model="fake-model", input="Weather in Paris?", tools=[WEATHER])
        (call,) = [o for o in r.output if o.type == "function_call"]
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
        assert call.call_id.startswith("call_") and call.status == "completed"
        events = list(c.responses.create(model="fake-model", input="Weather in Paris?", tools=[WEATHER],
                                         stream=True))
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert json.loads(args) == {"city": "Paris"}
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert [i.type for i in added] == ["function_call"] and added[0].arguments == ""
    finally:
        replies["call"] = None
    out = c.responses.create(model="fake-model", previous_response_id=r.id, tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 18}'}])
    msgs = eng.seen[-1].messages
    assert [m.role for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[1].tool_calls[0].id == call.call_id and msgs[2].tool_call_id == call.call_id
    assert out.output_text == 'echo: {"temperature_c": 18}'
    # the client's own replay of the output, without previous_response_id
    c.responses.create(model="fake-model", tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}])
    assert [m.role for m in eng.seen[-1].messages] == ["user", "assistant", "tool"]


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "extra_body": {"keep_alive": "forever"}}, "keep_alive"),
    ({"input": "x", "extra_body": {"hearth": {"keep_alive": True}}}, "hearth.keep_alive"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "messages[0].tool_call_id"),
])
def test_bad_requests_are_400_naming_the_field(fake, body, param):
    _eng, srv, _store, _ = fake
    with pytest.raises(openai.BadRequestError) as e:
        oai(srv).responses.create(model="fake-model", **body)
    assert e.value.body["param"] == param, e.value.body


def test_reasoning_item_from_thinking(fake):
    _eng, srv, _store, replies = fake
    replies["text"] = "<think>plan</think>answer"
    try:
        r = oai(srv).responses.create(model="fake-model", input="q", extra_body={"hearth": {"reasoning_budget": 32}})
        assert [o.type for o in r.output] == ["reasoning", "message"] and r.output_text == "answer"
        assert r.output[0].content[0].text == "plan" and r.usage.output_tokens_details.reasoning_tokens > 0
        events = list(oai(srv).responses.create(model="fake-model", input="q", stream=True,
                                                extra_body={"hearth": {"reasoning_budget": 32}}))
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "plan"
        assert [o.type for o in events[-1].response.output] == ["reasoning", "message"]
    finally:
        replies["text"] = None


# -- GET and DELETE /v1/responses/{response_id} --------------------------------------------------------------
def _not_found(call, param="response_id"):
    with pytest.raises(openai.NotFoundError) as e:
        call()
    err = e.value.body
    assert e.value.status_code == 404 and err["type"] == "invalid_request_error" and err["param"] == param, err
    return err


def test_retrieve_returns_the_created_response(fake):
    import httpx

    _eng, srv, _store, _ = fake
    c = oai(srv)
    r = c.responses.create(model="fake-model", input="keep me", instructions="sys", metadata={"k": "v"},
                           temperature=0.5, max_output_tokens=64)
    got = c.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.output_text == "echo: keep me"
    raw = httpx.post(f"{srv.url}/v1/responses", json={"model": "fake-model", "input": "raw"}, timeout=30).json()
    again = httpx.get(f"{srv.url}/v1/responses/{raw['id']}", timeout=30)
    assert again.status_code == 200 and again.json() == raw  # every field, hearth's included


def test_retrieve_a_streamed_response_with_thinking(fake):
    _eng, srv, _store, replies = fake
    c = oai(srv)
    replies["text"] = "<think>plan</think>answer"
    try:
        events = list(c.responses.create(model="fake-model", input="q", stream=True,
                                         extra_body={"hearth": {"reasoning_budget": 32}}))
    finally:
        replies["text"] = None
    done = events[-1].response
    got = c.responses.retrieve(done.id)
    assert got.model_dump() == done.model_dump()
    assert [o.type for o in got.output] == ["reasoning", "message"] and got.output_text == "answer"
    assert got.output[1].id == [e.item for e in events if e.type == "response.output_item.done"][1].id


def test_retrieve_a_function_call(fake):
    _eng, srv, _store, replies = fake
    c = oai(srv)
    replies["call"] = CALL_TEXT
    try:
        r = c.responses.create(model="fake-model", input="Weather in Paris?", tools=[WEATHER])
    finally:
        replies["call"] = None
    got = c.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.output[-1].type == "function_call"


def test_delete_forgets_the_response_but_keeps_the_messages(fake):
    import httpx

    eng, srv, store, _ = fake
    c = oai(srv)
    first = c.responses.create(model="fake-model", input="one")
    second = c.responses.create(model="fake-model", input="two", previous_response_id=first.id)
    cid = first.id[5:37]
    kept = [m.id for m in store.messages(cid)]
    assert c.responses.delete(second.id) is None  # the client reads no body
    err = _not_found(lambda: c.responses.retrieve(second.id))
    assert err["code"] == "response_not_found" and second.id in err["message"] and "deleted" in err["message"]
    err = _not_found(lambda: c.responses.create(model="fake-model", input="x", previous_response_id=second.id),
                     "previous_response_id")
    assert err["code"] == "previous_response_not_found"
    _not_found(lambda: c.responses.delete(second.id))
    assert [m.id for m in store.messages(cid)] == kept  # nothing lost, only the id's mapping
    assert second.id not in store.get_conversation(cid).settings["responses"]
    # the rest of the chain still answers
    assert c.responses.retrieve(first.id).id == first.id
    c.responses.create(model="fake-model", input="three", previous_response_id=first.id)
    assert prompt_of(eng.seen[-1]) == [("user", "one"), ("assistant", "echo: one"), ("user", "three")]
    # the body OpenAI sends
    r = c.responses.create(model="fake-model", input="gone")
    d = httpx.delete(f"{srv.url}/v1/responses/{r.id}", timeout=30)
    assert d.status_code == 200 and d.json() == {"id": r.id, "object": "response", "deleted": True}


@pytest.mark.parametrize("rid", ["resp_nope", "nope", "resp_" + "0" * 48, "resp_" + "g" * 48, "resp_0 1",
                                 "RESP_" + "a" * 48])
def test_unknown_and_malformed_ids_are_404(fake, rid):
    _eng, srv, _store, _ = fake
    c = oai(srv)
    assert _not_found(lambda: c.responses.retrieve(rid))["code"] == "response_not_found"
    _not_found(lambda: c.responses.delete(rid))


def test_a_store_false_response_cannot_be_retrieved_or_deleted(fake):
    _eng, srv, _store, _ = fake
    c = oai(srv)
    r = c.responses.create(model="fake-model", input="secret", store=False)
    assert "store: false" in _not_found(lambda: c.responses.retrieve(r.id))["message"]
    _not_found(lambda: c.responses.delete(r.id))
    events = list(c.responses.create(model="fake-model", input="secret", store=False, stream=True))
    _not_found(lambda: c.responses.retrieve(events[-1].response.id))


def test_an_old_entry_without_its_response_is_rebuilt_from_its_message(fake):
    eng, srv, store, _ = fake
    c = oai(srv)
    r = c.responses.create(model="fake-model", input="old")
    cid = r.id[5:37]
    settings = store.get_conversation(cid).settings
    settings["responses"][r.id] = settings["responses"][r.id]["message_id"]  # as stored before GET existed
    store.update_conversation(cid, settings=settings)
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.status == "completed" and got.output_text == "echo: old"
    assert got.model == "fake-model" and got.usage is None and got.model_extra["hearth"] == {"rebuilt": True}
    assert abs(got.created_at - r.created_at) <= 2
    assert c.responses.retrieve(r.id).model_dump() == got.model_dump()  # item ids stay put
    c.responses.create(model="fake-model", input="next", previous_response_id=r.id)
    assert prompt_of(eng.seen[-1]) == [("user", "old"), ("assistant", "echo: old"), ("user", "next")]
    c.responses.delete(r.id)
    _not_found(lambda: c.responses.retrieve(r.id))


def test_retrieve_with_stream_is_a_400(fake):
    import httpx

    _eng, srv, _store, _ = fake
    r = oai(srv).responses.create(model="fake-model", input="x")
    got = httpx.get(f"{srv.url}/v1/responses/{r.id}", params={"stream": "true"}, timeout=30)
    assert got.status_code == 400 and got.json()["error"]["param"] == "stream", got.text
    assert httpx.get(f"{srv.url}/v1/responses/{r.id}", params={"stream": "false"}, timeout=30).status_code == 200


# -- the real bundled model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(bundled_model, tmp_path_factory):
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048), max_queue=4)
    eng.load()
    store = Store(tmp_path_factory.mktemp("real-responses") / "hearth.db")
    with ServerThread(create_app(eng, ServerSettings(), responses_store=store)) as srv:
        yield srv
    store.close()
    eng.close()


@pytest.mark.model
def test_real_create_stream_and_chain(real):
    c = oai(real)
    r = c.responses.create(model="gemma-3-270m-q4_k_m", input="What is the capital of France?", temperature=0,
                           max_output_tokens=12)
    assert "Paris" in r.output_text and r.status in ("completed", "incomplete")
    events = list(c.responses.create(model="gemma-3-270m-q4_k_m", input="What is the capital of France?",
                                     temperature=0, max_output_tokens=12, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed",
                                                                         "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    # a multi-turn chain: the second turn sees the first
    one = c.responses.create(model="gemma-3-270m-q4_k_m", temperature=0, max_output_tokens=8,
                             input="My name is Ada. Reply with OK.")
    two = c.responses.create(model="gemma-3-270m-q4_k_m", temperature=0, max_output_tokens=8,
                             input="What is my name?", previous_response_id=one.id)
    three = c.responses.create(model="gemma-3-270m-q4_k_m", temperature=0, max_output_tokens=8,
                               input="Say it again.", previous_response_id=two.id)
    assert "Ada" in two.output_text, two.output_text
    assert three.previous_response_id == two.id and three.usage.input_tokens > two.usage.input_tokens


def test_text_and_text_format_that_are_not_objects_are_400s_naming_them(fake):
    import httpx

    _eng, srv, _store, _ = fake
    for text, param in (({"format": "json_object"}, "text.format"), ("plain", "text")):
        r = httpx.post(f"{srv.url}/v1/responses", json={"input": "x", "text": text}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_failed_save_leaves_no_empty_conversation(tmp_path, monkeypatch):
    """Each failed write used to leave an empty 'API: …' conversation behind (issue 29, item 5)."""
    from app.errors import DiskFull
    from app.protocol.types import ChatMessage
    from app.server.responses import ResponseChains

    store = Store(tmp_path / "hearth.db")
    chains = ResponseChains(store)
    chain = chains.chain(None)
    real = store.append_message

    def full(*a, **kw):
        raise DiskFull(str(tmp_path / "hearth.db"))

    monkeypatch.setattr(store, "append_message", full)
    with pytest.raises(DiskFull):
        chains.save(chains.new_id(chain), chain, [ChatMessage("user", "hi")], ChatMessage("assistant", "yo"), "m")
    assert store.list_conversations() == [] and chain.new  # nothing written; the next try creates it
    monkeypatch.setattr(store, "append_message", real)
    rid = chains.new_id(chain)
    chains.save(rid, chain, [ChatMessage("user", "hi")], ChatMessage("assistant", "yo"), "m")
    assert [c.title for c in store.list_conversations()] == ["API: hi"] and not chain.new
