"""Resident memory of a process and its descendants, from Linux's ``/proc`` (no other dependency).

- ``descendants(pid)``: every process whose chain of parents (``/proc/<pid>/stat``, field 4) reaches ``pid``;
- ``process_memory(pid)``: its name, command line, **RSS** (``VmRSS`` of ``/proc/<pid>/status``: every
  resident page it maps, shared ones included) and **PSS** (``Pss`` of ``/proc/<pid>/smaps_rollup``: each
  shared page divided among the processes that map it), in MiB (2**20 bytes);
- ``tree_memory(pid)``: both for ``pid`` and its descendants, listed and summed.

The sum of RSS counts a page shared by two processes of the tree twice (the shared libraries of a parent
and a spawned child, for instance); the sum of PSS does not, but a process's PSS also shrinks when a process
*outside* the tree maps the same file (two servers mmapping one GGUF file each get half of its pages).
``None`` stands for a figure that cannot be read (not Linux, a process that ended, no permission).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Optional

PROC = Path("/proc")
MIB = 1 << 20


def parent_of(pid: int, proc: Path = PROC) -> Optional[int]:
    """The parent pid of ``pid`` from ``/proc/<pid>/stat`` (after the command name, which may hold spaces
    and parentheses); None when it cannot be read."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    try:
        return int(stat[stat.rindex(")") + 2:].split()[1])
    except (ValueError, IndexError):
        return None


def _pids(proc: Path) -> Iterable[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    return (int(n) for n in names if n.isdigit())


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """Every live descendant of ``pid`` (children, their children...), sorted; [] when there is none or
    ``/proc`` cannot be read."""
    children: dict[int, list[int]] = {}
    for p in _pids(proc):
        parent = parent_of(p, proc)
        if parent is not None:
            children.setdefault(parent, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out and c != pid:
                out.append(c)
                todo.append(c)
    return sorted(out)


def _status_kib(pid: int, key: str, proc: Path) -> Optional[int]:
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rollup_kib(pid: int, key: str, proc: Path) -> Optional[int]:
    try:
        for line in (proc / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cmdline(pid: int, proc: Path, limit: int = 160) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    text = " ".join(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def process_memory(pid: int, proc: Path = PROC) -> Optional[dict[str, Any]]:
    """``{"pid", "ppid", "name", "cmdline", "rss_mib", "pss_mib"}`` of one process (MiB; ``pss_mib`` None
    when ``smaps_rollup`` cannot be read); None when the process is gone or ``status`` is unreadable."""
    rss = _status_kib(pid, "VmRSS", proc)
    if rss is None:
        return None
    try:
        name = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        name = ""
    pss = _rollup_kib(pid, "Pss", proc)
    return {"pid": pid, "ppid": parent_of(pid, proc), "name": name, "cmdline": _cmdline(pid, proc),
            "rss_mib": rss * 1024 / MIB, "pss_mib": None if pss is None else pss * 1024 / MIB}


def tree_memory(pid: int, proc: Path = PROC, note: str = "") -> dict[str, Any]:
    """Resident memory of ``pid`` and every descendant: ``processes`` (``process_memory`` of each, the root
    first), ``rss_mib`` and ``pss_mib`` summed over them (``pss_mib`` None when any PSS is unreadable;
    both None when no process could be read), ``root_pid``, ``source`` (where the figures come from) and
    ``note``."""
    rows = [m for m in (process_memory(p, proc) for p in [pid, *descendants(pid, proc)]) if m is not None]
    pss = [m["pss_mib"] for m in rows]
    return {"root_pid": pid, "processes": rows,
            "rss_mib": sum(m["rss_mib"] for m in rows) if rows else None,
            "pss_mib": sum(pss) if rows and None not in pss else None,  # type: ignore[arg-type]
            "source": "VmRSS of /proc/<pid>/status and Pss of /proc/<pid>/smaps_rollup, summed over the process "
                      "and its descendants (/proc/<pid>/stat parent links)", "note": note}
