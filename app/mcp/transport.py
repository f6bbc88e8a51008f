"""One configured server at run time (``_Server``) and the coroutines that open its transport, forward its
stream, list its tools and word its failures; ``McpHub`` (``app.mcp.client``) drives them on its loop
(docs/mcp.md, 'Inside the client')."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio

from app.mcp.config import McpServerConfig
from app.mcp.types import ServerState, ToolResult, content_to_text

if sys.version_info < (3, 11):  # pragma: no cover - anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup

log = logging.getLogger(__name__)

_STDERR_LINES = 20
_MAX_PAGES = 100  # tools/list pages: a server whose cursor never ends cannot hang the start
# The SDK refuses an HTTP event (one whole JSON-RPC answer) over 1 MiB by default; a 1 MB tool result is about
# 2 MB on the wire (MCPServer repeats it as structuredContent). The limit guards memory against a runaway server.
_MAX_HTTP_EVENT_BYTES = 64 * 1024 * 1024


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups raised by anyio task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class _Server:
    """Runtime state of one configured server. Written on the hub's loop thread under the hub's lock; read
    anywhere under it."""

    def __init__(self, cfg: McpServerConfig) -> None:
        self.cfg = cfg
        self.state: ServerState = "stopped"
        self.error: str | None = None
        self.tools: list[dict[str, Any]] = []  # MCP Tool JSON as last listed (kept when it fails or stops)
        self.server_info: str | None = None
        self.session: Any = None  # mcp.ClientSession while ready
        self.task: asyncio.Task | None = None
        self.wake: asyncio.Event | None = None
        self.started: asyncio.Future | None = None
        self.stopping = False
        self.eof = False  # the transport's read side ended: the connection is gone
        self.cancel_start: Callable[[], None] | None = None
        self.stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        self.stderr_closed = threading.Event()  # the process and its children have closed stderr


async def _open_stdio(stack: AsyncExitStack, srv: _Server):
    """``stdio_client`` with the server's stderr on a pipe read by a daemon thread (last lines kept for error
    messages, all of it logged at DEBUG)."""
    from mcp import StdioServerParameters, stdio_client

    cfg = srv.cfg
    params = StdioServerParameters(command=cfg.command or "", args=list(cfg.args), env=dict(cfg.env) or None,
                                   cwd=cfg.cwd)
    r, w = os.pipe()
    srv.stderr_closed.clear()
    errlog = os.fdopen(w, "w", encoding="utf-8", errors="replace")
    threading.Thread(target=_read_stderr, args=(r, srv), name=f"mcp-stderr:{cfg.name}", daemon=True).start()
    try:
        return await stack.enter_async_context(stdio_client(params, errlog=errlog))
    finally:
        errlog.close()  # the child holds its own copy; ours must go or the reader never sees EOF


def _read_stderr(fd: int, srv: _Server) -> None:
    try:
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip()
                if line:
                    srv.stderr.append(line)
                    log.debug("MCP server %r stderr: %s", srv.cfg.name, line)
    finally:
        srv.stderr_closed.set()


async def _open_http(stack: AsyncExitStack, cfg: McpServerConfig):
    # The SDK's documented way to send headers is an httpx2 client of our own (httpx2 comes with mcp 2.x);
    # timeouts as the SDK's default client: 30 s, 300 s to read a held-open event stream.
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = await stack.enter_async_context(
        httpx2.AsyncClient(headers=dict(cfg.headers), timeout=httpx2.Timeout(30.0, read=300.0)))
    return await stack.enter_async_context(streamable_http_client(
        cfg.url or "", http_client=client, max_sse_event_size=_MAX_HTTP_EVENT_BYTES))


async def _forward(read: Any, send: Any, srv: _Server) -> None:
    try:
        async for item in read:
            await send.send(item)
        srv.eof = True  # the transport ended (a stdio server exited): set before the session sees the end
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
        pass  # our own shutdown closed the session's end
    finally:
        await send.aclose()
        if srv.wake is not None:
            srv.wake.set()


async def _list_tools(session: Any) -> list[dict[str, Any]]:
    from mcp.types import PaginatedRequestParams

    tools: list[dict[str, Any]] = []
    cursor = None
    for _ in range(_MAX_PAGES):
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _result(server: str, tool: str, result: Any, t0: float) -> ToolResult:
    raw = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
    structured = result.structured_content
    text = content_to_text(raw, structured)
    return ToolResult(server=server, tool=tool, text=text, is_error=bool(result.is_error), raw=raw,
                      structured=structured, size_bytes=len(text.encode("utf-8")),
                      elapsed_s=time.monotonic() - t0)


def _error_result(server: str, tool: str, text: str, t0: float) -> ToolResult:
    return ToolResult(server=server, tool=tool, text=text, is_error=True, raw=[{"type": "text", "text": text}],
                      size_bytes=len(text.encode("utf-8")), elapsed_s=time.monotonic() - t0)


def _describe_start(e: BaseException, srv: _Server, timeout_s: float) -> str:
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    cfg = srv.cfg
    if isinstance(e, TimeoutError):
        return f"no answer to initialize within {timeout_s:g} s"
    if isinstance(e, FileNotFoundError) and cfg.transport == "stdio":
        return f"cannot start {cfg.command!r}: no such program (check command and PATH)"
    if isinstance(e, OSError) and cfg.transport == "stdio":
        return f"cannot start {cfg.command!r}: {e.strerror or e}"
    if isinstance(e, MCPError) and e.error.code == CONNECTION_CLOSED:
        return "the server exited before answering initialize" if cfg.transport == "stdio" else (
            f"{cfg.url} closed the connection during initialize")
    if isinstance(e, MCPError):
        return f"initialize failed: MCP error {e.error.code}: {e.error.message}"
    if cfg.transport == "http":
        return f"cannot reach {cfg.url}: {_short(e)}"
    return f"start failed: {_short(e)}"


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


async def _tail_when_exited(srv: _Server, e: BaseException | None) -> str:
    """``_tail`` once a process that ended has had its last stderr lines read (at most 1 s): its last words
    usually say why (a missing key, a missing module). A server still running (a timeout) is not waited for."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    leaf = _leaf(e) if e is not None else None
    exited = leaf is None or (isinstance(leaf, MCPError) and leaf.error.code == CONNECTION_CLOSED)
    if srv.cfg.transport == "stdio" and exited:
        deadline = time.monotonic() + 1.0
        while not srv.stderr_closed.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    return _tail(srv)


def _tail(srv: _Server) -> str:
    lines = [" ".join(line.split()) for line in list(srv.stderr)[-3:]]
    return ("; its last output: " + " | ".join(lines)) if lines else ""
