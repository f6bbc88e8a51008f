"""The names the model sees for MCP tools: one name, one (server, tool) pair (issue 29, item 4).

Servers ``a__b`` (tool ``c``) and ``a`` (tool ``b__c``, always allowed) once both became ``a__b__c``: the
permission question looked up the allowed tool and the call ran the other one. Names are now unique by
construction (``qualified_names``); a collision that still arose is refused with both servers named; the tool
loop's permission lookup and the hub's call resolve the same pair. Real stdio servers, no model.
"""

from __future__ import annotations

import random
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.assistant.tool_loop import Permission, ToolBox, ToolCallRequested, ToolResultShown
from app.mcp import McpHub, ToolError, parse_config, qualified_names
from app.protocol.tools import ToolCall

OPENAI_NAME = r"^[a-zA-Z0-9_-]{1,64}$"

# A stdio server whose tools answer "<label>/<tool>", so a test can see which one ran.
SERVER_SCRIPT = '''
import sys
from mcp.server.mcpserver import MCPServer

label, names = sys.argv[1], sys.argv[2:]
server = MCPServer("names-test", log_level="WARNING")


def make(name):
    def run() -> str:
        return f"{label}/{name}"
    return run


for n in names:
    server.add_tool(make(n), name=n, description=f"tool {n} of {label}")
server.run("stdio")
'''


# -- by construction -------------------------------------------------------------------------------------------

def test_the_reported_pair_gets_two_names() -> None:
    names = qualified_names([("a__b", ["c"]), ("a", ["b__c"])])
    assert names[("a__b", "c")] != names[("a", "b__c")]
    assert names[("a", "b__c")] == "a__b__c"  # a plain server name keeps its plain prefix


@pytest.mark.parametrize("servers", [
    [("a__b", ["c"]), ("a", ["b__c"])],
    [("a", ["b__c"]), ("a__b", ["c"])],
    [("a_", ["_b"]), ("a", ["__b"])],
    [("a.", ["b"]), ("a", ["_b"])],
    [("x" * 23 + "_z", ["t"]), ("x" * 23, ["_t"])],  # a prefix cut at 24 characters that ends in "_"
    [("my_fs", ["t"]), ("my.fs", ["t"]), ("my_fs_" + "0" * 8, ["t"])],
    [("", ["t"]), ("_", ["t"]), ("é", ["t"]), ("mcp", ["t"])],
])
def test_names_are_unique_across_servers(servers) -> None:
    names = qualified_names(servers)
    assert len(set(names.values())) == len(names), names
    assert all(re.match(OPENAI_NAME, n) for n in names.values())


def test_names_are_unique_for_many_random_configs() -> None:
    rng = random.Random(29)
    alphabet = "ab_._-"
    for _ in range(3000):
        servers = [("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))),
                    ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(3)])
                   for _ in range(rng.randint(2, 4))]
        servers = list({s: t for s, t in servers}.items())  # server names are unique in mcp.json
        names = qualified_names(servers)
        pairs = {(s, t) for s, tools in servers for t in tools}
        assert len(set(names.values())) == len(pairs), servers


def test_the_prefix_names_the_server() -> None:
    """The part before the first "__" tells the server: a prefix never contains "__" nor ends in "_"."""
    servers = [("a__b", ["c"]), ("a", ["b__c", "__x"]), ("a_", ["y"]), ("a-_", ["z"]), ("__", ["w"])]
    names = qualified_names(servers)
    owner: dict[str, str] = {}
    for (server, _tool), name in names.items():
        prefix = name.split("__", 1)[0]
        assert owner.setdefault(prefix, server) == server, names


# -- against real servers --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("names") / "named_tools.py"
    path.write_text(SERVER_SCRIPT, encoding="utf-8")
    return path


def _config(script: Path):
    return parse_config({"mcpServers": {
        "a__b": {"command": sys.executable, "args": [str(script), "a__b", "c"]},
        "a": {"command": sys.executable, "args": [str(script), "a", "b__c"], "alwaysAllow": ["b__c"]},
    }})


