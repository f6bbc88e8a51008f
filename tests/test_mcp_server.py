"""Hearth as an MCP server, without a model: the tools' logic (``Library``: bad input named, passages and their
neighbours, conversations, ``ask`` on the fake engine with its citations checked), the same tools through the
official SDK client in-process (tool errors, never a traceback; ``ingest`` off, refused without elicitation,
asked with it), and ``/mcp`` on a real loopback port behind the API key and the Host check."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import httpx
import mcp_types
import pytest
from mcp.client import Client

from app.assistant import DocumentSource
from app.errors import InvalidRequest
from app.memory import Store
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore
from app.server import ServerThread, create_app
from app.server.errors import DocumentsUnavailable
from app.server.mcp_library import Library, WritesNotAllowed, cited_grammar, cited_sentences, evidence_key
from app.server.mcp_server import build_server
from app.server.source import Held
from app.settings import ServerSettings
from tests.fakes import FakeEngine

KEY = "sk-test-mcp"
CODE = "The code word is PELICAN."


@pytest.fixture
def corpus(tmp_path: Path):
    """A document index with a one-passage note and a long many-passage text; yields ``(DocumentSource,
    note path, long path)``."""
    note = tmp_path / "notes.txt"
    note.write_text(CODE + "\n", encoding="utf-8")
    long = tmp_path / "long.txt"
    long.write_text("\n\n".join(f"Section {i}. " + " ".join(f"word{i}x{j}" for j in range(120))
                                for i in range(12)), encoding="utf-8")
    store = DocumentStore(tmp_path / "documents.db")
    assert Ingester(store).ingest([note, long]).count("indexed") == 2
    docs = DocumentSource(store, owns_store=True)
    yield docs, note, long
    docs.close()


@pytest.fixture
def conversation() -> str:
    """A stored conversation (in the test's HEARTH_HOME) about ferns; its id."""
    with Store() as store:
        cid = store.create_conversation("Ferns")
        first = store.append_message(cid, "user", "How often do I water the maidenhair fern?")
        store.append_message(cid, "assistant", "Keep its soil moist: water every two days.", first)
    return cid


def citing_reply(req) -> str:
    """The fake model's answer: cites the notes' passage twice, once with a fact it lacks (no passage: none)."""
    m = re.search(r"\[E:([0-9a-f]{12})\] notes\.txt", req.messages[-1].content)
    return f"The code word is PELICAN [E:{m.group(1)}]. It costs 7 euros [E:{m.group(1)}]." if m else "No idea."


# -- the tools' logic ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("call,param", [
    (lambda lib: lib.search_documents("", 3), "query"),
    (lambda lib: lib.search_documents("   ", 3), "query"),
    (lambda lib: lib.search_documents("code", 0), "k"),
    (lambda lib: lib.search_documents("code", 21), "k"),
    (lambda lib: lib.search_documents("code", True), "k"),
    (lambda lib: lib.read_passage("not-an-id"), "evidence_id"),
    (lambda lib: lib.read_passage("0123456789ab"), "evidence_id"),
    (lambda lib: lib.read_passage("0123456789ab", neighbours=6), "neighbours"),
    (lambda lib: lib.search_conversations("", 5), "query"),
    (lambda lib: lib.search_conversations("fern", 51), "limit"),
    (lambda lib: lib.read_conversation(""), "conversation_id"),
    (lambda lib: lib.read_conversation("nope"), "conversation_id"),
    (lambda lib: lib.ask(" ", 4), "question"),
    (lambda lib: lib.ask("code?", 4, max_tokens=0), "max_tokens"),
])
def test_bad_input_is_one_invalid_request_naming_the_parameter(corpus, call, param):
    with pytest.raises(InvalidRequest) as err:
        call(Library(lambda: corpus[0]))
    assert err.value.param == param and param.split("_")[0] in str(err.value)


def test_evidence_ids_are_read_in_the_forms_models_write_them():
    assert evidence_key("A1B2C3D4E5F6") == evidence_key("[E:a1b2c3d4e5f6]") == evidence_key(" E:a1b2c3d4e5f6 ")
    with pytest.raises(InvalidRequest, match="12 hex digits"):
        evidence_key("a1b2c3")


def test_search_read_passage_with_neighbours_and_list(corpus):
    docs, note, long = corpus
    lib = Library(lambda: docs)
    hits = lib.search_documents("code word PELICAN", 3)["hits"]
    top = hits[0]
    assert top["text"].strip() == CODE and top["path"] == str(note) and top["title"] == "notes.txt"
    assert top["page"] is None and (top["char_start"], top["char_end"]) == (0, len(top["text"]))
    assert lib.read_passage(f"[E:{top['evidence_id']}]")["text"] == top["text"]
    middle = lib.search_documents("word6x5", 1)["hits"][0]
    read = lib.read_passage(middle["evidence_id"], neighbours=2)
    offsets = [n["offset"] for n in read["neighbours"]]
    assert offsets == sorted(offsets) and {-1, 1} <= set(offsets) and 0 not in offsets
    text = long.read_text(encoding="utf-8")
    for n in [read, *read["neighbours"]]:  # offsets into the document's text, as documented
        assert text[n["char_start"]:n["char_end"]] == n["text"]
    listed = lib.list_documents()["documents"]
    assert [d["title"] for d in listed] == ["long.txt", "notes.txt"] and listed[1]["chunks"] == 1


