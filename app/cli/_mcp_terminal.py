"""MCP tools in the terminal: the ``mcp.json`` servers started for ``hearth chat`` and ``hearth serve``, and
the person's answer to each call asked in the terminal.

The turn runs the window's tool loop (``app.assistant.ToolBox`` in ``Assistant.turn``); this module only
starts the hub (a malformed file or a server that fails to start is one line on stderr, and the chat goes on
without it), asks (``TerminalPermission``: y / n / a, where "always" is saved to mcp.json by the loop, as the
window's answer is) and shows the calls and results on stderr. docs/tools.md, 'MCP in the terminal and on the
port'.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from typing import Any, Callable, Optional, TextIO

from app.assistant import Permission, ToolBox, ToolCallRequested, ToolNotice, ToolResultShown
from app.errors import HearthError

_ARGS_SHOWN = 400  # characters of a call's arguments shown in the question
_ANSWERS = {"y": Permission.ONCE, "yes": Permission.ONCE, "n": Permission.DENY, "no": Permission.DENY,
            "a": Permission.ALWAYS, "always": Permission.ALWAYS}


def start_hub(start_timeout_s: float, config_path: Any = None, err: Optional[TextIO] = None) -> Any:
    """A started ``McpHub`` over ``mcp.json`` (``config_path``; None: the data folder's), or None when the file
    lists no server or cannot be read (said in one line on ``err``, default stderr). Each server that fails to
    start is one line on ``err``; the hub runs the others."""
    from app.mcp import McpHub, load_config

    err = err or sys.stderr
    try:
        cfg = load_config(config_path)
    except (HearthError, OSError) as exc:
        print(f"hearth: mcp.json not used: {_one_line(str(exc))}", file=err)
        return None
    if not any(not s.disabled for s in cfg.servers):
        return None
    hub = McpHub(cfg)
    with _said_here("app.mcp.client"):
        started = hub.start(timeout_s=start_timeout_s)
    for name, st in started.items():
        if st.state == "failed":
            print(f"hearth: MCP server {name!r} did not start: {_one_line(st.error or 'unknown reason')}", file=err)
    return hub


@contextlib.contextmanager
def _said_here(name: str):
    """Logger ``name`` quiet below ERROR meanwhile (unless ``--verbose``): the hub's own warning for a server that
    fails to start would repeat the one line printed here."""
    logger = logging.getLogger(name)
    if logger.getEffectiveLevel() < logging.WARNING:
        yield
        return
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def toolbox(hub: Any, permission: Callable[[ToolCallRequested], Permission], settings: Any,
            tool_choice: Any = None, config_path: Any = None) -> Optional[ToolBox]:
    """The ``ToolBox`` of a terminal chat (None without a hub); ``settings``: ``app.settings.ToolSettings``."""
    if hub is None:
        return None
    return ToolBox(hub, permission, max_steps=settings.max_steps, call_timeout_s=settings.call_timeout_s,
                   tool_choice=tool_choice, config_path=config_path)


class TerminalPermission:
    """The ``ToolBox`` permission callback of ``hearth chat``. ``interactive``: a person can answer (a TTY,
    without ``--message``); otherwise each call that needs asking is refused as asked of nobody
    (``Permission.NOBODY``), unless ``yes`` (``--yes-tools``) allows it. ``read``: reads one answer line ("" at
    end of input); ``out``: where the question goes."""

    def __init__(self, interactive: bool, yes: bool = False, read: Optional[Callable[[], str]] = None,
                 out: Optional[TextIO] = None) -> None:
        self.interactive, self.yes = interactive, yes
        self.read = read or sys.stdin.readline
        self.out = out

    def __call__(self, req: ToolCallRequested) -> Permission:
        """Ask about ``req`` (server, tool, arguments) and return the answer."""
        out = self.out or sys.stderr
        if self.yes:
            print(f"  [tool {req.server} › {req.tool}: allowed by --yes-tools]", file=out)
            return Permission.ONCE
        if not self.interactive:
            print(f"  [tool {req.server} › {req.tool}: refused: nobody to ask (no terminal, or --message); "
                  "--yes-tools allows calls, alwaysAllow in mcp.json allows a tool]", file=out)
            return Permission.NOBODY
        print(f"\n  The model wants to call {req.tool!r} of MCP server {req.server!r} with:\n    "
              f"{_shown_args(req)}", file=out)
        while True:
            out.write("  allow? [y]es once / [n]o / [a]lways for this tool: ")
            out.flush()
            line = self.read()
            if not line:  # end of input: nobody answers
                print(file=out)
                return Permission.DENY
            answer = _ANSWERS.get(line.strip().lower())
            if answer is not None:
                return answer


def show_event(event: Any, out: Optional[TextIO] = None) -> None:
    """One line on ``out`` (default stderr) for a tool event of a turn: a call that runs without asking, a
    result, a notice."""
    out = out or sys.stderr
    if isinstance(event, ToolCallRequested) and not event.needs_permission and event.server:
        print(f"\n  [tool {event.server} › {event.tool} {_shown_args(event)}: running]", file=out)
    elif isinstance(event, ToolResultShown):
        preview = _one_line(event.text)[:120]
        print(f"  [{event.outcome} · {event.size_bytes} bytes · {event.elapsed_s:.2f} s] {preview}", file=out)
        if event.notice:
            print(f"  ({event.notice})", file=out)
    elif isinstance(event, ToolNotice):
        print(f"  ({event.text})", file=out)


def _shown_args(req: ToolCallRequested) -> str:
    text = json.dumps(req.arguments, ensure_ascii=False) if req.arguments is not None else req.call.arguments
    return text if len(text) <= _ARGS_SHOWN else text[:_ARGS_SHOWN] + f"… ({len(text)} characters)"


def _one_line(text: str) -> str:
    return " ".join(text.split())
