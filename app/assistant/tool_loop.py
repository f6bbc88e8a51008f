"""Tools in a turn: the model calls MCP tools in a bounded loop, one mechanism for every adapter (Qt-free).

``ToolBox`` is what a turn may call: an ``app.mcp.McpHub``, who decides (``permission``) and the limits. With
one, ``Assistant.turn`` runs steps:

The reasoning: docs/tools.md, 'app/assistant/tool_loop.py'.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generator, Union

from app.engine.chat.tools import parse_tools
from app.errors import Cancelled, HearthError
from app.protocol.tools import ToolCall, ToolChoice, ToolSpec

log = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 6  # generations per turn; the last one may not call tools
DEFAULT_CALL_TIMEOUT_S = 60.0


class Permission(str, enum.Enum):
    """The person's answer to one call."""

    ONCE = "once"  # this call only
    ALWAYS = "always"  # this call and every later one of the tool (saved as ``alwaysAllow``)
    DENY = "deny"
    NOBODY = "nobody"  # nobody could be asked (no terminal, ``--message``, the port): not run, as DENY


@dataclass(frozen=True)
class ToolCallRequested:
    """The model asked for a call. ``call``: id, the name the model used (``McpTool.qualified_name``) and the
    arguments as JSON text; ``server`` and ``tool``: where it goes (MCP names); ``arguments``: parsed (None
    when they are not a JSON object); ``needs_permission``: the person is asked next (False for a tool in
    ``alwaysAllow``); ``step``: which generation of the turn made it (1-based)."""

    call: ToolCall
    server: str
    tool: str
    arguments: dict | None
    needs_permission: bool
    step: int


@dataclass(frozen=True)
class ToolResultShown:
    """A call's result as stored (``message_id``) and given to the model. ``outcome``: "ok", "error" (the tool
    ran and reported failure), "denied" (by the person) or "failed" (the call could not run: a ``ToolError``,
    bad arguments); ``text``: the whole result (what the model reads, before any cut); ``notice``: one line
    for the person when it did not go well; ``prompt_note``: the note the prompt shows after a result cut to
    its share of the context (None when it fits)."""

    call: ToolCall
    message_id: str
    text: str
    outcome: str
    size_bytes: int
    elapsed_s: float = 0.0
    notice: str | None = None
    prompt_note: str | None = None

    @property
    def is_error(self) -> bool:
        """Anything but "ok": the model was told the call did not give what it asked for."""
        return self.outcome != "ok"


@dataclass(frozen=True)
class ToolNotice:
    """Something the person should know about the turn's tool use (calls the model wrote that were not
    valid, the step limit)."""

    text: str


ToolEvent = Union[ToolCallRequested, ToolResultShown, ToolNotice]
PermissionFn = Callable[[ToolCallRequested], Permission]


def deny_all(_request: ToolCallRequested) -> Permission:
    """A permission callback for adapters with no one to ask: every call that needs asking is refused
    (``Permission.NOBODY``)."""
    return Permission.NOBODY


def step_choice(forced: ToolChoice | None, step: int, max_steps: int, *, results_in: bool,
                other_tools: bool) -> ToolChoice | None:
    """The ``tool_choice`` of ``step`` (1-based) of a tool loop whose caller asked for ``forced`` (None: "auto"):
    "none" on the last step; a forcing choice ("required", a named function) only until the first results are
    in (``results_in``: a call ran, or was refused, on an earlier step), so that a small model is not made to
    repeat its call until the last step, which then copies the calls as text (the bundled 270M model did). After
    the results the model answers from them: "auto" when tools of someone else's are offered too
    (``other_tools``: the port's client may still want its own called), else "none"."""
    if step >= max_steps:
        return ToolChoice("none")
    if forced is not None and forced.forces_call and results_in:
        return ToolChoice("auto" if other_tools else "none")
    return forced


