"""``ChildHost``: the parent's handle on one llama.cpp child process (the chat engine and the embedder both
run their model through it): spawn, the lanes, timeouts, crashes and restarts. Why a child, the wire protocol,
the lanes and the timeout policy: docs/engine.md ("The process host")."""

from __future__ import annotations

import ctypes
import itertools
import logging
import multiprocessing as mp
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from app.childhost.calls import Call, MuxCall, _Dead, _unwrap
from app.childhost.child import ChildBug, Handler, _child_main, _close, _run_handler
from app.childhost.watchdog import SIDE_READ, UNRESPONSIVE_S, Heartbeat, new_pulse
from app.errors import EngineCrashed, EngineUnresponsive, ModelLoadError

log = logging.getLogger(__name__)

_POLL_S = 0.5  # seconds between liveness checks while waiting for a reply


@dataclass(frozen=True)
class Timeouts:
    """Seconds a host waits. ``start_s``: spawn → "ready" (loading a large model from a slow disk takes
    minutes); ``reply_s``: the longest silence while a request is open (one prefill chunk on a large model);
    ``unresponsive_s``: the longest a child process may send no heartbeat (stopped or frozen; docs/engine.md,
    "Watchdog") before it is killed, None for no watchdog."""

    start_s: float = 600.0
    reply_s: float = 600.0
    unresponsive_s: Optional[float] = UNRESPONSIVE_S


