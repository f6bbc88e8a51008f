"""Which shared libraries an ELF file needs, and which of them a given library search path cannot provide.

The reasoning: docs/doctor.md, 'app/doctor/elf.py'.
"""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

DT_NEEDED, DT_STRTAB, DT_RPATH, DT_RUNPATH = 1, 5, 15, 29
SHT_DYNAMIC = 6
DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64")


class NotElf(ValueError):
    """The file is not an ELF shared object or executable this reader understands."""


@dataclass(frozen=True)
class ElfDeps:
    """The dynamic-section facts of one ELF file: its class/machine (for matching candidates), needed
    sonames in order, and its RUNPATH / RPATH entries as written (``$ORIGIN`` not expanded)."""

    elf_class: int
    machine: int
    needed: tuple[str, ...]
    runpath: tuple[str, ...]
    rpath: tuple[str, ...]


def read_deps(path: str | os.PathLike[str]) -> ElfDeps:
    """Read ``path``'s dynamic section (via the section headers). Raises ``NotElf`` for anything else."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or len(data) < 64:
        raise NotElf(f"{path}: not an ELF file")
    elf_class, endian = data[4], "<" if data[5] == 1 else ">"
    if elf_class == 2:
        shoff, = struct.unpack_from(endian + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x3A)
        sec_fmt, dyn_fmt = endian + "IIQQQQIIQQ", endian + "qQ"
    elif elf_class == 1:
        shoff, = struct.unpack_from(endian + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(endian + "HH", data, 0x2E)
        sec_fmt, dyn_fmt = endian + "IIIIIIIIII", endian + "iI"
    else:
        raise NotElf(f"{path}: unknown ELF class {elf_class}")
    machine, = struct.unpack_from(endian + "H", data, 0x12)
    sections = [struct.unpack_from(sec_fmt, data, shoff + i * shentsize) for i in range(shnum)]
    dyn = next((s for s in sections if s[1] == SHT_DYNAMIC), None)
    if dyn is None:  # a static executable: needs nothing
        return ElfDeps(elf_class, machine, (), (), ())
    strtab = sections[dyn[6]]  # sh_link of .dynamic is .dynstr
    str_off = strtab[4]
    entries = _dynamic_entries(data, dyn[4], dyn[5], dyn_fmt)

    def string(offset: int) -> str:
        end = data.index(b"\0", str_off + offset)
        return data[str_off + offset:end].decode("utf-8", "replace")

    pick = lambda tag: [string(v) for t, v in entries if t == tag]  # noqa: E731
    split = lambda tag: tuple(p for s in pick(tag) for p in s.split(":") if p)  # noqa: E731
    return ElfDeps(elf_class, machine, tuple(pick(DT_NEEDED)), split(DT_RUNPATH), split(DT_RPATH))


def _dynamic_entries(data: bytes, offset: int, size: int, fmt: str) -> list[tuple[int, int]]:
    step = struct.calcsize(fmt)
    out = []
    for pos in range(offset, offset + size, step):
        tag, val = struct.unpack_from(fmt, data, pos)
        if tag == 0:
            break
        out.append((tag, val))
    return out


@dataclass
class Resolution:
    """The outcome of resolving an ELF file's needs, transitively: ``found`` soname → path, ``missing``
    soname → the first file that needed it."""

    found: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)


def ldconfig_cache() -> dict[str, list[str]]:
    """soname → paths listed by ``ldconfig -p`` (empty when ldconfig is not there, e.g. macOS)."""
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=5, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        cache: dict[str, list[str]] = {}
        for line in out.splitlines()[1:]:
            name, sep, target = line.strip().partition(" => ")
            if sep:
                cache.setdefault(name.split(" (", 1)[0], []).append(target.strip())
        return cache
    return {}


def default_search_dirs(env: dict[str, str] | None = None) -> list[str]:
    """The folders after an object's own RUNPATH: ``LD_LIBRARY_PATH``, the ld.so.cache folders, the defaults."""
    env = os.environ if env is None else env
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    for paths in ldconfig_cache().values():
        for p in paths:
            d = os.path.dirname(p)
            if d not in dirs:
                dirs.append(d)
    return dirs + [d for d in DEFAULT_DIRS if d not in dirs]


def resolve(path: str | os.PathLike[str], search_dirs: list[str] | None = None) -> Resolution:
    """Resolve ``path``'s needed libraries and theirs (breadth first, each soname once, as the loader does).
    ``search_dirs``: the folders searched after each object's own RPATH/RUNPATH (default:
    ``default_search_dirs()``)."""
    dirs = default_search_dirs() if search_dirs is None else list(search_dirs)
    top = read_deps(path)
    res = Resolution()
    queue: list[tuple[str, ElfDeps]] = [(str(path), top)]
    while queue:
        obj, deps = queue.pop(0)
        for soname in deps.needed:
            if soname in res.found or soname in res.missing:
                continue
            hit = _find(soname, obj, deps, top, dirs)
            if hit is None:
                res.missing[soname] = obj
                continue
            res.found[soname] = hit
            try:
                queue.append((hit, read_deps(hit)))
            except (OSError, NotElf):
                pass
    return res


def _find(soname: str, obj: str, deps: ElfDeps, top: ElfDeps, dirs: list[str]) -> str | None:
    origin = os.path.dirname(os.path.abspath(obj))
    own = deps.runpath or deps.rpath
    for d in [p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for p in own] + dirs:
        candidate = os.path.join(d, soname)
        if os.path.isfile(candidate) and _same_kind(candidate, top):
            return os.path.normpath(candidate)
    return None


def _same_kind(candidate: str, top: ElfDeps) -> bool:
    """A 32-bit library in a 64-bit process's path is skipped by the loader too."""
    try:
        with open(candidate, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    if head[:4] != b"\x7fELF":
        return False
    machine, = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 0x12)
    return head[4] == top.elf_class and machine == top.machine
