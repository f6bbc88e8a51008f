"""MCP tools in ``hearth chat`` (issue 26): the mcp.json servers, the window's permission rules, asked in the
terminal.

Pure: ``TerminalPermission`` (y / n / a, re-asking on anything else, end of input and no terminal refuse,
``--yes-tools`` allows). Fake model, real MCP server (``tests/mcp_servers/tool_server.py`` as ``t``): the whole
command, with the engine swapped for the fake one (scripted to call ``t__add``), for ``--message`` (refused
without ``--yes-tools``), an interactive session on a pretend terminal ("always" saved to mcp.json, then not
asked again), ``alwaysAllow`` and ``disabledTools``, ``--no-mcp``, a malformed mcp.json and a server that does
not start. Real: the bundled model forced by ``--tool-choice required``, in a ``hearth chat`` process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.assistant import Permission, ToolCallRequested
from app.cli import main
from app.cli._mcp_terminal import TerminalPermission
from app.mcp import load_config
from app.protocol.tools import ToolCall
from app.protocol.types import GenerateRequest
from tests.fakes import FakeEngine

SERVERS = Path(__file__).parent / "mcp_servers"
REPO = Path(__file__).resolve().parent.parent


def request(server: str = "t", tool: str = "add", **args) -> ToolCallRequested:
    call = ToolCall("call_1", f"{server}__{tool}", json.dumps(args))
    return ToolCallRequested(call, server, tool, args, True, 1)


def lines(*answers: str):
    it = iter(answers)
    return lambda: next(it, "")


# -- the question --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("typed,expected", [
    (["y\n"], Permission.ONCE), (["yes\n"], Permission.ONCE), (["n\n"], Permission.DENY),
    (["A\n"], Permission.ALWAYS), (["always\n"], Permission.ALWAYS), (["maybe\n", "\n", "y\n"], Permission.ONCE),
    ([], Permission.DENY),  # end of input: nobody answers
])
def test_the_question_shows_server_tool_and_arguments_and_reads_the_answer(typed, expected) -> None:
    out = io.StringIO()
    ask = TerminalPermission(True, read=lines(*typed), out=out)
    assert ask(request(a=2, b=3)) is expected
    text = out.getvalue()
    assert "'add' of MCP server 't'" in text and '{"a": 2, "b": 3}' in text
    assert text.count("allow? [y]es once / [n]o / [a]lways") == max(1, len(typed))


def test_without_a_terminal_a_call_is_refused_unless_yes_tools() -> None:
    out = io.StringIO()
    never = lambda: pytest.fail("asked without a terminal")  # noqa: E731
    assert TerminalPermission(False, read=never, out=out)(request()) is Permission.NOBODY  # not asked: not "denied"
    assert "refused" in out.getvalue() and "--yes-tools" in out.getvalue()
    assert TerminalPermission(False, yes=True, read=never, out=out)(request()) is Permission.ONCE
    assert TerminalPermission(True, yes=True, read=never, out=out)(request()) is Permission.ONCE


# -- the command, fake model ---------------------------------------------------------------------------------
def write_mcp(home: Path, **entry) -> None:
    servers = {"t": {"command": sys.executable, "args": [str(SERVERS / "tool_server.py")], **entry}}
    (home / "mcp.json").write_text(json.dumps({"mcpServers": servers}))


def scripted(call: str):
    """Per turn: the model calls ``call`` first, then answers ``Done.`` and the last tool result."""

    def reply(req: GenerateRequest) -> str:
        start = max(i for i, m in enumerate(req.messages) if m.role == "user")
        if req.tools and req.choice.mode != "none" and not any(m.tool_calls for m in req.messages[start:]):
            return call
        last = req.messages[-1]
        return f"Done. {last.content}" if last.role == "tool" else "Done."

    return reply


ADD = 'Tool call: {"name": "t__add", "arguments": {"a": 2, "b": 3}}'


@pytest.fixture
def fake(monkeypatch):
    """The chat's engine is a fake one scripted to call ``t__add``; ``fake.seen`` holds its requests."""
    eng = FakeEngine(n_ctx=4096, reply=scripted(ADD))

    @contextlib.contextmanager
    def make_engine(_args):
        yield eng

    monkeypatch.setattr("app.cli.chat.make_engine", make_engine)
    yield eng
    eng.close()


