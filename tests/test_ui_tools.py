"""Tools and MCP in the desktop window (offscreen, pytest-qt), with the MCP test servers of
``tests/mcp_servers/`` started from the window's mcp.json.

The window lists the stdio server's tools in Settings (switches saved as ``disabledTools``), shows a call,
asks permission, calls the tool, shows the result collapsed and stores it; "Always allow" is saved as
``alwaysAllow``; a server that exits at start and one that hangs past the start timeout are named with their
reason and leave the chat usable; a call past its timeout is a failed result; a 1 MB result is cut in the
prompt with a note and stored whole; Stop while the window asks ends the turn; one server over streamable HTTP
on 127.0.0.1. The model is the fake engine (``tests/fakes.py``): these claims are about the wiring, and the
scripted model calls exactly the tool each test needs (the loop's claim about a real model is in
tests/test_tool_loop.py). Every test ends with no worker, tool-call thread or MCP server process left.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.assistant import Permission
from app.mcp import load_config
from app.protocol.types import GenerateRequest
from tests.fakes import FakeEngine

pytestmark = pytest.mark.gui

SERVERS = Path(__file__).parent / "mcp_servers"
MB = 1024 * 1024
TURN_MS = 30_000


def server(script: str, *args: str) -> dict:
    return {"command": sys.executable, "args": [str(SERVERS / script), *args]}


def write_mcp(home: Path, servers: dict) -> None:
    (home / "mcp.json").write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")


def calls_then_answers(call: str, args: dict, final: str = "Result:"):
    """A model that calls ``call`` once per turn, then answers ``final`` and the result it was given."""

    def reply(req: GenerateRequest) -> str:
        start = max(i for i, m in enumerate(req.messages) if m.role == "user")
        last = req.messages[-1]
        if req.tools and req.choice.mode != "none" and not any(m.tool_calls for m in req.messages[start:]):
            return "Tool call: " + json.dumps({"name": call, "arguments": args})
        return f"{final} {last.content[:40]}" if last.role == "tool" else final

    return reply


def open_window(qtbot, reply=None, n_ctx: int = 4096, **tool_limits):
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    for k, v in tool_limits.items():
        setattr(ctx.tools, k, v)
    w = MainWindow(ctx, autoload=False)
    qtbot.addWidget(w)
    w.show()
    ctx.engine.engine = FakeEngine(n_ctx=n_ctx, reply=reply)  # a loaded model, as the controller holds one
    ctx.engine._set_state("ready")
    return w


def close_window(w) -> None:
    ctx = w.ctx
    w.close()
    assert ctx.pool.pool.activeThreadCount() == 0 and ctx.pool.active == 0
    assert not [t for t in threading.enumerate() if t.name in ("hearth-tool-call", "mcp-hub") and t.is_alive()]
    assert all(s.state != "ready" for s in ctx.tools.statuses().values())  # every server stopped


def wait_ready(qtbot, w, *names: str, timeout: int = 30_000) -> None:
    qtbot.waitUntil(lambda: all(w.ctx.tools.statuses()[n].state in ("ready", "failed") for n in names),
                    timeout=timeout)


def send(qtbot, w, text: str) -> None:
    w.chat.composer.setPlainText(text)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_Return)


def shown(widget) -> bool:
    """Not hidden (a widget just built for a rebuilt branch is visible once the event loop lays it out)."""
    return not widget.isHidden()


def tool_widget(w):
    from app.ui.tool_view import ToolCallWidget

    found = [x for x in w.chat.widgets if isinstance(x, ToolCallWidget)]
    return found[-1] if found else None


def asking(w) -> bool:
    t = tool_widget(w)
    return t is not None and t.row.tool_state == "asking" and shown(t.buttons["allow_once"])


@pytest.fixture
def stdio_window(qtbot, hearth_home: Path):
    write_mcp(hearth_home, {"t": server("tool_server.py")})
    w = open_window(qtbot, calls_then_answers("t__add", {"a": 2, "b": 3}, "The sum is"))
    wait_ready(qtbot, w, "t")
    yield w
    close_window(w)


def test_a_call_is_shown_asked_for_run_shown_collapsed_and_stored(qtbot, stdio_window) -> None:
    w = stdio_window
    # The chat says tools are on, and which (nothing did: issue 27)
    qtbot.waitUntil(lambda: shown(w.header.tools) and w.header.tools.text().startswith("⚒ Tools on"),
                    timeout=10_000)  # the server's "ready" reaches the window's header as a queued signal
    n = len(w.ctx.tools.hub.tools())
    assert w.header.tools.text() == f"⚒ Tools on: {n}" and "t: add" in w.header.tools.toolTip()
    send(qtbot, w, "What is 2 + 3?")
    qtbot.waitUntil(lambda: asking(w), timeout=TURN_MS)
    tw = tool_widget(w)
    assert "t › add" in tw.header.text() and "asks for your permission" in tw.header.text()
    assert tw.args.text() == '{"a": 2, "b": 3}'
    assert w.ctx.chat.busy and not shown(tw.toggle)
    qtbot.mouseClick(tw.buttons["allow_once"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
    rows = w.chat_model.items()
    assert [r.role for r in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[1].tool_calls and "calls a tool" in w.chat.widgets[1].status.text()
    assert not shown(w.chat.widgets[1].body)
    assert (rows[2].tool_state, rows[2].content, rows[2].server, rows[2].tool) == ("ok", "5", "t", "add")
    assert rows[3].content == "The sum is 5"
    tw = tool_widget(w)  # rebuilt from the store: collapsed, expandable
    assert shown(tw.toggle) and not shown(tw.result) and tw.toggle.text().startswith("Result ▸ (1 byte")
    tw.toggle.click()
    assert shown(tw.result) and tw.result.toPlainText() == "5"
    stored = w.ctx.store.get_message(rows[2].id)
    assert (stored.role, stored.content, stored.name, stored.meta["outcome"]) == ("tool", "5", "t__add", "ok")
    assert not asking(w) and w.chat.send_btn.isEnabled()


def test_always_allow_is_saved_and_not_asked_again_and_deny_is_shown(qtbot, stdio_window) -> None:
    w = stdio_window
    send(qtbot, w, "first")
    qtbot.waitUntil(lambda: asking(w), timeout=TURN_MS)
    qtbot.mouseClick(tool_widget(w).buttons["allow_always"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
    assert load_config().server("t").always_allow == {"add"}
    send(qtbot, w, "second")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
    assert w.chat_model.items()[-2].tool_state == "ok" and w.chat_model.items()[-1].content == "The sum is 5"
    # a tool not in alwaysAllow still asks; Deny is shown and the model reads it
    w.ctx.engine.engine.runtime.reply = calls_then_answers("t__echo", {"text": "secret"}, "Told:")
    send(qtbot, w, "third")
    qtbot.waitUntil(lambda: asking(w), timeout=TURN_MS)
    qtbot.mouseClick(tool_widget(w).buttons["deny"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
    tw = tool_widget(w)
    assert tw.row.tool_state == "denied" and "denied" in tw.header.text()
    assert w.chat_model.items()[-1].content.startswith("Told: The person did not allow")


def test_settings_list_the_tools_and_the_switches_are_saved(qtbot, stdio_window) -> None:
    w = stdio_window
    w.show_page("tools")
    dlg = w.tools_page
    page = dlg.mcp
    assert page.servers.item(0).text() == "t — ready · 8 tools"
    names = [page.tools.item(i).data(Qt.ItemDataRole.UserRole) for i in range(page.tools.count())]
    assert names[:3] == ["add", "echo", "big"]
    assert page.command.text() == sys.executable and page.args.toPlainText() == str(SERVERS / "tool_server.py")
    page.tools.item(1).setCheckState(Qt.CheckState.Unchecked)  # echo off
    assert dlg.save() and dlg.new_mcp is not None  # Save applies it
    assert load_config().server("t").disabled_tools == {"echo"}
    assert "t__echo" not in [t.qualified_name for t in w.ctx.tools.hub.tools()]
    assert "t__add" in [t.qualified_name for t in w.ctx.tools.hub.tools()]


def test_settings_add_edit_and_refuse_a_bad_entry(qtbot, stdio_window) -> None:
    w = stdio_window
    w.show_page("tools")
    dlg = w.tools_page
    page = dlg.mcp
    page.add_server()
    page.name.setText("web")
    page.http.setChecked(True)
    page.url.setText("ftp://nowhere")
    assert not dlg.save() and "mcpServers.web.url must be an http:// or https:// URL" in dlg.error.text()
    page.url.setText("http://127.0.0.1:9/mcp")
    page.headers.setPlainText("no colon here")
    assert not dlg.save() and "mcpServers.web.headers: line 1 must be KEY:value" in dlg.error.text()
    page.headers.setPlainText("Authorization: Bearer k")
    assert dlg.save()
    web = dlg.new_mcp.server("web")
    assert (web.transport, web.url, dict(web.headers)) == ("http", "http://127.0.0.1:9/mcp",
                                                           {"Authorization": "Bearer k"})
    assert dlg.new_mcp.server("t").command == sys.executable  # the other entry is unchanged


def test_failing_servers_are_named_and_the_chat_goes_on(qtbot, hearth_home: Path) -> None:
    write_mcp(hearth_home, {"dead": server("exit_at_start.py"), "hang": server("hang_at_start.py"),
                            "t": server("tool_server.py")})
    w = open_window(qtbot, calls_then_answers("t__add", {"a": 1, "b": 1}, "Got"), start_timeout_s=3)
    try:
        wait_ready(qtbot, w, "dead", "hang", "t", timeout=30_000)
        st = w.ctx.tools.statuses()
        assert st["dead"].state == "failed" and "exited" in st["dead"].error
        assert st["hang"].state == "failed" and "within 3 s" in st["hang"].error
        qtbot.waitUntil(lambda: "'hang' failed" in w.notice.text(), timeout=5_000)
        assert shown(w.notice) and "MCP server 'dead' failed" in w.notice.text()
        w.show_page("tools")
        dlg = w.tools_page
        texts = [dlg.mcp.servers.item(i).text() for i in range(3)]
        assert texts[0].startswith("dead — failed: ") and texts[1].startswith("hang — failed: no answer")
        dlg.show_current()
        w.ctx.tools.hub.apply_config(w.ctx.tools.config.with_always_allow("t", "add"))
        send(qtbot, w, "1 + 1?")
        qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
        assert w.chat_model.items()[-1].content == "Got 2"
        assert not shown(w.error)
    finally:
        close_window(w)


def test_a_call_past_its_timeout_is_a_failed_result_and_the_chat_goes_on(qtbot, hearth_home: Path) -> None:
    write_mcp(hearth_home, {"t": server("tool_server.py")})
    w = open_window(qtbot, calls_then_answers("t__slow", {"seconds": 30}, "Sorry:"), call_timeout_s=1)
    try:
        wait_ready(qtbot, w, "t")
        send(qtbot, w, "slow please")
        qtbot.waitUntil(lambda: asking(w), timeout=TURN_MS)
        qtbot.mouseClick(tool_widget(w).buttons["allow_once"], Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
        tw = tool_widget(w)
        assert tw.row.tool_state == "failed" and shown(tw.notice)
        assert "no answer within 1 s" in tw.notice.text()
        assert w.chat_model.items()[-1].content.startswith("Sorry: Error: the tool could not be called")
        w.ctx.engine.engine.runtime.reply = lambda req: "still here"
        send(qtbot, w, "hello?")
        qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
        assert w.chat_model.items()[-1].content == "still here"
    finally:
        close_window(w)


def test_a_1_mb_result_is_cut_in_the_prompt_and_stored_whole(qtbot, hearth_home: Path) -> None:
    write_mcp(hearth_home, {"t": {**server("tool_server.py"), "alwaysAllow": ["big"]}})
    w = open_window(qtbot, calls_then_answers("t__big", {"n_bytes": MB}, "Read"))
    try:
        wait_ready(qtbot, w, "t")
        send(qtbot, w, "a big one")
        qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
        seen = w.ctx.engine.engine.seen
        prompt_result = seen[1].messages[-1].content
        assert prompt_result.endswith("the whole result is kept in the conversation]")
        assert "[result cut: 1,048,576 bytes, first " in prompt_result and len(prompt_result) < 4096
        tw = tool_widget(w)
        assert tw.toggle.text() == "Result ▸ (1.0 MB)"  # rebuilt from the store: the whole result
        assert len(w.ctx.store.get_message(tw.row.id).content) == MB
        tw.toggle.click()
        assert tw.result.toPlainText().endswith("the whole result is kept in the conversation]")
    finally:
        close_window(w)


def test_the_live_row_says_the_prompt_shows_a_cut(qtbot, hearth_home: Path) -> None:
    from app.ui.tool_view import ToolCallWidget

    write_mcp(hearth_home, {"t": {**server("tool_server.py"), "alwaysAllow": ["big"]}})
    w = open_window(qtbot, calls_then_answers("t__big", {"n_bytes": 50_000}, "Read"))
    try:
        wait_ready(qtbot, w, "t")
        live: list = []
        w.ctx.chat.tool_result.connect(lambda _s: live.append(w.chat_model.item(w.chat_model.rowCount() - 1)))
        send(qtbot, w, "a big one")
        qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
        row = live[0]
        assert row.role == "tool" and row.tool_state == "ok" and row.size_bytes == 50_000
        assert row.prompt_note.startswith("[result cut: 50,000 bytes, first ")
        tw = ToolCallWidget(row)
        qtbot.addWidget(tw)
        assert tw.toggle.text() == "Result ▸ (50.0 KB · cut in the prompt)" and tw.toggle.toolTip() == row.prompt_note
    finally:
        close_window(w)


def test_stop_while_asking_ends_the_turn_and_the_chat_goes_on(qtbot, stdio_window) -> None:
    w = stdio_window
    send(qtbot, w, "add")
    qtbot.waitUntil(lambda: asking(w), timeout=TURN_MS)
    qtbot.keyClick(w.chat.composer, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=10_000)
    assert not shown(w.error)  # a stop is not an error
    w.ctx.engine.engine.runtime.reply = lambda req: "fine"
    send(qtbot, w, "still there?")
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
    assert w.chat_model.items()[-1].content == "fine"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_over_streamable_http(qtbot, hearth_home: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVERS / "tool_server.py"), "http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        write_mcp(hearth_home, {"web": {"url": f"http://127.0.0.1:{port}/mcp", "alwaysAllow": ["add"]}})
        w = open_window(qtbot, calls_then_answers("web__add", {"a": 20, "b": 22}, "Over HTTP:"))
        try:
            wait_ready(qtbot, w, "web")
            assert w.ctx.tools.statuses()["web"].state == "ready"
            send(qtbot, w, "add over http")
            qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
            assert w.chat_model.items()[-1].content == "Over HTTP: 42"
        finally:
            close_window(w)
    finally:
        proc.terminate()
        proc.wait(10)


def test_tool_view_wording() -> None:
    from app.ui.models import ChatRow
    from app.ui.tool_view import PREVIEW_CHARS, arguments_text, result_preview, size_text, state_text

    assert arguments_text('{"a":1,"b":"x"}') == '{"a": 1, "b": "x"}' and arguments_text("not json") == "not json"
    assert len(arguments_text(json.dumps({"t": "y" * 5000}))) == 600
    assert [size_text(n) for n in (1, 5, 12_345, MB)] == ["1 byte", "5 bytes", "12.3 KB", "1.0 MB"]
    assert state_text(ChatRow(None, "tool", "", tool_state="asking")) == "asks for your permission"
    big = result_preview("z" * MB)
    assert big.startswith("z" * PREVIEW_CHARS) and f"of {MB:,}" in big
    assert Permission("once") is Permission.ONCE


def test_without_mcp_json_turns_offer_no_tools(qtbot) -> None:
    w = open_window(qtbot, lambda req: "plain")
    try:
        send(qtbot, w, "hi")
        qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
        assert w.chat_model.items()[-1].content == "plain" and w.ctx.engine.engine.seen[-1].tools == ()
        assert not w.header.tools.isVisibleTo(w) and w.header.tools.text() == ""
        w.show_page("tools")
        dlg = w.tools_page
        assert dlg.mcp.servers.count() == 0 and not dlg.mcp.editor.isEnabled()
        assert dlg.save() and dlg.new_mcp is None  # nothing changed: mcp.json is not written
        assert not (w.ctx.tools.config_path or (Path(w.ctx.store.path).parent / "mcp.json")).exists()
    finally:
        close_window(w)


def test_a_malformed_mcp_json_is_named_and_replaced_from_settings(qtbot, hearth_home: Path) -> None:
    (hearth_home / "mcp.json").write_text('{"mcpServers": {"x": {"args": []}}}', encoding="utf-8")
    w = open_window(qtbot, lambda req: "plain")
    try:
        assert shown(w.notice) and "mcpServers.x needs a command" in w.notice.text()
        w.show_page("tools")
        dlg = w.tools_page
        assert shown(dlg.mcp.file_error) and "needs a command" in dlg.mcp.file_error.text()
        dlg.mcp.add_server()
        dlg.mcp.command.setText(sys.executable)
        dlg.mcp.args.setPlainText(str(SERVERS / "tool_server.py"))
        assert dlg.save()
        assert load_config().names() == ["server1"] and not shown(w.notice)
        qtbot.waitUntil(lambda: w.ctx.tools.statuses()["server1"].state == "ready", timeout=30_000)
    finally:
        close_window(w)


def test_always_allowed_is_taken_back_in_settings_and_the_next_call_asks(qtbot, stdio_window) -> None:
    w = stdio_window
    send(qtbot, w, "first")
    qtbot.waitUntil(lambda: asking(w), timeout=TURN_MS)
    qtbot.mouseClick(tool_widget(w).buttons["allow_always"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
    assert load_config().server("t").always_allow == {"add"}
    w.show_page("tools")
    dlg = w.tools_page
    page = dlg.mcp
    items = {page.tools.item(i).data(Qt.ItemDataRole.UserRole): page.tools.item(i) for i in range(page.tools.count())}
    assert items["add"].text().endswith("(always allowed)") and "always" not in items["echo"].text()
    page.tools.setCurrentItem(items["echo"])
    assert not page.ask_again_btn.isEnabled()
    page.tools.setCurrentItem(items["add"])
    assert page.ask_again_btn.isEnabled()
    qtbot.mouseClick(page.ask_again_btn, Qt.MouseButton.LeftButton)
    add = next(page.tools.item(i) for i in range(page.tools.count())
               if page.tools.item(i).data(Qt.ItemDataRole.UserRole) == "add")
    assert "always" not in add.text() and not page.ask_again_btn.isEnabled()
    assert load_config().server("t").always_allow == {"add"}  # nothing saved before Save
    assert dlg.save() and dlg.new_mcp.server("t").always_allow == frozenset()
    saved = json.loads((w.ctx.tools.config_path or (Path(w.ctx.store.path).parent / "mcp.json")).read_text())
    assert "alwaysAllow" not in saved["mcpServers"]["t"] and load_config().server("t").always_allow == set()
    send(qtbot, w, "second")
    qtbot.waitUntil(lambda: asking(w), timeout=TURN_MS)  # asks again
    qtbot.mouseClick(tool_widget(w).buttons["allow_once"], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
    assert w.chat_model.items()[-1].content == "The sum is 5"
    assert load_config().server("t").always_allow == set()


def test_tool_limits_come_from_settings_json_and_are_edited_on_the_mcp_page(qtbot, hearth_home: Path) -> None:
    from app import paths
    from app.settings import ToolSettings, load_user_settings
    paths.settings_file().write_text(json.dumps({"tools": {"max_steps": 3, "call_timeout_s": 1,
                                                           "start_timeout_s": 9999}}), encoding="utf-8")
    write_mcp(hearth_home, {"t": server("tool_server.py")})
    w = open_window(qtbot, calls_then_answers("t__slow", {"seconds": 30}, "Sorry:"))
    try:
        tools = w.ctx.tools
        assert (tools.max_steps, tools.call_timeout_s, tools.start_timeout_s) == (3, 1.0, 30.0)  # 9999: default
        wait_ready(qtbot, w, "t")
        assert tools.toolbox().max_steps == 3 and tools.toolbox().call_timeout_s == 1.0
        send(qtbot, w, "slow please")  # the call timeout from settings.json is the one used
        qtbot.waitUntil(lambda: asking(w), timeout=TURN_MS)
        qtbot.mouseClick(tool_widget(w).buttons["allow_once"], Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not w.ctx.chat.busy, timeout=TURN_MS)
        assert "no answer within 1 s" in tool_widget(w).notice.text()
        w.show_page("tools")
        dlg = w.tools_page
        spins = dlg.mcp.limits
        assert {k: s.value() for k, s in spins.items()} == {"max_steps": 3, "call_timeout_s": 1,
                                                             "start_timeout_s": 30}
        assert (spins["max_steps"].maximum(), spins["call_timeout_s"].maximum(),
                spins["start_timeout_s"].maximum()) == (20, 600, 300)
        spins["max_steps"].setValue(99)  # clamped by the spin box
        spins["call_timeout_s"].setValue(120)
        spins["start_timeout_s"].setValue(45)
        assert dlg.save() and dlg.new_mcp is None  # mcp.json unchanged; the limits are saved
        assert load_user_settings().tools == ToolSettings(max_steps=20, call_timeout_s=120, start_timeout_s=45)
        assert (tools.max_steps, tools.call_timeout_s, tools.start_timeout_s) == (20, 120.0, 45.0)
        assert tools.toolbox().max_steps == 20 and tools.toolbox().call_timeout_s == 120.0
    finally:
        close_window(w)



def test_ask_every_time_keeps_the_other_tools_and_keys(qtbot) -> None:
    from types import SimpleNamespace

    from app.mcp.config import parse_config
    from app.ui.mcp_page import McpPage

    cfg = parse_config({"mcpServers": {"s": {"command": "x", "alwaysAllow": ["a", "b"], "autoApprove": ["a"]}}})
    st = SimpleNamespace(name="s", state="ready", disabled=False, error=None,
                         tools=[SimpleNamespace(name=n, description="") for n in ("a", "b", "c")])
    page = McpPage(cfg, {"s": st})
    qtbot.addWidget(page)
    page.ask_every_time(page.tools.item(2))  # "c" is not always allowed: nothing to take back
    page.ask_every_time(page.tools.item(0))
    assert [page.tools.item(i).text() for i in range(3)] == ["a", "b (always allowed)", "c"]
    out = page.result_config().server("s")
    assert out.always_allow == {"b"} and dict(out.extra) == {"autoApprove": ["a"]}  # another client's key kept
