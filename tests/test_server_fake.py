"""The HTTP server wired to ``FakeEngine`` (``tests/fakes.py``: the real Engine queue and Generation over a
scripted runtime): routing, OpenAI shapes, SSE framing, errors, security, queueing, disconnects. No model, no
network (127.0.0.1 only)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from fakes import FakeEmbedder, FakeEngine
from fastapi.testclient import TestClient

from app.assistant import Found
from app.assistant.evidence import evidence_text
from app.errors import DiskFull, EngineCrashed, EngineUnresponsive, StoreDamaged
from app.retrieval.citecheck import CitationChecker
from app.retrieval.types import Evidence
from app.server import ServerThread, create_app
from app.server.models import ModelCatalog
from app.settings import ServerSettings

CATALOG = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat"), ("other-model", "/m/other-model.gguf",
                                                                             "chat")])
USER = [{"role": "user", "content": "hi"}]


def client(engine=None, settings=None, **kw) -> TestClient:
    app = create_app(engine if engine is not None else FakeEngine(), settings or ServerSettings(),
                     catalog=kw.pop("catalog", CATALOG), **kw)
    return TestClient(app, base_url="http://127.0.0.1:8765", raise_server_exceptions=False)


def events(raw: bytes) -> list:
    """Parse an SSE body strictly: ``data: ...\\n\\n`` frames, LF only."""
    assert b"\r" not in raw
    text = raw.decode("utf-8")
    assert text.endswith("\n\n")
    frames = text[:-2].split("\n\n")
    assert all(f.startswith("data: ") and "\n" not in f for f in frames), frames
    assert frames[-1] == "data: [DONE]"
    return [json.loads(f[6:]) for f in frames[:-1]]


def err(r: httpx.Response, status: int, param=None, code=None) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) >= {"message", "type", "param", "code"}
    if param is not None:
        assert e["param"] == param
    if code is not None:
        assert e["code"] == code
    return e


@pytest.fixture(scope="module")
def c() -> TestClient:
    return client()


# -- models -------------------------------------------------------------------------------------------------
def test_models_list_and_retrieve(c):
    data = c.get("/v1/models").json()
    assert data["object"] == "list"
    ids = [m["id"] for m in data["data"]]
    assert ids == ["fake-model", "other-model"]
    assert data["data"][0]["hearth"]["loaded"] is True and data["data"][1]["hearth"]["loaded"] is False
    assert c.get("/v1/models/fake-model").json()["id"] == "fake-model"
    err(c.get("/v1/models/nope"), 404, "model", "model_not_found")


@pytest.mark.parametrize("name", ["fake-model", "fake-model.gguf", None])
def test_loaded_model_by_id_or_file_name(c, name):
    body = {"messages": USER, **({"model": name} if name else {})}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["model"] == "fake-model"


def test_unknown_model_404_lists_ids_and_other_model_400(c):
    e = err(c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": USER}), 404, "model",
            "model_not_found")
    assert e["available"] == ["fake-model", "other-model"] and "fake-model" in e["message"]
    e = err(c.post("/v1/completions", json={"model": "other-model", "prompt": "x"}), 400, "model", "model_not_loaded")
    assert "fake-model" in e["message"]


# -- chat / completions ------------------------------------------------------------------------------------
def test_chat_shape_usage_and_hearth_metadata(c):
    j = c.post("/v1/chat/completions", json={"messages": USER, "user": "ignored", "store": False}).json()
    assert j["object"] == "chat.completion" and j["id"].startswith("chatcmpl-")
    (ch,) = j["choices"]
    assert ch["message"] == {"role": "assistant", "content": "echo: hi", "refusal": None}
    assert ch["finish_reason"] == "stop" and ch["index"] == 0 and ch["logprobs"] is None
    u = j["usage"]
    assert u["completion_tokens"] == 8 and u["total_tokens"] == u["prompt_tokens"] + 8
    h = j["hearth"]
    assert h["template"] == "fake" and h["model_file"] == "fake-model.gguf" and h["metrics"]["ttft_s"] >= 0
    assert h["metrics"]["prompt_tokens"] == u["prompt_tokens"] and "cache_source" in h["metrics"]
    # no max_tokens: the answer may take the rest of the context, so nothing is free
    assert h["context"] == {"prompt_tokens": u["prompt_tokens"], "evidence": 0, "max_tokens": None,
                            "max_tokens_clamped": False, "n_ctx": 512, "free": 0}
    assert not {"citations", "evidence", "search_notice"} & set(h)  # only when documents were asked for
    h = c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 9}).json()["hearth"]
    assert h["context"]["max_tokens"] == 9 and h["context"]["free"] == 512 - u["prompt_tokens"] - 9


def test_parameters_reach_the_engine():
    eng = FakeEngine()
    c = client(eng)
    r = c.post("/v1/chat/completions", json={
        "messages": [{"role": "developer", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "temperature": 0.3, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 11, "stop": "xx",
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"42": -100}, "max_completion_tokens": 9})
    assert r.status_code == 200, r.text
    req = eng.seen[-1]
    assert [m.role for m in req.messages] == ["system", "user"] and req.messages[1].content == "a\nb"
    d = req.decoding
    got = (d.temperature, d.top_p, d.top_k, d.min_p, d.seed, d.stop, d.max_tokens)
    assert got == (0.3, 0.5, 7, 0.1, 11, ("xx",), 9)
    assert d.logit_bias == ((42, -100.0),) and d.presence_penalty == 0.5


def test_max_tokens_absent_means_until_stop_and_length_finish(c):
    eng = FakeEngine()
    c2 = client(eng)
    assert c2.post("/v1/chat/completions", json={"messages": USER, "max_tokens": None}).status_code == 200
    assert eng.seen[-1].decoding.max_tokens is None
    j = c2.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 3}).json()
    assert j["choices"][0]["message"]["content"] == "ech" and j["choices"][0]["finish_reason"] == "length"


def test_huge_max_tokens_is_clamped_with_length():
    c2 = client(FakeEngine(n_ctx=64, reply=lambda r: "z" * 500))
    j = c2.post("/v1/completions", json={"prompt": "abc", "max_tokens": 100000000}).json()
    assert j["choices"][0]["finish_reason"] == "length"
    assert len(j["choices"][0]["text"]) == 60
    assert j["hearth"]["context"] == {"prompt_tokens": 4, "evidence": 0, "max_tokens": 60, "max_tokens_clamped": True,
                                      "n_ctx": 64, "free": 0}


def test_context_overflow_400_with_both_counts():
    c2 = client(FakeEngine(n_ctx=64))
    e = err(c2.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "w " * 100}]}), 400,
            code="context_length_exceeded")
    assert e["n_ctx"] == 64 and e["prompt_tokens"] > 64
    assert str(e["prompt_tokens"]) in e["message"] and "64" in e["message"]
    assert c2.post("/v1/chat/completions", json={"messages": USER}).status_code == 200


def test_n_choices_with_distinct_seeds(c):
    j = c.post("/v1/chat/completions", json={"messages": USER, "n": 3, "seed": 5}).json()
    assert [ch["index"] for ch in j["choices"]] == [0, 1, 2]
    assert [ch["message"]["content"] for ch in j["choices"]] == [f"echo: hi (seed {s})" for s in (5, 6, 7)]
    assert j["usage"]["completion_tokens"] == sum(len(f"echo: hi (seed {s})") for s in (5, 6, 7))


def test_completions_list_prompt_and_stop(c):
    j = c.post("/v1/completions", json={"prompt": ["one", "two"], "stop": ["w"], "n": 2}).json()
    assert j["object"] == "text_completion"
    assert [ch["text"] for ch in j["choices"]] == ["echo: one", "echo: one", "echo: t", "echo: t"]
    assert [ch["index"] for ch in j["choices"]] == [0, 1, 2, 3]


def test_logprobs_chat_and_completions(c):
    j = c.post("/v1/chat/completions", json={"messages": USER, "logprobs": True, "top_logprobs": 2}).json()
    content = j["choices"][0]["logprobs"]["content"]
    assert "".join(t["token"] for t in content) == "echo: hi"
    assert content[0]["bytes"] == list(b"e") and len(content[0]["top_logprobs"]) == 2
    j = c.post("/v1/chat/completions", json={"messages": USER, "logprobs": True}).json()
    assert j["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    j = c.post("/v1/completions", json={"prompt": "x", "logprobs": 1}).json()
    lp = j["choices"][0]["logprobs"]
    assert lp["tokens"][:2] == ["e", "c"] and lp["text_offset"][:3] == [0, 1, 2] and len(lp["top_logprobs"][0]) == 1


def test_response_format_grammars():
    eng = FakeEngine()
    c2 = client(eng)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = c2.post("/v1/chat/completions", json={"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}})
    assert r.status_code == 200 and "root" in eng.seen[-1].decoding.grammar
    assert c2.post("/v1/chat/completions", json={"messages": USER, "response_format": {"type": "json_object"}}
                   ).status_code == 200
    assert eng.seen[-1].decoding.grammar


@pytest.mark.parametrize("schema", [
    {"type": "nonsense"},
    {"$ref": "https://example.com/schema.json"},
    {"type": "string", "maxLength": 5000},
    {"type": "string", "maxLength": 987654321},  # written out, this grammar took 23 GB before the kernel killed us
    {"type": "array", "minItems": "three"},
])
def test_bad_schemas_are_400(c, schema):
    r = c.post("/v1/chat/completions", json={"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    err(r, 400, "response_format")


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]}),
    ("/v1/completions", {"prompt": "hi \udfff there"}),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(c, path, body):
    """JSON may escape a lone surrogate (``"\\ud800"``); it is not Unicode text and cannot be tokenized."""
    import json

    r = c.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    e = err(r, 400)
    assert e["param"] in ("messages[0].content", "prompt") and "surrogate" in e["message"]


@pytest.mark.parametrize("path,body,param,says", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [1]}]}, "messages[0].content[0]",
     "valid dictionary"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text", "needs a string 'text'"),
    ("/v1/responses", {"input": [1, 2]}, "input[0]", "valid dictionary"),
])
def test_a_list_of_parts_that_are_not_objects_names_the_part(c, path, body, param, says):
    """A string-or-parts field fails once per union branch; the error names the deepest one, not "should be
    a valid string"."""
    e = err(c.post(path, json={"model": "fake-model", **body}), 400)
    assert e["param"] == param and says in e["message"] and "valid string" not in e["message"]


