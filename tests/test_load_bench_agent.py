"""``hearth bench load``'s agent workload and resident-memory figures, without a model: the agent prompts
(deterministic, one preamble shared by the sessions of a round, sizes about right, each step's prompt
extending the previous one), the phases and their clocks over scripted servers, a real restart of a stand-in
server process, the RSS of a process tree (this process and a child ``sleep``), the ``hearth serve`` command
of the process target, and the workloads that need restartable targets."""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

import pytest

from benchmarks import agent_workload as aw
from benchmarks import load_bench, rss_tree
from benchmarks.loadstats import RequestRecord
from benchmarks.servers import ManagedServer


def _cfg(*argv: str) -> argparse.Namespace:
    return load_bench.parser().parse_args(list(argv))


# -- prompts --------------------------------------------------------------------------------------------------
def test_preamble_is_deterministic_unique_per_seed_and_about_the_asked_size():
    a, b = aw.preamble(random.Random("0:0:agent")), aw.preamble(random.Random("0:0:agent"))
    c = aw.preamble(random.Random("0:1:agent"))
    assert a == b and a != c
    assert a.splitlines()[0] != c.splitlines()[0]  # the first line differs: no round reuses another's prefix
    for tokens in (1500, 3000):
        est = aw.approx_tokens(aw.preamble(random.Random(tokens), tokens), aw.PREAMBLE_CHARS_PER_TOKEN)
        assert tokens <= est < tokens + 60  # standing orders of ~50 tokens fill it up to the size
    assert all(f"### {name}" in a for name, _, _ in aw.TOOLS) and "## Rules" in a


def test_sessions_share_the_preamble_and_each_step_extends_the_previous_prompt():
    rng = random.Random(7)
    pre = aw.preamble(rng, 1500)
    s1 = aw.plan_session(rng, pre, steps=5, step_tokens=260, answer_tokens=64, name="A")
    s2 = aw.plan_session(rng, pre, steps=5, step_tokens=260, answer_tokens=64, name="B")
    assert s1.header != s2.header and s1.steps != s2.steps
    assert s1.prompt(0).startswith(pre) and s2.prompt(0).startswith(pre)
    for k in range(5):  # an answer of ~64 tokens: ~260 new tokens per step
        est = aw.approx_tokens(s1.steps[k], aw.STEP_CHARS_PER_TOKEN)  # frame and observation
        assert 260 - 64 - 30 <= est <= 260 - 64 + 30, est
        assert s1.steps[k].startswith(f"\nStep {k + 1}\nObservation: ") and s1.steps[k].endswith(aw.ANSWER_CUE)
    with pytest.raises(ValueError, match="needs the answers"):
        s1.prompt(1)
    answers = [f" I call lookup_manifest for step {k}." for k in range(4)]
    for k, ans in enumerate(answers):
        before = s1.prompt(k)
        s1.answers.append(ans)
        assert s1.prompt(k + 1) == before + ans + s1.steps[k + 1]  # a strict extension: prefix caching applies
    again = aw.plan_session(random.Random(7), aw.preamble(random.Random(7), 1500), 5)
    assert again.steps == aw.plan_session(random.Random(7), aw.preamble(random.Random(7), 1500), 5).steps


def test_plan_is_the_same_for_every_target_of_a_round():
    cfg = _cfg()
    p1 = aw.make_plan(load_bench.cell_rng(3, 0, "agent"), cfg, load_bench.long_prompt)
    p2 = aw.make_plan(load_bench.cell_rng(3, 0, "agent"), cfg, load_bench.long_prompt)
    assert (p1.preamble, p1.first.steps, p1.second.steps, p1.long_prompt) == \
        (p2.preamble, p2.first.steps, p2.second.steps, p2.long_prompt)
    assert len(p1.first.steps) == cfg.agent_steps + cfg.agent_more_steps and len(p1.second.steps) == cfg.agent_steps
    assert p1.first.preamble is p1.second.preamble
    long_est = len(p1.long_prompt) / load_bench.LEDGER_CHARS_PER_TOKEN
    assert cfg.long_tokens <= long_est < cfg.long_tokens + 60


