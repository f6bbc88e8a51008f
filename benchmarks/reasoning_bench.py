"""``hearth bench reasoning``: what extra samples and extra thinking buy on an arithmetic set, and at what cost.

In one run, on one model (default: the bundled Gemma 3 270M base model), over ``--items`` problems of
``benchmarks/reasoning_items.py`` (known answers):

1. **The grid.** Each item runs once per thinking budget (``--budgets``, default 0, 32, 128 tokens, as
   ``ReasoningRequest`` budgets: the base model thinks only when Hearth prefills ``<think>``, and its
   thinking is ended when the budget runs out) with ``n`` = 5 self-consistency samples
   (``app.engine.policies.self_consistency``; ``last_number`` extraction, the ``[0-9]+`` format verifier of
   ``reasoning_items.VERIFIER``). n = 1 and n = 3 are read from the first 1 and 3 samples: with independent
   seeds a prefix of the samples *is* a smaller run (docs/reasoning.md), which saves 4 of 9 runs per item.
   Per budget and n: accuracy (the voted answer equals the known answer), mean agreement, ties, items with
   no extractable answer, tokens and seconds per item, and the cost per accepted answer
   (``consistency.cost_per_accepted``: all attempts' tokens and seconds ÷ correct answers). Then the
   marginal gain per step of budget (``consistency.marginal_gains``), across thinking budgets and across n.
2. **The router.** ``app.engine.policies.router.route`` on each question (the question only: the few-shot preamble
   is the bench's, not the person's), against always-fast (the smallest budget) and always-reasoning (the
   largest), at n = 1, over a mixed set: the arithmetic items plus ``--easy`` one-step lookups
   (``easy_items``: "What number comes right after 41?") that need no working. The router's own time is
   added to its cost.

**What "tokens" and "seconds" mean.** Tokens are sampled tokens (thinking and answer; the prompt is not
counted: samples 1..n-1 copy it from sample 0's slot, see ``SelfConsistencyResult.prefilled_tokens`` in the
JSON). Seconds are *machine* seconds: a run's wall time (n samples decoding in one batch) is shared among its
samples in proportion to their tokens, so that the n = 1 figure is one sample's share of the batch, and
n = 5 costs the whole wall time. The easy items run n = 1 in groups of ``--parallel`` at once and are
shared the same way. Latency to one answer is longer than its share: the JSON keeps each run's wall time.

Plan on 2 CPU cores (``--items 40``, budgets 0/32/128, n = 5, ``--answer-tokens 40``): 40 × 3 runs of 5
samples plus 2 × 20 easy samples, about 45,000 sampled tokens; the plan line gives the estimate from the
decode speed of the first run. ``--quick``: 6 items, 6 easy, budgets 0/16/32.
Run: ``hearth bench reasoning [--out results.json]`` or ``python -m benchmarks.reasoning_bench``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import asdict, replace
from typing import Any, Sequence

from benchmarks.reasoning_items import EXTRACT, STOP, VERIFIER, Item, default_items

WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen twenty").split()
MAX_N = 5
NS = (1, 3, 5)


def easy_items(count: int = 20, seed: int = 14) -> list[Item]:
    """One-step lookups with known answers (no working needed), three templates in turn, numbers from
    ``random.Random(seed)``: the router's fast-path questions."""
    r = random.Random(seed)
    out = []
    for i in range(count):
        kind = ("after", "larger", "digits")[i % 3]
        if kind == "after":
            a = r.randint(2, 90)
            q, ops, ans = f"What number comes right after {a}?", (a,), a + 1
        elif kind == "larger":
            a, b = r.sample(range(2, 99), 2)
            q, ops, ans = f"Which number is larger, {a} or {b}?", (a, b), max(a, b)
        else:
            a = r.randint(2, 20)
            q, ops, ans = f"Write the number {WORDS[a]} in digits.", (), a
        out.append(Item(f"easy-{i:03d}", kind, q, ops, ans))
    return out


# --- running ----------------------------------------------------------------------------------------------

def make_request(item: Item, budget: int, answer_tokens: int, temperature: float):
    """The request for one item at a thinking budget: the few-shot raw prompt, ``STOP`` and a newline (every
    worked answer of ``FEW_SHOT`` is one line; stop strings apply to the answer, not the thinking), room for the
    thinking and at least ``answer_tokens`` of answer (``max_tokens`` counts both, and the engine fits the
    budget to half of it); after a forced end of thinking "The answer is" is inserted."""
    from app.protocol.reasoning import resolve_budget
    from app.protocol.types import DecodingParams, GenerateRequest, ReasoningRequest

    reasoning = ReasoningRequest(budget=resolve_budget(budget_tokens=budget),
                                 answer_now="The answer is" if budget else None)
    return GenerateRequest(prompt=item.prompt(), reasoning=reasoning, decoding=DecodingParams.make(
        temperature=temperature, max_tokens=max(2 * budget, budget + answer_tokens), stop=STOP + ("\n",)))


