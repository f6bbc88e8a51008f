"""Server processes the load bench starts, restarts and stops itself: llama.cpp's ``llama-server``
(``benchmarks.peer``) and Hearth as ``hearth serve`` (``benchmarks.load_bench``).

``ManagedServer(argv, env, url)`` spawns ``argv`` in its own process group (output to a log file), waits until
``GET url/health`` answers 200, and stops the whole group (SIGTERM, then SIGKILL) on ``stop()`` or on leaving
its ``with`` block, whatever happened (``hearth serve`` gets SIGTERM alone first, so that it closes its
engine processes itself). ``restart()`` stops it and starts the same command again (same port,
same environment, so the same data folder): the restart of the ``agent`` workload.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

HEALTH_POLL_S = 0.025  # how often the health check is polled while a server starts


class ServerStartError(Exception):
    """The server exited before it was ready, or was not ready in time: one line with its log's tail."""


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET url/health`` answers 200 (False for 503 while a model loads, or nothing listening)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def tail(path: Path, n: int = 8) -> str:
    """The last ``n`` non-blank lines of a log file, joined with `` | `` ("" when unreadable)."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-n:] if line.strip())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0, leader_only: bool = False) -> None:
    """Stop ``proc`` and its process group; never raises. SIGTERM to the whole group (``leader_only``: to
    ``proc`` alone, which then stops its own children, as ``kill PID`` does), up to ``grace_s`` seconds for
    ``proc`` to exit and then for the rest of the group, then SIGKILL to whatever of the group is left."""
    pgid = proc.pid  # started with start_new_session: its own group
    if proc.poll() is None:
        try:
            if leader_only:
                proc.send_signal(signal.SIGTERM)
            else:
                os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + (grace_s if proc.poll() is not None else 0.0)
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _group_alive(pgid) or proc.poll() is None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass


class ManagedServer:
    """One server process the benchmark owns. ``argv``: the command; ``env``: its whole environment (None:
    this process's); ``url``: ``http://host:port`` it listens on; ``log_path``: where its output goes
    (appended across restarts); ``name``: for messages. ``proc`` is the running ``Popen`` (None before
    ``start``). ``leader_only_term``: ``stop`` sends SIGTERM to the process alone, which then closes its
    children itself, instead of to the whole group (``hearth serve``: a group SIGTERM would kill its engine
    process before the server closes it, losing what it had not yet written)."""

    def __init__(self, name: str, argv: Sequence[str], url: str, log_path: Any, env: Optional[Mapping[str, str]]
                 = None, ready_timeout_s: float = 120.0, cwd: Any = None, leader_only_term: bool = False) -> None:
        self.name, self.argv, self.url = name, [str(a) for a in argv], url
        self.log, self.env, self.ready_timeout_s, self.cwd = Path(log_path), env, ready_timeout_s, cwd
        self.leader_only_term = leader_only_term
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    @property
    def pid(self) -> Optional[int]:
        return None if self.proc is None else self.proc.pid

    def start(self) -> dict[str, float]:
        """Spawn the command and wait for ``/health`` to answer 200. Returns ``{"started_s", "ready_s"}``:
        ``time.perf_counter()`` just before the process was spawned and when the health check first answered
        200 (polled every ``HEALTH_POLL_S`` s, so ready is late by at most that). Raises ``ServerStartError``
        when it exits first or is not ready within ``ready_timeout_s`` (the process group is stopped)."""
        with open(self.log, "ab") as out:
            started = time.perf_counter()
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=None if self.env is None else dict(self.env), cwd=self.cwd,
                                         start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + self.ready_timeout_s
        try:
            while not healthy(self.url):
                if self.proc.poll() is not None:
                    raise ServerStartError(f"{self.name} exited with status {self.proc.returncode} before it was "
                                           f"ready (log {self.log}: {tail(self.log)})")
                if time.monotonic() > deadline:
                    raise ServerStartError(f"{self.name} not ready on {self.url} after {self.ready_timeout_s:g} s "
                                           f"(log {self.log}: {tail(self.log)})")
                time.sleep(HEALTH_POLL_S)
        except BaseException:
            stop_group(self.proc)
            raise
        return {"started_s": started, "ready_s": time.perf_counter()}

    def stop(self, grace_s: float = 10.0) -> float:
        """Stop the process group (``stop_group``); returns the seconds it took (0 when not running)."""
        if self.proc is None:
            return 0.0
        t0 = time.perf_counter()
        stop_group(self.proc, grace_s, self.leader_only_term)
        return time.perf_counter() - t0

    def restart(self) -> dict[str, float]:
        """``stop()`` then ``start()``: a new process with the same command and environment. Returns
        ``start()``'s stamps plus ``stop_s`` (seconds the old process took to exit)."""
        stopped = self.stop()
        t = self.start()
        t["stop_s"] = stopped
        return t

    def __enter__(self) -> "ManagedServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