# -- SSE ---------------------------------------------------------------------------------------------------
def test_stream_format_finish_reason_and_usage(c):
    plain = c.post("/v1/chat/completions", json={"messages": USER}).json()
    r = c.post("/v1/chat/completions", json={"messages": USER, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    ev = events(r.content)
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    reasons = [e["choices"][0]["finish_reason"] for e in ev]
    assert all(r is None for r in reasons[:-1]) and reasons[-1] == "stop"
    joined = "".join(e["choices"][0]["delta"].get("content", "") for e in ev)
    assert joined == plain["choices"][0]["message"]["content"]
    assert all("usage" not in e for e in ev)
    ev = events(c.post("/v1/chat/completions", json={"messages": USER, "stream": True,
                                                     "stream_options": {"include_usage": True}}).content)
    assert ev[-1]["choices"] == [] and ev[-1]["usage"] == plain["usage"]
    assert all(e["usage"] is None for e in ev[:-1])


def test_stream_completions_and_n2(c):
    ev = events(c.post("/v1/completions", json={"prompt": "ab", "stream": True, "n": 2, "max_tokens": 4}).content)
    for i in (0, 1):
        mine = [e["choices"][0] for e in ev if e["choices"][0]["index"] == i]
        assert "".join(x["text"] for x in mine) == "echo"
        assert mine[-1]["finish_reason"] == "length" and all(x["finish_reason"] is None for x in mine[:-1])


def test_stream_errors_before_first_token_are_http_errors():
    eng = FakeEngine(n_ctx=32)
    c2 = client(eng)
    err(c2.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 100}], "stream": True}),
        400, code="context_length_exceeded")
    eng.fail_next = EngineCrashed("boom")
    r = c2.post("/v1/chat/completions", json={"messages": USER, "stream": True})
    err(r, 503, code="engine_crashed")
    assert r.headers["retry-after"] == "1"
    eng.fail_next = EngineUnresponsive("the engine process stopped responding: it sent no heartbeat for 10 s")
    r = c2.post("/v1/chat/completions", json={"messages": USER})
    err(r, 503, code="engine_unresponsive")
    assert r.headers["retry-after"] == "1" and "heartbeat" in r.json()["error"]["message"]