def shared(candidates: Sequence[Any], wall_s: float) -> list[Any]:
    """``candidates`` with ``seconds`` set to their share of ``wall_s`` by tokens (module docstring)."""
    total = sum(c.tokens for c in candidates)
    n = len(candidates)
    return [replace(c, seconds=wall_s * (c.tokens / total if total else 1 / n)) for c in candidates]


def run_item(engine, item: Item, j: int, budget: int, args, spec) -> dict:
    """One item at ``budget`` with ``MAX_N`` samples: its candidates (shared seconds) and the run's figures."""
    from app.engine.policies.self_consistency import run_self_consistency

    res = run_self_consistency(engine, make_request(item, budget, args.answer_tokens, args.temperature), spec,
                               seed=args.seed + 1000 * j)
    return {"candidates": shared(res.candidates, res.wall_s), "wall_s": res.wall_s,
            "prefilled_tokens": res.prefilled_tokens, "prompt_tokens": res.prompt_tokens,
            "reasoning_tokens": sum(d.metrics.reasoning_tokens for d in res.dones),
            "forced": sum(d.metrics.reasoning_forced for d in res.dones), "texts": [d.text for d in res.dones],
            "reasoning": [d.reasoning for d in res.dones]}


def run_grid(engine, items: list[Item], args, spec, log) -> tuple[dict[int, dict[str, dict]], list[Item]]:
    """Every item at every budget (items outer, so that an interrupted run (Ctrl-C) still reports the items
    it finished at all budgets): budget → item id → ``run_item``'s dict; and the items finished."""
    grids: dict[int, dict[str, dict]] = {b: {} for b in args.budgets}
    finished: list[Item] = []
    t0, tokens = time.perf_counter(), 0
    try:
        for j, item in enumerate(items):
            for b in args.budgets:
                grids[b][item.id] = run_item(engine, item, j, b, args, spec)
                tokens += sum(c.tokens for c in grids[b][item.id]["candidates"])
            finished.append(item)
            el = time.perf_counter() - t0
            log(f"  {j + 1}/{len(items)} items, {el:.0f} s, {tokens / el:.0f} sampled tokens/s, about "
                f"{el / (j + 1) * (len(items) - j - 1) / 60:.1f} min left for the grid")
    except KeyboardInterrupt:
        log(f"interrupted: reporting the {len(finished)} items finished at every budget")
    return {b: {i.id: g[i.id] for i in finished} for b, g in grids.items()}, finished


def run_singles(engine, items: list[Item], budget: int, args, spec) -> dict[str, Any]:
    """Each item once at ``budget``, n = 1, ``args.parallel`` items at a time: id → candidate (shared
    seconds of its group's wall time)."""
    from app.engine.policies.self_consistency import run_self_consistency

    out: dict[str, Any] = {}
    for g in range(0, len(items), args.parallel):
        group = items[g:g + args.parallel]
        results: list[Any] = [None] * len(group)

        def one(i: int, group: list[Item] = group, results: list = results, g: int = g) -> None:
            results[i] = run_self_consistency(engine, make_request(group[i], budget, args.answer_tokens,
                                                                   args.temperature), spec, seed=args.seed + g + i)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(group))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if any(r is None for r in results):
            raise RuntimeError("an easy item failed (see the log above)")
        cands = shared([r.candidates[0] for r in results], wall)
        out.update({item.id: c for item, c in zip(group, cands)})
    return out


# --- the report -------------------------------------------------------------------------------------------

def grid_row(grid: dict[str, dict], items: list[Item], budget: int, k: int) -> dict:
    """Accuracy, agreement and cost at ``budget`` from the first ``k`` samples of each item."""
    from app.engine.policies.vote import cost_per_accepted, vote

    by_item = {it.id: grid[it.id]["candidates"][:k] for it in items}
    votes = {it.id: vote(by_item[it.id]) for it in items}
    correct = {it.id: votes[it.id].answer == str(it.answer) for it in items}
    cost = cost_per_accepted(by_item, accepted=correct)
    agreeing = [v.agreement for v in votes.values() if not v.no_answer]
    n = len(items)
    return {"budget": budget, "n": k, "accuracy": sum(correct.values()) / n,
            "agreement": sum(agreeing) / len(agreeing) if agreeing else None,
            "ties": sum(v.tie for v in votes.values()), "no_answer": sum(v.no_answer for v in votes.values()),
            "tokens_per_item": cost.tokens / n, "seconds_per_item": cost.seconds / n,
            "correct": cost.accepted, "tokens_per_accepted": cost.tokens_per_accepted,
            "seconds_per_accepted": cost.seconds_per_accepted}


