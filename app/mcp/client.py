"""``McpHub``: Hearth's MCP servers from ``mcp.json`` behind a synchronous facade for plain threads.

One hub owns one asyncio loop in a daemon thread and each server is one long-lived runner task on it holding
the whole connection, because the SDK's anyio task groups must be entered and left by the same task. Callers
on any thread wait on futures with their own deadline. Failure is per server and never raises out of
``start``. The reasoning, crash detection and process shutdown: docs/mcp.md, 'Inside the client'.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, NamedTuple

import anyio

from app import __version__
from app.errors import InvalidRequest
from app.mcp.config import McpConfig
from app.mcp.transport import (
    _describe_start,
    _error_result,
    _forward,
    _leaf,
    _list_tools,
    _open_http,
    _open_stdio,
    _result,
    _Server,
    _short,
    _tail,
    _tail_when_exited,
)
from app.mcp.types import (
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
    McpTool,
    ServerState,
    ServerStatus,
    ToolError,
    ToolResult,
    clash_text,
    content_to_text,
    name_clashes,
    qualified_names,
)

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S", "DEFAULT_START_TIMEOUT_S", "McpHub", "McpTool", "ServerStatus", "ToolError",
    "ToolResult", "content_to_text", "qualified_names",
]

_GRACE_S = 5.0  # a caller's own wait beyond timeout_s: covers the loop's reaction, never the server's
_STOP_WAIT_S = 8.0  # stdio shutdown: 0.5 s flush + 2 s for stdin EOF + 2 s after SIGTERM + reaping
_PING_TIMEOUT_S = 5.0


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
        self._clashes_logged: set[tuple[str, tuple]] = set()  # each name clash is logged once

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
        """Stop every server (each process exits or is killed, docs/mcp.md, 'Inside the client') and end the loop
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
        """Tools of the ready servers in config order (switched-off ones too unless ``enabled_only``); never a
        tool whose name clashes with another's (``name_clashes``)."""
        with self._lock:
            names = self._names_locked()
            return [t for s in self._servers.values() if s.state == "ready"
                    for t in self._tools_locked(s, names) if t.enabled or not enabled_only]

    def tool(self, qualified_name: str) -> McpTool:
        """The enabled tool of a ready server named ``qualified_name``. Raises ``ToolError``: kind
        ``unknown_tool`` when no listed tool has that name, it is switched off, or the name was given to tools
        of two servers (``name_clashes``: neither is called, the message names both), ``unavailable`` when its
        server is not ready (stopped, failed: the reason says why)."""
        with self._lock:
            names = self._names_locked()
            if qualified_name in names.clashes:
                raise ToolError("", clash_text(qualified_name, names.clashes[qualified_name]), "unknown_tool")
            found = self._usable_locked(lambda t: t.qualified_name == qualified_name, names)
        if found is None:
            raise ToolError("", f"no tool of a running server is named {qualified_name!r}", "unknown_tool")
        return found

    def _usable_locked(self, match: Callable[[McpTool], bool], names: _Names) -> McpTool | None:
        """The first listed tool ``match`` accepts (None: none), checked callable: its server ready and the
        tool switched on, else ``ToolError``."""
        for s in self._servers.values():
            for t in self._tools_locked(s, names):
                if not match(t):
                    continue
                if s.state != "ready":
                    raise ToolError(s.cfg.name, f"the server is {s.state}"
                                    + (f": {s.error}" if s.error else ""), "unavailable", t.name)
                if not t.enabled:
                    raise ToolError(s.cfg.name, "this tool is switched off in Settings", "unknown_tool", t.name)
                return t
        return None

    def _pair(self, tool: McpTool) -> McpTool:
        """``tool``'s own (server, MCP name) as it stands now, whatever its qualified name resolves to."""
        with self._lock:
            found = self._usable_locked(lambda t: (t.server, t.name) == (tool.server, tool.name),
                                        self._names_locked())
        if found is None:
            raise ToolError(tool.server, "no running server lists this tool now", "unknown_tool", tool.name)
        return found

    # -- calling --------------------------------------------------------------------------------------------

    def call(self, qualified_name: str | McpTool, arguments: Mapping[str, Any] | None = None, *,
             timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> ToolResult:
        """Call tool ``qualified_name`` (``McpTool.qualified_name``) with ``arguments`` (a JSON object) and
        wait for its result, at most ``timeout_s`` seconds (then the call is cancelled on the server). Given an
        ``McpTool`` (the one the person was asked about), that tool's own (server, MCP name) pair is called,
        never whatever its qualified name resolves to by now.

        Returns the ``ToolResult`` (``is_error`` when the tool reported failure, or the server answered with a
        JSON-RPC error such as invalid params). Raises ``ToolError``: kind ``unknown_tool``, ``unavailable``
        (its server is not ready), ``timeout``, ``crashed`` (the server went away during the call; it is then
        ``failed``), ``failed`` (this call's HTTP request failed, the server still answers);
        ``InvalidRequest`` for arguments that are not an object or a timeout <= 0."""
        _check_timeout(timeout_s)
        if arguments is not None and not isinstance(arguments, Mapping):
            raise InvalidRequest(f"tool arguments must be a JSON object, got {type(arguments).__name__}",
                                 param="arguments")
        t = self._pair(qualified_name) if isinstance(qualified_name, McpTool) else self.tool(qualified_name)
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
        """The runner: holds the connection of one server for its whole life (docs/mcp.md, 'Inside the client'). A
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

    def _names_locked(self) -> _Names:
        names = qualified_names([(n, [t["name"] for t in s.tools]) for n, s in self._servers.items()])
        clashes = name_clashes(names)
        for name, pairs in clashes.items():
            if (name, tuple(pairs)) not in self._clashes_logged:
                self._clashes_logged.add((name, tuple(pairs)))
                log.warning("MCP hub: %s", clash_text(name, pairs))
        return _Names(names, clashes)

    def _status_locked(self, srv: _Server, names: _Names) -> ServerStatus:
        error = srv.error
        if srv.state == "ready":  # a ready server says which of its tools are withheld, and why
            notes = [clash_text(n, pairs) for n, pairs in names.clashes.items()
                     if any(server == srv.cfg.name for server, _ in pairs)]
            error = "; ".join([srv.error, *notes] if srv.error else notes) or None
        return ServerStatus(name=srv.cfg.name, state=srv.state, error=error,
                            tools=tuple(self._tools_locked(srv, names)) if srv.state == "ready" else (),
                            server_info=srv.server_info,
                            transport=srv.cfg.transport, disabled=srv.cfg.disabled)

    def _tools_locked(self, srv: _Server, names: _Names) -> list[McpTool]:
        cfg = srv.cfg
        return [McpTool(server=cfg.name, name=t["name"], qualified_name=names.names[(cfg.name, t["name"])],
                        description=t.get("description") or t.get("title") or t["name"],
                        input_schema=copy.deepcopy(t.get("inputSchema") or {"type": "object"}),
                        title=t.get("title"), annotations=dict(t.get("annotations") or {}),
                        enabled=cfg.tool_enabled(t["name"]), always_allowed=t["name"] in cfg.always_allow)
                for t in srv.tools if names.names[(cfg.name, t["name"])] not in names.clashes]


class _Names(NamedTuple):
    """Every listed tool's qualified name by (server, MCP name), and the names given to more than one pair."""

    names: dict[tuple[str, str], str]
    clashes: dict[str, list[tuple[str, str]]]


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
