"""A tester's findings on the port (issue 26), each fixed with the test that failed before:

1. The template's stop strings ("\\n\\n", "\\nUser:", "User:", the JSON tool format's "Tool result:") cut
   grammar-bound JSON inside a string into invalid JSON with finish_reason "stop": under a grammar they no
   longer apply (``templates.render``); a request's own ``stop`` still does, and a JSON it cut short is a 422
   (``structured.check_cut``). The real bundled model (``model`` marker) answers the tester's repro whole.
2. One ``keep_alive: 0`` stuck to the model: every later request unloaded it (the pool's ``_lease``).
3. ``options.num_ctx`` 10^9 told the user to run ``hearth serve --n-ctx 1000000000``.
4. ``POST /api/show {}`` answered the embedding model, or a 404 without one: now the default chat model.
5. The embedding model's size, details and created time in the listings.
6. Anthropic: ``stop_sequences`` errors named ``stop``; ``/v1/models`` errors with an ``anthropic-version``
   header came in OpenAI's shape.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from fakes import FakeEmbedder, FakeEngine
from fastapi.testclient import TestClient
from gguf_writer import write_gguf
from test_server_models import chat, client, make_pool

from app.engine.chat.templates import render
from app.protocol.tools import ToolChoice, ToolSpec
from app.protocol.types import ChatMessage
from app.server import ServerThread, create_app
from app.server.errors import AnswerMismatch
from app.server.models import ModelCatalog
from app.server.ollama import sampling
from app.server.structured import check_cut
from app.settings import ServerSettings

WHO = {"type": "object", "properties": {"who": {"type": "string", "enum": ["User: Bob"]}}, "required": ["who"],
       "additionalProperties": False}
STRICT = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": WHO}}
ASK = [{"role": "user", "content": "Who spoke?"}]
TOOL = ToolSpec("get_time", "the time in a zone", {"type": "object", "properties": {"tz": {"type": "string"}}})
GRAMMAR = 'root ::= "{}"'


# -- 1. template stop strings under a grammar ----------------------------------------------------------------
def test_a_grammar_bound_answer_gets_no_template_stop_strings():
    msgs = (ChatMessage("user", "Who spoke?"),)
    assert render(msgs, "transcript").stop == ("\n\n", "\nUser:", "User:")  # a free answer still ends there
    assert render(msgs, "transcript", answer_grammar=GRAMMAR).stop == ()
    assert render(msgs, "chatml", answer_grammar=GRAMMAR).stop == ()
    with_prefill = msgs + (ChatMessage("assistant", '{"who": '),)
    assert render(with_prefill, "transcript", answer_grammar=GRAMMAR).stop == ()


@pytest.mark.parametrize("choice,answer,bound", [
    (ToolChoice("auto"), None, False), (ToolChoice("none"), None, False), (ToolChoice("required"), None, True),
    (ToolChoice("function", "get_time"), None, True), (ToolChoice("auto"), GRAMMAR, True),
    (ToolChoice("none"), GRAMMAR, True)])
def test_tools_keep_their_stop_strings_only_while_no_grammar_binds_the_answer(choice, answer, bound):
    rp = render((ChatMessage("user", "Time?"),), "transcript", tools=(TOOL,), tool_choice=choice,
                answer_grammar=answer)
    assert rp.stop == (() if bound else ("\n\n", "\nUser:", "User:", "Tool result:"))


def test_check_cut_refuses_json_a_stop_sequence_cut_and_passes_the_rest():
    with pytest.raises(AnswerMismatch, match=r"the stop sequence '\"' ended it before its JSON was complete"):
        check_cut('{"who": ', "stop", '"', ('"',))
    check_cut('{"who": "x"}', "stop", "\n", ("\n",))  # whole JSON before the stop: fine
    check_cut('{"who": ', "length", None, ('"',))  # max_tokens: finish_reason "length" says so
    check_cut('{"who": ', "stop", None, ('"',))  # the end of generation, not a stop string
    check_cut('{"who": ', "stop", "User:", ('"',))  # not one of the request's (never the case under a grammar)


@pytest.fixture(scope="module")
def stopping():
    """A port whose fake engine reports the stop string that ended an answer, as the real one does."""
    replies = {"text": '{"who": "User: Bob"}'}
    eng = FakeEngine(reply=lambda req: replies["text"])
    begin = eng.runtime.begin

    def reporting(rid, req, free):
        seq = begin(rid, req, free)
        found = [(replies["text"].find(s), s) for s in req.decoding.stop if s in replies["text"]]
        if found:
            seq.info["stop_sequence"] = min(found)[1]
        return seq

    eng.runtime.begin = reporting
    catalog = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
    c = TestClient(create_app(eng, ServerSettings(), catalog=catalog), base_url="http://127.0.0.1:8765",
                   raise_server_exceptions=False)
    yield c, replies
    eng.close()


def test_a_users_stop_that_cuts_strict_json_is_a_422_not_a_stop(stopping):
    c, replies = stopping
    replies["text"] = '{"who": "User: Bob"}'
    body = {"messages": ASK, "response_format": STRICT}
    r = c.post("/v1/chat/completions", json={**body, "stop": ["Bob"]})
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["param"] == "response_format" and e["code"] == "answer_schema_mismatch"
    assert "stop sequence 'Bob'" in e["message"] and "remove it" in e["message"]
    ok = c.post("/v1/chat/completions", json={**body, "stop": ["\n"]})  # never reached: the whole JSON
    assert ok.status_code == 200 and json.loads(ok.json()["choices"][0]["message"]["content"]) == {"who": "User: Bob"}
    free = c.post("/v1/chat/completions", json={"messages": ASK, "stop": ["Bob"]})  # no format: cut as asked
    assert free.status_code == 200 and free.json()["choices"][0]["message"]["content"] == '{"who": "User: '
    r = c.post("/api/chat", json={"messages": ASK, "format": WHO, "options": {"stop": ["Bob"]}, "stream": False})
    assert r.status_code == 422 and "stop sequence 'Bob'" in r.json()["error"] and "format" in r.json()["error"]


def test_a_cut_streamed_answer_ends_with_the_error_in_band(stopping):
    c, replies = stopping
    replies["text"] = '{"who": "User: Bob"}'
    r = c.post("/v1/chat/completions", json={"messages": ASK, "response_format": STRICT, "stop": ["Bob"],
                                             "stream": True})
    assert r.status_code == 200 and '"content":"U"' in r.text  # the text went out before the end
    assert "answer_schema_mismatch" in r.text and "stop sequence 'Bob'" in r.text


# -- 2. keep_alive per request -------------------------------------------------------------------------------
def test_one_keep_alive_zero_does_not_stick_to_later_requests():
    pool, made = make_pool(ttl_s=300)
    c = client(pool)
    assert chat(c, "beta", keep_alive=0).status_code == 200
    assert not pool.status()["beta"]["loaded"]
    for _ in range(3):
        assert chat(c, "beta").status_code == 200
    s = pool.status()["beta"]
    assert s["loaded"] and s["ttl_s"] == 300.0 and s["loads"] == 2 and len(made.engines["beta"]) == 2
    assert chat(c, "beta", keep_alive="5s").status_code == 200 and pool.status()["beta"]["ttl_s"] == 5.0
    assert chat(c, "beta").status_code == 200 and pool.status()["beta"]["ttl_s"] == 300.0


def test_an_ollama_unload_request_is_for_that_request_only():
    pool, _ = make_pool(ttl_s=300)
    c = client(pool)
    r = c.post("/api/generate", json={"model": "beta", "keep_alive": 0}).json()
    assert r["done_reason"] == "unload" and not pool.status()["beta"]["loaded"]
    assert c.post("/api/generate", json={"model": "beta", "prompt": "hi", "stream": False}).status_code == 200
    assert pool.status()["beta"]["loaded"] and pool.status()["beta"]["ttl_s"] == 300.0


def test_a_pinned_model_stays_loaded_unless_a_request_says_otherwise():
    pool, _ = make_pool(ttl_s=1)
    try:
        assert pool.pin("alpha") == "alpha"
        with pool.acquire("alpha"):
            pass
        assert pool.status()["alpha"]["ttl_s"] is None and pool.reap() == []
        with pool.acquire("alpha", keep_alive_s=0):
            pass
        assert not pool.status()["alpha"]["loaded"]
        with pool.acquire("alpha"):
            pass
        assert pool.status()["alpha"]["ttl_s"] is None  # pinned again once loaded again
    finally:
        pool.close()


# -- 3. num_ctx hint -----------------------------------------------------------------------------------------
def test_a_huge_num_ctx_suggests_the_trained_context_not_itself():
    with pytest.raises(Exception) as e:
        sampling({"num_ctx": 10**9}, 4096, lambda: 32768)
    assert "--n-ctx 32768" in str(e.value) and "1000000000`" not in str(e.value)
    with pytest.raises(Exception) as e:
        sampling({"num_ctx": 8192}, 4096, lambda: 32768)
    assert "--n-ctx 8192" in str(e.value)  # within the trained context: what was asked
    with pytest.raises(Exception) as e:
        sampling({"num_ctx": 10**9}, 4096)  # trained context unknown: LoadSettings' most
    assert "--n-ctx 1048576" in str(e.value)
    with pytest.raises(Exception) as e:
        sampling({"num_ctx": 10**9}, 4096, lambda: 2048)  # loaded beyond its training already
    assert "--n-ctx" not in str(e.value) and "2048 tokens" in str(e.value)


# -- 4, 5. /api/show without a model; the embedding model's metadata ----------------------------------------
class FileEmbedder(FakeEmbedder):
    def __init__(self, path: Path) -> None:
        super().__init__("mini-embed@0123456789ab")
        self.model_path = path


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    d = tmp_path_factory.mktemp("m")
    chat_path = write_gguf(d / "fake-model.gguf", "gemma3", context_length=8192)
    embed_path = write_gguf(d / "mini-embed.gguf", "bert", context_length=512)
    os.utime(embed_path, (1_600_000_000, 1_600_000_000))
    catalog = ModelCatalog(lambda: [("fake-model", str(chat_path), "chat")])
    eng = FakeEngine(chat_path, n_ctx=512)
    with ServerThread(create_app(eng, ServerSettings(), catalog=catalog, embedder=FileEmbedder(embed_path))) as a, \
            ServerThread(create_app(eng, ServerSettings(), catalog=catalog)) as b:
        yield a.url, b.url, embed_path
    eng.close()


def test_show_without_a_model_is_the_default_chat_model_with_or_without_embeddings(ports):
    for url in ports[:2]:
        for body in ({}, {"model": ""}):
            r = httpx.post(f"{url}/api/show", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["details"]["family"] == "gemma3" and "completion" in r.json()["capabilities"]


def test_num_ctx_over_the_loaded_context_names_the_trained_one(ports):
    r = httpx.post(f"{ports[1]}/api/chat", json={"messages": ASK, "options": {"num_ctx": 10**9}, "stream": False})
    assert r.status_code == 400 and "--n-ctx 8192" in r.json()["error"]


def test_the_embedding_models_listings_come_from_its_file(ports):
    url, _, path = ports
    tags = {m["name"]: m for m in httpx.get(f"{url}/api/tags").json()["models"]}
    emb = tags["mini-embed@0123456789ab"]
    assert emb["size"] == path.stat().st_size and emb["details"]["family"] == "bert"
    assert emb["modified_at"].startswith("2020-09-13")
    ps = {m["name"]: m for m in httpx.get(f"{url}/api/ps").json()["models"]}
    assert ps["mini-embed@0123456789ab"]["size"] > 0 and ps["mini-embed@0123456789ab"]["details"]["family"] == "bert"
    data = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
    assert data["mini-embed@0123456789ab"]["created"] == 1_600_000_000
    a = httpx.get(f"{url}/v1/models", headers={"anthropic-version": "2023-06-01"}).json()["data"]
    assert {m["id"]: m for m in a}["mini-embed@0123456789ab"]["created_at"] == "2020-09-13T12:26:40Z"


# -- 6. Anthropic's names and shape ---------------------------------------------------------------------------
def test_anthropic_errors_name_stop_sequences_and_models_errors_take_its_shape(ports):
    url = ports[1]
    r = httpx.post(f"{url}/v1/messages", json={"model": "fake-model", "max_tokens": 5, "messages": ASK,
                                               "stop_sequences": [""]}, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "(param: stop_sequences)" in r.json()["error"]["message"]
    h = {"anthropic-version": "2023-06-01"}
    r = httpx.get(f"{url}/v1/models/claude-3", headers=h)
    assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(f"{url}/v1/models", params={"after_id": "zzz"}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "(param: after_id)" in r.json()["error"]["message"]
    r = httpx.get(f"{url}/v1/models/claude-3")  # without the header: OpenAI's shape, as before
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_show_of_an_unknown_name_is_still_a_404(ports):
    r = httpx.post(f"{ports[1]}/api/show", json={"model": "nope"})
    assert r.status_code == 404 and "nope" in r.json()["error"]


# -- 1, on the real bundled model -----------------------------------------------------------------------------
@pytest.mark.model
def test_the_bundled_model_answers_the_repro_whole_and_still_stops_free_text(bundled_model):
    from engine_runs import served

    with served(bundled_model) as srv:
        body = {"messages": ASK, "temperature": 0, "max_tokens": 30, "response_format": STRICT}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120).json()
        assert json.loads(r["choices"][0]["message"]["content"]) == {"who": "User: Bob"}, r
        assert r["choices"][0]["finish_reason"] == "stop"
        o = httpx.post(f"{srv.url}/api/chat", json={"messages": ASK, "format": WHO, "stream": False,
                                                    "options": {"temperature": 0, "num_predict": 30}},
                       timeout=120).json()
        assert json.loads(o["message"]["content"]) == {"who": "User: Bob"}, o
        tool = {"type": "function", "function": {"name": "who_spoke", "parameters": {"type": "object",
                                                                                 "properties": {}}}}
        after = ASK + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "who_spoke", "arguments": "{}"}}]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "User: Bob"}]
        t = httpx.post(f"{srv.url}/v1/chat/completions", timeout=120, json={**body, "messages": after,
                                                                            "tools": [tool]}).json()
        m = t["choices"][0]["message"]
        assert m.get("tool_calls") or json.loads(m["content"]) == {"who": "User: Bob"}, t
        free = httpx.post(f"{srv.url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Say hello."}], "temperature": 0, "max_tokens": 60}).json()
        text = free["choices"][0]["message"]["content"]
        assert "User:" not in text and "\n\n" not in text  # the transcript's stops still end free text
