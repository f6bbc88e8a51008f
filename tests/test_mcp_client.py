"""The MCP client (``app.mcp``) against real MCP servers written with the SDK in ``tests/mcp_servers/``: one over
stdio, one over streamable HTTP on 127.0.0.1, and servers that exit at start, hang at start or crash mid-call.

No model is involved. Timeouts are short so the file stays fast; one module-wide hub serves the happy paths.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.errors import HearthError
from app.mcp import (
    McpConfig,
    McpConfigError,
    McpHub,
    ToolError,
    content_to_text,
    load_config,
    parse_config,
    qualified_names,
    save_config,
)

SERVERS = Path(__file__).parent / "mcp_servers"
PY = sys.executable
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MARKER = f"--marker={uuid.uuid4().hex}"  # tags this module's server processes for the leak checks


def _stdio(script: str, *args: str) -> dict:
    return {"command": PY, "args": [str(SERVERS / script), MARKER, *args]}


# -- config ----------------------------------------------------------------------------------------------------

def test_config_round_trips_and_keeps_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    original = {
        "globalShortcut": "x",
        "mcpServers": {
            "fs": {"command": "npx", "args": ["-y", "server-fs", "/tmp"], "env": {"A": "1"}, "cwd": "/tmp",
                   "autoApprove": ["read"], "disabledTools": ["write"], "alwaysAllow": ["read"]},
            "web": {"type": "http", "url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer k"},
                    "disabled": True},
        },
    }
    path.write_text(json.dumps(original), encoding="utf-8")
    cfg = load_config(path)
    fs, web = cfg.servers
    assert (fs.transport, fs.command, fs.args, dict(fs.env), fs.cwd) == (
        "stdio", "npx", ("-y", "server-fs", "/tmp"), {"A": "1"}, "/tmp")
    assert not fs.tool_enabled("write") and fs.tool_enabled("read") and "read" in fs.always_allow
    assert (web.transport, web.url, dict(web.headers), web.disabled) == (
        "http", "http://127.0.0.1:9000/mcp", {"Authorization": "Bearer k"}, True)
    cfg2 = cfg.with_tool_enabled("fs", "write", True).with_tool_enabled("fs", "delete", False)
    save_config(path, cfg2)
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["globalShortcut"] == "x"
    assert saved["mcpServers"]["fs"]["autoApprove"] == ["read"]  # another client's key survives an edit
    assert saved["mcpServers"]["fs"]["disabledTools"] == ["delete"]
    assert saved["mcpServers"]["web"]["type"] == "http"
    assert load_config(path) == cfg2
    assert not list(tmp_path.glob("*.tmp"))


def test_missing_config_is_empty_and_default_path_is_in_the_data_folder(hearth_home: Path) -> None:
    from app.mcp import config_path

    assert config_path() == hearth_home / "mcp.json"
    assert load_config() == McpConfig()


@pytest.mark.parametrize("servers, param", [
    ({"fs": {"args": ["x"]}}, "mcpServers.fs.command"),
    ({"fs": {"command": ""}}, "mcpServers.fs.command"),
    ({"fs": {"command": "x", "args": "a b"}}, "mcpServers.fs.args"),
    ({"fs": {"command": "x", "args": ["a", 2]}}, "mcpServers.fs.args[1]"),
    ({"fs": {"command": "x", "env": {"K": 1}}}, "mcpServers.fs.env.K"),
    ({"fs": {"command": "x", "disabledTools": "write"}}, "mcpServers.fs.disabledTools"),
    ({"fs": {"command": "x", "disabled": "yes"}}, "mcpServers.fs.disabled"),
    ({"web": {"url": "ftp://host"}}, "mcpServers.web.url"),
    ({"web": {"url": "http://h/mcp", "headers": ["a"]}}, "mcpServers.web.headers"),
    ({"web": {"url": "http://h/mcp", "command": "x"}}, "mcpServers.web.url"),
    ({"web": {"url": "http://h/sse", "type": "sse"}}, "mcpServers.web.type"),
    ({"web": "http://h/mcp"}, "mcpServers.web"),
])
def test_config_errors_name_the_field(servers: dict, param: str) -> None:
    with pytest.raises(McpConfigError) as e:
        parse_config({"mcpServers": servers})
    assert e.value.param == param
    assert param.split(".")[1] in str(e.value)  # the message names the server too


def test_errors_survive_pickling() -> None:
    import pickle

    e = pickle.loads(pickle.dumps(McpConfigError("bad", param="mcpServers.a.url", path="/x/mcp.json")))
    assert (type(e), e.param, e.path, str(e)) == (McpConfigError, "mcpServers.a.url", "/x/mcp.json", "bad")
    t = pickle.loads(pickle.dumps(ToolError("fs", "no answer within 1 s", "timeout", "read")))
    assert (t.server, t.reason, t.kind, t.tool) == ("fs", "no answer within 1 s", "timeout", "read")
    assert str(t) == "MCP server 'fs', tool 'read': no answer within 1 s"


def test_config_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {', encoding="utf-8")
    with pytest.raises(McpConfigError, match="not valid JSON .* line 1") as e:
        load_config(path)
    assert e.value.path == str(path) and isinstance(e.value, HearthError)
    path.write_text('{"mcpServers": {"a": {"command": 3}}}', encoding="utf-8")
    with pytest.raises(McpConfigError, match=r"mcp\.json: mcpServers\.a\.command") as e:
        load_config(path)
    assert e.value.param == "mcpServers.a.command"


# -- pure helpers ----------------------------------------------------------------------------------------------

def test_qualified_names_are_valid_unique_and_stable() -> None:
    long = "t" * 80
    names = qualified_names([("my.fs", ["read file", "read_file", long]), ("my_fs", ["read_file"]),
                             ("web", ["search"])])
    assert names[("web", "search")] == "web__search"
    assert names[("my.fs", "read file")] == "my_fs__read_file"
    assert len(set(names.values())) == len(names)
    assert all(OPENAI_NAME.match(n) for n in names.values())
    # The same config gives the same names (hash suffixes, not list positions).
    assert qualified_names([("my.fs", ["read file", "read_file", long]), ("my_fs", ["read_file"]),
                            ("web", ["search"])]) == names


def test_content_to_text_covers_every_block_kind() -> None:
    blocks = [
        {"type": "text", "text": "hello"},
        {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
        {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
        {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "A"}},
        {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAAA", "mimeType": "app/x"}},
        {"type": "resource_link", "uri": "file:///c", "name": "c"},
    ]
    assert content_to_text(blocks).splitlines() == [
        "hello",
        "[image: image/png, 5 bytes, not shown to the model]",
        "[audio: audio/wav, 3 bytes, not shown to the model]",
        "[resource file:///a.txt]", "A",
        "[resource file:///b.bin: app/x, 3 bytes, not shown to the model]",
        "[resource link: c file:///c]",
    ]
    assert content_to_text([], {"result": 5}) == '{"result": 5}'


# -- real servers ----------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _http_server():
    """The tool server over streamable HTTP on a free 127.0.0.1 port, in a subprocess stopped whatever happens;
    yields (url, process)."""
    port = _free_port()
    proc = subprocess.Popen([PY, str(SERVERS / "tool_server.py"), "http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the HTTP MCP server did not come up (exit {proc.poll()})") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def http_url():
    with _http_server() as (url, _):
        yield url


@pytest.fixture(scope="module")
def hub(http_url: str):
    cfg = parse_config({"mcpServers": {
        "t": _stdio("tool_server.py"),
        "web": {"url": http_url, "headers": {"X-Hearth-Test": "sesame"}},
        "crashy": _stdio("tool_server.py"),
        "exit": {**_stdio("exit_at_start.py"), "disabled": True},
        "hang": {**_stdio("hang_at_start.py"), "disabled": True},
        "nocmd": {"command": str(SERVERS / "no-such-program"), "disabled": True},
    }})
    h = McpHub(cfg)
    try:
        status = h.start(timeout_s=20)
        assert {n: s.state for n, s in status.items()} == {
            "t": "ready", "web": "ready", "crashy": "ready", "exit": "stopped", "hang": "stopped",
            "nocmd": "stopped"}, {n: s.error for n, s in status.items()}
        yield h
    finally:
        h.close()


def test_lists_tools_of_both_transports(hub: McpHub) -> None:
    names = {t.qualified_name: t for t in hub.tools()}
    for server in ("t", "web"):
        for tool in ("add", "echo", "big", "slow", "fail"):
            assert f"{server}__{tool}" in names
    add = names["t__add"]
    assert (add.server, add.name, add.description) == ("t", "add", "Add two integers.")
    assert add.input_schema["properties"]["a"]["type"] == "integer"
    assert add.openai_tool()["function"]["name"] == "t__add"
    assert all(OPENAI_NAME.match(n) for n in names)
    assert hub.status()["t"].server_info == "hearth-test 1.0"


@pytest.mark.parametrize("server", ["t", "web"])
def test_call_returns_text_and_structured_content(hub: McpHub, server: str) -> None:
    r = hub.call(f"{server}__add", {"a": 2, "b": 3}, timeout_s=10)
    assert (r.text, r.is_error, r.structured, r.size_bytes) == ("5", False, {"result": 5}, 1)
    assert r.raw == [{"type": "text", "text": "5"}]
    bad = hub.call(f"{server}__fail", {}, timeout_s=10)
    assert bad.is_error and "this tool always fails" in bad.text


def test_http_headers_reach_the_server(hub: McpHub) -> None:
    assert hub.call("web__header", {"name": "X-Hearth-Test"}, timeout_s=10).text == "sesame"


@pytest.mark.parametrize("server", ["t", "web"])
def test_one_megabyte_result_is_whole(hub: McpHub, server: str) -> None:
    r = hub.call(f"{server}__big", {"n_bytes": 1_000_000}, timeout_s=20)
    assert r.size_bytes == 1_000_000 and len(r.text) == 1_000_000 and not r.is_error


def test_call_past_its_timeout_raises_and_the_server_stays_usable(hub: McpHub, monkeypatch, caplog) -> None:
    probes: list[str] = []  # the call's own deadline, in the hub's loop, pings the server after it fires
    probe = hub._probe
    monkeypatch.setattr(hub, "_probe", lambda srv, session, after, *a: probes.append(after) or probe(
        srv, session, after, *a))
    with caplog.at_level(logging.WARNING, logger="app.mcp.client"), pytest.raises(ToolError) as e:
        hub.call("t__slow", {"seconds": 30}, timeout_s=0.5)
    assert (e.value.kind, e.value.server, e.value.tool) == ("timeout", "t", "slow")
    # The 0.5 s deadline fired in the loop (its ping follows), not the caller's fallback wait of 0.5 + 5 s.
    assert probes == ["a call timed out"]
    assert not [r for r in caplog.records if "gave up waiting" in r.getMessage()]
    assert "0.5 s" in str(e.value)
    assert hub.call("t__echo", {"text": "still here"}, timeout_s=10).text == "still here"
    assert hub.status()["t"].state == "ready"


def test_calls_from_many_threads_at_once(hub: McpHub) -> None:
    results: dict[int, str] = {}

    def work(i: int) -> None:
        results[i] = hub.call("t__add" if i % 2 else "web__add", {"a": i, "b": 1}, timeout_s=20).text

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: str(i + 1) for i in range(8)}


def test_switched_off_tools_are_hidden_and_refused(hub: McpHub) -> None:
    base = hub.config
    try:
        hub.apply_config(base.with_tool_enabled("t", "echo", False))
        assert "t__echo" not in {t.qualified_name for t in hub.tools()}
        off = {t.qualified_name: t for t in hub.tools(enabled_only=False)}["t__echo"]
        assert not off.enabled
        assert "web__echo" in {t.qualified_name for t in hub.tools()}
        with pytest.raises(ToolError, match="switched off") as e:
            hub.call("t__echo", {"text": "x"}, timeout_s=5)
        assert e.value.kind == "unknown_tool"
        assert hub.status()["t"].state == "ready"  # a switch does not restart the server
        hub.apply_config(hub.config.with_always_allow("t", "add"))
        assert hub.tool("t__add").always_allowed and not hub.tool("web__add").always_allowed
    finally:
        hub.apply_config(base)
    assert hub.call("t__echo", {"text": "back"}, timeout_s=10).text == "back"


def test_unknown_tool_and_bad_arguments(hub: McpHub) -> None:
    with pytest.raises(ToolError) as e:
        hub.call("nope__nothing", {}, timeout_s=5)
    assert e.value.kind == "unknown_tool"
    with pytest.raises(HearthError, match="JSON object"):
        hub.call("t__add", ["not", "a", "dict"], timeout_s=5)  # type: ignore[arg-type]
    r = hub.call("t__add", {"a": "x"}, timeout_s=10)  # the server validates: the model sees why
    assert r.is_error and "validation" in r.text


def test_server_that_exits_at_start_fails_clearly(hub: McpHub) -> None:
    st = hub.start("exit", timeout_s=10)["exit"]
    assert st.state == "failed"
    # Its exit is what failed it, not the 10 s handshake timeout.
    assert "exited before answering initialize" in st.error and "no answer to initialize" not in st.error
    assert "HEARTH_TEST_TOKEN is not set" in st.error  # its last stderr line says why
    with pytest.raises(ToolError) as e:
        hub.call("exit__add", {}, timeout_s=5)
    assert e.value.kind == "unknown_tool"
    assert hub.call("t__add", {"a": 1, "b": 1}, timeout_s=10).text == "2"  # the others keep working


def test_server_that_hangs_at_start_fails_within_the_timeout(hub: McpHub, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="app.mcp.client"):
        st = hub.start("hang", timeout_s=1.5)["hang"]
    # The 1.5 s handshake deadline failed it, and start() returned on that (still "starting" otherwise):
    # not on the caller's fallback wait of 1.5 + 5 s, which would log that it gave up.
    assert st.state == "failed" and "no answer to initialize within 1.5 s" in st.error
    assert not [r for r in caplog.records if "gave up waiting" in r.getMessage()]
    assert hub.call("web__add", {"a": 1, "b": 1}, timeout_s=10).text == "2"


def test_missing_program_fails_clearly(hub: McpHub) -> None:
    st = hub.start("nocmd", timeout_s=5)["nocmd"]
    assert st.state == "failed" and "no such program" in st.error and "no-such-program" in st.error


def test_unreachable_http_server_fails_clearly() -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    with McpHub(parse_config({"mcpServers": {"gone": {"url": url}}})) as h:
        st = h.start(timeout_s=5)["gone"]
    assert st.state == "failed" and f"cannot reach {url}" in st.error


def test_crash_mid_session_fails_the_server_and_it_can_restart(hub: McpHub) -> None:
    with pytest.raises(ToolError) as e:
        hub.call("crashy__crash", {}, timeout_s=10)
    assert (e.value.kind, e.value.server) == ("crashed", "crashy")
    deadline = time.monotonic() + 5
    while hub.status()["crashy"].state != "failed" and time.monotonic() < deadline:
        time.sleep(0.02)
    st = hub.status()["crashy"]
    assert st.state == "failed" and "closed the connection" in st.error and st.tools == ()
    with pytest.raises(ToolError):
        hub.call("crashy__add", {"a": 1, "b": 2}, timeout_s=5)
    assert hub.call("t__add", {"a": 1, "b": 2}, timeout_s=10).text == "3"
    assert hub.start("crashy", timeout_s=20)["crashy"].state == "ready"
    assert hub.call("crashy__add", {"a": 1, "b": 2}, timeout_s=10).text == "3"


def test_http_server_that_dies_mid_session_fails_clearly() -> None:
    with _http_server() as (url, proc), McpHub(parse_config({"mcpServers": {"w": {"url": url}}})) as h:
        assert h.start(timeout_s=20)["w"].state == "ready"
        assert h.call("w__add", {"a": 1, "b": 2}, timeout_s=10).text == "3"
        proc.kill()
        proc.wait()
        with pytest.raises(ToolError) as e:
            h.call("w__add", {"a": 1, "b": 2}, timeout_s=5)
        assert e.value.kind == "crashed"
        st = h.status()["w"]
        assert st.state == "failed" and "stopped answering" in st.error
        with pytest.raises(ToolError, match="the server is failed") as e:
            h.call("w__add", {"a": 1, "b": 2}, timeout_s=5)
        assert e.value.kind == "unavailable"


# -- no process left behind ------------------------------------------------------------------------------------

def _children(marker: str) -> list[tuple[int, str, str]]:
    """(pid, state, cmdline) of this process's children: those tagged with ``marker``, and any zombie."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == os.getpid() and (marker in cmd or state == "Z"):
            out.append((int(d.name), state, cmd))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_close_leaves_no_child_processes(caplog) -> None:
    marker = f"--marker={uuid.uuid4().hex}"
    cfg = parse_config({"mcpServers": {
        "t": {"command": PY, "args": [str(SERVERS / "tool_server.py"), marker]},
        "stubborn": {"command": PY, "args": [str(SERVERS / "hang_at_start.py"), marker, "--ignore-sigterm"]},
    }})
    seen: list[tuple[str, str]] = []
    h = McpHub(cfg, on_status=lambda st: seen.append((st.name, st.state)))
    h.start("t", timeout_s=20)
    assert h.call("t__grow", {}, timeout_s=10).text == "grown"  # notifications/tools/list_changed
    deadline = time.monotonic() + 5
    while "t__extra" not in {t.qualified_name for t in h.tools()} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert h.call("t__extra", {}, timeout_s=10).text == "extra"
    h.start("stubborn", wait=False)  # still starting when close() comes
    errors: list[ToolError] = []

    def in_flight() -> None:
        try:
            h.call("t__slow", {"seconds": 30}, timeout_s=20)
        except ToolError as e:
            errors.append(e)

    call = threading.Thread(target=in_flight)
    call.start()
    deadline = time.monotonic() + 10
    while len(_children(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_children(marker)) == 2
    with caplog.at_level(logging.WARNING, logger="app.mcp.client"):
        h.close()
    call.join(5)
    assert not call.is_alive() and [e.kind for e in errors] == ["unavailable"]
    # Each server stopped on its own path (the stubborn one by the SIGKILL after its ignored SIGTERM) within
    # close()'s budget: none had to be cancelled, and close() did not give up waiting.
    assert not [r.getMessage() for r in caplog.records
                if any(w in r.getMessage() for w in ("did not stop", "gave up waiting", "did not finish"))]
    assert _children(marker) == []
    assert {s.state for s in h.status().values()} == {"stopped"}
    assert [st for name, st in seen if name == "t"] == ["starting", "ready", "ready", "stopped"]  # + re-list
    assert [st for name, st in seen if name == "stubborn"] == ["starting", "stopped"]
    with pytest.raises(ToolError, match="closed"):
        h.start()