def gains(rows: list[dict], key: str) -> list[dict]:
    from app.engine.policies.vote import BudgetPoint, marginal_gains

    pts = [BudgetPoint(r[key], r["accuracy"], r["tokens_per_item"], r["seconds_per_item"]) for r in rows]
    return [asdict(g) for g in marginal_gains(pts)]


def router_rows(items: list[Item], fast: dict, reasoning: dict, budgets: tuple[int, int]) -> tuple[list, dict]:
    """Always-fast, always-reasoning and the router over ``items``; the router's time is part of its cost."""
    from app.engine.policies.router import RouterConfig, route
    from app.engine.policies.vote import cost_per_accepted

    cfg = RouterConfig(fast_tokens=budgets[0], reasoning_tokens=budgets[1])
    routes = {it.id: route(it.question, "auto", cfg) for it in items}
    chosen = {it.id: (reasoning if routes[it.id].path == "reasoning" else fast)[it.id] for it in items}
    route_s = sum(r.seconds for r in routes.values())
    rows = []
    for name, pick, extra_s in (("always fast", fast, 0.0), ("always reasoning", reasoning, 0.0),
                                ("router", chosen, route_s)):
        correct = {it.id: pick[it.id].answer == str(it.answer) for it in items}
        cost = cost_per_accepted({it.id: [pick[it.id]] for it in items}, accepted=correct)
        n, good = len(items), cost.accepted
        rows.append({"policy": name, "accuracy": good / n, "correct": good, "tokens_per_item": cost.tokens / n,
                     "seconds_per_item": (cost.seconds + extra_s) / n, "routing_s": extra_s,
                     "tokens_per_accepted": cost.tokens_per_accepted,
                     "seconds_per_accepted": (cost.seconds + extra_s) / good if good else None})
    paths = {"reasoning": [i for i, r in routes.items() if r.path == "reasoning"],
             "fast": [i for i, r in routes.items() if r.path == "fast"], "routing_s_total": route_s,
             "routing_us_per_request": route_s / len(items) * 1e6}
    return rows, paths


def _f(x: Any, fmt: str = "{:.2f}", none: str = "∞") -> str:
    return none if x is None else fmt.format(x)


def markdown(report: dict) -> str:
    """The report's tables in Markdown (the JSON holds every figure)."""
    cfg = report["config"]
    out = [f"Model {cfg['model']}, {cfg['items']} arithmetic items, budgets {cfg['budgets']}, temperature "
           f"{cfg['temperature']}, n_parallel {cfg['parallel']}, {report['wall_s']:.0f} s in all.", "",
           "| thinking budget | n | accuracy | agreement | ties | no answer | tokens/item | s/item "
           "| tokens/correct | s/correct |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["grid"]:
        out.append(f"| {r['budget']} | {r['n']} | {r['accuracy']:.1%} ({r['correct']}) | {_f(r['agreement'])} "
                   f"| {r['ties']} | {r['no_answer']} | {r['tokens_per_item']:.1f} | {r['seconds_per_item']:.2f} "
                   f"| {_f(r['tokens_per_accepted'], '{:.0f}')} | {_f(r['seconds_per_accepted'])} |")
    out += ["", "Marginal gain per step (accuracy points of 0..1; — where the step cost nothing more):", "",
            "| step | n | accuracy gain | extra tokens/item | extra s/item | gain per 1k tokens | gain per s |",
            "|---|---|---|---|---|---|---|"]
    for n, steps in report["gains_by_budget"].items():
        for g in steps:
            out.append(f"| budget {g['from_budget']:g} → {g['to_budget']:g} | {n} | {g['accuracy_gain']:+.3f} "
                       f"| {g['extra_tokens']:+.1f} | {g['extra_seconds']:+.2f} "
                       f"| {_f(g['gain_per_1k_tokens'], '{:+.3f}', '—')} "
                       f"| {_f(g['gain_per_second'], '{:+.3f}', '—')} |")
    for b, steps in report["gains_by_n"].items():
        for g in steps:
            out.append(f"| n {g['from_budget']:g} → {g['to_budget']:g} | budget {b} | {g['accuracy_gain']:+.3f} "
                       f"| {g['extra_tokens']:+.1f} | {g['extra_seconds']:+.2f} "
                       f"| {_f(g['gain_per_1k_tokens'], '{:+.3f}', '—')} "
                       f"| {_f(g['gain_per_second'], '{:+.3f}', '—')} |")
    rp = report["router_paths"]
    out += ["", f"Router vs fixed paths, n = 1, over {report['router_items']} items ({cfg['items']} arithmetic + "
            f"{cfg['easy']} one-step lookups); the router sent {len(rp['reasoning'])} to reasoning and "
            f"{len(rp['fast'])} to fast, {rp['routing_us_per_request']:.0f} µs per request:", "",
            "| policy | accuracy | tokens/item | s/item | tokens/correct | s/correct |", "|---|---|---|---|---|---|"]
    for r in report["router"]:
        out.append(f"| {r['policy']} | {r['accuracy']:.1%} ({r['correct']}) | {r['tokens_per_item']:.1f} "
                   f"| {r['seconds_per_item']:.3f} | {_f(r['tokens_per_accepted'], '{:.0f}')} "
                   f"| {_f(r['seconds_per_accepted'])} |")
    return "\n".join(out)


# --- the command ------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hearth bench reasoning", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model name or GGUF path (default: the bundled model)")
    p.add_argument("--items", type=int, default=40, help="arithmetic items (1..60, default 40)")
    p.add_argument("--easy", type=int, default=20, help="one-step lookups added for the router (default 20)")
    p.add_argument("--budgets", default="0,32,128", help="thinking budgets in tokens, comma-separated")
    p.add_argument("--answer-tokens", type=int, default=40, help="max answer tokens after thinking")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--parallel", type=int, default=5, help="n_parallel slots (5: the 5 samples in one batch)")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--quick", action="store_true", help="6 items, 6 easy, budgets 0,16,32")
    p.add_argument("--out", default=None, help="write the report as JSON here")
    a = p.parse_args(argv)
    if a.quick:
        a.items, a.easy, a.budgets = min(a.items, 6), min(a.easy, 6), "0,16,32"
    a.budgets = tuple(sorted({int(b) for b in a.budgets.split(",")}))
    if not 1 <= a.items <= 60 or len(a.budgets) < 2:
        p.error("--items must be 1..60 and --budgets must name at least two budgets")
    return a


