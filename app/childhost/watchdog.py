"""The watchdog of a hosted child (docs/engine.md, "Watchdog"): a few counters in shared memory per child.
The child's heartbeat thread bumps one every ``BEAT_S`` seconds, whatever its main thread computes (llama.cpp
releases the GIL); a stopped (SIGSTOP) or wedged process bumps none, and the parent's ``Heartbeat`` says for
how long. The child's lane readers write read receipts, so the parent knows whether a dead child ever read a
request (one it never read cannot have crashed it, and is sent again to the next child)."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

BEAT_S = 0.25  # seconds between two heartbeats of a child
STALE_S = 1.0  # heartbeats silent this long: a request past its deadline is not waited for any more
UNRESPONSIVE_S = 10.0  # default ``Timeouts.unresponsive_s``: no heartbeat this long and the child is killed

BEATS, MAIN_READ, SIDE_READ = 0, 1, 2  # the counters of a pulse


def new_pulse(ctx: Any) -> Any:
    """The counters one child shares with its parent (a lock-free ``RawArray``: one writer per counter, and
    nothing for the resource tracker to report when a parent is killed)."""
    return ctx.RawArray(ctypes.c_longlong, 3)


def start_heartbeat(pulse: Any, interval_s: float = BEAT_S) -> None:
    """In the child: bump ``pulse[BEATS]`` every ``interval_s`` seconds from a daemon thread."""

    def beat() -> None:
        while True:
            pulse[BEATS] += 1
            time.sleep(interval_s)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


class Heartbeat:
    """The parent's view of one child's heartbeats (thread-safe)."""

    def __init__(self, pulse: Any) -> None:
        self.pulse = pulse
        self._seen = -1
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def silent_s(self) -> float:
        """Seconds since this parent last saw the beat count change; 0.0 until the first beat (the start
        timeout covers a child that never got that far) and for a child on threads (it has no heartbeat)."""
        with self._lock:
            beats, now = self.pulse[BEATS], time.monotonic()
            if beats != self._seen:
                self._seen, self._at = beats, now
            return 0.0 if beats == 0 else now - self._at

    def read(self, lane: int) -> int:
        """The child's read receipt on ``lane`` (``MAIN_READ``: the last request id read on a multiplexed lane,
        else the requests read; ``SIDE_READ``: side requests read)."""
        return int(self.pulse[lane])