@pytest.fixture(scope="module")
def hub(script: Path):
    with McpHub(_config(script)) as h:
        status = h.start(timeout_s=20)
        assert {n: s.state for n, s in status.items()} == {"a__b": "ready", "a": "ready"}, status
        assert not any(s.error for s in status.values())
        yield h


class _Session:
    """What ``ToolBox.run_calls`` needs of a chat session: a store for results and the prompt's cut."""

    builder = SimpleNamespace(cut_result=lambda text, cap: text, tool_result_cap=100_000)

    def __init__(self) -> None:
        self.results: list[tuple[str, str]] = []

    def add_tool_result(self, _conversation: str, _parent: str, call: ToolCall, text: str, meta=None) -> str:
        self.results.append((call.name, text))
        return f"m{len(self.results)}"


def test_an_always_allowed_tool_never_runs_another_servers_tool_unasked(hub: McpHub) -> None:
    asked: list[tuple[str, str]] = []

    def deny(req: ToolCallRequested) -> Permission:
        asked.append((req.server, req.tool))
        return Permission.DENY

    box = ToolBox(hub, deny)
    offered = [s.name for s in box.specs()]
    session = _Session()
    calls = tuple(ToolCall(f"call_{i:024d}", name, "{}") for i, name in enumerate(offered))
    events = list(_drain(box.run_calls(session, "conv", calls, "m0", 1)))
    ran = {text for _, text in session.results if "/" in text and "did not allow" not in text}
    assert ran == {"a/b__c"}, session.results  # only the always-allowed tool ran without asking
    assert asked == [("a__b", "c")]
    assert len(offered) == 2 and len(set(offered)) == 2, offered
    outcomes = {e.call.name: e.outcome for e in events if isinstance(e, ToolResultShown)}
    assert sorted(outcomes.values()) == ["denied", "ok"]


def test_the_hub_calls_the_pair_the_name_was_given_to(hub: McpHub) -> None:
    assert {(t.server, t.name, t.always_allowed) for t in hub.tools()} == {("a__b", "c", False), ("a", "b__c", True)}
    for t in hub.tools():
        assert hub.tool(t.qualified_name) == t
        assert hub.call(t.qualified_name, {}, timeout_s=10).text == f"{t.server}/{t.name}"
        assert hub.call(t, {}, timeout_s=10).text == f"{t.server}/{t.name}"  # the McpTool itself


def test_a_collision_that_still_arises_is_refused_naming_both_servers(script: Path, monkeypatch) -> None:
    import app.mcp.client as client

    monkeypatch.setattr(client, "qualified_names", lambda servers: {
        (s, t): "same__name" for s, tools in servers for t in tools})
    with McpHub(_config(script)) as hub:
        status = hub.start(timeout_s=20)
        assert hub.tools() == [] and hub.tools(enabled_only=False) == []  # neither is offered
        for name in ("a__b", "a"):
            assert status[name].state == "ready"
            assert "a__b" in (status[name].error or "") and "'a'" in (status[name].error or "")
        with pytest.raises(ToolError) as e:
            hub.call("same__name", {}, timeout_s=10)
        assert e.value.kind == "unknown_tool" and "a__b" in str(e.value) and "'a'" in str(e.value)


def test_calling_an_mcptool_runs_its_own_pair_not_whatever_its_name_resolves_to(hub: McpHub) -> None:
    asked_for = next(t for t in hub.tools() if t.server == "a__b")
    moved = replace(asked_for, server="a", name="b__c")  # same qualified name, another pair
    assert hub.call(moved, {}, timeout_s=10).text == "a/b__c"
    assert hub.call(asked_for, {}, timeout_s=10).text == "a__b/c"
    with pytest.raises(ToolError) as e:
        hub.call(replace(asked_for, name="gone"), {}, timeout_s=10)
    assert (e.value.kind, e.value.server, e.value.tool) == ("unknown_tool", "a__b", "gone")


def _drain(gen):
    while True:
        try:
            yield next(gen)
        except StopIteration:
            return

