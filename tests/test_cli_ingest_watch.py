"""``hearth ingest --watch``: a watched folder is re-indexed when files appear or disappear, and Ctrl+C (SIGINT)
stops it even when it was started with SIGINT ignored, as a POSIX shell starts a background job.

The child is started with SIGINT explicitly ignored, so the test does not depend on the disposition pytest
itself inherited, and proves that the command restores the default handler. Its output goes to files that the
test polls (no fixed sleeps, no pipe to fill up); whatever happens, the child is killed and reaped at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT and preexec_fn are POSIX")


def _ignore_sigint() -> None:
    """In the child before exec: SIGINT ignored, as a shell without job control starts a background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Poll ``path`` until it contains ``text``; fail early if the process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in path.read_text(encoding="utf-8", errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    pytest.fail(f"{text!r} did not appear in {path.name} (exit code {proc.poll()}):\n{path.read_text()}")


def test_watch_picks_up_new_and_deleted_files_and_stops_on_sigint(tmp_path: Path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha notes\n")
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "app.cli", "ingest", str(folder), "--no-embed", "--watch", "--interval", "0.3"]
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env, preexec_fn=_ignore_sigint)
    try:
        _wait_for(err_path, "watching", proc)  # printed once the SIGINT handler is back
        _wait_for(out_path, f"indexed   {folder / 'a.txt'}", proc)
        (folder / "b.txt").write_text("beta notes\n")
        _wait_for(out_path, f"indexed   {folder / 'b.txt'}", proc)
        (folder / "a.txt").unlink()
        _wait_for(out_path, f"removed   {folder / 'a.txt'}", proc)
        proc.send_signal(signal.SIGINT)
        returncode = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:  # SIGINT did not stop it (or the test failed before sending it)
            proc.kill()
        proc.wait(timeout=30)
    err_text = err_path.read_text()
    assert returncode == 0, err_text
    assert "stopped watching" in err_text and "Traceback" not in err_text
