"""Issue 27: "a test that drives the real window (xcb under Xvfb when present, else offscreen) through a first
hour: first start on an empty data folder, chats, edit and regenerate, a dropped document attached to one chat
only, a restart; after every step the window fits the screen and no text is clipped in the status strip or
titles."

The walk and its checks (``clipped(window) -> list[str]``, ``misfit``) are in ``tests/first_hour_walk.py``, so
that a child process can run them: this suite's process is offscreen, and Qt picks its platform once per
process. With ``Xvfb`` on PATH and Qt's xcb plugin able to open a display (``app.doctor.qt.probe``: a machine
without libxcb-icccm4 and friends cannot), the walk runs as a
child on a fresh Xvfb screen of ``XVFB_SCREEN`` with the xcb platform, killed with everything it started
whatever happens; else it runs here, offscreen. Either way it reports every step's failures as JSON and this
test asserts on the report, all steps at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.first_hour_walk import clipped, misfit, walk  # noqa: F401 - clipped and misfit: the checks, named here
from tests.test_ui_window import home_with_model  # noqa: F401 - a fixture

pytestmark = [pytest.mark.model, pytest.mark.gui]

REPO = Path(__file__).resolve().parents[1]
XVFB_SCREEN = "1366x768x24"  # the smallest common laptop screen
CHILD_TIMEOUT_S = 900  # the whole walk in the child: two model loads, four short answers, an indexing
MAX_TOKENS = 16  # short answers keep the walk quick; no check reads what they say
STEPS = 9  # 1 … 7 with 6b, and the last close


@contextlib.contextmanager
def xvfb(screen: str) -> Iterator[str]:
    """A fresh Xvfb on a free display (Xvfb picks it: ``-displayfd``) with one ``screen`` ("WxHxDEPTH");
    yields its ``DISPLAY``, ended afterwards whatever happens."""
    read, write = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", screen, "-nolisten", "tcp"],
                            pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 15)
        number = os.read(read, 32).decode().strip() if ready else ""
        if not number.isdigit():
            raise RuntimeError(f"Xvfb gave no display within 15 s (exit status {proc.poll()})")
        yield f":{number}"
    finally:
        os.close(read)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def xcb_env(display: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WAYLAND_DISPLAY"}
    return {**env, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb", "HEARTH_HOME": str(home)}


def run_child(env: dict[str, str], home: Path, files: Path, out: Path) -> dict[str, Any]:
    """``python -m tests.first_hour_walk`` in its own session under ``env``; its report, with ``left`` naming
    processes it left (they are killed). The whole session is killed past ``CHILD_TIMEOUT_S``."""
    report, log = out / "report.json", out / "child.log"
    cmd = [sys.executable, "-m", "tests.first_hour_walk", "--home", str(home), "--files", str(files),
           "--report", str(report)]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=err, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            left = end_session(proc)
    tail = log.read_text(errors="replace")[-4000:]
    if not report.exists():
        return {"steps": [], "error": f"the child wrote no report (exit status {proc.returncode}):\n{tail}",
                "left": left}
    return {**json.loads(report.read_text()), "left": left, "log": tail}


def end_session(proc: subprocess.Popen) -> list[str]:
    """Kill ``proc`` when it still runs, then whatever of its session outlives it (after 10 s for a clean
    exit); returns what had to be killed."""
    killed = []
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        killed.append(f"the walk itself, after {CHILD_TIMEOUT_S} s")
    proc.wait(30)
    end = time.monotonic() + 10
    while _session_alive(proc.pid):
        if time.monotonic() > end:
            killed.append(f"processes of session {proc.pid} after the walk ended")
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    return killed


def _session_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def run_walk(home: Path, files: Path, out: Path) -> dict[str, Any]:
    """The walk's report: in a child on Xvfb with xcb when this machine can, else here offscreen; ``where``
    says which and why."""
    from app.doctor.qt import probe

    if shutil.which("Xvfb") is None:
        return {**walk(home, files), "where": "offscreen, in this process: no Xvfb on PATH"}
    with xvfb(XVFB_SCREEN) as display:
        env = xcb_env(display, home)
        ok, _platform, err = probe(env)
        if not ok:
            lines = [ln for ln in err.splitlines() if ln.strip()][-3:]
            why = f"Qt's xcb platform cannot open Xvfb's display here: {' / '.join(lines)}"
            return {**walk(home, files), "where": f"offscreen, in this process: {why}"}
        return {**run_child(env, home, files, out), "where": f"xcb on Xvfb {XVFB_SCREEN}, in a child process"}


def short_answers() -> None:
    from app.settings import load_user_settings, save_user_settings

    saved = load_user_settings()
    save_user_settings(replace(saved, decoding=replace(saved.decoding, max_tokens=MAX_TOKENS)))


def test_a_first_hour_fits_the_screen_and_cuts_no_text(home_with_model, qapp, tmp_path):  # noqa: F811
    short_answers()
    files = tmp_path / "files"
    files.mkdir()
    report = run_walk(home_with_model, files, tmp_path)
    failures = by_failure(report) + [f"left running: {what}" for what in report.get("left", [])]
    ran = [s["step"] for s in report["steps"]]
    where = (f"{report.get('where')}; screen {report.get('screen')} (available {report.get('available')}); "
             f"window {report.get('start_size')} at the start, {report.get('narrow_size')} narrowed")
    assert report["error"] is None and len(ran) == STEPS and not failures, (
        f"{where}\n" + "\n".join(failures) + f"\nsteps run: {ran}\n{report['error'] or ''}")


def by_failure(report: dict[str, Any]) -> list[str]:
    """Each distinct failure once, with the steps it was seen after (a cut label fails every step)."""
    seen: dict[str, list[str]] = {}
    for s in report["steps"]:
        for f in s["failures"]:
            seen.setdefault(f, []).append(s["step"].split(" ")[0])
    return [f"{f}  (after step {', '.join(steps)})" for f, steps in seen.items()]