class _Child:
    """One launched child: its process (or thread), the parent ends of its lanes, its ready info."""

    def __init__(self, runner: Any, main: Any, side: Any, in_thread: bool, pulse: Any,
                 unresponsive_s: Optional[float]) -> None:
        self.runner, self.main, self.side, self.in_thread = runner, main, side, in_thread
        self.beat, self.unresponsive_s = Heartbeat(pulse), unresponsive_s
        self.sent_side = 0  # requests sent on the side lane (against its read receipts)
        self.info: Any = None
        self._dead = False
        self._lock = threading.Lock()
        # multiplexed lane (mux hosts): open requests by id, and whether the reader saw the child end
        self.calls: dict[int, "MuxCall"] = {}
        self.reader_gone: Optional["_Dead"] = None
        self.reader: Optional[threading.Thread] = None  # the mux lane's reader thread (``_demux``)

    def alive(self) -> bool:
        return not self._dead and self.runner.is_alive() and not self.frozen()

    def frozen(self) -> bool:
        """No heartbeat for ``unresponsive_s`` seconds (a process stopped by SIGSTOP, or wedged)."""
        limit = self.unresponsive_s
        return limit is not None and not self.in_thread and self.beat.silent_s() > limit

    def unread(self, lane: int, sent: int) -> bool:
        """Whether the child never read request ``sent`` (a request id on a multiplexed lane, else the count
        of requests sent) on ``lane``: it cannot have crashed the child, and may go to the next one."""
        return self.beat.read(lane) < sent

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
    lane. ``in_thread``: run on threads of this process (no crash isolation, no spawn cost: for handlers that never
    load llama.cpp). ``timeouts``:
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
        pulse = new_pulse(self._ctx)
        if self.in_thread:
            runner: Any = threading.Thread(target=_run_handler, name=self.name, daemon=True, args=(
                self.target, self.args, main_child, side_child, self._cancel, self.mux, pulse))
        else:
            runner = self._ctx.Process(target=_child_main, name=self.name, daemon=True, args=(
                self.target, self.args, main_child, side_child, self._cancel, self.mux, pulse))
        runner.start()
        if not self.in_thread:  # the child has its own copies; ours must go for EOF to mean "it died"
            _close(main_child, side_child)
        return _Child(runner, main_parent, side_parent, self.in_thread, pulse, self.timeouts.unresponsive_s)

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
    def submit(self, op: str, *args: Any, deadline_s: Optional[float] = None) -> "MuxCall":
        """Open a request on a multiplexed main lane (thread-safe; any number may be open at once) and return
        it in flight. ``deadline_s``: seconds after which the request is not waited for any more while the
        child sends no heartbeat (docs/engine.md, "Watchdog"). Raises ``EngineCrashed`` / ``ModelLoadError``
        (see ``start``)."""
        if not self.mux:
            raise ValueError(f"{self.label} has no multiplexed lane")
        call = MuxCall(self, op, args, deadline_s)
        self._open(call)
        return call

    def _open(self, call: "MuxCall") -> None:
        """Send ``call`` to the child (starting it if needed) under a new request id; again to a new child,
        once, when the one it went to died before reading it."""
        for attempt in (0, 1):
            self.start()
            child = call._child = self._running()
            rid = call.rid = next(self._rids)
            with child._lock:
                gone: Optional[BaseException] = child.reader_gone
                if gone is None:
                    child.calls[rid] = call
            if gone is None:
                try:
                    with self._send_lock:
                        child.main.send(("submit", rid, call.op, *call.args))
                    return
                except (OSError, EOFError) as exc:
                    with child._lock:
                        child.calls.pop(rid, None)
                    gone = exc
            err = self._died(child, call.op, gone)
            if attempt:
                raise err from None

    def _mux_send(self, child: _Child, msg: tuple) -> None:
        try:
            with self._send_lock:
                child.main.send(msg)
        except (OSError, EOFError, ValueError):
            pass  # the child is gone: the reader ends the open requests

    def _demux(self, child: _Child) -> None:
        """Reader thread of a multiplexed lane: hand each message to its request; when the child dies, sends
        no heartbeat for ``unresponsive_s`` seconds, or is silent for ``reply_s`` seconds while a request is
        open (it is then killed), end every open request."""
        conn = child.main
        heard = time.monotonic()
        while True:
            try:
                msg = conn.recv() if conn.poll(_POLL_S) else None
            except (EOFError, OSError, ValueError, TypeError):  # TypeError: closed under us (a handle of None)
                dead = _Dead()
                break
            now = time.monotonic()
            if msg is not None:
                heard = now
                self._dispatch(child, msg)
                continue
            with child._lock:
                busy = bool(child.calls)
            if not busy:
                heard = now
            gone = self._quiet(child, now - heard)
            if gone is not None:
                dead = gone
                break
        if dead.unresponsive:
            self._died(child, "a wait for requests", dead)  # counted as a crash even with no request open
        with child._lock:
            child.reader_gone = dead
            calls, child.calls = list(child.calls.values()), {}
        for call in calls:
            call._inbox.put(("_dead", dead))

    def _dispatch(self, child: _Child, msg: tuple) -> None:
        """One message of a multiplexed lane to its request(s)."""
        if msg[0] == "events":  # one step's events for several requests
            with child._lock:
                calls = [(child.calls.get(ev[0]), ev) for ev in msg[1]]
            for call, ev in calls:
                if call is not None:
                    call._inbox.put(("event", *ev))
            return
        with child._lock:
            call = child.calls.get(msg[1]) if len(msg) > 1 else None
            if call is not None and msg[0] != "event":
                del child.calls[msg[1]]
        if call is not None:
            call._inbox.put(msg)

    def _quiet(self, child: _Child, silence_s: float) -> Optional["_Dead"]:
        """After a quiet poll: why the child is gone (it died; no heartbeat for ``unresponsive_s``, or
        ``silence_s`` past ``reply_s`` while a request is open: it is then killed), or None."""
        if not child.runner.is_alive():
            return _Dead()
        if child.frozen():
            log.warning("%s sent no heartbeat for %g s; killing it", self.label, self.timeouts.unresponsive_s)
            child.kill()
            return _Dead(unresponsive=True)
        if silence_s > self.timeouts.reply_s:
            child.kill()
            return _Dead(timed_out=True)
        return None

    def side(self, op: str, *args: Any) -> Any:
        """A side-lane request (thread-safe; does not wait for the main lane): its result; sent again to a new
        child, once, when the one it went to died before reading it. Raises like ``request``."""
        if not self.side_lane:
            raise ValueError(f"{self.label} has no side lane")
        for attempt in (0, 1):
            self.start()
            with self._side_lock:
                child = self._running()
                try:
                    child.side.send((op, *args))
                    child.sent_side += 1
                    msg = self._receive(child, child.side, self.timeouts.reply_s)
                    break
                except (OSError, EOFError, _Dead) as exc:
                    err = self._died(child, op, exc)
                    if attempt or not child.unread(SIDE_READ, child.sent_side):
                        raise err from None
        return _unwrap(msg)

    def cancel(self) -> None:
        """Raise the cancel flag (what runs on the main lane stops at its next check)."""
        self._cancel.value = 1

    def clear_cancel(self) -> None:
        self._cancel.value = 0

    def _running(self) -> _Child:
        child = self._child
        if child is None:
            raise EngineCrashed(f"{self.label} was closed" if self._closed else f"{self.label} is not running")
        return child

    def _receive(self, child: _Child, conn: Any, timeout_s: float) -> tuple:
        """The next message on ``conn``. Raises ``_Dead`` when the child dies, sends no heartbeat for
        ``unresponsive_s`` seconds or stays silent for ``timeout_s`` seconds (it is then killed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if conn.poll(max(0.0, min(_POLL_S, deadline - time.monotonic()))):
                    return conn.recv()
            except (EOFError, OSError):
                raise _Dead() from None
            if not child.runner.is_alive() and not conn.poll(0):
                raise _Dead()
            if child.frozen():
                child.kill()
                raise _Dead(unresponsive=True)
            if time.monotonic() >= deadline:
                child.kill()
                raise _Dead(timed_out=True)

    def _died(self, child: _Child, doing: str, dead: BaseException) -> EngineCrashed:
        """The error for a request whose child died (counted once per child through ``on_crash``)."""
        if self._closed:
            return EngineCrashed(f"{self.label} was closed")
        if child.mark_dead() and self.on_crash is not None:
            self.on_crash()
        if isinstance(dead, _Dead) and dead.unresponsive:
            return EngineUnresponsive(f"{self.label} stopped responding during {doing}: it sent no heartbeat "
                                      f"for {self.timeouts.unresponsive_s:g} s (stopped or frozen) and was killed; "
                                      "it restarts on the next request")
        if isinstance(dead, _Dead) and dead.timed_out:
            why = f"it did not answer within {self.timeouts.reply_s:.0f} s and was stopped"
        else:
            why = child.exit_text()
        return EngineCrashed(f"{self.label} died during {doing} ({why}); it restarts on the next request")

    def _late(self, call: "MuxCall", silent_s: float) -> EngineCrashed:
        """The error for a request past its deadline while the child sends no heartbeat (it is let go: the
        watchdog kills the child once ``unresponsive_s`` pass without one)."""
        with call._child._lock:
            call._child.calls.pop(call.rid, None)
        self._mux_send(call._child, ("cancel", call.rid))
        after = self.timeouts.unresponsive_s
        return EngineUnresponsive(f"{self.label} is not responding: its deadline ({call.deadline_s:g} s) passed "
                                  f"while it sent no heartbeat for {silent_s:.1f} s (stopped or frozen)"
                                  + (f"; it is killed after {after:g} s without one and restarts on the next "
                                     "request" if after is not None else ""))
