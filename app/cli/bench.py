"""``hearth bench engine|cache|server|load|...``: benchmarks that print ratios against a baseline measured in the same
run (``load``: latency and throughput under five workloads, against Hearth or any OpenAI-compatible server;
``soak``: mixed load for a given time, then errors, latency drift and every Hearth process's memory)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

BENCHES = {"engine": "benchmarks.engine_bench", "cache": "benchmarks.prefix_cache_bench",
           "server": "benchmarks.server_bench", "retrieval": "benchmarks.retrieval_perf",
           "retrieval-quality": "benchmarks.retrieval_quality", "load": "benchmarks.load_bench",
           "reasoning": "benchmarks.reasoning_bench", "speculative": "benchmarks.speculative_bench",
           "soak": "benchmarks.soak"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark (engine, cache, server, load, soak, reasoning, "
                                     "speculative, retrieval, retrieval-quality)")
    p.add_argument("name", choices=sorted(BENCHES))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark (see its --help)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    repo = Path(__file__).resolve().parents[2]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    try:
        mod = importlib.import_module(BENCHES[args.name])
    except ModuleNotFoundError:
        print(f"hearth: error: benchmark {args.name!r} is not available in this installation "
              "(benchmarks/ ships with the source checkout)", file=sys.stderr)
        return 1
    if "prog" in inspect.signature(mod.main).parameters:  # its usage line names the command typed
        return int(mod.main(args.rest, prog=f"hearth bench {args.name}") or 0)
    return int(mod.main(args.rest) or 0)
