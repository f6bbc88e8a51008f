"""Bridges between the blocking engine stream and the event loop, and client-disconnect detection.

The reasoning: docs/server.md, 'app/server/pump.py'.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable

from app.errors import Cancelled
from app.protocol.types import Done

log = logging.getLogger(__name__)

_END = object()


class Pump:
    """Runs ``generation`` (an iterable of events with ``cancel()`` and ``close()``) in a thread."""

    def __init__(self, generation: Any) -> None:
        self._gen = generation
        self._loop = asyncio.get_running_loop()
        self._q: asyncio.Queue = asyncio.Queue()
        self._stop = threading.Event()
        self.finished = False
        self._thread = threading.Thread(target=self._run, name="hearth-http-generation", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for ev in self._gen:
                self._put(ev)
                if self._stop.is_set():
                    break
        except BaseException as exc:  # noqa: BLE001 - every error crosses to the loop as an object
            self._put(exc)
        finally:
            try:
                self._gen.close()  # no-op when finished; otherwise cancel + drain the engine
            except Exception:  # noqa: BLE001
                log.exception("closing a generation failed")
            self._put(_END)

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._q.put_nowait, item)
        except RuntimeError:  # the loop is gone (server shut down): nobody is listening
            self._stop.set()

    async def next(self) -> Any:
        """The next event; raises the engine's error, or ``Cancelled`` when the stream was stopped."""
        if self.finished:
            raise Cancelled("the generation has ended")
        item = await self._q.get()
        if item is _END:
            self.finished = True
            raise Cancelled("the generation was cancelled")
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if isinstance(item, Done):
            self.finished = True
        return item

    def stop(self) -> None:
        """Cancel the generation (any thread; idempotent; a no-op once it has finished)."""
        if not self.finished and not self._stop.is_set():
            self._stop.set()
            self._gen.cancel()


class DisconnectWatcher:
    """Watches ``receive`` for ``http.disconnect``; then calls ``on_disconnect`` once and stops the pumps."""

    def __init__(self, receive: Callable, on_disconnect: Callable[[], None] | None = None) -> None:
        self.gone = False
        self._pump: Pump | None = None
        self._on_disconnect = on_disconnect
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Callable) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001 - a broken channel means the client is gone too
            pass
        self.gone = True
        pump = self._pump
        if pump is not None and not pump.finished:
            if self._on_disconnect:
                self._on_disconnect()
            pump.stop()

    def track(self, pump: Pump) -> None:
        """Make ``pump`` the generation to stop if the client leaves (one runs at a time per request)."""
        self._pump = pump
        if self.gone:
            pump.stop()

    def close(self) -> None:
        self._task.cancel()
