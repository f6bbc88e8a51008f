"""Speculative decoding benchmark: plain vs prompt lookup vs a draft model, on copy-heavy items, in one run.

Each item gives the model a code block and asks for it again with one change (a name renamed), so most of
the answer is a copy of the prompt: the case prompt-lookup decoding is for (Saxena 2023). Every item runs
greedily under each mode in turn (plain, prompt_lookup, draft; alternating per item and round so that
machine noise hits all of them), on one engine with one slot. Reported per mode:

- decode tokens/s (median over items and rounds; ``Metrics.decode_tps``, measured at the caller) and the
  speedup = that ÷ plain's;
- drafted and accepted guesses, acceptance rate = accepted ÷ drafted, tokens per verification step;
- identical greedy: items whose text equals plain greedy decoding's.

Guesses per step are capped where the target's logits stay bit for bit those of one-token steps (measured by
the engine, docs/speculative.md); ``--long-draft N`` (default 10) adds a second engine where prompt lookup may
guess up to N tokens (``HEARTH_SPEC_MAX_DRAFT``), compared with that engine's own plain runs: faster, but its
greedy text may differ from plain.

The draft model defaults to the target model itself (the bundled Gemma 3 270M is the smallest GGUF with its
vocabulary here): acceptance is then near 100 % but each guess costs a full decode of the same size, so it
shows the mechanism's overhead, not a speedup. Give ``--draft`` a smaller model with the same vocabulary for
a real one.

Run: ``hearth bench speculative`` or ``python -m benchmarks.speculative_bench`` (``--json`` for raw figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

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

MODES = (None, "prompt_lookup", "draft")


def copy_prompt(old: str, new: str, code: str) -> str:
    """A raw completion prompt asking for ``code`` again with ``old`` renamed to ``new`` (the base model continues
    the second code fence)."""
    return (f"Original:\n```python\n{code}```\n\nThe same code with `{old}` renamed to `{new}`:\n```python\n")


def items(n: int | None = None) -> list[tuple[str, str]]:
    """``(label, prompt)`` of the copy-heavy items (the first ``n``; None: all)."""
    out = [(f"rename {old}->{new}", copy_prompt(old, new, code)) for old, new, code in CODE]
    return out[:n] if n else out


def _run_engine(path: str, draft_path: str, modes: tuple, rounds: int, n_items: int | None, max_tokens: int,
                n_threads: int | None, label: str = "") -> tuple[dict[str, list[dict]], dict]:
    from app.engine.local.engine import Engine
    from app.protocol.types import DecodingParams, GenerateRequest, LoadSettings

    settings = LoadSettings(n_ctx=4096, n_parallel=1, n_threads=n_threads)
    rows: dict[str, list[dict]] = {f"{m}{label}": [] for m in modes}
    texts: dict[tuple[str, int], str] = {}
    with Engine(path, settings, draft_model=draft_path if "draft" in modes else None) as eng:
        for r in range(rounds):
            for i, (_label, prompt) in enumerate(items(n_items)):
                shift = (i + r) % len(modes)
                for mode in modes[shift:] + modes[:shift]:
                    req = GenerateRequest(prompt=prompt, speculative=mode, decoding=DecodingParams.make(
                        temperature=0.0, max_tokens=max_tokens, stop=["```"]))
                    done = eng.complete(req)
                    m = done.metrics
                    if r == 0:
                        texts[(str(mode), i)] = done.text
                    rows[f"{mode}{label}"].append({
                        "item": i, "round": r, "decode_tps": m.decode_tps, "tokens": m.completion_tokens,
                        "drafted": m.spec_drafted, "accepted": m.spec_accepted, "steps": m.spec_steps,
                        "spec_mode": m.spec_mode, "identical": None})
    for mode in modes:
        for row in rows[f"{mode}{label}"]:
            row["identical"] = texts[(str(mode), row["item"])] == texts[("None", row["item"])]
    return rows, texts


def run(model: str | None = None, draft: str | None = None, rounds: int = 2, n_items: int | None = None,
        max_tokens: int = 200, n_threads: int | None = None, long_draft: int = 10) -> dict:
    """Every mode on every item (see the module docstring). ``long_draft`` > 0 adds a second engine where
    prompt lookup may guess up to that many tokens per step (``HEARTH_SPEC_MAX_DRAFT``: past the exact
    batch size, so its greedy text may differ from plain), compared with that engine's own plain runs."""
    import os

    from app.catalog.registry import resolve_model

    path = str(resolve_model(model))
    draft_path = str(resolve_model(draft)) if draft else path
    rows, _ = _run_engine(path, draft_path, MODES, rounds, n_items, max_tokens, n_threads)
    summary = {mode: _summary(rs, rows["None"], len(items(n_items))) for mode, rs in rows.items()}
    if long_draft > 0:
        old = os.environ.get("HEARTH_SPEC_MAX_DRAFT")
        os.environ["HEARTH_SPEC_MAX_DRAFT"] = str(long_draft)  # read by the engine process it spawns
        try:
            label = f" k<={long_draft}"
            more, _ = _run_engine(path, draft_path, (None, "prompt_lookup"), rounds, n_items, max_tokens,
                                  n_threads, label)
        finally:
            if old is None:
                os.environ.pop("HEARTH_SPEC_MAX_DRAFT", None)
            else:
                os.environ["HEARTH_SPEC_MAX_DRAFT"] = old
        for mode, rs in more.items():
            summary[mode] = _summary(rs, more[f"None{label}"], len(items(n_items)))
        rows.update(more)
    return {"model": path, "draft": draft_path, "rounds": rounds, "items": len(items(n_items)),
            "max_tokens": max_tokens, "long_draft": long_draft, "summary": summary, "runs": rows}


