"""``hearth`` on a display whose Qt platform plugin cannot load: doctor's message, then the terminal chat
(never Qt's abort). ``hearth gui``, asked for by name, prints the message and exits 1."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.doctor import elf, qt

DEAD_DISPLAY = ":187"  # no X server listens there (checked below)


def hearth(home: Path, *args: str, env: dict, stdin: str = "", timeout: int = 300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM",
                                                             "HEARTH_SKIP_QT_CHECK")}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], input=stdin, capture_output=True, text=True,
                          env={**base, "HEARTH_HOME": str(home), **env}, timeout=timeout)


@pytest.fixture()
def home(tmp_path: Path, bundled_model: Path) -> Path:
    h = tmp_path / "home"
    (h / "models").mkdir(parents=True)
    (h / "models" / bundled_model.name).symlink_to(bundled_model)
    return h


@pytest.mark.model
@pytest.mark.skipif(not sys.platform.startswith("linux") or os.path.exists(f"/tmp/.X11-unix/X{DEAD_DISPLAY[1:]}"),
                    reason="needs Linux and no X server on :187")
def test_hearth_falls_back_to_the_terminal_chat_when_xcb_cannot_load(home: Path):
    r = hearth(home, env={"QT_QPA_PLATFORM": "xcb", "DISPLAY": DEAD_DISPLAY},
               stdin="What is the capital of France?\n")
    assert r.returncode == 0, r.stderr[-3000:]
    missing = sorted(elf.resolve(qt.plugin_file("xcb")).missing) if qt.plugin_file("xcb") else []
    if missing:  # a fresh machine: the libraries are named first (the display is never reached)
        assert "these system libraries are missing" in r.stderr, r.stderr[-3000:]
        assert all(s in r.stderr for s in missing), r.stderr[-3000:]
    else:
        assert "No display: Qt's xcb plugin cannot reach a display server" in r.stderr
    assert "starting the terminal chat instead" in r.stderr and "hearth doctor" in r.stderr
    assert "Hearth chat · gemma-3-270m-q4_k_m" in r.stderr  # the terminal chat started...
    assert "you> hearth> " in r.stdout and "Paris" in r.stdout  # ...and answered the one line
    assert "Aborted" not in r.stderr and "This application failed to start" not in r.stderr


@pytest.mark.model
def test_hearth_falls_back_when_the_platform_plugin_does_not_exist(home: Path):
    r = hearth(home, env={"QT_QPA_PLATFORM": "nonexistent"}, stdin="/quit\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "QT_QPA_PLATFORM='nonexistent' is not a Qt platform plugin" in r.stderr
    assert "Hearth chat ·" in r.stderr and "you> " in r.stdout


def test_hearth_gui_prints_the_message_and_exits_1(tmp_path: Path):
    r = hearth(tmp_path, "gui", env={"QT_QPA_PLATFORM": "nonexistent"}, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr)  # not -6 (SIGABRT)
    assert "is not a Qt platform plugin" in r.stderr and "hearth chat" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux") or qt.plugin_file("xcb") is None, reason="Linux xcb")
def test_missing_xcb_cursor_at_startup_names_the_package_and_starts_the_chat(tmp_path: Path, monkeypatch):
    """The issue's machine: the probe fails and the plugin's libraries lack libxcb-cursor.so.0."""
    import app.cli.chat as chat
    import app.cli.default as default

    plugin = qt.plugin_file("xcb")
    libs = tmp_path / "libs"
    libs.mkdir()
    for soname, path in elf.resolve(plugin).found.items():
        if soname != "libxcb-cursor.so.0":
            (libs / soname).symlink_to(path)
    qt_said = ("qt.qpa.plugin: From 6.5.0, xcb-cursor0 or libxcb-cursor0 is needed to load the Qt xcb platform "
               "plugin.\nThis application failed to start because no Qt platform plugin could be initialized.")
    monkeypatch.setattr(qt, "probe", lambda env=None, timeout=qt.PROBE_TIMEOUT_S: (False, None, qt_said))
    real = qt.missing_libraries
    monkeypatch.setattr(qt, "missing_libraries", lambda p, search_dirs=None: real(p, [str(libs)]))
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    monkeypatch.delenv("HEARTH_SKIP_QT_CHECK", raising=False)
    started = []
    monkeypatch.setattr(chat, "run_terminal_chat", lambda args: started.append(args) or 0)
    assert default.run_default(argparse.Namespace(command=None, verbose=False)) == 0
    assert len(started) == 1 and started[0].model is None


def test_the_message_printed_for_missing_libraries(capsys, monkeypatch):
    import app.cli.chat as chat
    import app.cli.default as default

    rep = qt.QtReport(ok=False, platform="xcb", plugin="libqxcb.so", cause="missing_libraries",
                      missing=[qt.MissingLib(s, "libqxcb.so", *qt.packages_for(s))
                               for s in ("libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1")])
    rep.message = qt.explain(rep, {})
    monkeypatch.setattr(qt, "startup_check", lambda env=None: rep)
    monkeypatch.setattr(default, "_has_display", lambda: True)
    monkeypatch.setattr(chat, "run_terminal_chat", lambda args: 0)
    default.run_default(argparse.Namespace(command=None, verbose=False))
    err = capsys.readouterr().err
    assert "sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1" in err
    assert "sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms" in err
    assert "sudo pacman -S xcb-util-cursor xcb-util-wm xcb-util-keysyms" in err
    assert "starting the terminal chat instead" in err


def test_skip_env_goes_straight_to_the_window(monkeypatch):
    import app.cli.default as default

    monkeypatch.setenv("HEARTH_SKIP_QT_CHECK", "1")
    monkeypatch.setattr(qt, "probe", lambda *a, **k: pytest.fail("the probe ran"))
    assert default.gui_problem() is None


@pytest.mark.gui  # imports the window module (PySide6)
def test_a_passing_probe_opens_the_window(monkeypatch):
    import app.cli.default as default
    import app.ui.main as ui_main

    monkeypatch.setattr(default, "_has_display", lambda: True)
    monkeypatch.setattr(qt, "startup_check", lambda env=None: qt.QtReport(ok=True, platform="xcb", plugin=None))
    opened = []
    monkeypatch.setattr(ui_main, "run_app", lambda argv: opened.append(argv) or 0)
    assert default.run_default(argparse.Namespace(command=None, verbose=False)) == 0 and opened == [[]]
