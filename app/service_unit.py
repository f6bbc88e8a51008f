"""``hearth serve`` as a per-user background service: a systemd user unit (Linux) or a launchd agent (macOS).

The reasoning: docs/architecture.md, 'app/service_unit.py'.
"""

from __future__ import annotations

import json
import os
import plistlib
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

SYSTEMD_UNIT = "hearth.service"
LAUNCHD_LABEL = "org.hearth.serve"

Runner = Callable[[list[str]], subprocess.CompletedProcess]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)


@dataclass(frozen=True)
class ServiceSpec:
    """What the service runs: ``argv`` (absolute program first) and its extra ``environment``."""

    argv: tuple[str, ...]
    environment: dict[str, str] = field(default_factory=dict)
    description: str = "Hearth local LLM server (OpenAI-compatible API)"
    log_file: str | None = None  # launchd only; systemd logs to the journal


def default_spec(serve_args: list[str] | None = None, hearth_home: str | None = None) -> ServiceSpec:
    """The spec for this installation: this interpreter (or the frozen bundle) running ``serve`` plus
    ``serve_args``, with ``HEARTH_HOME`` set to the data folder in use (``hearth_home`` overrides)."""
    from app import paths

    if getattr(sys, "frozen", False):
        argv = [os.path.abspath(sys.executable), "serve"]
    else:
        argv = [os.path.abspath(sys.executable), "-m", "app.cli", "serve"]
    home = hearth_home or str(paths.home().resolve())
    env = {"HEARTH_HOME": home, "PYTHONUNBUFFERED": "1"}
    return ServiceSpec(tuple(argv + list(serve_args or [])), env,
                       log_file=str(Path(home) / "logs" / "service.log"))


# ---------------------------------------------------------------------------------------------- rendering


def _systemd_quote(arg: str) -> str:
    """One word of a systemd command line: ``%`` and ``$`` doubled (specifiers and variables), and the word
    double-quoted with ``\\`` and ``"`` escaped when it holds anything but plain characters."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and re.fullmatch(r"[A-Za-z0-9_@%+=:,./$-]+", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_systemd(spec: ServiceSpec) -> str:
    """The text of ``hearth.service`` (a user unit: ``WantedBy=default.target``)."""
    env = "\n".join(f"Environment={_systemd_quote(f'{k}={v}')}" for k, v in spec.environment.items())
    return (
        "# Written by `hearth service install`; remove with `hearth service uninstall`.\n"
        "[Unit]\n"
        f"Description={spec.description}\n"
        "After=network.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={' '.join(_systemd_quote(a) for a in spec.argv)}\n"
        f"{env}\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "TimeoutStopSec=30\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def render_launchd(spec: ServiceSpec) -> bytes:
    """The launchd agent plist (XML) for ``spec``."""
    plist: dict[str, Any] = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": list(spec.argv),
        "EnvironmentVariables": dict(spec.environment),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ProcessType": "Background",
    }
    if spec.log_file:
        plist["StandardOutPath"] = plist["StandardErrorPath"] = spec.log_file
    return plistlib.dumps(plist)


# ---------------------------------------------------------------------------------------------- where


def manager(system: str | None = None) -> str | None:
    """"systemd" on Linux, "launchd" on macOS, None elsewhere."""
    system = system or sys.platform
    return "systemd" if system.startswith("linux") else "launchd" if system == "darwin" else None


def unit_path(home: Path | None = None, system: str | None = None, env: dict[str, str] | None = None) -> Path:
    """Where the unit goes: ``$XDG_CONFIG_HOME/systemd/user/hearth.service`` (default ``~/.config``) or
    ``~/Library/LaunchAgents/org.hearth.serve.plist``."""
    env = os.environ if env is None else env
    home = Path(home) if home else Path.home()
    kind = manager(system)
    if kind == "launchd":
        return home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
    if kind == "systemd":
        config = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") and home == Path.home() \
            else home / ".config"
        return config / "systemd" / "user" / SYSTEMD_UNIT
    raise OSError(f"no user service manager is supported on {system or sys.platform} (Linux systemd and macOS "
                  "launchd are)")


def _launchd_domain() -> str:
    return f"gui/{os.getuid()}"


def start_commands(path: Path, system: str | None = None) -> list[list[str]]:
    """The commands that load and start the installed unit."""
    if manager(system) == "launchd":
        return [["launchctl", "bootstrap", _launchd_domain(), str(path)]]
    return [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT]]


def stop_commands(path: Path, system: str | None = None) -> list[list[str]]:
    """The commands that stop and unload it."""
    if manager(system) == "launchd":
        return [["launchctl", "bootout", f"{_launchd_domain()}/{LAUNCHD_LABEL}"]]
    return [["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT]]


def logs_hint(system: str | None = None) -> str:
    """Where the service's output goes."""
    if manager(system) == "launchd":
        from app import paths

        return str(paths.logs_dir() / "service.log")
    return f"journalctl --user -u {SYSTEMD_UNIT} -e"


# ---------------------------------------------------------------------------------------------- actions


