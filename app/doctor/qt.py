"""Can Qt open a window here? The check ``hearth`` runs before it creates the application.

Qt aborts the whole process (SIGABRT, "This application failed to start because no Qt platform plugin could
be initialized") when its platform plugin cannot load, and prints the same misleading line about xcb-cursor0
for every xcb failure, a missing display included. So the question is asked twice, without Qt in this
process:

The reasoning: docs/doctor.md, 'app/doctor/qt.py'.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.doctor import child, elf

SKIP_ENV = "HEARTH_SKIP_QT_CHECK"
PROBE_TIMEOUT_S = 8.0
# What the child runs. Kept as text (the frozen bundle runs it through ``hearth doctor --qt-probe``) so the
# checking process never imports Qt.
PROBE_CODE = ("import sys\nfrom PySide6.QtGui import QGuiApplication\napp = QGuiApplication(sys.argv[:1] or "
              "['hearth'])\nprint('platform=' + app.platformName(), flush=True)\n")

# soname -> (apt, dnf, pacman). The xcb-util family, xkbcommon, X11, GL/EGL (libglvnd) and the few other
# system libraries Qt's xcb and wayland plugins link (read from `ldd libqxcb.so` / `libqwayland.so`).
PACKAGES: dict[str, tuple[str, str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util"),
    "libxcb-ewmh.so.2": ("libxcb-ewmh2", "xcb-util-wm", "xcb-util-wm"),
    **{f"libxcb-{n}.so.{v}": (f"libxcb-{n}{v}", "libxcb", "libxcb")
       for n, v in (("randr", 0), ("shm", 0), ("sync", 1), ("xfixes", 0), ("render", 0), ("shape", 0),
                    ("xkb", 1), ("glx", 0), ("xinput", 0), ("xinerama", 0), ("present", 0), ("dri3", 0))},
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11"),
    "libXau.so.6": ("libxau6", "libXau", "libxau"),
    "libXdmcp.so.6": ("libxdmcp6", "libXdmcp", "libxdmcp"),
    "libSM.so.6": ("libsm6", "libSM", "libsm"),
    "libICE.so.6": ("libice6", "libICE", "libice"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd"),
    "libGLX.so.0": ("libglx0", "libglvnd-glx", "libglvnd"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl", "libglvnd"),
    "libGLdispatch.so.0": ("libglvnd0", "libglvnd", "libglvnd"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype", "freetype2"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client", "wayland"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor", "wayland"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl", "wayland"),
    "libz.so.1": ("zlib1g", "zlib", "zlib"),
    "libpng16.so.16": ("libpng16-16", "libpng", "libpng"),
    "libexpat.so.1": ("libexpat1", "expat", "expat"),
    "libzstd.so.1": ("libzstd1", "libzstd", "zstd"),
    "libbrotlidec.so.1": ("libbrotli1", "libbrotli", "brotli"),
    "libpcre2-8.so.0": ("libpcre2-8-0", "pcre2", "pcre2"),
}
MANAGERS = (("apt", "sudo apt install"), ("dnf", "sudo dnf install"), ("pacman", "sudo pacman -S"))


@dataclass(frozen=True)
class MissingLib:
    """A library the plugin needs that the search path lacks, and the packages that provide it (None for a
    soname this table does not know)."""

    soname: str
    needed_by: str
    apt: str | None
    dnf: str | None
    pacman: str | None

    def to_dict(self) -> dict[str, str | None]:
        return {"soname": self.soname, "needed_by": self.needed_by, "apt": self.apt, "dnf": self.dnf,
                "pacman": self.pacman}


@dataclass
class QtReport:
    """What the Qt check found. ``ok``: the probe created the application (or, probe skipped, nothing is
    missing). ``cause``: a short code (``missing_libraries``, ``no_display``, ``unknown_platform``,
    ``probe_failed``, ``timeout``, ``no_plugin``, ``skipped``) or None when ok. ``qt_lines``: Qt's own stderr
    lines from the probe. ``message``: the text to print (cause + exact fix)."""

    ok: bool
    platform: str
    plugin: str | None
    missing: list[MissingLib] = field(default_factory=list)
    probe_ran: bool = False
    probe_platform: str | None = None
    cause: str | None = None
    qt_lines: list[str] = field(default_factory=list)
    seconds: float = 0.0
    message: str = ""

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "missing"}
        d["missing"] = [m.to_dict() for m in self.missing]
        return d


def platform_name(env: dict[str, str] | None = None) -> str:
    """The platform plugin Qt will try first: ``QT_QPA_PLATFORM``'s first entry, else what Qt 6 picks for
    this session (wayland on a Wayland session, xcb elsewhere on Linux, cocoa / windows)."""
    env = os.environ if env is None else env
    given = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if given:
        return given
    if sys.platform == "darwin":
        return "cocoa"
    if sys.platform == "win32":
        return "windows"
    if env.get("WAYLAND_DISPLAY") and env.get("XDG_SESSION_TYPE") == "wayland":
        return "wayland"
    return "xcb"


def plugins_dir() -> Path | None:
    """PySide6's ``Qt/plugins/platforms`` folder (also inside a PyInstaller bundle), found without importing
    PySide6; None when PySide6 is not installed."""
    base = getattr(sys, "_MEIPASS", None)
    if base and (Path(base) / "PySide6" / "Qt" / "plugins" / "platforms").is_dir():
        return Path(base) / "PySide6" / "Qt" / "plugins" / "platforms"
    spec = importlib.util.find_spec("PySide6")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("Qt/plugins/platforms", "plugins/platforms"):
            if (Path(folder) / sub).is_dir():
                return Path(folder) / sub
    return None


def plugin_file(platform: str, folder: Path | None = None) -> Path | None:
    """The plugin library for ``platform`` (``xcb`` → ``libqxcb.so``; every ``wayland*`` name is the wayland
    plugin), or None when this platform has no such file (macOS/Windows use other suffixes)."""
    folder = folder or plugins_dir()
    if folder is None:
        return None
    name = "wayland" if platform.startswith("wayland") else platform
    for candidate in (f"libq{name}.so", f"libq{name}.dylib", f"q{name}.dll"):
        if (folder / candidate).is_file():
            return folder / candidate
    return None


def packages_for(soname: str) -> tuple[str | None, str | None, str | None]:
    """(apt, dnf, pacman) package names providing ``soname``, None where not known."""
    return PACKAGES.get(soname, (None, None, None))


def missing_libraries(plugin: Path, search_dirs: list[str] | None = None) -> list[MissingLib]:
    """Libraries ``plugin`` (transitively) needs that cannot be found. Without ``search_dirs``: what ``ldd``
    says on this machine (the resolver when there is no ``ldd``); with them: ``app.doctor.elf.resolve`` over
    only those folders (after the plugin's own RUNPATH, which finds the Qt libraries next to it)."""
    if search_dirs is None:
        found = _ldd_missing(plugin)
        if found is not None:
            return found
    if sys.platform != "linux" and search_dirs is None:
        return []
    res = elf.resolve(plugin, search_dirs)
    return [MissingLib(s, os.path.basename(by), *packages_for(s)) for s, by in res.missing.items()]


def parse_ldd(text: str) -> list[str]:
    """Sonames ``ldd`` reports as ``=> not found``, in order, each once (``ldd`` repeats a soname for every
    library that needs it)."""
    return list(dict.fromkeys(m.group(1) for m in re.finditer(r"^\s*(\S+)\s+=>\s+not found", text, re.M)))


def _ldd_missing(plugin: Path) -> list[MissingLib] | None:
    try:
        out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 and not out.stdout:
        return None
    return [MissingLib(s, plugin.name, *packages_for(s)) for s in parse_ldd(out.stdout)]


def probe_command() -> list[str]:
    """The child that tries to create the application (``hearth doctor --qt-probe`` in a frozen bundle)."""
    return child.probe_command(PROBE_CODE, "--qt-probe")


def probe(env: dict[str, str] | None = None, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str | None, str]:
    """Run the load probe: (loaded, platform name Qt reports, Qt's stderr)."""
    env = dict(os.environ if env is None else env)
    try:
        r = child.run_probe(probe_command(), timeout, env)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return False, None, err + f"\n(the probe did not finish within {timeout:.0f} s)"
    except OSError as exc:
        return False, None, f"could not start the probe: {exc}"
    m = re.search(r"^platform=(\S*)", r.stdout, re.M)
    return (r.returncode == 0 and m is not None), (m.group(1) if m else None), r.stderr


def has_display(env: dict[str, str] | None = None) -> bool:
    """Whether a window could be shown at all: always on macOS/Windows; on Linux an X11 ``DISPLAY`` or a
    ``WAYLAND_DISPLAY``, or a ``QT_QPA_PLATFORM`` that needs no display server (offscreen, vnc...)."""
    env = os.environ if env is None else env
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY") or env.get("QT_QPA_PLATFORM"))


def server_answers(var: str, value: str, env: dict[str, str] | None = None, timeout: float = 1.0) -> bool | None:
    """Whether the display server that ``var`` = ``value`` names accepts a connection (Linux). ``DISPLAY``:
    ``[host]:N[.S]``; a local one (no host, or ``unix``) at the socket ``/tmp/.X11-unix/XN`` or its abstract
    twin, a remote one at TCP port 6000 + N (the X11 conventions, Xlib's ``_X11TransConnect``).
    ``WAYLAND_DISPLAY``: a socket path, relative to ``$XDG_RUNTIME_DIR`` unless absolute (libwayland's
    ``wl_display_connect``). None when ``value`` cannot be read as either (not judged)."""
    import socket

    env = os.environ if env is None else env
    if var == "WAYLAND_DISPLAY":
        runtime = env.get("XDG_RUNTIME_DIR", "")
        path = value if os.path.isabs(value) else os.path.join(runtime, value) if runtime else None
        targets = [(socket.AF_UNIX, path)] if path else []
    else:
        m = re.fullmatch(r"(?:(?P<host>[^:]*)/)?(?P<h>[^:/]*):(?P<n>\d+)(?:\.\d+)?", value.strip())
        if m is None:
            return None
        n, host = int(m["n"]), m["h"]
        if host in ("", "unix"):
            targets = [(socket.AF_UNIX, f"/tmp/.X11-unix/X{n}"), (socket.AF_UNIX, f"\0/tmp/.X11-unix/X{n}")]
        else:
            targets = [(socket.AF_INET, (host, 6000 + n))]
    for family, address in targets:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
                return True
        except OSError:
            continue
    return False if targets else None


def startup_check(env: dict[str, str] | None = None) -> QtReport | None:
    """What ``hearth`` / ``hearth gui`` run before creating the application: the load probe alone (the
    library check only when it failed, to explain why). None when ``HEARTH_SKIP_QT_CHECK`` is set."""
    env = dict(os.environ if env is None else env)
    if env.get(SKIP_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    import time

    t0 = time.perf_counter()
    result = probe(env)
    if result[0]:
        return QtReport(ok=True, platform=platform_name(env), plugin=None, probe_ran=True,
                        probe_platform=result[1], seconds=time.perf_counter() - t0)
    return check(env, probe_result=result)


def check(env: dict[str, str] | None = None, search_dirs: list[str] | None = None,
          run_probe: bool = True, probe_result: tuple[bool, str | None, str] | None = None) -> QtReport:
    """The whole Qt check for ``env`` (default: this process's environment). ``search_dirs`` restricts the
    library search (tests); ``run_probe=False`` checks the libraries only; ``probe_result``: a probe already
    run under ``env``."""
    import time

    env = dict(os.environ if env is None else env)
    t0 = time.perf_counter()
    plat = platform_name(env)
    plugin = plugin_file(plat)
    rep = QtReport(ok=False, platform=plat, plugin=str(plugin) if plugin else None)
    if plugin is not None and plugin.suffix == ".so":
        rep.missing = missing_libraries(plugin, search_dirs)
    if run_probe or probe_result is not None:
        rep.probe_ran = True
        ok, rep.probe_platform, err = probe_result or probe(env)
        rep.qt_lines = [ln for ln in err.splitlines() if ln.strip()][-12:]
        rep.ok = ok and not rep.missing
        if "did not finish within" in err:
            rep.cause = "timeout"
    else:
        rep.ok = not rep.missing
    rep.cause = None if rep.ok else (rep.cause or _cause(rep, plugin, env))
    rep.seconds = time.perf_counter() - t0
    rep.message = explain(rep, env)
    return rep


def _cause(rep: QtReport, plugin: Path | None, env: dict[str, str]) -> str:
    text = "\n".join(rep.qt_lines)
    if rep.missing:
        return "missing_libraries"
    if "could not connect to display" in text or (rep.platform == "xcb" and not env.get("DISPLAY")) or (
            rep.platform.startswith("wayland") and not env.get("WAYLAND_DISPLAY")
            and "Failed to create wl_display" in text):
        return "no_display"
    if "Could not find the Qt platform plugin" in text or plugin is None and plugins_dir() is not None:
        return "unknown_platform"
    if plugins_dir() is None:
        return "no_plugin"
    return "probe_failed" if rep.probe_ran else "skipped"


def install_commands(missing: list[MissingLib]) -> list[str]:
    """One install command per package manager for the packages of ``missing`` (each package once)."""
    cmds = []
    for i, (_mgr, cmd) in enumerate(MANAGERS):
        pkgs = list(dict.fromkeys(p for m in missing for p in [(m.apt, m.dnf, m.pacman)[i]] if p))
        if pkgs:
            cmds.append(f"{cmd} {' '.join(pkgs)}")
    return cmds


def explain(rep: QtReport, env: dict[str, str] | None = None) -> str:
    """The message for ``rep``: what is wrong and the exact fix (empty when all is well)."""
    env = os.environ if env is None else env
    if rep.ok:
        return ""
    headless = ("Without a window Hearth still works: `hearth chat` (terminal chat) or `hearth serve` "
                "(the API on 127.0.0.1).")
    if rep.cause == "missing_libraries":
        libs = ", ".join(m.soname for m in rep.missing)
        unknown = [m.soname for m in rep.missing if m.apt is None]
        lines = [f"Qt's {rep.platform} platform plugin cannot load: these system libraries are missing: {libs}.",
                 "Install them with your package manager:"]
        lines += [f"  {c}" for c in install_commands(rep.missing)]
        if unknown:
            lines.append(f"  (no package known for {', '.join(unknown)}: search your distribution for it)")
        return "\n".join(lines + [headless])
    if rep.cause == "no_display":
        shown = env.get("DISPLAY") or env.get("WAYLAND_DISPLAY") or "(none)"
        return (f"No display: Qt's {rep.platform} plugin cannot reach a display server (DISPLAY="
                f"{env.get('DISPLAY', '')!s}, WAYLAND_DISPLAY={env.get('WAYLAND_DISPLAY', '')!s}; tried "
                f"{shown}). Run Hearth from your desktop session (or `ssh -X`), or check that DISPLAY names a "
                f"running X server. " + headless + _cursor_note(rep))
    if rep.cause == "unknown_platform":
        return (f"QT_QPA_PLATFORM={rep.platform!r} is not a Qt platform plugin here. Unset it "
                "(`unset QT_QPA_PLATFORM`) or use one Qt lists below. " + headless +
                _qt_tail(rep))
    if rep.cause == "no_plugin":
        return "PySide6 is not installed (or has no platform plugins): run `make run` again. " + headless
    if rep.cause == "timeout":
        return (f"Qt's {rep.platform} plugin did not start within {PROBE_TIMEOUT_S:.0f} s (a display server that "
                "does not answer?). " + headless + _qt_tail(rep))
    return (f"Qt's {rep.platform} platform plugin failed to start. Run `QT_DEBUG_PLUGINS=1 hearth gui` to see "
            "why. " + headless + _qt_tail(rep))


def _cursor_note(rep: QtReport) -> str:
    """Qt 6.5+ prints its xcb-cursor0 hint for any xcb failure; say when that library is in fact present."""
    if any("xcb-cursor0" in ln for ln in rep.qt_lines) and not rep.missing:
        return (" (Qt's line about xcb-cursor0 is printed for every xcb failure; libxcb-cursor.so.0 is "
                "installed here.)")
    return ""


def _qt_tail(rep: QtReport) -> str:
    return ("\nQt said:\n" + "\n".join(f"  {ln}" for ln in rep.qt_lines[-6:])) if rep.qt_lines else ""
