"""``app.childhost.ChildHost`` with a toy handler (no model): the wire protocol, the side lane, cancel,
crashes and restarts, timeouts, start errors, SIGINT, a killed parent, the in-thread host and the thread
policy. The handler lives in this module: spawned children import it by name (pytest puts tests/ on
sys.path, and children inherit it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from crashes import gone, kill, wait_dead

from app.childhost import ChildBug, ChildHost, Timeouts, default_threads, threads
from app.errors import Cancelled, EngineCrashed, HearthError, InvalidRequest, ModelLoadError

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


class Toy:
    """A handler whose ops exercise every kind of reply."""

    def ready_info(self) -> dict:
        return {"pid": os.getpid()}

    def call(self, op, args, emit, cancelled):
        if op == "echo":
            return args
        if op == "count":
            for i in range(args[0]):
                emit("n", i)
            return "counted"
        if op == "fail":
            raise InvalidRequest("bad value", param="x")
        if op == "bug":
            raise ValueError("a bug in the handler")
        if op == "block":  # until cancelled, as a long generation
            while not cancelled():
                time.sleep(0.01)
            raise Cancelled("stopped")
        if op == "sleep":
            time.sleep(args[0])
            return "slept"
        if op == "exit":  # ends the handler's thread (or process) without a reply, as a crash does
            raise SystemExit(3)
        raise InvalidRequest(f"unknown op {op}")

    def side(self, op, args):
        if op == "ping":
            return ("pong", os.getpid(), threading.current_thread().name)
        raise InvalidRequest(f"unknown side op {op}")


def make_toy(mode: str = "ok") -> Toy:
    if mode == "refuse":
        raise ModelLoadError("no such model", path="m.gguf")
    if mode == "bug":
        raise RuntimeError("a bug in the loader")
    if mode == "slow":  # a load that never ends by itself
        time.sleep(3600)
    return Toy()


@pytest.fixture
def crashes() -> list:
    return []


@pytest.fixture
def host(crashes):
    h = ChildHost("hearth-test", make_toy, label="the toy", side_lane=True, on_crash=lambda: crashes.append(1))
    yield h
    h.close()


def test_events_results_known_errors_and_bugs(host):
    info = host.start()
    assert info["pid"] == host.pid != os.getpid()
    assert host.request("echo", 1, "two") == (1, "two")
    call = host.call("count", 3)
    assert list(call) == [("n", 0), ("n", 1), ("n", 2)] and call.result == "counted" and not call.open
    with pytest.raises(InvalidRequest) as ei:
        host.request("fail")
    assert ei.value.param == "x"  # a known error crosses as itself
    with pytest.raises(ChildBug) as bug:
        host.request("bug")
    assert not isinstance(bug.value, HearthError)  # a bug stays a bug
    assert "ValueError: a bug in the handler" in str(bug.value)
    assert "Traceback" in bug.value.child_traceback and "def call" not in str(bug.value)
    assert host.request("echo", "still serving") == ("still serving",)


def test_side_lane_answers_while_the_main_lane_runs_then_cancel(host):
    host.start()
    call = host.call("block")
    got = []
    t = threading.Thread(target=_wait_cancelled, args=(call, got))
    t.start()
    pong, pid, thread = host.side("ping")
    assert (pong, pid) == ("pong", host.pid) and thread == "side-lane"
    host.cancel()
    t.join(5)
    assert got == ["cancelled"]
    host.clear_cancel()
    assert host.request("echo", 1) == (1,)


def _wait_cancelled(call, got: list) -> None:
    try:
        call.wait()
    except Cancelled:
        got.append("cancelled")


def test_a_crash_names_the_signal_counts_once_and_restarts(host, crashes):
    first = host.start()["pid"]
    call = host.call("block")  # runs until cancelled: only the crash can end it
    kill(first)  # as llama.cpp's abort ends the process mid-request
    with pytest.raises(EngineCrashed) as ei:
        call.wait()
    assert "the toy died during block (killed by signal SIGKILL)" in str(ei.value)
    assert crashes == [1] and not host.alive
    assert host.request("echo", 1) == (1,) and host.pid != first  # a fresh child
    second = host.pid
    kill(second)  # died while idle: the next request starts another
    assert wait_dead(host)
    assert host.side("ping")[1] not in (first, second)


def test_a_silent_child_is_killed_after_the_reply_timeout():
    h = ChildHost("hearth-test", make_toy, label="the toy", timeouts=Timeouts(start_s=60, reply_s=1))
    try:
        with pytest.raises(EngineCrashed, match="did not answer within 1 s"):
            h.request("block")  # never answers: only the timeout ends it
        assert not h.alive
        assert h.request("sleep", 0) == "slept"
    finally:
        h.close()


@pytest.mark.parametrize("mode,words", [("refuse", "no such model"), ("bug", "a bug in the loader")])
def test_start_errors_are_model_load_errors(mode, words):
    h = ChildHost("hearth-test", make_toy, (mode,), label="the toy", model_path="m.gguf")
    try:
        with pytest.raises(ModelLoadError, match=words) as ei:
            h.start()
        assert ei.value.path == "m.gguf"
    finally:
        h.close()


def test_start_timeout_and_close_abort_a_load():
    h = ChildHost("hearth-test", make_toy, ("slow",), label="the toy", timeouts=Timeouts(start_s=1))
    with pytest.raises(ModelLoadError, match="did not finish loading within 1 s"):
        h.start()
    h.close()
    h = ChildHost("hearth-test", make_toy, ("slow",), label="the toy", timeouts=Timeouts(start_s=60))
    errors: list = []
    t = threading.Thread(target=lambda: _catch(h.start, errors))
    t.start()
    time.sleep(1.0)
    h.close()
    t.join(10)  # the load never ends by itself: only close() ends it
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ModelLoadError) and "aborted" in str(errors[0])
    with pytest.raises(EngineCrashed, match="closed"):
        h.request("echo")


def _catch(fn, errors: list) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        errors.append(exc)


def test_children_ignore_sigint(host):
    host.start()
    os.kill(host.pid, signal.SIGINT)  # Ctrl+C in a terminal reaches the whole process group
    time.sleep(0.3)
    assert host.alive and host.request("echo", "here") == ("here",)


_PARENT = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from app.childhost import ChildHost
from test_process_host import make_toy

h = ChildHost("hearth-test", make_toy)
h.start()
print(h.pid, flush=True)
h.request("sleep", 1.5)  # the parent is killed while this runs; the reply meets a closed pipe
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_the_child_of_a_killed_parent_exits_quietly(tmp_path):
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as f:
        parent = subprocess.Popen([sys.executable, "-c", _PARENT], cwd=REPO, stdout=subprocess.PIPE, stderr=f)
    child = None
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), err.read_text()
        child = int(line)
        time.sleep(0.3)
        parent.kill()
        parent.wait(10)
        assert gone(child, 5), "the child outlived its parent"
        time.sleep(2.0)  # past the moment its reply would have been written
        assert err.read_text() == ""
    finally:
        parent.kill()
        parent.wait(10)
        if child is not None and not gone(child, 0):
            kill(child)


# "exit" ends the handler's thread with SystemExit, which pytest reports as an unhandled thread exception
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_in_thread_host_speaks_the_same_protocol(crashes):
    h = ChildHost("hearth-test", make_toy, label="the toy", side_lane=True, in_thread=True,
                  on_crash=lambda: crashes.append(1))
    try:
        assert h.start()["pid"] == os.getpid() and h.pid is None
        assert list(h.call("count", 2)) == [("n", 0), ("n", 1)]
        assert h.side("ping")[2] == "side-lane"
        with pytest.raises(ChildBug, match="a bug in the handler"):
            h.request("bug")
        with pytest.raises(EngineCrashed, match="its thread ended"):
            h.request("exit")  # ends the handler's thread, not this process
        assert crashes == [1]
        assert h.request("echo", 1) == (1,)
    finally:
        h.close()


@pytest.mark.parametrize("cpus,foreground,background", [(1, 1, 1), (2, 2, 1), (4, 4, 2), (8, 4, 2), (16, 8, 4)])
def test_one_thread_policy(monkeypatch, cpus, foreground, background):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda _pid: set(range(cpus)), raising=False)
    assert default_threads() == foreground
    assert default_threads(background=True) == background


def test_a_child_bug_logged_in_the_parent_shows_the_child_traceback():
    """A soak's 500 logged only "ChildBug: ValueError: NULL pointer access": not where in the child."""
    import traceback

    from app.childhost.child import ChildBug

    text = ('Traceback (most recent call last):\n  File "sampling.py", line 63, in row\n'
            "ValueError: NULL pointer access\n")
    bug = ChildBug(text)
    assert str(bug) == "ValueError: NULL pointer access" and bug.child_traceback == text
    if hasattr(bug, "add_note"):
        assert 'File "sampling.py", line 63' in "".join(traceback.format_exception(bug))
