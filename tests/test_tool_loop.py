"""The tool loop (``app.assistant.ToolBox`` in ``Assistant.turn``) against real MCP servers from
``tests/mcp_servers/`` (stdio): permission asked with name and arguments, the call made, the result stored and
fed back, deny, always (saved in mcp.json), a call past its timeout, a server that exits at start, a server
that crashes mid-call, a 1 MB result (cut in the prompt with a note, stored whole), the step limit, Stop while
the person is being asked.

The wiring tests script the model with the fake engine (``tests/fakes.py``): what they claim is about the
loop, not about a model. The one claim about a model (the bundled model, forced by the grammar of
``tool_choice`` "required", writes a valid call the loop runs) is the last test, on the real model.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from app.assistant import (
    Assistant,
    Permission,
    TextDelta,
    ToolBox,
    ToolCallRequested,
    ToolNotice,
    ToolResultShown,
    TurnDone,
)
from app.errors import Cancelled
from app.mcp import McpHub, load_config, parse_config, save_config
from app.protocol.tools import ToolChoice
from app.protocol.types import DecodingParams, GenerateRequest
from tests.fakes import FakeEngine

SERVERS = Path(__file__).parent / "mcp_servers"
MB = 1024 * 1024


def server_entry(script: str, *args: str) -> dict:
    return {"command": sys.executable, "args": [str(SERVERS / script), *args]}


@pytest.fixture
def hub(hearth_home: Path):
    """A hub running the stdio test server as ``t`` (tools ``t__add``, ``t__echo``, ``t__big``, ...), its
    config saved as the data folder's mcp.json."""
    cfg = parse_config({"mcpServers": {"t": server_entry("tool_server.py")}})
    save_config(None, cfg)
    with McpHub(cfg) as h:
        assert h.start(timeout_s=30)["t"].state == "ready"
        yield h


def call_text(name: str, **args) -> str:
    """A call as the fake engine's model writes it (the json format: the fake template's family)."""
    return "Tool call: " + json.dumps({"name": name, "arguments": args})


def scripted(*calls: str, final: str = "Done."):
    """A model that writes ``calls[i]`` on step i (while tools are offered and may be called), then answers
    ``final`` followed by the last tool result it was given."""

    def reply(req: GenerateRequest) -> str:
        start = max(i for i, m in enumerate(req.messages) if m.role == "user")
        steps = sum(1 for m in req.messages[start:] if m.tool_calls)  # this turn's calls so far
        choice = req.choice
        if req.tools and choice.mode != "none" and steps < len(calls):
            return calls[steps]
        last = req.messages[-1]
        return f"{final} {last.content}" if last.role == "tool" else final

    return reply


class Asker:
    """A permission callback that records each request and answers from a list (the last answer repeats)."""

    def __init__(self, *answers: Permission) -> None:
        self.answers, self.asked = list(answers) or [Permission.ONCE], []

    def __call__(self, req: ToolCallRequested) -> Permission:
        self.asked.append(req)
        return self.answers[min(len(self.asked), len(self.answers)) - 1]


def run(engine, store, box, text: str = "What is 2 + 3?", cid: str | None = None):
    a = Assistant(engine, store, decoding=DecodingParams.make(max_tokens=64), tools=box)
    cid = cid or a.new_conversation()
    return cid, list(a.turn(cid, text))


