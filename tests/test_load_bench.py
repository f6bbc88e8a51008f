"""``hearth bench load``: the pure statistics on known samples (percentiles = numpy.percentile, Poisson
arrivals, SLO and goodput accounting) and the client wired to Hearth's server over ``FakeEngine`` on a free
127.0.0.1 port (no model): every request accounted for, the report's contract, the ``--out`` files, bad
input and servers that answer 429 / 500."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import socket

import numpy as np
import pytest
from fakes import FakeEngine

from app.server import ServerThread, create_app
from app.settings import ServerSettings
from benchmarks import load_bench
from benchmarks.loadstats import SLO, RequestRecord, distribution, goodput, percentile, poisson_arrivals, summarize


# -- percentiles ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentile_equals_numpy_linear(n):
    rng = random.Random(n)
    xs = [rng.expovariate(3.0) for _ in range(n)]
    for q in (0, 1, 25, 50, 90, 95, 99, 99.9, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-15)


def test_percentile_hand_computed_and_order_free():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4; h = 3q/100
    assert percentile(xs, 50) == 2.5  # h 1.5
    assert percentile(xs, 95) == pytest.approx(3.85)  # h 2.85: 3 + 0.85 * (4 - 3)
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert (percentile(xs, 0), percentile(xs, 100)) == (1.0, 4.0)
    assert percentile([7.0], 99) == 7.0
    d = distribution(xs)
    assert d == {"n": 4, "mean": 2.5, "p50": 2.5, "p95": pytest.approx(3.85), "p99": pytest.approx(3.97),
                 "max": 4.0}
    assert distribution([]) == {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}


@pytest.mark.parametrize("samples,q,match", [([], 50, "no samples"), ([1.0], 101, r"\[0, 100\]"),
                                             ([1.0], -1, r"\[0, 100\]"), ([1.0, math.nan], 50, "finite")])
def test_percentile_refuses_bad_input(samples, q, match):
    with pytest.raises(ValueError, match=match):
        percentile(samples, q)


# -- Poisson arrivals -----------------------------------------------------------------------------------------
def test_poisson_arrivals_seeded_and_mean_gap():
    a = poisson_arrivals(4.0, 20000, seed=7)
    assert a == poisson_arrivals(4.0, 20000, seed=7)
    assert a != poisson_arrivals(4.0, 20000, seed=8)
    gaps = np.diff([0.0] + a)
    assert (gaps > 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)  # mean 1/rate; standard error 0.7 % at n = 20000
    assert np.std(gaps) == pytest.approx(0.25, rel=0.05)  # exponential: sd = mean
    assert poisson_arrivals(1.0, 0) == []


@pytest.mark.parametrize("rate", [0, -1.0, math.nan, math.inf])
def test_poisson_rate_must_be_positive(rate):
    with pytest.raises(ValueError, match="rate must be a finite number > 0"):
        poisson_arrivals(rate, 5)


# -- SLOs, goodput, summaries ---------------------------------------------------------------------------------
def rec(ttft=0.1, gaps=(0.01, 0.01), status="ok", tokens=None, prompt=10, cached=None) -> RequestRecord:
    times = [ttft]
    for g in gaps:
        times.append(times[-1] + g)
    if status != "ok":
        return RequestRecord(send_s=0.0, end_s=0.05, status=status, error="HTTP 500: x")
    return RequestRecord(send_s=0.0, first_token_s=ttft, token_times=times, end_s=times[-1] + 0.001,
                         completion_tokens=tokens if tokens is not None else len(times), prompt_tokens=prompt,
                         cached_tokens=cached, tokens_source="usage")


def test_record_clocks():
    r = rec(ttft=0.2, gaps=(0.05, 0.15))
    assert r.ttft_s == 0.2 and r.itls_s == pytest.approx([0.05, 0.15])
    assert r.e2e_s == pytest.approx(0.401)
    assert r.tpot_s == pytest.approx((0.401 - 0.2) / 2)  # (end - first token) / (completion_tokens - 1)
    assert rec(gaps=()).tpot_s is None  # one token: undefined
    d = r.to_dict()
    assert d["ttft_s"] == 0.2 and d["itl_p95_s"] == pytest.approx(percentile([0.05, 0.15], 95))


def test_goodput_keeps_failed_and_rejected_in_the_denominator():
    slo = SLO(ttft_s=1.0, itl_p95_s=0.1)
    records = [rec(), rec(gaps=()), rec(ttft=2.0), rec(gaps=(0.01, 0.5)), rec(status="rejected"),
               rec(status="failed")]
    assert [slo.met(r) for r in records] == [True, True, False, False, False, False]
    g = goodput(records, slo, duration_s=4.0)
    assert (g["good"], g["total"]) == (2, 6)
    assert g["goodput_rps"] == 0.5 and g["slo_attainment"] == pytest.approx(2 / 6)
    assert g["success_rate"] == pytest.approx(4 / 6)
    assert goodput([], slo, None)["slo_attainment"] is None
    with pytest.raises(ValueError, match="duration"):
        goodput(records, slo, 0.0)
    with pytest.raises(ValueError, match="ttft_s"):
        SLO(ttft_s=0)


def test_summary_latencies_over_ok_and_cache_hit_rate():
    records = [rec(ttft=0.1, prompt=100, cached=50), rec(ttft=0.3, prompt=100, cached=0), rec(status="failed")]
    s = summarize(records, SLO(), duration_s=2.0)
    assert s["counts"] == {"total": 3, "ok": 2, "rejected": 0, "failed": 1}
    assert s["ttft_s"]["n"] == 2 and s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["cache_hit_rate"] == 0.25
    assert s["output_tokens_per_s"] == 3.0 and s["requests_per_s"] == 1.0
    assert s["goodput"]["total"] == 3 and s["errors"] == ["HTTP 500: x"]
    assert summarize([rec()], SLO())["cache_hit_rate"] is None  # the server reported no cached tokens


# -- the SSE client -------------------------------------------------------------------------------------------
class _Lines:
    def __init__(self, lines):
        self.lines = lines

    def iter_lines(self):
        return iter(self.lines)


def test_chat_stream_without_usage_counts_deltas_and_a_cut_stream_fails():
    chunk = {"choices": [{"delta": {"content": "Hi"}}]}
    lines = ["data: " + json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), "",
             ": keep-alive", "data: " + json.dumps(chunk), "data: " + json.dumps(chunk), "data: [DONE]"]
    r = RequestRecord()
    load_bench._consume(r, _Lines(lines), "chat")
    assert r.status == "ok" and r.text == "HiHi" and len(r.token_times) == 2
    assert r.tokens_source == "deltas" and r.completion_tokens == 2 and r.cached_tokens is None
    cut = RequestRecord()
    load_bench._consume(cut, _Lines(lines[:-1]), "chat")
    assert cut.status == "failed" and "[DONE]" in cut.error
    err = RequestRecord()
    load_bench._consume(err, _Lines(["data: " + json.dumps({"error": {"message": "engine crashed"}})]), "chat")
    assert err.status == "failed" and err.error == "error event: engine crashed"


# -- wired to Hearth's server over the fake engine --------------------------------------------------------------
FAKE_REPLY = "and so the story went on and on"


def _fake(tmp_path, **kw) -> tuple[FakeEngine, str]:
    model = tmp_path / "fake-model.gguf"
    model.write_bytes(b"not really a GGUF")
    return FakeEngine(model, n_ctx=2048, reply=kw.pop("reply", lambda r: FAKE_REPLY), **kw), \
        hashlib.sha256(model.read_bytes()).hexdigest()


def test_closed_workload_on_hearth_over_fake_engine(tmp_path, capsys):
    eng, sha = _fake(tmp_path, token_delay_s=0.001)
    out = tmp_path / "out"
    try:
        rc = load_bench.main(["--workloads", "closed", "--clients", "2", "--requests-per-client", "2",
                              "--max-tokens", "8", "--out", str(out), "--json"], engine=eng)
    finally:
        eng.close()
    assert rc == 0
    report = json.loads((out / "load.json").read_text())
    assert json.loads(capsys.readouterr().out) == report
    assert report["counts"] == {"total": 4, "ok": 4, "rejected": 0, "failed": 0}
    (res,) = report["results"]
    assert res["cell"] == "closed" and res["target"] == "hearth" and len(res["requests"]) == 4
    for q in res["requests"]:
        assert q["status"] == "ok" and q["completion_tokens"] == 8 and q["tokens_source"] == "usage"
        assert q["text"] == FAKE_REPLY[:8] and q["cached_tokens"] == 0 and q["queue_s"] is not None
        assert 0 < q["ttft_s"] <= q["e2e_s"] and len(q["token_times"]) == 8
    s = report["summary"]["closed"]["hearth"]
    assert s["ttft_s"]["n"] == 4 and set(s["ttft_s"]) == {"n", "mean", "p50", "p95", "p99", "max"}
    assert s["goodput"]["total"] == 4 and s["output_tokens_per_s"] > 0 and s["cache_hit_rate"] == 0
    c = report["contract"]
    (t,) = c["targets"]
    assert t["model_sha256"] == sha and t["load_settings"]["n_ctx"] == 2048 and t["max_queue"] == 16
    assert t["cache_state"] == "prefix cache off"
    assert {"ttft_s", "itl_s", "tpot_s", "e2e_s", "queue_s"} <= set(c["clocks"])
    assert c["decoding"]["temperature"] == 0 and c["decoding"]["max_tokens"] == 8
    assert c["hardware"]["logical_cores"] >= 1 and c["versions"]["python"]
    assert c["workloads"] == {"closed": {"clients": 2, "requests_per_client": 2}}
    assert "| closed | hearth | 4 / 0 / 0 |" in (out / "load.md").read_text()
    png = (out / "latency_cdf.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_every_workload_and_compare_against_a_second_server(tmp_path):
    """Two fake servers by URL, alternating: all five workloads, ratios other/target, the Poisson plot."""
    a, _ = _fake(tmp_path)
    b = FakeEngine(tmp_path / "other.gguf", n_ctx=2048, reply=lambda r: FAKE_REPLY)
    out = tmp_path / "out"
    try:
        with ServerThread(create_app(a, ServerSettings())) as sa, ServerThread(create_app(b, ServerSettings())) as sb:
            rc = load_bench.main(["--url", sa.url + "/v1", "--compare", sb.url, "--rates", "20,40", "--requests",
                                  "3", "--repeats", "2", "--turns", "2", "--think-s", "0.01", "--long-tokens", "200",
                                  "--clients", "2", "--requests-per-client", "1", "--max-tokens", "4",
                                  "--out", str(out)])
    finally:
        a.close()
        b.close()
    assert rc == 0
    report = json.loads((out / "load.json").read_text())
    cells = ["single", "long", "multiturn", "poisson@20rps", "poisson@40rps", "closed"]
    assert list(report["summary"]) == cells
    order = [(c, t) for c in cells for t in ("target", "other")]  # A/B/A/B
    assert [(r["cell"], r["target"]) for r in report["results"]] == order
    n = report["counts"]
    assert n["total"] == 2 * (2 + 1 + 2 + 3 + 3 + 2) and n["ok"] == n["total"]
    assert report["ratios"]["of"] == "other/target" and report["ratios"]["closed"]["same_text"] == 1.0
    assert [t["model_sha256"] for t in report["contract"]["targets"]] == [None, None]
    mt = report["summary"]["multiturn"]["target"]
    assert mt["think_s_total"] == [0.01] and mt["conversation_e2e_s"][0] >= 0.01
    assert (out / "poisson_rates.png").stat().st_size > 1000


def test_429_and_500_are_counted_not_raised(tmp_path):
    """On the chat endpoint: a full queue (max_queue 1) answers 429, a scripted engine failure 500."""
    calls = itertools.count(1)

    def reply(req):
        if next(calls) == 2:  # the first generation after the warm-up fails: a 500 before its first token
            raise RuntimeError("scripted failure")
        return FAKE_REPLY

    eng, _ = _fake(tmp_path, max_queue=1, token_delay_s=0.01, reply=reply)
    out = tmp_path / "out"
    try:
        rc = load_bench.main(["--workloads", "closed", "--clients", "4", "--requests-per-client", "3",
                              "--max-tokens", "8", "--endpoint", "chat", "--out", str(out)], engine=eng)
    finally:
        eng.close()
    assert rc == 0
    report = json.loads((out / "load.json").read_text())
    n = report["counts"]
    assert n["total"] == 12 and n["ok"] + n["rejected"] + n["failed"] == 12
    assert n["rejected"] >= 1 and n["failed"] >= 1  # one runs, one waits (max_queue 1): the others get 429
    statuses = {(q["status"], q["http_status"]) for q in report["results"][0]["requests"]}
    assert {("rejected", 429), ("failed", 500)} <= statuses
    ok = [q for q in report["results"][0]["requests"] if q["status"] == "ok"]
    assert ok and all(q["text"] == FAKE_REPLY[:8] and q["completion_tokens"] == 8 for q in ok)  # chat deltas
    g = report["summary"]["closed"]["hearth"]["goodput"]
    assert g["total"] == 12 and g["success_rate"] == n["ok"] / 12


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv,message", [
    (["--rates", "0"], "argument --rates: every rate must be > 0 requests/s"),
    (["--clients", "0"], "argument --clients: must be >= 1, got 0"),
    (["--workloads", "burst"], "unknown workload 'burst'"),
    (["--long-fraction", "2"], "must be a fraction in [0, 1]")])
def test_bad_arguments_are_one_clear_line(argv, message, capsys):
    with pytest.raises(SystemExit) as ei:
        load_bench.main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unreachable_url_is_a_clear_error(capsys):
    url = f"http://127.0.0.1:{_closed_port()}"
    assert load_bench.main(["--url", url, "--workloads", "single"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hearth: error: cannot reach the server at {url}") and "Traceback" not in err


def test_registered_as_hearth_bench_load():
    from app.cli.bench import BENCHES

    assert BENCHES["load"] == "benchmarks.load_bench"


def test_multiturn_prompts_grow_by_appending():
    """On completions every turn is a transcript, so each turn's prompt begins with the previous one's."""
    first = load_bench.Ask((("user", "Once"),), "multiturn", kind="turn")
    second = load_bench.Ask((("user", "Once"), ("assistant", "upon"), ("user", "Next?")), "multiturn", kind="turn")
    p1 = load_bench.request_body("completions", "m", first, 8)[1]["prompt"]
    p2 = load_bench.request_body("completions", "m", second, 8)[1]["prompt"]
    assert p1 == "User: Once\nAssistant:" and p2.startswith(p1)
    assert load_bench.request_body("completions", "m", load_bench.Ask((("user", "raw"),), "single"), 8)[1][
        "prompt"] == "raw"
    chat = load_bench.request_body("chat", "m", second, 8)
    assert chat[0] == "/v1/chat/completions" and chat[1]["messages"][1] == {"role": "assistant", "content": "upon"}