@pytest.mark.parametrize("exc,status,code", [
    (DiskFull("/data/hearth.db"), 507, "insufficient_storage"),
    (StoreDamaged("/data/hearth.db", "a page is damaged"), 503, "store_damaged"),
])
def test_store_faults_are_named_not_500(exc, status, code):
    """Disk full and a damaged store were a 500 "hearth_error" (issue 29, item 5)."""
    eng = FakeEngine()
    eng.fail_next = exc
    r = client(eng).post("/v1/chat/completions", json={"messages": USER})
    err(r, status, code=code)
    assert "/data/hearth.db" in r.json()["error"]["message"]


# -- errors ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_tokens": -5}, "max_tokens"),
    ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": USER, "n": 0}, "n"),
    ({"messages": USER, "n": 99}, "n"),
    ({"messages": USER, "temperature": 3}, "temperature"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "seed": -1}, "seed"),
    ({"messages": USER, "stop": ["a"] * 20}, "stop"),
    ({"messages": USER, "logit_bias": {"x": 1}}, "logit_bias"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
])
def test_bad_chat_requests_are_400_naming_param(c, body, param):
    err(c.post("/v1/chat/completions", json=body), 400, param)


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "logprobs": 9}, "logprobs"),
])
def test_bad_completion_requests_are_400(c, body, param):
    err(c.post("/v1/completions", json=body), 400, param)