# -- the phases over a scripted target --------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_phases_run_in_order_with_three_restarts_and_their_clocks(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(aw.time, "perf_counter", clock)
    monkeypatch.setattr(aw.time, "sleep", lambda s: setattr(clock, "t", clock.t + s))
    events: list[str] = []

    def send(prompt: str, kind: str) -> RequestRecord:
        events.append(kind)
        r = RequestRecord(send_s=clock.t, status="ok", text=f" answer {len(events)}", prompt_tokens=len(prompt))
        r.first_token_s = clock.t + 0.5
        clock.t += 1.0
        r.end_s = clock.t
        return r

    def restart() -> dict:
        events.append("restart")
        started = clock.t + 0.25  # stop takes 0.25 s, then the new process takes 2 s to be ready
        clock.t += 2.25
        return {"started_s": started, "ready_s": clock.t, "stop_s": 0.25}

    plan = aw.make_plan(random.Random(1), _cfg("--agent-steps", "3", "--agent-more-steps", "2"),
                        load_bench.long_prompt)
    records, extra = aw.run_phases(plan, 3, send, restart, lambda: events.append("warm-up"), settle_s=1.0)
    assert events == (["agent-a"] * 3 + ["restart", "warm-up"] + ["agent-b"] * 3 + ["restart", "warm-up"]
                      + ["agent-a"] * 2 + ["agent-long-seen", "restart", "agent-long-after-restart"])
    ph = extra["phases"]
    assert [ph[n]["seconds"] for n in aw.AGENT_PHASE_NAMES[:3]] == [3.0, 3.0, 2.0]
    d = ph["start_to_first_token"]
    assert d["seconds"] == pytest.approx(2.0 + 0.5)  # spawn -> ready 2 s, then TTFT 0.5 s
    assert d["info"]["spawn_to_ready_s"] == pytest.approx(2.0) and d["info"]["ttft_s"] == pytest.approx(0.5)
    assert len(records) == 3 + 3 + 2 + 2 and extra["long_seen"] == 8
    assert [r["spawn_to_ready_s"] for r in extra["restarts"]] == [pytest.approx(2.0)] * 3
    assert "started_s" not in extra["restarts"][0]  # no absolute perf_counter stamps in the report
    # (c) continues session A with its own answers: its first prompt holds step 3's answer
    assert records[6].prompt_tokens > records[2].prompt_tokens


def test_a_failed_step_ends_its_session_and_the_continuation():
    calls = []

    def send(prompt, kind):
        calls.append(kind)
        now = time.perf_counter()
        status = "failed" if len(calls) == 2 else "ok"
        return RequestRecord(send_s=now, first_token_s=now, end_s=now, status=status, text="x")

    plan = aw.make_plan(random.Random(2), _cfg(), load_bench.long_prompt)
    records, extra = aw.run_phases(plan, 5, send, lambda: {"started_s": 0.0, "ready_s": 0.0}, lambda: None, 0.0)
    assert extra["phases"]["session"]["seconds"] is None
    assert extra["phases"]["session_continued_after_restart"]["info"]["skipped"] == "session A failed"
    assert extra["phases"]["new_session_after_restart"]["seconds"] is not None
    assert calls.count("agent-a") == 2 and calls.count("agent-b") == 5