def test_a_call_is_asked_for_made_stored_and_fed_back(hub, memory_store) -> None:
    asker = Asker(Permission.ONCE)
    with FakeEngine(reply=scripted(call_text("t__add", a=2, b=3), final="The sum is")) as eng:
        cid, events = run(eng, memory_store, ToolBox(hub, asker))
        seen = list(eng.seen)
    kinds = [type(e).__name__ for e in events if not isinstance(e, TextDelta)]
    assert kinds == ["ToolCallRequested", "ToolResultShown", "TurnDone"]
    req, shown, done = (e for e in events if not isinstance(e, TextDelta))
    assert (req.server, req.tool, req.arguments, req.needs_permission) == ("t", "add", {"a": 2, "b": 3}, True)
    assert [(r.call.name, r.arguments) for r in asker.asked] == [("t__add", {"a": 2, "b": 3})]
    assert (shown.text, shown.outcome, shown.notice, shown.prompt_note) == ("5", "ok", None, None)
    assert done.result.text == "The sum is 5" and done.result.tool_calls == ()
    # the model was offered the tool, then given its own call and the result
    assert [t.name for t in seen[0].tools][:2] == ["t__add", "t__echo"]
    second = seen[1].messages
    assert [m.role for m in second[-3:]] == ["user", "assistant", "tool"]
    assert second[-2].tool_calls[0].name == "t__add" and json.loads(second[-2].tool_calls[0].arguments) == \
        {"a": 2, "b": 3}
    assert (second[-1].content, second[-1].tool_call_id) == ("5", second[-2].tool_calls[0].id)
    # stored as original records on one branch: user → call → result → answer
    path = memory_store.path_to(done.result.message_id)
    assert [m.role for m in path] == ["user", "assistant", "tool", "assistant"]
    call_msg, result_msg = path[1], path[2]
    assert call_msg.tool_calls == second[-2].tool_calls and call_msg.content == ""
    assert (result_msg.content, result_msg.tool_call_id, result_msg.name) == ("5", call_msg.tool_calls[0].id,
                                                                             "t__add")
    assert result_msg.meta["outcome"] == "ok" and result_msg.meta["server"] == "t"
    assert done.result.user_message_id == path[0].id and memory_store.get_conversation(cid).current_message_id \
        == path[-1].id


def test_the_next_turn_sees_the_earlier_calls_as_history(hub, memory_store) -> None:
    with FakeEngine(reply=scripted(call_text("t__echo", text="pelican"), final="Said")) as eng:
        box = ToolBox(hub, Asker())
        cid, _ = run(eng, memory_store, box)
        eng.runtime.reply = lambda req: "plain answer"
        _, events = run(eng, memory_store, box, "And now?", cid)
        last = eng.seen[-1].messages
    assert events[-1].result.text == "plain answer"
    roles = [m.role for m in last]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    assert last[2].content == "pelican" and last[1].tool_calls[0].id == last[2].tool_call_id


def test_deny_becomes_a_result_the_model_reads(hub, memory_store) -> None:
    with FakeEngine(reply=scripted(call_text("t__echo", text="secret"), final="Answer:")) as eng:
        _, events = run(eng, memory_store, ToolBox(hub, Asker(Permission.DENY)))
    shown = next(e for e in events if isinstance(e, ToolResultShown))
    assert shown.outcome == "denied" and shown.is_error and "did not allow" in shown.text
    assert shown.notice == "You denied the call of 'echo'."
    done = events[-1]
    assert isinstance(done, TurnDone) and "did not allow" in done.result.text  # the model read it
    assert "secret" not in done.result.text
    assert memory_store.get_message(shown.message_id).meta["outcome"] == "denied"


def test_always_is_saved_in_mcp_json_and_not_asked_again(hub, memory_store) -> None:
    asker = Asker(Permission.ALWAYS)
    with FakeEngine(reply=scripted(call_text("t__add", a=1, b=1), final="=")) as eng:
        box = ToolBox(hub, asker)
        cid, first = run(eng, memory_store, box)
        _, second = run(eng, memory_store, box, "Again?", cid)
    assert len(asker.asked) == 1
    assert load_config().server("t").always_allow == {"add"}
    req = next(e for e in second if isinstance(e, ToolCallRequested))
    assert not req.needs_permission
    assert next(e for e in second if isinstance(e, ToolResultShown)).text == "2"