def run(args: argparse.Namespace, log=None) -> dict:
    """Run the bench (module docstring) and return the report as a dict."""
    from app.catalog.registry import resolve_model
    from app.engine.local.engine import Engine
    from app.engine.policies.consistency import parse_self_consistency
    from app.protocol.types import LoadSettings

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    items, easy = list(default_items()[:args.items]), easy_items(args.easy, args.seed)
    spec = parse_self_consistency({"n": MAX_N, "extract": EXTRACT, "verifier": VERIFIER})
    single = parse_self_consistency({"n": 1, "extract": EXTRACT, "verifier": VERIFIER})
    path = resolve_model(args.model)
    n_ctx = 512 + 2 * max(args.budgets) + args.answer_tokens
    t0 = time.perf_counter()
    samples = len(items) * len(args.budgets) * MAX_N + 2 * len(easy)
    tokens = sum(len(items) * MAX_N * (b + args.answer_tokens * 0.8) for b in args.budgets)
    log(f"plan: {len(items)} items x budgets {list(args.budgets)} x n={MAX_N} + {len(easy)} easy x 2 = {samples} "
        f"samples, about {tokens:,.0f} sampled tokens")
    with Engine(path, LoadSettings(n_ctx=n_ctx, n_parallel=args.parallel), max_queue=32) as engine:
        grids, items = run_grid(engine, items, args, spec, log)
        fast = run_singles(engine, easy, args.budgets[0], args, single)
        slow = run_singles(engine, easy, args.budgets[-1], args, single)
        info = dict(engine.info)
    return build_report(args, items, easy, grids, fast, slow, info, time.perf_counter() - t0)


def build_report(args, items, easy, grids, fast_easy, slow_easy, info, wall_s) -> dict:
    rows = [grid_row(grids[b], items, b, k) for b in args.budgets for k in NS]
    by_budget = {str(k): gains([r for r in rows if r["n"] == k], "budget") for k in NS}
    by_n = {str(b): gains([r for r in rows if r["budget"] == b], "n") for b in args.budgets}
    lo, hi = args.budgets[0], args.budgets[-1]
    fast = {**{it.id: grids[lo][it.id]["candidates"][0] for it in items}, **fast_easy}
    slow = {**{it.id: grids[hi][it.id]["candidates"][0] for it in items}, **slow_easy}
    router, paths = router_rows(items + easy, fast, slow, (lo, hi))
    per_item = {str(b): {i: {k: v for k, v in g.items() if k != "candidates"} |
                         {"answers": [c.answer for c in g["candidates"]]} for i, g in grids[b].items()}
                for b in args.budgets}
    return {"config": {"model": info.get("model"), "items": len(items), "easy": len(easy),
                       "budgets": list(args.budgets), "n": MAX_N, "temperature": args.temperature,
                       "answer_tokens": args.answer_tokens, "parallel": args.parallel, "seed": args.seed},
            "wall_s": wall_s, "grid": rows, "gains_by_budget": by_budget, "gains_by_n": by_n,
            "router": router, "router_paths": paths, "router_items": len(items) + len(easy), "per_item": per_item,
            "known": {it.id: it.answer for it in items + easy}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(markdown(report))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
