"""Headless check of a built bundle: start it offscreen with the local port on, let it load the bundled model,
and ask it a question over HTTP. Exit 0 when the answer comes back.

    python packaging/check_bundle.py [dist/hearth/hearth] [--timeout 300]

Runs the bundle with a fresh temporary ``HEARTH_HOME`` (so the bundled model is assembled from the bundle's own
data, as on a first run) and ``QT_QPA_PLATFORM=offscreen``; standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "dist" / "hearth" / ("hearth.exe" if os.name == "nt" else "hearth")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(port: int, question: str) -> tuple[int, dict]:
    body = json.dumps({"messages": [{"role": "user", "content": question}], "max_tokens": 8,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_answer(proc: subprocess.Popen, port: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the bundle exited with code {proc.returncode} before answering")
        try:
            status, data = ask(port, "What is the capital of France?")
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = f"port not answering yet ({exc})"
        else:
            if status == 200:
                return data
            last = f"HTTP {status}: {data.get('error', {}).get('message', data)}"  # e.g. model still loading
        time.sleep(1.0)
    raise SystemExit(f"no answer within {timeout_s:.0f} s: {last}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM on POSIX; the engine process notices its parent is gone and exits
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", nargs="?", default=str(DEFAULT), help="the built executable")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the first answer")
    args = p.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hearth-bundle-") as home:
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEARTH_HOME": home}
        started = time.monotonic()
        proc = subprocess.Popen([args.bundle, "gui", "--port", str(port)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            data = wait_answer(proc, port, args.timeout)
        finally:
            stop(proc)
            out = proc.stdout.read() if proc.stdout else ""
        answer = data["choices"][0]["message"]["content"]
        print(f"bundle answered on port {port} after {time.monotonic() - started:.1f} s: {answer!r}")
        if "Paris" not in answer:
            print(out[-4000:], file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
