"""A real coding agent through ``hearth launch``: aider (``make agent-aider``) against the bundled model, twice,
with a restart of the port between, on a fresh data folder; the figures of docs/launch.md.

Run 1 is cold (an empty prefix cache); the port is then stopped (closing the engine writes the prefix
cache's last chunks to disk) and run 2 goes to a new ``hearth serve`` process on the same folder with the
same n_ctx, asking another question: its prompt shares aider's system prompt (and the example turns after
it), which is restored from the disk cache. Each run records the agent's exit status, its answer, the wall
time of ``hearth launch`` and the port's ``/metrics``: prompt and cached prompt tokens, TTFT (the server's
clock: request accepted → first token). ``system_prompt_tokens`` is aider's system message alone, counted by
the port (``/v1/completions`` with the raw text).

aider runs in its default code mode with the diff edit format (its full system prompt, ~2,300 tokens with the
example turns) and ``--dry-run`` (a 270M base model's reply is not a valid edit and nothing is written), with
every outbound connection sent to a dead proxy: any download it tried would fail and show in its output
(``NETWORK_ERRORS``). Run: ``python -m benchmarks.launch_agent [--json]``; tests/test_launch_real.py runs the
same functions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.servers import ManagedServer

REPO = Path(__file__).resolve().parents[1]
DEAD_PROXY = "http://127.0.0.1:9"  # nothing listens on the discard port: every non-loopback request fails
NETWORK_ERRORS = ("raw.githubusercontent", "HTTPSConnectionPool", "Max retries exceeded", "NameResolutionError",
                  "ProxyError", "openrouter.ai")
QUESTIONS = ("What is the capital of France?", "Name a prime number.")
METRICS = {"prompt_tokens": "hearth_prompt_tokens_total", "cached_tokens": "hearth_cached_prompt_tokens_total",
           "ttft_sum_s": "hearth_ttft_seconds_sum", "generations": "hearth_ttft_seconds_count"}


def aider_args(message: str, history: Path) -> list[str]:
    """aider's own flags for one non-interactive request (after those ``hearth launch`` adds)."""
    return ["--edit-format", "diff", "--dry-run", "--no-git", "--yes-always", "--no-pretty", "--no-fancy-input",
            "--map-tokens", "0", "--llm-history-file", str(history), "--message", message]


def offline_env(home: Path, user_home: Path) -> dict[str, str]:
    """This process's environment with ``HEARTH_HOME``, a fresh ``HOME`` (aider's ~/.aider stays empty) and
    every proxy variable at a dead port, loopback excepted."""
    env = {**os.environ, "HEARTH_HOME": str(home), "HOME": str(user_home), "PYTHONUNBUFFERED": "1"}
    for k in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        env[k] = DEAD_PROXY
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    return env


def prepare_home(root: Path, model: Path) -> Path:
    """A fresh data folder under ``root`` with the bundled model linked into its models folder."""
    home = root / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / model.name).symlink_to(model)
    (root / "user-home").mkdir()
    (root / "work").mkdir()
    return home


def run_launch(root: Path, port: int, message: str, history: Path, timeout_s: float = 900) -> dict[str, Any]:
    """``hearth launch --port PORT aider -- ...`` in ``root/work``; returns its exit status, output, answer
    and wall time."""
    cmd = [sys.executable, "-m", "app.cli", "launch", "--port", str(port), "aider", "--",
           *aider_args(message, history)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=root / "work", env=offline_env(root / "home", root / "user-home"),
                       capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    return {"command": cmd[1:], "returncode": r.returncode, "wall_s": round(time.perf_counter() - t0, 2),
            "answer": answer_of(r.stdout), "output": out,
            "network_errors": [e for e in NETWORK_ERRORS if e in out]}


def answer_of(stdout: str) -> str:
    """The model's answer as aider shows it: the lines between its banner and its ``Tokens:`` line."""
    lines = stdout.splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith("Repo-map:")), default=-1)
    end = next((i for i, line in enumerate(lines) if line.startswith("Tokens:")), len(lines))
    return "\n".join(lines[start + 1:end]).strip()


