"""HTTP overhead benchmark: decode tokens/s through the server's SSE stream vs the engine called directly.

Both sides run in one invocation on one ``Engine`` (the server is a ``ServerThread`` on 127.0.0.1 over that
same engine), with the same raw prompt and greedy decoding, alternating A/B/A/B so that machine noise hits
both. Per run, at the caller:

- decode tokens/s = (completion tokens − 1) / (last text arrival − first text arrival); the HTTP side reads
  the raw SSE lines with ``httpx`` and takes the token count from the ``include_usage`` chunk;
- TTFT = request sent → first text at the caller (the HTTP side includes connection, JSON and SSE framing).

Reported: the median of each side and the ratio HTTP / engine (target ≥ 0.95).
Run: ``python -m benchmarks.server_bench [--tokens 256] [--rounds 3] [--model PATH]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8,"


def engine_run(engine, n: int) -> dict:
    from app.protocol.types import DecodingParams, Delta, Done, GenerateRequest

    req = GenerateRequest(prompt=PROMPT, decoding=DecodingParams.make(temperature=0.0, max_tokens=n))
    t0 = time.perf_counter()
    times, done = [], None
    for ev in engine.generate(req):
        if isinstance(ev, Delta) and ev.text:
            times.append(time.perf_counter())
        elif isinstance(ev, Done):
            done = ev
    return _result(t0, times, done.metrics.completion_tokens)


def http_run(url: str, model: str, n: int) -> dict:
    import httpx

    body = {"model": model, "prompt": PROMPT, "temperature": 0, "max_tokens": n, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    times, tokens = [], 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            if obj["choices"] and obj["choices"][0]["text"]:
                times.append(time.perf_counter())
            elif obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    return _result(t0, times, tokens)


def _result(t0: float, times: list[float], tokens: int) -> dict:
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {"ttft_s": times[0] - t0 if times else 0.0, "tokens": tokens,
            "decode_tps": (tokens - 1) / span if span > 0 else 0.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="GGUF path (default: the bundled model)")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings
    from app.server import ServerThread, create_app
    from app.settings import ServerSettings

    model = Path(args.model) if args.model else _bundled()
    engine = Engine(model, LoadSettings(n_ctx=args.n_ctx, n_threads=args.n_threads))
    engine.load()
    runs: dict[str, list[dict]] = {"engine": [], "http": []}
    try:
        with ServerThread(create_app(engine, ServerSettings())) as srv:
            engine_run(engine, 8)  # warm-up both paths (first load of pages, connection setup)
            http_run(srv.url, model.stem, 8)
            for _ in range(args.rounds):
                runs["engine"].append(engine_run(engine, args.tokens))
                runs["http"].append(http_run(srv.url, model.stem, args.tokens))
    finally:
        engine.close()
    summary = {side: {k: statistics.median(r[k] for r in rs) for k in ("decode_tps", "ttft_s", "tokens")}
               for side, rs in runs.items()}
    summary["ratio_decode_http_over_engine"] = summary["http"]["decode_tps"] / summary["engine"]["decode_tps"]
    if args.json:
        print(json.dumps({"summary": summary, "runs": runs}, indent=2))
    else:
        for side in ("engine", "http"):
            s = summary[side]
            print(f"{side:6s}  decode {s['decode_tps']:6.1f} tok/s  TTFT {s['ttft_s'] * 1000:6.1f} ms  "
                  f"({s['tokens']:.0f} tokens, median of {args.rounds})")
        print(f"ratio http/engine decode: {summary['ratio_decode_http_over_engine']:.3f} (target >= 0.95)")
    return 0


def _bundled() -> Path:
    from app.catalog.registry import resolve_model

    return resolve_model(None)


if __name__ == "__main__":
    sys.exit(main())