def test_a_call_past_its_timeout_is_a_failed_result_and_the_chat_goes_on(hub, memory_store) -> None:
    with FakeEngine(reply=scripted(call_text("t__slow", seconds=20), final="Sorry:")) as eng:
        cid, events = run(eng, memory_store, ToolBox(hub, Asker(), call_timeout_s=1))
        shown = next(e for e in events if isinstance(e, ToolResultShown))
        assert shown.outcome == "failed" and "no answer within 1 s" in shown.text
        assert shown.notice.startswith("The tool call failed: MCP server 't', tool 'slow'")
        assert events[-1].result.text.startswith("Sorry: Error: the tool could not be called")  # the model read it
        eng.runtime.reply = scripted(call_text("t__add", a=4, b=4), final="Now")
        _, again = run(eng, memory_store, ToolBox(hub, Asker()), "Try add", cid)
    assert again[-1].result.text == "Now 8"  # the server still answers


def test_a_server_that_exits_at_start_leaves_the_others_and_the_chat(memory_store) -> None:
    cfg = parse_config({"mcpServers": {"dead": server_entry("exit_at_start.py"),
                                       "t": server_entry("tool_server.py")}})
    with McpHub(cfg) as hub:
        status = hub.start(timeout_s=20)
        assert status["dead"].state == "failed" and "exited" in status["dead"].error
        with FakeEngine(reply=scripted(call_text("t__add", a=1, b=2), final="Got")) as eng:
            _, events = run(eng, memory_store, ToolBox(hub, Asker()))
            assert [t.name for t in eng.seen[0].tools if t.name.startswith("dead")] == []
    assert events[-1].result.text == "Got 3"


def test_a_crash_mid_call_is_reported_and_the_next_call_is_unavailable(memory_store) -> None:
    cfg = parse_config({"mcpServers": {"t": server_entry("tool_server.py")}})
    with McpHub(cfg) as hub:
        hub.start(timeout_s=30)
        with FakeEngine(reply=scripted(call_text("t__crash"), call_text("t__add", a=1, b=1),
                                       final="Final")) as eng:
            _, events = run(eng, memory_store, ToolBox(hub, Asker()))
    shown = [e for e in events if isinstance(e, ToolResultShown)]
    assert [s.outcome for s in shown] == ["failed", "failed"]
    assert "closed the connection" in shown[0].text or "crash" in shown[0].text.lower()
    # the crashed server is not called again (it is marked failed, or found gone, depending on who is first)
    assert "the server is failed" in shown[1].notice or "went away" in shown[1].notice
    assert isinstance(events[-1], TurnDone) and events[-1].result.text.startswith("Final")


def test_a_1_mb_result_is_cut_in_the_prompt_with_a_note_and_stored_whole(hub, memory_store) -> None:
    with FakeEngine(n_ctx=4096, reply=scripted(call_text("t__big", n_bytes=MB), final="Seen")) as eng:
        cid, events = run(eng, memory_store, ToolBox(hub, Asker()))
        prompt = eng.seen[1].messages[-1]
        data = json.loads(memory_store.export_conversation(cid))
    shown = next(e for e in events if isinstance(e, ToolResultShown))
    assert shown.size_bytes == MB and len(shown.text) == MB
    assert shown.prompt_note.startswith("[result cut: 1,048,576 bytes, first ")
    assert prompt.role == "tool" and prompt.content.endswith(shown.prompt_note)
    shown_bytes = int(shown.prompt_note.split("first ")[1].split(" ")[0].replace(",", ""))
    assert prompt.content.startswith("x" * shown_bytes) and 100 < shown_bytes < 4096
    assert len(memory_store.get_message(shown.message_id).content) == MB  # the store keeps it whole
    assert [len(m["content"]) for m in data["messages"] if m["role"] == "tool"] == [MB]  # and exports it whole
    assert events[-1].result.context["tools"] < 4096 // 3


def test_the_loop_is_bounded_and_the_last_step_may_not_call(hub, memory_store) -> None:
    forever = [call_text("t__add", a=i, b=i) for i in range(10)]
    with FakeEngine(reply=scripted(*forever, final="Enough")) as eng:
        _, events = run(eng, memory_store, ToolBox(hub, Asker(), max_steps=3))
        choices = [r.choice.mode for r in eng.seen]
    assert choices == ["auto", "auto", "none"]
    assert len([e for e in events if isinstance(e, ToolResultShown)]) == 2
    assert events[-1].result.text == "Enough 2"


