"""Exactness sweep of the prefix cache: every reuse path against a cold prefill, token for token.

For each KV type, generated prompts of lengths spread over a range run greedily (``max_tokens`` tokens) in
two engine processes sharing one prefix-cache folder:

- engine 1: each prompt cold (``cache_reuse`` must say ``cold``; its chunks are saved), then again (**live**:
  all but its last token from the live KV cache, or all but a tail shorter than ``layout.TAIL_SPLIT`` that goes
  in with the last token). For every ``derived_every``-th prompt P of those longer
  than three chunks also: P extended by a new turn (**live-next-turn**: P's whole chunks from the live KV
  cache), then a prefix of P (**live-prefix-of-cached**), each compared with the same prompt prefilled cold
  (``prefix_cache=False``).
- engine 2 (a new process): each prompt again (**restored**: as much as **live**, from disk), and for every
  ``derived_every``-th prompt P, P extended by another turn (**restored-shorter**: the whole chunks of P's,
  the rest prefilled) and P's first half with another ending (**restored-shared**: only the chunks it shares with
  the longer prompts stored before, none of which it extends), compared with the same prompt prefilled cold.

A path counts as identical when its token ids equal the cold run's. A run that did not reuse what its path
names (say, nothing was restored) is counted as *not exercised*, never as identical. TTFT (request accepted
→ first token at the caller, ``Metrics.ttft_s``) is reported per path as the median ratio to the same
prompt's cold TTFT.

Run: ``hearth bench cache --exactness 40`` (with the other cache sections) or
``python -m benchmarks.cache_exactness --prompts 40``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

MAX_TOKENS = 20  # greedy tokens per run: the flips before the fix came within the first 15
PATHS = ("live", "live-next-turn", "live-prefix-of-cached", "restored", "restored-shorter", "restored-shared")
KV_TYPES = ("f16", "q8_0", "q4_0")

_COLOURS = ("red", "green", "blue", "amber", "violet")
_WORDS = ("harbour ledger cargo captain weather tide lantern anchor rope barrel spice salt cloth timber copper "
          "grain wine wool pepper silver map compass storm harbourmaster clerk inventory crate").split()


def marbles_prompt(n: int) -> str:
    """The prompt of the issue that found the bug: ``n`` items, each a box and a count (tokens ≈ 14.7 n)."""
    return " ".join(f"Item {i}: the {('red', 'green', 'blue')[i % 3]} box holds {i * 7} marbles." for i in range(n))


#: The prompts that broke before the fix (marble items, KV type): 874, 1474, 1954 and 2281 tokens.
TABLE_PROMPTS = ((60, "f16"), (100, "f16"), (130, "f16"), (150, "f16"), (150, "q4_0"))


def _sentence(family: int, i: int, rng: random.Random) -> str:
    if family == 0:
        return f"Item {i}: the {_COLOURS[i % 5]} box holds {rng.randint(1, 999)} marbles."
    if family == 1:
        return (f"On day {i} the {rng.choice(_WORDS)} was moved to shelf {rng.randint(1, 60)} by the "
                f"{rng.choice(_WORDS)} clerk.")
    if family == 2:
        return f"def f_{i}(x):\n    return x * {rng.randint(2, 97)} + {rng.randint(0, 9)}\n"
    if family == 3:
        return f"- {rng.choice(_WORDS)}, {rng.choice(_WORDS)}; {rng.randint(10, 9999)} units at {rng.random():.3f}"
    return f"Q{i}: What is {rng.randint(2, 99)} plus {rng.randint(2, 99)}? A{i}:"


def make_prompts(count_tokens, n: int, lo: int, hi: int, seed: int = 0) -> list[str]:
    """``n`` prompts of varied content whose token counts spread evenly over ``[lo, hi]``.

    ``count_tokens(text) -> int`` is the engine's tokenizer. Each prompt starts with its own header, so no two
    share a prefix (a prompt's cold run must not reuse the previous one's KV). Raises ``ValueError`` for
    ``n < 1`` or ``lo > hi``."""
    if n < 1 or lo > hi:
        raise ValueError(f"need n >= 1 and lo <= hi, got n={n}, lo={lo}, hi={hi}")
    rng = random.Random(seed)
    out = []
    for j in range(n):
        target = lo + (hi - lo) * j // max(1, n - 1)
        family = j % 5
        parts = [f"Record {j} of the sweep, kind {family}:"]
        step = 8
        while True:
            parts.extend(_sentence(family, len(parts) + k, rng) for k in range(step))
            if count_tokens(" ".join(parts)) >= target:
                break
        while len(parts) > 1 and count_tokens(" ".join(parts[:-1])) >= target:
            parts.pop()
        out.append(" ".join(parts))
    return out


@dataclass
class PathTally:
    """Outcome of one reuse path: ``identical`` of ``exercised`` runs equal the cold tokens; ``skipped`` runs
    did not reuse what the path names. ``ttft_ratios``: path TTFT / cold TTFT per exercised run."""

    identical: int = 0
    exercised: int = 0
    skipped: int = 0
    ttft_ratios: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"identical": self.identical, "exercised": self.exercised, "skipped": self.skipped,
                "ttft_ratio_p50": statistics.median(self.ttft_ratios) if self.ttft_ratios else None,
                "mismatches": self.mismatches}


@dataclass
class Run:
    tokens: list
    metrics: object


def run(engine, prompt: str, max_tokens: int, reuse: bool = True) -> Run:
    """One greedy generation; its token ids and metrics."""
    from app.protocol.types import DecodingParams, Delta, GenerateRequest

    req = GenerateRequest(prompt=prompt, decoding=DecodingParams.make(temperature=0.0, max_tokens=max_tokens),
                          prefix_cache=reuse)
    toks: list[int] = []
    done = None
    for ev in engine.generate(req):
        if isinstance(ev, Delta):
            toks.extend(ev.token_ids)
        else:
            done = ev
    return Run(toks, done.metrics)


def _record(tally: PathTally, got: Run, cold: Run, want_all_but_last: bool, label: str, source: str = "") -> None:
    """Count ``got`` against ``cold`` on ``tally``'s path. ``want_all_but_last``: the path must have reused the
    whole prompt but its last token, or but a tail shorter than ``layout.TAIL_SPLIT`` (a repeat); ``source``:
    the reuse must have come from there (``Metrics.cache_source``)."""
    from app.engine.local.layout import TAIL_SPLIT

    m = got.metrics
    reused = (0 < m.prompt_tokens - 1 - m.cached_tokens + 1 <= TAIL_SPLIT if want_all_but_last
              else m.cached_tokens > 0)
    if not reused or m.cache_reuse != "exact" or (source and m.cache_source != source):
        tally.skipped += 1
        return
    tally.exercised += 1
    if got.tokens == cold.tokens:
        tally.identical += 1
    else:
        first = next((i for i, (a, b) in enumerate(zip(got.tokens, cold.tokens)) if a != b),
                     min(len(got.tokens), len(cold.tokens)))
        tally.mismatches.append({"prompt": label, "prompt_tokens": m.prompt_tokens, "first_diff": first})
    if cold.metrics.ttft_s > 0:
        tally.ttft_ratios.append(m.ttft_s / cold.metrics.ttft_s)


_TURNS = (" Next question: which record came first, and why?", " Then the clerk wrote one more line.",
          " Nothing else was written in the ledger that season; the harbour froze.")


def _derived(prompt: str) -> tuple[str, str]:
    """(an extension of ``prompt`` by a new turn, a prefix of it: its first two thirds, cut at a space)."""
    cut = prompt.rfind(" ", 0, len(prompt) * 2 // 3)
    return prompt + _TURNS[0], prompt[:cut if cut > 0 else len(prompt) // 2]


def _derive(cold: Run, every: int, chunk: int, picked: list[int]) -> bool:
    """Whether this prompt also gets the derived paths: every ``every``-th (none for ``every`` 0) of the prompts
    long enough to share two whole chunks with their prefix, counting from the first. ``picked`` holds the
    count of long-enough prompts seen (one element, updated)."""
    if every <= 0 or cold.metrics.prompt_tokens <= 3 * chunk:
        return False
    picked[0] += 1
    return (picked[0] - 1) % every == 0


def sweep(model_path: str, prompts: list[str], kv: str, *, n_ctx: int = 4096, max_tokens: int = MAX_TOKENS,
          derived_every: int = 3, labels: list[str] | None = None) -> dict:
    """Run every path of the module docstring for ``prompts`` with KV type ``kv`` (``f16``, ``q8_0``, ``q4_0``;
    flash attention on). Returns ``{"kv", "prompts", "cold_ttft_s_p50", "paths": {path: PathTally.to_dict()}}``.
    Raises ``RuntimeError`` if a cold run reused a prefix (the prompts were not independent)."""
    from app.engine.local.engine import Engine
    from app.engine.local.settle import SAVE_GRACE_S
    from app.protocol.types import LoadSettings

    settings = LoadSettings(n_ctx=n_ctx, type_k=kv, type_v=kv, flash_attn=True).validate()
    labels = labels or [f"prompt {i}" for i in range(len(prompts))]
    tally = {p: PathTally() for p in PATHS}
    cold: list[Run] = []
    derived: set[int] = set()
    shared: list[tuple[int, str]] = []
    picked = [0]
    with tempfile.TemporaryDirectory(prefix="hearth-exactness-") as d:
        cfg = {"dir": d, "budget_bytes": 64 << 30, "min_tokens": 1}
        with Engine(model_path, settings, prefix_cache=cfg) as e:
            for i, p in enumerate(prompts):
                ref = run(e, p, max_tokens)
                if ref.metrics.cache_reuse != "cold":
                    raise RuntimeError(f"{labels[i]}: its cold run reused {ref.metrics.cached_tokens} tokens")
                cold.append(ref)
                _record(tally["live"], run(e, p, max_tokens), ref, True, labels[i])
                if _derive(ref, derived_every, settings.n_batch, picked):
                    derived.add(i)
                    time.sleep(SAVE_GRACE_S + 0.2)  # saved to disk, as a pause leaves it, before a next turn
                    # extends it in the same slot (its last partial chunk would not be saved otherwise)
                    ext, pre = _derived(p)
                    got_ext, got_pre = run(e, ext, max_tokens), run(e, pre, max_tokens)
                    _record(tally["live-next-turn"], got_ext, run(e, ext, max_tokens, reuse=False), False, labels[i])
                    _record(tally["live-prefix-of-cached"], got_pre, run(e, pre, max_tokens, reuse=False), False,
                            labels[i])
        with Engine(model_path, settings, prefix_cache=cfg) as e2:
            for i, p in enumerate(prompts):
                _record(tally["restored"], run(e2, p, max_tokens), cold[i], True, labels[i])
                if i in derived:
                    ext2 = p + _TURNS[1]
                    got = run(e2, ext2, max_tokens)
                    _record(tally["restored-shorter"], got, run(e2, ext2, max_tokens, reuse=False), False, labels[i])
                    half = p.rfind(" ", 0, len(p) // 2)
                    shared.append((i, p[:half if half > 0 else len(p) // 2] + _TURNS[2]))  # extends no stored prompt
        with Engine(model_path, settings, prefix_cache=cfg) as e3:  # a new process again: nothing live shares it
            for i, other in shared:
                got = run(e3, other, max_tokens)
                _record(tally["restored-shared"], got, run(e3, other, max_tokens, reuse=False), False, labels[i],
                        source="disk")
    return {"kv": kv, "prompts": len(prompts), "max_tokens": max_tokens, "labels": labels,
            "prompt_tokens": [r.metrics.prompt_tokens for r in cold],
            "cold_ttft_s_p50": statistics.median(r.metrics.ttft_s for r in cold),
            "paths": {k: v.to_dict() for k, v in tally.items()}}


def table_sweep(model_path: str, max_tokens: int = MAX_TOKENS) -> list[dict]:
    """``sweep`` on each prompt of ``TABLE_PROMPTS`` (the whole-prompt paths: live and restored). One sweep per
    prompt, in its own cache folder: each marble prompt starts with the shorter ones, so in one folder its cold
    run would reuse theirs."""
    return [sweep(model_path, [marbles_prompt(n)], kv, max_tokens=max_tokens, derived_every=0,
                  labels=[f"marbles N={n}"]) for n, kv in TABLE_PROMPTS]


def longest_prompt(n_ctx: int, max_tokens: int) -> int:
    """Tokens of the sweep's longest prompt: room for ``max_tokens``, a derived turn and the template."""
    return n_ctx - 64 - max_tokens


