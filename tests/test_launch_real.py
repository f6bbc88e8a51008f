"""``hearth launch aider`` for real: the agent from ``make agent-aider`` against the bundled model, offline.

Run 1 on a fresh data folder: ``hearth launch`` starts its own ``hearth serve``, aider sends its one request
and exits 0 showing an answer, and the port is stopped. Run 2 after that restart: a new ``hearth serve``
process on the same folder (``hearth launch`` finds it) and another question; the port's metrics show the
prompt's shared prefix restored from the disk cache, at least aider's whole system prompt. Every
non-loopback connection goes to a dead proxy; the agent's output must show no failed download. About 2
minutes on 2 cores. Skipped when aider is not installed (``make agent-aider``).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from app.cli import _agents, launch
from benchmarks.launch_agent import two_runs

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def aider() -> str:
    exe = launch.find_executable(_agents.get("aider"))
    if exe is None:
        pytest.skip("aider is not installed: `make agent-aider` puts it in .agents/aider (docs/launch.md)")
    return exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_aider_answers_offline_and_its_system_prompt_comes_back_from_disk(aider, bundled_model, tmp_path: Path):
    result = two_runs(tmp_path, bundled_model, _free_port(), launch_starts_first=True)
    first, second = result["runs"]
    for run in (first, second):
        assert run["returncode"] == 0, run["output"][-3000:]
        assert run["answer"], run["output"][-3000:]  # aider received an answer and showed it
        assert "Tokens:" in run["output"] and run["network_errors"] == [], run["output"][-3000:]
    assert "starting `hearth serve`" in first["output"]  # run 1: the port hearth launch started (and stopped)
    assert "using the port on" in second["output"]  # run 2: the new serve process, found
    m = second["metrics"]
    assert m["generations"] == 1 and m["prompt_tokens"] > 2000  # aider's full code-mode prompt, one request
    assert m["cached_tokens"] >= second["system_prompt_tokens"] > 500, second
    assert not any((tmp_path / "work").glob("*.py"))  # --dry-run: the base model's "edits" wrote nothing
