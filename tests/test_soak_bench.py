"""``hearth bench soak`` (benchmarks/soak*.py): the summary's math and verdicts on made-up records and samples,
the stream readers, the /proc readers on this process, and one short real soak of the bundled model."""

from __future__ import annotations

import json
import os
import random
import sys
import time

import pytest

from benchmarks import soak, soak_client, soak_procs, soak_report
from benchmarks.soak_report import Thresholds, summarize

MIB = 1 << 20


def rec(start, ttft=0.5, total=1.0, status="ok", kind="stream"):
    return {"kind": kind, "model": "m", "client": 0, "start_s": start, "ttft_s": ttft, "total_s": total,
            "status": status, "http_status": 200, "error": None if status != "failed" else "boom", "pieces": 3}


def flat_samples(duration_s, pid=10, role="serve", rss_mib=100.0, slope_mib_per_min=0.0, fds=20, every=5.0):
    out, t = [], 0.0
    while t <= duration_s:
        rss = int((rss_mib + slope_mib_per_min * t / 60) * MIB)
        out.append({"t_s": t, "pid": pid, "role": role, "rss_bytes": rss, "open_files": fds})
        t += every
    return out


def steady_records(duration_s, ttft_first=0.5, ttft_last=0.5, n=40):
    """``n`` requests in the first third with TTFT ``ttft_first``, ``n`` in the last third with ``ttft_last``."""
    third = duration_s / 3
    return ([rec(i * third / n, ttft=ttft_first) for i in range(n)]
            + [rec(2 * third + i * third / n, ttft=ttft_last) for i in range(n)])


def test_windows_are_five_minutes_from_ten_minutes_on_else_thirds():
    assert soak_report.window_s(20 * 60) == 300
    assert soak_report.window_s(10 * 60) == 300
    assert soak_report.window_s(3 * 60) == 60
    assert soak_report.window_s(30) == 10


def test_drift_ratio_last_over_first_and_which_requests_count():
    records = steady_records(180, ttft_first=0.5, ttft_last=0.75)
    records += [rec(5, ttft=9.0, status="cancelled"), rec(6, ttft=None, status="failed"),  # never in TTFT
                rec(170, ttft=0.75, total=9.0, status="cut")]  # cut: its TTFT counts, its total does not
    d = soak_report.latency_drift(records, 180)
    assert d["window_s"] == 60
    assert d["first"]["ttft"]["n"] == 40 and d["last"]["ttft"]["n"] == 41
    assert d["ratio"]["ttft_p99"] == pytest.approx(1.5)
    assert d["last"]["total"]["n"] == 40 and d["last"]["total"]["max"] == 1.0


def test_slope_in_units_per_minute():
    assert soak_report.slope_per_min([(0, 0), (60, 2), (120, 4)]) == pytest.approx(2.0)
    assert soak_report.slope_per_min([(0, 5), (30, 5), (90, 5)]) == pytest.approx(0.0)
    assert soak_report.slope_per_min([(10, 1)]) is None
    assert soak_report.slope_per_min([(10, 1), (10, 3)]) is None


def test_process_trends_ignore_the_warm_up():
    # 30 MiB of growth in the first 20 % (warm-up: an engine pages in its model), flat afterwards
    samples = [s for s in flat_samples(600, rss_mib=130) if s["t_s"] >= 120]
    samples += [{"t_s": t, "pid": 10, "role": "serve", "rss_bytes": int((100 + t / 4) * MIB), "open_files": 20}
                for t in range(0, 120, 5)]
    (p,) = soak_report.process_trends(samples, 600, warmup_frac=0.2)
    assert p["rss_mib"]["slope_per_min"] == pytest.approx(0.0, abs=1e-9)
    assert p["rss_mib"]["growth"] == pytest.approx(0.0, abs=1e-6)
    assert p["span_after_warmup_s"] == pytest.approx(480)
    assert not p["started_after_warmup"]


def test_a_steady_leak_is_a_breach_named_in_the_summary():
    samples = flat_samples(600, pid=10, role="serve", slope_mib_per_min=0.1)
    samples += flat_samples(600, pid=11, role="engine:m", slope_mib_per_min=5.0)  # 5 MiB/min: 40 MiB in 8 min
    s = summarize(steady_records(600), samples, 600)
    engine = next(p for p in s["processes"] if p["pid"] == 11)
    assert engine["rss_mib"]["slope_per_min"] == pytest.approx(5.0, rel=1e-3)
    assert engine["rss_mib"]["growth"] == pytest.approx(40.0, rel=1e-3)
    failed = [v["criterion"] for v in s["verdicts"] if v["passed"] is False]
    assert failed == ["engine:m (pid 11) RSS flat"]
    assert not s["passed"]
    assert "FAIL (engine:m (pid 11) RSS flat)" in soak_report.summary_text(s)


