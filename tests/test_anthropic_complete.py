"""The rest of Anthropic's API through the official ``anthropic`` client, on the fake engine: structured
outputs (``messages.parse`` with ``output_format`` / ``output_config.format`` → the chat path's json-schema
grammar), ``messages.count_tokens``, ``models.list`` / ``models.retrieve`` in Anthropic's shape; the
``stop_sequence`` mapping of a finished answer (pure logic: the fake runtime does not say which stop string
matched); the ``openai`` client's ``models.list`` with a ``--model`` file outside the models folder and a
remote engine; ``/v1/embeddings`` with token ids. The real model: tests/test_anthropic_complete_real.py."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest
from fakes import FakeEmbedder, FakeEngine
from pydantic import BaseModel

from app.engine.pool import GIB, ModelPool
from app.errors import InvalidRequest, ModelNotFound
from app.protocol.types import Done, GenerateRequest, Metrics
from app.server import ServerThread, create_app
from app.server import format as fmt
from app.server.convert import chat_plan
from app.server.messages import MessagesAnswer, MessagesRequest, chat_body, stop_of
from app.server.models import ModelCatalog
from app.settings import ServerSettings

CATALOG = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
HI = [{"role": "user", "content": "hi"}]
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class Person(BaseModel):
    name: str
    age: int


def reply(req: GenerateRequest) -> str:
    if req.decoding.grammar:
        return '{"name": "Ada", "age": 36}'
    return "echo: " + req.messages[-1].content


@pytest.fixture(scope="module")
def fake():
    eng = FakeEngine(n_ctx=4096, reply=reply)
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        yield eng, srv
    eng.close()


def client(srv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)


# -- structured outputs ---------------------------------------------------------------------------------------
def test_parse_runs_under_the_schemas_grammar_and_validates(fake):
    eng, srv = fake
    m = client(srv).messages.parse(model="fake-model", max_tokens=64, messages=HI, output_format=Person)
    assert m.parsed_output == Person(name="Ada", age=36)
    grammar = eng.seen[-1].decoding.grammar
    assert "name-kv" in grammar and "age-kv" in grammar  # the schema's grammar, not free text
    raw = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
           "additionalProperties": False}
    client(srv).messages.create(model="fake-model", max_tokens=64, messages=HI,
                                output_config={"format": {"type": "json_schema", "schema": raw}})
    assert "ok-kv" in eng.seen[-1].decoding.grammar
    m = client(srv).messages.create(model="fake-model", max_tokens=64, messages=HI)
    assert eng.seen[-1].decoding.grammar is None and m.content[0].text == "echo: hi"


@pytest.mark.parametrize("config, param", [
    ({"format": {"type": "xml"}}, "output_config.format.type"),
    ({"format": {"type": "json_schema"}}, "output_config.format.schema"),
    ({"format": {"type": "json_schema", "schema": {"type": "array", "uniqueItems": True}}},
     "output_config.format.schema"),
    ({"format": {"type": "json_schema", "schema": {"type": "nope"}}}, "output_config.format.schema"),
    ({"effort": "extreme"}, "output_config.effort"),
])
def test_bad_output_config_is_a_400_naming_it(fake, config, param):
    _eng, srv = fake
    with pytest.raises(anthropic.BadRequestError) as e:
        client(srv).messages.create(model="fake-model", max_tokens=8, messages=HI, output_config=config)
    err = e.value.body["error"]
    assert err["type"] == "invalid_request_error" and param in err["message"]


def test_effort_alone_is_accepted_and_changes_nothing(fake):
    eng, srv = fake
    m = client(srv).messages.create(model="fake-model", max_tokens=64, messages=HI, output_config={"effort": "low"})
    assert m.content[0].text == "echo: hi" and eng.seen[-1].reasoning is None


# -- count_tokens ---------------------------------------------------------------------------------------------
def test_count_tokens_is_the_prompt_messages_create_gives_the_model(fake):
    eng, srv = fake
    c = client(srv)
    system = "be brief"
    msgs = [{"role": "user", "content": "what is 2+2?"}]
    n = c.messages.count_tokens(model="fake-model", system=system, messages=msgs).input_tokens
    # the fake tokenizer: one token per character of the rendered prompt, plus BOS
    assert n == len("system: be brief\nuser: what is 2+2?\nassistant:") + 1
    m = c.messages.create(model="fake-model", max_tokens=16, system=system, messages=msgs)
    assert m.usage.input_tokens == n
    assert c.messages.count_tokens(model="fake-model", messages=msgs, tools=[WEATHER]).input_tokens > 0


def test_count_tokens_errors_in_anthropic_shape(fake):
    _eng, srv = fake
    url = f"{srv.url}/v1/messages/count_tokens"
    r = httpx.post(url, json={"model": "fake-model", "messages": []}, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url, json={"model": "nope", "messages": HI})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(url, json={"model": "fake-model"})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


# -- stop_sequence (pure: the mapping of a finished answer) ---------------------------------------------------
def _choice(finish: str, info: dict) -> fmt.Choice:
    return fmt.Choice(Done(finish, Metrics(prompt_tokens=3, completion_tokens=2), "ab", info))


def _plan(stops):
    body = MessagesRequest.model_validate({"max_tokens": 8, "messages": HI, "stop_sequences": stops})
    return chat_plan(chat_body(body), "fake-model")


def test_a_matched_stop_sequence_is_reported_with_its_string():
    plan = _plan(["END", "###"])
    assert stop_of(plan, _choice("stop", {"stop_sequence": "###"})) == ("stop_sequence", "###")
    assert stop_of(plan, _choice("stop", {})) == ("end_turn", None)  # the end-of-turn token
    assert stop_of(plan, _choice("stop", {"stop_sequence": "<end_of_turn>"})) == ("end_turn", None)  # template's
    assert stop_of(plan, _choice("length", {"stop_sequence": "END"})) == ("max_tokens", None)
    answer = MessagesAnswer()
    frame = answer.frame(plan)
    whole = asyncio.run(answer.whole(frame, [_choice("stop", {"stop_sequence": "END"})], None))
    assert whole["stop_reason"] == "stop_sequence" and whole["stop_sequence"] == "END"

    async def pieces():
        yield _choice("stop", {"stop_sequence": "END"})

    async def events():
        return [e async for e in answer.stream(frame, pieces(), None)]

    deltas = [json.loads(e.split(b"data: ", 1)[1]) for e in asyncio.run(events()) if b"message_delta" in e]
    assert deltas[0]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_stop_sequences_reach_the_engine_and_cut_the_answer(fake):
    eng, srv = fake
    m = client(srv).messages.create(model="fake-model", max_tokens=64, messages=HI, stop_sequences=[": h"])
    assert m.content[0].text == "echo" and eng.seen[-1].decoding.stop == (": h",)
    assert m.stop_reason in ("end_turn", "stop_sequence")  # which one: the engine's Done.info (see stop_of)


# -- /v1/models -----------------------------------------------------------------------------------------------
MODELS = {"alpha": "/m/alpha.gguf", "beta": "/m/beta.gguf"}


def _resolve(name):
    """The pool's names: the ``--model`` file (path or id), the installed models, the remote ``cloud``."""
    if name == "cloud":
        return name, "remote:" + name
    if name in (None, "/own/mine.gguf", "mine"):
        return "mine", "/own/mine.gguf"
    for mid, path in MODELS.items():
        if name in (mid, path, path.rsplit("/", 1)[1]):
            return mid, path
    raise ModelNotFound(name, list(MODELS))


