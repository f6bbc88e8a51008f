"""Issue 3's "Must show", against the real bundled model (Gemma 3 270M base, plain transcript template)
through the official ``openai`` client and raw HTTP, server on 127.0.0.1 and a free port.

One engine (n_ctx 2048) and one server per module, plus a small engine (n_ctx 512) for the overflow and
run-to-the-end cases; answers are kept short (max_tokens ≤ 40 mostly) so the module stays within a few
minutes on 2 shared cores."""

from __future__ import annotations

import json
import threading

import httpx
import jsonschema
import openai
import pytest

from app.engine.local.engine import Engine
from app.protocol.types import LoadSettings
from app.server import ServerThread, create_app
from app.settings import ServerSettings

pytestmark = pytest.mark.model
MODEL = "gemma-3-270m-q4_k_m"
EMOJI = "Reply with exactly: 👍🏽 🇯🇵 👨‍👩‍👧 歪 ß"
ORIGIN = "http://localhost:5173"


@pytest.fixture(scope="module")
def engine(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048), max_queue=8)
    eng.load()
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    with ServerThread(create_app(engine, ServerSettings())) as srv:
        yield srv


@pytest.fixture(scope="module")
def small(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=512), max_queue=4)
    eng.load()
    with ServerThread(create_app(eng, ServerSettings())) as srv:
        yield eng, srv
    eng.close()


def oai(srv, key="unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=key, max_retries=0, timeout=120)


def chat(c, content, **kw):
    return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def streamed(stream) -> tuple[str, list]:
    chunks = list(stream)
    text = "".join((ch.choices[0].delta.content or "") if ch.choices and hasattr(ch.choices[0], "delta")
                   else (ch.choices[0].text if ch.choices else "") for ch in chunks)
    return text, chunks


# -- the official client ------------------------------------------------------------------------------------
def test_client_models_chat_stream_usage_and_completions(server):
    c = oai(server)
    assert [m.id for m in c.models.list()] == [MODEL]
    r = chat(c, "What is the capital of France?", temperature=0, max_tokens=12)
    assert "Paris" in r.choices[0].message.content and r.model == MODEL
    assert r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    text, chunks = streamed(chat(c, "What is the capital of France?", temperature=0, max_tokens=12, stream=True))
    assert text == r.choices[0].message.content
    text, chunks = streamed(chat(c, "What is the capital of France?", temperature=0, max_tokens=12, stream=True,
                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    u = chunks[-1].usage
    assert (u.prompt_tokens, u.completion_tokens) == (r.usage.prompt_tokens, r.usage.completion_tokens)
    assert all(ch.usage is None for ch in chunks[:-1])
    t = c.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=5)
    assert t.choices[0].text and t.object == "text_completion"


def test_client_json_schema_output_validates(server):
    schema = {"type": "object", "additionalProperties": False, "required": ["answer", "color"],
              "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                             "color": {"type": "string", "enum": ["blue", "green", "red"]}}}
    r = chat(oai(server), "Is the sky blue? Answer in JSON.", temperature=0, max_tokens=60,
             response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_client_logprobs_streamed_equal_whole(server):
    c = oai(server)
    kw = dict(temperature=0, max_tokens=6, logprobs=True, top_logprobs=2)
    r = chat(c, "What is the capital of France?", **kw)
    whole = r.choices[0].logprobs.content
    assert whole and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in whole)
    assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token or t.token.startswith("bytes:") for t in whole)
    joined, content = "".join(t.token for t in whole), r.choices[0].message.content
    assert joined.startswith(content) or content.startswith(joined)
    _text, chunks = streamed(chat(c, "What is the capital of France?", stream=True, **kw))
    streamed_lp = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                   for t in ch.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed_lp] == [(t.token, round(t.logprob, 4)) for t in whole]


def test_client_typed_errors(server, engine):
    c = oai(server)
    with pytest.raises(openai.NotFoundError) as ei:
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}])
    assert ei.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as ei:
        chat(c, "Hi", max_tokens=0)
    assert ei.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        chat(c, "Hi", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}})
    with ServerThread(create_app(engine, ServerSettings(api_key="k"))) as keyed:
        with pytest.raises(openai.AuthenticationError):
            oai(keyed, "wrong").models.list()
        assert [m.id for m in oai(keyed, "k").models.list()] == [MODEL]