def check_args(n: int, n_ctx: int, max_tokens: int = MAX_TOKENS, lo: int = 100) -> str:
    """What is wrong with a sweep of ``n`` prompts at ``n_ctx`` and ``max_tokens`` (empty when nothing)."""
    if n < 1:
        return f"the number of prompts must be >= 1, got {n}"
    if max_tokens < 1:
        return f"--max-tokens must be >= 1, got {max_tokens}"
    if longest_prompt(n_ctx, max_tokens) < lo:
        return (f"--n-ctx {n_ctx} leaves no room for prompts of {lo} tokens or more (the longest is "
                f"n_ctx − 64 − max_tokens tokens)")
    return ""


def exactness(model_path: str, n: int, kv_types=KV_TYPES, n_ctx: int = 4096, max_tokens: int = MAX_TOKENS,
              lo: int = 100, seed: int = 0, derived_every: int = 4) -> dict:
    """``n`` prompts of ``lo`` … ``n_ctx − 64 − max_tokens`` tokens for each KV type (the derived paths on every
    ``derived_every``-th), plus the table's prompts."""
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    with Engine(model_path, LoadSettings(n_ctx=n_ctx), prefix_cache=None) as e:
        prompts = make_prompts(e.count_tokens, n, lo, longest_prompt(n_ctx, max_tokens), seed)
    sweeps = [sweep(model_path, prompts, kv, n_ctx=n_ctx, max_tokens=max_tokens, derived_every=derived_every)
              for kv in kv_types]
    return {"sweeps": sweeps, "table": table_sweep(model_path, max_tokens)}