def test_an_invalid_call_is_kept_as_text_with_a_notice(hub, memory_store) -> None:
    with FakeEngine(reply=scripted(call_text("t__add", a="two", b=3))) as eng:
        _, events = run(eng, memory_store, ToolBox(hub, Asker()))
    notice = next(e for e in events if isinstance(e, ToolNotice))
    assert "not valid" in notice.text and "arguments" in notice.text
    assert isinstance(events[-1], TurnDone) and events[-1].result.text.startswith("Tool call:")


def test_stop_while_asking_ends_the_turn_and_the_chat_goes_on(hub, memory_store) -> None:
    asking, release = threading.Event(), threading.Event()

    def blocking(req: ToolCallRequested) -> Permission:
        asking.set()
        release.wait(10)
        return Permission.DENY

    with FakeEngine(reply=scripted(call_text("t__echo", text="x"), final="ok")) as eng:
        a = Assistant(eng, memory_store, tools=ToolBox(hub, blocking))
        cid = a.new_conversation()
        out: list = []

        def turn() -> None:
            try:
                out.extend(a.turn(cid, "hello"))
            except Cancelled as exc:
                out.append(exc)

        t = threading.Thread(target=turn)
        t.start()
        assert asking.wait(10)
        a.cancel()
        release.set()  # what an adapter does on Stop: end its wait
        t.join(10)
        assert isinstance(out[-1], Cancelled)
        eng.runtime.reply = lambda req: "fine"
        _, events = run(eng, memory_store, ToolBox(hub, Asker()), "still there?", cid)
        last = eng.seen[-1].messages
    assert events[-1].result.text == "fine"
    assert all(not m.tool_calls and m.role != "tool" for m in last)  # the unanswered call is left out


def test_a_forced_choice_asks_for_one_call_per_step(hub) -> None:
    box = ToolBox(hub, max_steps=2, tool_choice=ToolChoice("required"))
    specs = box.specs()
    first, last = box.options(specs, 1), box.options(specs, 2)
    assert (first["tool_choice"].mode, first["parallel_tool_calls"]) == ("required", False)
    assert (last["tool_choice"].mode, last["parallel_tool_calls"]) == ("none", True)
    assert ToolBox(hub).options(specs, 1) == {"tools": specs, "tool_choice": None, "parallel_tool_calls": True}
    assert box.options((), 1) == {}


def forced_only(call: str, final: str = "Done."):
    """A model like the bundled base one: it calls only when ``tool_choice`` forces it (every time it does),
    else answers ``final`` and the last tool result."""

    def reply(req: GenerateRequest) -> str:
        if req.tools and req.choice.forces_call:
            return call
        last = req.messages[-1]
        return f"{final} {last.content}" if last.role == "tool" else final

    return reply


def test_a_forced_choice_is_forced_until_the_first_results_then_the_model_answers(hub, memory_store) -> None:
    # Before: every step but the last was forced; the model called 5 times and the last step copied the calls.
    box = ToolBox(hub, Asker(), tool_choice=ToolChoice("required"))
    with FakeEngine(reply=forced_only(call_text("t__add", a=2, b=3))) as eng:
        _, events = run(eng, memory_store, box)
        choices = [r.choice.mode for r in eng.seen]
        _, again = run(eng, memory_store, box, "And again?")  # a new turn is forced again
        choices_again = [r.choice.mode for r in eng.seen[len(choices):]]
    assert choices == ["required", "none"] and choices_again == ["required", "none"]
    assert len([e for e in events if isinstance(e, ToolResultShown)]) == 1
    assert events[-1].result.text == "Done. 5" and again[-1].result.text == "Done. 5"


