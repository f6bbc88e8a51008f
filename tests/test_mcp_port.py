"""MCP tools on the port (issue 26): ``hearth serve --mcp-tools`` and ``"hearth": {"mcp_tools": true}``.

A real stdio MCP server (``tests/mcp_servers/tool_server.py``, as ``t`` with ``add`` in ``alwaysAllow``) behind
the port; the model is the fake engine, scripted to call (the claims are about the loop on the port: only
``alwaysAllow`` tools run, the others are answered as not allowed, each call is logged and counted). The
refusals: the opt-in on a port without tools, a stream, ``--mcp-tools`` off loopback without an API key. The
one claim about a model (the bundled base model, forced by ``tool_choice`` "required", gets its call run on
the port) is the last test.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.mcp import McpHub, parse_config, save_config
from app.protocol.types import GenerateRequest
from app.server import create_app
from app.server.mcp_tools import PortTools
from app.server.models import ModelCatalog
from app.settings import ServerSettings
from tests.fakes import FakeEngine

SERVERS = Path(__file__).parent / "mcp_servers"
ASK = [{"role": "user", "content": "What is 2 + 3?"}]
ON = {"mcp_tools": True}


def config(**entry) -> dict:
    return {"mcpServers": {"t": {"command": sys.executable, "args": [str(SERVERS / "tool_server.py")], **entry}}}


def call_text(name: str, **args) -> str:
    return "Tool call: " + json.dumps({"name": name, "arguments": args})


def scripted(*calls: str, final: str = "Done."):
    """The model writes ``calls[i]`` on step i while it may call, then ``final`` and the last tool result."""

    def reply(req: GenerateRequest) -> str:
        steps = sum(1 for m in req.messages if m.tool_calls)
        if req.tools and req.choice.mode != "none" and steps < len(calls):
            return calls[steps]
        last = req.messages[-1]
        return f"{final} {last.content}" if last.role == "tool" else final

    return reply


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    cfg = parse_config(config(alwaysAllow=["add"]))
    with McpHub(cfg) as h:
        assert h.start(timeout_s=30)["t"].state == "ready"
        yield h


def client(engine, tools=None) -> TestClient:
    catalog = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
    return TestClient(create_app(engine, ServerSettings(), catalog=catalog, mcp_tools=tools), base_url="http://127.0.0.1")


def chat(c: TestClient, **body):
    return c.post("/v1/chat/completions", json={"model": "fake-model", "messages": ASK, **body})


def test_an_always_allowed_tool_runs_on_the_port_logged_and_counted(hub, caplog) -> None:
    eng = FakeEngine(reply=scripted(call_text("t__add", a=2, b=3)))
    with eng, client(eng, PortTools(hub, max_steps=3)) as c, caplog.at_level(logging.INFO, "app.server.mcp_tools"):
        r = chat(c, hearth=ON)
        metrics = c.get("/metrics").text
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] == "Done. 5" and not msg.get("tool_calls")
    second = eng.seen[-1]
    assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
    assert {t.name for t in second.tools} >= {"t__add", "t__echo"}
    line = next(rec.getMessage() for rec in caplog.records if "MCP tool call" in rec.getMessage())
    assert "server=t tool=add" in line and "outcome=ok" in line and "arguments=16 bytes" in line
    assert 'hearth_mcp_tool_calls_total{server="t",tool="add",outcome="ok"} 1' in metrics


def test_a_tool_not_always_allowed_is_answered_as_not_allowed(hub, caplog) -> None:
    eng = FakeEngine(reply=scripted(call_text("t__echo", text="hi")))
    with eng, client(eng, PortTools(hub, max_steps=3)) as c, caplog.at_level(logging.INFO, "app.server.mcp_tools"):
        r = chat(c, hearth=ON)
    assert r.status_code == 200, r.text
    assert "was not allowed" in r.json()["choices"][0]["message"]["content"]
    assert any("tool=echo" in rec.getMessage() and "outcome=denied" in rec.getMessage() for rec in caplog.records)


def test_without_the_opt_in_no_mcp_tool_is_offered(hub) -> None:
    eng = FakeEngine(reply=scripted(call_text("t__add", a=2, b=3)))
    with eng, client(eng, PortTools(hub)) as c:
        r = chat(c)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Done."
    assert not eng.seen[-1].tools


def test_a_call_of_the_clients_own_tool_goes_back_to_the_client(hub) -> None:
    own = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    eng = FakeEngine(reply=scripted(call_text("lookup")))
    with eng, client(eng, PortTools(hub)) as c:
        r = chat(c, tools=[own], hearth=ON)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"


@pytest.mark.parametrize("tools,extra,says", [
    (False, {}, "--mcp-tools"),
    (True, {"hearth": {**ON, "self_consistency": {"n": 2}}}, "self_consistency"),
])
def test_the_opt_in_is_refused_where_it_cannot_run(hub, tools, extra, says) -> None:
    eng = FakeEngine(reply=scripted())
    with eng, client(eng, PortTools(hub) if tools else None) as c:
        r = chat(c, **{"hearth": ON, **extra})
        again = chat(c)  # the model was released: the port still answers
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "hearth.mcp_tools" and says in err["message"]
    assert again.status_code == 200


def sse(text: str) -> list[dict]:
    return [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]


def test_a_stream_is_written_once_the_tools_have_run(hub) -> None:
    eng = FakeEngine(reply=scripted(call_text("t__add", a=2, b=3)))
    with eng, client(eng, PortTools(hub, max_steps=3)) as c:
        r = chat(c, hearth=ON, stream=True, stream_options={"include_usage": True})
        m = c.post("/v1/messages", json={"model": "fake-model", "max_tokens": 256, "messages": ASK, "hearth": ON,
                                         "stream": True})
        resp = c.post("/v1/responses", json={"model": "fake-model", "input": "What is 2 + 3?", "hearth": ON,
                                             "stream": True})
    assert resp.status_code == 200 and '"text":"Done. 5"' in resp.text
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    chunks = sse(r.text)
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert text == "Done. 5"
    assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    events = sse(m.text)
    assert "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta") == "Done. 5"
    assert events[-1]["type"] == "message_stop"


def test_tool_choice_may_name_an_mcp_tool_and_is_checked_against_them(hub) -> None:
    eng = FakeEngine(reply=scripted(call_text("t__add", a=4, b=5)))
    with eng, client(eng, PortTools(hub, max_steps=2)) as c:
        r = chat(c, hearth=ON, tool_choice={"type": "function", "function": {"name": "t__add"}})
        bad = chat(c, hearth=ON, tool_choice={"type": "function", "function": {"name": "t__nope"}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Done. 9"
    assert eng.seen[0].tool_choice.name == "t__add" and eng.seen[1].tool_choice.mode == "none"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"


def forced_only(call: str, final: str = "Done."):
    """A model like the bundled base one: it calls whenever ``tool_choice`` forces it, else answers ``final``
    and the last tool result (as JSON under a ``response_format`` grammar)."""

    def reply(req: GenerateRequest) -> str:
        if req.tools and req.choice.forces_call:
            return call
        last = req.messages[-1]
        if req.decoding.grammar:
            return json.dumps({"sum": int(last.content)})
        return f"{final} {last.content}" if last.role == "tool" else final

    return reply


def test_required_forces_the_first_call_only_on_every_api(hub) -> None:
    # Before: every step but the last was forced (the bundled model called 5 times, then its answer copied the
    # calls as text); now the first step's call, then an answer from its result.
    eng = FakeEngine(reply=forced_only(call_text("t__add", a=2, b=3)))
    with eng, client(eng, PortTools(hub)) as c:
        r = chat(c, hearth=ON, tool_choice="required")
        s = chat(c, hearth=ON, tool_choice="required", stream=True)
        resp = c.post("/v1/responses", json={"model": "fake-model", "input": "What is 2 + 3?", "hearth": ON,
                                             "tool_choice": "required"})
        m = c.post("/v1/messages", json={"model": "fake-model", "max_tokens": 256, "messages": ASK, "hearth": ON,
                                         "tool_choice": {"type": "any"}})
    assert [q.choice.mode for q in eng.seen] == ["required", "none"] * 4
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Done. 5"
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in sse(s.text) if ch["choices"]) == \
        "Done. 5"
    assert resp.status_code == 200 and '"text":"Done. 5"' in resp.text
    assert m.status_code == 200 and m.json()["content"][0]["text"] == "Done. 5"


def test_a_refused_call_is_not_forced_again_and_client_tools_keep_auto(hub) -> None:
    own = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    eng = FakeEngine(reply=forced_only(call_text("t__echo", text="hi"), final="Answer:"))
    with eng, client(eng, PortTools(hub)) as c:
        r = chat(c, hearth=ON, tool_choice={"type": "function", "function": {"name": "t__echo"}})
        own_too = chat(c, hearth=ON, tools=[own], tool_choice="required")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("Answer: This call")
    assert own_too.status_code == 200, own_too.text
    assert [q.choice.mode for q in eng.seen] == ["function", "none", "required", "auto"]


SUM = {"type": "json_schema", "json_schema": {"name": "sum", "strict": True, "schema": {
    "type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"],
    "additionalProperties": False}}}


def test_required_with_a_strict_response_format_calls_first_then_answers_in_the_format(hub) -> None:
    # Before: a 400 "tool_choice forces a tool call through a grammar, and the request already has one".
    eng = FakeEngine(reply=forced_only(call_text("t__add", a=2, b=3)))
    with eng, client(eng, PortTools(hub)) as c:
        r = chat(c, hearth=ON, tool_choice="required", response_format=SUM)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"sum": 5}
    first, second = eng.seen
    assert (first.choice.mode, first.decoding.grammar) == ("required", None)
    assert second.choice.mode == "none" and second.decoding.grammar and second.messages[-1].role == "tool"


def test_mcp_tools_must_be_a_boolean(hub) -> None:
    eng = FakeEngine(reply=scripted())
    with eng, client(eng, PortTools(hub)) as c:
        r = chat(c, hearth={"mcp_tools": "yes"})
    assert r.status_code == 400 and "mcp_tools" in r.text


def test_anthropic_messages_run_the_tools_too(hub) -> None:
    eng = FakeEngine(reply=scripted(call_text("t__add", a=1, b=1)))
    with eng, client(eng, PortTools(hub, max_steps=3)) as c:
        r = c.post("/v1/messages", json={"model": "fake-model", "max_tokens": 256, "messages": ASK, "hearth": ON})
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == "Done. 2"


# -- hearth serve --mcp-tools ---------------------------------------------------------------------------------
@pytest.mark.parametrize("host,key,refused", [
    ("0.0.0.0", None, True), ("192.168.1.5", "", True), ("0.0.0.0", "sk-1", False), ("127.0.0.1", None, False),
    ("localhost", None, False), ("::1", None, False),
])
def test_mcp_tools_off_loopback_needs_an_api_key(host, key, refused) -> None:
    from app.cli.serve import mcp_refusal

    why = mcp_refusal(True, host, key)
    assert (why is not None) == refused
    if refused:
        assert host in why and "--api-key" in why
    assert mcp_refusal(False, host, key) is None


def test_hearth_serve_exits_with_one_line_before_anything_loads(capsys, monkeypatch) -> None:
    from app.cli import main

    monkeypatch.delenv("HEARTH_API_KEY", raising=False)
    rc = main(["serve", "--host", "0.0.0.0", "--i-know-this-exposes-my-machine", "--mcp-tools"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "error: --mcp-tools on 0.0.0.0" in err and "Traceback" not in err
    assert "WARNING" not in err and len(err.strip().splitlines()) == 1  # the refusal only, not the warning first


def test_a_malformed_mcp_json_is_one_line_and_the_port_goes_on_without(hearth_home: Path, capsys) -> None:
    from app.cli._mcp_terminal import start_hub

    (hearth_home / "mcp.json").write_text('{"mcpServers": {"t": {"args": 3}}}')
    assert start_hub(5) is None
    err = capsys.readouterr().err.strip()
    assert err.startswith("hearth: mcp.json not used:") and "\n" not in err


def test_a_server_that_fails_to_start_is_one_line(hearth_home: Path, capsys) -> None:
    from app.cli._mcp_terminal import start_hub

    save_config(None, parse_config({"mcpServers": {
        "bad": {"command": sys.executable, "args": [str(SERVERS / "exit_at_start.py")]},
        **config()["mcpServers"]}}))
    hub = start_hub(15)
    try:
        assert hub.status()["t"].state == "ready"
    finally:
        hub.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hearth: MCP server 'bad' did not start:")


# -- the real model ---------------------------------------------------------------------------------------------
@pytest.mark.model
def test_the_bundled_model_forced_to_call_gets_the_call_run_on_the_port(hub, bundled_model: Path, caplog) -> None:
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    with Engine(bundled_model, LoadSettings(n_ctx=2048)) as eng, \
            TestClient(create_app(eng, ServerSettings(), mcp_tools=PortTools(hub, max_steps=2)),
                       base_url="http://127.0.0.1") as c, \
            caplog.at_level(logging.INFO, "app.server.mcp_tools"):
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Add 2 and 3 with the add tool."}], "temperature": 0,
            "max_tokens": 48, "tool_choice": "required", "hearth": ON})
    assert r.status_code == 200, r.text
    lines = [rec.getMessage() for rec in caplog.records if "MCP tool call" in rec.getMessage()]
    assert len(lines) >= 1 and all("server=t" in ln for ln in lines)
    assert not r.json()["choices"][0]["message"].get("tool_calls")  # the last step may not call: an answer


@pytest.mark.model
def test_the_bundled_model_forced_calls_once_then_answers_from_the_result(hub, bundled_model: Path,
                                                                          caplog) -> None:
    # Before: with the default step limit every step but the last was forced: 5 calls, and the answer was the
    # call pattern as text (" Tool call: {...}").
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    with Engine(bundled_model, LoadSettings(n_ctx=2048)) as eng, \
            TestClient(create_app(eng, ServerSettings(), mcp_tools=PortTools(hub)),
                       base_url="http://127.0.0.1") as c, \
            caplog.at_level(logging.INFO, "app.server.mcp_tools"):
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Add 2 and 3 with the add tool."}], "temperature": 0,
            "max_tokens": 48, "tool_choice": {"type": "function", "function": {"name": "t__add"}}, "hearth": ON})
    assert r.status_code == 200, r.text
    lines = [rec.getMessage() for rec in caplog.records if "MCP tool call" in rec.getMessage()]
    assert len(lines) == 1 and "tool=add" in lines[0] and "outcome=ok" in lines[0]
    text = r.json()["choices"][0]["message"]["content"]
    assert "Tool call" not in text and text.strip(), text
