"""``hearth search QUERY``: the best passages of the default collection, with evidence IDs.

Text output: one block per passage (rank, evidence ID, path, page, score, passage). ``--json``: a JSON list of
objects with ``evidence_id``, ``path``, ``page``, ``score`` and ``text``. A degraded mode (no embedding model:
keyword search only) is said on stderr, so that the JSON on stdout stays clean.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search indexed documents (hybrid BM25 + vector)",
                       description="Search the indexed documents; prints evidence IDs, paths, pages, "
                                   "scores and passages.")
    p.add_argument("query", metavar="QUERY", help="what to look for (free text)")
    p.add_argument("--k", type=int, default=5, metavar="N", help="number of passages (default 5)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    p.add_argument("--mode", choices=("hybrid", "bm25", "vector"), default=None,
                   help="ranking (default: hybrid when an embedding model is installed, else bm25)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.assistant import DocumentSource

    docs = DocumentSource.open_default()
    try:
        found = docs.search(args.query, args.k, mode=args.mode, floor=0.0)  # all k: a search, not a chat turn
    finally:
        docs.close()
    results = found.evidence
    if found.notice:
        print(f"hearth: {found.notice}", file=sys.stderr)
    if args.json:
        print(json.dumps([{"evidence_id": e.evidence_id, "path": e.path, "page": e.page, "score": e.score,
                           "text": e.text} for e in results], ensure_ascii=False, indent=2))
        return 0
    if not results:
        print("no matching passages")
    for rank, e in enumerate(results, start=1):
        where = e.path + (f"  page {e.page}" if e.page is not None else "")
        print(f"{rank}. [E:{e.evidence_id}] {where}  score {e.score:.4f}")
        print(textwrap.indent(e.text.strip(), "   "))
        print()
    return 0
