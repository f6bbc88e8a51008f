"""The requests a ``ChildHost`` has in flight: ``Call`` (the one-request-at-a-time lane) and ``MuxCall`` (the
multiplexed lane). On the multiplexed lane a request the child died before reading goes to the next child,
once, and a request past its deadline while the child sends no heartbeat is not waited for (docs/engine.md,
"Watchdog")."""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

from app.childhost.child import ChildBug
from app.childhost.watchdog import BEAT_S, MAIN_READ, STALE_S

if TYPE_CHECKING:
    from app.childhost.host import ChildHost

log = logging.getLogger(__name__)


class _Dead(Exception):
    """Internal: the child of a lane is gone (or was stopped after ``timed_out``, or killed as
    ``unresponsive``)."""

    def __init__(self, timed_out: bool = False, unresponsive: bool = False) -> None:
        super().__init__("timed out" if timed_out else "unresponsive" if unresponsive else "gone")
        self.timed_out, self.unresponsive = timed_out, unresponsive


class _Request:
    """What ``Call`` and ``MuxCall`` share: iterating yields each event's payload (a tuple); when the final
    reply arrives iteration ends and ``result`` holds it, or the child's error is raised. ``open`` is True until
    then. A subclass's ``_next`` returns the next message as ``(kind, *payload)``."""

    open: bool
    result: Any

    def __iter__(self) -> Iterator[tuple]:
        while self.open:
            msg = self._next()
            if msg[0] == "event":
                yield msg[1:]
                continue
            self.open = False
            self.result = _unwrap(msg)

    def _next(self) -> tuple:
        raise NotImplementedError

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


class Call(_Request):
    """One main-lane request in flight. Iterating yields each event's payload (a tuple); when the final reply
    arrives iteration ends and ``result`` holds it, or the child's error is raised (``HearthError``,
    ``ChildBug``; ``EngineCrashed`` if the child dies). ``open`` is True until then."""

    def __init__(self, host: ChildHost, child: Any, op: str) -> None:
        self._host, self._child, self.op = host, child, op
        self.open = True
        self.result = None

    def _next(self) -> tuple:
        try:
            return self._host._receive(self._child, self._child.main, self._host.timeouts.reply_s)
        except _Dead as dead:
            self.open = False
            raise self._host._died(self._child, self.op, dead) from None


class MuxCall(_Request):
    """One request in flight on a multiplexed lane. Iterating yields each event's payload (a tuple, without the
    request id); when the final reply arrives iteration ends and ``result`` holds it, or the child's error is
    raised (``HearthError``, ``ChildBug``; ``EngineCrashed`` if the child dies, or sends no heartbeat past
    ``deadline_s``). A request the child died before reading goes to a new child (once). ``cancel()`` asks the
    child to stop this request only (any thread); the child still answers it (usually ``Cancelled``)."""

    def __init__(self, host: ChildHost, op: str, args: tuple, deadline_s: Optional[float] = None) -> None:
        self._host, self.op, self.args, self.deadline_s = host, op, args, deadline_s
        self._child: Any = None  # set when sent (``ChildHost._open``)
        self.rid = 0
        self._due = None if deadline_s is None else time.monotonic() + deadline_s
        self._inbox: "queue.Queue[tuple]" = queue.Queue()
        self._resent = False
        self.open = True
        self.result = None

    def _next(self) -> tuple:
        """The next message without its request id; a death before the child read the request sends it again
        (``_again``) and waits on."""
        while True:
            msg = self._get()
            if msg[0] == "_dead" and self._again(msg[1]):
                continue
            return (msg[0], *msg[2:])

    def _get(self) -> tuple:
        """The next message for this request; past the deadline, ``EngineCrashed`` once the child has sent no
        heartbeat for ``STALE_S`` seconds."""
        while self._due is not None:
            try:
                return self._inbox.get(timeout=BEAT_S)
            except queue.Empty:
                pass
            silent = self._child.beat.silent_s()
            if time.monotonic() >= self._due and silent >= STALE_S:
                self.open = False
                raise self._host._late(self, silent)
        return self._inbox.get()

    def _again(self, dead: "_Dead") -> bool:
        """The child died: True when this request went to a new one (the old one never read it, and it was
        not sent again before); else raises the crash."""
        child, host = self._child, self._host
        err = host._died(child, self.op, dead)
        if self._resent or host._closed or not child.unread(MAIN_READ, self.rid):
            self.open = False
            raise err
        self._resent = True
        log.warning("%s died before it read request %d; sending it to a new one", host.label, self.rid)
        try:
            host._open(self)
        except Exception:
            self.open = False
            raise
        return True

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


def _unwrap(msg: tuple) -> Any:
    kind = msg[0]
    if kind == "ok":
        return msg[1]
    if kind == "error":
        raise msg[1]
    if kind == "bug":
        raise ChildBug(msg[1])
    raise ChildBug(f"unexpected message from a child: {kind!r}")