def test_malformed_bodies_and_routes(c):
    err(c.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}), 400,
        code="invalid_json")
    err(c.post("/v1/chat/completions", json=[1, 2]), 400)
    err(c.get("/v1/nothing"), 404, code="not_found")
    err(c.get("/v1/chat/completions"), 405)
    # the next valid request is fine
    assert c.post("/v1/chat/completions", json={"messages": USER}).status_code == 200


def test_unexpected_error_is_500_without_traceback():
    def boom(_req):
        raise RuntimeError("secret internals")

    r = client(FakeEngine(reply=boom)).post("/v1/chat/completions", json={"messages": USER})
    e = err(r, 500, code="internal_error")
    assert "secret" not in r.text and "Traceback" not in r.text and e["type"] == "server_error"


def test_no_engine_is_503():
    c2 = TestClient(create_app(lambda: None, ServerSettings(), catalog=CATALOG), base_url="http://127.0.0.1")
    err(c2.post("/v1/chat/completions", json={"messages": USER}), 503, code="no_model_loaded")
    assert c2.get("/health").status_code == 503


# -- documents (RAG) ---------------------------------------------------------------------------------------
PELICAN = Evidence("a1b2c3d4e5f6", "/docs/birds.txt", None, 1.0, "The code word is PELICAN.", 0, 25)
PAGE3 = Evidence("0f0e0d0c0b0a", "/docs/manual.pdf", 3, 0.5, "The code word changes every week.", 90, 123)
QUESTION = "What is the code word?"
HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
           {"role": "assistant", "content": "Hi! How can I help?"}]


class FakeDocs:
    """``app.assistant.DocumentSource``'s ``search`` over fixed passages: a passage matches when it shares a
    word with the query; it records the queries and the k each was searched with. ``checker()``: the real
    citation check without embeddings (facts only), as a source without an embedding model has."""

    notice = "no embedding model installed: keyword search (BM25) only"

    def __init__(self, passages=(PELICAN, PAGE3)) -> None:
        self.passages, self.queries = passages, []

    def checker(self):
        return CitationChecker(None)

    def search(self, query, k, paths=None, mode=None):
        self.queries.append((query, k))
        words = set(query.lower().strip("?").split()) - {"what", "is", "the"}
        items = [e for e in self.passages if words & set(e.text.lower().strip(".").split())][:k]
        return Found(tuple(items), self.notice)


def cite_pelican(req):
    last = req.messages[-1].content
    return "The code word is PELICAN [E:a1b2c3d4e5f6]." if "[E:a1b2c3d4e5f6]" in last else "I do not know."


def rag(**kw):
    eng, docs = FakeEngine(n_ctx=4096, reply=kw.pop("reply", cite_pelican)), FakeDocs(**kw)
    return eng, docs, client(eng, documents=docs)