@pytest.fixture()
def pooled():
    """``hearth serve --model /own/mine.gguf`` (a file outside the models folder) with a remote engine."""
    pool = ModelPool(_resolve, lambda key, path: FakeEngine(path), lambda key, path: GIB, budget_bytes=None,
                     reaper_interval_s=0)
    pool.remote_names = ("cloud",)
    catalog = ModelCatalog(lambda: [(k, v, "chat") for k, v in MODELS.items()])
    app = create_app(settings=ServerSettings(), pool=pool, default_model="/own/mine.gguf", catalog=catalog,
                     embedder=FakeEmbedder())
    try:
        with ServerThread(app) as srv:
            yield srv
    finally:
        pool.close()


def test_openai_models_list_names_the_served_file_first_and_remotes(pooled):
    c = openai.OpenAI(base_url=pooled.url + "/v1", api_key="unused", max_retries=0)
    models = c.models.list().data
    assert [m.id for m in models] == ["mine", "alpha", "beta", "cloud", "mini@0123456789ab"]
    by_id = {m.id: m.model_extra["hearth"] for m in models}
    assert by_id["mine"]["file"] == "mine.gguf" and by_id["cloud"]["remote"] is True
    assert by_id["mini@0123456789ab"]["kind"] == "embedding"
    assert c.models.retrieve("cloud").id == "cloud"
    r = c.chat.completions.create(model=models[0].id, messages=HI)
    assert r.model == "mine"  # what a client that picks the first listed model gets


