"""``hearth setup``: assemble the bundled model (and the default embedding model) into the data directory."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("setup", help="install the bundled model into the data directory (no network)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.catalog.bundled import ensure_bundled_model

    path = ensure_bundled_model()
    print(f"bundled model: {path}")
    try:
        from app.retrieval.embed_model import ensure_embedding_model
    except ImportError:
        return 0
    emb = ensure_embedding_model()
    if emb is not None:
        print(f"embedding model: {emb}")
    return 0
