"""The child host's watchdog and read receipts without a model (docs/engine.md, "Watchdog"): toy children
stopped with SIGSTOP are found frozen and killed (mid-request and idle), a request past its deadline on a
stopped child ends without waiting for the watchdog, and a request the child died before reading goes to the
next child. The handlers live in this module: spawned children import it by name (as in test_process_host).

Every process a test stops is continued and killed in ``finally``."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from crashes import end_stopped, gone, kill, wait_dead

from app.childhost import ChildHost, Timeouts
from app.childhost.watchdog import BEATS, Heartbeat
from app.errors import EngineCrashed, EngineUnresponsive


class Plain:
    """A one-request-at-a-time handler: ``echo``, ``block`` (until cancelled); ``ping`` on the side lane."""

    def ready_info(self) -> dict:
        return {"pid": os.getpid()}

    def call(self, op, args, emit, cancelled):
        while op == "block" and not cancelled():
            time.sleep(0.01)
        return args

    def side(self, op, args):
        return ("pong", os.getpid())


class Mux:
    """A multiplexed handler: ``echo`` answers at once, ``block`` never answers."""

    def ready_info(self) -> dict:
        return {"pid": os.getpid()}

    def serve(self, inbox, send) -> None:
        while True:
            msg = inbox.get()
            if msg[0] == "close":
                return
            if msg[0] == "submit" and msg[2] == "echo":
                send(("ok", msg[1], msg[3:]))

    def side(self, op, args):
        return ("pong", os.getpid())


def make_plain() -> Plain:
    return Plain()


def make_mux() -> Mux:
    return Mux()


def _stop(host: ChildHost, stopped: list[int]) -> int:
    pid = host.pid
    os.kill(pid, signal.SIGSTOP)
    stopped.append(pid)
    return pid


def test_heartbeat_silence_counts_from_the_last_change_and_not_before_the_first_beat():
    pulse = [0, 0, 0]
    beat = Heartbeat(pulse)
    time.sleep(0.05)
    assert beat.silent_s() == 0.0  # no beat yet: the start timeout's business
    pulse[BEATS] = 1
    assert beat.silent_s() < 0.01
    time.sleep(0.1)
    assert 0.1 <= beat.silent_s() < 0.5
    pulse[BEATS] = 2
    assert beat.silent_s() < 0.01


def test_a_stopped_child_is_killed_mid_request_and_the_next_request_restarts_it():
    crashes: list = []
    h = ChildHost("hearth-test", make_plain, label="the toy", timeouts=Timeouts(60, 60, 1.0),
                  on_crash=lambda: crashes.append(1))
    stopped: list[int] = []
    try:
        h.start()
        time.sleep(0.3)  # a few beats: the watchdog is armed
        call = h.call("block")
        pid = _stop(h, stopped)
        t0 = time.monotonic()
        with pytest.raises(EngineUnresponsive, match="stopped responding during block: it sent no heartbeat for 1 s"):
            call.wait()
        assert time.monotonic() - t0 < 3.0
        assert not h.alive and gone(pid, 5) and crashes == [1]
        assert h.request("echo", 1) == (1,) and h.pid != pid
    finally:
        end_stopped(stopped)
        h.close()


def test_an_idle_stopped_engine_is_reported_not_alive_killed_and_counted():
    crashes: list = []
    h = ChildHost("hearth-test", make_mux, label="the toy", mux=True, timeouts=Timeouts(60, 60, 1.0),
                  on_crash=lambda: crashes.append(1))
    stopped: list[int] = []
    try:
        h.start()
        time.sleep(0.3)
        pid = _stop(h, stopped)
        assert h.alive
        assert wait_dead(h, 3.0), "a stopped child is still reported alive"
        assert gone(pid, 5) and crashes == [1]
        assert h.request("echo", 2) == (2,) and h.pid != pid
    finally:
        end_stopped(stopped)
        h.close()


def test_a_deadline_ends_a_request_on_a_stopped_child_before_the_watchdog_does():
    h = ChildHost("hearth-test", make_mux, label="the toy", mux=True, timeouts=Timeouts(60, 60, 30.0))
    stopped: list[int] = []
    try:
        h.start()
        time.sleep(0.3)
        _stop(h, stopped)
        t0 = time.monotonic()
        call = h.submit("block", deadline_s=1.0)
        with pytest.raises(EngineUnresponsive, match=r"not responding: its deadline \(1 s\) passed"):
            call.wait()
        assert 1.0 <= time.monotonic() - t0 < 2.5
        assert not call.open
    finally:
        end_stopped(stopped)
        h.close()


def test_a_healthy_child_past_a_deadline_is_waited_for():
    h = ChildHost("hearth-test", make_mux, label="the toy", mux=True)
    got: list = []

    def wait(call) -> None:
        try:
            got.append(call.wait())
        except EngineCrashed as exc:
            got.append(str(exc))

    try:
        call = h.submit("block", deadline_s=0.2)  # never answered: the toy has no scheduler to end it
        t = threading.Thread(target=wait, args=(call,), daemon=True)
        t.start()
        t.join(1.5)
        assert t.is_alive() and not got  # the child beats: it is busy, not frozen
    finally:
        h.close()
    t.join(5)
    assert got == ["the toy was closed"]


@pytest.mark.parametrize("lane", ["main", "side"])
def test_a_request_the_child_died_before_reading_goes_to_the_next_child(lane):
    crashes: list = []
    h = ChildHost("hearth-test", make_mux, label="the toy", mux=True, side_lane=True,
                  on_crash=lambda: crashes.append(1))
    stopped: list[int] = []
    try:
        h.start()
        pid = _stop(h, stopped)  # the request waits unread in its pipe
        got: list = []
        ask = (lambda: h.request("echo", 3)) if lane == "main" else (lambda: h.side("ping"))
        t = threading.Thread(target=lambda: got.append(ask()), daemon=True)
        t.start()
        time.sleep(0.3)
        kill(pid)  # the crash, before the child read it
        t.join(30)
        assert got and got[0] in ((3,), ("pong", h.pid)) and h.pid != pid
        assert crashes == [1]
    finally:
        end_stopped(stopped)
        h.close()