def test_anthropic_models_list_and_retrieve_in_anthropics_shape(pooled, fake):
    page = client(pooled).models.list()
    assert [m.id for m in page.data] == ["mine", "alpha", "beta", "cloud", "mini@0123456789ab"]
    assert all(m.type == "model" and m.display_name == m.id and m.created_at.year >= 1970 for m in page.data)
    assert page.first_id == "mine" and page.last_id == "mini@0123456789ab" and page.has_more is False
    first = client(pooled).models.list(limit=2)
    assert [m.id for m in first.data] == ["mine", "alpha"] and first.has_more
    assert [m.id for m in first.get_next_page().data] == ["beta", "cloud"]  # after_id=alpha
    assert [m.id for m in client(pooled).models.list(before_id="cloud", limit=1).data] == ["beta"]
    got = client(pooled).models.retrieve("alpha")
    assert got.type == "model" and got.id == "alpha"
    with pytest.raises(anthropic.NotFoundError):
        client(pooled).models.retrieve("nope")
    with pytest.raises(anthropic.BadRequestError) as e:
        client(pooled).models.list(after_id="nope")
    assert "after_id" in str(e.value)
    _eng, srv = fake
    assert [m.id for m in client(srv).models.list().data] == ["fake-model"]
    plain = httpx.get(f"{srv.url}/v1/models").json()  # no anthropic-version header: OpenAI's shape
    assert plain["object"] == "list" and plain["data"][0]["object"] == "model"


# -- /v1/embeddings with token ids ----------------------------------------------------------------------------
class VocabEmbedder(FakeEmbedder):
    """``FakeEmbedder`` with a vocabulary: token id = code point, ids below 0x110000 (``detokenize``)."""

    n_vocab = 0x110000

    def detokenize(self, seqs: list[list[int]]) -> list[str]:
        for i, ids in enumerate(seqs):
            for j, t in enumerate(ids):
                if not 0 <= t < self.n_vocab:
                    raise InvalidRequest(f"token id {t} at input[{i}][{j}] is outside the vocabulary", param="input")
        return ["".join(chr(t) for t in ids) for ids in seqs]


@pytest.fixture(scope="module")
def embedding_server():
    eng = FakeEngine()
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG, embedder=VocabEmbedder())) as srv:
        yield srv
    eng.close()


def test_embeddings_take_token_ids(embedding_server):
    c = openai.OpenAI(base_url=embedding_server.url + "/v1", api_key="unused", max_retries=0)
    text = c.embeddings.create(model="mini", input=["a b", "ccc"])
    ids = c.embeddings.create(model="mini", input=[[ord(ch) for ch in "a b"], [ord(ch) for ch in "ccc"]])
    assert [d.embedding for d in ids.data] == [d.embedding for d in text.data]
    one = c.embeddings.create(model="mini", input=[ord(ch) for ch in "hello"])  # one text as a list of ints
    assert len(one.data) == 1 and one.data[0].embedding == [1.0, 5.0, 0.5]


@pytest.mark.parametrize("value, says", [
    ([[104, 105], []], "input[1]"),
    ([[104, -1]], "-1"),
    ([[104, 0x110000]], str(0x110000)),
    ([[104], "text"], "input"),
    ([104, [105]], "input"),
    ([True, 1], "input"),
])
def test_bad_token_ids_are_a_400_naming_them(embedding_server, value, says):
    r = httpx.post(f"{embedding_server.url}/v1/embeddings", json={"input": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input" and says in r.json()["error"]["message"]


def test_an_embedder_without_a_vocabulary_refuses_token_ids_clearly():
    eng = FakeEngine()
    try:
        with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG, embedder=FakeEmbedder())) as srv:
            r = httpx.post(f"{srv.url}/v1/embeddings", json={"input": [[1, 2]]})
    finally:
        eng.close()
    assert r.status_code == 400 and "token" in r.json()["error"]["message"]