class Tty(io.StringIO):
    """stdin as a terminal would be, with the lines a person types."""

    def isatty(self) -> bool:
        return True


def chat(*args: str) -> int:
    return main(["chat", "--max-tokens", "256", *args])


def test_message_without_a_terminal_refuses_the_call_and_the_model_is_told(fake, hearth_home, capsys) -> None:
    write_mcp(hearth_home)
    assert chat("--message", "What is 2 + 3?") == 0
    out, err = capsys.readouterr()
    assert "was not allowed" in out and "nobody was there" in out and "refused: nobody to ask" in err
    # nobody was asked: not "You denied" (before: "(You denied the call of 'add'.)")
    assert "You denied" not in err and "(Not run: nobody was there to allow 'add'.)" in err
    assert {t.name for t in fake.seen[0].tools} >= {"t__add", "t__echo"}


def test_yes_tools_runs_the_call(fake, hearth_home, capsys) -> None:
    write_mcp(hearth_home)
    assert chat("--message", "What is 2 + 3?", "--yes-tools") == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Done. 5"
    assert "allowed by --yes-tools" in err and "[ok · 1 bytes" in err


def test_always_allowed_runs_without_asking_and_disabled_tools_are_not_offered(fake, hearth_home, capsys) -> None:
    write_mcp(hearth_home, alwaysAllow=["add"], disabledTools=["echo"])
    assert chat("--message", "What is 2 + 3?", "--json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["text"] == "Done. 5"
    assert "[tool t › add" in err and "running" in err
    names = {t.name for t in fake.seen[0].tools}
    assert "t__add" in names and "t__echo" not in names


def test_interactive_always_is_saved_to_mcp_json_and_not_asked_again(fake, hearth_home, capsys,
                                                                     monkeypatch) -> None:
    write_mcp(hearth_home)
    monkeypatch.setattr(sys, "stdin", Tty("What is 2 + 3?\na\nAnd again?\n/quit\n"))
    assert chat() == 0
    out, err = capsys.readouterr()
    assert out.count("Done. 5") == 2
    assert err.count("allow? [y]es once") == 1  # the second turn's call ran without asking
    assert load_config(hearth_home / "mcp.json").server("t").always_allow == {"add"}


def test_interactive_always_is_not_asked_again_in_the_same_turn(fake, hearth_home, capsys, monkeypatch) -> None:
    def twice(req: GenerateRequest) -> str:
        start = max(i for i, m in enumerate(req.messages) if m.role == "user")
        if req.tools and sum(1 for m in req.messages[start:] if m.tool_calls) < 2:
            return ADD
        return f"Done. {req.messages[-1].content}"

    fake.runtime.reply = twice
    write_mcp(hearth_home)
    monkeypatch.setattr(sys, "stdin", Tty("What is 2 + 3?\na\n/quit\n"))
    assert chat() == 0
    out, err = capsys.readouterr()
    assert "Done. 5" in out
    assert err.count("allow? [y]es once") == 1 and err.count("[ok · 1 bytes") == 2  # the 2nd call: not asked


def forced_only(req: GenerateRequest) -> str:
    """The bundled base model's way: a call whenever tool_choice forces one, else an answer."""
    if req.tools and req.choice.forces_call:
        return ADD
    last = req.messages[-1]
    return f"Done. {last.content}" if last.role == "tool" else "Done."


def test_tool_choice_required_forces_the_first_call_then_the_model_answers(fake, hearth_home, capsys) -> None:
    # Before: every step but the last was forced (5 calls), and the last step's answer copied the calls.
    fake.runtime.reply = forced_only
    write_mcp(hearth_home)
    assert chat("--message", "What is 2 + 3?", "--tool-choice", "required", "--yes-tools") == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Done. 5" and err.count("allowed by --yes-tools") == 1
    assert [r.choice.mode for r in fake.seen] == ["required", "none"]


def test_tool_choice_with_no_mcp_is_refused_in_one_line(fake, hearth_home, capsys) -> None:
    write_mcp(hearth_home)
    assert chat("--message", "hi", "--no-mcp", "--tool-choice", "required") == 1
    err = capsys.readouterr().err.strip()
    assert err == "hearth: error: --tool-choice needs MCP tools; drop --no-mcp"
    assert not fake.seen


def test_no_mcp_offers_no_tools(fake, hearth_home, capsys) -> None:
    write_mcp(hearth_home)
    assert chat("--message", "hi", "--no-mcp") == 0
    assert capsys.readouterr().out.strip() == "Done."
    assert not fake.seen[0].tools


def test_a_malformed_mcp_json_is_one_line_and_the_chat_goes_on(fake, hearth_home, capsys) -> None:
    (hearth_home / "mcp.json").write_text('{"mcpServers": {"t": {"command": ')
    assert chat("--message", "hi") == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Done." and not fake.seen[0].tools
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        next(ln for ln in err.splitlines() if ln.startswith("hearth: mcp.json not used:"))]
    assert "Traceback" not in err


