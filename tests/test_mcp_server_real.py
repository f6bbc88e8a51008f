"""Hearth as an MCP server as a client meets it, with the real bundled model (Gemma 3 270M, a base model): the
official SDK client against ``hearth mcp`` (the real CLI in a child process, its data folder a temp dir,
filled by ``hearth ingest``) and against ``/mcp`` on a real loopback port (API key set). Both end whatever
happens: the client's context ends the child (stdin closed, then SIGTERM, SIGKILL), the fixture the port."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from app.assistant import DocumentSource
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore
from app.server import ServerThread, create_app
from app.server.mcp_library import cited_sentences
from app.settings import ServerSettings

pytestmark = pytest.mark.model
REPO = Path(__file__).resolve().parents[1]
KEY = "sk-real-mcp"
CODE = "The code word is PELICAN."
QUESTION = "What is the code word?"
CITED_MAX_TOKENS = 64  # room for one cited sentence (cited_sentences(64) == 1) and the end


def check_answer(asked: dict, given_id: str) -> None:
    """What ``ask`` returns, whatever the small base model wrote: the answer from the passage, and the
    citation check on every citation it made (only IDs it was given; facts only: no embedding model)."""
    assert "PELICAN" in asked["answer"] and asked["finish_reason"] in ("stop", "length")
    assert [e["evidence_id"] for e in asked["evidence"]] == [given_id] and "BM25" in asked["notice"]
    assert set(asked["cited"]) <= {given_id}
    assert asked["cited"] == list(dict.fromkeys(c["evidence_id"] for c in asked["citations"]))
    for c in asked["citations"]:
        assert isinstance(c["supported"], bool) and c["support"]["reason"] and c["support"]["similarity"] is None
        assert 0 <= c["sentence_start"] <= c["sentence_end"] <= len(asked["answer"])
        assert c["quote"] and c["path"].endswith("notes.txt")
    assert asked["all_supported"] == (bool(asked["citations"]) and all(c["supported"] for c in asked["citations"]))


async def search_read_ask(c) -> tuple[set, dict, dict, dict]:
    names = {t.name for t in (await c.list_tools()).tools}
    hit = (await c.call_tool("search_documents", {"query": "code word", "k": 3})).structured_content["hits"][0]
    read = await c.call_tool("read_passage", {"evidence_id": hit["evidence_id"], "neighbours": 1})
    asked = (await c.call_tool("ask", {"question": QUESTION, "k": 2, "max_tokens": CITED_MAX_TOKENS,
                                       "require_citations": True})).structured_content
    return names, hit, read.structured_content, asked


def check_cited(asked: dict, given_id: str) -> None:
    """``ask`` with ``require_citations``: the base model, held to the citation grammar, cites the passage it
    was given after its first sentence, and the check finds that sentence supported. The grammar lets it end
    after a cited sentence (the newline it ends its turn with) and bounds the sentences, so it stops before
    ``max_tokens`` with every citation whole (it used to run on to ``length``, the last citation cut)."""
    check_answer(asked, given_id)
    assert asked["finish_reason"] == "stop", asked
    whole = re.fullmatch(r"[^.\[\]\n]+\. \[E:[0-9a-f]{12}\]( [^.\[\]\n]+\. \[E:[0-9a-f]{12}\])*", asked["answer"])
    assert whole, asked["answer"]
    assert asked["answer"].count("[E:") == len(asked["citations"]) <= cited_sentences(CITED_MAX_TOKENS)
    assert asked["cited"] == [given_id] and asked["answer"].lstrip().startswith(("PELICAN. [E:", "The code word"))
    first = asked["citations"][0]
    assert first["supported"] is True and first["support"]["missing"] == []
    assert "PELICAN" in asked["answer"][first["sentence_start"]:first["sentence_end"]]


# -- hearth mcp (stdio) ---------------------------------------------------------------------------------------
@pytest.fixture()
def home(tmp_path: Path, bundled_model: Path) -> Path:
    """A data folder with the bundled model and ``notes.txt`` ingested by the real ``hearth ingest``."""
    h = tmp_path / "home"
    (h / "models").mkdir(parents=True)
    (h / "models" / bundled_model.name).symlink_to(bundled_model)
    doc = tmp_path / "notes.txt"
    doc.write_text(CODE + "\n", encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "app.cli", "ingest", str(doc)], capture_output=True, text=True,
                       env={**os.environ, "HEARTH_HOME": str(h)}, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    return h


def stdio(home: Path, *flags: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--n-ctx", "2048", *flags],
                                 env={"HEARTH_HOME": str(home), "PYTHONPATH": str(REPO)}, cwd=str(REPO))


def test_hearth_mcp_over_stdio_searches_reads_and_asks(home: Path, tmp_path: Path):
    async def main():
        async with Client(stdio(home), read_timeout_seconds=300) as c:
            found = await search_read_ask(c)
            refused = await c.call_tool("ingest", {"path": str(tmp_path)})
            return (*found, refused)
    names, hit, read, asked, refused = anyio.run(main)
    assert {"search_documents", "read_passage", "list_documents", "search_conversations", "read_conversation",
            "ask", "ingest"} <= names
    assert hit["text"].strip() == CODE and hit["path"] == str(tmp_path / "notes.txt")
    assert read["text"] == hit["text"] and read["neighbours"] == []  # a one-passage document
    check_cited(asked, hit["evidence_id"])
    assert refused.is_error and "writes are off" in refused.content[0].text


def test_hearth_mcp_allow_writes_still_needs_a_client_that_can_ask(home: Path, tmp_path: Path):
    async def main():
        async with Client(stdio(home, "--allow-writes"), read_timeout_seconds=120) as c:
            return await c.call_tool("ingest", {"path": str(tmp_path)})
    r = anyio.run(main)
    assert r.is_error and "cannot ask" in r.content[0].text and "Traceback" not in r.content[0].text


# -- /mcp on the port -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def port(bundled_model, tmp_path_factory):
    """The real engine behind the port (API key set, a document index with notes.txt); all closed whatever
    happens."""
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    folder = tmp_path_factory.mktemp("port")
    doc = folder / "notes.txt"
    doc.write_text(CODE + "\n", encoding="utf-8")
    store = DocumentStore(folder / "documents.db")
    Ingester(store).ingest([doc])
    docs = DocumentSource(store, owns_store=True)
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048), max_queue=4)
    try:
        eng.load()
        with ServerThread(create_app(eng, ServerSettings(api_key=KEY), documents=docs)) as srv:
            yield srv
    finally:
        eng.close()
        docs.close()


def http(url: str):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=httpx2.Timeout(30, read=300))
    return streamable_http_client(f"{url}/mcp", http_client=client)


def test_port_mcp_searches_reads_and_asks_with_the_served_engine(port):
    async def main():
        async with Client(http(port.url)) as c:
            found = await search_read_ask(c)
            free = await c.call_tool("ask", {"question": QUESTION, "k": 2, "max_tokens": 12})
            refused = await c.call_tool("ingest", {"path": "/tmp"})
            return (*found, free.structured_content, refused)
    names, hit, read, asked, free, refused = anyio.run(main)
    assert "ask" in names and hit["text"].strip() == CODE and read["evidence_id"] == hit["evidence_id"]
    check_cited(asked, hit["evidence_id"])
    check_answer(free, hit["evidence_id"])  # unconstrained: whatever it cites (often nothing) is checked
    assert asked["model"] == "gemma-3-270m-q4_k_m"
    assert refused.is_error and "writes are off" in refused.content[0].text


def test_port_mcp_needs_the_key_and_a_loopback_host(port):
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    r = httpx.post(f"{port.url}/mcp", json=init, headers=accept)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(f"{port.url}/mcp", json=init, headers={**accept, "Authorization": f"Bearer {KEY}",
                                                          "Host": "attacker.example:8765"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"

    async def no_key():
        async with Client(f"{port.url}/mcp") as c:  # the SDK's own HTTP client: no Authorization header
            await c.list_tools()
    with pytest.raises(BaseException) as err:
        anyio.run(no_key)
    assert leaves(err.value) == ["MCPError: Server returned an error response"]  # the 401 above, as the SDK says it


def leaves(exc: BaseException) -> list[str]:
    """The messages of the exceptions inside (nested) exception groups."""
    inner = getattr(exc, "exceptions", None)  # an ExceptionGroup (Python 3.11+, anyio's backport before)
    if inner:
        return [m for e in inner for m in leaves(e)]
    return [f"{type(exc).__name__}: {exc}"]
