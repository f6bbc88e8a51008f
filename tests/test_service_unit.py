"""``hearth service``: the systemd user unit and the launchd agent are rendered correctly, and installing into a
temporary HOME writes the file (and asks the manager only through an injected runner: systemd never starts)."""

from __future__ import annotations

import http.server
import json
import os
import plistlib
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app import service_unit as su


def hearth(*args: str, home: Path, hearth_home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "HEARTH_HOME": str(hearth_home)}
    env.pop("XDG_CONFIG_HOME", None)
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60)


class Recorder:
    """A runner that records commands and answers from a script (command prefix → stdout, returncode)."""

    def __init__(self, answers: dict[str, tuple[str, int]] | None = None):
        self.calls: list[list[str]] = []
        self.answers = answers or {}

    def __call__(self, cmd: list[str]) -> subprocess.CompletedProcess:
        self.calls.append(cmd)
        out, rc = next((v for k, v in self.answers.items() if " ".join(cmd).startswith(k)), ("", 0))
        return subprocess.CompletedProcess(cmd, rc, out, "")


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_systemd_unit_is_rendered(hearth_home: Path):
    spec = su.default_spec(["--port", "9123"])
    text = su.render_systemd(spec)
    lines = _lines(text)
    assert lines[0] == "[Unit]" and "[Service]" in lines and lines[-2:] == ["[Install]", "WantedBy=default.target"]
    exec_start = next(ln for ln in lines if ln.startswith("ExecStart="))
    assert exec_start == f"ExecStart={os.path.abspath(sys.executable)} -m app.cli serve --port 9123"
    assert os.path.isabs(exec_start.split("=", 1)[1].split()[0])
    assert f"Environment=HEARTH_HOME={hearth_home.resolve()}" in lines
    assert "Restart=on-failure" in lines and "Type=simple" in lines


def test_systemd_quoting_of_spaces_percent_and_dollar():
    spec = su.ServiceSpec(("/opt/my apps/python", "-m", "app.cli", "serve", "--model", "50%$off.gguf"),
                          {"HEARTH_HOME": '/home/a b/"x"'})
    text = su.render_systemd(spec)
    assert 'ExecStart="/opt/my apps/python" -m app.cli serve --model 50%%$$off.gguf' in text
    assert 'Environment="HEARTH_HOME=/home/a b/\\"x\\""' in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_accepts_the_unit(tmp_path: Path):
    path = tmp_path / su.SYSTEMD_UNIT
    path.write_text(su.render_systemd(su.default_spec()), encoding="utf-8")
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_launchd_plist_is_rendered(hearth_home: Path):
    spec = su.default_spec(["--port", "9123"])
    plist = plistlib.loads(su.render_launchd(spec))
    assert plist["Label"] == "org.hearth.serve"
    assert plist["ProgramArguments"] == [os.path.abspath(sys.executable), "-m", "app.cli", "serve", "--port", "9123"]
    assert plist["EnvironmentVariables"]["HEARTH_HOME"] == str(hearth_home.resolve())
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardErrorPath"].endswith("logs/service.log")


def test_unit_paths(tmp_path: Path):
    assert su.unit_path(tmp_path, "linux") == tmp_path / ".config/systemd/user/hearth.service"
    assert su.unit_path(tmp_path, "darwin") == tmp_path / "Library/LaunchAgents/org.hearth.serve.plist"
    with pytest.raises(OSError, match="supported"):
        su.unit_path(tmp_path, "win32")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the systemd layout")