def ask(c, *, stream=False, **hearth):
    return c.post("/v1/chat/completions", json={"messages": [*HISTORY, {"role": "user", "content": QUESTION}],
                                                "hearth": {"documents": True, **hearth}, "stream": stream})


@pytest.mark.parametrize("body,param", [
    ({"messages": USER, "hearth": {"documents": "yes"}}, "hearth.documents"),
    ({"messages": USER, "hearth": {"documents": True, "k": 0}}, "hearth.k"),
    ({"messages": USER, "hearth": {"documents": True, "k": 99}}, "hearth.k"),
    ({"messages": USER, "hearth": {"documents": True, "k": "4"}}, "hearth.k"),
    ({"messages": USER, "hearth": {"document": True}}, "hearth.document"),  # a typo is not silently ignored
    ({"messages": USER, "hearth": True}, "hearth"),
    ({"messages": [{"role": "assistant", "content": "x"}], "hearth": {"documents": True}}, "messages"),
    ({"messages": [{"role": "user", "content": "  "}], "hearth": {"documents": True}}, "messages[0].content"),
])
def test_documents_bad_fields_are_400(body, param):
    err(rag()[2].post("/v1/chat/completions", json=body), 400, param)


def test_documents_unavailable_is_400_and_off_by_default(c):
    e = err(c.post("/v1/chat/completions", json={"messages": USER, "hearth": {"documents": True}}), 400,
            "hearth.documents", "documents_unavailable")
    assert "--documents" in e["message"]
    err(c.post("/v1/completions", json={"prompt": "x", "hearth": {"documents": True}}), 400, "hearth.documents")
    assert c.post("/v1/chat/completions", json={"messages": USER, "hearth": {"documents": False}}).status_code == 200


def test_documents_evidence_before_last_user_message_and_citations():
    eng, docs, c = rag()
    j = ask(c, k=1).json()
    first = list(docs.queries)
    ask(c)
    second = docs.queries[len(first):]
    # Every user message of the request is searched for its own evidence (app/assistant/grounding.py), with
    # the request's k, then the default.
    assert {q for q, _ in first} == {q for q, _ in second} == {QUESTION, "Hello"}
    assert {k for _, k in first} == {1} and {k for _, k in second} == {4}
    msgs = [(m.role, m.content) for m in eng.seen[-2].messages]
    assert msgs[:3] == [(m["role"], m["content"]) for m in HISTORY]  # system and history untouched: cacheable
    block = evidence_text([PELICAN]).block()  # the stored chat's placement: the evidence, then the question
    assert msgs[3] == ("user", block + QUESTION) and len(msgs) == 4
    h = j["hearth"]
    assert j["choices"][0]["message"]["content"] == "The code word is PELICAN [E:a1b2c3d4e5f6]."
    assert h["citations"] == [{"evidence_id": "a1b2c3d4e5f6", "path": "/docs/birds.txt", "page": None,
                               "quote": "The code word is PELICAN.", "supported": True,
                               "sentence_start": 0, "sentence_end": 25,
                               "support": {"supported": True, "missing": [], "similarity": None,
                                           "threshold": None, "reason": "facts found in the cited passage"}}]
    assert h["evidence"] == [{"evidence_id": "a1b2c3d4e5f6", "path": "/docs/birds.txt", "page": None,
                              "text": "The code word is PELICAN."}]
    assert h["search_notice"] == docs.notice and h["template"] == "fake" and "ttft_s" in h["metrics"]
    ctx = h["context"]
    assert ctx["evidence"] == len(block) and ctx["prompt_tokens"] == j["usage"]["prompt_tokens"] > len(block)


def test_documents_uncited_answer_and_no_match():
    eng, docs, c = rag(reply=lambda r: "No idea.")
    h = ask(c).json()["hearth"]
    assert h["citations"] == [] and [e["evidence_id"] for e in h["evidence"]] == ["a1b2c3d4e5f6", "0f0e0d0c0b0a"]
    assert h["evidence"][1]["page"] == 3
    eng, docs, c = rag(passages=())
    h = ask(c).json()["hearth"]
    assert (h["citations"], h["evidence"], h["context"]["evidence"]) == ([], [], 0)
    assert eng.seen[-1].messages[-1].content == QUESTION  # nothing matched: the question alone