def test_a_refused_call_is_not_forced_again(hub, memory_store) -> None:
    asker = Asker(Permission.DENY)
    box = ToolBox(hub, asker, tool_choice=ToolChoice("function", "t__echo"))
    with FakeEngine(reply=forced_only(call_text("t__echo", text="x"), final="Without it:")) as eng:
        _, events = run(eng, memory_store, box)
        choices = [r.choice.mode for r in eng.seen]
    assert choices == ["function", "none"] and len(asker.asked) == 1
    assert events[-1].result.text.startswith("Without it: The person did not allow")


def test_step_choice_forces_until_results_then_auto_beside_other_tools_else_none() -> None:
    from app.assistant.tool_loop import step_choice

    req, fn = ToolChoice("required"), ToolChoice("function", "t__add")
    assert step_choice(req, 1, 6, results_in=False, other_tools=False) == req
    assert step_choice(fn, 2, 6, results_in=False, other_tools=True) == fn
    assert step_choice(req, 2, 6, results_in=True, other_tools=False) == ToolChoice("none")
    assert step_choice(fn, 2, 6, results_in=True, other_tools=True) == ToolChoice("auto")
    assert step_choice(None, 2, 6, results_in=True, other_tools=False) is None
    assert step_choice(ToolChoice("auto"), 6, 6, results_in=False, other_tools=True) == ToolChoice("none")


def test_always_counts_from_the_next_call_of_the_same_turn(hub, memory_store) -> None:
    # Before: the turn's tools kept the old alwaysAllow, so the second call of the turn was asked again.
    asker = Asker(Permission.ALWAYS)
    with FakeEngine(reply=scripted(call_text("t__add", a=1, b=1), call_text("t__add", a=2, b=2),
                                   final="=")) as eng:
        _, events = run(eng, memory_store, ToolBox(hub, asker))
    asked = [e for e in events if isinstance(e, ToolCallRequested)]
    assert len(asker.asked) == 1 and [e.needs_permission for e in asked] == [True, False]
    assert [e.text for e in events if isinstance(e, ToolResultShown)] == ["2", "4"]
    assert load_config().server("t").always_allow == {"add"}


def test_nobody_to_ask_is_not_said_to_be_a_denial(hub, memory_store) -> None:
    from app.assistant import deny_all

    with FakeEngine(reply=scripted(call_text("t__echo", text="secret"), final="Answer:")) as eng:
        _, events = run(eng, memory_store, ToolBox(hub, deny_all))
    shown = next(e for e in events if isinstance(e, ToolResultShown))
    assert shown.outcome == "denied" and shown.notice == "Not run: nobody was there to allow 'echo'."
    assert "nobody was there" in shown.text and "The person did not allow" not in shown.text


def test_toolbox_refuses_bad_limits(hub) -> None:
    with pytest.raises(ValueError, match="max_steps"):
        ToolBox(hub, max_steps=0)
    with pytest.raises(ValueError, match="call_timeout_s"):
        ToolBox(hub, call_timeout_s=0)


@pytest.mark.model
def test_the_bundled_model_forced_by_the_grammar_calls_a_tool_the_loop_runs(hub, memory_store,
                                                                           bundled_model: Path) -> None:
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    box = ToolBox(hub, Asker(), max_steps=2, tool_choice=ToolChoice("function", "t__add"))
    with Engine(bundled_model, LoadSettings(n_ctx=2048)) as eng:
        a = Assistant(eng, memory_store, decoding=DecodingParams.make(temperature=0.0, max_tokens=48), tools=box)
        cid = a.new_conversation()
        events = list(a.turn(cid, "Add 2 and 3 with the add tool."))
    req = next(e for e in events if isinstance(e, ToolCallRequested))
    shown = next(e for e in events if isinstance(e, ToolResultShown))
    assert req.tool == "add" and set(req.arguments) == {"a", "b"}
    assert all(isinstance(v, int) for v in req.arguments.values())
    assert shown.outcome == "ok" and shown.text == str(req.arguments["a"] + req.arguments["b"])
    done = events[-1]
    assert isinstance(done, TurnDone) and not done.result.tool_calls
    assert [m.role for m in memory_store.path_to(done.result.message_id)] == ["user", "assistant", "tool",
                                                                               "assistant"]
