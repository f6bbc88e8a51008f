"""``hearth launch``: the plan per agent (--print), unknown and missing agents, a port found vs started.

No real agent and no real server: the port is a faked ``probe`` / ``spawn_serve``, the agent a shell script
that records its argv and environment. The real run (aider against the bundled model) is
tests/test_launch_real.py.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from pathlib import Path

import pytest

from app.cli import _agents, launch, main

BUNDLED = "gemma-3-270m-q4_k_m"


@pytest.fixture(autouse=True)
def no_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test asks a real port (/v1/models, /api/ps): whatever listens on 8765 here is not the test's."""
    monkeypatch.setattr(launch, "_get_json", lambda root, path, key: None)


@pytest.fixture
def no_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing answers on the port."""
    monkeypatch.setattr(launch, "probe", lambda host, port: None)


@pytest.fixture
def empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH and the agents folder hold only what a test puts in ``bin``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("HEARTH_AGENTS_DIR", str(tmp_path / "no-agents"))
    return bin_dir


def fake_agent(bin_dir: Path, name: str, rc: int = 0, before_exit: str = "") -> Path:
    """An executable called ``name`` that writes its argv and environment to ``<itself>.json``, runs the shell
    line ``before_exit`` and exits ``rc``."""
    exe = bin_dir / name
    code = ("import json, os, sys; json.dump({'argv': sys.argv[2:], 'env': dict(os.environ)}, "
            "open(sys.argv[1] + '.json', 'w'))")
    record = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} \"$0\" \"$@\""
    exe.write_text(f"#!/bin/sh\n{record}\n{before_exit}\nexit {rc}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def printed(capsys: pytest.CaptureFixture, *argv: str) -> str:
    assert main(["launch", "--print", *argv]) == 0
    return capsys.readouterr().out


# -- --print, per agent ------------------------------------------------------------------------------------
def test_print_aider_points_litellm_at_chat_completions_and_would_start_serve(no_port, empty_path, capsys):
    out = printed(capsys, "aider", "--", "--message", "hi there")
    assert "export OPENAI_API_BASE=http://127.0.0.1:8765/v1" in out
    assert "export LITELLM_LOCAL_MODEL_COST_MAP=True" in out
    last = shlex.split(out.strip().splitlines()[-1])
    assert last[:3] == ["aider", "--model", f"openai/{BUNDLED}"] and last[-2:] == ["--message", "hi there"]
    assert "--no-check-update" in last and "--analytics-disable" in last
    assert "NOT INSTALLED" in out and "make agent-aider" in out
    assert "would start" in out and "serve --host 127.0.0.1 --port 8765 --n-ctx 8192" in out
    assert '"max_input_tokens": 8192' in out  # the metadata file aider reads instead of downloading one


def test_print_claude_uses_messages_and_removes_a_stray_anthropic_key(no_port, empty_path, capsys):
    out = printed(capsys, "--port", "9001", "claude", "--", "-p", "hello")
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:9001" in out
    assert f"export ANTHROPIC_MODEL={BUNDLED}" in out and "unset ANTHROPIC_API_KEY" in out
    assert "export ANTHROPIC_AUTH_TOKEN=hearth" in out
    assert "--n-ctx 32768" in out and out.strip().endswith("claude -p hello")


def test_print_codex_gives_a_responses_provider_as_overrides(no_port, empty_path, capsys):
    out = printed(capsys, "--api-key", "s3cret", "codex", "exec", "say hi")
    argv = shlex.split(out.strip().splitlines()[-1])
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert 'model_providers.hearth.wire_api="responses"' in overrides
    assert 'model_providers.hearth.base_url="http://127.0.0.1:8765/v1"' in overrides
    assert 'model_provider="hearth"' in overrides and f'model="{BUNDLED}"' in overrides
    assert argv[-2:] == ["exec", "say hi"] and "export HEARTH_API_KEY=s3cret" in out


def test_print_opencode_writes_an_openai_compatible_provider(no_port, empty_path, capsys, hearth_home):
    (hearth_home / "models").mkdir(exist_ok=True)
    (hearth_home / "models" / "qwen2.5-coder.gguf").write_bytes(b"")  # installed: --model is checked
    out = printed(capsys, "--model", "qwen2.5-coder", "opencode", "--", "run", "hi")
    conf = hearth_home / "launch" / "opencode" / "opencode.json"
    assert f"export OPENCODE_CONFIG={conf}" in out and "OPENCODE_DISABLE_AUTOUPDATE=1" in out
    body = "\n".join(line[4:] for line in out.splitlines() if line.startswith("#   ") and "serve" not in line)
    provider = json.loads(body)["provider"]["hearth"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:8765/v1" and "qwen2.5-coder" in provider["models"]
    assert not conf.exists()  # --print writes nothing


def test_print_with_a_port_answering_uses_it_and_its_default_model(empty_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"})
    monkeypatch.setattr(launch, "default_model", lambda root, key: "served-model")
    out = printed(capsys, "aider")
    assert "answers; used as it is" in out and "would start" not in out
    assert "--model openai/served-model" in out


def test_print_with_a_port_whose_n_ctx_is_below_the_agents_minimum_warns(empty_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"})
    monkeypatch.setattr(launch, "default_model", lambda root, key: "served-model")
    monkeypatch.setattr(launch, "loaded_n_ctx", lambda root, key, model: 2048 if model == "served-model" else None)
    assert main(["launch", "--print", "--n-ctx", "16384", "aider"]) == 0
    out, err = capsys.readouterr()
    for text in (out, err):  # in the plan, and said on stderr
        assert "serves served-model with n_ctx 2048, below aider's minimum of 8192" in text
        assert "--n-ctx 16384 is ignored: it applies only when `hearth launch` starts the port" in text
    assert '"max_input_tokens": 2048' in out  # aider is told the context the port really has


def test_a_port_found_with_a_small_n_ctx_is_used_with_a_warning(empty_path, monkeypatch, capsys):
    fake_agent(empty_path, "aider")
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"})
    monkeypatch.setattr(launch, "default_model", lambda root, key: "served-model")
    monkeypatch.setattr(launch, "loaded_n_ctx", lambda root, key, model: 4096)
    monkeypatch.setattr(launch, "spawn_serve", lambda *a: pytest.fail("started a server although one answered"))
    assert main(["launch", "aider"]) == 0
    err = capsys.readouterr().err
    assert "n_ctx 4096, below aider's minimum of 8192" in err and "hearth serve --n-ctx 8192" in err
    assert "is ignored" not in err  # no --n-ctx given


# -- errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--port", "99999"], "--port must be from 1 to 65535, got 99999"),
    (["--port", "0"], "--port must be from 1 to 65535, got 0"),
    (["--n-ctx", "10"], "--n-ctx must be from 16 to 1048576, got 10 (aider needs at least 8192)"),
    (["--model", "nope"], "model 'nope' not found; available: gemma-3-270m-q4_k_m"),
])
def test_bad_options_are_one_error_line_before_anything(no_port, empty_path, monkeypatch, capsys, argv, words):
    monkeypatch.setattr(launch, "spawn_serve", lambda *a: pytest.fail("started a server for bad options"))
    for print_only in ([], ["--print"]):
        assert main(["launch", *print_only, *argv, "aider"]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.strip().splitlines() == [f"hearth: error: {words}"]


def test_a_model_the_answering_port_does_not_list_is_refused(empty_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"})
    monkeypatch.setattr(launch, "port_models", lambda root, key: ["served-model"])
    assert main(["launch", "--print", "--model", "nope", "aider"]) == 1
    assert "model 'nope' not found; available: served-model" in capsys.readouterr().err
    assert main(["launch", "--print", "--model", "served-model", "aider"]) == 0


def test_n_ctx_below_the_agents_minimum_is_a_warning_naming_it(no_port, empty_path, capsys):
    assert main(["launch", "--print", "--n-ctx", "4096", "aider"]) == 0
    out, err = capsys.readouterr()
    assert "--n-ctx 4096 is below aider's minimum of 8192" in err and "--n-ctx 4096" in out


def test_unknown_agent_lists_the_known_ones(capsys):
    assert main(["launch", "vim"]) == 1
    err = capsys.readouterr().err
    assert "unknown agent 'vim'" in err and "aider, claude, codex, opencode" in err


def test_missing_agent_names_its_install_command_and_starts_nothing(no_port, empty_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "spawn_serve", lambda *a: pytest.fail("started a server for a missing agent"))
    assert main(["launch", "codex", "--", "exec", "hi"]) == 1
    err = capsys.readouterr().err
    assert "codex is not installed" in err and "npm i -g @openai/codex" in err


def test_an_agent_in_the_agents_folder_is_found(tmp_path, empty_path, monkeypatch):
    folder = tmp_path / "agents"
    (folder / "aider" / "bin").mkdir(parents=True)
    exe = fake_agent(folder / "aider" / "bin", "aider")
    monkeypatch.setenv("HEARTH_AGENTS_DIR", str(folder))
    assert launch.find_executable(_agents.get("aider")) == str(exe)


def test_plan_environ_sets_and_removes():
    plan = _agents.Plan(("x",), {"A": "1", "B": None})
    assert plan.environ({"B": "old", "C": "3"}) == {"A": "1", "C": "3"}


# -- running: a port found, a port started -----------------------------------------------------------------
class FakeServe:
    """Stands in for the ``hearth serve`` process: alive until signalled."""

    def __init__(self, exit_at_once: int | None = None) -> None:
        self.returncode = exit_at_once
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.returncode = 0

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0

    def kill(self) -> None:
        self.returncode = -9


def test_a_port_found_is_used_and_nothing_is_started(empty_path, monkeypatch, hearth_home):
    fake_agent(empty_path, "aider", rc=3)
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"})
    monkeypatch.setattr(launch, "default_model", lambda root, key: "served-model")
    monkeypatch.setattr(launch, "spawn_serve", lambda *a: pytest.fail("started a server although one answered"))
    assert main(["launch", "aider", "--", "--message", "hi"]) == 3  # the agent's exit status
    seen = json.loads((empty_path / "aider.json").read_text())
    assert seen["argv"][:2] == ["--model", "openai/served-model"] and seen["argv"][-2:] == ["--message", "hi"]
    assert seen["env"]["OPENAI_API_BASE"] == "http://127.0.0.1:8765/v1"
    meta = Path(seen["argv"][seen["argv"].index("--model-metadata-file") + 1])
    assert meta.parent == hearth_home / "launch" / "aider" and "openai/served-model" in json.loads(meta.read_text())


def test_no_port_starts_serve_with_the_agents_n_ctx_and_stops_it_after(empty_path, monkeypatch):
    fake_agent(empty_path, "claude")
    proc, started = FakeServe(), []
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"} if started else None)
    monkeypatch.setattr(launch, "default_model", lambda root, key: None)
    monkeypatch.setattr(launch, "spawn_serve", lambda cmd, key, log: started.append((cmd, key)) or proc)
    assert main(["launch", "--port", "9100", "--api-key", "k", "claude", "--", "-p", "hi"]) == 0
    (cmd, key), = started
    assert cmd[cmd.index("--n-ctx") + 1] == "32768" and cmd[cmd.index("--port") + 1] == "9100" and key == "k"
    assert proc.signals == [launch.signal.SIGTERM]  # stopped when the agent exited
    env = json.loads((empty_path / "claude.json").read_text())["env"]
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9100" and env["ANTHROPIC_AUTH_TOKEN"] == "k"
    assert env["ANTHROPIC_MODEL"] == BUNDLED


def test_n_ctx_flag_overrides_the_agents_minimum(empty_path, monkeypatch):
    fake_agent(empty_path, "aider")
    started: list = []
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"} if started else None)
    monkeypatch.setattr(launch, "default_model", lambda root, key: None)
    monkeypatch.setattr(launch, "spawn_serve", lambda cmd, key, log: started.append(cmd) or FakeServe())
    assert main(["launch", "--n-ctx", "20000", "aider"]) == 0
    assert started[0][started[0].index("--n-ctx") + 1] == "20000"
    argv = json.loads((empty_path / "aider.json").read_text())["argv"]
    meta = json.loads(Path(argv[argv.index("--model-metadata-file") + 1]).read_text())
    assert meta[f"openai/{BUNDLED}"]["max_input_tokens"] == 20000  # aider is told the context it gets


def test_a_serve_that_dies_is_reported_with_its_log_and_the_agent_never_runs(empty_path, monkeypatch, capsys,
                                                                            hearth_home):
    fake_agent(empty_path, "aider")
    monkeypatch.setattr(launch, "probe", lambda host, port: None)

    def dead(cmd, key, log):
        log.write_text("OSError: [Errno 98] address already in use\n")
        return FakeServe(exit_at_once=1)

    monkeypatch.setattr(launch, "spawn_serve", dead)
    assert main(["launch", "aider"]) == 1
    assert "address already in use" in capsys.readouterr().err
    assert not (empty_path / "aider.json").exists()


def test_a_failed_start_shows_this_runs_log_only(empty_path, monkeypatch, capsys, hearth_home):
    fake_agent(empty_path, "aider")
    monkeypatch.setattr(launch, "probe", lambda host, port: None)
    old = hearth_home / "logs" / "launch-serve-8765.log"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text("hearth: serving every installed model on http://127.0.0.1:8765/v1\n"
                   "hearth: error: model 'nope' not found\n")  # an earlier run's lines

    def dead(cmd, key, log):
        with open(log, "a") as f:  # as the real one writes: appending to the file it is given
            f.write("hearth: error: port 8765 on 127.0.0.1 is in use\n")
        return FakeServe(exit_at_once=1)

    monkeypatch.setattr(launch, "spawn_serve", dead)
    assert main(["launch", "aider"]) == 1
    err = capsys.readouterr().err
    assert "port 8765 on 127.0.0.1 is in use" in err and str(old) in err
    assert "serving every installed model" not in err and "'nope'" not in err


def test_ctrl_c_belongs_to_the_agent_and_the_started_port_is_still_stopped(empty_path, monkeypatch):
    # the agent sends SIGINT to hearth launch (as a terminal's Ctrl+C reaches both), then leaves with 5
    fake_agent(empty_path, "aider", rc=5, before_exit="kill -INT $PPID; sleep 0.3")
    proc, started = FakeServe(), []
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"} if started else None)
    monkeypatch.setattr(launch, "default_model", lambda root, key: None)
    monkeypatch.setattr(launch, "spawn_serve", lambda cmd, key, log: started.append(cmd) or proc)
    assert main(["launch", "aider"]) == 5
    assert proc.signals == [launch.signal.SIGTERM]


def test_a_sigterm_is_passed_to_the_agent_and_the_started_port_is_stopped(empty_path, monkeypatch):
    fake_agent(empty_path, "aider", rc=0, before_exit="kill -TERM $PPID; sleep 5")  # killed in its sleep
    proc, started = FakeServe(), []
    monkeypatch.setattr(launch, "probe", lambda host, port: {"status": "ok"} if started else None)
    monkeypatch.setattr(launch, "default_model", lambda root, key: None)
    monkeypatch.setattr(launch, "spawn_serve", lambda cmd, key, log: started.append(cmd) or proc)
    assert main(["launch", "aider"]) == 128 + launch.signal.SIGTERM
    assert proc.signals == [launch.signal.SIGTERM]