def test_documents_streamed_hearth_on_the_final_chunk_and_n2():
    _eng, _docs, c = rag()
    whole = ask(c).json()["hearth"]
    ev = events(ask(c, stream=True).content)
    assert all("hearth" not in e for e in ev[:-1]) and ev[-1]["choices"][0]["finish_reason"] == "stop"
    last = ev[-1]["hearth"]
    for key in ("citations", "evidence", "search_notice", "context", "template"):
        assert last[key] == whole[key], key
    j = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}], "n": 2,
                                             "hearth": {"documents": True}}).json()
    assert len(j["hearth"]["evidence"]) == 2 and len(j["hearth"]["choices"]) == 2
    assert all(ch["citations"][0]["evidence_id"] == "a1b2c3d4e5f6" for ch in j["hearth"]["choices"])


WEEKLY = Evidence("99aa88bb77cc", "/docs/manual.pdf", 4, 0.4, "Dogs get a bath once a week in spring.", 10, 48)


def cite_two(req):
    return ("The code word is PELICAN [E:a1b2c3d4e5f6]. Dogs get a bath 3 times a week in March "
            "[E:99aa88bb77cc].")


def check_marks(cites, answer):
    """One supported and one unsupported citation, each naming its sentence of ``answer``."""
    good, bad = cites
    assert good["supported"] is True and bad["supported"] is False
    assert answer[good["sentence_start"]:good["sentence_end"]].strip() == "The code word is PELICAN"
    assert answer[bad["sentence_start"]:bad["sentence_end"]].strip() == "Dogs get a bath 3 times a week in March"
    assert bad["support"]["missing"] == ["3", "March"] and "3" in bad["support"]["reason"]
    assert bad["support"]["reason"] == "not in the cited passage: 3, March"


def ask_two(c, stream=False, n=1):
    q = "What is the code word and how often do dogs get a bath?"
    return c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": q}], "n": n,
                                                "hearth": {"documents": True}, "stream": stream})


def test_documents_citation_check_marks_unsupported_sentences():
    # The fake source's checker is the real facts check: "3 times ... in March" is not in the passage it cites.
    _eng, _docs, c = rag(reply=cite_two, passages=(PELICAN, WEEKLY))
    j = ask_two(c).json()
    answer = j["choices"][0]["message"]["content"]
    check_marks(j["hearth"]["citations"], answer)
    last = events(ask_two(c, stream=True).content)[-1]["hearth"]
    assert last["citations"] == j["hearth"]["citations"]  # the streamed final chunk: the same marks
    for ch in ask_two(c, n=2).json()["hearth"]["choices"]:  # n > 1: each choice's own
        check_marks(ch["citations"], answer)
    # /v1/responses and /v1/messages take no hearth.documents (a 400 naming it), so only chat emits citations


# -- embeddings --------------------------------------------------------------------------------------------
def test_embeddings():
    c2 = client(embedder=FakeEmbedder())
    j = c2.post("/v1/embeddings", json={"model": "mini", "input": ["a b", "ccc"]}).json()
    assert [d["embedding"] for d in j["data"]] == [[1.0, 3.0, 0.5], [1.0, 3.0, 0.5]]
    assert j["usage"] == {"prompt_tokens": 3, "total_tokens": 3} and j["model"] == "mini@0123456789ab"
    b = c2.post("/v1/embeddings", json={"input": "x", "encoding_format": "base64"}).json()
    assert isinstance(b["data"][0]["embedding"], str)
    err(c2.post("/v1/embeddings", json={"model": "fake-model", "input": "x"}), 400, "model", "model_cannot_embed")
    err(c2.post("/v1/embeddings", json={"model": "nope", "input": "x"}), 404, "model", "model_not_found")
    err(c2.post("/v1/embeddings", json={"input": [1, 2]}), 400, "input")
    err(c2.post("/v1/embeddings", json={"input": "x", "dimensions": 7}), 400, "dimensions")


def test_embeddings_without_embedder_is_400(c):
    e = err(c.post("/v1/embeddings", json={"model": "fake-model", "input": "x"}), 400, "model", "model_cannot_embed")
    assert "cannot embed" in e["message"]


