"""The figures and verdicts of ``hearth bench soak`` (``benchmarks.soak``), pure functions of its records.

- **Latency drift**: TTFT (over ``ok`` and ``cut`` requests that received content) and total time (over
  ``ok`` requests) in the first and the last window of the run, by each request's start: 5 minutes each when
  the run lasts 10 minutes or more, else the first and last third. Ratio = last / first, per percentile.
- **Processes**: per pid, over the samples after the warm-up (the first ``warmup_frac``, 20 %, of the run),
  the least-squares slope of RSS (MiB per minute) and of the open-file count (per minute), the growth the
  slope implies over that span, and max − min. A process first seen after the warm-up is flagged (a child
  that was restarted).
- **Verdicts**: no failed or rejected request (deliberate cuts and cancels are not failures); P99 TTFT of the
  last window within ``ttft_ratio`` (1.2) × the first; per process an RSS growth after warm-up of at most
  ``rss_growth_mib`` and an open-file growth of at most ``fd_growth``. A verdict that lacks data (fewer
  than ``min_window_n`` (20) TTFTs in a window; fewer than 3 samples, or less than ``min_trend_s`` (60 s),
  after warm-up: an engine still pages in its model and grows its buffers in a run's first minute) is
  ``None``: not judged, said so, and not a breach.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional, Sequence

from benchmarks.loadstats import distribution, percentile

MIB = float(1 << 20)
LONG_RUN_S = 600.0  # from 10 minutes on, the windows are 5 minutes each
LONG_WINDOW_S = 300.0
FAILED = ("failed", "rejected")


@dataclass(frozen=True)
class Thresholds:
    """The pass/fail limits (see the module docstring)."""

    ttft_ratio: float = 1.2
    rss_growth_mib: float = 16.0
    fd_growth: float = 10.0
    warmup_frac: float = 0.2
    min_window_n: int = 20
    min_trend_s: float = 60.0


def window_s(duration_s: float) -> float:
    """The length of the first and the last window: 5 minutes from a 10-minute run on, else a third."""
    return LONG_WINDOW_S if duration_s >= LONG_RUN_S else duration_s / 3.0


def _ttfts(records: Iterable[dict]) -> list[float]:
    return [r["ttft_s"] for r in records if r["status"] in ("ok", "cut") and r.get("ttft_s") is not None]


def _totals(records: Iterable[dict]) -> list[float]:
    return [r["total_s"] for r in records if r["status"] == "ok" and r.get("total_s") is not None]


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None or b <= 0 else a / b


def latency_drift(records: Sequence[dict], duration_s: float) -> dict[str, Any]:
    """TTFT and total distributions of the first and the last window and the ratios last / first."""
    w = window_s(duration_s)
    first = [r for r in records if r["start_s"] < w]
    last = [r for r in records if r["start_s"] >= duration_s - w]
    out: dict[str, Any] = {"window_s": w, "first": {}, "last": {}, "ratio": {}}
    for name, pick in (("ttft", _ttfts), ("total", _totals)):
        out["first"][name], out["last"][name] = distribution(pick(first)), distribution(pick(last))
        for q in ("p50", "p95", "p99"):
            out["ratio"][f"{name}_{q}"] = _ratio(out["last"][name][q], out["first"][name][q])
    return out


def slope_per_min(points: Sequence[tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of ``(t_s, y)`` points in y per minute; None with fewer than 2 distinct times."""
    if len(points) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    return 60.0 * sum((t - mt) * (y - my) for t, y in points) / var


def _trend(points: list[tuple[float, float]], span_min: float) -> dict[str, Any]:
    ys = [y for _, y in points]
    slope = slope_per_min(points) if len(points) >= 3 else None
    return {"first": ys[0] if ys else None, "last": ys[-1] if ys else None, "min": min(ys, default=None),
            "max": max(ys, default=None), "max_minus_min": (max(ys) - min(ys)) if ys else None,
            "slope_per_min": slope, "growth": None if slope is None else slope * span_min}


