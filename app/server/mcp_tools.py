"""``PortTools``: the ``mcp.json`` tools on the port (``hearth serve --mcp-tools``), run server-side for a chat
request that asks with ``"hearth": {"mcp_tools": true}``.

The calls go through ``app.assistant.ToolBox``, the tool loop the window and ``hearth chat`` use, with
``deny_all`` as its permission: nobody is at the port to ask, so only tools in ``alwaysAllow`` run and any
other call is answered to the model as not allowed. A request carries its own history, so each result
becomes a ``tool`` message of the next step's request instead of a stored message (``_Results``). A forced
``tool_choice`` forces the first step's call only (``ToolBox.options``), and a ``response_format`` grammar
decodes every step that is not forced (``_PortBox``), so that the answer after the results is in the format.
Every call is logged (server, tool, argument bytes, outcome, seconds) and counted for /metrics.
docs/tools.md, 'MCP in the terminal and on the port'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, Optional

from app.assistant import ToolBox, ToolCallRequested, ToolResultShown, deny_all
from app.assistant.tool_loop import DEFAULT_CALL_TIMEOUT_S, DEFAULT_MAX_STEPS
from app.engine.chat.tools import check_tool_grammars, parse_tool_choice
from app.errors import InvalidRequest
from app.protocol.tools import ToolCall, ToolSpec
from app.protocol.types import ChatMessage, GenerateRequest

log = logging.getLogger(__name__)

RESULT_CHARS_PER_CTX_TOKEN = 1  # a result keeps at most n_ctx characters (~ a quarter of the context)
_PARAM = "hearth.mcp_tools"


class PortTools:
    """The port's MCP tools: a started ``app.mcp.McpHub`` and the loop's limits (``max_steps`` generations per
    request, ``call_timeout_s`` per call). Thread-safe; one per app."""

    def __init__(self, hub: Any, *, max_steps: int = DEFAULT_MAX_STEPS,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        ToolBox(hub, max_steps=max_steps, call_timeout_s=call_timeout_s)  # ValueError naming a bad limit
        self.hub, self.max_steps, self.call_timeout_s = hub, int(max_steps), float(call_timeout_s)
        self._lock = threading.Lock()
        self.calls: dict[tuple[str, str, str], int] = defaultdict(int)  # (server, tool, outcome) -> calls

    def check(self, plan: Any) -> None:
        """Raise ``InvalidRequest`` (param ``hearth.mcp_tools``) for what the loop does not do: self-consistency.
        (A stream is written once the tools have run: ``Service._replay``.)"""
        if plan.consistency is not None:
            raise InvalidRequest("hearth.mcp_tools cannot be combined with hearth.self_consistency", param=_PARAM)

    def toolbox(self, req: GenerateRequest, raw_choice: Any = None,
                answer_grammar: Optional[str] = None) -> tuple["_PortBox", GenerateRequest]:
        """A ``ToolBox`` for one request's steps and ``req`` with the MCP tools added to the client's own. The
        request's ``tool_choice`` (or ``raw_choice``, the client's when it sent no tools of its own, checked
        here against the MCP tools) applies to the steps before the last, a forcing one until the first results
        are in; ``answer_grammar`` (the ``response_format``'s, default the request's grammar) decodes the steps
        that are not forced. ``InvalidRequest`` when a name is taken twice or the choice does not fit the
        tools."""
        box = _PortBox(self.hub, deny_all, max_steps=self.max_steps, call_timeout_s=self.call_timeout_s)
        box.answer_grammar = answer_grammar if answer_grammar is not None else req.decoding.grammar
        specs = box.specs()
        clash = sorted({t.name for t in req.tools} & {s.name for s in specs})
        if clash:
            raise InvalidRequest(f"tools: {clash[0]!r} is also the name of an MCP tool of the port; rename it or "
                                 "leave out hearth.mcp_tools", param="tools")
        every = tuple(req.tools) + specs
        if raw_choice is not None:
            box.tool_choice = parse_tool_choice(raw_choice, every)
            check_tool_grammars(every, box.tool_choice)
        elif req.tools:  # without tools of the client's, its tool_choice is "none" only for lack of tools
            box.tool_choice = req.tool_choice
        return box, box.step_request(req, every, 1)

    def next_request(self, box: "_PortBox", req: GenerateRequest, text: str, calls: tuple[ToolCall, ...],
                     step: int, n_ctx: int) -> Optional[GenerateRequest]:
        """After step ``step`` answered ``text`` with ``calls``: run them (blocking) and return the request of
        the next step, whose history ends with the calls and their results. None when the answer is final: no
        calls, the step limit, or a call of a tool the client offered (the client runs those)."""
        mine = {s.name for s in box.specs()}
        if not calls or step >= box.max_steps or any(c.name not in mine for c in calls):
            return None
        results = _Results(max(2000, n_ctx * RESULT_CHARS_PER_CTX_TOKEN))
        events = box.run_calls(results, "", calls, "", step)
        self._log(events)
        history = (*req.messages, ChatMessage("assistant", text, tuple(calls)), *results.messages)
        return box.step_request(replace(req, messages=history), req.tools, step + 1)

    def _log(self, events: Any) -> None:
        """Drive ``ToolBox.run_calls``: one log line and one count per call."""
        asked: Optional[ToolCallRequested] = None
        t0 = time.monotonic()
        for ev in events:
            if isinstance(ev, ToolCallRequested):
                asked, t0 = ev, time.monotonic()
            elif isinstance(ev, ToolResultShown) and asked is not None:
                seconds = time.monotonic() - t0
                log.info("MCP tool call on the port: server=%s tool=%s arguments=%d bytes outcome=%s %.3f s",
                         asked.server or "-", asked.tool, len(ev.call.arguments.encode("utf-8")), ev.outcome,
                         seconds)
                with self._lock:
                    self.calls[(asked.server, asked.tool, ev.outcome)] += 1

    def metric_lines(self) -> list[str]:
        """``hearth_mcp_tool_calls_total{server, tool, outcome}`` in the Prometheus text format."""
        with self._lock:
            counts = sorted(self.calls.items())
        out = ["# HELP hearth_mcp_tool_calls_total MCP tool calls run for hearth.mcp_tools requests",
               "# TYPE hearth_mcp_tool_calls_total counter"]
        out += [f'hearth_mcp_tool_calls_total{{server="{_label(s)}",tool="{_label(t)}",outcome="{o}"}} {n}'
                for (s, t, o), n in counts]
        return out

    def close(self) -> None:
        """Stop the servers (at most about 10 s)."""
        self.hub.close()


class _PortBox(ToolBox):
    """The port's ``ToolBox``: also the request's ``response_format`` grammar (``answer_grammar``), which
    decodes each step whose ``tool_choice`` does not force a call (a forced call decodes through the tools'
    grammar, and one request has one grammar: docs/server.md, 'Tools with structured output')."""

    answer_grammar: Optional[str] = None

    def step_request(self, req: GenerateRequest, specs: tuple[ToolSpec, ...], step: int) -> GenerateRequest:
        """``req`` as step ``step`` runs it: the tools, the step's ``tool_choice`` and grammar."""
        opts = self.options(specs, step)
        choice = opts.get("tool_choice")
        grammar = None if choice is not None and choice.forces_call else self.answer_grammar
        return replace(req, decoding=replace(req.decoding, grammar=grammar), **opts).validate()


