"""Ollama's native API (``/api/*``) through the official ``ollama`` client, on ``FakeEngine`` / ``FakeEmbedder``
(``tests/fakes.py``) behind a real uvicorn server on 127.0.0.1: listing, show, ps, version, chat and generate
(whole and NDJSON streams, options, ``format``, tools, thinking), embeddings, and errors in Ollama's shape."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import httpx
import ollama
import pytest
from fakes import FakeEmbedder, FakeEngine, default_reply
from gguf_writer import write_gguf

from app.engine.pool import GIB, ModelPool
from app.errors import InvalidRequest, ModelNotFound
from app.server import ServerThread, create_app
from app.server.errors import ApiError
from app.server.models import ModelCatalog
from app.server.ollama import OllamaAnswer, message, model_name, sampling
from app.settings import ServerSettings

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL_TEXT = 'Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}'
HI = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    path = write_gguf(tmp_path_factory.mktemp("m") / "fake-model.gguf", "gemma3", context_length=2048)
    catalog = ModelCatalog(lambda: [("fake-model", str(path), "chat"), ("other-model", "/m/other-model.gguf",
                                                                          "chat")])
    replies: dict = {}

    def reply(req):
        if req.decoding.grammar:
            return '{"answer": "yes"}'
        if req.tools and replies.get("call"):
            return replies["call"]
        return replies.get("text") or default_reply(req)

    eng = FakeEngine(path, n_ctx=4096, reply=reply)
    with ServerThread(create_app(eng, ServerSettings(), catalog=catalog, embedder=FakeEmbedder())) as srv:
        yield eng, srv, replies
    eng.close()


def client(srv) -> ollama.Client:
    return ollama.Client(host=srv.url, timeout=60)


# -- models --------------------------------------------------------------------------------------------------
def test_version_list_show_ps(fake):
    _eng, srv, _ = fake
    c = client(srv)
    assert c._client.get("/api/version").json()["version"]
    names = [m.model for m in c.list().models]
    assert names == ["fake-model", "other-model", "mini@0123456789ab"]
    m = c.list().models[0]
    assert m.size > 0 and len(m.digest) == 64 and m.modified_at is not None
    assert m.details.format == "gguf" and m.details.family == "gemma3" and m.details.parameter_size.endswith("M")
    s = c.show("fake-model:latest")
    assert s.details.family == "gemma3" and s.modelinfo["gemma3.context_length"] == 2048
    assert "completion" in s.capabilities and "tools" in s.capabilities and "temperature" in s.parameters
    (run,) = [p for p in c.ps().models if p.model == "fake-model"]
    assert run.context_length == 4096 and run.expires_at is not None
    assert "other-model" not in [p.model for p in c.ps().models]


def test_unknown_model_is_404_in_ollama_shape(fake):
    _eng, srv, _ = fake
    with pytest.raises(ollama.ResponseError) as e:
        client(srv).show("nope")
    assert e.value.status_code == 404 and "nope" in e.value.error and "fake-model" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client(srv).chat(model="llama3.2", messages=HI, stream=False)
    assert e.value.status_code == 404 and isinstance(e.value.error, str)
    r = httpx.get(f"{srv.url}/api/nothing")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    r = httpx.get(f"{srv.url}/api/chat")
    assert r.status_code == 405 and "POST" in r.json()["error"]


# -- chat ----------------------------------------------------------------------------------------------------
def test_chat_whole_with_options_and_durations(fake):
    eng, srv, _ = fake
    r = client(srv).chat(model="fake-model", messages=[{"role": "system", "content": "be kind"}, *HI], stream=False,
                         options={"temperature": 0.3, "top_k": 7, "top_p": 0.5, "min_p": 0.1, "seed": 11,
                                  "num_predict": 64, "stop": ["zz"], "repeat_penalty": 1.1, "num_ctx": 2048})
    assert r.message.role == "assistant" and r.message.content == "echo: hi (seed 11)"
    assert r.done and r.done_reason == "stop" and r.model == "fake-model"
    assert r.eval_count == len("echo: hi (seed 11)") and r.prompt_eval_count > 0
    assert r.total_duration > 0 and r.prompt_eval_duration > 0 and r.eval_duration >= 0 and r.load_duration >= 0
    req = eng.seen[-1]
    d = req.decoding
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.seed, d.max_tokens) == (0.3, 7, 0.5, 0.1, 11, 64)
    assert d.stop == ("zz",) or list(d.stop) == ["zz"]
    assert [(m.role, m.content) for m in req.messages] == [("system", "be kind"), ("user", "hi")]
    r = client(srv).chat(model="fake-model", messages=HI, stream=False, options={"num_predict": 3})
    assert r.message.content == "ech" and r.done_reason == "length"


def test_chat_stream_is_ndjson(fake):
    _eng, srv, _ = fake
    parts = list(client(srv).chat(model="fake-model", messages=HI, options={"seed": 1}, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "stop"
    assert "".join(p.message.content for p in parts) == "echo: hi (seed 1)"
    assert parts[-1].eval_count == len("echo: hi (seed 1)") and parts[-1].total_duration > 0
    with httpx.stream("POST", f"{srv.url}/api/chat", content=json.dumps({"model": "fake-model", "messages": HI}),
                      headers={"Content-Type": "application/x-www-form-urlencoded"}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[-1]["done"] is True and lines[0]["done"] is False and "created_at" in lines[0]


def test_chat_format_schema_and_json(fake):
    eng, srv, _ = fake
    r = client(srv).chat(model="fake-model", messages=HI, format=SCHEMA, stream=False)
    assert json.loads(r.message.content) == {"answer": "yes"} and "answer" in eng.seen[-1].decoding.grammar
    r = client(srv).generate(model="fake-model", prompt="Is it?", format="json", stream=False)
    assert json.loads(r.response) == {"answer": "yes"} and eng.seen[-1].decoding.grammar


def test_chat_tools_whole_streamed_and_results(fake):
    eng, srv, replies = fake
    c = client(srv)
    replies["call"] = CALL_TEXT
    try:
        r = c.chat(model="fake-model", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
                   stream=False)
        (call,) = r.message.tool_calls
        assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
        assert r.done_reason == "stop" and not r.message.content
        parts = list(c.chat(model="fake-model", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER],
                            stream=True))
        calls = [tc for p in parts for tc in (p.message.tool_calls or [])]
        assert [tc.function.arguments for tc in calls] == [{"city": "Paris"}] and parts[-1].done
    finally:
        replies["call"] = None
    r = c.chat(model="fake-model", tools=[WEATHER], stream=False, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "content": "18C", "tool_name": "get_weather"}])
    msgs = eng.seen[-1].messages
    assert [m.role for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[1].tool_calls[0].name == "get_weather" and msgs[2].tool_call_id == msgs[1].tool_calls[0].id
    assert r.message.content == "echo: 18C"


def test_chat_think(fake):
    eng, srv, replies = fake
    replies["text"] = "<think>plan</think>answer"
    try:
        r = client(srv).chat(model="fake-model", messages=HI, think=True, stream=False)
        assert r.message.thinking == "plan" and r.message.content == "answer"
        parts = list(client(srv).chat(model="fake-model", messages=HI, think="low", stream=True))
        assert "".join(p.message.thinking or "" for p in parts) == "plan"
        assert "".join(p.message.content for p in parts) == "answer"
    finally:
        replies["text"] = None
    client(srv).chat(model="fake-model", messages=HI, think=False, stream=False)
    assert eng.seen[-1].reasoning is not None and eng.seen[-1].reasoning.budget.tokens == 0


def test_chat_without_messages_loads(fake):
    _eng, srv, _ = fake
    r = client(srv).chat(model="fake-model", messages=[])
    assert r.done and r.done_reason == "load"
    r = httpx.post(f"{srv.url}/api/generate", json={"model": "fake-model", "keep_alive": 0}).json()
    assert r["done_reason"] == "unload" and r["response"] == ""


# -- generate ------------------------------------------------------------------------------------------------
def test_generate_template_raw_and_stream(fake):
    eng, srv, _ = fake
    c = client(srv)
    r = c.generate(model="fake-model", prompt="hello", system="be brief", stream=False, options={"seed": 2})
    assert r.response == "echo: hello (seed 2)" and r.done and r.done_reason == "stop"
    assert [(m.role, m.content) for m in eng.seen[-1].messages] == [("system", "be brief"), ("user", "hello")]
    r = c.generate(model="fake-model", prompt="Once upon", raw=True, stream=False)
    assert r.response == "echo: Once upon" and eng.seen[-1].prompt == "Once upon"
    parts = list(c.generate(model="fake-model", prompt="hey", options={"num_predict": 4}, stream=True))
    assert "".join(p.response for p in parts) == "echo" and parts[-1].done_reason == "length"
    assert parts[-1].eval_count == 4


# -- embeddings ----------------------------------------------------------------------------------------------
def test_embed_and_legacy_embeddings(fake):
    _eng, srv, _ = fake
    c = client(srv)
    r = c.embed(model="mini", input=["a b", "abc"])
    assert [list(v) for v in r.embeddings] == [[1.0, 3.0, 0.5], [1.0, 3.0, 0.5]] and r.prompt_eval_count == 3
    assert list(c.embed(model="mini@0123456789ab", input="xy").embeddings[0]) == [1.0, 2.0, 0.5]
    assert list(c.embeddings(model="mini", prompt="four").embedding) == [1.0, 4.0, 0.5]
    with pytest.raises(ollama.ResponseError) as e:
        c.embed(model="fake-model", input="x")
    assert e.value.status_code == 400 and "chat model" in e.value.error


def test_embed_without_an_embedder_says_how():
    eng = FakeEngine()
    with ServerThread(create_app(eng, ServerSettings(), catalog=ModelCatalog(lambda: []))) as srv:
        with pytest.raises(ollama.ResponseError) as e:
            client(srv).embed(model="x", input="hello")
    eng.close()
    assert e.value.status_code == 400 and "--embeddings" in e.value.error


# -- errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path,body,needle", [
    ("/api/chat", {"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "messages[0].images"),
    ("/api/generate", {"prompt": "hi", "images": ["aGk="]}, "images"),
    ("/api/generate", {"prompt": "def f():", "suffix": "return 1"}, "suffix"),
    ("/api/generate", {"prompt": "x", "raw": True, "system": "s"}, "system"),
    ("/api/chat", {"messages": HI, "options": {"temperature": 5}}, "options.temperature"),
    ("/api/chat", {"messages": HI, "options": {"num_predict": 0}}, "options.num_predict"),
    ("/api/chat", {"messages": HI, "options": {"num_ctx": 100000}}, "options.num_ctx"),
    ("/api/chat", {"messages": HI, "options": {"num_gpu": 99}}, "options.num_gpu"),
    ("/api/chat", {"messages": HI, "options": {"mirostat": 2}}, "options.mirostat"),
    ("/api/chat", {"messages": HI, "format": "yaml"}, "format"),
    ("/api/chat", {"messages": HI, "format": {"type": "object", "$ref": "http://x/y"}}, "format"),
    ("/api/chat", {"messages": HI, "think": "very"}, "think"),
    ("/api/chat", {"messages": [{"role": "tool", "content": "18C"}]}, "messages[0]"),
    ("/api/chat", {"messages": HI, "keep_alive": "soon"}, "keep_alive"),
    ("/api/embed", {"model": "mini"}, "input"),
    ("/api/embed", {"model": "mini", "input": "x", "dimensions": 7}, "dimensions"),
    ("/api/embed", {"model": "mini", "input": "x", "truncate": False}, "truncate"),
    ("/api/pull", {"model": "llama3.2"}, "hearth models"),
])
def test_bad_requests_are_400_naming_the_field(fake, path, body, needle):
    _eng, srv, _ = fake
    r = httpx.post(f"{srv.url}{path}", json={"model": "fake-model", "stream": False, **body})
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error"} and needle in r.json()["error"], r.json()


def test_errors_through_the_client(fake):
    _eng, srv, _ = fake
    c = client(srv)
    with pytest.raises(ollama.ResponseError) as e:
        # a stream (read lazily): the error comes before the first line, as an HTTP error
        list(c.chat(model="fake-model", messages=[{"role": "user", "content": "look", "images": [b"\x89PNG"]}],
                    stream=True))
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="fake-model", prompt="x", options={"top_p": 2}, stream=False)
    assert "options.top_p" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.delete("fake-model")
    assert e.value.status_code == 400 and "models folder" in e.value.error
    r = httpx.post(f"{srv.url}/api/chat", content=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]


def test_metrics_count_ollama_generations(fake):
    _eng, srv, _ = fake
    before = httpx.get(f"{srv.url}/metrics").text
    client(srv).generate(model="fake-model", prompt="count me", stream=False)
    after = httpx.get(f"{srv.url}/metrics").text
    assert before != after and "hearth_" in after
    assert 'endpoint="/api/generate",method="POST",status="200"' in after  # its own label, not "other"


def test_root_answers_the_ollama_probe_and_is_counted(fake):
    _eng, srv, _ = fake
    for method in ("GET", "HEAD"):
        r = httpx.request(method, f"{srv.url}/")
        assert r.status_code == 200, r.text
    assert "Hearth is running" in httpx.get(f"{srv.url}/").text
    text = httpx.get(f"{srv.url}/metrics").text
    assert 'endpoint="/",method="GET",status="200"' in text and 'endpoint="/",method="HEAD"' in text


# -- many models (`hearth serve`: a pool) --------------------------------------------------------------------
def test_pool_loads_by_name_ps_expiry_and_unload():
    paths = {"alpha": "/m/alpha.gguf", "beta": "/m/beta.gguf"}
    engines: list = []

    def make(key, path):
        engines.append(FakeEngine(path, reply=lambda req, k=key: f"{k}: {req.messages[-1].content}"))
        return engines[-1]

    def resolve(name):
        name = model_name(name) or "alpha"
        if name not in paths:
            raise ModelNotFound(name, list(paths))
        return name, paths[name]

    pool = ModelPool(resolve, make, lambda key, path: GIB, reaper_interval_s=0)
    app = create_app(settings=ServerSettings(), pool=pool,
                     catalog=ModelCatalog(lambda: [(k, v, "chat") for k, v in paths.items()]))
    try:
        with ServerThread(app) as srv:
            c = client(srv)
            assert [m.model for m in c.ps().models] == []
            r = c.chat(model="beta:latest", messages=HI, keep_alive="5m", stream=False)
            assert r.message.content == "beta: hi" and r.model == "beta"
            (run,) = c.ps().models
            assert run.model == "beta" and run.size == GIB
            left = (run.expires_at - datetime.now(timezone.utc)).total_seconds()
            assert 200 < left <= 300
            assert c.chat(model="alpha", messages=[], keep_alive=0).done_reason == "unload"
            assert [m.model for m in c.ps().models] == ["beta"] and not pool.status()["alpha"]["loaded"]
    finally:
        pool.close()


# -- pure logic ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("param,text,want", [
    ("temperature", "invalid value for temperature: too big", "invalid value for options.temperature: too big"),
    ("stop", "stop must be a list; nonstop", "options.stop must be a list; nonstop"),
    ("response_format", "only local $ref are supported", "only local $ref are supported (param: format)"),
    ("messages[0].images", "messages[0].images: no", "messages[0].images: no"),
    (None, "boom", "boom"),
])
def test_error_messages_use_ollama_names(param, text, want):
    assert message(ApiError(400, "invalid_request_error", text, param)) == want


def test_an_error_in_a_stream_is_one_json_line_the_client_raises_on():
    line = OllamaAnswer("chat", 0.0, 0.0).error_event(ApiError(503, "server_error", "engine crashed"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and json.loads(line) == {"error": "engine crashed"}


def test_options_map_and_refuse():
    assert sampling({"num_predict": -1, "temperature": 0, "mirostat": 0, "num_ctx": 64}, 128) == {"temperature": 0}
    assert sampling({"num_predict": 5, "stop": ["x"]}) == {"max_tokens": 5, "stop": ["x"]}
    for bad in ({"num_ctx": 256}, {"num_ctx": True}, {"tfs_z": 1.0}, {"num_predict": -3}):
        with pytest.raises(InvalidRequest) as e:
            sampling(bad, 128)
        assert e.value.param.startswith("options.")


def test_key_refusal_is_in_ollama_shape():
    """The security middleware answers before any route: on /api/* it answers in Ollama's shape too."""
    with ServerThread(create_app(FakeEngine(), ServerSettings(api_key="sekrit"))) as srv:
        r = httpx.get(f"{srv.url}/api/tags")
        assert r.status_code == 401 and isinstance(r.json()["error"], str) and "API key" in r.json()["error"]
        with pytest.raises(ollama.ResponseError) as ei:
            client(srv).list()
        assert ei.value.status_code == 401 and "API key" in ei.value.error
        ok = ollama.Client(host=srv.url, headers={"Authorization": "Bearer sekrit"}).list()
        assert [m.model for m in ok.models] == ["fake-model"]