def test_conversations_search_and_read(conversation):
    lib = Library(lambda: None)
    (hit,) = lib.search_conversations("maidenhair")["results"]
    assert hit["conversation_id"] == conversation and hit["title"] == "Ferns" and "[maidenhair]" in hit["snippet"]
    read = lib.read_conversation(conversation[:8])
    assert read["conversation_id"] == conversation
    assert [m["role"] for m in read["messages"]] == ["user", "assistant"]
    assert read["messages"][1]["content"].startswith("Keep its soil moist")


def test_no_documents_and_writes_off_are_said():
    lib = Library(lambda: None)
    with pytest.raises(DocumentsUnavailable, match="--documents"):
        lib.search_documents("code", 3)
    with pytest.raises(WritesNotAllowed, match="--allow-writes"):
        lib.ingest("/tmp")
    with pytest.raises(InvalidRequest, match="absolute"):
        Library(lambda: None, allow_writes=True).ingest_path("relative/file.txt")


def test_ask_answers_from_the_documents_and_checks_each_citation(corpus):
    eng = FakeEngine(n_ctx=4096, reply=citing_reply)
    try:
        out = Library(lambda: corpus[0], engine=lambda: Held(eng, "fake")).ask("What is the code word?", k=2)
    finally:
        eng.close()
    (eid,) = out["cited"]
    assert out["answer"].startswith("The code word is PELICAN") and out["model"] == "fake"
    assert [e["evidence_id"] for e in out["evidence"]][0] == eid
    good, bad = out["citations"]
    assert good["supported"] is True and bad["supported"] is False and out["all_supported"] is False
    assert bad["support"]["missing"] == ["7 euros"] and "7 euros" in bad["support"]["reason"]
    assert out["answer"][bad["sentence_start"]:bad["sentence_end"]].startswith("It costs 7 euros")
    assert eng.seen[0].decoding.temperature == 0.0  # greedy: the same question, the same answer


def test_require_citations_decodes_under_the_citation_grammar(corpus):
    eng = FakeEngine(n_ctx=4096, reply=citing_reply)
    try:
        lib = Library(lambda: corpus[0], engine=lambda: Held(eng, "fake"))
        out = lib.ask("What is the code word?", k=1, require_citations=True)
        lib.ask("zzzz qqqq", k=1, require_citations=True)  # nothing found: nothing to cite, no grammar
    finally:
        eng.close()
    grammar = eng.seen[0].decoding.grammar
    assert grammar == cited_grammar(out["cited"]) and f'id ::= "{out["cited"][0]}"' in grammar
    assert eng.seen[1].decoding.grammar is None


def test_the_citation_grammar_may_end_after_any_cited_sentence_and_must_after_a_few():
    one, three = cited_grammar(["a1b2c3d4e5f6"], 1), cited_grammar(["a1b2c3d4e5f6"])
    # the newline a base model ends its turn with is allowed once, after a whole citation; then only the end
    assert one.startswith('root ::= sentence "\\n"?\n')
    assert three.startswith('root ::= sentence (" " sentence (" " sentence)?)? "\\n"?\n')
    assert cited_sentences(24) == 1 and cited_sentences(80) == 2 and cited_sentences(2048) == 3
    with pytest.raises(ValueError):
        cited_grammar(["a1b2c3d4e5f6"], 0)


def test_require_citations_bounds_the_sentences_by_max_tokens_and_drops_the_ending_newline(corpus):
    eng = FakeEngine(n_ctx=4096, reply=lambda req: citing_reply(req).split(" It costs")[0] + "\n")
    try:
        out = Library(lambda: corpus[0], engine=lambda: Held(eng, "fake")).ask(
            "What is the code word?", k=1, max_tokens=48, require_citations=True)
    finally:
        eng.close()
    assert eng.seen[0].decoding.grammar == cited_grammar(out["cited"], 1)
    assert out["answer"] == f"The code word is PELICAN [E:{out['cited'][0]}]." and out["all_supported"] is True


# -- through the SDK client ----------------------------------------------------------------------------------
def run_client(server, body, **client_kw):
    async def main():
        async with Client(server, **client_kw) as c:
            return await body(c)
    return anyio.run(main)


def test_tools_listed_with_schemas_and_read_only_hints(corpus):
    tools = run_client(build_server(Library(lambda: corpus[0])), lambda c: c.list_tools()).tools
    by_name = {t.name: t for t in tools}
    assert set(by_name) == {"search_documents", "read_passage", "list_documents", "search_conversations",
                            "read_conversation", "ask", "ingest"}
    assert all(by_name[n].annotations.read_only_hint for n in by_name if n != "ingest")
    assert by_name["ingest"].annotations.read_only_hint is False
    assert set(by_name["ingest"].input_schema["properties"]) == {"path"}  # the confirmation is not an argument
    assert by_name["search_documents"].input_schema["required"] == ["query"]