def test_open_files_creeping_up_is_a_breach():
    samples = flat_samples(600)
    for i, x in enumerate(samples):
        x["open_files"] = 20 + i // 4  # one more every 20 s: 24 over the 8 minutes after warm-up
    s = summarize(steady_records(600), samples, 600)
    assert [v["criterion"] for v in s["verdicts"] if v["passed"] is False] == ["serve (pid 10) open files flat"]


def test_ttft_drift_verdict_at_the_limit_and_past_it():
    samples = flat_samples(180)
    assert summarize(steady_records(180, 0.5, 0.6), samples, 180)["passed"]  # 1.2x: at the limit
    s = summarize(steady_records(180, 0.5, 0.65), samples, 180)
    assert not s["passed"]
    assert [v["criterion"] for v in s["verdicts"] if v["passed"] is False] == ["P99 TTFT last/first <= 1.2"]
    assert summarize(steady_records(180, 0.5, 0.65), samples, 180, Thresholds(ttft_ratio=1.4))["passed"]


def test_deliberate_cuts_are_not_failures_but_errors_and_429_are():
    records = steady_records(180) + [rec(50, status="cut"), rec(60, status="cancelled", ttft=None)]
    s = summarize(records, flat_samples(180), 180)
    assert s["failed_n"] == 0 and s["passed"]
    assert s["counts"]["stream"] == {"ok": 80, "cut": 1, "cancelled": 1}
    records += [rec(70, status="failed"), rec(80, status="rejected")]
    s = summarize(records, flat_samples(180), 180)
    assert s["failed_n"] == 2 and not s["passed"]
    assert s["verdicts"][0] == {"criterion": "no failed requests", "passed": False,
                                "detail": "2 failed or rejected besides the deliberate cuts and cancels"}


def test_too_little_data_is_not_judged_and_not_a_breach():
    s = summarize([rec(1), rec(29)], flat_samples(30, slope_mib_per_min=100), 30)
    judged = {v["criterion"]: v["passed"] for v in s["verdicts"]}
    assert judged["P99 TTFT last/first <= 1.2"] is None
    assert judged["serve (pid 10) RSS flat"] is None  # 24 s after warm-up: under a minute
    assert s["passed"]
    assert "n/a " in soak_report.summary_text(s)


def test_p99_ttft_buckets_and_the_plot(tmp_path):
    pytest.importorskip("matplotlib")
    records = steady_records(600)
    buckets = soak_report.ttft_p99_by_bucket(records, 600)
    assert len(buckets) == 10 and buckets[0] == (0.0, 0.5) and buckets[4][1] is None
    soak_report.write_plot(tmp_path / "soak.png", records, flat_samples(600), 600)
    assert (tmp_path / "soak.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("path, lines, text, done", [
    ("/v1/chat/completions", ['data: {"choices":[{"delta":{"content":"Hi"}}]}', "data: [DONE]"], "Hi", True),
    ("/v1/responses", ["event: response.output_text.delta",
                       'data: {"type":"response.output_text.delta","delta":"Hi"}',
                       'data: {"type":"response.completed"}'], "Hi", True),
    ("/v1/messages", ['data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}',
                      'data: {"type":"message_stop"}'], "Hi", True),
    ("/api/chat", ['{"message":{"content":"Hi"},"done":false}', '{"message":{"content":""},"done":true}'], "Hi",
     True),
])
def test_stream_readers_find_content_and_the_end_event(path, lines, text, done):
    pieces, ended = [], False
    for line in lines:
        obj = soak_client._event(path, line)
        if obj is None:
            continue
        if obj.get("_done"):
            ended = True
            continue
        piece, end, error = soak_client.READERS[path](obj)
        assert error is None
        pieces.append(piece)
        ended = ended or end
    assert "".join(pieces) == text and ended == done


def test_error_events_are_read_as_errors():
    assert soak_client._chat_event({"error": {"message": "x"}})[2]
    assert soak_client._messages_event({"type": "error", "error": {"type": "overloaded_error"}})[2]
    assert soak_client._ollama_event({"error": "model crashed"})[2] == "model crashed"


def test_every_kind_has_a_request_and_the_mix_is_seeded():
    mix = soak_client.Mix("http://x", ["a", "b"], dict(soak_client.WEIGHTS))
    for kind in soak_client.WEIGHTS:
        path, body, _ = soak_client.request_for(kind, "a", mix, random.Random(1))
        assert path.startswith("/")
    draws = [mix.draw(random.Random("0:1")) for _ in range(3)]
    assert draws == [mix.draw(random.Random("0:1")) for _ in range(3)]
    assert soak_client.request_for("tool", "a", mix, random.Random(1))[1]["tool_choice"] == "required"