# -- security ----------------------------------------------------------------------------------------------
def test_host_header_check():
    c2 = client()
    assert c2.get("/v1/models", headers={"host": "localhost:8765"}).status_code == 200
    assert c2.get("/v1/models", headers={"host": "[::1]:8765"}).status_code == 200
    err(c2.get("/v1/models", headers={"host": "evil.example:8765"}), 403, code="host_not_allowed")
    c3 = client(allow_hosts=["hearth.lan"])
    assert c3.get("/v1/models", headers={"host": "hearth.lan:8765"}).status_code == 200


def test_api_key():
    c2 = client(settings=ServerSettings(api_key="sekrit"))
    err(c2.get("/v1/models"), 401, code="invalid_api_key")
    err(c2.get("/v1/models", headers={"authorization": "Bearer nope"}), 401, code="invalid_api_key")
    assert c2.get("/v1/models", headers={"authorization": "Bearer sekrit"}).status_code == 200
    assert c2.get("/health").status_code == 200  # liveness needs no key
    err(c2.get("/metrics"), 401)


def test_cors_preflight_without_key_then_key_required():
    origin = "http://localhost:5173"
    c2 = client(settings=ServerSettings(api_key="k", cors_origins=[origin]))
    pre = c2.options("/v1/chat/completions", headers={
        "origin": origin, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert pre.status_code == 204
    assert pre.headers["access-control-allow-origin"] == origin
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    r = c2.post("/v1/chat/completions", json={"messages": USER}, headers={"origin": origin})
    err(r, 401)
    assert r.headers["access-control-allow-origin"] == origin  # the page can read the 401
    r = c2.post("/v1/chat/completions", json={"messages": USER},
                headers={"origin": origin, "authorization": "Bearer k"})
    assert r.status_code == 200
    err(c2.post("/v1/chat/completions", json={"messages": USER},
                headers={"origin": "http://evil.example", "authorization": "Bearer k"}),
        403, code="origin_not_allowed")


def test_cross_origin_refused_when_cors_off(c):
    err(c.post("/v1/chat/completions", json={"messages": USER}, headers={"origin": "http://evil.example"}), 403)
    same = c.post("/v1/chat/completions", json={"messages": USER}, headers={"origin": "http://127.0.0.1:8765"})
    assert same.status_code == 200


# -- real sockets: queue, disconnects, concurrency, openai client -------------------------------------------
@pytest.fixture(scope="module")
def slow():
    eng = FakeEngine(max_queue=1, token_delay_s=0.01, reply=lambda r: r.messages[-1].content * 400)
    app = create_app(eng, ServerSettings(), catalog=CATALOG)
    with ServerThread(app) as srv:
        yield eng, srv


def _stream(url: str, content: str, max_tokens: int = 200):
    return httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30,
                        json={"messages": [{"role": "user", "content": content}], "stream": True,
                              "max_tokens": max_tokens})


def test_queue_full_is_429_with_retry_after():
    # max_queue=1: one request runs, one waits, the next is refused. A runs for about 3.8 s (190 tokens of
    # 20 ms), so it is still running when the third request comes even on a loaded machine; B is short.
    eng = FakeEngine(max_queue=1, token_delay_s=0.02,
                     reply=lambda r: "x" * (190 if r.messages[-1].content == "A" else 5))
    results: list = []
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        def run(tag):
            with _stream(srv.url, tag) as r:
                results.append((tag, r.status_code, r.read()))

        threads = [threading.Thread(target=run, args=(t,)) for t in ("A", "B")]
        threads[0].start()
        assert eng.started.wait(5)
        threads[1].start()
        deadline = time.time() + 5
        # A counts as running once its stream has read its "admitted" event; until then it counts as waiting
        # itself, and the third request would overtake B.
        while (eng.active() < 1 or eng.queue_depth() < 1) and time.time() < deadline:
            time.sleep(0.01)
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": USER}, timeout=10)
        err(r, 429, code="queue_full")
        assert int(r.headers["retry-after"]) >= 1
        for t in threads:
            t.join(30)
    assert sorted(s for _, s, _ in results) == [200, 200]


def test_disconnect_cancels_and_next_request_starts_at_once(slow):
    eng, srv = slow
    before, completed, tokens = eng.stats.cancelled, eng.stats.completed, eng.stats.completion_tokens
    with _stream(srv.url, "L", max_tokens=2000) as r:
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
            if got == 3:
                break
    j = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": USER, "max_tokens": 1}, timeout=10).json()
    assert j["choices"][0]["finish_reason"] == "length"
    # One slot: the new request ran once the stream before it had ended, and that stream ended cancelled,
    # part-way through its 400 tokens, not by running them out: only the new request completed.
    assert eng.stats.cancelled == before + 1
    assert (eng.stats.completed, eng.stats.completion_tokens) == (completed + 1, tokens + 1), eng.stats
    m = httpx.get(f"{srv.url}/metrics").text
    assert "hearth_requests_cancelled_total 1" in m


def test_parallel_streams_do_not_mix(slow):
    _eng, srv = slow
    out: dict = {}

    def run(tag):
        c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
        s = c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": tag}], stream=True,
                                      max_tokens=30)
        out[tag] = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)

    eng2 = FakeEngine(max_queue=8, token_delay_s=0.002, reply=lambda r: r.messages[-1].content * 30)
    with ServerThread(create_app(eng2, ServerSettings(), catalog=CATALOG)) as srv2:
        srv = srv2
        threads = [threading.Thread(target=run, args=(t,)) for t in ("P", "Q", "R", "S")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert out == {t: t * 30 for t in ("P", "Q", "R", "S")}


def test_openai_client_typed_errors(slow):
    _eng, srv = slow
    c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    assert [m.id for m in c.models.list()] == ["fake-model", "other-model"]
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=USER)
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="fake-model", messages=USER, max_tokens=0)
    assert ei.value.param == "max_tokens"
    with ServerThread(create_app(FakeEngine(), ServerSettings(api_key="k"), catalog=CATALOG)) as s2:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{s2.url}/v1", api_key="wrong", max_retries=0).models.list()


