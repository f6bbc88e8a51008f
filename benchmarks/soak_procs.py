"""The processes ``hearth bench soak`` watches, read from Linux's ``/proc`` (psutil is not a dependency).

Every ``sample_s`` seconds a ``Sampler`` thread reads, for the server process and each of its descendants
(``benchmarks.rss_tree.descendants``: the engine child of each loaded model, the embedder child,
multiprocessing's resource tracker), the resident memory (``VmRSS`` of ``/proc/<pid>/status``) and the
number of open file descriptors (entries of ``/proc/<pid>/fd``). A child's role comes from the GGUF file it
maps or holds open (``/proc/<pid>/maps``, else ``/proc/<pid>/fd``): a file under ``models/embeddings/`` is the
embedder, any other the engine of the model that file is (``engine:<id>``); spawned children all have the
same command line, so nothing else tells them apart. A server the soak did not start is found by the
process listening on its port (``/proc/net/tcp*`` → socket inode → ``/proc/<pid>/fd``).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Optional

from benchmarks.rss_tree import PROC, descendants

ROOT_ROLE = "serve"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def status_bytes(pid: int, proc: Path = PROC) -> dict[str, int]:
    """``VmRSS``, ``RssAnon`` and ``RssFile`` of ``pid`` in bytes, those that can be read ({} when the
    process ended)."""
    out = {}
    for line in _read(proc / str(pid) / "status").splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "RssAnon", "RssFile"):
            try:
                out[key] = int(line.split()[1]) * 1024
            except (ValueError, IndexError):
                pass
    return out


def rss_bytes(pid: int, proc: Path = PROC) -> Optional[int]:
    """``VmRSS`` of ``pid`` in bytes; None when it cannot be read (the process ended)."""
    return status_bytes(pid, proc).get("VmRSS")


def open_files(pid: int, proc: Path = PROC) -> Optional[int]:
    """How many file descriptors ``pid`` holds open (files, sockets, pipes); None when unreadable."""
    try:
        return len(os.listdir(proc / str(pid) / "fd"))
    except OSError:
        return None


def _gguf_paths(pid: int, proc: Path) -> list[str]:
    found = [line.split(None, 5)[5].strip() for line in _read(proc / str(pid) / "maps").splitlines()
             if line.rstrip().endswith(".gguf") and len(line.split(None, 5)) == 6]
    if found:
        return found
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    out = []
    for n in names:
        try:
            target = os.readlink(fd_dir / n)
        except OSError:
            continue
        if target.endswith(".gguf"):
            out.append(target)
    return out


def role_of(pid: int, root: int, proc: Path = PROC) -> str:
    """``serve`` (the root), ``engine:<model id>``, ``embedder``, ``resource-tracker`` or ``child``."""
    if pid == root:
        return ROOT_ROLE
    if "resource_tracker" in _read(proc / str(pid) / "cmdline"):
        return "resource-tracker"
    paths = _gguf_paths(pid, proc)
    if any("/embeddings/" in p for p in paths):
        return "embedder"
    if paths:
        return "engine:" + Path(paths[0]).stem
    return "child"


def listener_pid(port: int, proc: Path = PROC) -> Optional[int]:
    """The pid of the process listening on TCP ``port`` (IPv4 or IPv6); None when not found (or not ours)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        for line in _read(proc / "net" / table).splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{parts[9]}]")
    if not inodes:
        return None
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        fd_dir = proc / name / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in inodes:
                    return int(name)
            except OSError:
                continue
    return None


class Sampler:
    """Samples the process tree of ``root`` every ``every_s`` seconds on its own thread (times relative to
    ``t0``, a ``perf_counter`` value) into ``samples``: ``{"t_s", "pid", "role", "rss_bytes", "rss_anon_bytes",
    "rss_file_bytes", "open_files"}`` (anonymous memory and file pages, the model's mapped weights among
    them, apart: ``RssAnon`` and ``RssFile`` of ``/proc/<pid>/status``)."""

    def __init__(self, root: int, t0: float, every_s: float = 5.0, proc: Path = PROC) -> None:
        self.root, self.t0, self.every_s, self.proc = root, t0, every_s, proc
        self.samples: list[dict[str, Any]] = []
        self._roles: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)

    def sample(self) -> None:
        """One sample of every process of the tree now."""
        t = time.perf_counter() - self.t0
        for pid in [self.root, *descendants(self.root, self.proc)]:
            role = self._roles.get(pid)
            if role is None or role == "child":  # a child may not have mapped its model yet
                role = self._roles[pid] = role_of(pid, self.root, self.proc)
            mem = status_bytes(pid, self.proc)
            if "VmRSS" in mem:
                self.samples.append({"t_s": round(t, 3), "pid": pid, "role": role, "rss_bytes": mem["VmRSS"],
                                     "rss_anon_bytes": mem.get("RssAnon"), "rss_file_bytes": mem.get("RssFile"),
                                     "open_files": open_files(pid, self.proc)})

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def start(self) -> None:
        """Take the first sample now, then one every ``every_s`` seconds."""
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and take a last sample."""
        self._stop.set()
        self._thread.join(timeout=self.every_s + 5)
        self.sample()
