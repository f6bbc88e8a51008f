"""The child's end of a ``ChildHost``: build the handler, say "ready", serve the main lane (one request at a
time, or multiplexed) and the optional side lane until the parent closes or goes away. The wire protocol is
described in docs/engine.md ("The process host")."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
import traceback
from typing import Any, Callable, Optional, Protocol

from app.childhost.threads import tune_openmp
from app.childhost.watchdog import MAIN_READ, SIDE_READ, start_heartbeat
from app.errors import HearthError

PARENT_WATCH_S = 0.5  # seconds between checks that the parent still lives


class Handler(Protocol):
    """The child-side object a host serves (built in the child by the host's ``target(*args)``)."""

    def ready_info(self) -> Any:
        """What the parent gets from ``start()`` (picklable)."""

    def call(self, op: str, args: tuple, emit: Callable[..., None], cancelled: Callable[[], bool]) -> Any:
        """A main-lane request. ``emit(*payload)`` streams an event; ``cancelled()`` polls the cancel flag."""

    def side(self, op: str, args: tuple) -> Any:
        """A side-lane request (read-only; runs on another thread while ``call`` may be running)."""


class MuxHandler(Protocol):
    """A handler for a multiplexed main lane (``ChildHost(mux=True)``)."""

    def ready_info(self) -> Any: ...

    def serve(self, inbox: "queue.Queue[tuple]", send: Callable[[tuple], bool]) -> None:
        """Serve until ``("close",)`` arrives on ``inbox``: ``("submit", rid, op, *args)`` and ``("cancel", rid)``
        messages; ``send(msg)`` (thread-safe) writes ``("event", rid, ...)`` / ``("ok", rid, result)`` /
        ``("error", rid, exc)`` / ``("bug", rid, text)`` and returns False once the parent is gone."""

    def side(self, op: str, args: tuple) -> Any: ...


class ChildBug(RuntimeError):
    """An unexpected exception in a child's handler (a bug, not a known error). ``str()`` is its type and
    message; ``child_traceback`` the traceback formatted in the child."""

    def __init__(self, text: str) -> None:
        lines = text.rstrip().splitlines()
        super().__init__(lines[-1] if lines else "unknown error")
        self.child_traceback = text
        if hasattr(self, "add_note"):  # Python 3.11+: a logged traceback shows where in the child it happened
            self.add_note("Raised in the child process:\n" + text.rstrip())


class _ParentGone(BaseException):
    """Raised inside ``emit`` when the parent no longer reads: unwinds the handler (a BaseException, so no
    ``except Exception`` in a handler swallows it) and ends the lane quietly."""


def _child_main(target: Callable[..., Handler], args: tuple, main: Any, side: Any, cancel: Any,
                mux: bool = False, pulse: Any = None) -> None:
    """Entry point of a spawned child (``pulse``: its ``watchdog`` counters)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C goes to the parent, which cancels
    watch_parent()
    if pulse is not None:
        start_heartbeat(pulse)
    tune_openmp()
    _run_handler(target, args, main, side, cancel, mux, pulse)


def watch_parent(interval_s: float = PARENT_WATCH_S) -> None:
    """End this process (exit status 0, nothing printed) within ``interval_s`` seconds of its parent's death,
    even a SIGKILL, instead of running on (a long prefill would not notice the closed pipe)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _run_handler(target: Callable[..., Handler], args: tuple, main: Any, side: Any, cancel: Any,
                 mux: bool = False, pulse: Any = None) -> None:
    """Build the handler, say "ready" (or why not), then serve the lanes until the main lane closes; the lane
    readers write their read receipts into ``pulse`` (when given)."""
    try:
        handler: Optional[Handler] = target(*args)
        reply: tuple = ("ready", handler.ready_info())  # type: ignore[union-attr]
    except HearthError as exc:
        handler, reply = None, ("error", exc)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises ModelLoadError
        handler, reply = None, ("bug", bug_text(exc))
    if not _reply(main, reply) or handler is None:
        _close(main, side)
        return
    if side is not None:
        threading.Thread(target=_serve_lane, name="side-lane", daemon=True,
                         args=(side, lambda op, a, _emit: handler.side(op, a), pulse, SIDE_READ)).start()

    if mux:
        _serve_mux(main, handler, pulse)  # type: ignore[arg-type]
        return

    def cancelled() -> bool:
        return bool(cancel.value)

    _serve_lane(main, lambda op, a, emit: handler.call(op, a, emit, cancelled), pulse, MAIN_READ)


def _serve_mux(conn: Any, handler: MuxHandler, pulse: Any = None) -> None:
    """The child's end of a multiplexed main lane: a reader thread feeds ``inbox`` (and writes the id of each
    request it read into ``pulse[MAIN_READ]``); ``handler.serve`` runs here until ``("close",)`` (also queued
    when the pipe closes)."""
    inbox: "queue.Queue[tuple]" = queue.Queue()
    lock = threading.Lock()

    def send(msg: tuple) -> bool:
        with lock:
            return _reply(conn, msg)

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("close",)
            if pulse is not None and msg[0] == "submit":
                pulse[MAIN_READ] = msg[1]
            inbox.put(msg)
            if msg[0] == "close":
                return

    threading.Thread(target=read, name="mux-reader", daemon=True).start()
    try:
        handler.serve(inbox, send)
    except _ParentGone:
        pass
    finally:
        conn.close()


def _serve_lane(conn: Any, handle: Callable[[str, tuple, Callable[..., None]], Any], pulse: Any = None,
                lane: int = MAIN_READ) -> None:
    """Answer requests on ``conn`` until ``("close",)``, a closed pipe or a parent that no longer reads;
    ``pulse[lane]`` counts the requests read (when ``pulse`` is given)."""

    def emit(*payload: Any) -> None:
        if not _send(conn, ("event", *payload)):
            raise _ParentGone

    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            op, args = msg[0], tuple(msg[1:])
            if op == "close":
                return
            if pulse is not None:
                pulse[lane] += 1
            try:
                reply: tuple = ("ok", handle(op, args, emit))
            except _ParentGone:
                return
            except HearthError as exc:
                reply = ("error", exc)
            except Exception as exc:  # noqa: BLE001 - a bug in one request must not end the child
                reply = ("bug", bug_text(exc))
            if not _reply(conn, reply):
                return
    finally:
        conn.close()


def _send(conn: Any, msg: tuple) -> bool:
    """Send ``msg``; False when the other end is gone (BrokenPipeError, ConnectionResetError, EOF)."""
    try:
        conn.send(msg)
    except (OSError, EOFError):
        return False
    return True


def _reply(conn: Any, msg: tuple) -> bool:
    """``_send``, turning a reply that cannot be pickled into a ``bug`` reply."""
    try:
        return _send(conn, msg)
    except Exception as exc:  # noqa: BLE001 - pickling failed before anything was written
        return _send(conn, ("bug", bug_text(exc)))


def bug_text(exc: BaseException) -> str:
    """The formatted traceback of ``exc``: what a ``("bug", text)`` reply carries (raised as ``ChildBug``)."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _close(*conns: Any) -> None:
    for c in conns:
        if c is not None:
            c.close()