def print_report(res: dict) -> None:
    """Identical/exercised per path and KV type, the median TTFT ratio of each path to cold, and the prompts
    that differed before the fix."""
    print(f"{'KV':6} {'path':22} {'identical':>12} {'TTFT/cold P50':>14}")
    for s in res["sweeps"]:
        for name, t in s["paths"].items():
            r = f"{t['ttft_ratio_p50']:.3f}" if t["ttft_ratio_p50"] is not None else "-"
            skip = f" ({t['skipped']} not exercised)" if t["skipped"] else ""
            print(f"{s['kv']:6} {name:22} {t['identical']:>5}/{t['exercised']:<6} {r:>14}{skip}")
            for mm in t["mismatches"]:
                print(f"         DIFFERS: {mm['prompt']} ({mm['prompt_tokens']} tokens), "
                      f"first at token {mm['first_diff']}")
    print("Prompts that differed before the fix (docs/prefix-cache.md):")
    for s in res["table"]:
        verdict = ", ".join(f"{name} {'identical' if t['identical'] == t['exercised'] > 0 else 'DIFFERS'}"
                            for name, t in s["paths"].items() if name in ("live", "restored"))
        print(f"  {s['labels'][0]:14} {s['prompt_tokens'][0]:5} tokens {s['kv']:5} {verdict}")
    print("TTFT: request accepted -> first token at the caller; cold = the same prompt prefilled with no reuse.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=40, help="generated prompts per KV type (default 40)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    p.add_argument("--kv", nargs="+", choices=KV_TYPES, default=list(KV_TYPES))
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    problem = check_args(a.prompts, a.n_ctx, a.max_tokens)
    if problem:
        p.error(problem)
    from app.catalog.registry import resolve_model
    from app.errors import HearthError

    try:
        res = exactness(str(resolve_model(a.model)), a.prompts, tuple(a.kv), a.n_ctx, a.max_tokens)
    except HearthError as exc:
        print(f"hearth: error: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print_report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