class ToolBox:
    """The tools one assistant's turns may call. ``hub``: a started ``McpHub`` (its enabled tools of ready
    servers are offered, read at the start of each turn); ``permission``: asked before each call of a tool not
    in ``alwaysAllow`` (runs on the turn's thread and may block); ``max_steps``: generations per turn (1 to
    32); ``call_timeout_s``: seconds one call may take; ``tool_choice``: for the steps before the last (None:
    "auto"; a forcing one only until the first results are in, ``step_choice``); ``config_path``: the mcp.json
    an ALWAYS answer is saved to (None: the data folder's)."""

    def __init__(self, hub: Any, permission: PermissionFn = deny_all, *, max_steps: int = DEFAULT_MAX_STEPS,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, tool_choice: ToolChoice | None = None,
                 config_path: str | Path | None = None) -> None:
        if not 1 <= int(max_steps) <= 32:
            raise ValueError(f"max_steps must be 1 to 32, got {max_steps!r}")
        if not call_timeout_s > 0:
            raise ValueError(f"call_timeout_s must be > 0 seconds, got {call_timeout_s!r}")
        self.hub, self.permission = hub, permission
        self.max_steps, self.call_timeout_s = int(max_steps), float(call_timeout_s)
        self.tool_choice, self.config_path = tool_choice, config_path
        self._tools: dict[str, Any] = {}
        self._always: set[tuple[str, str]] = set()  # (server, tool) answered ALWAYS during this turn
        self._results_in = False  # a call of this turn ran or was refused: a forced choice is not forced again
        self._cancel = threading.Event()

    # ---- per turn -----------------------------------------------------------------------------------------

    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools to offer now: each enabled tool of a ready server whose schema the engine accepts (a tool
        it refuses is left out, with a warning in the log)."""
        specs, self._tools, self._always = [], {}, set()
        for t in self.hub.tools():
            try:
                spec = parse_tools([t.openai_tool()])[0]
            except HearthError as exc:
                log.warning("MCP tool %s of %s is not offered to the model: %s", t.name, t.server, exc)
                continue
            specs.append(spec)
            self._tools[spec.name] = t
        return tuple(specs)

    def options(self, specs: tuple[ToolSpec, ...], step: int) -> dict[str, Any]:
        """Generation options for ``step`` (1-based): the tools, and the step's tool_choice (``step_choice``:
        "none" on the last step, a forced choice only until the first results are in). A forced choice asks
        for one call per step: with several allowed, the grammar lets a small model repeat the call until
        ``max_tokens`` cuts the last one off (and a cut call passes none on)."""
        if not specs:
            return {}
        choice = step_choice(self.tool_choice, step, self.max_steps, results_in=self._results_in,
                             other_tools=any(s.name not in self._tools for s in specs))
        return {"tools": specs, "tool_choice": choice,
                "parallel_tool_calls": not (choice is not None and choice.forces_call)}

    def reset(self) -> None:
        """A new turn: forget a cancel and the results of the previous one."""
        self._cancel.clear()
        self._results_in = False

    def cancel(self) -> None:
        """Stop the turn's tool use (any thread): a running call is abandoned (it ends on its own timeout)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        """Stop was asked for during this turn."""
        return self._cancel.is_set()

    # ---- one step's calls ---------------------------------------------------------------------------------

    def run_calls(self, session: Any, conversation_id: str, calls: tuple[ToolCall, ...], parent_id: str,
                  step: int) -> Generator[ToolEvent, None, str]:
        """Run ``calls`` (made by the stored assistant message ``parent_id``) one after another, storing each
        result (``session.add_tool_result``) under the one before; yields the events and returns the id of the
        last result."""
        tip = parent_id
        for call in calls:
            self._check_cancel()
            text, meta, notice = yield from self._run_one(call, step)
            meta["size_bytes"] = len(text.encode("utf-8"))
            tip = session.add_tool_result(conversation_id, tip, call, text, meta=meta)
            builder = session.builder
            shown = builder.cut_result(text, builder.tool_result_cap)
            note = shown[shown.rfind("\n") + 1:] if shown != text else None
            self._results_in = True
            yield ToolResultShown(call, tip, text, meta["outcome"], meta["size_bytes"], meta.get("elapsed_s", 0.0),
                                  notice, note)
        return tip

    def _run_one(self, call: ToolCall, step: int) -> Generator[ToolEvent, None, tuple[str, dict, str | None]]:
        """(result text for the model, its meta, a notice for the person)."""
        tool = self._tools.get(call.name)
        args = _arguments(call)
        yield ToolCallRequested(call, tool.server if tool else "", tool.name if tool else call.name, args,
                                bool(tool) and not self._always_allowed(tool), step)
        if tool is None:
            why = f"no tool named {call.name!r} is available now"
            return _failed(why), _meta("failed", why), f"The model called {call.name!r}, which is not available."
        if args is None:
            why = "the arguments are not a JSON object"
            return _failed(why), _meta("failed", why, tool), f"The call of {tool.name!r} had unreadable arguments."
        answer = Permission.ONCE if self._always_allowed(tool) else self._ask(tool, call, args, step)
        if answer is Permission.NOBODY:
            return (f"This call of {tool.name!r} was not allowed: it needs a person's permission and nobody was "
                    "there to give it. Do not call it again for this request; answer without it."), \
                _meta("denied", None, tool), f"Not run: nobody was there to allow {tool.name!r}."
        if answer is Permission.DENY:
            return (f"The person did not allow this call of {tool.name!r}. Do not call it again for this request; "
                    "answer without it."), _meta("denied", None, tool), f"You denied the call of {tool.name!r}."
        return self._invoke(tool, call, args)

    def _always_allowed(self, tool: Any) -> bool:
        """In ``alwaysAllow`` when the turn began, or answered ALWAYS since (the turn's tools are not re-read)."""
        return tool.always_allowed or (tool.server, tool.name) in self._always

    def _ask(self, tool: Any, call: ToolCall, args: dict, step: int) -> Permission:
        answer = Permission(self.permission(ToolCallRequested(call, tool.server, tool.name, args, True, step)))
        self._check_cancel()
        if answer is Permission.ALWAYS:
            self._remember_always(tool)
        return answer

    def _invoke(self, tool: Any, call: ToolCall, args: dict) -> tuple[str, dict, str | None]:
        from app.mcp import ToolError

        try:
            r = self._call(tool, args)  # the McpTool asked about: its own (server, tool) pair
        except ToolError as exc:
            log.info("tool call %s failed: %s", call.name, exc)
            return _failed(str(exc)), _meta("failed", str(exc), tool, kind=exc.kind), f"The tool call failed: {exc}"
        meta = _meta("error" if r.is_error else "ok", None, tool, elapsed_s=round(r.elapsed_s, 3))
        return r.text, meta, (f"{tool.name!r} reported an error." if r.is_error else None)

    def _call(self, tool: Any, args: dict) -> Any:
        """``hub.call`` on its own thread, so that Stop does not wait for a slow tool (the call ends on its
        timeout; the hub cancels it on the server)."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["result"] = self.hub.call(tool, args, timeout_s=self.call_timeout_s)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = exc

        t = threading.Thread(target=work, name="hearth-tool-call", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.05)
            self._check_cancel()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _remember_always(self, tool: Any) -> None:
        """Add the tool to its server's ``alwaysAllow`` in mcp.json and in the running hub. A file that cannot
        be written leaves the answer valid for this call only (logged)."""
        from app.mcp import save_config

        cfg = self.hub.config.with_always_allow(tool.server, tool.name)
        try:
            save_config(self.config_path, cfg)
        except (OSError, HearthError) as exc:
            log.warning("cannot save alwaysAllow for %s of %s: %s", tool.name, tool.server, exc)
            return
        self.hub.apply_config(cfg)
        self._always.add((tool.server, tool.name))

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise Cancelled("stopped by the person")


def _arguments(call: ToolCall) -> dict | None:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        return None
    return args if isinstance(args, dict) else None


def _failed(why: str) -> str:
    return f"Error: the tool could not be called: {why}"


def _meta(outcome: str, error: str | None, tool: Any = None, **more: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"outcome": outcome, **more}
    if tool is not None:
        meta.update(server=tool.server, tool=tool.name)
    if error:
        meta["error"] = error
    return meta