@pytest.mark.parametrize("tool,args,words", [
    ("search_documents", {"query": "", "k": 3}, "query must be a non-empty string, got ''"),
    ("search_documents", {"query": "code", "k": 99}, "k must be an integer from 1 to 20, got 99"),
    ("search_documents", {"query": "code", "k": "many"}, "k: Input should be a valid integer"),
    ("read_passage", {"evidence_id": "0123456789ab"}, "unknown evidence ID '0123456789ab'"),
    ("read_conversation", {"conversation_id": "nope"}, "no conversation with id 'nope'"),
    ("ask", {"question": "code?"}, "this server has no model"),
    ("ingest", {"path": "/tmp"}, "writes are off"),
])
def test_bad_calls_are_tool_errors_naming_the_problem(corpus, tool, args, words):
    r = run_client(build_server(Library(lambda: corpus[0])), lambda c: c.call_tool(tool, args))
    (block,) = r.content
    # the bare message (docs/mcp.md): "Error executing tool <name>" is kept for unexpected failures
    assert r.is_error and block.text.startswith(words) and "\n" not in block.text
    assert "Error executing tool" not in block.text and "Traceback" not in block.text


def test_an_unexpected_failure_is_named_by_the_tool_alone(corpus):
    def broken():
        raise RuntimeError("secret internals")
    r = run_client(build_server(Library(broken)), lambda c: c.call_tool("search_documents", {"query": "code"}))
    assert r.is_error and r.content[0].text == "Error executing tool search_documents"


def confirm(action: str, content: dict | None = None):
    async def callback(ctx, params):
        assert "index" in params.message and "Allow it?" in params.message
        return mcp_types.ElicitResult(action=action, content=content)
    return callback


def test_ingest_asks_first_and_is_refused_when_it_cannot(corpus, tmp_path):
    new = tmp_path / "more.txt"
    new.write_text("The boat is called HERON.\n", encoding="utf-8")
    server = build_server(Library(lambda: corpus[0], allow_writes=True))
    ingest = lambda c: c.call_tool("ingest", {"path": str(new)})  # noqa: E731
    r = run_client(server, ingest)  # this client declares no elicitation: it cannot ask the person
    assert r.is_error and "cannot ask" in r.content[0].text
    r = run_client(server, ingest, elicitation_callback=confirm("decline"))
    assert r.is_error and "did not allow" in r.content[0].text
    assert not corpus[0].search("HERON", 1).evidence
    r = run_client(server, ingest, elicitation_callback=confirm("accept", {"confirm": True}))
    assert not r.is_error and r.structured_content["indexed"] == 1
    assert corpus[0].search("HERON", 1).evidence[0].path == str(new)


# -- /mcp on the port ----------------------------------------------------------------------------------------
@pytest.fixture
def port(corpus):
    eng = FakeEngine(n_ctx=4096, reply=citing_reply)
    try:
        with ServerThread(create_app(eng, ServerSettings(api_key=KEY), documents=corpus[0])) as srv:
            yield srv
    finally:
        eng.close()


def http_client(url: str, key: str | None = KEY):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return streamable_http_client(f"{url}/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=60))


def test_port_serves_the_tools_behind_the_key(port):
    async def body(c):
        names = {t.name for t in (await c.list_tools()).tools}
        hits = (await c.call_tool("search_documents", {"query": "code word", "k": 2})).structured_content["hits"]
        asked = (await c.call_tool("ask", {"question": "What is the code word?"})).structured_content
        return names, hits, asked
    names, hits, asked = run_client(http_client(port.url), body)
    assert "ask" in names and hits[0]["text"].strip() == CODE
    assert asked["cited"] == [hits[0]["evidence_id"]] and [c["supported"] for c in asked["citations"]] == [True,
                                                                                                          False]


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def test_port_refuses_mcp_without_the_key_or_from_a_foreign_host(port):
    r = httpx.post(f"{port.url}/mcp", json=INIT, headers=MCP_HEADERS)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(f"{port.url}/mcp", json=INIT, headers={**MCP_HEADERS, "Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = httpx.post(f"{port.url}/mcp", json=INIT,
                   headers={**MCP_HEADERS, "Authorization": f"Bearer {KEY}", "Host": "evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    r = httpx.post(f"{port.url}/mcp", json=INIT, headers={**MCP_HEADERS, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200  # the same request with the key and a loopback Host is answered


def test_hearth_mcp_help_names_every_tool_and_the_write_switch():
    import argparse

    from app.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["mcp"].format_help().split())
    tools = run_client(build_server(Library(lambda: None)), lambda c: c.list_tools()).tools
    assert all(t.name in text for t in tools)
    assert "unless --allow-writes" in text and "confirm" in text and "/mcp" in text
