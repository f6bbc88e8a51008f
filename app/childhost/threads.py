"""Thread and OpenMP policy for every child that loads llama.cpp (the chat engine and the embedder)."""

from __future__ import annotations

import os


def default_threads(*, background: bool = False) -> int:
    """CPU threads for llama.cpp when the settings give none (an int >= 1).

    Foreground (the chat engine): every CPU this process may run on when there are at most 4, else half of
    them (at least 4): hyper-threads do not help llama.cpp, and llama-cpp-python's own default
    (``cpu_count // 2``) left half of a 2-core machine idle during decode (23 vs 38 tokens/s measured here).

    ``background=True`` (the embedder, which runs next to the chat engine and the UI): half of the foreground
    count, at least one. llama.cpp's threads wait for each other at every barrier, so one busy core stalls
    them all: measured on the 2-core machine while other work ran, 2 threads embedded 1.7 chunks/s (182
    tokens each) and took 144 ms per query, 1 thread 6.4 chunks/s and 3.8 ms."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        n = os.cpu_count() or 1
    foreground = n if n <= 4 else max(4, n // 2)
    return max(1, foreground // 2) if background else foreground


def tune_openmp() -> None:
    """Call before llama.cpp is loaded. llama.cpp's OpenMP threads spin-wait at every barrier (libgomp's default
    spin count is 300,000); when another process holds a core, decode collapses. Measured here, 2 threads on 2
    cores, decode tokens/s idle / with one busy process: default spin 48 / 7.5; ``GOMP_SPINCOUNT=1000`` 48.5 /
    23.6; one thread 27.7 / 27.5. So Hearth sets 1000 unless the environment already sets it (or
    ``OMP_WAIT_POLICY``); ``HEARTH_GOMP_SPINCOUNT`` overrides the value."""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = os.environ.get("HEARTH_GOMP_SPINCOUNT", "1000")

