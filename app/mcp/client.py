"""MCP client: Hearth's servers from ``mcp.json``, behind a synchronous facade for plain threads.

The official SDK (``mcp`` 2.x) is async and built on anyio, whose cancel scopes and task groups must be entered
and left by the same task. So one ``McpHub`` owns one asyncio event loop in a daemon thread, and each server is
one long-lived *runner* task on it that holds the whole connection (transport, then ``ClientSession``) for the
server's life: it connects, runs ``initialize`` and ``tools/list`` under the start timeout, marks the server
ready, then sleeps until it is stopped or the connection ends. Callers on any thread (a Qt worker, the
assistant's tool loop) submit coroutines with ``asyncio.run_coroutine_threadsafe`` and wait on the future with
their own timeout as well, so no caller waits past ``timeout_s`` plus a few seconds whatever the server does.

Failure is per server and never raises out of ``start``: a command that cannot be spawned, a process that exits
before the handshake, a handshake past the timeout, an HTTP endpoint that refuses; each leaves that server
``failed`` with a one-line reason (plus the last lines the process wrote to stderr) and the others running.
Calls to a server that is not ready raise ``ToolError``. Crash detection: the session does not read the
transport directly but through a forwarding stream whose end wakes the runner, so a server that dies between
calls is marked failed at once, not at the next call. A call past its timeout is cancelled (the SDK sends
``notifications/cancelled``) and raises ``ToolError(kind="timeout")``; the server stays ready unless a
``ping`` right after also goes unanswered (a slow tool is not a dead server).

Processes: stdio servers are spawned by the SDK's ``stdio_client`` in their own process group; leaving it
closes stdin, waits 2 s, then SIGTERMs and SIGKILLs the group and reaps it (the shutdown sequence of the MCP
spec, ``basic/lifecycle#shutdown``), so ``stop``/``close`` leave no child or zombie behind. ``close`` also runs
at interpreter exit for a hub left open.

Results are not truncated here (the caller cuts to its share of the context and keeps the full text in the
store); ``ToolResult.size_bytes`` reports the size. Content becomes text: text blocks as they are, embedded text
resources with their URI, images, audio and binary resources as a bracketed note the model can read.

``mcp`` is imported inside the functions that use it: it takes 0.75 s to import (its pydantic models), which a
desktop start with no MCP server configured should not pay.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import binascii
import concurrent.futures
import copy
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from app import __version__
from app.errors import HearthError, InvalidRequest
from app.mcp.config import McpConfig, McpServerConfig

if sys.version_info < (3, 11):  # pragma: no cover - anyio depends on the backport there
    from exceptiongroup import BaseExceptionGroup

log = logging.getLogger(__name__)

ServerState = Literal["stopped", "starting", "ready", "failed"]

DEFAULT_START_TIMEOUT_S = 30.0  # first run of an `npx -y` server downloads it
DEFAULT_CALL_TIMEOUT_S = 60.0
_GRACE_S = 5.0  # a caller's own wait beyond timeout_s: covers the loop's reaction, never the server's
_STOP_WAIT_S = 8.0  # stdio shutdown: 0.5 s flush + 2 s for stdin EOF + 2 s after SIGTERM + reaping
_PING_TIMEOUT_S = 5.0
_STDERR_LINES = 20
_MAX_PAGES = 100  # tools/list pages: a server whose cursor never ends cannot hang the start
_NAME_MAX = 64  # OpenAI function names: ^[a-zA-Z0-9_-]{1,64}$
_PREFIX_MAX = 24
# The SDK refuses an HTTP event (one whole JSON-RPC answer) over 1 MiB by default; a 1 MB tool result is about
# 2 MB on the wire (MCPServer repeats it as structuredContent). The limit guards memory against a runaway server.
_MAX_HTTP_EVENT_BYTES = 64 * 1024 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class ToolError(HearthError):
    """An MCP server cannot run a tool call. ``server``: its name in ``mcp.json``; ``tool``: the MCP tool name
    (None when the call never got that far); ``kind``: ``"unavailable"`` (the server is not ready: not started,
    failed to start, stopped, crashed earlier; the reason says which), ``"timeout"`` (the call ran past its
    ``timeout_s``), ``"crashed"`` (the connection was lost during this call; the server is now ``failed``),
    ``"failed"`` (this call's HTTP request failed, the session lives on), ``"unknown_tool"`` (no enabled tool
    has that name); ``reason``: a short reason for a person.

    A tool that runs and reports failure is not a ``ToolError``: it is a ``ToolResult`` with ``is_error`` (MCP
    asks clients to show those to the model, which may correct itself)."""

    def __init__(self, server: str, reason: str, kind: str = "unavailable", tool: str | None = None) -> None:
        where = (f"MCP server {server!r}" if server else "MCP") + (f", tool {tool!r}" if tool else "")
        super().__init__(f"{where}: {reason}")
        self.server = server
        self.reason = reason
        self.kind = kind
        self.tool = tool

    def __reduce__(self):
        return (self.__class__, (self.server, self.reason, self.kind, self.tool))


@dataclass(frozen=True)
class McpTool:
    """One tool of one server. ``name``: the MCP tool name; ``qualified_name``: the name the model sees, unique
    over all servers and valid as an OpenAI function name (``^[a-zA-Z0-9_-]{1,64}$``: ``<server>__<tool>``
    sanitized, shortened with a hash when needed); ``input_schema``: the tool's JSON Schema (an object schema,
    MCP ``inputSchema``); ``annotations``: MCP hints (``readOnlyHint``, ``destructiveHint``...), possibly empty;
    ``enabled``: the Settings switch; ``always_allowed``: the person allowed it "always" (``alwaysAllow``)."""

    server: str
    name: str
    qualified_name: str
    description: str
    input_schema: dict[str, Any]
    title: str | None = None
    annotations: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    always_allowed: bool = False

    def openai_tool(self) -> dict[str, Any]:
        """The tool as an OpenAI ``tools`` entry (``{"type": "function", "function": {...}}``)."""
        return {"type": "function", "function": {
            "name": self.qualified_name, "description": self.description,
            "parameters": copy.deepcopy(self.input_schema)}}


@dataclass(frozen=True)
class ServerStatus:
    """Where one server stands. ``state``: ``stopped`` (never started, stopped, or ``disabled``), ``starting``,
    ``ready``, ``failed`` (``error`` says why, for a person); ``tools``: every tool it listed, switched off ones
    included (for the Settings switches), empty unless ready; ``server_info``: name and version from its
    ``initialize`` answer; ``transport``: ``"stdio"`` or ``"http"``."""

    name: str
    state: ServerState
    error: str | None = None
    tools: tuple[McpTool, ...] = ()
    server_info: str | None = None
    transport: str = "stdio"
    disabled: bool = False


@dataclass(frozen=True)
class ToolResult:
    """A finished ``tools/call``. ``text``: every content block as text (see ``content_to_text``), never
    truncated; ``is_error``: the tool reported failure (MCP ``isError``; also set for a JSON-RPC error answer
    and a result that breaks the tool's output schema); ``raw``: the content blocks as MCP JSON dicts;
    ``structured``: MCP ``structuredContent`` or None; ``size_bytes``: UTF-8 bytes of ``text``;
    ``elapsed_s``: wall time of the call in seconds."""

    server: str
    tool: str
    text: str
    is_error: bool
    raw: list[dict[str, Any]]
    structured: dict[str, Any] | None = None
    size_bytes: int = 0
    elapsed_s: float = 0.0


def content_to_text(blocks: Sequence[Mapping[str, Any]], structured: Mapping[str, Any] | None = None) -> str:
    """MCP content blocks (``CallToolResult.content``, JSON dicts) as one text for the model, blocks joined by
    newlines: ``text`` as is; an embedded ``resource`` with text as ``[resource <uri>]`` then its text; images,
    audio and binary resources as a bracketed note with the MIME type and decoded size in bytes (the model
    cannot see them); ``resource_link`` as a note with its name and URI. With no blocks, ``structured``
    (``structuredContent``) as JSON."""
    parts = [_block_text(b) for b in blocks]
    if not parts and structured is not None:
        parts = [json.dumps(structured, ensure_ascii=False)]
    return "\n".join(parts)


def _block_text(b: Mapping[str, Any]) -> str:
    kind = b.get("type")
    if kind == "text":
        return str(b.get("text", ""))
    if kind in ("image", "audio"):
        return f"[{kind}: {b.get('mimeType', '?')}, {_b64_len(b.get('data', ''))} bytes, not shown to the model]"
    if kind == "resource":
        r = b.get("resource") or {}
        if "text" in r:
            return f"[resource {r.get('uri', '')}]\n{r['text']}"
        return (f"[resource {r.get('uri', '')}: {r.get('mimeType', 'binary')}, {_b64_len(r.get('blob', ''))} "
                "bytes, not shown to the model]")
    if kind == "resource_link":
        return f"[resource link: {b.get('name', '')} {b.get('uri', '')}]".replace("  ", " ")
    return f"[{kind} content, not shown to the model]"


def _b64_len(data: Any) -> int:
    try:
        return len(base64.b64decode(str(data), validate=False))
    except (binascii.Error, ValueError):
        return len(str(data)) * 3 // 4


def qualified_names(servers: Sequence[tuple[str, Sequence[str]]]) -> dict[tuple[str, str], str]:
    """Model-facing names for ``(server, [tool names])`` in config order: ``<server>__<tool>`` with every
    character outside ``[A-Za-z0-9_-]`` replaced by ``_``, at most 64 characters. Server prefixes are made unique
    first (from the config alone, so a server going down never renames another's tools), then a tool name that
    is too long or collides after sanitizing gets a stable hash suffix."""
    out: dict[tuple[str, str], str] = {}
    used_prefix: set[str] = set()
    for server, tools in servers:
        prefix = _UNSAFE.sub("_", server)[:_PREFIX_MAX] or "_"
        if prefix in used_prefix:
            prefix = f"{prefix[:_PREFIX_MAX - 9]}_{_hash8(server)}"
        used_prefix.add(prefix)
        used: set[str] = set()
        for tool in tools:
            name = f"{prefix}__{_UNSAFE.sub('_', tool)}"
            if len(name) > _NAME_MAX or name in used:
                name = f"{name[:_NAME_MAX - 9]}_{_hash8(server + '/' + tool)}"
            n = 2
            while name in used:  # a hash clash: never in practice, but names must be unique
                name = f"{name[:_NAME_MAX - 4]}_{n:03d}"
                n += 1
            used.add(name)
            out[(server, tool)] = name
    return out


def _hash8(s: str) -> str:
    return hashlib.sha1(s.encode("utf-8")).hexdigest()[:8]


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


class McpHub:
    """Runs the MCP servers of an ``McpConfig`` and calls their tools; safe to use from any number of threads.
    ``on_status`` runs on the hub's own loop thread: it may read (``status``, ``tools``) but must not block
    nor call ``start``/``stop``/``call``/``close`` (they wait on that very thread); hand over instead, e.g. by
    emitting a Qt signal.

    ``on_status(status)`` is called after every state change of a server (starting, ready, failed, stopped,
    tools re-listed). Blocking methods wait at most their ``timeout_s`` plus a few seconds. Use as a context
    manager, or call ``close()``; a hub left open is closed at interpreter exit."""

    def __init__(self, config: McpConfig | None = None, *,
                 on_status: Callable[[ServerStatus], None] | None = None) -> None:
        self._lock = threading.RLock()
        self._config = config or McpConfig()
        self._servers = {s.name: _Server(s) for s in self._config.servers}
        self._on_status = on_status
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._tasks: set[asyncio.Task] = set()  # background probes and re-listings (loop thread only)

    def __enter__(self) -> McpHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def config(self) -> McpConfig:
        """The config the hub runs now."""
        with self._lock:
            return self._config

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self, name: str | None = None, *, timeout_s: float = DEFAULT_START_TIMEOUT_S,
              wait: bool = True) -> dict[str, ServerStatus]:
        """Start server ``name``, or every server not ``disabled`` (None); a ready or starting server is left
        alone, a failed or stopped one is started again (``name`` starts it even when disabled). ``timeout_s``:
        seconds each server has to answer ``initialize`` and ``tools/list``. With ``wait`` it returns once each
        is ready or failed (at most ``timeout_s`` + a few seconds), else at once (follow ``on_status``).

        Never raises for a server that fails: read ``status()``. Raises ``ToolError(kind="unavailable")`` for a
        name that is not in the config or a closed hub, ``InvalidRequest`` for a timeout <= 0."""
        _check_timeout(timeout_s)
        with self._lock:
            if name is not None and name not in self._servers:
                raise ToolError(name, "no such server in mcp.json")
            names = [name] if name is not None else [n for n, s in self._servers.items() if not s.cfg.disabled]
        fut = self._submit(self._start_many(names, timeout_s))
        if wait:
            _wait(fut, timeout_s + _GRACE_S)
        return self.status()

    def stop(self, name: str | None = None, *, timeout_s: float = _STOP_WAIT_S) -> None:
        """Stop server ``name`` (or all) and wait, at most ``timeout_s`` seconds, until its process has exited;
        it ends ``stopped``. In-flight calls end with ``ToolError(kind="unavailable")``."""
        with self._lock:
            if self._loop is None or self._closed:
                return
            names = [name] if name is not None else list(self._servers)
        _wait(self._submit(self._stop_many(names, timeout_s)), timeout_s + _GRACE_S)

    def restart(self, name: str, *, timeout_s: float = DEFAULT_START_TIMEOUT_S,
                wait: bool = True) -> ServerStatus:
        """``stop(name)`` then ``start(name)``; returns its status."""
        self.stop(name)
        return self.start(name, timeout_s=timeout_s, wait=wait)[name]

    def apply_config(self, config: McpConfig, *, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        """Switch to ``config`` (edited in Settings) without waiting: removed and newly ``disabled`` servers are
        stopped, new servers and running ones whose command, arguments, environment, URL or headers changed are
        (re)started in the background; tool switches and ``alwaysAllow`` apply at once, with no restart."""
        _check_timeout(timeout_s)
        with self._lock:
            old = self._servers
            self._config = config
            self._servers = {}
            gone, launch = [], []
            for s in config.servers:
                prev = old.get(s.name)
                if prev is not None and prev.cfg.launch_key() == s.launch_key():
                    prev.cfg = s
                    self._servers[s.name] = prev
                    if s.disabled and prev.state in ("starting", "ready"):
                        gone.append(prev)
                    continue
                self._servers[s.name] = _Server(s)
                if prev is not None:
                    gone.append(prev)
                if not s.disabled and (prev is None or prev.state in ("starting", "ready")):
                    launch.append(s.name)
            gone += [srv for n, srv in old.items() if n not in self._servers]
            running = self._loop is not None and not self._closed
        if running:
            self._submit(self._reconfigure(gone, launch, timeout_s))

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every server (each process exits or is killed, see the module docstring) and end the loop
        thread; idempotent, never raises (but ``RuntimeError`` from ``on_status``, i.e. the loop thread itself).
        Waits at most about ``timeout_s`` seconds."""
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError("McpHub.close must not be called from its own loop thread (on_status)")
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        atexit.unregister(self.close)
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(timeout_s), loop).result(timeout_s + _GRACE_S)
        except Exception:  # noqa: BLE001 - close must finish; the loop is stopped below regardless
            log.exception("MCP hub: shutdown did not finish cleanly")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if not thread.is_alive():
            loop.close()

    # -- reading --------------------------------------------------------------------------------------------

    def status(self) -> dict[str, ServerStatus]:
        """Every configured server's status, in config order."""
        with self._lock:
            names = self._names_locked()
            return {n: self._status_locked(s, names) for n, s in self._servers.items()}

    def tools(self, enabled_only: bool = True) -> list[McpTool]:
        """Tools of the ready servers in config order (switched-off ones too unless ``enabled_only``)."""
        with self._lock:
            names = self._names_locked()
            return [t for s in self._servers.values() if s.state == "ready"
                    for t in self._tools_locked(s, names) if t.enabled or not enabled_only]

    def tool(self, qualified_name: str) -> McpTool:
        """The enabled tool of a ready server named ``qualified_name``. Raises ``ToolError``: kind
        ``unknown_tool`` when no listed tool has that name or it is switched off, ``unavailable`` when its
        server is not ready (stopped, failed: the reason says why)."""
        with self._lock:
            names = self._names_locked()
            for s in self._servers.values():
                for t in self._tools_locked(s, names):
                    if t.qualified_name != qualified_name:
                        continue
                    if s.state != "ready":
                        raise ToolError(s.cfg.name, f"the server is {s.state}"
                                        + (f": {s.error}" if s.error else ""), "unavailable", t.name)
                    if not t.enabled:
                        raise ToolError(s.cfg.name, "this tool is switched off in Settings", "unknown_tool",
                                        t.name)
                    return t
        raise ToolError("", f"no tool of a running server is named {qualified_name!r}", "unknown_tool")

    # -- calling --------------------------------------------------------------------------------------------

    def call(self, qualified_name: str, arguments: Mapping[str, Any] | None = None, *,
             timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> ToolResult:
        """Call tool ``qualified_name`` (``McpTool.qualified_name``) with ``arguments`` (a JSON object) and
        wait for its result, at most ``timeout_s`` seconds (then the call is cancelled on the server).

        Returns the ``ToolResult`` (``is_error`` when the tool reported failure, or the server answered with a
        JSON-RPC error such as invalid params). Raises ``ToolError``: kind ``unknown_tool``, ``unavailable``
        (its server is not ready), ``timeout``, ``crashed`` (the server went away during the call; it is then
        ``failed``), ``failed`` (this call's HTTP request failed, the server still answers);
        ``InvalidRequest`` for arguments that are not an object or a timeout <= 0."""
        _check_timeout(timeout_s)
        if arguments is not None and not isinstance(arguments, Mapping):
            raise InvalidRequest(f"tool arguments must be a JSON object, got {type(arguments).__name__}",
                                 param="arguments")
        t = self.tool(qualified_name)
        fut = self._submit(self._call(t.server, t.name, dict(arguments or {}), timeout_s))
        try:
            return fut.result(timeout_s + _GRACE_S)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise ToolError(t.server, f"no answer within {timeout_s:g} s", "timeout", t.name) from None

    # -- loop side ------------------------------------------------------------------------------------------

    def _submit(self, coro) -> concurrent.futures.Future:
        with self._lock:
            if self._closed:
                coro.close()
                raise ToolError("", "the MCP hub is closed")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-hub", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            loop = self._loop
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("McpHub methods must not be called from its own loop thread (on_status)")
        return asyncio.run_coroutine_threadsafe(coro, loop)

    async def _start_many(self, names: list[str], timeout_s: float) -> None:
        done = await asyncio.gather(*(self._start_one(n, timeout_s) for n in names), return_exceptions=True)
        for name, r in zip(names, done):
            if isinstance(r, BaseException):
                log.error("MCP hub: starting %r failed", name, exc_info=r)

    async def _start_one(self, name: str, timeout_s: float) -> None:
        with self._lock:
            srv = self._servers.get(name)
            if srv is None or srv.state in ("starting", "ready"):
                started = srv.started if srv is not None else None
            else:
                started = None
        if srv is None:
            return
        if started is not None:
            await asyncio.shield(started)
            return
        if srv.task is not None and not srv.task.done():  # a failed runner still tearing down
            await asyncio.wait([srv.task], timeout=_STOP_WAIT_S)
        loop = asyncio.get_running_loop()
        with self._lock:
            srv.stopping = False
            srv.eof = False
            srv.wake = asyncio.Event()
            srv.started = loop.create_future()
            srv.stderr.clear()
            self._set_locked(srv, "starting", error=None, tools=[], server_info=None)
            srv.task = loop.create_task(self._run_server(srv, timeout_s), name=f"mcp:{name}")
            started = srv.started
        self._notify(srv)
        await asyncio.shield(started)

    async def _run_server(self, srv: _Server, timeout_s: float) -> None:
        """The runner: holds the connection of one server for its whole life (see the module docstring). A
        failure is reported as soon as it is known; closing the connection (and the process) follows."""
        try:
            async with AsyncExitStack() as stack:
                try:
                    session = await self._connect(stack, srv)  # spawns, never waits on the server
                    with anyio.CancelScope() as handshake:  # stop() cancels a start still under way
                        srv.cancel_start = handshake.cancel
                        with anyio.fail_after(timeout_s):
                            init = await session.initialize()
                            tools = await _list_tools(session)
                except Exception as e:  # noqa: BLE001 - every failure of one server is that server's state
                    self._fail(srv, _describe_start(_leaf(e), srv, timeout_s) + await _tail_when_exited(srv, e))
                    return
                finally:
                    srv.cancel_start = None
                if handshake.cancelled_caught:
                    return
                self._ready(srv, session, init, tools)
                assert srv.wake is not None
                await srv.wake.wait()
                if not srv.stopping:
                    self._fail(srv, "the server closed the connection (it exited or crashed)"
                               + await _tail_when_exited(srv, None))
        except Exception as e:  # noqa: BLE001 - e.g. an error group from the transport's teardown
            if not srv.stopping:
                self._fail(srv, _describe_start(_leaf(e), srv, timeout_s) + _tail(srv))
            else:
                log.debug("MCP server %r: error while stopping: %r", srv.cfg.name, e)
        finally:
            with self._lock:
                srv.session = None
                if srv.stopping or srv.state != "failed":
                    self._set_locked(srv, "stopped", error=None)
            _resolve(srv.started)
            self._notify(srv)

    def _ready(self, srv: _Server, session: Any, init: Any, tools: list[dict[str, Any]]) -> None:
        info = init.server_info
        with self._lock:
            srv.session = session
            self._set_locked(srv, "ready", tools=tools,
                             server_info=f"{info.name} {info.version}".strip() if info else None)
        log.info("MCP server %r ready: %d tools", srv.cfg.name, len(tools))
        _resolve(srv.started)
        self._notify(srv)

    async def _connect(self, stack: AsyncExitStack, srv: _Server):
        """Open the transport and the ``ClientSession`` on ``stack``; the session reads through a forwarding
        stream whose end sets ``srv.wake`` (crash detection)."""
        from mcp import ClientSession
        from mcp.types import Implementation

        if srv.cfg.transport == "stdio":
            read, write = await _open_stdio(stack, srv)
        else:
            read, write = await _open_http(stack, srv.cfg)
        send, receive = anyio.create_memory_object_stream(0)
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)  # exits after the session, before the transport
        tg.start_soon(_forward, read, send, srv)

        async def on_message(message: Any) -> None:
            if getattr(message, "method", None) == "notifications/tools/list_changed":
                self._background(self._relist(srv))
            elif isinstance(message, Exception):
                log.debug("MCP server %r: transport error: %r", srv.cfg.name, message)

        return await stack.enter_async_context(ClientSession(
            receive, write, message_handler=on_message,
            client_info=Implementation(name="hearth", version=__version__)))

    async def _relist(self, srv: _Server) -> None:
        session = srv.session
        if session is None:
            return
        try:
            with anyio.fail_after(_PING_TIMEOUT_S * 2):
                tools = await _list_tools(session)
        except Exception as e:  # noqa: BLE001 - keep the old list; the server may be going away
            log.warning("MCP server %r: re-listing tools failed: %s", srv.cfg.name, e)
            return
        with self._lock:
            if srv.session is session:
                srv.tools = tools
        self._notify(srv)

    async def _call(self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float) -> ToolResult:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        with self._lock:
            srv = self._servers.get(server)
            session = srv.session if srv is not None and srv.state == "ready" else None
        if srv is None or session is None:
            raise ToolError(server, "the server is not running", "unavailable", tool)
        t0 = time.monotonic()
        try:
            with anyio.fail_after(timeout_s):
                result = await session.call_tool(tool, arguments)
        except TimeoutError:
            self._background(self._probe(srv, session, "a call timed out"))
            raise ToolError(server, f"no answer within {timeout_s:g} s", "timeout", tool) from None
        except MCPError as e:
            if e.error.code != CONNECTION_CLOSED:
                return _error_result(server, tool, f"MCP error {e.error.code}: {e.error.message}", t0)
            if srv.eof or srv.stopping:
                raise self._lost(srv, tool) from None
            # Over HTTP one request's stream can fail while the session lives on (the SDK answers it so, e.g.
            # for an oversized event); a ping tells that from a server that is gone.
            # (2 s: the caller's own deadline is timeout_s + 5 s.)
            if not await self._probe(srv, session, f"a call failed: {e.error.message}", 2.0):
                raise ToolError(server, f"the server went away during the call ({e.error.message})", "crashed",
                                tool) from None
            raise ToolError(server, f"the call failed: {e.error.message}", "failed", tool) from None
        except RuntimeError as e:  # the SDK's check of the result against the tool's outputSchema
            if srv.session is session and not srv.stopping:
                return _error_result(server, tool, str(e), t0)
            raise self._lost(srv, tool) from None
        except Exception as e:  # noqa: BLE001 - e.g. an HTTP connection error: the server is gone
            log.warning("MCP server %r: call %r failed: %r", server, tool, e)
            err = self._lost(srv, tool)
            self._fail(srv, f"the connection failed during a call: {_short(e)}")
            raise err from None
        return _result(server, tool, result, t0)

    def _lost(self, srv: _Server, tool: str) -> ToolError:
        if srv.stopping:
            return ToolError(srv.cfg.name, "the server was stopped during the call", "unavailable", tool)
        return ToolError(srv.cfg.name, "the server went away during the call" + _tail(srv), "crashed", tool)

    async def _probe(self, srv: _Server, session: Any, after: str, timeout_s: float = _PING_TIMEOUT_S) -> bool:
        """After a call timed out or its HTTP request failed: a server that does not answer ``ping`` either is
        hung or gone; fail it (its connection and process are then closed). Returns whether it answered."""
        try:
            with anyio.fail_after(timeout_s):
                await session.send_ping()
            return True
        except Exception as e:  # noqa: BLE001 - any failure to answer means the same
            if srv.session is session and not srv.stopping:
                self._fail(srv, f"it stopped answering ({after}, and ping failed: {_short(e)})")
            return False

    def _background(self, coro) -> None:
        """Run ``coro`` on the loop without waiting; the task is kept referenced until it ends (asyncio only
        holds weak references to tasks)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop_many(self, names: list[str], timeout_s: float) -> None:
        with self._lock:
            servers = [self._servers[n] for n in names if n in self._servers]
        await self._stop_servers(servers, timeout_s)

    async def _stop_servers(self, servers: list[_Server], timeout_s: float) -> None:
        tasks = []
        for srv in servers:
            srv.stopping = True
            if srv.wake is not None:
                srv.wake.set()
            if srv.cancel_start is not None:
                srv.cancel_start()
            if srv.task is not None and not srv.task.done():
                tasks.append(srv.task)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:  # the SDK's shutdown is shielded and bounded; this is a last resort
            log.warning("MCP hub: %s did not stop in %.0f s; cancelling it", task.get_name(), timeout_s)
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=_STOP_WAIT_S)

    async def _reconfigure(self, gone: list[_Server], launch: list[str], timeout_s: float) -> None:
        await self._stop_servers(gone, _STOP_WAIT_S)
        await self._start_many(launch, timeout_s)

    async def _shutdown(self, timeout_s: float) -> None:
        with self._lock:
            servers = list(self._servers.values())
        await self._stop_servers(servers, timeout_s)
        rest = asyncio.all_tasks() - {asyncio.current_task()}
        for task in rest:
            task.cancel()  # probes, re-listings, calls still waiting
        if rest:
            await asyncio.wait(rest, timeout=1.0)

    # -- state ----------------------------------------------------------------------------------------------

    def _fail(self, srv: _Server, reason: str) -> None:
        with self._lock:
            if srv.stopping or srv.state == "failed":
                return
            self._set_locked(srv, "failed", error=reason)  # the last listing stays: calls then say why
        log.warning("MCP server %r failed: %s", srv.cfg.name, reason)
        if srv.wake is not None:
            srv.wake.set()
        _resolve(srv.started)
        self._notify(srv)

    def _set_locked(self, srv: _Server, state: ServerState, **fields: Any) -> None:
        srv.state = state
        for k, v in fields.items():
            setattr(srv, k, v)

    def _notify(self, srv: _Server) -> None:
        if self._on_status is None:
            return
        with self._lock:
            st = self._status_locked(srv, self._names_locked())
        try:
            self._on_status(st)
        except Exception:  # noqa: BLE001 - a broken listener must not break the servers
            log.exception("MCP hub: on_status listener failed")

    def _names_locked(self) -> dict[tuple[str, str], str]:
        return qualified_names([(n, [t["name"] for t in s.tools]) for n, s in self._servers.items()])

    def _status_locked(self, srv: _Server, names: dict[tuple[str, str], str]) -> ServerStatus:
        return ServerStatus(name=srv.cfg.name, state=srv.state, error=srv.error,
                            tools=tuple(self._tools_locked(srv, names)) if srv.state == "ready" else (),
                            server_info=srv.server_info,
                            transport=srv.cfg.transport, disabled=srv.cfg.disabled)

    def _tools_locked(self, srv: _Server, names: dict[tuple[str, str], str]) -> list[McpTool]:
        cfg = srv.cfg
        return [McpTool(server=cfg.name, name=t["name"], qualified_name=names[(cfg.name, t["name"])],
                        description=t.get("description") or t.get("title") or t["name"],
                        input_schema=copy.deepcopy(t.get("inputSchema") or {"type": "object"}),
                        title=t.get("title"), annotations=dict(t.get("annotations") or {}),
                        enabled=cfg.tool_enabled(t["name"]), always_allowed=t["name"] in cfg.always_allow)
                for t in srv.tools]


# -- transports and helpers ---------------------------------------------------------------------------------

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


def _resolve(fut: asyncio.Future | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


def _wait(fut: concurrent.futures.Future, timeout_s: float) -> None:
    try:
        fut.result(timeout_s)
    except concurrent.futures.TimeoutError:
        log.warning("MCP hub: gave up waiting after %.0f s", timeout_s)


def _check_timeout(timeout_s: float) -> None:
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise InvalidRequest(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}", param="timeout_s")
