"""Speculative decoding benchmark: the default (adaptive prompt lookup) against no speculation, on answers that
quote their prompt and on free text, in one run (docs/speculative.md).

Workloads (greedy unless named, one engine with one slot, raw completion prompts for the bundled base model):

- ``quotes``: answers that copy large parts of their prompt: a code block with one name renamed (4 items), a
  bug fix ("Here is the corrected code:" after the code), a document quoted with the answer's start
  prefilled, a corrected article, a tool's JSON result laid out again;
- ``free``: continuations that repeat neither the prompt nor themselves. The bundled 270M base model starts
  looping after about 50 greedy tokens, so these run for at most ``FREE_TOKENS`` tokens;
- ``free-sampled``: the same prompts sampled (``DecodingParams``' defaults: temperature 0.8, top-k 40, top-p
  0.95, min-p 0.05; seeded); the text is not compared
  (speculative sampling draws from the same distribution with another generator, docs/speculative.md).

Every item runs under each mode in turn (``off`` and ``default``, i.e. ``GenerateRequest.speculative`` None;
``--modes`` adds ``prompt_lookup`` / ``draft``), the order rotating per item and round so that machine noise
hits all of them. Reported per workload and mode: decode tokens/s (median of ``Metrics.decode_tps``, measured at
the caller), the speedup (median over items × rounds of each run's ratio to the ``off`` run of the same item
and round), guesses drafted and kept, tokens per verification step, and items whose greedy text equals
``off``'s.

``--costs`` measures instead what the default's policy needs: the time of one ``llama_decode`` of r tokens of
one sequence, each with logits, relative to one token (``speculative.STEP_COST``), the same for two sequences,
and the time of ``target_dist`` / ``greedy_token`` on one row (``SAMPLED_ROW_COST``), in a bare llama.cpp
context with the engine's settings.

Run: ``hearth bench speculative`` or ``python -m benchmarks.speculative_bench`` (``--json`` for raw figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import NamedTuple

CODE = [
    ("total", "acc", '''def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    if count == 0:
        return {"total": 0, "average": 0.0, "count": 0}
    return {"total": total, "average": total / count, "count": count}
'''),
    ("items", "entries", '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, quantity):
        self.items[name] = self.items.get(name, 0) + quantity

    def remove(self, name, quantity):
        if self.items.get(name, 0) < quantity:
            raise ValueError(f"not enough {name}")
        self.items[name] -= quantity
        if self.items[name] == 0:
            del self.items[name]

    def report(self):
        return sorted(self.items.items())
'''),
    ("path", "source", '''import json
from pathlib import Path


def load_config(path):
    path = Path(path)
    if not path.exists():
        return {}
    with path.open() as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise TypeError(f"{path} must hold a JSON object")
    return data


def save_config(path, data):
    Path(path).write_text(json.dumps(data, indent=2))
'''),
    ("matrix", "grid", '''def transpose(matrix):
    rows = len(matrix)
    cols = len(matrix[0]) if rows else 0
    result = [[0] * rows for _ in range(cols)]
    for i in range(rows):
        for j in range(cols):
            result[j][i] = matrix[i][j]
    return result


def trace(matrix):
    return sum(matrix[i][i] for i in range(min(len(matrix), len(matrix[0]))))
'''),
]

BUGGY = '''def average(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def median(values):
    s = sorted(values)
    n = len(s)
    mid = n // 2
    if n % 2 == 1:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def describe(values):
    return {"average": average(values), "median": median(values), "count": len(values)}
'''

DOC = """The Lindqvist Bridge opened in 1932 and carried the coastal railway across the Hallen estuary for
forty years. Its designer, Maria Lindqvist, chose a riveted steel truss because the riverbed was too soft for
stone piers. In 1974 the railway moved inland and the bridge was closed to trains. A local society saved it
from demolition in 1981, and since 1990 it has carried a footpath and a cycle lane. The bridge is 412 metres
long, has nine spans, and is painted green every twelve years. Its last repainting was finished in 2019."""

TOOL = """{"city": "Bergen", "forecast": [
  {"day": "Monday", "high_c": 11, "low_c": 6, "rain_mm": 14, "wind": "SW 8 m/s"},
  {"day": "Tuesday", "high_c": 9, "low_c": 5, "rain_mm": 22, "wind": "W 11 m/s"},
  {"day": "Wednesday", "high_c": 12, "low_c": 7, "rain_mm": 3, "wind": "S 4 m/s"},
  {"day": "Thursday", "high_c": 13, "low_c": 8, "rain_mm": 0, "wind": "SE 3 m/s"}
]}"""

FREE_PROMPTS = [
    "The following is a short essay on the history of tea.\n\nTea was first",
    "Chapter 1\n\nThe train pulled into the station just after midnight. Anna",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The invention of the printing press changed Europe in many ways. First,",
    "A review of the new smartphone: The design is",
    "Dear Sam,\nThank you for your letter. Since you asked about my trip to the mountains,",
]
FREE_TOKENS = 48  # the bundled base model's greedy text starts repeating itself after about 50 tokens


class Item(NamedTuple):
    """One prompt of a workload: ``stop`` strings and ``max_tokens`` (None: the run's ``--max-tokens``)."""

    label: str
    prompt: str
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None


def copy_prompt(old: str, new: str, code: str) -> str:
    """A raw completion prompt asking for ``code`` again with ``old`` renamed to ``new`` (the base model continues
    the second code fence)."""
    return (f"Original:\n```python\n{code}```\n\nThe same code with `{old}` renamed to `{new}`:\n```python\n")


def items(n: int | None = None) -> list[tuple[str, str]]:
    """``(label, prompt)`` of the rename items (the first ``n``; None: all); their answers end at a fence."""
    out = [(f"rename {old}->{new}", copy_prompt(old, new, code)) for old, new, code in CODE]
    return out[:n] if n else out


def quote_items() -> list[Item]:
    """The ``quotes`` workload: answers that copy large parts of their prompt."""
    fence = ("```",)
    return [Item(label, prompt, fence) for label, prompt in items()] + [
        Item("code fix", "This code crashes on an empty list:\n```python\n" + BUGGY + "```\n\nHere is the "
             "corrected code, with `average` returning 0.0 for an empty list:\n```python\n", fence),
        Item("quote a document", f"Document:\n{DOC}\n\nQuestion: What does the document say about the bridge's "
             "history? Quote it exactly.\nAnswer: \"The Lindqvist Bridge opened in 1932", ("\"\n", "\n\n")),
        Item("correct an article", f"Article:\n{DOC}\n\nCorrected article (the bridge is 414 metres long, not "
             "412):\n", ("\n\n",)),
        Item("tool result", f"Tool result (get_forecast):\n{TOOL}\n\nThe same forecast as a JSON list, one day "
             "per line:\n[\n", ("]\n",)),
    ]


def free_items() -> list[Item]:
    """The ``free`` workload: continuations that repeat neither their prompt nor themselves."""
    return [Item(f"free {i + 1}", p, (), FREE_TOKENS) for i, p in enumerate(FREE_PROMPTS)]


WORKLOADS = {"quotes": (quote_items, False), "free": (free_items, False), "free-sampled": (free_items, True)}
MODES = ("off", "default")


def _request(item: Item, mode: str, sampled: bool, max_tokens: int, seed: int):
    from app.protocol.types import DecodingParams, GenerateRequest

    n = min(item.max_tokens or max_tokens, max_tokens)
    d = (DecodingParams.make(temperature=0.8, seed=seed, max_tokens=n, stop=list(item.stop)) if sampled else
         DecodingParams.make(temperature=0.0, max_tokens=n, stop=list(item.stop)))
    return GenerateRequest(prompt=item.prompt, speculative=None if mode == "default" else mode, decoding=d)


def _row(done, workload: str, i: int, r: int, mode: str) -> dict:
    m = done.metrics
    return {"workload": workload, "item": i, "round": r, "mode": mode, "decode_tps": m.decode_tps,
            "tokens": m.completion_tokens, "drafted": m.spec_drafted, "accepted": m.spec_accepted,
            "steps": m.spec_steps, "spec_mode": m.spec_mode, "text": done.text}


def _run_engine(path: str, draft: str | None, modes: tuple, workloads: list[str], rounds: int, max_tokens: int,
                n_threads: int | None) -> list[dict]:
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings

    settings = LoadSettings(n_ctx=4096, n_parallel=1, n_threads=n_threads)
    rows: list[dict] = []
    with Engine(path, settings, draft_model=draft if "draft" in modes else None) as eng:
        warm = quote_items()[0]  # the first speculating request measures the exact batch size: not timed
        eng.complete(_request(warm, "default", False, 16, 0))
        for r in range(rounds):
            for workload in workloads:
                make, sampled = WORKLOADS[workload]
                for i, item in enumerate(make()):
                    shift = (i + r) % len(modes)
                    for mode in modes[shift:] + modes[:shift]:
                        done = eng.complete(_request(item, mode, sampled, max_tokens, seed=1000 * r + i))
                        rows.append(_row(done, workload, i, r, mode))
    return rows


def run(model: str | None = None, draft: str | None = None, rounds: int = 2, max_tokens: int = 160,
        n_threads: int | None = None, modes: tuple = MODES, workloads: tuple = tuple(WORKLOADS)) -> dict:
    """Every mode on every item of ``workloads`` (see the module docstring); ``"off"`` is always run, as the
    baseline. ``draft``: the draft model for ``"draft"`` (default: the target itself)."""
    from app.catalog.registry import resolve_model

    path = str(resolve_model(model))
    draft_path = str(resolve_model(draft)) if draft else path
    modes = ("off",) + tuple(m for m in modes if m != "off")
    rows = _run_engine(path, draft_path, modes, list(workloads), rounds, max_tokens, n_threads)
    summary = {w: {m: _summary(rows, w, m) for m in modes} for w in workloads}
    return {"model": path, "draft": draft_path if "draft" in modes else None, "rounds": rounds,
            "max_tokens": max_tokens, "summary": summary, "runs": rows}


def _summary(rows: list[dict], workload: str, mode: str) -> dict:
    mine = [r for r in rows if r["workload"] == workload and r["mode"] == mode]
    base = {(r["item"], r["round"]): r for r in rows if r["workload"] == workload and r["mode"] == "off"}
    ratios = [r["decode_tps"] / base[(r["item"], r["round"])]["decode_tps"] for r in mine
              if base[(r["item"], r["round"])]["decode_tps"] > 0]
    drafted, accepted = sum(r["drafted"] for r in mine), sum(r["accepted"] for r in mine)
    steps, tokens = sum(r["steps"] for r in mine), sum(r["tokens"] for r in mine)
    first = [r for r in mine if r["round"] == 0]
    return {"decode_tps": statistics.median(r["decode_tps"] for r in mine),
            "speedup": statistics.median(ratios) if ratios else 0.0,
            "speedup_min": min(ratios) if ratios else 0.0, "speedup_max": max(ratios) if ratios else 0.0,
            "drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_step": tokens / (tokens - accepted) if accepted else 1.0,
            "spec_steps": steps, "tokens": tokens,
            "identical": sum(1 for r in first if r["text"] == base[(r["item"], 0)]["text"]), "of": len(first)}


def report(out: dict) -> str:
    lines = [f"model: {out['model']}" + (f", draft: {out['draft']}" if out["draft"] else ""),
             f"{out['rounds']} rounds, one slot, max_tokens {out['max_tokens']} (free text: "
             f"{min(FREE_TOKENS, out['max_tokens'])})", "",
             "| workload | mode | decode tok/s (median) | speedup vs off (median, min–max) | acceptance | drafted "
             "| accepted | tokens/step | identical text |",
             "|---|---|---|---|---|---|---|---|---|"]
    for workload, modes in out["summary"].items():
        for mode, s in modes.items():
            acc = f"{s['acceptance_rate']:.1%}" if s["acceptance_rate"] is not None else "–"
            same = "–" if workload.endswith("sampled") else f"{s['identical']}/{s['of']}"
            lines.append(f"| {workload} | {mode} | {s['decode_tps']:.1f} | {s['speedup']:.2f}x "
                         f"({s['speedup_min']:.2f}–{s['speedup_max']:.2f}) | {acc} | {s['drafted']} "
                         f"| {s['accepted']} | {s['tokens_per_step']:.2f} | {same} |")
    return "\n".join(lines)


# -- the costs the default's policy is set from ----------------------------------------------------------
COST_SHAPES = ((1,), (2,), (3,), (4,), (1, 1), (3, 1), (2, 2), (3, 3))  # tokens per sequence in one decode


def _bare_context(path: str, n_threads: int | None, n_seq: int):
    from app.childhost import tune_openmp

    tune_openmp()  # as in the engine process (before llama.cpp's OpenMP starts)
    import llama_cpp

    from app.engine.local.llama import _context_with_sequences, llama_kwargs
    from app.protocol.types import LoadSettings

    settings = LoadSettings(n_ctx=2048, n_parallel=n_seq, n_threads=n_threads).validate()
    kw = llama_kwargs(settings)
    kw["n_ctx"] = settings.n_ctx * n_seq
    with _context_with_sequences(n_seq):
        llm = llama_cpp.Llama(model_path=path, **kw)
    return llm, llama_cpp.llama_batch_init(settings.n_batch, 0, 1)


def costs(model: str | None = None, rounds: int = 20, n_threads: int | None = None) -> dict:
    """Median time (ms) of one ``llama_decode`` of each ``COST_SHAPES`` shape after a 300-token prompt in each
    of two sequences, every token with logits (as a verification step has them; a one-token item is a plain
    step), shapes alternating in order per round; ``ratio``: to (1,) for one sequence, to (1, 1) for two.
    Also ``target_dist`` and ``greedy_token`` of one row (ms, and as a fraction of the (1,) decode)."""
    from app.catalog.registry import resolve_model

    llm, batch = _bare_context(str(resolve_model(model)), n_threads, 2)
    import llama_cpp
    import numpy as np

    from app.engine.local import speculative as spec
    from app.protocol.types import DecodingParams

    ctx, mem = llm._ctx.ctx, llama_cpp.llama_get_memory(llm._ctx.ctx)
    text = " ".join(FREE_PROMPTS) + "\n\n" + DOC + "\n\n" + BUGGY
    prompt = llm.tokenize(text.encode(), add_bos=True)[:300]

    def decode(items: list[tuple[int, int, list[int]]], every: bool) -> float:
        n = 0
        for sid, pos0, toks in items:
            for i, t in enumerate(toks):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = t, pos0 + i, 1
                batch.seq_id[n][0] = sid
                batch.logits[n] = every or i == len(toks) - 1
                n += 1
        batch.n_tokens = n
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return time.perf_counter() - t0

    for sid in (0, 1):
        for a in range(0, len(prompt), 256):
            decode([(sid, a, prompt[a:a + 256])], every=False)
    times: dict[tuple, list[float]] = {s: [] for s in COST_SHAPES}
    P = len(prompt)
    for r in range(rounds):
        for shape in (COST_SHAPES if r % 2 == 0 else COST_SHAPES[::-1]):
            times[shape].append(decode([(sid, P, prompt[:n]) for sid, n in enumerate(shape)], every=True))
            for sid in range(len(shape)):
                llama_cpp.llama_memory_seq_rm(mem, sid, P, -1)
    ms = {s: statistics.median(v) * 1e3 for s, v in times.items()}
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, 0), shape=(llm.n_vocab(),)).copy()
    top40 = DecodingParams.make(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)  # the defaults
    nucleus = DecodingParams.make(temperature=0.8, top_k=0, top_p=0.95, min_p=0.0)
    per = {"target_dist, top-k 40": _time(lambda: spec.target_dist(row, top40)),
           "target_dist, top-k 0, top-p 0.95": _time(lambda: spec.target_dist(row, nucleus)),
           "greedy_token": _time(lambda: spec.greedy_token(row))}
    one, two = ms[(1,)], ms[(1, 1)]
    return {"rounds": rounds, "prompt_tokens": P,
            "decode": {"+".join(map(str, s)): {"ms": v, "ratio": v / (one if len(s) == 1 else two)}
                       for s, v in ms.items()},
            "per_row": {k: {"ms": v, "of_one_token_decode": v / one} for k, v in per.items()}}