def test_proc_readers_on_this_process():
    rss, fds = soak_procs.rss_bytes(os.getpid()), soak_procs.open_files(os.getpid())
    assert rss and rss > 1 << 20 and fds and fds >= 3
    assert soak_procs.role_of(os.getpid(), os.getpid()) == "serve"
    assert soak_procs.rss_bytes(2 ** 22 + 12345) is None


def test_sampler_reads_the_tree():
    sampler = soak_procs.Sampler(os.getpid(), time.perf_counter(), every_s=0.05)
    sampler.start()
    time.sleep(0.2)
    sampler.stop()
    mine = [s for s in sampler.samples if s["pid"] == os.getpid()]
    assert len(mine) >= 3 and {s["role"] for s in mine} == {"serve"}
    assert mine[0]["rss_anon_bytes"] + mine[0]["rss_file_bytes"] <= mine[0]["rss_bytes"]


def test_listener_pid_finds_this_process():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert soak_procs.listener_pid(s.getsockname()[1]) == os.getpid()


def test_bad_arguments_and_registration(capsys):
    from app.cli.bench import BENCHES

    assert BENCHES["soak"] == "benchmarks.soak"
    assert soak.main(["--minutes", "0"]) == 2
    assert "--minutes is out of range" in capsys.readouterr().err


@pytest.mark.model
@pytest.mark.slow
def test_a_short_real_soak(tmp_path, hearth_home, bundled_model, embedding_model):
    """Half a minute, two clients, over the bundled model served under two ids: no failure, both files
    (about 70 s: the server's start, the ingest, the warm-up, 30 s of load and the requests still running)."""
    out = tmp_path / "out"
    (hearth_home / "models" / "embeddings").mkdir(parents=True)
    os.link(embedding_model, hearth_home / "models" / "embeddings" / embedding_model.name)  # not converted again
    t = time.monotonic()
    rc = soak.main(["--minutes", "0.5", "--clients", "2", "--out", str(out), "--model", str(bundled_model)])
    assert time.monotonic() - t < 120, "the short soak took too long"
    doc = json.loads((out / "soak.json").read_text())
    summary = doc["summary"]
    assert summary["failed_n"] == 0, summary["failures"]
    assert rc in (0, 1), rc  # 1 only for a drift or memory verdict on a shared machine: the failures are 0
    assert (out / "soak.txt").read_text().startswith("Soak: 0.50 min")
    assert len({r["model"] for r in doc["records"]}) >= 1 and doc["records"]
    roles = {s["role"] for s in doc["samples"]}
    assert "serve" in roles and any(r.startswith("engine:") for r in roles), roles
    if "matplotlib" in sys.modules or __import__("importlib").util.find_spec("matplotlib"):
        assert (out / "soak.png").is_file()


def test_soak_of_an_existing_server_over_the_fake_engine(tmp_path):
    """``--port-of-existing``: the models from /v1/models, the process listening on the port (here this one),
    documents dropped from the mix with a note (a server without them answers 400), every other kind ok."""
    from fakes import FakeEngine

    from app.server import ServerThread, create_app
    from app.settings import ServerSettings

    call = 'Tool call: {"name": "get_weather", "arguments": {"city": "Oslo"}}'
    model = tmp_path / "fake-model.gguf"
    model.write_bytes(b"not really a GGUF")
    eng = FakeEngine(model, n_ctx=2048, token_delay_s=0.002, n_parallel=2,
                     reply=lambda req: call if req.tools else "a short answer of a few words")
    out = tmp_path / "out"
    try:
        with ServerThread(create_app(eng, ServerSettings())) as srv:
            rc = soak.main(["--minutes", "0.05", "--clients", "2", "--port-of-existing", srv.url + "/v1",
                            "--out", str(out), "--sample-s", "0.5", "--max-tokens", "80"])  # fake tokens: characters
    finally:
        eng.close()
    doc = json.loads((out / "soak.json").read_text())
    c, s = doc["contract"], doc["summary"]
    assert s["failed_n"] == 0, s["failures"]
    assert rc == 0
    assert c["models"] == ["fake-model"] and c["root_pid"] == os.getpid()
    assert "documents" not in c["mix"] and "documents left out of the mix" in c["notes"][0]
    kinds = {r["kind"] for r in doc["records"]}
    assert {"stream", "tool", "messages", "ollama", "responses"} <= kinds, kinds
    assert all(r["ttft_s"] is not None for r in doc["records"] if r["status"] == "ok" and r["kind"] == "stream")
    assert {x["role"] for x in doc["samples"]} >= {"serve"}