# -- a real restart of a stand-in server process ------------------------------------------------------------------
STAND_IN = """\
# A minimal OpenAI-compatible stand-in (stdlib only, so it starts in a blink): /health, streamed /v1/completions.
import http.server, json, os, sys
with open(os.environ["STAND_IN_STARTS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(b'{"status": "ok"}')
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
        pieces = [" I", " call", " lookup", "_manifest", "."][:body["max_tokens"]]
        for p in pieces:
            self.wfile.write(b"data: " + json.dumps({"choices": [{"text": p}]}).encode() + b"\\n\\n")
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(pieces)}
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\\n\\n")
        self.wfile.write(b"data: [DONE]\\n\\n")
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_agent_cell_over_a_restartable_stand_in_process(tmp_path, monkeypatch):
    """The agent cell restarts a real process (same port, new pid) three times and reports every phase."""
    import httpx

    from benchmarks.peer import free_port

    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    starts = tmp_path / "starts"
    port = free_port()
    env = {**os.environ, "STAND_IN_STARTS": str(starts)}
    server = ManagedServer("stand-in", [sys.executable, str(script), str(port)], f"http://127.0.0.1:{port}",
                           tmp_path / "log", env=env, ready_timeout_s=60)
    cfg = _cfg("--agent-steps", "2", "--agent-more-steps", "1", "--agent-preamble-tokens", "100",
               "--agent-step-tokens", "80", "--agent-max-tokens", "4", "--long-tokens", "100",
               "--agent-settle-s", "0")
    with server:
        t = load_bench.Target("stand-in", server.url, "stand-in", {}, server=server, memory_pid=server.pid)
        with httpx.Client(base_url=server.url, timeout=30,
                          limits=httpx.Limits(max_keepalive_connections=0)) as t.client:
            run = load_bench.run_cell(cfg, t, load_bench.Cell("agent", "agent"), 0)
        pids = starts.read_text().split()
        assert len(pids) == 4 and len(set(pids)) == 4 and t.memory_pid == int(pids[-1]) == server.pid
    assert [r.status for r in run.records] == ["ok"] * (2 + 2 + 1 + 2)
    ph = run.extra["phases"]
    assert all(ph[n]["seconds"] > 0 for n in aw.AGENT_PHASE_NAMES)
    assert ph["start_to_first_token"]["seconds"] > ph["start_to_first_token"]["info"]["spawn_to_ready_s"] > 0
    assert run.extra["memory_after_last_restart"]["root_pid"] == int(pids[-1])
    assert run.records[0].text == " I call lookup_manifest" and run.records[0].completion_tokens == 4
    with pytest.raises(ProcessLookupError):
        os.kill(int(pids[-1]), 0)


# -- resident memory of a process tree -----------------------------------------------------------------------------
def test_rss_tree_of_this_process_and_a_child_sleep():
    child = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while child.pid not in rss_tree.descendants(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.01)
        m = rss_tree.tree_memory(os.getpid(), note="this test")
        pids = [p["pid"] for p in m["processes"]]
        assert pids[0] == os.getpid() and child.pid in pids and m["root_pid"] == os.getpid()
        sleep = next(p for p in m["processes"] if p["pid"] == child.pid)
        assert sleep["name"] == "sleep" and sleep["ppid"] == os.getpid() and sleep["cmdline"] == "sleep 30"
        assert 0 < sleep["rss_mib"] < m["processes"][0]["rss_mib"]
        assert m["rss_mib"] == pytest.approx(sum(p["rss_mib"] for p in m["processes"]))
        with open(f"/proc/{os.getpid()}/status") as f:
            vm = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        assert m["processes"][0]["rss_mib"] == pytest.approx(vm / 1024, rel=0.2)
        if m["pss_mib"] is not None:
            assert m["pss_mib"] <= m["rss_mib"] + 1e-9
        only = rss_tree.tree_memory(child.pid)
        assert [p["pid"] for p in only["processes"]] == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert child.pid not in rss_tree.descendants(os.getpid())
    assert rss_tree.tree_memory(child.pid)["rss_mib"] is None  # gone: no figure, never 0


def test_parent_links_read_from_a_proc_folder_with_odd_command_names(tmp_path):
    def proc(pid: int, ppid: int, comm: str, rss_kib: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")
        (d / "status").write_text(f"Name:\t{comm}\nVmRSS:\t{rss_kib} kB\n")
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(comm.encode() + b"\0--flag\0")

    proc(10, 1, "hearth serve", 1024)
    proc(11, 10, "py (engine) x", 2048)
    proc(12, 11, ") evil (", 512)
    proc(13, 1, "other", 4096)
    (tmp_path / "self").mkdir()  # not a pid
    assert rss_tree.parent_of(12, tmp_path) == 11
    assert rss_tree.descendants(10, tmp_path) == [11, 12]
    m = rss_tree.tree_memory(10, tmp_path)
    assert [p["pid"] for p in m["processes"]] == [10, 11, 12] and m["rss_mib"] == pytest.approx(3.5)
    assert m["pss_mib"] is None  # no smaps_rollup here
    assert m["processes"][1]["cmdline"] == "py (engine) x --flag"


# -- the Hearth process target and the workloads that need it --------------------------------------------------
def test_hearth_serve_command_passes_the_flags_given_and_nothing_else():
    argv = load_bench.hearth_serve_command(_cfg(), "/m/model.gguf", 4321)
    i = argv.index("serve")
    assert argv[i:] == ["serve", "--host", "127.0.0.1", "--port", "4321", "--model", "/m/model.gguf", "--ttl", "-1"]
    argv = load_bench.hearth_serve_command(
        _cfg("--n-ctx", "2048", "--parallel", "4", "--n-threads", "2", "--no-flash-attn", "--type-k", "q8_0",
             "--no-prefix-cache", "--cache-budget-mb", "512", "--max-queue", "8", "--no-mmap"), "m.gguf", 1)
    tail = argv[argv.index("-1") + 1:]
    assert tail == ["--max-queue", "8", "--n-ctx", "2048", "--n-threads", "2", "--parallel", "4", "--type-k", "q8_0",
                    "--cache-budget-mb", "512", "--no-flash-attn", "--no-mmap", "--no-prefix-cache"]


def test_agent_needs_targets_the_benchmark_starts(capsys):
    assert load_bench.resolve_workloads(_cfg()) == [w for w in load_bench.WORKLOADS if w not in load_bench.OPT_IN]
    assert "agent" not in load_bench.resolve_workloads(_cfg("--url", "http://127.0.0.1:9"))
    assert "agent" not in load_bench.resolve_workloads(_cfg("--hearth-server", "thread"))
    assert "agent" not in load_bench.resolve_workloads(_cfg(), engine=object())
    assert load_bench.resolve_workloads(_cfg("--workloads", "single,agent", "--peer", "llama-server")) == \
        ["single", "agent"]
    assert load_bench.main(["--url", "http://127.0.0.1:9", "--workloads", "agent"]) == 2
    err = capsys.readouterr().err
    assert "agent workload restarts the servers" in err and "Traceback" not in err
