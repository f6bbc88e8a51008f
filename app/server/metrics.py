"""Server metrics in the Prometheus text format (version 0.0.4), written by hand.

``prometheus_client`` is not a dependency: the handful of counters and histograms below are a few dozen
lines, and a hand-written registry keeps one app per ``create_app`` call (tests build many) without a
process-global registry. Names are prefixed ``hearth_``. Sources:

The reasoning: docs/server.md, 'app/server/metrics.py'.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any, Optional

from app.protocol.backend import Backend

TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0)
QUEUE_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0)


class Histogram:
    """Cumulative-bucket histogram (seconds)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{_num(b)}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_num(self.sum)}")
        out.append(f"{name}_count {self.count}")
        return out


class ServerMetrics:
    """Thread-safe counters for one app. ``render(engine)`` writes the exposition text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.errors: dict[tuple[str, str], int] = defaultdict(int)
        self.finish: dict[str, int] = defaultdict(int)
        self.in_flight = 0
        self.client_cancelled = 0
        self.prompt_tokens = self.cached_tokens = self.completion_tokens = 0
        self.generations = self.generations_with_cache = 0
        self.disk_cache_off = 0  # 1 while the last generation said its disk prefix cache is off
        self.disk_cache_off_answers = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.queue = Histogram(QUEUE_BUCKETS)

    # -- recording -----------------------------------------------------------------------------------
    def request_started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def request_done(self, endpoint: str, method: str, status: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.requests[(endpoint, method, status)] += 1

    def error(self, type_: str, code: str | None) -> None:
        with self._lock:
            self.errors[(type_, code or "")] += 1

    def cancelled_by_client(self) -> None:
        with self._lock:
            self.client_cancelled += 1

    def generation(self, done: Any) -> None:
        """Record a finished generation (an ``app.protocol.types.Done``)."""
        m = done.metrics
        with self._lock:
            self.generations += 1
            self.generations_with_cache += 1 if m.cached_tokens else 0
            self.finish[done.finish_reason] += 1
            self.prompt_tokens += m.prompt_tokens
            self.cached_tokens += m.cached_tokens
            self.completion_tokens += m.completion_tokens
            self.ttft.observe(m.ttft_s)
            self.queue.observe(m.queue_s)
            if m.completion_tokens > 1:
                self.tpot.observe(m.tpot_s)
            off = str(getattr(m, "cache_error", "") or "").startswith("disk cache off")
            self.disk_cache_off = int(off)
            self.disk_cache_off_answers += int(off)

    # -- exposition ----------------------------------------------------------------------------------
    def render(self, engine: Optional[Backend] = None) -> str:
        with self._lock:
            out: list[str] = []
            _family(out, "hearth_http_requests_total", "counter", "HTTP requests answered",
                    [(f'endpoint="{e}",method="{m}",status="{s}"', v)
                     for (e, m, s), v in sorted(self.requests.items())])
            _family(out, "hearth_http_errors_total", "counter", "error answers by OpenAI error type and code",
                    [(f'type="{t}",code="{c}"', v) for (t, c), v in sorted(self.errors.items())])
            _family(out, "hearth_http_requests_in_flight", "gauge", "HTTP requests being served",
                    [("", self.in_flight)])
            _family(out, "hearth_requests_cancelled_total", "counter",
                    "generations cancelled because the HTTP client disconnected", [("", self.client_cancelled)])
            _family(out, "hearth_generations_total", "counter",
                    "generations finished through the API, by finish reason",
                    [(f'finish_reason="{k}"', v) for k, v in sorted(self.finish.items())])
            _family(out, "hearth_prompt_tokens_total", "counter", "prompt tokens of API generations",
                    [("", self.prompt_tokens)])
            _family(out, "hearth_cached_prompt_tokens_total", "counter", "prompt tokens reused from the KV cache",
                    [("", self.cached_tokens)])
            _family(out, "hearth_generated_tokens_total", "counter", "tokens generated for API requests",
                    [("", self.completion_tokens)])
            rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
            _family(out, "hearth_prefix_cache_hit_rate", "gauge",
                    "cached prompt tokens / prompt tokens over API generations", [("", rate)])
            hits = self.generations_with_cache / self.generations if self.generations else 0.0
            _family(out, "hearth_prefix_cache_request_hit_ratio", "gauge",
                    "share of API generations that reused a cached prefix", [("", hits)])
            _family(out, "hearth_prefix_cache_disk_off", "gauge",
                    "1 while the disk prefix cache is off (cannot open, read or write; generation goes on without "
                    "it and it is tried again), as the last API generation reported", [("", self.disk_cache_off)])
            _family(out, "hearth_prefix_cache_disk_off_generations_total", "counter",
                    "API generations that ran while the disk prefix cache was off",
                    [("", self.disk_cache_off_answers)])
            for name, h, help_ in (("hearth_ttft_seconds", self.ttft, "time to first token (after queueing)"),
                                   ("hearth_tpot_seconds", self.tpot, "mean time per output token after the first"),
                                   ("hearth_queue_wait_seconds", self.queue, "time waiting for the engine")):
                out += [f"# HELP {name} {help_}", f"# TYPE {name} histogram", *h.lines(name)]
        out += _engine_lines(engine)
        return "\n".join(out) + "\n"


def _engine_lines(engine: Optional[Backend]) -> list[str]:
    out: list[str] = []
    loaded = engine is not None
    _family(out, "hearth_model_loaded", "gauge", "1 when a chat model is loaded", [("", int(loaded))])
    if not loaded:
        return out
    _family(out, "hearth_queue_depth", "gauge", "requests waiting for a free engine slot (UI and API)",
            [("", engine.queue_depth())])
    _family(out, "hearth_active_requests", "gauge", "requests running in an engine slot now (UI and API)",
            [("", engine.active())])
    _family(out, "hearth_parallel_slots", "gauge", "sequences the engine serves at once (n_parallel)",
            [("", engine.n_parallel)])
    st = engine.stats
    for field in ("requests", "completed", "cancelled", "failed", "crashes"):
        _family(out, f"hearth_engine_{field}_total", "counter", f"engine {field} since it was created (UI and API)",
                [("", getattr(st, field))])
    return out


def _family(out: list[str], name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        out.append(f"{name}{{{labels}}} {_num(value)}" if labels else f"{name} {_num(value)}")


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))
