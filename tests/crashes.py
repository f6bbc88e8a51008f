"""Crashing a child for real, as llama.cpp does: the product has no crash hook, so tests kill the child's
process (``SIGKILL``, by its ``pid``) and wait until the host can see it is gone. (A scripted runtime on
threads ends its own serving loop instead: ``tests/fakes.py::FakeRuntime.crash_next``.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def kill(pid: int) -> None:
    """SIGKILL ``pid`` (a child process of this one)."""
    os.kill(pid, signal.SIGKILL)


def gone(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` has exited (gone, or a zombie nobody reaped yet) within ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def wait_dead(host, timeout_s: float = 10.0) -> bool:
    """True once ``host`` (a ``ChildHost``) no longer reports its child alive (what waitpid says: /proc may show
    the zombie leader while its other threads still exit)."""
    deadline = time.monotonic() + timeout_s
    while host.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    return not host.alive


def end_stopped(pids: list[int]) -> None:
    """Continue and kill every process a test stopped (``SIGSTOP``); one that is gone already is skipped."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break


@contextlib.contextmanager
def tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's ``size=``, e.g. ``"1m"``) mounted under ``tmp_path`` for a disk-full test
    and unmounted after it whatever happens; the test is skipped where it cannot be mounted (not root)."""
    import pytest

    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