def process_trends(samples: Sequence[dict], duration_s: float, warmup_frac: float = 0.2) -> list[dict[str, Any]]:
    """Per pid (in order of first sample): role, samples, RSS (MiB) and open-file trends after the warm-up."""
    warm = duration_s * warmup_frac
    by_pid: dict[int, list[dict]] = {}
    for s in sorted(samples, key=lambda s: s["t_s"]):
        by_pid.setdefault(s["pid"], []).append(s)
    out = []
    for pid, rows in by_pid.items():
        after = [s for s in rows if s["t_s"] >= warm]
        span_min = (after[-1]["t_s"] - after[0]["t_s"]) / 60.0 if after else 0.0
        rss = [(s["t_s"], s["rss_bytes"] / MIB) for s in after if s.get("rss_bytes") is not None]
        fds = [(s["t_s"], float(s["open_files"])) for s in after if s.get("open_files") is not None]
        parts = {k: _trend([(s["t_s"], s[f"rss_{k}_bytes"] / MIB) for s in after
                            if s.get(f"rss_{k}_bytes") is not None], span_min) for k in ("anon", "file")}
        out.append({"pid": pid, "role": rows[-1]["role"], "samples": len(rows), "samples_after_warmup": len(after),
                    "span_after_warmup_s": span_min * 60.0,
                    "first_seen_s": rows[0]["t_s"], "last_seen_s": rows[-1]["t_s"],
                    "started_after_warmup": rows[0]["t_s"] > warm and rows[0]["t_s"] > 0,
                    "rss_mib": _trend(rss, span_min), "rss_anon_mib": parts["anon"], "rss_file_mib": parts["file"],
                    "open_files": _trend(fds, span_min)})
    return out


