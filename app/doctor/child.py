"""Running a probe in a child Python, as ``hearth doctor`` does for Qt (``app.doctor.qt``) and for llama.cpp's
build (``app.doctor.backend``): what could abort or map a library stays out of the doctor's own process."""

from __future__ import annotations

import subprocess
import sys


def probe_command(code: str, flag: str) -> list[str]:
    """``python -c code``, or in a frozen bundle (no ``-c``) the bundle itself: ``hearth doctor <flag>``, which
    runs the same code."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "doctor", flag]
    return [sys.executable, "-c", code]


def run_probe(command: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` with no stdin, its output captured as text, for at most ``timeout`` seconds. Raises
    ``subprocess.TimeoutExpired`` past it and ``OSError`` when it cannot start (each probe words its own)."""
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)