def test_a_server_that_does_not_start_is_one_line_and_the_others_run(fake, hearth_home, capsys) -> None:
    servers = {"gone": {"command": sys.executable, "args": [str(SERVERS / "exit_at_start.py")]},
               "t": {"command": sys.executable, "args": [str(SERVERS / "tool_server.py")]}}
    (hearth_home / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    assert chat("--message", "What is 2 + 3?", "--yes-tools") == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Done. 5"
    assert len([ln for ln in err.splitlines() if "did not start" in ln]) == 1
    assert "hearth: MCP server 'gone' did not start:" in err


# -- the real model ------------------------------------------------------------------------------------------
@pytest.mark.model
def test_hearth_chat_with_the_bundled_model_forced_runs_the_tool(tmp_path: Path, bundled_model: Path) -> None:
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / bundled_model.name).symlink_to(bundled_model)
    (home / "settings.json").write_text(json.dumps({"tools": {"max_steps": 2}}))
    write_mcp(home, alwaysAllow=["add", "echo", "big", "slow", "fail", "header", "grow"], disabledTools=["crash"])
    p = subprocess.run([sys.executable, "-m", "app.cli", "chat", "--message", "Add 2 and 3 with the add tool.",
                        "--tool-choice", "required", "--temperature", "0", "--max-tokens", "48", "--n-ctx", "2048",
                        "--json"], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, "HEARTH_HOME": str(home)})
    assert p.returncode == 0, p.stderr
    assert "[tool t › " in p.stderr and "running]" in p.stderr
    assert "[ok · " in p.stderr or "[error · " in p.stderr  # the tool ran (a wrong argument is the tool's error)
    assert "Traceback" not in p.stderr
    assert isinstance(json.loads(p.stdout)["text"], str)


@pytest.mark.model
def test_hearth_chat_required_calls_once_then_answers_from_the_result(tmp_path: Path, bundled_model: Path) -> None:
    # Before: with the default step limit the model called the tool on every step but the last (5 times), and
    # the last step's answer was the call pattern as text (" Tool call: {...}").
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / bundled_model.name).symlink_to(bundled_model)
    write_mcp(home, alwaysAllow=["add"], disabledTools=["echo", "crash", "slow", "grow", "big", "fail", "header"])
    p = subprocess.run([sys.executable, "-m", "app.cli", "chat", "--message", "Add 2 and 3 with the add tool.",
                        "--tool-choice", "required", "--temperature", "0", "--max-tokens", "48", "--n-ctx", "2048",
                        "--json"], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, "HEARTH_HOME": str(home)})
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("[tool t › ") == 1, p.stderr
    text = json.loads(p.stdout)["text"]
    assert "Tool call" not in text and text.strip(), text