def _summary(rs: list[dict], plain: list[dict], n: int) -> dict:
    tps = statistics.median(r["decode_tps"] for r in rs)
    base = statistics.median(r["decode_tps"] for r in plain)
    drafted, accepted = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
    steps = sum(r["steps"] for r in rs)
    tokens = sum(r["tokens"] for r in rs)
    return {"decode_tps": tps, "speedup": tps / base if base else 0.0, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "tokens_per_step": tokens / steps if steps else None,
            "identical": sum(1 for r in rs if r["round"] == 0 and r["identical"]), "of": n,
            "spec_mode": rs[0]["spec_mode"] if rs else None}


def report(out: dict) -> str:
    lines = [f"model: {out['model']}", f"draft: {out['draft']}",
             f"{out['items']} copy-heavy items x {out['rounds']} rounds, greedy, max_tokens {out['max_tokens']}", "",
             "| mode | decode tok/s (median) | speedup vs plain | acceptance | drafted | accepted "
             "| tokens/step | identical greedy |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, s in out["summary"].items():
        acc = f"{s['acceptance_rate']:.1%}" if s["acceptance_rate"] is not None else "–"
        tps_step = f"{s['tokens_per_step']:.2f}" if s["tokens_per_step"] is not None else "1"
        name = mode.replace("None", "plain")
        lines.append(f"| {name} | {s['decode_tps']:.1f} | {s['speedup']:.2f}x | {acc} | {s['drafted']} "
                     f"| {s['accepted']} | {tps_step} | {s['identical']}/{s['of']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="target model (default: the bundled one)")
    p.add_argument("--draft", default=None, help="draft model with the same vocabulary (default: the target)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--items", type=int, default=None, help="use only the first N items")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--long-draft", type=int, default=10,
                   help="also run prompt lookup with up to N guesses per step on a second engine (0: skip)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    out = run(a.model, a.draft, a.rounds, a.items, a.max_tokens, a.n_threads, a.long_draft)
    print(json.dumps(out, indent=2) if a.json else report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