class BoxStopper:
    """What the disconnect watcher stops when the client leaves during a call: the request's ``ToolBox``."""

    def __init__(self, box: ToolBox) -> None:
        self.box, self.finished = box, False

    def stop(self) -> None:
        """Abandon the running call (it ends on its timeout)."""
        if not self.finished:
            self.box.cancel()


class _Results:
    """``ToolBox.run_calls``'s session for a request that carries its own history: each result becomes a
    ``tool`` message, cut to ``cap`` characters with a note (the whole text is not kept: no store)."""

    def __init__(self, cap: int) -> None:
        self.messages: list[ChatMessage] = []
        self.builder, self.tool_result_cap = self, cap

    def cut_result(self, text: str, cap: int) -> str:
        """``text``, or its first ``cap`` characters and a note with both sizes in bytes."""
        if len(text) <= cap:
            return text
        head = text[:cap]
        return (f"{head}\n[cut: the whole result is {len(text.encode('utf-8'))} bytes; the first "
                f"{len(head.encode('utf-8'))} are shown]")

    def add_tool_result(self, conversation_id: str, parent_id: str, call: ToolCall, text: str, *,
                        meta: Any = None) -> str:
        """Keep the result as the ``tool`` message answering ``call``; its id is the call's."""
        self.messages.append(ChatMessage("tool", self.cut_result(text, self.tool_result_cap), tool_call_id=call.id,
                                         name=call.name))
        return call.id


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def prepare(tools: Optional[PortTools], plan: Any) -> tuple[Any, list[ToolBox]]:
    """``plan`` (which asked for ``hearth.mcp_tools``) with the port's MCP tools added to each request, and
    each request's ``ToolBox``. Raises ``InvalidRequest`` (param ``hearth.mcp_tools``) when the port offers
    none (``tools`` None: started without ``--mcp-tools``) or the plan asks for self-consistency."""
    if tools is None:
        raise InvalidRequest("hearth.mcp_tools: this port offers no MCP tools (they need `hearth serve "
                             "--mcp-tools` and servers in mcp.json)", param=_PARAM)
    tools.check(plan)
    pairs = [tools.toolbox(r, plan.mcp_choice, plan.mcp_format) for r in plan.requests]
    return replace(plan, requests=tuple(r for _, r in pairs)), [b for b, _ in pairs]
