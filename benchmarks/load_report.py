"""The report of ``hearth bench load``: the JSON record with its measurement contract, the Markdown table and
the PNG plots. Everything is computed from the request records (``benchmarks.loadstats``) after the run, so
the JSON alone is enough to redo any figure.

The contract states what a reader needs to trust or reproduce a figure: per target the model file and its
sha256 (known for Hearth's own server), the load settings, the queue bound, the cache state, the exact
command line of every server the benchmark started (Hearth's ``hearth serve``, llama-server and which peer
settings it ran with) and its resident memory after load and at the end; the decoding
policy (greedy, fixed max_tokens, the endpoint); the hardware (CPU model, cores, memory); the versions
(Python, llama-cpp-python, Hearth, httpx); the workload parameters and seed; the SLOs; the definition of every
clock; and the ok / rejected / failed accounting. ``matplotlib`` is imported only when plots are written, with
the Agg canvas (no display, no pyplot global state).

``headline(report)`` is the summary table the issue asks for (the first target against the second, usually
Hearth against llama-server): single-stream decode tokens/s, TTFT of a short and of a long prompt, aggregate
tokens/s of concurrent clients, the four agent figures and the resident memory after load.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from benchmarks.agent_workload import AGENT_PHASE_NAMES
from benchmarks.loadstats import (
    ACCOUNTING,
    CLOCKS,
    PERCENTILE_DEFINITION,
    SLO,
    counts,
    percentile,
    ratio,
    span_s,
    summarize,
)

AGENT_PHASES = AGENT_PHASE_NAMES
AGENT_CLOCKS = {
    "session": "(a) session of --agent-steps steps in one server process: the first step sent -> the last step's "
               "stream ended (client perf_counter, s)",
    "new_session_after_restart": "(b) after a restart (new process, same data folder) and one unmeasured 4-token "
                                 "warm-up: a new session, same preamble, another task, --agent-steps steps; first "
                                 "sent -> last ended (s)",
    "session_continued_after_restart": "(c) after another restart and warm-up: session (a) continued by "
                                       "--agent-more-steps steps; first sent -> last ended (s)",
    "start_to_first_token": "(d) a ~--long-tokens prompt sent once, then a restart: the new server process "
                            "spawned (perf_counter just before Popen) -> the first token of the same prompt "
                            "received, the prompt sent as soon as GET /health answered 200 (polled every 25 ms)",
    "restart": "stop: SIGTERM (hearth serve: to the server process, which closes its engine; llama-server: its "
               "process group), SIGKILL after 10 s; --agent-settle-s before each restart, outside every clock",
}
MEMORY_DEFINITION = ("resident memory of the server's process and every descendant (/proc/<pid>/stat parent "
                     "links): RSS = VmRSS of /proc/<pid>/status, PSS = Pss of /proc/<pid>/smaps_rollup, MiB "
                     "(2**20 bytes), summed; after load = the server answered /health, before any request; end = "
                     "after the last workload. RSS sums count pages shared between the tree's processes once per "
                     "process; PSS shares them, but also with processes outside the tree (both servers map the "
                     "same GGUF file)")

# (name in the ratios, path in a summary); ratios are other / first target.
RATIO_METRICS = (("ttft_p50_s", ("ttft_s", "p50")), ("ttft_p95_s", ("ttft_s", "p95")),
                 ("tpot_p50_s", ("tpot_s", "p50")), ("itl_p50_s", ("itl_s", "p50")), ("itl_p95_s", ("itl_s", "p95")),
                 ("e2e_p50_s", ("e2e_s", "p50")), ("e2e_p95_s", ("e2e_s", "p95")),
                 ("output_tokens_per_s", ("output_tokens_per_s",)), ("requests_per_s", ("requests_per_s",)),
                 ("goodput_rps", ("goodput", "goodput_rps")))


# -- the record -----------------------------------------------------------------------------------------------
def build(cfg: Any, targets: Sequence[Any], runs: Sequence[Any], slo: SLO, started: float) -> dict[str, Any]:
    """The whole JSON record: ``contract``, ``summary`` (cell → target → ``loadstats.summarize`` pooled over
    rounds), ``ratios`` (cell → metric → other/first, with two targets), ``counts`` (every request of the
    run) and ``results`` (every cell run with its request records)."""
    names = [t.name for t in targets]
    results = [_result(r, slo) for r in runs]
    summary: dict[str, dict[str, Any]] = {}
    for label in dict.fromkeys(r.cell.label for r in runs):
        summary[label] = {n: _pooled([r for r in runs if r.cell.label == label and r.target == n], slo)
                          for n in names}
    every = [rec for r in runs for rec in r.records]
    report = {"benchmark": "hearth bench load", "contract": contract(cfg, targets, slo, started),
              "summary": summary, "counts": counts(every), "results": results}
    if len(names) == 2:
        report["ratios"] = {"of": f"{names[1]}/{names[0]}",
                            **{label: _ratios(s[names[0]], s[names[1]], runs, label, names)
                               for label, s in summary.items()}}
    report["headline"] = headline(report)
    return report


def _tpot_rate(s: dict) -> Optional[float]:
    p50 = (s.get("tpot_s") or {}).get("p50")
    return 1.0 / p50 if p50 else None


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The summary table: ``{"targets": [names], "ratio_of": "first/second" (None with one target), "rows":
    [{"metric", "unit", "better", "values": {target: value}, "ratio"}]}``, one row per figure of the issue's
    table whether or not it ran (value None: not measured). Figures: single-stream decode tokens/s = 1 / TPOT
    P50 of the ``single`` cell, and of ``quote`` (answers that copy their document; TPOT: first token → last
    byte over completion tokens − 1); TTFT P50 of
    ``single`` and ``long`` (s); aggregate tokens/s of ``closed`` (completion tokens / the cell's wall time);
    the agent phases' medians over rounds (s, ``AGENT_CLOCKS``); the RSS of every process of the server
    after load (MiB, ``MEMORY_DEFINITION``). ``ratio`` = first target / second."""
    c = report["contract"]
    names = [t["name"] for t in c["targets"]]
    w = c.get("parameters") or c["workloads"]
    summ = report["summary"]

    def cell(label: str, fn) -> dict[str, Optional[float]]:
        return {n: (fn(summ[label][n]) if label in summ and n in summ[label] else None) for n in names}

    def agent(phase: str) -> dict[str, Optional[float]]:
        return cell("agent", lambda s: (s.get("agent") or {}).get(phase, {}).get("median_s"))

    single = w.get("single") or {}
    quote = w.get("quote") or {}
    closed = w.get("closed") or {}
    ag = w.get("agent") or {}
    steps, more = ag.get("steps", "N"), ag.get("more_steps", "M")
    long_tokens = (w.get("long") or {}).get("approx_prompt_tokens") or ag.get("approx_long_prompt_tokens")
    long_txt = f"~{long_tokens:,}" if isinstance(long_tokens, int) else "long"
    mem = {t["name"]: (t.get("memory_after_load") or {}).get("rss_mib") for t in c["targets"]}
    rows = [
        ("Single-stream decode tokens/s" + (f" ({single['max_tokens']} tokens)" if single else ""), "tokens/s",
         "higher", cell("single", _tpot_rate)),
        ("TTFT, ~40-token prompt (P50)", "s", "lower", cell("single", lambda s: s["ttft_s"]["p50"])),
        ("Decode tokens/s, answers that quote their document" + (f" ({quote['max_tokens']} tokens)" if quote else ""),
         "tokens/s", "higher", cell("quote", _tpot_rate)),
        (f"TTFT, {long_txt}-token prompt (P50)", "s", "lower", cell("long", lambda s: s["ttft_s"]["p50"])),
        (f"{closed.get('clients', 'N')} concurrent clients, aggregate tokens/s", "tokens/s", "higher",
         cell("closed", lambda s: s["output_tokens_per_s"])),
        (f"Agent (a): {steps}-step session, one process, end to end", "s", "lower", agent("session")),
        (f"Agent (b): new {steps}-step session after a restart (same preamble), end to end", "s", "lower",
         agent("new_session_after_restart")),
        (f"Agent (c): earlier session continued after a restart ({more} step{'' if more == 1 else 's'}), end to "
         "end", "s", "lower",
         agent("session_continued_after_restart")),
        (f"Agent (d): process start → first token, {long_txt}-token prompt seen before the restart", "s", "lower",
         agent("start_to_first_token")),
        ("Resident memory after load, all of the server's processes (RSS)", "MiB", "lower", mem),
    ]
    out_rows = [{"metric": m, "unit": u, "better": b, "values": v,
                 "ratio": ratio(v.get(names[0]), v.get(names[1])) if len(names) == 2 else None}
                for m, u, b, v in rows]
    return {"targets": names, "ratio_of": f"{names[0]}/{names[1]}" if len(names) == 2 else None, "rows": out_rows}