@dataclass
class ActionResult:
    """What ``install`` / ``uninstall`` did: the file, the commands run with their exit codes and output, and
    whether every one of them succeeded."""

    path: str
    commands: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _run_all(cmds: list[list[str]], runner: Runner, res: ActionResult) -> None:
    for cmd in cmds:
        try:
            r = runner(cmd)
            rc, out = r.returncode, ((r.stdout or "") + (r.stderr or "")).strip()
        except (OSError, subprocess.SubprocessError) as exc:
            rc, out = 127, str(exc)
        res.commands.append({"command": shlex.join(cmd), "returncode": rc, "output": out})
        if rc != 0:
            res.ok = False
            return


def install(spec: ServiceSpec, *, home: Path | None = None, start: bool = True, runner: Runner = _run,
            system: str | None = None) -> ActionResult:
    """Write the unit for ``spec`` (atomically; replaces an older one) and, with ``start``, load and start it."""
    from app.fileio import atomic_write_text

    path = unit_path(home, system)
    path.parent.mkdir(parents=True, exist_ok=True)
    if manager(system) == "launchd":
        if spec.log_file:
            Path(spec.log_file).parent.mkdir(parents=True, exist_ok=True)
        if start and path.exists():  # bootstrap refuses a label that is already loaded
            _run_all(stop_commands(path, system), runner, ActionResult(str(path)))
        atomic_write_text(path, render_launchd(spec).decode("utf-8"))
    else:
        atomic_write_text(path, render_systemd(spec))
    res = ActionResult(str(path))
    if start:
        _run_all(start_commands(path, system), runner, res)
    return res


def uninstall(*, home: Path | None = None, stop: bool = True, runner: Runner = _run,
              system: str | None = None) -> ActionResult:
    """Stop and remove the unit (a missing one is not an error); with systemd, reload the manager after."""
    path = unit_path(home, system)
    res = ActionResult(str(path))
    if stop and path.exists():
        _run_all(stop_commands(path, system), runner, res)
        res.ok = True  # a unit that was not running cannot be stopped; removing it is what counts
    path.unlink(missing_ok=True)
    if stop and manager(system) == "systemd":
        _run_all([["systemctl", "--user", "daemon-reload"]], runner, res)
    return res


# ---------------------------------------------------------------------------------------------- status


def probe_health(host: str, port: int, timeout: float = 1.0) -> dict[str, Any] | None:
    """``GET http://host:port/health`` as JSON (a 503 "no_model" counts: a Hearth server is there), or None
    when nothing (or not Hearth) answers."""
    h = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{h}:{port}/health", timeout=timeout) as r:  # noqa: S310 - loopback
            body = r.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (OSError, ValueError):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "status" in data else None


@dataclass
class ServiceStatus:
    """``installed``: the unit file exists; ``active``: the manager's word ("active", "inactive", "failed",
    "running"..., None when it cannot be asked); ``enabled``: starts at login; ``answering``: ``/health``
    answered on ``host:port`` (``health`` its body)."""

    supported: bool
    manager: str | None
    path: str | None
    installed: bool
    active: str | None
    enabled: bool | None
    host: str
    port: int
    answering: bool
    health: dict[str, Any] | None = None
    note: str = ""

    def summary(self) -> str:
        """One line for people."""
        if not self.supported:
            return self.note or "user services are not supported on this platform"
        if not self.installed:
            return f"not installed ({self.path})"
        state = self.active or "state unknown"
        where = f"http://{self.host}:{self.port}/v1"
        answer = f"answers on {where}" if self.answering else f"nothing answers on {where}"
        model = f" (model {self.health['model']})" if self.health and self.health.get("model") else ""
        return f"installed, {state}{', enabled at login' if self.enabled else ''}; {answer}{model}" + (
            f"; {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def installed_port(path: Path) -> int | None:
    """The ``--port`` pinned in an installed unit, if any."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r"--port\W+(\d+)", text)
    return int(m.group(1)) if m else None


def status(*, home: Path | None = None, runner: Runner = _run, system: str | None = None,
           host: str | None = None, port: int | None = None) -> ServiceStatus:
    """Installed / running / answering, for the service of this user."""
    from app.settings import load_user_settings

    kind = manager(system)
    server = load_user_settings().server
    host = host or server.host
    if kind is None:
        return ServiceStatus(False, None, None, False, None, None, host, port or server.port, False,
                             note=f"no user service manager is supported on {system or sys.platform}")
    path = unit_path(home, system)
    port = port or installed_port(path) or server.port
    installed = path.exists()
    active, enabled, note = _manager_state(kind, runner) if installed else (None, None, "")
    health = probe_health(host, port)
    return ServiceStatus(True, kind, str(path), installed, active, enabled, host, port, health is not None, health,
                         note)


def _manager_state(kind: str, runner: Runner) -> tuple[str | None, bool | None, str]:
    try:
        if kind == "launchd":
            r = runner(["launchctl", "print", f"{_launchd_domain()}/{LAUNCHD_LABEL}"])
            if r.returncode != 0:
                return "not loaded", None, ""
            m = re.search(r"^\s*state = (\S+)", r.stdout or "", re.M)
            return (m.group(1) if m else "loaded"), True, ""
        act = runner(["systemctl", "--user", "is-active", SYSTEMD_UNIT])
        en = runner(["systemctl", "--user", "is-enabled", SYSTEMD_UNIT])
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, f"cannot ask {kind}: {exc}"
    word = (act.stdout or "").strip()
    if not word or "Failed to connect" in (act.stderr or ""):
        return None, None, "the systemd user manager is not reachable"
    return word, (en.stdout or "").strip() == "enabled", ""
