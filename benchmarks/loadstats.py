"""Pure statistics of ``hearth bench load`` (no I/O, no clock reads): request records, percentiles, Poisson
arrival times, SLO accounting and goodput.

Every time here is in **seconds**, read by the benchmark client with ``time.perf_counter()`` in one process,
so differences between two stamps of one run are meaningful and absolute values are not. The clocks:

- **TTFT** (time to first token) = the client begins sending the request (before connecting) → the first
  *non-empty* content delta is received by the client (``choices[0].text`` on ``/v1/completions``,
  ``choices[0].delta.content`` on ``/v1/chat/completions``). It includes connection setup, queueing in the
  server, prompt processing and SSE framing: what a tool calling the port waits for.
- **ITL** (inter-token latency) = the gap between two successive non-empty content deltas received. A server
  that packs several tokens into one delta shows one long gap, not several short ones; ITL is per delta.
- **TPOT** (time per output token) = (end − first token) / (completion_tokens − 1), with completion_tokens
  from the server's ``usage`` (or, when the server sends no usage, the number of content deltas: the record
  says which in ``tokens_source``). Undefined for fewer than 2 tokens.
- **End-to-end** = the client begins sending → the last byte of the stream (after ``data: [DONE]``, or the
  connection closing) is received.
- **Queueing time** = what the server says the request waited before it was served: Hearth's
  ``hearth.metrics.queue_s`` from the stream's last chunk (``Engine.generate`` called → request accepted).
  Absent (``None``) for a server that does not report it; never estimated.

Requests end in one of three states: ``ok`` (HTTP 200 and a complete stream), ``rejected`` (HTTP 429: the
server refused it for load) or ``failed`` (anything else: another HTTP status, a connection error, an error
event inside the stream, a timeout). Latency statistics are computed over ``ok`` requests only; every success
rate and goodput keeps all requests, rejected and failed included, in its denominator, so refusing work never
improves a score.

Percentiles use linear interpolation between closest ranks, the definition of ``numpy.percentile``'s
default method (``"linear"``, type 7 of Hyndman & Fan 1996): for sorted samples x[0..n−1] and q in [0, 100],
h = (n − 1)·q/100 and P = x[⌊h⌋] + (h − ⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋]). The result equals ``numpy.percentile(x, q)``.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional, Sequence

STATUSES = ("ok", "rejected", "failed")
PERCENTILES = (50.0, 95.0, 99.0)
PERCENTILE_DEFINITION = ("linear interpolation between closest ranks, numpy.percentile's default 'linear' "
                         "method (Hyndman & Fan type 7)")

# The clocks, as every report states them (the module docstring explains them).
CLOCKS = {
    "clock": "time.perf_counter() in the benchmark client's process; every time in seconds",
    "ttft_s": "the client begins sending the request (before connecting) -> the first non-empty content delta "
              "is received by the client",
    "itl_s": "gap between two successive non-empty content deltas received by the client",
    "tpot_s": "(end - first token) / (completion_tokens - 1); completion_tokens from usage (else counted deltas); "
              "undefined below 2 tokens",
    "e2e_s": "the client begins sending the request -> the last byte of the stream is received",
    "queue_s": "the server's own report of its queueing time (Hearth: hearth.metrics.queue_s in the last "
               "chunk, Engine.generate called -> request accepted); absent when the server reports none",
    "multiturn": "think time between turns is outside every request's clocks; the conversation's end-to-end "
                 "time (extra.conversation_e2e_s) includes it",
    "duration_s": "a cell's wall time: its first request sent -> its last request ended (summed over rounds); "
                  "tokens/s, requests/s and goodput divide by it",
}
ACCOUNTING = ("ok = HTTP 200 and a complete stream; rejected = HTTP 429; failed = any other status, a connection "
              "error, an error event in the stream, a timeout or a stream cut before [DONE]. Latencies are over ok "
              "requests; success rate, SLO attainment and goodput keep every request sent in the denominator.")


# -- percentiles ----------------------------------------------------------------------------------------------
def percentile(samples: Iterable[float], q: float) -> float:
    """The q-th percentile (q in [0, 100]) of ``samples`` by linear interpolation between closest ranks
    (``numpy.percentile``'s default ``"linear"`` method; see the module docstring). Units: those of the
    samples. Raises ``ValueError`` for no samples, a non-finite sample or q outside [0, 100]."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("percentile of no samples")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError("percentile: every sample must be finite")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def distribution(samples: Iterable[float]) -> dict[str, Any]:
    """``{"n", "mean", "p50", "p95", "p99", "max"}`` of ``samples`` (units: the samples'); with no samples
    ``n`` is 0 and every statistic is ``None`` (a missing measurement is never reported as 0)."""
    xs = [float(x) for x in samples]
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    out: dict[str, Any] = {"n": len(xs), "mean": sum(xs) / len(xs)}
    for q in PERCENTILES:
        out[f"p{q:g}"] = percentile(xs, q)
    out["max"] = max(xs)
    return out


# -- arrivals -------------------------------------------------------------------------------------------------
def poisson_arrivals(rate: float, n: int, seed: int = 0) -> list[float]:
    """``n`` arrival times in seconds after the start of an open-loop run, as a Poisson process of ``rate``
    requests per second: the gaps are independent exponential draws with mean 1/rate s
    (``random.Random(seed).expovariate(rate)``), and arrival i is the sum of the first i+1 gaps (the first
    request waits one gap too). Same (rate, n, seed) → the same list. Raises ``ValueError`` for a rate that is
    not a finite number > 0 or a negative n."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"Poisson arrival rate must be a finite number > 0 requests/s, got {rate!r}")
    if n < 0:
        raise ValueError(f"number of arrivals must be >= 0, got {n}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


# -- records --------------------------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    """What the client saw of one request. Times: seconds on the client's ``perf_counter`` (module docstring).

    ``send_s``: the client began the request. ``first_token_s``: the first non-empty content delta arrived
    (None: none did). ``token_times``: every non-empty content delta's arrival, in order. ``end_s``: the last
    byte of the stream (or the error) arrived. ``completion_tokens`` / ``prompt_tokens``: from ``usage``
    (``tokens_source`` = ``"usage"``) or counted deltas / unknown 0 (``"deltas"``). ``cached_tokens``:
    ``usage.prompt_tokens_details.cached_tokens`` when the server reports it, else None. ``queue_s``: the
    server's queueing time when it reports one (Hearth: ``hearth.metrics.queue_s``), else None. ``status``:
    ok | rejected (HTTP 429) | failed; ``http_status`` and ``error`` say why. ``wait_before_s``: a multi-turn
    replay's think time before this turn (excluded from its latencies). ``label``: the workload cell.
    """

    label: str = ""
    send_s: float = 0.0
    first_token_s: Optional[float] = None
    token_times: list[float] = field(default_factory=list)
    end_s: Optional[float] = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: Optional[int] = None
    queue_s: Optional[float] = None
    tokens_source: str = "deltas"  # "usage" once a usage chunk arrived
    status: str = "ok"
    http_status: Optional[int] = None
    error: str = ""
    wait_before_s: float = 0.0
    text: str = ""

    @property
    def ttft_s(self) -> Optional[float]:
        return None if self.first_token_s is None else self.first_token_s - self.send_s

    @property
    def e2e_s(self) -> Optional[float]:
        return None if self.end_s is None else self.end_s - self.send_s

    @property
    def itls_s(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot_s(self) -> Optional[float]:
        if self.first_token_s is None or self.end_s is None or self.completion_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.completion_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        """The record with its derived clocks (``ttft_s``, ``tpot_s``, ``e2e_s``, ``itl_p95_s``), times
        relative to ``send_s`` so the JSON does not carry meaningless absolute clock values."""
        d = asdict(self)
        base = self.send_s
        d["first_token_s"] = None if self.first_token_s is None else self.first_token_s - base
        d["end_s"] = None if self.end_s is None else self.end_s - base
        d["token_times"] = [t - base for t in self.token_times]
        d.update(ttft_s=self.ttft_s, tpot_s=self.tpot_s, e2e_s=self.e2e_s, itl_p95_s=_itl_p95(self))
        return d


def _itl_p95(r: RequestRecord) -> Optional[float]:
    gaps = r.itls_s
    return percentile(gaps, 95.0) if gaps else None


# -- SLOs and goodput -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SLO:
    """Service-level objectives one request must meet to count toward goodput (seconds): TTFT ≤ ``ttft_s``
    and the P95 of its own inter-token gaps ≤ ``itl_p95_s``. A request with fewer than two content deltas has
    no gaps and meets the ITL objective vacuously; a request that is not ``ok``, or an ok one that streamed no
    content at all (no TTFT), meets nothing. Raises ``ValueError`` for an objective that is not > 0."""

    ttft_s: float = 1.0
    itl_p95_s: float = 0.100

    def __post_init__(self) -> None:
        for name in ("ttft_s", "itl_p95_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"SLO {name} must be a finite number of seconds > 0, got {v!r}")

    def met(self, r: RequestRecord) -> bool:
        """True when ``r`` is ok and meets both objectives."""
        if r.status != "ok" or r.ttft_s is None or r.ttft_s > self.ttft_s:
            return False
        p95 = _itl_p95(r)
        return p95 is None or p95 <= self.itl_p95_s


def counts(records: Sequence[RequestRecord]) -> dict[str, int]:
    """``{"total", "ok", "rejected", "failed"}``; raises ``ValueError`` for an unknown status."""
    out = {"total": len(records), **{s: 0 for s in STATUSES}}
    for r in records:
        if r.status not in STATUSES:
            raise ValueError(f"request status must be one of {STATUSES}, got {r.status!r}")
        out[r.status] += 1
    return out


def goodput(records: Sequence[RequestRecord], slo: SLO, duration_s: Optional[float]) -> dict[str, Any]:
    """SLO accounting over every request sent (rejected and failed ones stay in the denominators):

    - ``good``: requests that met the SLO; ``goodput_rps`` = good / ``duration_s`` (requests per second; None
      when ``duration_s`` is None);
    - ``slo_attainment`` = good / total; ``success_rate`` = ok / total (None when no request was sent).

    Raises ``ValueError`` for a ``duration_s`` that is not > 0."""
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"goodput needs a duration > 0 s, got {duration_s!r}")
    total = len(records)
    good = sum(1 for r in records if slo.met(r))
    ok = sum(1 for r in records if r.status == "ok")
    return {"good": good, "total": total, "goodput_rps": good / duration_s if duration_s else None,
            "slo_attainment": good / total if total else None, "success_rate": ok / total if total else None,
            "slo": asdict(slo)}


def span_s(records: Sequence[RequestRecord]) -> Optional[float]:
    """The run's wall time: the first request's send → the last request's end (s); None without records."""
    ends = [r.end_s for r in records if r.end_s is not None]
    if not records or not ends:
        return None
    return max(ends) - min(r.send_s for r in records)


def summarize(records: Sequence[RequestRecord], slo: SLO, duration_s: Optional[float] = None) -> dict[str, Any]:
    """Everything one workload cell reports. Latency distributions (``ttft_s``, ``tpot_s``, ``itl_s`` over
    every gap of every ok request, ``e2e_s``, ``queue_s``) are over ok requests. ``duration_s`` defaults to
    ``span_s(records)``; ``output_tokens_per_s`` = completion tokens of ok requests / duration and
    ``requests_per_s`` = ok requests / duration. ``cache_hit_rate`` = Σ cached_tokens / Σ prompt_tokens over
    the ok requests whose server reported cached tokens (None when none did)."""
    ok = [r for r in records if r.status == "ok"]
    dur = span_s(records) if duration_s is None else duration_s
    out: dict[str, Any] = {"counts": counts(records), "duration_s": dur}
    out["ttft_s"] = distribution(r.ttft_s for r in ok if r.ttft_s is not None)
    out["tpot_s"] = distribution(r.tpot_s for r in ok if r.tpot_s is not None)
    out["itl_s"] = distribution(g for r in ok for g in r.itls_s)
    out["e2e_s"] = distribution(r.e2e_s for r in ok if r.e2e_s is not None)
    out["queue_s"] = distribution(r.queue_s for r in ok if r.queue_s is not None)
    tokens = sum(r.completion_tokens for r in ok)
    out["completion_tokens"] = tokens
    out["prompt_tokens"] = sum(r.prompt_tokens for r in ok)
    out["output_tokens_per_s"] = tokens / dur if dur else None
    out["requests_per_s"] = len(ok) / dur if dur else None
    reported = [r for r in ok if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    out["cache_hit_rate"] = sum(r.cached_tokens or 0 for r in reported) / prompt if prompt else None
    out["goodput"] = goodput(records, slo, dur if dur else None)
    out["errors"] = sorted({r.error for r in records if r.status != "ok" and r.error})[:10]
    return out


def ratio(other: Optional[float], base: Optional[float]) -> Optional[float]:
    """other / base, or None when either is missing or base is 0."""
    if other is None or base is None or base == 0:
        return None
    return other / base
