"""``hearth ingest --watch``: a watched folder is re-indexed when files appear or disappear."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_watch_picks_up_new_and_deleted_files(tmp_path: Path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha notes\n")
    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "ingest", str(folder), "--no-embed", "--watch", "0.3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(2.0)
        (folder / "b.txt").write_text("beta notes\n")
        time.sleep(1.5)
        (folder / "a.txt").unlink()
        time.sleep(1.5)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"indexed   {folder / 'a.txt'}" in out
    assert f"indexed   {folder / 'b.txt'}" in out
    assert f"removed   {folder / 'a.txt'}" in out
    assert "Traceback" not in err
