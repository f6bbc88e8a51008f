"""The command verifier: a program run (no shell) in a fresh temporary directory with the answer on stdin,
in its own process group, killed as a whole at its timeout; only the tail of its output is kept. Not a
sandbox: the API refuses it unless the caller allows commands."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from app.engine.policies.checks import NO_ANSWER, Verdict

MAX_COMMAND_TIMEOUT_S = 60.0
COMMAND_OUTPUT_TAIL = 2000  # bytes of a command's output kept for its reason


@dataclass(frozen=True)
class CommandCheck:
    """``{"command": [argv...], "timeout_s": 10, "on": "answer" | "text"}``: runs ``argv`` (no shell) in a
    fresh temporary directory with the answer (default) or the text on stdin, UTF-8; accepted iff it exits 0
    within ``timeout_s`` seconds. The command runs in its own process group (session), killed as a whole
    (SIGKILL) at the timeout and after it exits, so a forked child cannot outlive the check (one that starts
    its own session can). Output is read as it comes and only its last ``COMMAND_OUTPUT_TAIL`` bytes are kept
    for the reason. This is *not* a sandbox: the command, and any model code it runs, has the person's
    rights; the API refuses it unless the caller allows commands (``parse_self_consistency``)."""

    argv: tuple[str, ...]
    timeout_s: float = 10.0
    on: str = "answer"

    def verify(self, answer: str | None, text: str) -> Verdict:
        target = answer if self.on == "answer" else text
        if target is None:
            return NO_ANSWER
        with tempfile.TemporaryDirectory(prefix="hearth-verify-") as cwd:
            return _run_command(self.argv, target.encode("utf-8"), cwd, self.timeout_s)

    def to_api(self) -> dict:
        return {"command": list(self.argv), "timeout_s": self.timeout_s, "on": self.on}


def _run_command(argv: Sequence[str], stdin: bytes, cwd: str, timeout_s: float) -> Verdict:
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=os.name == "posix")
    except OSError as exc:
        return Verdict(False, f"cannot run {argv[0]!r}: {exc.strerror or exc}")
    tail: deque[bytes] = deque()
    threads = [threading.Thread(target=_feed, args=(proc, stdin), daemon=True),
               threading.Thread(target=_drain, args=(proc, tail), daemon=True)]
    for t in threads:
        t.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _kill_group(proc)
        for t in threads:
            t.join(timeout=2.0)
    output = b"".join(tail)[-COMMAND_OUTPUT_TAIL:].decode("utf-8", "replace").strip()
    said = f": {output[-300:]}" if output else ""
    if code is None:
        return Verdict(False, f"the command timed out after {timeout_s:g} s (killed){said}")
    if code == 0:
        return Verdict(True, f"the command exited 0{said}")
    how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
    return Verdict(False, f"the command {how}{said}")


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:  # it exited (or closed stdin) without reading everything
        pass


def _drain(proc: subprocess.Popen, tail: deque) -> None:
    kept = 0
    for chunk in iter(lambda: proc.stdout.read1(4096), b""):
        tail.append(chunk)
        kept += len(chunk)
        while kept - len(tail[0]) >= COMMAND_OUTPUT_TAIL:
            kept -= len(tail.popleft())
    proc.stdout.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)  # the session's group: its pgid is the leader's pid
        else:  # pragma: no cover - Windows
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