def outcome_counts(records: Iterable[dict]) -> dict[str, dict[str, int]]:
    """``{kind: {outcome: n}}`` plus ``"all"``."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        for key in (r["kind"], "all"):
            row = out.setdefault(key, {})
            row[r["status"]] = row.get(r["status"], 0) + 1
    return out


def failures(records: Iterable[dict]) -> list[dict]:
    """The records that failed or were rejected (deliberate cuts and cancels are not failures)."""
    return [r for r in records if r["status"] in FAILED]


def verdicts(drift: dict, procs: Sequence[dict], failed: int, th: Thresholds) -> list[dict[str, Any]]:
    """Each criterion: ``{"criterion", "passed" (True, False, or None: not judged), "detail"}``."""
    out = [{"criterion": "no failed requests", "passed": failed == 0,
            "detail": f"{failed} failed or rejected besides the deliberate cuts and cancels"}]
    n1, n2 = drift["first"]["ttft"]["n"], drift["last"]["ttft"]["n"]
    ratio = drift["ratio"]["ttft_p99"]
    if min(n1, n2) < th.min_window_n or ratio is None:
        out.append({"criterion": f"P99 TTFT last/first <= {th.ttft_ratio:g}", "passed": None,
                    "detail": f"not judged: {n1} and {n2} TTFTs in the windows (< {th.min_window_n})"})
    else:
        out.append({"criterion": f"P99 TTFT last/first <= {th.ttft_ratio:g}", "passed": ratio <= th.ttft_ratio,
                    "detail": f"ratio {ratio:.2f} ({drift['last']['ttft']['p99']:.3f} s / "
                              f"{drift['first']['ttft']['p99']:.3f} s)"})
    for p in procs:
        for key, limit, unit in (("rss_mib", th.rss_growth_mib, "MiB"), ("open_files", th.fd_growth, "files")):
            growth = p[key]["growth"]
            name = f"{p['role']} (pid {p['pid']}) {'RSS' if key == 'rss_mib' else 'open files'} flat"
            if growth is None or p["span_after_warmup_s"] < th.min_trend_s:
                out.append({"criterion": name, "passed": None,
                            "detail": f"not judged: {p['samples_after_warmup']} samples over "
                                      f"{p['span_after_warmup_s']:.0f} s after warm-up "
                                      f"(needs 3 over {th.min_trend_s:g} s)"})
            else:
                out.append({"criterion": name, "passed": growth <= limit,
                            "detail": f"growth {growth:+.1f} {unit} after warm-up (limit {limit:g})"})
    return out


def summarize(records: Sequence[dict], samples: Sequence[dict], duration_s: float,
              th: Thresholds = Thresholds()) -> dict[str, Any]:
    """Everything the text summary shows: counts, failures, drift, processes, verdicts and the overall pass."""
    drift = latency_drift(records, duration_s)
    procs = process_trends(samples, duration_s, th.warmup_frac)
    failed = failures(records)
    vs = verdicts(drift, procs, len(failed), th)
    return {"duration_s": duration_s, "thresholds": asdict(th), "counts": outcome_counts(records),
            "failures": failed[:50], "failed_n": len(failed), "drift": drift, "processes": procs,
            "verdicts": vs, "passed": all(v["passed"] is not False for v in vs)}


def _fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _drift_lines(d: dict) -> list[str]:
    w = d["window_s"]
    lines = [f"Latency, first {w / 60:.2g} min vs last {w / 60:.2g} min (seconds; ratio last/first):",
             f"  {'':6} {'window':6} {'n':>5} {'P50':>8} {'P95':>8} {'P99':>8}"]
    for name in ("ttft", "total"):
        for side in ("first", "last"):
            x = d[side][name]
            lines.append(f"  {name:6} {side:6} {x['n']:>5} {_fmt(x['p50']):>8} {_fmt(x['p95']):>8} "
                         f"{_fmt(x['p99']):>8}")
        r = d["ratio"]
        lines.append(f"  {name:6} {'ratio':6} {'':>5} {_fmt(r[name + '_p50'], '.2f'):>8} "
                     f"{_fmt(r[name + '_p95'], '.2f'):>8} {_fmt(r[name + '_p99'], '.2f'):>8}")
    return lines


def _process_lines(procs: Sequence[dict]) -> list[str]:
    lines = ["Processes after warm-up (RSS MiB: last, slope MiB/min [anonymous + file pages], max-min; "
             "open files: last, growth):"]
    for p in procs:
        r, f = p["rss_mib"], p["open_files"]
        anon, file = (p.get(k, {}).get("slope_per_min") for k in ("rss_anon_mib", "rss_file_mib"))
        late = "  (first seen after warm-up)" if p["started_after_warmup"] else ""
        lines.append(f"  {p['role']:<22} pid {p['pid']:<7} RSS {_fmt(r['last'], '.1f'):>7}  "
                     f"{_fmt(r['slope_per_min'], '+.2f'):>7}/min [{_fmt(anon, '+.2f')} + {_fmt(file, '+.2f')}]  "
                     f"{_fmt(r['max_minus_min'], '.1f'):>6}   files {_fmt(f['last'], '.0f'):>4} "
                     f"{_fmt(f['growth'], '+.1f'):>6}{late}")
    return lines


def summary_text(s: dict) -> str:
    """The text summary: requests by kind and outcome, failures, latency drift, processes, verdicts."""
    outcomes = ("ok", "cut", "cancelled", "failed", "rejected")
    lines = [f"Soak: {s['duration_s'] / 60:.2f} min", "Requests by kind and outcome:",
             f"  {'kind':<11}" + "".join(f"{o:>10}" for o in outcomes)]
    for kind in sorted(s["counts"], key=lambda k: (k == "all", k)):
        row = s["counts"][kind]
        lines.append(f"  {kind:<11}" + "".join(f"{row.get(o, 0):>10}" for o in outcomes))
    lines.append(f"Failures besides deliberate cuts and cancels: {s['failed_n']}")
    lines += [f"  {f['kind']} {f['model']} at {f['start_s']:.1f} s: {f['error']}" for f in s["failures"][:10]]
    lines += _drift_lines(s["drift"]) + _process_lines(s["processes"]) + ["Verdicts:"]
    for v in s["verdicts"]:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[v["passed"]]
        lines.append(f"  {mark}  {v['criterion']}: {v['detail']}")
    breached = [v["criterion"] for v in s["verdicts"] if v["passed"] is False]
    lines.append("Result: " + ("PASS" if s["passed"] else "FAIL (" + "; ".join(breached) + ")"))
    return "\n".join(lines) + "\n"


def ttft_p99_by_bucket(records: Sequence[dict], duration_s: float) -> list[tuple[float, Optional[float]]]:
    """``(bucket start in minutes, P99 TTFT or None)``: per minute from a 5-minute run on, else sixths."""
    size = 60.0 if duration_s >= 300 else max(duration_s / 6.0, 1.0)
    out = []
    t = 0.0
    while t < duration_s:
        xs = _ttfts(r for r in records if t <= r["start_s"] < t + size)
        out.append((t / 60.0, percentile(xs, 99) if xs else None))
        t += size
    return out


def write_plot(path: Any, records: Sequence[dict], samples: Sequence[dict], duration_s: float) -> None:
    """A PNG: RSS of each process over time (top) and P99 TTFT per bucket (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    by_pid: dict[int, list[dict]] = {}
    for s in samples:
        by_pid.setdefault(s["pid"], []).append(s)
    for pid, rows in by_pid.items():
        rows = [r for r in rows if r.get("rss_bytes") is not None]
        top.plot([r["t_s"] / 60 for r in rows], [r["rss_bytes"] / MIB for r in rows], marker=".",
                 label=f"{rows[-1]['role'] if rows else '?'} ({pid})")
    top.set_ylabel("RSS (MiB)")
    top.set_title("Resident memory of every Hearth process")
    top.legend(fontsize=7)
    all_buckets = ttft_p99_by_bucket(records, duration_s)
    half = (all_buckets[1][0] - all_buckets[0][0]) / 2 if len(all_buckets) > 1 else 0.0
    buckets = [(t + half, y) for t, y in all_buckets if y is not None]  # drawn at each bucket's middle
    bottom.plot([t for t, _ in buckets], [y for _, y in buckets], marker="o")
    bottom.set_ylabel("P99 TTFT (s)")
    bottom.set_xlabel("minutes since the soak started")
    bottom.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
