"""``hearth serve`` (the real CLI, the real bundled model) keeps llama.cpp out of the server process: after a
chat completion with logprobs (token bytes from the engine's vocabulary lane) and one with a JSON-schema
``response_format`` (the schema → grammar conversion runs in the server), ``/proc/<pid>/maps`` of the server
lists no libllama, and its engine child's does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.model, pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc")]
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def maps_libllama(pid: int) -> bool:
    try:
        return "libllama" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"hearth serve exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("hearth serve did not become ready")


def test_the_server_process_does_not_map_libllama(bundled_model, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    err = tmp_path / "serve.stderr"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(err, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--model",
                                 str(bundled_model), "--n-ctx", "1024", "--no-prefix-cache"],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=f)
    try:
        wait_ready(url, proc)
        body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 8,
                "temperature": 0, "logprobs": True, "top_logprobs": 2}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        content = choice["logprobs"]["content"]
        assert content and all(len(t["top_logprobs"]) == 2 and isinstance(t["bytes"], list) for t in content)
        assert "".join(t["token"] for t in content) == choice["message"]["content"]
        schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": body["messages"], "max_tokens": 24, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
        assert r.status_code == 200, r.text

        assert not maps_libllama(proc.pid), "the server process itself maps libllama"
        engine_children = [c for c in children(proc.pid) if maps_libllama(c)]
        assert len(engine_children) == 1, children(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert "Traceback" not in err.read_text(), err.read_text()
