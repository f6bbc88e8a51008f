"""The connection to a remote: one HTTP exchange whose socket another thread can shut down (``_Http``), the
slots that bound the requests forwarded at once (``_Slots``), and the reason of a failed connection.

``http.client`` on a thread per generation, not ``httpx`` (a test dependency only): a stream needs one
blocking reader that ``cancel()`` can wake at once with ``socket.shutdown`` (docs/remote.md)."""

from __future__ import annotations

import heapq
import http.client
import itertools
import socket
import ssl
import threading
from typing import Any, Optional
from urllib.parse import urlsplit

from app.errors import QueueFull


class _Http:
    """One HTTP exchange with the remote whose socket another thread may shut down (``abort``)."""

    def __init__(self, base: str, connect_timeout_s: float, read_timeout_s: float) -> None:
        p = urlsplit(base)
        self.https = p.scheme == "https"
        self.host, self.port = p.hostname or "", p.port or (443 if self.https else 80)
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.conn: Optional[http.client.HTTPConnection] = None
        self.sock: Optional[socket.socket] = None
        self.aborted = False

    def open(self, method: str, path: str, body: Optional[bytes],
             headers: dict[str, str]) -> http.client.HTTPResponse:
        """Connect and send; returns the response (headers read). Raises ``OSError`` kinds (classified by the
        caller): ``ConnectionRefusedError``, ``socket.gaierror``, ``TimeoutError``..."""
        if self.https:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.connect_timeout_s, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout_s)
        self.conn = conn
        conn.connect()
        if self.aborted:
            raise ConnectionAbortedError("cancelled")
        assert conn.sock is not None
        # Kept here: http.client drops conn.sock once a response that ends at close (HTTP/1.0) is read.
        self.sock = conn.sock
        self.sock.settimeout(self.read_timeout_s)
        conn.request(method, path, body=body, headers=headers)
        return conn.getresponse()

    def abort(self) -> None:
        """Shut the socket down now (any thread): a blocked read returns, and the remote sees the client
        leave."""
        self.aborted = True
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.sock is not None:
            self.sock.close()


# ------------------------------------------------------------------------------------------------------
# slots: n_parallel requests forwarded at once, the rest wait here, highest priority first
# ------------------------------------------------------------------------------------------------------
class _Slots:
    def __init__(self, n: int, max_queue: int) -> None:
        self.n, self.max_queue = n, max_queue
        self.busy = 0
        self._waiting: list[tuple[int, int]] = []  # heap of (-priority, ticket)
        self._tickets = itertools.count()
        self._cond = threading.Condition()

    def enter(self) -> int:
        """A ticket, or ``QueueFull`` when every slot is busy and ``max_queue`` requests already wait."""
        with self._cond:
            if self.busy >= self.n and len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are already waiting for the remote engine "
                                f"({self.busy} running)", 2.0)
            return next(self._tickets)

    def acquire(self, ticket: int, priority: int, cancelled: Any) -> bool:
        """Wait for a slot (False when ``cancelled()`` became true first)."""
        key = (-priority, ticket)
        with self._cond:
            heapq.heappush(self._waiting, key)
            try:
                while not (self.busy < self.n and self._waiting[0] == key):
                    if cancelled():
                        return False
                    self._cond.wait(0.05)
                self.busy += 1
                return True
            finally:
                self._waiting.remove(key)
                heapq.heapify(self._waiting)
                self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self.busy -= 1
            self._cond.notify_all()

    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the server running, and on that port?)"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror or exc})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason or exc})"
    if isinstance(exc, http.client.IncompleteRead):
        return "the connection closed before the chunk ended"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the remote closed the connection"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
