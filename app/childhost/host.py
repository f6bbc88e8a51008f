"""One host for Hearth's llama.cpp child processes: the chat engine (``app.engine.local.engine``) and the embedder
(``app.retrieval.embedder``) both run their model through ``ChildHost``.

Why a child: llama.cpp aborts its whole process on some inputs and files; in a child that is an
``EngineCrashed`` for the caller (naming the signal, e.g. ``killed by signal SIGABRT``), and the next request
starts a fresh child. Every child is *spawned* (never forked: the parent holds threads, Qt and sqlite
handles), ignores SIGINT (Ctrl+C reaches the parent, which cancels), sets the OpenMP spin policy before
llama.cpp loads (``tune_openmp``), and ends when its parent dies, even by SIGKILL: a closed pipe ends it
quietly (no ``BrokenPipeError`` traceback), and a watch thread ends it within ``PARENT_WATCH_S`` seconds when
it is busy and not writing.

Wire protocol: pickled tuples over ``multiprocessing`` pipes, the same words on every lane and for every
child::

    child  -> parent  once, when the handler is built:  ("ready", info)   | ("error", HearthError)
    parent -> child   one request at a time per lane:   (op, *args)       ("close",) ends the lane
    child  -> parent  per request, zero or more:        ("event", *payload)     (streamed progress)
                      then exactly one:                 ("ok", result) | ("error", HearthError) | ("bug", text)

Known errors (``HearthError``) cross as themselves. Any other exception in the handler is a bug: it crosses
as ``("bug", formatted traceback)`` and the parent raises ``ChildBug`` (not a ``HearthError``, so it is logged
as a bug at the edges); the child keeps serving after either. The op ``"_abort"`` (a test hook, either lane)
makes the child die as llama.cpp does on a fatal error (``os.abort``).

Lanes: the *main* lane runs ``handler.call(op, args, emit, cancelled)``, one request at a time (callers
serialise it: the embedder's lock; the engine uses the multiplexed lane below). The optional *side* lane
is a second pipe served by a
second thread in the child, for short read-only ops (``handler.side(op, args)``) that must not wait behind a
running main-lane request: the engine's vocabulary (llama.cpp's tokenizer only reads the vocabulary;
llama-server tokenizes in its HTTP threads while it decodes). Parent-side, side requests are serialised by a
lock and may run while a main-lane request streams.

Multiplexed main lane (``mux=True``, the chat engine's continuous batching): many requests are open at once
on the main lane, each named by a request id (``rid``) the parent picks::

    parent -> child   any time:   ("submit", rid, op, *args)   ("cancel", rid)   ("stop_thinking", rid)
                                  ("close",)
    child  -> parent  per rid:    ("event", rid, *payload) ...  then  ("ok", rid, result) | ("error", rid, exc)
                                  | ("bug", rid, text)
                      batched:    ("events", [(rid, *payload), ...])   (one step's events, in order)

In the child a reader thread puts every parent message on a queue and the handler's ``serve(inbox, send)``
runs the loop (the engine's scheduler: ``app.engine.local.scheduler``) on the main thread. In the parent one reader
thread per child hands each message to its request's ``MuxCall``; a child that dies or stays silent for
``reply_s`` while a request is open ends every open request with ``EngineCrashed``.

Cancel: one flag in shared memory (a ``RawValue``: no semaphore, so nothing for the resource tracker to
report when a parent is killed), read by the handler through ``cancelled()``.

Timeouts (``Timeouts``, one policy for every child): ``start_s`` from spawn to "ready" (the model load);
``reply_s`` the longest silence while a request is open (each event restarts it; a generation sends one per
token). When one runs out the child is killed: ``ModelLoadError`` for a start, ``EngineCrashed`` for a
request.

``in_thread=True`` runs the same handler and protocol on threads of this process instead: no crash
isolation and no spawn cost, for handlers that never load llama.cpp (scripted runtimes for tests and UI
development). There ``"_abort"`` ends the handler's thread, which the parent sees as a crash.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol

from app.errors import EngineCrashed, HearthError, ModelLoadError

log = logging.getLogger(__name__)

PARENT_WATCH_S = 0.5  # seconds between checks that the parent still lives
_POLL_S = 0.5  # seconds between liveness checks while waiting for a reply


# ------------------------------------------------------------------------------------------------------
# thread and OpenMP policy (applies to every child that loads llama.cpp)
# ------------------------------------------------------------------------------------------------------
def default_threads(*, background: bool = False) -> int:
    """CPU threads for llama.cpp when the settings give none (an int >= 1).

    Foreground (the chat engine): every CPU this process may run on when there are at most 4, else half of
    them (at least 4): hyper-threads do not help llama.cpp, and llama-cpp-python's own default
    (``cpu_count // 2``) left half of a 2-core machine idle during decode (23 vs 38 tokens/s measured here).

    ``background=True`` (the embedder, which runs next to the chat engine and the UI): half of the foreground
    count, at least one. llama.cpp's threads wait for each other at every barrier, so one busy core stalls
    them all: measured on the 2-core machine while other work ran, 2 threads embedded 1.7 chunks/s (182
    tokens each) and took 144 ms per query, 1 thread 6.4 chunks/s and 3.8 ms."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        n = os.cpu_count() or 1
    foreground = n if n <= 4 else max(4, n // 2)
    return max(1, foreground // 2) if background else foreground


def tune_openmp() -> None:
    """Call before llama.cpp is loaded. llama.cpp's OpenMP threads spin-wait at every barrier (libgomp's default
    spin count is 300,000); when another process holds a core, decode collapses. Measured here, 2 threads on 2
    cores, decode tokens/s idle / with one busy process: default spin 48 / 7.5; ``GOMP_SPINCOUNT=1000`` 48.5 /
    23.6; one thread 27.7 / 27.5. So Hearth sets 1000 unless the environment already sets it (or
    ``OMP_WAIT_POLICY``); ``HEARTH_GOMP_SPINCOUNT`` overrides the value."""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = os.environ.get("HEARTH_GOMP_SPINCOUNT", "1000")


# ------------------------------------------------------------------------------------------------------
# what runs in the child
# ------------------------------------------------------------------------------------------------------
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


class _ParentGone(BaseException):
    """Raised inside ``emit`` when the parent no longer reads: unwinds the handler (a BaseException, so no
    ``except Exception`` in a handler swallows it) and ends the lane quietly."""


def _child_main(target: Callable[..., Handler], args: tuple, main: Any, side: Any, cancel: Any,
                mux: bool = False) -> None:
    """Entry point of a spawned child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C goes to the parent, which cancels
    watch_parent()
    tune_openmp()
    _run_handler(target, args, main, side, cancel, os.abort, mux)


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
                 abort: Callable[[], None], mux: bool = False) -> None:
    """Build the handler, say "ready" (or why not), then serve the lanes until the main lane closes."""
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
                         args=(side, lambda op, a, _emit: handler.side(op, a), abort)).start()

    if mux:
        _serve_mux(main, handler, abort)  # type: ignore[arg-type]
        return

    def cancelled() -> bool:
        return bool(cancel.value)

    _serve_lane(main, lambda op, a, emit: handler.call(op, a, emit, cancelled), abort)


def _serve_mux(conn: Any, handler: MuxHandler, abort: Callable[[], None]) -> None:
    """The child's end of a multiplexed main lane: a reader thread feeds ``inbox``; ``handler.serve`` runs
    here until ``("close",)`` (also queued when the pipe closes)."""
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
            if msg[0] == "_abort":
                abort()
                msg = ("close",)
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


def _serve_lane(conn: Any, handle: Callable[[str, tuple, Callable[..., None]], Any],
                abort: Callable[[], None]) -> None:
    """Answer requests on ``conn`` until ``("close",)``, a closed pipe or a parent that no longer reads."""

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
            if op == "_abort":
                abort()
                return
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


# ------------------------------------------------------------------------------------------------------
# the parent side
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timeouts:
    """Seconds a host waits. ``start_s``: spawn → "ready" (loading a large model from a slow disk takes
    minutes); ``reply_s``: the longest silence while a request is open (one prefill chunk on a large model)."""

    start_s: float = 600.0
    reply_s: float = 600.0


class _Child:
    """One launched child: its process (or thread), the parent ends of its lanes, its ready info."""

    def __init__(self, runner: Any, main: Any, side: Any, in_thread: bool) -> None:
        self.runner, self.main, self.side, self.in_thread = runner, main, side, in_thread
        self.info: Any = None
        self._dead = False
        self._lock = threading.Lock()
        # multiplexed lane (mux hosts): open requests by id, and whether the reader saw the child end
        self.calls: dict[int, "MuxCall"] = {}
        self.reader_gone: Optional["_Dead"] = None
        self.reader: Optional[threading.Thread] = None  # the mux lane's reader thread (``_demux``)

    def alive(self) -> bool:
        return not self._dead and self.runner.is_alive()

    def mark_dead(self) -> bool:
        """True the first time only (a death seen by both lanes is one crash)."""
        with self._lock:
            first, self._dead = not self._dead, True
            return first

    def exit_text(self) -> str:
        self.runner.join(5)
        if self.in_thread:
            return "its thread ended" if not self.runner.is_alive() else "it was stopped"
        code = self.runner.exitcode
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        """Stop it at once: SIGKILL a process; close the pipes of a thread (its next send fails)."""
        if self.in_thread:
            _close(self.main, self.side)
        elif self.runner.is_alive():
            self.runner.kill()

    def stop(self, timeout_s: float) -> None:
        """Ask it to close, wait ``timeout_s`` seconds, then kill it; close the pipes."""
        if self.runner.is_alive():
            for conn in (self.main, self.side):
                if conn is not None:
                    _send_quietly(conn, ("close",))
            self.runner.join(timeout_s)
            if self.runner.is_alive() and not self.in_thread:
                self.runner.kill()
                self.runner.join(timeout_s)
        # The reader must be done with ``main`` before it is closed: closing a pipe another thread is reading
        # frees its descriptor, the next pipe opened (another engine's) can get the same number, and the old
        # reader then reads that engine's messages (seen in CI: a new engine's "ready" was taken, and its
        # load failed with "the process died while loading"). It ends within one poll once the child is gone.
        reader = self.reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout_s + 2 * _POLL_S)
        _close(self.main, self.side)


def _send_quietly(conn: Any, msg: tuple) -> None:
    try:
        conn.send(msg)
    except (OSError, EOFError, ValueError):  # ValueError: already closed here
        pass


class ChildHost:
    """Parent-side handle on one child that serves ``target(*args)`` (a ``Handler``).

    ``name``: the process (or thread) name. ``target``: called in the child to build the handler; with a
    process it and ``args`` must be picklable (a module-level function). ``label``: how errors name the
    child ("the engine process"). ``model_path``: put on ``ModelLoadError``. ``side_lane``: open the second
    lane. ``in_thread``: run on threads of this process (see the module docstring). ``timeouts``:
    ``Timeouts``. ``on_crash``: called once per child that dies unasked (for crash counters).

    ``mux``: the main lane is multiplexed (the handler is a ``MuxHandler``; requests go through ``submit``).

    The child starts on ``start()`` or on the first request, and again on the request after it died."""

    def __init__(self, name: str, target: Callable[..., Handler], args: tuple = (), *, label: str = "",
                 model_path: Optional[str] = None, side_lane: bool = False, in_thread: bool = False,
                 timeouts: Timeouts = Timeouts(), on_crash: Optional[Callable[[], None]] = None,
                 mux: bool = False) -> None:
        self.mux = mux
        self._rids = itertools.count(1)
        self._send_lock = threading.Lock()
        self.name, self.target, self.args = name, target, args
        self.label = label or f"the {name} process"
        self.model_path, self.side_lane, self.in_thread = model_path, side_lane, in_thread
        self.timeouts, self.on_crash = timeouts, on_crash
        self._ctx = mp.get_context("spawn")
        self._cancel = self._ctx.RawValue(ctypes.c_int, 0)
        self._child: Optional[_Child] = None
        self._starting: Optional[_Child] = None
        self._closed = False
        self._start_lock = threading.Lock()
        self._side_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        child = self._child
        return child is not None and child.alive()

    @property
    def pid(self) -> Optional[int]:
        """The running child's process id (None for none, or for a thread)."""
        child = self._child
        return child.runner.pid if child is not None and not child.in_thread else None

    @property
    def info(self) -> Any:
        """The running child's ready info (None when none runs)."""
        child = self._child
        return child.info if child is not None else None

    def start(self) -> Any:
        """Start the child unless one is running; return its ready info. Blocks while the model loads (up to
        ``timeouts.start_s`` seconds). Raises ``ModelLoadError`` (the handler refused, the child died or timed
        out while loading, or ``close()`` aborted the load) or ``EngineCrashed`` after ``close()``."""
        with self._start_lock:
            child = self._child
            if child is not None and child.alive():
                return child.info
            if self._closed:
                raise EngineCrashed(f"{self.label} was closed")
            if child is not None:
                log.warning("%s is not running; starting a new one", self.label)
                self._child = None
                child.stop(0)
            child = self._starting = self._launch()
            try:
                child.info = self._await_ready(child)
            finally:
                self._starting = None
            if self._closed:  # closed while it loaded
                child.stop(0)
                raise ModelLoadError(f"{self.label} could not load the model: the load was aborted",
                                     path=self.model_path)
            self._child = child
            if self.mux:
                child.reader = threading.Thread(target=self._demux, args=(child,), name=f"{self.name}-demux",
                                                daemon=True)
                child.reader.start()
            return child.info

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the child: cancel what runs, ask it to close, wait ``timeout_s`` seconds, then kill it; a load
        in progress is aborted. The next request starts a new child."""
        self._cancel.value = 1
        starting = self._starting
        if starting is not None:
            starting.kill()
        child, self._child = self._child, None
        if child is not None:
            child.mark_dead()
            child.stop(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """``stop``, for good: later requests raise ``EngineCrashed``, a load in progress ``ModelLoadError``."""
        self._closed = True
        self.stop(timeout_s)

    def _launch(self) -> _Child:
        main_parent, main_child = self._ctx.Pipe()
        side_parent, side_child = self._ctx.Pipe() if self.side_lane else (None, None)
        if self.in_thread:
            runner: Any = threading.Thread(target=_run_handler, name=self.name, daemon=True, args=(
                self.target, self.args, main_child, side_child, self._cancel, lambda: None, self.mux))
        else:
            runner = self._ctx.Process(target=_child_main, name=self.name, daemon=True, args=(
                self.target, self.args, main_child, side_child, self._cancel, self.mux))
        runner.start()
        if not self.in_thread:  # the child has its own copies; ours must go for EOF to mean "it died"
            _close(main_child, side_child)
        return _Child(runner, main_parent, side_parent, self.in_thread)

    def _await_ready(self, child: _Child) -> Any:
        def refused(why: str) -> ModelLoadError:
            return ModelLoadError(f"{self.label} could not load the model: {why}", path=self.model_path)

        try:
            kind, payload = self._receive(child, child.main, self.timeouts.start_s)
        except _Dead as dead:
            if self._closed:
                raise refused("the load was aborted") from None
            if dead.timed_out:
                raise refused(f"it did not finish loading within {self.timeouts.start_s:.0f} s") from None
            raise refused(f"the process died while loading ({child.exit_text()})") from None
        if kind == "ready":
            return payload
        child.stop(5)
        if kind == "error":
            raise payload
        log.error("%s failed while loading:\n%s", self.label, payload)
        raise refused(str(ChildBug(payload)))

    # -- requests -------------------------------------------------------------------------------------
    def call(self, op: str, *args: Any) -> "Call":
        """Send a main-lane request and return it in flight (iterate it for its events). The caller
        serialises main-lane requests. Raises ``EngineCrashed`` / ``ModelLoadError`` (see ``start``)."""
        self.start()
        child = self._running()
        try:
            child.main.send((op, *args))
        except (OSError, EOFError) as exc:
            raise self._died(child, op, exc) from None
        return Call(self, child, op)

    def request(self, op: str, *args: Any) -> Any:
        """A main-lane request without events: its result. Raises the child's ``HearthError``, ``ChildBug``,
        ``EngineCrashed``."""
        if self.mux:
            return self.submit(op, *args).wait()
        return self.call(op, *args).wait()

    # -- the multiplexed lane ---------------------------------------------------------------------------
    def submit(self, op: str, *args: Any) -> "MuxCall":
        """Open a request on a multiplexed main lane (thread-safe; any number may be open at once) and return
        it in flight. Raises ``EngineCrashed`` / ``ModelLoadError`` (see ``start``)."""
        if not self.mux:
            raise ValueError(f"{self.label} has no multiplexed lane")
        self.start()
        child = self._running()
        rid = next(self._rids)
        call = MuxCall(self, child, op, rid)
        with child._lock:
            if child.reader_gone is not None:
                raise self._died(child, op, child.reader_gone)
            child.calls[rid] = call
        msg = ("_abort",) if op == "_abort" else ("submit", rid, op, *args)
        try:
            with self._send_lock:
                child.main.send(msg)
        except (OSError, EOFError) as exc:
            with child._lock:
                child.calls.pop(rid, None)
            raise self._died(child, op, exc) from None
        return call

    def _mux_send(self, child: _Child, msg: tuple) -> None:
        try:
            with self._send_lock:
                child.main.send(msg)
        except (OSError, EOFError, ValueError):
            pass  # the child is gone: the reader ends the open requests

    def _demux(self, child: _Child) -> None:
        """Reader thread of a multiplexed lane: hand each message to its request; when the child dies, or is
        silent for ``reply_s`` seconds while a request is open (it is then killed), end every open request."""
        conn = child.main
        heard = time.monotonic()
        dead = _Dead()
        while True:
            try:
                msg = conn.recv() if conn.poll(_POLL_S) else None
            except (EOFError, OSError, ValueError, TypeError):  # TypeError: closed under us (a handle of None)
                break
            now = time.monotonic()
            if msg is not None and msg[0] == "events":  # one step's events for several requests
                heard = now
                with child._lock:
                    calls = [(child.calls.get(ev[0]), ev) for ev in msg[1]]
                for call, ev in calls:
                    if call is not None:
                        call._inbox.put(("event", *ev))
                continue
            if msg is not None:
                heard = now
                with child._lock:
                    call = child.calls.get(msg[1]) if len(msg) > 1 else None
                    if call is not None and msg[0] != "event":
                        del child.calls[msg[1]]
                if call is not None:
                    call._inbox.put(msg)
                continue
            with child._lock:
                busy = bool(child.calls)
            if not child.runner.is_alive():
                break
            if not busy:
                heard = now
            elif now - heard > self.timeouts.reply_s:
                child.kill()
                dead = _Dead(timed_out=True)
                break
        with child._lock:
            child.reader_gone = dead
            calls, child.calls = list(child.calls.values()), {}
        for call in calls:
            call._inbox.put(("_dead", dead))

    def side(self, op: str, *args: Any) -> Any:
        """A side-lane request (thread-safe; does not wait for the main lane): its result. Raises like
        ``request``."""
        if not self.side_lane:
            raise ValueError(f"{self.label} has no side lane")
        self.start()
        with self._side_lock:
            child = self._running()
            try:
                child.side.send((op, *args))
                msg = self._receive(child, child.side, self.timeouts.reply_s)
            except (OSError, EOFError, _Dead) as exc:
                raise self._died(child, op, exc) from None
        return _unwrap(msg)

    def cancel(self) -> None:
        """Raise the cancel flag (what runs on the main lane stops at its next check)."""
        self._cancel.value = 1

    def clear_cancel(self) -> None:
        self._cancel.value = 0

    def crash_for_test(self) -> EngineCrashed:
        """Make the child abort as llama.cpp's GGML_ABORT does; returns the ``EngineCrashed`` it caused."""
        try:
            self.request("_abort")
        except EngineCrashed as exc:
            return exc
        raise AssertionError(f"{self.label} did not die")

    def _running(self) -> _Child:
        child = self._child
        if child is None:
            raise EngineCrashed(f"{self.label} was closed" if self._closed else f"{self.label} is not running")
        return child

    def _receive(self, child: _Child, conn: Any, timeout_s: float) -> tuple:
        """The next message on ``conn``. Raises ``_Dead`` when the child dies, or stays silent for ``timeout_s``
        seconds (it is then killed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if conn.poll(max(0.0, min(_POLL_S, deadline - time.monotonic()))):
                    return conn.recv()
            except (EOFError, OSError):
                raise _Dead() from None
            if not child.runner.is_alive() and not conn.poll(0):
                raise _Dead()
            if time.monotonic() >= deadline:
                child.kill()
                raise _Dead(timed_out=True)

    def _died(self, child: _Child, doing: str, dead: BaseException) -> EngineCrashed:
        """The error for a request whose child died (counted once per child through ``on_crash``)."""
        if self._closed:
            return EngineCrashed(f"{self.label} was closed")
        if child.mark_dead() and self.on_crash is not None:
            self.on_crash()
        if isinstance(dead, _Dead) and dead.timed_out:
            why = f"it did not answer within {self.timeouts.reply_s:.0f} s and was stopped"
        else:
            why = child.exit_text()
        doing = "a forced abort" if doing == "_abort" else doing
        return EngineCrashed(f"{self.label} died during {doing} ({why}); it restarts on the next request")


class _Dead(Exception):
    """Internal: the child of a lane is gone (or was stopped after ``timed_out``)."""

    def __init__(self, timed_out: bool = False) -> None:
        super().__init__("timed out" if timed_out else "gone")
        self.timed_out = timed_out


class Call:
    """One main-lane request in flight. Iterating yields each event's payload (a tuple); when the final reply
    arrives iteration ends and ``result`` holds it, or the child's error is raised (``HearthError``,
    ``ChildBug``; ``EngineCrashed`` if the child dies). ``open`` is True until then."""

    def __init__(self, host: ChildHost, child: _Child, op: str) -> None:
        self._host, self._child, self.op = host, child, op
        self.open = True
        self.result: Any = None

    def __iter__(self) -> Iterator[tuple]:
        while self.open:
            msg = self._next()
            if msg[0] == "event":
                yield msg[1:]
                continue
            self.open = False
            self.result = _unwrap(msg)

    def wait(self) -> Any:
        """Run to the end, dropping events; returns ``result``."""
        for _payload in self:
            pass
        return self.result

    def drain(self) -> None:
        """After a cancel: read and drop what is left of the reply, so the lane is quiet for the next request
        (its error, usually ``Cancelled``, is dropped; a dead child is recorded as crashed)."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the caller abandoned this request
            pass

    def _next(self) -> tuple:
        try:
            return self._host._receive(self._child, self._child.main, self._host.timeouts.reply_s)
        except _Dead as dead:
            self.open = False
            raise self._host._died(self._child, self.op, dead) from None


class MuxCall:
    """One request in flight on a multiplexed lane. Iterating yields each event's payload (a tuple, without the
    request id); when the final reply arrives iteration ends and ``result`` holds it, or the child's error is
    raised (``HearthError``, ``ChildBug``; ``EngineCrashed`` if the child dies). ``cancel()`` asks the child to
    stop this request only (any thread); the child still answers it (usually ``Cancelled``)."""

    def __init__(self, host: ChildHost, child: _Child, op: str, rid: int) -> None:
        self._host, self._child, self.op, self.rid = host, child, op, rid
        self._inbox: "queue.Queue[tuple]" = queue.Queue()
        self.open = True
        self.result: Any = None

    def __iter__(self) -> Iterator[tuple]:
        while self.open:
            msg = self._inbox.get()
            if msg[0] == "event":
                yield msg[2:]
                continue
            self.open = False
            if msg[0] == "_dead":
                raise self._host._died(self._child, self.op, msg[1])
            self.result = _unwrap((msg[0], *msg[2:]))

    def cancel(self) -> None:
        if self.open:
            self._host._mux_send(self._child, ("cancel", self.rid))

    def control(self, kind: str) -> bool:
        """Send ``(kind, rid)`` to the child's handler (``"stop_thinking"``; any thread). False when the request
        already ended."""
        if not self.open:
            return False
        self._host._mux_send(self._child, (kind, self.rid))
        return True

    def wait(self) -> Any:
        """Run to the end, dropping events; returns ``result``."""
        for _payload in self:
            pass
        return self.result

    def drain(self) -> None:
        """After a cancel: wait for the final reply and drop it (errors included)."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the caller abandoned this request
            pass


def _unwrap(msg: tuple) -> Any:
    kind = msg[0]
    if kind == "ok":
        return msg[1]
    if kind == "error":
        raise msg[1]
    if kind == "bug":
        raise ChildBug(msg[1])
    raise ChildBug(f"unexpected message from a child: {kind!r}")