# -- the eleven numbered cases ------------------------------------------------------------------------------
def test_01_finish_reason_length_and_stop_only_on_last_chunk(server):
    c = oai(server)
    for prompt, want in (("Count from 1 to 50", "length"), ("What is the capital of France?", "stop")):
        _text, chunks = streamed(chat(c, prompt, temperature=0, max_tokens=8 if want == "length" else 30,
                                      stream=True))
        reasons = [ch.choices[0].finish_reason for ch in chunks]
        assert reasons[-1] == want, (prompt, reasons)
        assert all(r is None for r in reasons[:-1])


def test_02_emoji_stream_equals_whole_no_replacement_char(server):
    c = oai(server)
    whole = chat(c, EMOJI, temperature=0, max_tokens=40).choices[0].message.content
    text, _ = streamed(chat(c, EMOJI, temperature=0, max_tokens=40, stream=True))
    assert text == whole and "\ufffd" not in text
    raw = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": EMOJI}], "temperature": 0, "max_tokens": 40,
        "stream": True}).content
    assert "\ufffd" not in raw.decode("utf-8") and b"\r" not in raw and raw.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("prompt", ["Here is the English alphabet: ABC",
                                    "The alphabet: ABCDEFGHIJKLMNOPQRSTUVWXYZ. Again: ABC"])
def test_03_stop_string_stream_equals_whole_no_prefix_leak(server, prompt):
    c = oai(server)
    kw = dict(model=MODEL, prompt=prompt, temperature=0, stop=["DEFGHIJ"], max_tokens=30)
    whole = c.completions.create(**kw).choices[0]
    text, chunks = streamed(c.completions.create(**kw, stream=True))
    assert text == whole.text and "DEFGHIJ" not in text
    if whole.finish_reason == "stop":
        assert not any(text.endswith("DEFGHIJ"[:k]) for k in range(1, 7)), text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_04_n3_gives_three_choices(server):
    r = chat(oai(server), "Name a fruit.", n=3, temperature=0.8, seed=7, max_tokens=6)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert all(ch.finish_reason in ("stop", "length") for ch in r.choices)


def test_05_max_tokens_absent_null_bad_and_huge(small):
    eng, srv = small
    c = oai(srv)
    for kw in ({}, {"max_tokens": None}):
        r = chat(c, "What is the capital of France?", temperature=0, **kw)
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
    for bad in (0, -5):
        with pytest.raises(openai.BadRequestError) as ei:
            chat(c, "Hi", max_tokens=bad)
        assert ei.value.param == "max_tokens" and "max_tokens" in ei.value.message
    # a counting prompt that nearly fills n_ctx 512: max_tokens 1e8 is clamped to what is left
    words, n = [], 0
    while n < 470:
        words.append(str(len(words) + 1) + ",")
        n = eng.count_tokens(" ".join(words)) + 1
    r = c.completions.create(model=MODEL, prompt=" ".join(words), temperature=0, max_tokens=100000000)
    assert r.choices[0].finish_reason == "length"
    ctx = r.model_extra["hearth"]["context"]
    assert ctx["max_tokens_clamped"] and ctx["max_tokens"] == 512 - r.usage.prompt_tokens and ctx["free"] == 0
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 512


def test_06_system_message_is_merged_not_an_error(server):
    r = oai(server).chat.completions.create(model=MODEL, temperature=0, max_tokens=10, messages=[
        {"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Hi"}])
    assert r.choices[0].finish_reason in ("stop", "length")


def test_07_context_overflow_reports_both_counts_then_recovers(small):
    _eng, srv = small
    c = oai(srv)
    with pytest.raises(openai.BadRequestError) as ei:
        chat(c, "word " * 5000, max_tokens=16)
    body = ei.value.body
    assert ei.value.code == "context_length_exceeded"
    assert body["n_ctx"] == 512 and body["prompt_tokens"] > 5000
    assert str(body["prompt_tokens"]) in ei.value.message and "512" in ei.value.message
    assert chat(c, "Hi", max_tokens=5).choices[0].finish_reason in ("stop", "length")


def test_08_bad_messages_are_400_then_200(server):
    url = f"{server.url}/v1/chat/completions"
    for body, param in (({"model": MODEL, "messages": []}, "messages"), ({"model": MODEL}, "messages"),
                        ({"model": MODEL, "messages": [{"role": "user"}]}, "messages[0].content")):
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(url, json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                   timeout=60)
    assert r.status_code == 200