def _time(fn, n: int = 30) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def costs_report(out: dict) -> str:
    lines = [f"one llama_decode after a {out['prompt_tokens']}-token prompt, every token with logits, median of "
             f"{out['rounds']} rounds", "", "| tokens per sequence | ms | ratio to the plain step |", "|---|---|---|"]
    lines += [f"| {shape} | {v['ms']:.1f} | {v['ratio']:.2f} |" for shape, v in out["decode"].items()]
    lines += ["", "| per row | ms | of a one-token decode |", "|---|---|---|"]
    lines += [f"| {k} | {v['ms']:.2f} | {v['of_one_token_decode']:.3f} |" for k, v in out["per_row"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="target model (default: the bundled one)")
    p.add_argument("--draft", default=None, help="draft model with the same vocabulary (default: the target)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated: off, default, auto, prompt_lookup, draft (off is always run)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    p.add_argument("--costs", action="store_true", help="measure the decode costs the default's policy uses")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.costs:
        out = costs(a.model, max(a.rounds, 20), a.n_threads)
        print(json.dumps(out, indent=2) if a.json else costs_report(out))
        return 0
    out = run(a.model, a.draft, a.rounds, a.max_tokens, a.n_threads, tuple(a.modes.split(",")),
              tuple(a.workloads.split(",")))
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