def test_serve_refuses_non_loopback_without_flag(capsys):
    from app.cli import main

    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "--i-know-this-exposes-my-machine" in capsys.readouterr().err


def test_json_body_without_json_content_type_is_accepted():
    """``curl -d '{...}'`` labels the body as a form; like llama-server and Ollama, Hearth reads it as JSON."""
    eng = FakeEngine(reply=lambda r: "ok")
    with ServerThread(create_app(eng, ServerSettings(), catalog=CATALOG)) as srv:
        body = json.dumps({"messages": USER, "max_tokens": 4}).encode()
        for ctype in (None, "application/x-www-form-urlencoded"):
            headers = {"Content-Type": ctype} if ctype else {}
            r = httpx.post(f"{srv.url}/v1/chat/completions", content=body, headers=headers, timeout=10)
            assert r.status_code == 200, r.text
        r = httpx.post(f"{srv.url}/v1/chat/completions", content=b"messages=hi",
                       headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=10)
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_connections_are_accepted_with_nagle_off():
    """The server's connections write each SSE chunk at once: asyncio turns Nagle's algorithm off only on sockets
    whose ``proto`` is ``IPPROTO_TCP``, which accepted sockets copy from the listener (``app.server.run._bind``).
    With Nagle on, a chunk written right after the headers waited for the client's delayed ACK (40 ms here)."""
    import socket

    from app.server.run import _bind

    listener = _bind("127.0.0.1", 0)
    client = socket.create_connection(listener.getsockname()[:2])
    conn, _ = listener.accept()
    try:
        for s in (listener, conn):
            assert s.proto == socket.IPPROTO_TCP
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        for s in (conn, client, listener):
            s.close()


def test_metrics_say_while_the_disk_prefix_cache_is_off():
    """A prefix cache that turned itself off was silent in /metrics (issue 29, item 1)."""
    from app.protocol.types import Done, Metrics
    from app.server.metrics import ServerMetrics

    m = ServerMetrics()
    m.generation(Done("stop", Metrics(prompt_tokens=9, cache_error="disk cache off: disk full: /d/kv-cache")))
    text = m.render()
    assert "hearth_prefix_cache_disk_off 1" in text and "hearth_prefix_cache_disk_off_generations_total 1" in text
    m.generation(Done("stop", Metrics(prompt_tokens=9)))  # it was opened again
    text = m.render()
    assert "hearth_prefix_cache_disk_off 0" in text and "hearth_prefix_cache_disk_off_generations_total 1" in text