def test_install_status_uninstall_in_a_temporary_home(tmp_path: Path, hearth_home: Path):
    home = tmp_path / "home"
    home.mkdir()
    r = hearth("service", "install", "--no-start", "--port", "9124", home=home, hearth_home=hearth_home)
    assert r.returncode == 0, r.stderr
    unit = home / ".config/systemd/user/hearth.service"
    assert unit.is_file() and f"wrote {unit}" in r.stdout
    assert "systemctl --user daemon-reload && systemctl --user enable --now hearth.service" in r.stdout
    text = unit.read_text(encoding="utf-8")
    assert "-m app.cli serve --port 9124" in text and f"HEARTH_HOME={hearth_home.resolve()}" in text
    st = hearth("service", "status", "--json", home=home, hearth_home=hearth_home)
    data = json.loads(st.stdout)
    assert data["installed"] is True and data["port"] == 9124 and data["answering"] is False
    assert st.returncode == 1  # nothing answers on the port
    printed = hearth("service", "install", "--print", home=home, hearth_home=hearth_home)
    assert "ExecStart=" in printed.stdout
    gone = hearth("service", "uninstall", "--no-stop", home=home, hearth_home=hearth_home)
    assert gone.returncode == 0 and not unit.exists()


def test_install_starts_through_systemctl_user(tmp_path: Path):
    rec = Recorder()
    res = su.install(su.default_spec(), home=tmp_path, runner=rec, system="linux")
    assert res.ok and Path(res.path).is_file()
    assert rec.calls == [["systemctl", "--user", "daemon-reload"],
                         ["systemctl", "--user", "enable", "--now", "hearth.service"]]


def test_install_reports_a_refusing_manager(tmp_path: Path):
    rec = Recorder({"systemctl --user daemon-reload": ("Failed to connect to bus", 1)})
    res = su.install(su.default_spec(), home=tmp_path, runner=rec, system="linux")
    assert not res.ok and len(rec.calls) == 1 and res.commands[0]["returncode"] == 1
    assert Path(res.path).is_file()  # the file stays; the person can start it later


def test_launchd_install_and_uninstall(tmp_path: Path):
    rec = Recorder()
    res = su.install(su.default_spec(), home=tmp_path, runner=rec, system="darwin")
    path = tmp_path / "Library/LaunchAgents/org.hearth.serve.plist"
    assert res.path == str(path) and plistlib.loads(path.read_bytes())["Label"] == "org.hearth.serve"
    assert rec.calls == [["launchctl", "bootstrap", f"gui/{os.getuid()}", str(path)]]
    su.uninstall(home=tmp_path, runner=rec, system="darwin")
    assert rec.calls[-1] == ["launchctl", "bootout", f"gui/{os.getuid()}/org.hearth.serve"] and not path.exists()


def test_uninstall_disables_then_reloads(tmp_path: Path):
    su.install(su.default_spec(), home=tmp_path, start=False, system="linux")
    rec = Recorder({"systemctl --user disable": ("not loaded", 1)})
    res = su.uninstall(home=tmp_path, runner=rec, system="linux")
    assert res.ok and not Path(res.path).exists()
    assert rec.calls == [["systemctl", "--user", "disable", "--now", "hearth.service"],
                         ["systemctl", "--user", "daemon-reload"]]


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server API
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"status": "no_model"}).encode())

    def log_message(self, *args):
        pass


def test_status_running_and_answering(tmp_path: Path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        su.install(su.default_spec(["--port", str(port)]), home=tmp_path, start=False, system="linux")
        rec = Recorder({"systemctl --user is-active": ("active\n", 0),
                        "systemctl --user is-enabled": ("enabled\n", 0)})
        st = su.status(home=tmp_path, runner=rec, system="linux")
    finally:
        srv.shutdown()
        srv.server_close()
    assert st.installed and st.active == "active" and st.enabled and st.port == port
    assert st.answering and st.health == {"status": "no_model"}  # a 503 from /health is still Hearth
    assert "installed, active, enabled at login; answers on" in st.summary()


def test_status_when_not_installed(tmp_path: Path):
    st = su.status(home=tmp_path, runner=Recorder(), system="linux")
    assert not st.installed and st.summary().startswith("not installed")
    assert not su.status(home=tmp_path, system="win32").supported