def _result(r: Any, slo: SLO) -> dict[str, Any]:
    return {"cell": r.cell.label, "workload": r.cell.workload, "rate_rps": r.cell.rate, "target": r.target,
            "round": r.round, "summary": summarize(r.records, slo), "extra": r.extra,
            "requests": [rec.to_dict() for rec in r.records]}


def _pooled(runs: Sequence[Any], slo: SLO) -> dict[str, Any]:
    spans = [span_s(r.records) for r in runs]
    duration = sum(s for s in spans if s is not None) if any(s is not None for s in spans) else None
    out = summarize([rec for r in runs for rec in r.records], slo, duration)
    extra = [r.extra for r in runs if r.extra]
    if extra and "conversation_e2e_s" in extra[0]:
        out["conversation_e2e_s"] = [e["conversation_e2e_s"] for e in extra]
        out["think_s_total"] = [e["think_s_total"] for e in extra]
    if extra and "phases" in extra[0]:
        out["agent"] = agent_summary(extra)
    return out


def _median(xs: Sequence[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return percentile(vals, 50.0) if vals else None


def agent_summary(extras: Sequence[dict]) -> dict[str, Any]:
    """Per agent phase, its seconds in each round (None where a request failed) and their median (over the
    rounds that completed it); the restarts' spawn → ready seconds; and per phase the prompt and cached tokens
    of its first request in each round (what the server reused)."""
    out: dict[str, Any] = {}
    for name in AGENT_PHASES:
        ph = [e["phases"].get(name) or {} for e in extras]
        secs = [p.get("seconds") for p in ph]
        first = [(p.get("info") or {}) for p in ph]
        out[name] = {"seconds": secs, "median_s": _median(secs),
                     "first_prompt_tokens": [_first(i.get("prompt_tokens")) for i in first],
                     "first_cached_tokens": [_first(i.get("cached_tokens")) for i in first]}
        if name == "start_to_first_token":
            out[name].update(spawn_to_ready_s=[i.get("spawn_to_ready_s") for i in first],
                             ttft_s=[i.get("ttft_s") for i in first])
    out["restart_spawn_to_ready_s"] = [r.get("spawn_to_ready_s") for e in extras for r in e.get("restarts", [])]
    out["restart_stop_s"] = [r.get("stop_s") for e in extras for r in e.get("restarts", [])]
    return out


def _first(v: Any) -> Any:
    return v[0] if isinstance(v, list) and v else v


def _get(summary: dict, path: Sequence[str]) -> Optional[float]:
    v: Any = summary
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return v


def _ratios(first: dict, other: dict, runs: Sequence[Any], label: str, names: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {m: ratio(_get(other, p), _get(first, p)) for m, p in RATIO_METRICS}
    out["same_text"] = _agreement(runs, label, names)
    return out


def _agreement(runs: Sequence[Any], label: str, names: Sequence[str]) -> Optional[float]:
    """Share of request pairs (same cell, round and position; both ok) whose answers are the same text."""
    pairs = 0
    same = 0
    for rnd in {r.round for r in runs if r.cell.label == label}:
        a, b = ([r for r in runs if r.cell.label == label and r.round == rnd and r.target == n] for n in names)
        if not a or not b:
            continue
        for x, y in zip(a[0].records, b[0].records):
            if x.status == "ok" and y.status == "ok":
                pairs += 1
                same += x.text == y.text
    return same / pairs if pairs else None


# -- the contract ---------------------------------------------------------------------------------------------
def contract(cfg: Any, targets: Sequence[Any], slo: SLO, started: float) -> dict[str, Any]:
    """What the figures mean and what produced them (module docstring)."""
    from dataclasses import asdict

    return {"created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "targets": [{"name": t.name, **t.contract} for t in targets],
            "order": "each round runs every workload cell on each target in turn, in the order of targets "
                     "(A/B/A/B), so machine noise hits both",
            "decoding": {"endpoint": cfg.endpoint, "temperature": 0, "max_tokens": cfg.max_tokens, "stream": True,
                         "stream_options": {"include_usage": True}, "multiturn_stop": ["\nUser:"],
                         "policy": "greedy; no other sampling field is sent"},
            "workloads": workload_params(cfg), "parameters": workload_params(cfg, every=True), "seed": cfg.seed,
            "rounds": cfg.rounds,
            "warm_up": "one 4-token request per target before the first round, not measured",
            "hearth_server": getattr(cfg, "hearth_server", None) if not cfg.url else None,
            "peer_settings": getattr(cfg, "peer_settings", None) if cfg.peer else None,
            "slo": asdict(slo), "clocks": CLOCKS, "agent_clocks": AGENT_CLOCKS if "agent" in cfg.workloads else None,
            "memory": MEMORY_DEFINITION, "accounting": ACCOUNTING, "percentiles": PERCENTILE_DEFINITION,
            "hardware": hardware(), "versions": versions()}


def workload_params(cfg: Any, every: bool = False) -> dict[str, Any]:
    """The parameters of the workloads that ran (``every``: of every workload, for the summary's labels)."""
    params = {"single": {"repeats": cfg.repeats, "prompt": "short story opening (~40 tokens)",
                         "max_tokens": cfg.single_max_tokens},
              "quote": {"repeats": cfg.repeats, "prompt": "a ~500-token ledger, then the start of a word-for-word "
                                                          "copy of it", "max_tokens": cfg.single_max_tokens},
              "long": {"requests_per_round": 1, "approx_prompt_tokens": cfg.long_tokens},
              "multiturn": {"turns": cfg.turns, "think_s": cfg.think_s},
              "poisson": {"rates_rps": cfg.rates, "requests_per_rate": cfg.requests,
                          "long_fraction": cfg.long_fraction, "approx_long_prompt_tokens": cfg.long_tokens},
              "closed": {"clients": cfg.clients, "requests_per_client": cfg.requests_per_client},
              "agent": {"steps": cfg.agent_steps, "more_steps": cfg.agent_more_steps,
                        "approx_preamble_tokens": cfg.agent_preamble_tokens,
                        "approx_step_tokens": cfg.agent_step_tokens, "max_tokens": cfg.agent_max_tokens,
                        "approx_long_prompt_tokens": cfg.long_tokens, "settle_s": cfg.agent_settle_s,
                        "endpoint": "completions (raw text: the same prompt on every server)",
                        "prompt": "preamble (rules, 12 tool definitions, standing orders) + session header and "
                                  "task + per step a JSON tool observation and 'Thought and action:', each "
                                  "step's answer appended verbatim before the next step"}}
    return params if every else {w: params[w] for w in cfg.workloads}


def hardware() -> dict[str, Any]:
    """CPU model (``/proc/cpuinfo``, else ``platform``), logical and usable cores, total memory (bytes)."""
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu or platform.processor() or platform.machine(), "logical_cores": os.cpu_count(),
            "usable_cores": usable, "memory_bytes": _memory_bytes(), "platform": platform.platform()}


def _memory_bytes() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def versions() -> dict[str, Optional[str]]:
    """Python, llama-cpp-python, Hearth and httpx versions (None when not installed)."""
    from importlib import metadata

    import app

    def ver(dist: str) -> Optional[str]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "llama_cpp_python": ver("llama-cpp-python"),
            "hearth": app.__version__, "httpx": ver("httpx")}


# -- Markdown -------------------------------------------------------------------------------------------------
def _ms(v: Optional[float]) -> str:
    return "–" if v is None else f"{v * 1000:.0f}" if v >= 0.1 else f"{v * 1000:.1f}"


def _dist(d: dict) -> str:
    """``P50 / P95 / P99 / max`` in milliseconds."""
    return " / ".join(_ms(d.get(k)) for k in ("p50", "p95", "p99", "max")) if d.get("n") else "–"


def _num(v: Optional[float], fmt: str = "{:.2f}") -> str:
    return "–" if v is None else fmt.format(v)


def markdown(report: dict[str, Any]) -> str:
    """The contract in brief, one table row per (cell, target) and, with two targets, the ratios."""
    c = report["contract"]
    lines = ["# hearth bench load", ""] + _contract_lines(c) + [""]
    if report.get("headline"):
        lines += _headline_lines(report["headline"]) + [""]
    if any("agent" in s for per in report["summary"].values() for s in per.values()):
        lines += _agent_lines(report) + [""]
    lines += _memory_lines(c) + [""]
    lines += ["Latencies in ms as P50 / P95 / P99 / max over ok requests; tok/s and req/s over the cell's wall "
             "time (the agent cell's wall time includes its restarts: read its own table above); goodput = "
             "requests/s that met every SLO (all requests in the denominator of attainment).", "",
             "| cell | target | ok / rejected / failed | TTFT | TPOT | ITL | end-to-end | queue | tok/s | req/s "
             "| cache hit | goodput req/s (attained) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, per in report["summary"].items():
        for name, s in per.items():
            n, g = s["counts"], s["goodput"]
            hit = "–" if s["cache_hit_rate"] is None else f"{s['cache_hit_rate']:.0%}"
            att = "–" if g["slo_attainment"] is None else f"{g['slo_attainment']:.0%}"
            lines.append(f"| {label} | {name} | {n['ok']} / {n['rejected']} / {n['failed']} | {_dist(s['ttft_s'])} "
                         f"| {_dist(s['tpot_s'])} | {_dist(s['itl_s'])} | {_dist(s['e2e_s'])} "
                         f"| {_dist(s['queue_s'])} | {_num(s['output_tokens_per_s'], '{:.1f}')} "
                         f"| {_num(s['requests_per_s'], '{:.3f}')} | {hit} | {_num(g['goodput_rps'], '{:.3f}')} "
                         f"({att}) |")
    if "ratios" in report:
        lines += ["", *_ratio_lines(report["ratios"])]
    errors = sorted({e for per in report["summary"].values() for s in per.values() for e in s["errors"]})
    if errors:
        lines += ["", "Errors seen: " + "; ".join(errors[:10])]
    return "\n".join(lines) + "\n"


def _fmt(v: Optional[float], unit: str) -> str:
    if v is None:
        return "–"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
    return f"{v:.1f}"


def _headline_lines(h: dict) -> list[str]:
    names = h["targets"]
    two = len(names) == 2
    head = "| figure | " + " | ".join(names) + (f" | ratio {h['ratio_of']} |" if two else " |")
    out = ["## Summary", "", head, "|---|" + "---|" * (len(names) + (1 if two else 0))]
    for r in h["rows"]:
        vals = " | ".join(_fmt(r["values"].get(n), r["unit"]) + (f" {r['unit']}" if r["unit"] not in ("s",)
                                                                 and r["values"].get(n) is not None else "")
                          for n in names)
        rat = "" if not two else (" | –" if r["ratio"] is None else f" | {r['ratio']:.2f}×")
        out.append(f"| {r['metric']} ({r['better']} is better) | {vals}{rat} |")
    if two:
        out += ["", f"Ratio = {names[0]} / {names[1]} of the figure: below 1 favours {names[0]} for times and "
                    f"memory, above 1 for tokens/s. TTFTs are P50s over the cell's requests (all rounds), agent "
                    "figures medians over rounds; decode tokens/s = 1 / TPOT P50."]
    return out


def _agent_lines(report: dict) -> list[str]:
    out = ["## Agent sessions across restarts (per target: median over rounds; per round in load.json)", "",
           "| target | (a) session | (b) new session after restart | (c) continued after restart | (d) start → "
           "first token | (d) spawn → ready | (d) TTFT | cached/prompt tokens, first request of (b) | of (c) "
           "| of (d) | restart spawn → ready (median) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in report["summary"].get("agent", {}).items():
        a = s.get("agent") or {}

        def med(phase: str, key: str = "median_s") -> str:
            v = (a.get(phase) or {}).get(key)
            return _fmt(_median(v) if isinstance(v, list) else v, "s")

        def cached(phase: str) -> str:
            p = a.get(phase) or {}
            pairs = [f"{c if c is not None else '?'}/{t}" for c, t in zip(p.get("first_cached_tokens", []),
                                                                          p.get("first_prompt_tokens", []))]
            return ", ".join(pairs) or "–"

        restart = _fmt(_median(a.get("restart_spawn_to_ready_s") or []), "s")
        out.append(f"| {name} | {med('session')} | {med('new_session_after_restart')} | "
                   f"{med('session_continued_after_restart')} | {med('start_to_first_token')} | "
                   f"{med('start_to_first_token', 'spawn_to_ready_s')} | {med('start_to_first_token', 'ttft_s')} | "
                   f"{cached('new_session_after_restart')} | {cached('session_continued_after_restart')} | "
                   f"{cached('start_to_first_token')} | {restart} |")
    out += ["", "Clocks: " + "; ".join(f"{k}: {v}" for k, v in AGENT_CLOCKS.items())]
    return out


def _memory_lines(c: dict) -> list[str]:
    out = ["## Resident memory", "", "| target | when | RSS MiB | PSS MiB | processes (pid name: RSS MiB) |",
           "|---|---|---|---|---|"]
    for t in c["targets"]:
        for when, key in (("after load", "memory_after_load"), ("end of run", "memory_end_of_run")):
            m = t.get(key)
            if not m:
                out.append(f"| {t['name']} | {when} | – | – | not measured (a server this benchmark did not start) |")
                continue
            procs = "; ".join(f"{p['pid']} {p['name']}: {p['rss_mib']:.0f}" for p in m["processes"])
            pss = "–" if m.get("pss_mib") is None else f"{m['pss_mib']:.0f}"
            rss = "–" if m.get("rss_mib") is None else f"{m['rss_mib']:.0f}"
            out.append(f"| {t['name']} | {when} | {rss} | {pss} | {procs} |")
        note = (t.get("memory_after_load") or {}).get("note")
        if note:
            out.append(f"| {t['name']} | | | | {note} |")
    out += ["", f"Memory: {c.get('memory', MEMORY_DEFINITION)}."]
    return out


def _contract_lines(c: dict) -> list[str]:
    hw, v, d = c["hardware"], c["versions"], c["decoding"]
    out = []
    for t in c["targets"]:
        sha = t.get("model_sha256") or "unknown"
        out.append(f"- **{t['name']}**: {t['url']}, model `{t['model']}`"
                   + (f" (`{t['model_path']}`, sha256 `{sha}`)" if t.get("model_path") else ", sha256 unknown")
                   + f"; cache: {t['cache_state']}")
        if t.get("load_settings"):
            ls = t["load_settings"]
            peer = f"peer settings **{ls['peer_settings']}**; " if ls.get("peer_settings") else ""
            out.append(f"  - load: {peer}n_parallel {ls.get('n_parallel')}, n_ctx {ls.get('n_ctx')} per slot, "
                       f"n_batch {ls.get('n_batch')}, n_ubatch {ls.get('n_ubatch')}, n_threads "
                       f"{ls.get('n_threads')}, KV {ls.get('type_k')}/{ls.get('type_v')}, flash_attn "
                       f"{ls.get('flash_attn')}, swa_full {ls.get('swa_full')}"
                       + (f"; max_queue {t['max_queue']}" if t.get("max_queue") is not None else ""))
        if t.get("process"):
            out.append(f"  - served: {t['process']}" + (" (in the benchmark's process)" if t["process"] == "thread"
                                                        else ""))
        if t.get("command"):
            env = " ".join(f"{k}={val}" for k, val in (t.get("env") or {}).items())
            out.append(f"  - command: `{(env + ' ') if env else ''}{t['command']}`")
    out += [f"- decoding: {d['endpoint']} endpoint, {d['policy']}, max_tokens {d['max_tokens']}, streamed with "
            "include_usage",
            f"- hardware: {hw['cpu']}, {hw['usable_cores']} usable of {hw['logical_cores']} cores; "
            f"{hw['platform']}",
            f"- versions: Python {v['python']}, llama-cpp-python {v['llama_cpp_python']}, Hearth {v['hearth']}",
            f"- SLOs: TTFT <= {c['slo']['ttft_s']} s and per-request ITL P95 <= {c['slo']['itl_p95_s']} s; seed "
            f"{c['seed']}, {c['rounds']} round(s); {c['order']}",
            f"- clocks: TTFT = {CLOCKS['ttft_s']}; ITL = {CLOCKS['itl_s']}; TPOT = {CLOCKS['tpot_s']}; "
            f"end-to-end = {CLOCKS['e2e_s']}; queue = {CLOCKS['queue_s']}",
            f"- accounting: {c['accounting']}"]
    return out


def _ratio_lines(ratios: dict) -> list[str]:
    out = [f"Ratios {ratios['of']} (lower is better for latencies, higher for rates):", "",
           "| cell | TTFT P50 | TTFT P95 | TPOT P50 | ITL P95 | E2E P50 | tok/s | req/s | goodput | same text |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in ratios.items():
        if label == "of":
            continue
        cols = [_num(r[k]) for k in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "itl_p95_s", "e2e_p50_s",
                                     "output_tokens_per_s", "requests_per_s", "goodput_rps")]
        same = "–" if r["same_text"] is None else f"{r['same_text']:.0%}"
        out.append(f"| {label} | " + " | ".join(cols) + f" | {same} |")
    return out


# -- files and plots ------------------------------------------------------------------------------------------
def write(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write ``load.json``, ``load.md``, ``latency_cdf.png`` and, when ``poisson`` ran, ``poisson_rates.png``
    into ``out_dir`` (created); return the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "load.json", out_dir / "load.md"]
    paths[0].write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    paths[1].write_text(markdown(report), encoding="utf-8")
    paths.append(plot_cdf(report, out_dir / "latency_cdf.png"))
    if any(r["workload"] == "poisson" for r in report["results"]):
        paths.append(plot_rates(report, out_dir / "poisson_rates.png"))
    return paths


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _values(report: dict, label: str, target: str, key: str) -> list[float]:
    return sorted(q[key] for r in report["results"] if r["cell"] == label and r["target"] == target
                  for q in r["requests"] if q["status"] == "ok" and q[key] is not None)


def plot_cdf(report: dict[str, Any], path: Path) -> Path:
    """One panel per workload cell: the empirical CDF of end-to-end latency (solid) and TTFT (dashed) of the
    ok requests, per target, pooled over rounds."""
    labels = list(report["summary"])
    cols = min(3, max(1, len(labels)))
    rows = (len(labels) + cols - 1) // cols
    fig = _figure(4.2 * cols, 3.2 * rows)
    for i, label in enumerate(labels):
        ax = fig.add_subplot(rows, cols, i + 1)
        for j, target in enumerate(report["summary"][label]):
            for key, style in (("e2e_s", "-"), ("ttft_s", "--")):
                xs = _values(report, label, target, key)
                if xs:  # the empirical CDF: 0 before the first sample, k/n from the k-th on
                    ys = [0.0] + [(k + 1) / len(xs) for k in range(len(xs))]
                    ax.step([xs[0]] + xs, ys, style, where="post", color=f"C{j}", label=f"{target} {key[:-2]}")
        ax.set_title(label)
        ax.set_xlabel("seconds")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.set_xlim(left=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no ok request", ha="center", va="center", transform=ax.transAxes)
    fig.savefig(path, dpi=100)
    return path


def plot_rates(report: dict[str, Any], path: Path) -> Path:
    """``poisson``: TTFT P50 and P95 vs offered rate (left) and goodput vs offered rate (right), per target."""
    cells = _rates(report)
    fig = _figure(9, 3.5)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    rates = [r for _, r in cells]
    for j, target in enumerate(next(iter(report["summary"].values()))):
        s = [report["summary"][label][target] for label, _ in cells]
        left.plot(rates, [_nan(x["ttft_s"]["p50"]) for x in s], "o-", color=f"C{j}", label=f"{target} P50")
        left.plot(rates, [_nan(x["ttft_s"]["p95"]) for x in s], "s--", color=f"C{j}", label=f"{target} P95")
        right.plot(rates, [_nan(x["goodput"]["goodput_rps"]) for x in s], "o-", color=f"C{j}", label=target)
    right.plot(rates, rates, ":", color="grey", label="offered")
    left.set(title="TTFT vs request rate", xlabel="offered rate (requests/s)", ylabel="TTFT (s)")
    right.set(title="goodput vs request rate", xlabel="offered rate (requests/s)", ylabel="goodput (requests/s)")
    left.legend(fontsize="small")
    right.legend(fontsize="small")
    fig.savefig(path, dpi=100)
    return path


def _nan(v: Optional[float]) -> float:
    return float("nan") if v is None else v


def _rates(report: dict) -> list[tuple[str, float]]:
    seen: dict[str, float] = {}
    for r in report["results"]:
        if r["workload"] == "poisson":
            seen.setdefault(r["cell"], r["rate_rps"])
    return sorted(seen.items(), key=lambda kv: kv[1])