def test_09_cors_preflight_then_key(engine):
    app = create_app(engine, ServerSettings(api_key="k", cors_origins=[ORIGIN]))
    with ServerThread(app) as srv:
        url = f"{srv.url}/v1/chat/completions"
        pre = httpx.options(url, headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        assert httpx.post(url, json=body, headers={"Origin": ORIGIN}, timeout=60).status_code == 401
        ok = httpx.post(url, json=body, headers={"Origin": ORIGIN, "Authorization": "Bearer k"}, timeout=60)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN


def test_10_disconnect_cancels_and_next_starts_at_once(server, engine):
    cancelled, completed, tokens = engine.stats.cancelled, engine.stats.completed, engine.stats.completion_tokens
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": "1, 2, 3, 4, 5,", "temperature": 0, "max_tokens": 1000, "stream": True}) as r:
        n = 0
        for line in r.iter_lines():
            n += line.startswith("data: {")
            if n == 3:
                break
    j = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).json()
    # The stream ended cancelled, part-way through its 1000 tokens, not by running them out: the new request
    # is the only one that completed, so it never queued behind those 1000 tokens (counted, not timed).
    assert engine.stats.cancelled == cancelled + 1
    done_tokens = j["usage"]["completion_tokens"]
    assert 0 < done_tokens <= 2
    assert (engine.stats.completed, engine.stats.completion_tokens) == (completed + 1, tokens + done_tokens)
    m = httpx.get(f"{server.url}/metrics").text
    assert "hearth_requests_cancelled_total 1" in m and "hearth_engine_cancelled_total" in m


def test_11_parallel_streams_no_cross_talk(server):
    c = oai(server)
    qs = ["What is the capital of France?", "What is the capital of Japan?", "What color is the sky?",
          "Name a fruit that is yellow."]
    alone = {q: chat(c, q, temperature=0, max_tokens=8).choices[0].message.content for q in qs}
    out: dict = {}

    def run(q):
        text, chunks = streamed(chat(c, q, temperature=0, max_tokens=8, stream=True))
        out[q] = (text, {ch.id for ch in chunks})

    threads = [threading.Thread(target=run, args=(q,)) for q in qs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert {q: v[0] for q, v in out.items()} == alone
    assert all(len(v[1]) == 1 for v in out.values()) and len({next(iter(v[1])) for v in out.values()}) == 4


def test_documents_rag_evidence_citations_and_context(engine, tmp_path):
    """hearth.documents through the official client (extra_body): BM25 over a store built here finds the
    passage, the base model answers from it, and the answer's hearth object lists the evidence it was given."""
    from app.assistant import DocumentSource
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore

    doc = tmp_path / "notes.txt"
    doc.write_text("The code word is PELICAN.\n", encoding="utf-8")
    store = DocumentStore(tmp_path / "documents.db")
    assert Ingester(store).ingest([doc]).count("indexed") == 1
    docs = DocumentSource(store, owns_store=True)  # no embedder: BM25 only, and the notice says so
    try:
        with ServerThread(create_app(engine, ServerSettings(), documents=docs)) as srv:
            r = chat(oai(srv), "What is the code word?", temperature=0, max_tokens=8,
                     extra_body={"hearth": {"documents": True, "k": 2}})
    finally:
        docs.close()
    h = r.model_extra["hearth"]
    (ev,) = h["evidence"]
    assert ev["text"].strip() == "The code word is PELICAN." and ev["path"].endswith("notes.txt")
    assert "BM25" in h["search_notice"]
    assert all(c["evidence_id"] == ev["evidence_id"] for c in h["citations"])
    for c in h["citations"]:  # the citation check (facts only: no embedder), on whatever the model cited
        assert isinstance(c["supported"], bool) and c["support"]["reason"] and c["support"]["similarity"] is None
        assert 0 <= c["sentence_start"] <= c["sentence_end"] <= len(r.choices[0].message.content)
    ctx = h["context"]
    assert 0 < ctx["evidence"] < ctx["prompt_tokens"] == r.usage.prompt_tokens
    assert ctx["n_ctx"] == 2048 and ctx["free"] == 2048 - r.usage.prompt_tokens - 8
    assert h["metrics"]["ttft_s"] > 0 and h["template"]
    assert "PELICAN" in r.choices[0].message.content
