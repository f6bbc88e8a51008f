"""``hearth launch AGENT [-- AGENT ARGS]``: run a coding agent (aider, Claude Code, Codex, opencode) against
Hearth's port.

``--port``, ``--n-ctx`` and ``--model`` are checked before anything runs (one error line each). The port is
found first: whatever answers ``/health`` as Hearth on the configured host and port (a ``hearth serve`` or
``hearth service``) is used as it is, with a warning when its loaded n_ctx is below the agent's minimum.
Otherwise ``hearth serve`` is started in the background with an n_ctx the agent's system prompt fits in
(``_agents.AGENTS``, ``--n-ctx`` overrides), its log emptied first, and stopped when the agent exits. The
agent's exit status is ``hearth launch``'s. ``--print`` shows the command, environment and config files and
runs nothing. Per-agent wiring lives in ``app.cli._agents``; the table and the measured run: docs/launch.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from app.cli import _agents
from app.errors import HearthError, InvalidRequest

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # a cold start loads the model and may assemble the bundled one first
STOP_TIMEOUT_S = 30.0  # closing the engine saves the prefix cache's last chunks to disk first
N_CTX_RANGE = (16, 1 << 20)  # what the engine's LoadSettings accepts


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``hearth launch`` to the CLI's subcommands."""
    p = sub.add_parser("launch", help="run a coding agent (aider, claude, codex, opencode) against Hearth's port",
                       description="Find Hearth's port (or start `hearth serve` until the agent exits) and run a "
                                   "coding agent pointed at it. Hearth's options go before AGENT, the "
                                   "agent's after it, e.g. `hearth launch --print aider -- --message "
                                   "\"...\"`. Agents: "
                                   + ", ".join(f"{a.name} ({a.api})" for a in _agents.AGENTS.values()) + ".")
    p.add_argument("agent", nargs="?", help="the agent: " + ", ".join(_agents.AGENTS))
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the command, environment and config files; run nothing")
    p.add_argument("--host", default=None, help="the port's address (default from settings: 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="the port (default from settings: 8765)")
    p.add_argument("--model", default=None, help="model id the agent asks for (default: the port's default)")
    p.add_argument("--n-ctx", type=int, default=None,
                   help="context for a `hearth serve` started here (default: the agent's minimum, docs/launch.md)")
    p.add_argument("--api-key", default=os.environ.get("HEARTH_API_KEY"),
                   help="the port's key (default: $HEARTH_API_KEY, else settings.json's)")
    p.add_argument("agent_args", nargs=argparse.REMAINDER,
                   help="everything after AGENT goes to the agent (a leading -- is dropped); Hearth's options "
                        "go before AGENT")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the options, resolve the agent and the port, then print the plan or run the agent; returns the
    agent's exit code."""
    from app.settings import load_user_settings

    agent = _agents.get(args.agent)
    rest = list(args.agent_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    server = load_user_settings().server
    host, port = args.host or server.host, args.port if args.port is not None else server.port
    key = args.api_key or server.api_key or None
    check_port(port)
    n_ctx = check_n_ctx(args.n_ctx, agent)
    check_model(args.model, host, port, key)
    exe = find_executable(agent)
    if args.print_only:
        return _print(agent, exe, host, port, key, n_ctx, args.model, rest, args.n_ctx)
    if exe is None:
        raise _not_installed(agent)
    with port_for(host, port, key, n_ctx, args.model, agent=agent, n_ctx_flag=args.n_ctx) as endpoint:
        plan = agent.plan(endpoint, config_dir(agent), rest, exe)
        return run_plan(plan)


# -- the options, checked before anything runs ---------------------------------------------------------------
def check_port(port: int) -> None:
    """Raises ``InvalidRequest`` unless ``port`` is a TCP port (1-65535)."""
    if not 1 <= port <= 65535:
        raise InvalidRequest(f"--port must be from 1 to 65535, got {port}", param="port")


def check_n_ctx(n_ctx: int | None, agent: _agents.Agent) -> int:
    """The n_ctx a port started here gets: ``n_ctx`` (``--n-ctx``), else the agent's minimum. Raises
    ``InvalidRequest`` outside what the engine accepts; below the agent's minimum, a warning on stderr."""
    if n_ctx is None:
        return agent.min_n_ctx
    low, high = N_CTX_RANGE
    if not low <= n_ctx <= high:
        raise InvalidRequest(f"--n-ctx must be from {low} to {high}, got {n_ctx} ({agent.name} needs at least "
                             f"{agent.min_n_ctx})", param="n_ctx")
    if n_ctx < agent.min_n_ctx:
        print(f"hearth: warning: --n-ctx {n_ctx} is below {agent.name}'s minimum of {agent.min_n_ctx} "
              "(docs/launch.md): its system prompt and tools may not fit, and its requests fail with "
              "context_length_exceeded", file=sys.stderr)
    return n_ctx


def check_model(model: str | None, host: str, port: int, key: str | None) -> None:
    """Raises ``ModelNotFound`` (listing the ids there are) unless ``model`` (``--model``) names a model: one
    the port that answers lists, else (no port yet) an installed model or a model file, as ``hearth serve
    --model`` resolves it. None (the default model) is not checked."""
    from app import paths
    from app.catalog.registry import BUNDLED_MODEL_ID, resolve_model
    from app.errors import ModelNotFound

    if not model or model in (BUNDLED_MODEL_ID, paths.BUNDLED_MODEL_FILENAME):
        return
    if probe(host, port) is None:
        resolve_model(model)
        return
    listed = port_models(_root(host, port), key)
    if listed is not None and _model_id(model) not in listed and model not in listed:
        raise ModelNotFound(model, listed)


# -- the agent's executable --------------------------------------------------------------------------------
def agents_dir() -> Path:
    """Where ``make agent-*`` installs agents: ``$HEARTH_AGENTS_DIR``, else ``.agents`` in the source tree."""
    env = os.environ.get("HEARTH_AGENTS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / ".agents"


def find_executable(agent: _agents.Agent) -> str | None:
    """The agent's executable: on PATH, else in ``agents_dir()`` (``<name>/bin``: a venv; ``npm/bin``: an npm
    prefix); None when it is nowhere."""
    found = shutil.which(agent.executable)
    if found:
        return found
    base = agents_dir()
    extra = os.pathsep.join(str(d) for d in (base / agent.name / "bin", base / "npm" / "bin"))
    return shutil.which(agent.executable, path=extra)


def _not_installed(agent: _agents.Agent) -> HearthError:
    return _agents.AgentNotInstalled(f"{agent.name} is not installed ({agent.executable!r} is not on PATH nor in "
                                     f"{agents_dir()}); install it with: {agent.install}")


def config_dir(agent: _agents.Agent) -> Path:
    """The folder for the agent's generated config files (under the data folder)."""
    from app import paths

    return paths.home() / "launch" / agent.name


# -- the port -----------------------------------------------------------------------------------------------
def _root(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def probe(host: str, port: int) -> dict | None:
    """``/health`` of a Hearth port at ``host:port`` as JSON, None when no Hearth answers."""
    from app.service_unit import probe_health

    return probe_health(host, port)


def _get_json(root: str, path: str, key: str | None) -> Any:
    """``GET root+path`` as JSON (with the key), None when it cannot be asked."""
    req = urllib.request.Request(f"{root}{path}", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - the loopback port
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def port_models(root: str, key: str | None) -> list[str] | None:
    """The chat model ids the port lists (``/v1/models``, the default first), None when it cannot be asked."""
    try:
        data = _get_json(root, "/v1/models", key)["data"]
        return [m["id"] for m in data if isinstance(m, dict) and m.get("hearth", {}).get("kind", "chat") == "chat"]
    except (KeyError, TypeError, AttributeError):
        return None


def default_model(root: str, key: str | None) -> str | None:
    """The port's default model id (the first of ``/v1/models``), None when it cannot be asked."""
    ids = port_models(root, key)
    return ids[0] if ids else None


def loaded_n_ctx(root: str, key: str | None, model: str) -> int | None:
    """The n_ctx ``model`` is loaded with on the port (``/api/ps``' ``context_length``, known for the port's
    default model while it is loaded), None when not known."""
    try:
        for m in _get_json(root, "/api/ps", key)["models"]:
            if model in (m.get("name"), m.get("model")) and isinstance(m.get("context_length"), int):
                return m["context_length"]
    except (KeyError, TypeError, AttributeError):
        pass
    return None


def existing_port(root: str, key: str | None, model: str, agent: _agents.Agent,
                  n_ctx_flag: int | None) -> tuple[int | None, list[str]]:
    """What a port that already answers offers ``agent``: ``(its loaded n_ctx or None, notes for the
    person)``; a note warns when that n_ctx is below the agent's minimum, and when ``--n-ctx`` was given
    (it applies only to a port started here)."""
    have, need = loaded_n_ctx(root, key, model), agent.min_n_ctx
    if have is None:
        notes = [f"using the port on {root} as it is; its n_ctx for {model} is not known until the model is "
                 f"loaded ({agent.name} needs at least {need})"]
    elif have < need:
        notes = [f"warning: the port on {root} serves {model} with n_ctx {have}, below {agent.name}'s minimum "
                 f"of {need}: its requests may fail with context_length_exceeded; restart that port with "
                 f"`hearth serve --n-ctx {need}` (it is used as it is)"]
    else:
        notes = [f"using the port on {root} as it is ({model}: n_ctx {have}; {agent.name} needs at least {need})"]
    if n_ctx_flag is not None:
        notes.append(f"warning: --n-ctx {n_ctx_flag} is ignored: it applies only when `hearth launch` starts the "
                     f"port, and the port on {root} keeps its own n_ctx")
    return have, notes


def _model_id(model: str | None) -> str:
    from app.catalog.registry import BUNDLED_MODEL_ID, model_id

    if not model:
        return BUNDLED_MODEL_ID
    return model_id(model) if model.lower().endswith(".gguf") else model  # a file's id is its stem; an id as is


def _port_model(root: str, key: str | None, model: str | None) -> str:
    """The model id the agent asks the port at ``root`` for: ``model``'s (``--model``), else the port's default,
    else the bundled model's."""
    return _model_id(model) if model else default_model(root, key) or _model_id(None)


def serve_command(host: str, port: int, n_ctx: int, model: str | None) -> list[str]:
    """The ``hearth serve`` a launch starts when no port answers. ``--model`` (default: the bundled one) makes it
    load the model before it answers, so the agent's first request does not wait for the load."""
    from app.catalog.registry import BUNDLED_MODEL_ID

    return [sys.executable, "-m", "app.cli", "serve", "--host", host, "--port", str(port), "--n-ctx", str(n_ctx),
            "--model", model or BUNDLED_MODEL_ID]


def spawn_serve(cmd: list[str], key: str | None, log_path: Path) -> subprocess.Popen:
    """Start ``cmd`` in its own session (Ctrl+C in the agent does not reach it), output to ``log_path``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if key:
        env["HEARTH_API_KEY"] = key
    with open(log_path, "ab") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def stop_serve(proc: subprocess.Popen) -> None:
    """SIGTERM (``hearth serve`` closes its engines, which saves the prefix cache), then SIGKILL after
    ``STOP_TIMEOUT_S``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)  # the leader alone: it closes its engine processes itself
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the engine children go too
        except OSError:
            proc.kill()
        proc.wait()


def _wait_ready(proc: subprocess.Popen, host: str, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
            raise HearthError(f"`hearth serve` exited ({proc.returncode}) before answering; its log "
                              f"({log_path}):\n{tail}")
        health = probe(host, port)
        if health and health.get("status") == "ok":
            return
        if time.monotonic() > deadline:
            raise HearthError(f"`hearth serve` did not answer on {_root(host, port)} within "
                              f"{READY_TIMEOUT_S:.0f} s (log: {log_path})")
        time.sleep(0.25)


def serve_log(port: int) -> Path:
    """The log of the ``hearth serve`` a launch starts on ``port`` (``logs/launch-serve-<port>.log``), emptied:
    each run's log holds that run's lines only."""
    from app import paths

    path = paths.logs_dir() / f"launch-serve-{port}.log"
    path.write_bytes(b"")
    return path


@contextmanager
def port_for(host: str, port: int, key: str | None, n_ctx: int, model: str | None,
             agent: _agents.Agent | None = None, n_ctx_flag: int | None = None) -> Iterator[_agents.Endpoint]:
    """The endpoint of the Hearth port on ``host:port``: the one that answers (with ``agent``, a warning when
    its n_ctx is below the agent's minimum or ``n_ctx_flag`` would be ignored), else a ``hearth serve``
    started here with ``n_ctx`` and stopped when the block ends."""
    root = _root(host, port)
    if probe(host, port) is not None:
        mid = _port_model(root, key, model)
        have, notes = existing_port(root, key, mid, agent, n_ctx_flag) if agent else (None, [])
        for note in notes:
            print(f"hearth: {note}", file=sys.stderr)
        yield _agents.Endpoint(root, mid, key, have)
        return
    log_path = serve_log(port)
    print(f"hearth: starting `hearth serve` on {root} with n_ctx {n_ctx} (log: {log_path})", file=sys.stderr)
    proc = spawn_serve(serve_command(host, port, n_ctx, model), key, log_path)
    try:
        _wait_ready(proc, host, port, log_path)
        yield _agents.Endpoint(root, _port_model(root, key, model), key, n_ctx)
    finally:
        stop_serve(proc)


# -- running and printing -----------------------------------------------------------------------------------
def write_files(plan: _agents.Plan) -> None:
    """Write the plan's config files (atomically)."""
    from app.fileio import atomic_write_text

    for path, text in plan.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)


def run_plan(plan: _agents.Plan) -> int:
    """Write the plan's files and run its command in the current folder; returns its exit code (128 + N when
    signal N ended it, as shells say). Ctrl+C belongs to the agent (aider and Claude Code stop an answer with
    it, and leave on their own terms), so this process waits through it; a SIGTERM to this process is passed
    on to the agent, and the port started for it is still stopped afterwards."""
    write_files(plan)
    log.debug("launch: %s", shlex.join(plan.argv))
    previous = signal.signal(signal.SIGINT, lambda *_: None)  # a handler, not SIG_IGN: exec resets it
    previous_term = signal.getsignal(signal.SIGTERM)
    try:
        proc = subprocess.Popen(list(plan.argv), env=plan.environ(dict(os.environ)))
        signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
        rc = proc.wait()
        return 128 - rc if rc < 0 else rc
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


def _print(agent: _agents.Agent, exe: str | None, host: str, port: int, key: str | None, n_ctx: int,
           model: str | None, rest: list[str], n_ctx_flag: int | None = None) -> int:
    root = _root(host, port)
    found = probe(host, port) is not None
    mid = _port_model(root, key, model) if found else _model_id(model)
    have, notes = existing_port(root, key, mid, agent, n_ctx_flag) if found else (None, [])
    endpoint = _agents.Endpoint(root, mid, key, have if found else n_ctx)
    plan = agent.plan(endpoint, config_dir(agent), rest, exe)
    lines = [f"# agent: {agent.name} via {agent.api}; minimum n_ctx {agent.min_n_ctx}"]
    if exe is None:
        lines.append(f"# NOT INSTALLED; install with: {agent.install}")
    if found:
        lines.append(f"# port: {root} answers; used as it is")
        lines += [f"# {note}" for note in notes]
    else:
        lines.append(f"# port: nothing answers on {root}; would start (and stop when the agent exits):")
        lines.append("#   " + shlex.join(serve_command(host, port, n_ctx, model)))
    for path, text in plan.files.items():
        lines += [f"# file {path}:", *("#   " + t for t in text.rstrip("\n").splitlines())]
    lines += [f"unset {k}" for k, v in plan.env.items() if v is None]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in plan.env.items() if v is not None]
    lines.append(shlex.join(plan.argv))
    print("\n".join(lines))
    for note in notes:
        if note.startswith("warning:"):
            print(f"hearth: {note}", file=sys.stderr)
    return 0