def serving(root: Path, port: int, n_ctx: int) -> ManagedServer:
    """``hearth serve`` exactly as ``hearth launch`` starts it (same n_ctx, so the same cache fingerprint),
    on the data folder of ``root``."""
    from app.cli.launch import serve_command

    return ManagedServer("hearth serve", serve_command("127.0.0.1", port, n_ctx, None), f"http://127.0.0.1:{port}",
                         root / "serve.log", env=offline_env(root / "home", root / "user-home"),
                         ready_timeout_s=300, leader_only_term=True)


def metrics(url: str) -> dict[str, float]:
    """The port's prompt, cached and TTFT counters (``METRICS``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:  # noqa: S310 - loopback
        text = r.read().decode()
    out = {}
    for key, name in METRICS.items():
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        out[key] = float(m.group(1)) if m else 0.0
    return out


def system_prompt(history: Path) -> str:
    """aider's system message of its first request, from its ``--llm-history-file``."""
    lines, body = history.read_text().splitlines(), []
    first = lines.index("-------") + 1
    for line in lines[first:]:
        if not line.startswith("SYSTEM"):
            break
        body.append(line[7:])
    return "\n".join(body)


def count_tokens(url: str, text: str) -> int:
    """Tokens of ``text`` as the port's model reads it (``usage.prompt_tokens`` of a 1-token completion)."""
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(
        {"prompt": text, "max_tokens": 1, "temperature": 0}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310 - loopback
        return int(json.loads(r.read())["usage"]["prompt_tokens"])


def measured_run(root: Path, port: int, n_ctx: int, message: str, history: Path) -> dict[str, Any]:
    """One agent run against a ``hearth serve`` this function starts and stops (``hearth launch`` finds it):
    the run plus the port's metrics after it."""
    with serving(root, port, n_ctx) as srv:
        run = run_launch(root, port, message, history)
        run["metrics"] = metrics(srv.url)
        run["ttft_s"] = round(run["metrics"]["ttft_sum_s"] / max(run["metrics"]["generations"], 1), 3)
        if history.exists():
            run["system_prompt_tokens"] = count_tokens(srv.url, system_prompt(history))
    return run


def two_runs(root: Path, model: Path, port: int, launch_starts_first: bool = False) -> dict[str, Any]:
    """Run 1 on a fresh data folder, then run 2 after a restart. With ``launch_starts_first`` run 1's port is
    the ``hearth serve`` that ``hearth launch`` starts and stops itself (no metrics then)."""
    from app.cli._agents import AIDER_MIN_N_CTX

    prepare_home(root, model)
    if launch_starts_first:
        first = run_launch(root, port, QUESTIONS[0], root / "history-1.txt")
    else:
        first = measured_run(root, port, AIDER_MIN_N_CTX, QUESTIONS[0], root / "history-1.txt")
    second = measured_run(root, port, AIDER_MIN_N_CTX, QUESTIONS[1], root / "history-2.txt")
    return {"n_ctx": AIDER_MIN_N_CTX, "runs": [first, second]}


def main(argv: list[str] | None = None) -> int:
    """Run the two runs on a temporary folder and print their figures (``--json``: everything)."""
    import tempfile

    from app.catalog.bundled import ensure_bundled_model
    from benchmarks.peer import free_port

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print every field, the agent's output included")
    args = ap.parse_args(argv)
    model = ensure_bundled_model(REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf")
    with tempfile.TemporaryDirectory(prefix="hearth-launch-agent-") as tmp:
        result = two_runs(Path(tmp), model, free_port())
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for i, run in enumerate(result["runs"], 1):
        m = run["metrics"]
        print(f"run {i}: exit {run['returncode']}, launch wall {run['wall_s']} s, TTFT {run['ttft_s']} s, "
              f"prompt {m['prompt_tokens']:.0f} tokens, cached {m['cached_tokens']:.0f}, system prompt "
              f"{run.get('system_prompt_tokens')} tokens, network errors {run['network_errors'] or 'none'}; "
              f"answer: {run['answer'][:80]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
